//! `plumber status` and `plumber history`: asking a running daemon, once or (`status --watch`)
//! following its event stream and redrawing in place.

use std::io::{BufRead, BufReader, IsTerminal as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::{TextOrJson, json_line, print};

/// How long `--watch` waits before connecting again to a daemon that went away.
const RECONNECT: Duration = Duration::from_secs(2);

pub fn ask(
    server: &str,
    path: &str,
    format: TextOrJson,
    render: fn(&serde_json::Value) -> String,
) -> Result<ExitCode> {
    let answer = get_json(server, path)?;
    let text = match format {
        TextOrJson::Json => json_line(&answer)?,
        TextOrJson::Text => render(&answer),
    };
    print(&text)?;
    Ok(ExitCode::SUCCESS)
}

pub fn get_json(server: &str, path: &str) -> Result<serde_json::Value> {
    let url = format!("{}{path}", server.trim_end_matches('/'));
    let mut response = ureq::get(&url)
        .call()
        .with_context(|| format!("asking the daemon at {server} (is `plumber up` running?)"))?;
    response
        .body_mut()
        .read_json()
        .with_context(|| format!("reading the answer of {url}"))
}

/// `status --watch`: every status the daemon pushes, redrawn in place on a terminal (one
/// JSON document per line with `--format json`, for scripts). Runs until interrupted; a lost
/// daemon is waited for.
pub fn watch_status(server: &str, format: TextOrJson) -> Result<ExitCode> {
    let url = format!("{}/api/events", server.trim_end_matches('/'));
    let redraw = std::io::stdout().is_terminal() && format == TextOrJson::Text;
    loop {
        let error = match follow(&url, |status| show(server, status, format, redraw)) {
            Ok(()) => "the daemon closed the stream".to_owned(),
            Err(error) => crate::report(&error),
        };
        let note = format!(
            "{error}; connecting again in {} s (Ctrl-C stops)\n",
            RECONNECT.as_secs()
        );
        if redraw {
            print(&format!("\x1b[H\x1b[J{note}"))?;
        } else {
            eprint!("{note}");
        }
        std::thread::sleep(RECONNECT);
    }
}

fn show(server: &str, status: &serde_json::Value, format: TextOrJson, redraw: bool) -> Result<()> {
    match format {
        TextOrJson::Json => print(&format!("{}\n", serde_json::to_string(status)?)),
        TextOrJson::Text if redraw => {
            let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
            // Home, clear to the end: the new frame replaces the old without scrolling.
            print(&format!(
                "\x1b[H\x1b[J{server}  {now}  (Ctrl-C stops)\n\n{}",
                plumber::output::status::text(status)
            ))
        }
        TextOrJson::Text => print(&format!("{}\n", plumber::output::status::text(status))),
    }
}

/// Reads the event stream at `url`, handing each `status` event's document to `on_status`.
fn follow(url: &str, mut on_status: impl FnMut(&serde_json::Value) -> Result<()>) -> Result<()> {
    let response = ureq::get(url)
        .header("Accept", "text/event-stream")
        .config()
        .timeout_global(None)
        .build()
        .call()
        .with_context(|| format!("connecting to {url} (is `plumber up` running?)"))?;
    let reader = BufReader::new(response.into_body().into_reader());
    let mut event = SseEvent::default();
    for line in reader.lines() {
        let line = line.with_context(|| format!("reading {url}"))?;
        if let Some(complete) = event.feed(&line)
            && complete.kind == "status"
        {
            let status: serde_json::Value = serde_json::from_str(&complete.data)
                .with_context(|| format!("reading a status event of {url}"))?;
            on_status(&status)?;
        }
    }
    Ok(())
}

/// One Server-Sent Event being read, line by line (the WHATWG format: `field: value` lines,
/// a blank line ends the event; `data` lines join with newlines; `:` starts a comment).
#[derive(Debug, Default, PartialEq)]
struct SseEvent {
    kind: String,
    data: String,
}

impl SseEvent {
    /// Takes one line; the event it ends, if it ends one.
    fn feed(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let done = std::mem::take(self);
            return (!done.data.is_empty()).then(|| SseEvent {
                kind: if done.kind.is_empty() {
                    "message".into()
                } else {
                    done.kind
                },
                data: done.data,
            });
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.kind),
            "data" => {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value);
            }
            // Comments (keep-alives), ids and retry delays: nothing to show.
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_as_the_event_stream_format_says() {
        let mut event = SseEvent::default();
        let lines = [
            "retry: 2000",
            "",
            ": keep-alive",
            "id: 7",
            "event: status",
            "data: {\"a\":",
            "data:1}",
            "",
            "data: plain",
            "",
        ];
        let events: Vec<SseEvent> = lines.iter().filter_map(|l| event.feed(l)).collect();
        assert_eq!(
            events,
            [
                SseEvent {
                    kind: "status".into(),
                    data: "{\"a\":\n1}".into()
                },
                SseEvent {
                    kind: "message".into(),
                    data: "plain".into()
                }
            ]
        );
    }
}
