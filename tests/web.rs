//! The web page (SPEC §10) in a real browser: Debian's `chromium`, headless, driven over
//! WebDriver (`chromedriver`, through fantoccini), against `plumber up` running the example
//! repository on a broker (tansu unless `PLUMBER_TEST_BOOTSTRAP` names another), with real
//! processors and a real git repository.
//!
//! What it checks, in one page load (a marker set in the page at the start must survive, so
//! nothing below reloads it): every topology and step shows; a commit that replaces a step
//! and adds one whose source topic does not exist yet shows the cutover action by action,
//! waiting for that topic, with the life each replaced step retires on its node and in its
//! details until it has stopped, then (the topic created) finishing with the new history
//! entry; a broken commit shows its error with file and line; a restarted daemon is
//! reconnected to. At each of these the numbers, states and retiring lives the page shows
//! (each node's lines and spoken label, the details, the summary, the overview's rows) are
//! those of the status it shows, the one the daemon sent under the event id the page marks
//! (`<main data-event-id>`), written as the page writes them; and the browser's console has
//! no error (none at all but the failed reconnections while the daemon is away).
//!
//! Screenshots (the overview, a topology, its cutover, the overview with an error) are
//! written to `PLUMBER_WEB_SCREENSHOTS` (a directory; `docs/` for the README) when it is set.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{TestRepo, processor_binary, write};
use plumber_testkit::browser::fantoccini::key::Key;
use plumber_testkit::browser::{Browser, ConsoleEntry};
use plumber_testkit::{Broker, Process, TestRecord, free_port, unique};
use serde_json::{Value, json};

/// A cutover on a slow broker and a busy machine.
const PATIENCE: Duration = Duration::from_secs(180);

/// `plumber up` on the repository, as a process of its own.
struct Daemon {
    /// `None` once stopped.
    process: Option<Process>,
    api: String,
}

/// Stopped as a person stops it (SIGTERM), so it stops its processors: killed, it would leave
/// them running after the test.
impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(nix::sys::signal::Signal::SIGTERM);
            if process.wait_exit(PATIENCE).is_none() {
                eprintln!("plumber up did not stop within {PATIENCE:?}");
            }
        }
    }
}

impl Daemon {
    fn start(repo: &TestRepo, broker: &Broker, state: &Path, port: u16) -> Daemon {
        let log = state.join(format!("daemon-{}.log", unique("run")));
        eprintln!("daemon log: {}", log.display());
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .args(["up", &repo.location(), "--branch", "main"])
            .args(["--bootstrap", broker.bootstrap()])
            .arg("--state-dir")
            .arg(state.join("state"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--poll-interval", "1"])
            .env("PLUMBER_PROCESSOR", processor_binary())
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if broker.is_tansu() {
            command.arg("--keep-topics");
            command.env("PLUMBER_ASSIGNOR", "eager");
        }
        Daemon {
            process: Some(Process::spawn("plumber up", &mut command)),
            api: format!("http://127.0.0.1:{port}"),
        }
    }

    fn status(&self) -> Option<Value> {
        let mut response = ureq::get(&format!("{}/api/status", self.api)).call().ok()?;
        response.body_mut().read_json().ok()
    }

    /// The status once `condition` holds of it.
    fn wait_status(&self, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        while Instant::now() < deadline {
            if let Some(status) = self.status() {
                if condition(&status) {
                    return status;
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out waiting until {what}; last status: {last:#}");
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(nix::sys::signal::Signal::SIGTERM);
            assert!(
                process.wait_exit(Duration::from_secs(60)).is_some(),
                "plumber up stops on SIGTERM"
            );
        }
    }
}

fn topology<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["topologies"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .unwrap_or(&Value::Null)
}

/// What this test does in the page besides loading it and waiting on it.
trait PageActions {
    /// `(attribute value, text)` of every element matching `selector`.
    fn elements(&self, selector: &str, attribute: &str) -> Vec<(String, String)>;
    /// Presses `key` where the focus is, as a person at the keyboard does.
    fn press(&self, key: Key);
    /// The whole page at 1280 px wide (the window is made as tall as the page for it).
    fn screenshot(&self, file: &Path);
    fn resize(&self, width: u32, height: u32);
}

impl PageActions for Browser {
    fn elements(&self, selector: &str, attribute: &str) -> Vec<(String, String)> {
        let selector = serde_json::to_string(selector).unwrap();
        let attribute = serde_json::to_string(attribute).unwrap();
        let found = self.script(&format!(
            "return [...document.querySelectorAll({selector})]\
             .map(e => [e.getAttribute({attribute}) || '', e.textContent || '']);"
        ));
        serde_json::from_value(found).unwrap()
    }

    fn press(&self, key: Key) {
        self.block_on(async {
            let focused = self.client().active_element().await?;
            focused.send_keys(&key.to_string()).await
        })
        .unwrap();
    }

    fn screenshot(&self, file: &Path) {
        let height = self
            .script("return document.documentElement.scrollHeight;")
            .as_u64()
            .unwrap_or(900)
            .clamp(600, 4000);
        // The window's frame takes some of its height in headless Chromium too.
        self.resize(1280, height as u32 + 90);
        let png = self.block_on(self.client().screenshot()).unwrap();
        std::fs::write(file, png).unwrap();
        self.resize(1280, 900);
    }

    fn resize(&self, width: u32, height: u32) {
        self.block_on(self.client().set_window_size(width, height))
            .unwrap();
    }
}

/// The status documents the daemon sends on `/api/events` as numbered changes, by event id:
/// what every client, the page too, was sent under that id, and what `/api/status` answered
/// when it was sent. (A client's opening status, and a resync's, is numbered as the last event
/// sent but may be newer than that event's: never kept here; the page marks one it shows with
/// `data-event-opening`.) One daemon run: ids start over with the next.
struct StatusFeed {
    documents: Arc<Mutex<BTreeMap<u64, Value>>>,
}

impl StatusFeed {
    /// Follows the daemon's event stream from now on, until the daemon stops.
    fn follow(api: &str) -> StatusFeed {
        let documents = Arc::new(Mutex::new(BTreeMap::new()));
        let (connected, opened) = std::sync::mpsc::channel();
        let (api, kept) = (api.to_owned(), documents.clone());
        std::thread::spawn(move || {
            let mut stream = EventStream::connect(&api);
            let mut last = stream.next().and_then(|opening| opening.id);
            let _ = connected.send(());
            while let Some(event) = stream.next() {
                let Some(id) = event.id else { continue };
                let fresh = last.is_none_or(|last| id > last);
                last = last.max(Some(id));
                if fresh
                    && event.kind == "status"
                    && let Ok(document) = serde_json::from_str(&event.data)
                {
                    kept.lock().unwrap().insert(id, document);
                }
            }
        });
        opened
            .recv_timeout(PATIENCE)
            .expect("the status feed connects to the daemon");
        StatusFeed { documents }
    }

    /// The status document sent as event `id`.
    fn at(&self, id: u64) -> Option<Value> {
        self.documents.lock().unwrap().get(&id).cloned()
    }
}

/// What the page shows of the status, as a script reads it in one go: the event id of the
/// status shown (`<main data-event-id>`), the route, each drawn step (its data attributes and
/// each line of text), the summary line, the selected step's details and its retiring life's,
/// and the overview's rows.
const PAGE_NUMBERS: &str = "(() => {
  const main = document.getElementById('main');
  const rows = (dl) => dl ? [...dl.children].map(d =>
    [d.querySelector('dt')?.textContent ?? '', d.querySelector('dd')?.textContent ?? '']) : null;
  const retiring = document.querySelector('aside.details [data-retiring-details]');
  return {
    id: main?.dataset.eventId ?? null,
    opening: main?.hasAttribute('data-event-opening') ?? false,
    hash: location.hash,
    steps: [...document.querySelectorAll('section[aria-labelledby=dag-title] svg [data-step]')]
      .map(g => ({
        step: g.dataset.step, kind: g.dataset.kind ?? null, state: g.dataset.state ?? null,
        retiring: g.dataset.retiring ?? null, retiringState: g.dataset.retiringState ?? null,
        selected: g.classList.contains('selected'), label: g.getAttribute('aria-label'),
        lines: [...g.querySelectorAll('text')].map(t => [t.getAttribute('class'), t.textContent]),
      })),
    summary: document.querySelector('.page-head .summary')?.textContent ?? null,
    details: rows(document.querySelector('aside.details > dl')),
    retiring: retiring ? [retiring.dataset.retiringDetails, rows(retiring.querySelector('dl'))] : null,
    topologies: [...document.querySelectorAll('tr[data-topology]')].map(r => ({
      name: r.dataset.topology, phase: r.dataset.phase,
      cells: Object.fromEntries([...r.querySelectorAll('td[data-label]')]
        .map(c => [c.dataset.label, c.textContent])),
    })),
  };
})()";

/// The event id of the status the page shows, when that status is a numbered change (not a
/// connection's opening one).
fn shown_event(page: &Value) -> Option<u64> {
    if page["opening"] == true {
        return None;
    }
    page["id"].as_str()?.parse().ok()
}

/// Waits until the page shows a status it was sent as a numbered event, then checks that every
/// number, state and retiring life it shows is that status's (`/api/status` at the same event
/// id), written as the page writes them, and that the console has no error; again at every
/// later status the page shows until `until` holds of the status and the page's reading.
/// Returns that status.
fn page_shows_status(
    browser: &Browser,
    feed: &StatusFeed,
    what: &str,
    until: impl Fn(&Value, &Value) -> bool,
) -> Value {
    let deadline = Instant::now() + PATIENCE;
    let mut checked = None;
    loop {
        let page = browser.wait_for(
            &format!("the page shows a newer numbered status ({what})"),
            PAGE_NUMBERS,
            |page| shown_event(page).is_some_and(|id| checked != Some(id) && feed.at(id).is_some()),
        );
        let id = shown_event(&page).unwrap();
        let status = feed.at(id).unwrap();
        let expected = page_of(&status, &page);
        assert_eq!(
            reading(&page),
            expected,
            "the page shows status event {id} as it is ({what}); the status: {status:#}"
        );
        no_console_errors(browser, what);
        if until(&status, &page) {
            return status;
        }
        checked = Some(id);
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}; last status: {status:#}"
        );
    }
}

/// Fails on any error in the browser's console since the last look.
fn no_console_errors(browser: &Browser, when: &str) {
    let errors: Vec<ConsoleEntry> = browser
        .console()
        .into_iter()
        .filter(ConsoleEntry::is_error)
        .collect();
    assert!(
        errors.is_empty(),
        "the page's console has errors ({when}): {errors:#?}"
    );
}

/// What the page reads of a status, without what only locates it (the id, the route).
fn reading(page: &Value) -> Value {
    json!({
        "steps": page["steps"],
        "summary": page["summary"],
        "details": page["details"],
        "retiring": page["retiring"],
        "topologies": page["topologies"],
    })
}

/// What the page shows of `status` on the route it is on (`page["hash"]`), with the step it
/// has selected, as `reading` has it: the page's own writing (`web/src/topology.tsx`,
/// `overview.tsx`, `format.ts`), from the status document.
fn page_of(status: &Value, page: &Value) -> Value {
    let hash = page["hash"].as_str().unwrap_or_default();
    let Some(name) = hash.strip_prefix("#/topology/") else {
        let rows: Vec<Value> = status["topologies"]
            .as_array()
            .into_iter()
            .flatten()
            .map(overview_row)
            .collect();
        let topologies = rows.len() as u64;
        let summary = format!(
            "Branch {} at {} · {} · {}",
            status["branch"].as_str().unwrap_or_default(),
            short(&status["commit"]),
            phase(&status["phase"]),
            plural(topologies, "topology", "topologies")
        );
        return json!({
            "steps": [], "summary": summary, "details": null, "retiring": null,
            "topologies": rows,
        });
    };
    let t = topology(status, name);
    let steps: Vec<&Value> = t["steps"].as_array().into_iter().flatten().collect();
    let selected = page["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["selected"] == true)
        .and_then(|s| s["step"].as_str());
    let chosen = steps
        .iter()
        .find(|s| Some(s["name"].as_str().unwrap()) == selected);
    // The nodes in the page's order (data flow), matched by name.
    let nodes: Vec<Value> = page["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|drawn| {
            let s = steps.iter().find(|s| s["name"] == drawn["step"])?;
            Some(step_node(name, s, drawn))
        })
        .collect();
    let mut expected_nodes = nodes;
    // A step of the status the page does not draw shows as missing.
    for s in &steps {
        if !page["steps"]
            .as_array()
            .is_some_and(|drawn| drawn.iter().any(|d| d["step"] == s["name"]))
        {
            expected_nodes.push(step_node(name, s, &Value::Null));
        }
    }
    let summary = t["name"].is_string().then(|| {
        format!(
            "{} · commit {} · {} · total lag {} · {} rec/s{}",
            phase(&t["phase"]),
            short(&t["commit"]),
            plural(steps.len() as u64, "step", "steps"),
            count(total_lag(t)),
            rate(total_rate(t)),
            t["delivery"]
                .as_str()
                .map(|d| format!(" · {d}"))
                .unwrap_or_default()
        )
    });
    json!({
        "steps": expected_nodes,
        "summary": summary,
        "details": chosen.map(|s| step_details(s)),
        "retiring": chosen.and_then(|s| s["retiring"].as_object().map(|_| retiring_details(&s["retiring"]))),
        "topologies": [],
    })
}

/// A drawn step as `PAGE_NUMBERS` reads it; `drawn`, what it read (for whether the step is
/// selected, and names the node has no room for, which the page shortens with an ellipsis).
fn step_node(topology: &str, s: &Value, drawn: &Value) -> Value {
    let selected = drawn["selected"] == true;
    // A name written whole, or its beginning and "…" (`fit`); never a number.
    let fitted = |class: &str, text: &str| {
        let shown = drawn["lines"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l[0] == class)
            .and_then(|l| l[1].as_str())
            .unwrap_or_default();
        match shown.strip_suffix('…') {
            Some(start) if !start.is_empty() && text.starts_with(start) => shown.to_owned(),
            _ => text.to_owned(),
        }
    };
    let name = s["name"].as_str().unwrap();
    let kind = s["kind"].as_str().unwrap();
    let state = s["state"].as_str().unwrap();
    let processor = kind == "processor";
    let kind_label = match s["transform"].as_str() {
        Some(transform) if processor => format!("processor · {transform}"),
        _ => kind.to_owned(),
    };
    let mut lines = vec![
        json!(["kind-label", kind_label.clone()]),
        json!(["badge", badge(state)]),
        json!(["name", fitted("name", name)]),
    ];
    let old = &s["retiring"];
    if processor {
        let replicas = match s["replicas"].as_u64() {
            Some(n) => plural(n, "replica", "replicas"),
            None => "— replicas".to_owned(),
        };
        lines.push(json!([
            "detail",
            format!(
                "{replicas} · {} rec/s",
                rate(s["recordsPerSecond"].as_f64())
            )
        ]));
        lines.push(json!([
            "detail",
            format!("lag {}", count(s["lag"].as_i64()))
        ]));
        if old.is_object() {
            lines.push(json!([
                "detail retiring-line",
                format!(
                    "replacing {}: {}, lag {}",
                    short_group(topology, name, old["group"].as_str().unwrap()),
                    retiring_state(old["state"].as_str().unwrap()),
                    count(old["lag"].as_i64())
                )
            ]));
        }
    } else {
        let topic = s["topic"].as_str().unwrap_or_default();
        lines.push(json!(["detail", fitted("detail", topic)]));
    }
    let retiring = processor && old.is_object();
    // What assistive technology says: the numbers unrounded, as JavaScript prints them.
    let known = |v: &Value| match v {
        Value::Number(n) => n.as_f64().map_or(n.to_string(), |f| f.to_string()),
        _ => "unknown".to_owned(),
    };
    let spoken = if processor {
        format!(
            ", {} replicas, lag {}, {} records per second",
            known(&s["replicas"]),
            known(&s["lag"]),
            known(&s["recordsPerSecond"])
        )
    } else {
        s["topic"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(|t| format!(", topic {t}"))
            .unwrap_or_default()
    };
    let spoken_retiring = if retiring {
        format!(
            ", replacing life {}, {}, {} replicas, lag {}",
            old["group"].as_str().unwrap(),
            retiring_state(old["state"].as_str().unwrap()),
            known(&old["replicas"]),
            known(&old["lag"])
        )
    } else {
        String::new()
    };
    json!({
        "label": format!("{kind_label} {name}, {state}{spoken}{spoken_retiring}"),
        "step": name,
        "kind": kind,
        "state": state,
        "retiring": if retiring { old["group"].clone() } else { Value::Null },
        "retiringState": if retiring { old["state"].clone() } else { Value::Null },
        "selected": selected,
        "lines": lines,
    })
}

/// The rows of a step's details (`StepDetails`).
fn step_details(s: &Value) -> Value {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let mut rows = vec![
        ("State", Some(badge(s["state"].as_str().unwrap()))),
        ("File", text(&s["file"])),
        ("Topic", text(&s["topic"])),
        ("Transform", text(&s["transform"])),
        ("Identity", text(&s["identity"])),
        ("Group", text(&s["group"])),
        ("Internal topic", text(&s["internalTopic"])),
        ("Dead-letter topic", text(&s["deadLetterTopic"])),
    ];
    if s["kind"] == "processor" {
        let scale = &s["scale"];
        rows.push((
            "Replicas",
            Some(format!(
                "{}{}",
                s["replicas"]
                    .as_u64()
                    .map_or("—".to_owned(), |n| n.to_string()),
                if scale.is_object() {
                    format!(" (scale {}..{})", scale["min"], scale["max"])
                } else {
                    String::new()
                }
            )),
        ));
        rows.push(("Lag", Some(count(s["lag"].as_i64()))));
        rows.push(("Records/s", Some(rate(s["recordsPerSecond"].as_f64()))));
        // A stateful step's state (`StateRows`).
        let kept = &s["keepsState"];
        if kept.is_object() {
            let restoring = match kept["restoringEntries"].as_i64() {
                Some(n) if n > 0 => format!(", restoring ({} entries read)", count(Some(n))),
                _ => String::new(),
            };
            rows.push((
                "State",
                Some(format!(
                    "{} groups{restoring}",
                    count(kept["groups"].as_i64())
                )),
            ));
            rows.push((
                "Watermark",
                Some(kept["watermarkMs"].as_i64().map_or(
                    "no record counted yet".to_owned(),
                    |ms| {
                        humantime::format_rfc3339_millis(
                            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64),
                        )
                        .to_string()
                    },
                )),
            ));
            rows.push((
                "State started",
                Some(
                    match kept["startedFrom"].as_str().unwrap_or_default() {
                        "restore" => "restored from its changelog",
                        "rebuild" => "rebuilt from the records before the cutover",
                        "earliest" => "rebuilt from the earliest records",
                        "empty" => "empty at its start",
                        "cannot" => "waiting: the step file must set stateStart",
                        other => other,
                    }
                    .to_owned(),
                ),
            ));
            rows.push(("Changelog", kept["changelog"].as_str().map(str::to_owned)));
        }
    } else if let Some(lag) = s["lag"].as_i64() {
        rows.push(("Lag", Some(count(Some(lag)))));
    }
    let reads: Vec<&str> = s["inputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    rows.push(("Reads", Some(reads.join(", "))));
    shown_rows(rows)
}

/// The rows of a retiring life's details (`RetiringDetails`): group, then its rows.
fn retiring_details(life: &Value) -> Value {
    let state = life["state"].as_str().unwrap();
    json!([
        life["group"],
        shown_rows(vec![
            (
                "State",
                Some(format!("{} ({})", badge(state), retiring_state(state)))
            ),
            ("Group", life["group"].as_str().map(str::to_owned)),
            ("Identity", life["identity"].as_str().map(str::to_owned)),
            ("Replicas", life["replicas"].as_u64().map(|n| n.to_string())),
            ("Lag", Some(count(life["lag"].as_i64()))),
        ])
    ])
}

/// The `Row`s the page writes: none for a missing or empty value.
fn shown_rows(rows: Vec<(&str, Option<String>)>) -> Value {
    rows.into_iter()
        .filter_map(|(term, value)| value.filter(|v| !v.is_empty()).map(|v| json!([term, v])))
        .collect()
}

/// An overview row as `PAGE_NUMBERS` reads it (`Overview`).
fn overview_row(t: &Value) -> Value {
    let steps = t["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
    let kinds = |kind: &str| steps.iter().filter(|s| s["kind"] == kind).count();
    let cutover = &t["cutover"];
    let progress = match (cutover["done"].as_u64(), cutover["remaining"].as_u64()) {
        (Some(done), Some(remaining)) => format!(" {done}/{}", done + remaining),
        _ => String::new(),
    };
    let error = t["lastError"]
        .as_str()
        .map_or("none".to_owned(), |e| format!("✕ {e}"));
    json!({
        "name": t["name"],
        "phase": t["phase"],
        "cells": {
            "Commit": short(&t["commit"]),
            "Phase": format!("{}{progress}", phase(&t["phase"])),
            "Steps": format!(
                "{} ({} in · {} proc · {} out)",
                steps.len(),
                kinds("source"),
                kinds("processor"),
                kinds("sink")
            ),
            "Total lag": count(total_lag(t)),
            "Records/s": rate(total_rate(t)),
            "Error": error,
        },
    })
}

/// A topology's lag: its steps' and their retiring lives' (`totalLag`).
fn total_lag(t: &Value) -> Option<i64> {
    let lags: Vec<i64> = t["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| [s["lag"].as_i64(), s["retiring"]["lag"].as_i64()])
        .flatten()
        .collect();
    (!lags.is_empty()).then(|| lags.iter().sum())
}

/// A topology's records/s: its processors' (`totalRate`), added in the page's order.
fn total_rate(t: &Value) -> Option<f64> {
    let rates: Vec<f64> = t["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == "processor")
        .filter_map(|s| s["recordsPerSecond"].as_f64())
        .collect();
    (!rates.is_empty()).then(|| rates.iter().fold(0.0, |a, b| a + b))
}

fn badge(state: &str) -> String {
    match state {
        "running" => "● running".into(),
        "starting" => "◐ starting".into(),
        "stopped" => "■ stopped".into(),
        "pending" => "◌ pending".into(),
        "external" => "○ external".into(),
        other => other.into(),
    }
}

fn phase(phase: &Value) -> String {
    match phase.as_str().unwrap_or_default() {
        "idle" => "● idle".into(),
        "cutover" => "◆ cutover".into(),
        "error" => "✕ error".into(),
        other => other.into(),
    }
}

/// A retiring life's state, as what it does for the move.
fn retiring_state(state: &str) -> &str {
    match state {
        "running" => "draining",
        other => other,
    }
}

/// A life's group without the `plumber.<topology>.<step>.` every life shares: 8 hex digits of
/// the identity, then its life number if any.
fn short_group(topology: &str, step: &str, group: &str) -> String {
    match group.strip_prefix(&format!("plumber.{topology}.{step}.")) {
        Some(rest) if rest.len() >= 12 => format!("{}{}", &rest[..8], &rest[12..]),
        Some(rest) => rest[..rest.len().min(8)].to_owned(),
        None => group.to_owned(),
    }
}

fn short(commit: &Value) -> String {
    commit
        .as_str()
        .map_or("none".to_owned(), |c| c.chars().take(8).collect())
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `count` of `format.ts`: an integer as `Intl.NumberFormat('en-US')` writes it.
fn count(n: Option<i64>) -> String {
    n.map_or("—".to_owned(), |n| intl(n as f64, 0))
}

/// `rate` of `format.ts`: from 100 on an integer, below it one decimal.
fn rate(n: Option<f64>) -> String {
    n.map_or("—".to_owned(), |n| {
        intl(n, if n >= 100.0 { 0 } else { 1 })
    })
}

/// `n` as `Intl.NumberFormat('en-US', {minimumFractionDigits: fraction,
/// maximumFractionDigits: fraction})` writes it: the shortest decimal that reads back as `n`
/// (what JavaScript prints, and Rust's `Display` too), rounded half away from zero, its
/// thousands grouped with commas.
fn intl(n: f64, fraction: usize) -> String {
    let shortest = format!("{}", n.abs());
    let (whole, decimals) = shortest.split_once('.').unwrap_or((&shortest, ""));
    let mut digits: Vec<u8> = whole
        .bytes()
        .chain(
            decimals
                .bytes()
                .chain(std::iter::repeat(b'0'))
                .take(fraction),
        )
        .map(|b| b - b'0')
        .collect();
    if decimals
        .as_bytes()
        .get(fraction)
        .is_some_and(|&d| d >= b'5')
    {
        let mut at = digits.len();
        loop {
            if at == 0 {
                digits.insert(0, 1);
                break;
            }
            at -= 1;
            if digits[at] == 9 {
                digits[at] = 0;
            } else {
                digits[at] += 1;
                break;
            }
        }
    }
    let split = digits.len() - fraction;
    let whole: String = digits[..split]
        .iter()
        .map(|d| char::from(b'0' + d))
        .collect();
    let mut grouped = String::new();
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let decimals: String = digits[split..]
        .iter()
        .map(|d| char::from(b'0' + d))
        .collect();
    let sign = if n < 0.0 { "-" } else { "" };
    if fraction == 0 {
        format!("{sign}{grouped}")
    } else {
        format!("{sign}{grouped}.{decimals}")
    }
}

#[test]
fn numbers_are_written_as_the_pages_intl_number_format_writes_them() {
    let cases: &[(f64, usize, &str)] = &[
        (0.0, 1, "0.0"),
        (0.05, 1, "0.1"),
        (0.25, 1, "0.3"),
        (0.35, 1, "0.4"),
        (1.005, 2, "1.01"),
        (12.34, 1, "12.3"),
        (99.96, 1, "100.0"),
        (99.94, 1, "99.9"),
        (100.5, 0, "101"),
        (999.5, 0, "1,000"),
        (1234.0, 0, "1,234"),
        (1234567.4, 0, "1,234,567"),
        (1e-7, 1, "0.0"),
        (0.15, 1, "0.2"),
        (0.45, 1, "0.5"),
        (1.45, 1, "1.5"),
        (2.675, 2, "2.68"),
        (-2.5, 0, "-3"),
    ];
    for &(n, fraction, written) in cases {
        assert_eq!(intl(n, fraction), written, "{n} with {fraction} decimals");
    }
    assert_eq!(rate(Some(12.0)), "12.0");
    assert_eq!(rate(Some(150.4)), "150");
    assert_eq!(rate(None), "—");
    assert_eq!(count(Some(12345)), "12,345");
}

fn step<'a>(topology: &'a Value, name: &str) -> &'a Value {
    topology["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The http servers of a processor life's instances (the processes the local runtime starts
/// beside each, marked with its instance in their environment), paused (SIGSTOP) until
/// dropped (SIGCONT): the life's processors wait on their calls, so it drains as slowly as the
/// test needs, while they still answer the daemon (their metrics, their group).
struct Paused(Vec<nix::unistd::Pid>);

impl Paused {
    fn servers_of(group: &str) -> Paused {
        let marker = format!("{}={group}.", plumber::runtime::local::INSTANCE_OF_ENV);
        let pids: Vec<nix::unistd::Pid> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let read =
                    |file: &str| std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
                let server = !String::from_utf8_lossy(&read("cmdline")).contains("--group\0");
                server
                    && read("environ")
                        .split(|&b| b == 0)
                        .any(|var| var.starts_with(marker.as_bytes()))
            })
            .map(nix::unistd::Pid::from_raw)
            .collect();
        assert!(!pids.is_empty(), "no http server of {group} runs");
        for pid in &pids {
            nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        }
        Paused(pids)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGCONT);
        }
    }
}

/// The steps of vehicle-telemetry with a life retiring.
fn retiring_steps(status: &Value) -> Vec<String> {
    topology(status, "vehicle-telemetry")["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["retiring"].is_object())
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}

fn step_names(topology: &Value) -> Vec<String> {
    topology["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_page_shows_the_example_live_through_a_cutover_a_broken_commit_and_a_restart() {
    let broker = Broker::start();
    let repo = TestRepo::new();
    let main = repo.commit_snapshot("main", "The example topologies", &common::example_files());
    let state = tempfile::tempdir().unwrap();
    let (code, out, err) = common::run(&[
        "dev",
        "topics",
        &repo.location(),
        "--bootstrap",
        broker.bootstrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let records: Vec<TestRecord> = (0..20)
        .map(|n| {
            TestRecord::new(
                &format!("v{n}"),
                &json!({"vehicle": format!("v{n}"), "speed": 5 * n, "ts": n}).to_string(),
            )
        })
        .collect();
    broker.produce("vehicles.telemetry", &records);

    let port = free_port();
    let mut daemon = Daemon::start(&repo, &broker, state.path(), port);
    let status = daemon.wait_status("both example topologies run the first commit", |s| {
        ["clicks", "vehicle-telemetry"].iter().all(|name| {
            let t = topology(s, name);
            t["commit"] == main.to_string().as_str()
                && t["phase"] == "idle"
                && t["steps"].as_array().is_some_and(|steps| {
                    !steps.is_empty()
                        && steps.iter().all(|s| {
                            ["external", "running"].contains(&s["state"].as_str().unwrap_or(""))
                        })
                })
        })
    });

    let feed = StatusFeed::follow(&daemon.api);

    // Sample records keep flowing, as in `scripts/demo`, so records/s show.
    let _load = Process::spawn(
        "plumber dev load",
        Command::new(env!("CARGO_BIN_EXE_plumber"))
            .args(["dev", "load", "--bootstrap", broker.bootstrap()])
            .args(["--topic", "clicks.raw", "--topic", "vehicles.telemetry"])
            .args(["--rate", "20"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );

    let browser = Browser::start(PATIENCE);
    browser.goto(&format!("{}/", daemon.api));
    browser.wait_for(
        "the page is live",
        "document.querySelector('[data-connection]')?.dataset.connection",
        |v| v == "live",
    );
    browser.script("window.plumberTestMarker = 'not reloaded'; return null;");

    // Every topology on the overview.
    let rows = browser.wait_for(
        "every topology is listed",
        "[...document.querySelectorAll('[data-topology]')].map(e => e.dataset.topology)",
        |v| v.as_array().is_some_and(|a| a.len() >= 2),
    );
    assert_eq!(rows, json!(["clicks", "vehicle-telemetry"]));
    page_shows_status(&browser, &feed, "the overview", |_, _| true);
    let screenshots = std::env::var_os("PLUMBER_WEB_SCREENSHOTS").map(PathBuf::from);
    if let Some(dir) = &screenshots {
        std::fs::create_dir_all(dir).unwrap();
        browser.screenshot(&dir.join("overview.png"));
    }

    // Every step of each topology, with its state as status says.
    for name in ["clicks", "vehicle-telemetry"] {
        browser.script(&format!(
            "location.hash = '#/topology/{name}'; return null;"
        ));
        let mut wanted = step_names(topology(&status, name));
        wanted.sort();
        assert!(wanted.len() >= 6, "{status:#}");
        browser.wait_for(
            &format!("every step of {name} is drawn"),
            "[...document.querySelectorAll('svg [data-step]')].map(e => e.dataset.step).sort()",
            |v| *v == json!(wanted),
        );
        for (state, text) in browser.elements("svg [data-step][data-kind=processor]", "data-state")
        {
            assert!(
                ["running", "starting"].contains(&state.as_str()),
                "a processor of {name} is {state}: {text}"
            );
            assert!(
                text.contains("replica"),
                "replicas on each processor: {text}"
            );
            assert!(text.contains("lag"), "lag on each processor: {text}");
            assert!(
                text.contains("rec/s"),
                "records/s on each processor: {text}"
            );
        }
        page_shows_status(&browser, &feed, &format!("the steps of {name}"), |_, _| {
            true
        });
    }
    // Records/s as the processors' own metrics count them.
    page_shows_status(
        &browser,
        &feed,
        "moving shows the records it reads per second",
        |status, _| {
            step(topology(status, "vehicle-telemetry"), "moving")["recordsPerSecond"]
                .as_f64()
                .is_some_and(|rate| rate > 0.0)
        },
    );

    // From the keyboard: Tab reaches the `moving` step, Enter opens its details.
    let mut focused = Value::Null;
    for _ in 0..60 {
        browser.press(Key::Tab);
        focused = browser.script("return document.activeElement?.dataset?.step ?? null;");
        if focused == "moving" {
            break;
        }
    }
    assert_eq!(focused, "moving", "Tab reaches every step of the DAG");
    browser.press(Key::Enter);
    let group = topology(&status, "vehicle-telemetry")["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["name"] == "moving"))
        .map(|s| s["group"].as_str().unwrap().to_owned())
        .unwrap();
    browser.wait_for(
        "Enter shows the step's details: its group and dead-letter topic",
        "document.querySelector('aside.details')?.textContent ?? ''",
        |v| {
            v.as_str().is_some_and(|t| {
                t.contains(&group) && t.contains("plumber.vehicle-telemetry.moving.dlq")
            })
        },
    );
    page_shows_status(&browser, &feed, "the details of moving", |_, _| true);

    browser.wait_for(
        "the first deployment is in the history",
        "[...document.querySelectorAll('[data-history]')].map(e => e.dataset.to)",
        |v| {
            v.as_array()
                .is_some_and(|a| a.contains(&json!(main.to_string())))
        },
    );
    if let Some(dir) = &screenshots {
        browser.screenshot(&dir.join("topology.png"));
    }

    // A commit that replaces `moving` and adds a step whose source topic does not exist yet:
    // the cutover waits for it, action by action on the page. Replacing `moving` replaces
    // `risk-score` below it too, whose old life drains what the old `moving` wrote before it
    // stops: its model server paused until the page has shown it retiring (else how long it
    // retires is up to the machine, and may be shorter than one status event).
    let old_risk = step(topology(&status, "vehicle-telemetry"), "risk-score")["group"]
        .as_str()
        .unwrap()
        .to_owned();
    browser.script(
        "document.querySelector(\"section[aria-labelledby=dag-title] svg [data-step='risk-score']\")\
         .focus(); return null;",
    );
    let paused = Paused::servers_of(&old_risk);
    let late = unique("vehicles-late");
    let late_out = unique("vehicles-late-out");
    broker.create_topic(&late_out, 1);
    let replaced = repo.commit(
        "main",
        "Only fast vehicles, and late readings",
        &[
            write(
                "topologies/vehicle-telemetry/steps/moving.yaml",
                "kind: processor\ninput: telemetry\njq: 'select(.speed > 20)'\n\
                 scale: { min: 1, max: 10, lagThreshold: 500 }\n",
            ),
            write(
                "topologies/vehicle-telemetry/sources/late.yaml",
                format!("kind: source\ntopic: {late}\n"),
            ),
            write(
                "topologies/vehicle-telemetry/steps/late-copy.yaml",
                "kind: processor\ninput: late\njq: '.'\n",
            ),
            write(
                "topologies/vehicle-telemetry/sinks/late-out.yaml",
                format!("kind: sink\ntopic: {late_out}\ninput: late-copy\n"),
            ),
        ],
    );
    // The life the move retires, on its step and in its details, as status has it; then
    // it may drain and stop (it leaves the step: checked below).
    let retires = |status: &Value| {
        step(topology(status, "vehicle-telemetry"), "risk-score")["retiring"]["group"] == *old_risk
    };
    page_shows_status(
        &browser,
        &feed,
        "risk-score's old life retires, on its node and in its details",
        |status, page| retires(status) && page["retiring"][0] == *old_risk,
    );
    drop(paused);
    let waiting = browser.wait_for(
        "the cutover waits for the missing topic, action by action",
        "[...document.querySelectorAll('[data-cutover] [data-action]')]\
         .map(e => [e.dataset.actionState, e.textContent])",
        |v| {
            v.as_array().is_some_and(|actions| {
                actions
                    .iter()
                    .any(|a| a[0] == "waiting" && a[1].as_str().is_some_and(|t| t.contains(&late)))
            })
        },
    );
    eprintln!("cutover actions on the page: {waiting:#}");
    browser.wait_for(
        "the new step is drawn during the move",
        "!!document.querySelector(\"svg [data-step='late-copy']\")",
        |v| v == true,
    );
    if let Some(dir) = &screenshots {
        browser.screenshot(&dir.join("cutover.png"));
    }
    broker.create_topic(&late, 1);
    browser.wait_for(
        "the cutover finishes and its history entry shows",
        "[!document.querySelector('[data-cutover]'), \
          [...document.querySelectorAll('[data-history]')].map(e => e.dataset.to)]",
        |v| {
            v[0] == true
                && v[1]
                    .as_array()
                    .is_some_and(|a| a.contains(&json!(replaced.to_string())))
        },
    );
    page_shows_status(
        &browser,
        &feed,
        "the steps after the cutover",
        |status, _| {
            topology(status, "vehicle-telemetry")["cutover"].is_null()
                && retiring_steps(status).is_empty()
        },
    );
    let history = browser.elements(&format!("[data-history][data-to='{replaced}']"), "data-to");
    assert!(
        history[0].1.contains("Only fast vehicles"),
        "the entry shows the commit's message: {history:?}"
    );

    // A broken commit: its error with file and line, on the overview too.
    let broken = repo.commit(
        "main",
        "A typo",
        &[write(
            "topologies/clicks/steps/normalize.yaml",
            "kind: processor\ninput: raw-clicks\njq: '.'\npartitons: 3\n",
        )],
    );
    browser.script("location.hash = '#/'; return null;");
    let error = browser.wait_for(
        "the broken commit's error shows with its file and line",
        "[...document.querySelectorAll('[data-error]')].map(e => e.textContent).join('\\n')",
        |v| {
            v.as_str()
                .is_some_and(|t| t.contains("topologies/clicks/steps/normalize.yaml:4"))
        },
    );
    assert!(error.as_str().unwrap().contains("partitons"), "{error}");
    if let Some(dir) = &screenshots {
        browser.screenshot(&dir.join("error.png"));
    }
    let status = daemon.status().unwrap();
    assert_eq!(status["lastError"]["commit"], broken.to_string().as_str());
    page_shows_status(
        &browser,
        &feed,
        "the overview with the error",
        |status, _| status["lastError"]["commit"] == broken.to_string().as_str(),
    );

    // The daemon goes away and comes back: the page reconnects by itself.
    daemon.stop();
    browser.wait_for(
        "the page says it lost the daemon",
        "document.querySelector('[data-connection]')?.dataset.connection",
        |v| v == "reconnecting",
    );
    let daemon = Daemon::start(&repo, &broker, state.path(), port);
    daemon.wait_status("the restarted daemon knows the broken head", |s| {
        s["lastError"]["commit"] == broken.to_string().as_str()
    });
    let feed = StatusFeed::follow(&daemon.api);
    browser.wait_for(
        "the page is live again and shows the error again",
        "[document.querySelector('[data-connection]')?.dataset.connection, \
          [...document.querySelectorAll('[data-error]')].map(e => e.textContent).join('\\n')]",
        |v| {
            v[0] == "live"
                && v[1]
                    .as_str()
                    .is_some_and(|t| t.contains("normalize.yaml:4"))
        },
    );
    // While the daemon was away, the page's attempts to reconnect failed: those, and only
    // those, are errors the console may have.
    let reconnecting = format!("{}/api/events - Failed to load resource: ", daemon.api);
    let errors: Vec<ConsoleEntry> = browser
        .console()
        .into_iter()
        .filter(|e| e.is_error())
        .filter(|e| !(e.source == "network" && e.message.starts_with(&reconnecting)))
        .collect();
    assert!(
        errors.is_empty(),
        "the console has errors besides failed reconnections: {errors:#?}"
    );
    page_shows_status(&browser, &feed, "the restarted daemon's status", |_, _| {
        true
    });
    assert_eq!(
        browser.script("return window.plumberTestMarker ?? null;"),
        "not reloaded",
        "everything above happened without a reload"
    );
    let elsewhere = browser.script(&format!(
        "return performance.getEntriesByType('resource').map(e => e.name)\
         .filter(u => !u.startsWith({:?}) && !u.startsWith('data:'));",
        daemon.api
    ));
    assert_eq!(
        elsewhere,
        json!([]),
        "the page asks nothing of anyone but the daemon"
    );

    // At a phone's width the page still shows every topology.
    browser.resize(390, 844);
    browser.wait_for(
        "the overview at a phone's width",
        "document.querySelectorAll('[data-topology]').length",
        |v| v == 2,
    );
    no_console_errors(&browser, "at the end");
    drop(daemon);
}

/// One Server-Sent Event as read off the wire.
#[derive(Debug, Default, Clone)]
struct WireEvent {
    id: Option<u64>,
    kind: String,
    data: String,
    retry: Option<u64>,
}

/// Reads `/api/events`, event by event.
struct EventStream {
    lines: Box<dyn Iterator<Item = std::io::Result<String>>>,
}

impl EventStream {
    fn connect(api: &str) -> EventStream {
        EventStream::open(api, false)
    }

    /// Asking for gzip, as browsers do; the stream is decoded here as it arrives (an event
    /// the daemon did not flush whole would hang the read).
    fn connect_gzip(api: &str) -> EventStream {
        EventStream::open(api, true)
    }

    fn open(api: &str, gzip: bool) -> EventStream {
        use std::io::BufRead as _;
        let mut request =
            ureq::get(&format!("{api}/api/events")).header("Accept", "text/event-stream");
        if gzip {
            request = request.header("Accept-Encoding", "gzip");
        }
        let response = request
            .config()
            .timeout_global(None)
            .timeout_recv_body(Some(PATIENCE))
            .build()
            .call()
            .unwrap();
        let encoding = response
            .headers()
            .get("content-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(encoding.as_deref(), gzip.then_some("gzip"));
        let body = response.into_body().into_reader();
        let reader: Box<dyn std::io::Read> = if gzip {
            Box::new(flate2::read::GzDecoder::new(body))
        } else {
            Box::new(body)
        };
        EventStream {
            lines: Box::new(std::io::BufReader::new(reader).lines()),
        }
    }

    /// Reads what is left until the daemon ends the stream; an error if it did not end
    /// cleanly (for a gzipped stream: without the gzip trailer).
    fn read_to_end(&mut self) -> std::io::Result<()> {
        for line in self.lines.by_ref() {
            line?;
        }
        Ok(())
    }

    /// The next event; `None` when the daemon closed the stream.
    fn next(&mut self) -> Option<WireEvent> {
        let mut event = WireEvent::default();
        let mut any = false;
        for line in self.lines.by_ref() {
            let Ok(line) = line else { return None };
            if line.is_empty() {
                if any {
                    return Some(event);
                }
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            // A comment (the keep-alive) is no field.
            any |= !field.is_empty();
            match field {
                "id" => event.id = value.parse().ok(),
                "event" => event.kind = value.to_owned(),
                "data" => event.data.push_str(value),
                "retry" => event.retry = value.parse().ok(),
                _ => {}
            }
        }
        None
    }
}

#[test]
fn the_event_stream_sends_the_status_first_then_numbered_events_at_a_bounded_rate_and_again_after_a_restart()
 {
    let broker = Broker::start();
    let source = unique("events-in");
    let sink = unique("events-out");
    broker.create_topic(&source, 1);
    broker.create_topic(&sink, 1);
    let repo = TestRepo::new();
    let files = |program: &str| {
        vec![
            write(
                "topologies/t/in.yaml",
                format!("kind: source\ntopic: {source}\n"),
            ),
            write(
                "topologies/t/clean.yaml",
                format!("kind: processor\ninput: in\njq: '{program}'\n"),
            ),
            write(
                "topologies/t/out.yaml",
                format!("kind: sink\ntopic: {sink}\ninput: clean\n"),
            ),
        ]
    };
    let first = repo.commit("main", "first", &files("."));
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut daemon = Daemon::start(&repo, &broker, state.path(), port);
    daemon.wait_status("t runs the first commit", |s| {
        topology(s, "t")["commit"] == first.to_string().as_str()
            && topology(s, "t")["phase"] == "idle"
    });

    // `plumber status --watch` follows the same stream, one document per line in JSON.
    let mut watch_command = Command::new(env!("CARGO_BIN_EXE_plumber"));
    watch_command
        .args([
            "status",
            "--watch",
            "--format",
            "json",
            "--server",
            &daemon.api,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut watcher = Process::spawn("plumber status --watch", &mut watch_command);
    let documents = {
        use std::io::BufRead as _;
        let stdout = watcher.stdout().unwrap();
        let (sender, receiver) = std::sync::mpsc::channel::<Value>();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(serde_json::from_str(&line).unwrap()).is_err() {
                    return;
                }
            }
        });
        receiver
    };
    let watched = |what: &str, condition: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let document = documents
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("plumber status --watch never printed {what}"));
            if condition(&document) {
                return document;
            }
        }
    };
    watched("the status", &|d| {
        topology(d, "t")["commit"] == first.to_string().as_str()
    });

    let mut stream = EventStream::connect(&daemon.api);
    let opening = stream.next().unwrap();
    assert_eq!(opening.kind, "status", "{opening:?}");
    assert_eq!(
        opening.retry,
        Some(2000),
        "the browser's reconnection delay comes first"
    );
    let document: Value = serde_json::from_str(&opening.data).unwrap();
    assert_eq!(document["branch"], "main");
    assert_eq!(
        topology(&document, "t")["commit"],
        first.to_string().as_str()
    );

    // Gzipped as a browser asks for it: the same status first, decoded as it arrives.
    let mut gzipped = EventStream::connect_gzip(&daemon.api);
    let opening_gzipped = gzipped.next().unwrap();
    assert_eq!(opening_gzipped.kind, "status");
    assert_eq!(opening_gzipped.retry, Some(2000));
    let document_gzipped: Value = serde_json::from_str(&opening_gzipped.data).unwrap();
    assert_eq!(
        topology(&document_gzipped, "t")["commit"],
        first.to_string().as_str()
    );
    // And the API's other answers, gzipped when asked for.
    let status = ureq::get(&format!("{}/api/status", daemon.api))
        .header("Accept-Encoding", "gzip")
        .call()
        .unwrap();
    assert_eq!(status.headers()["content-encoding"], "gzip");
    let status: Value = serde_json::from_reader(flate2::read::GzDecoder::new(
        status.into_body().into_reader(),
    ))
    .unwrap();
    assert_eq!(status["branch"], "main");

    // Records flow while a commit moves the topology: many status changes, one history event.
    let started = Instant::now();
    let moved = repo.commit("main", "tag records", &files(".tagged = true"));
    broker.produce(
        &source,
        &(0..50)
            .map(|n| TestRecord::new(&format!("k{n}"), &format!("{{\"n\":{n}}}")))
            .collect::<Vec<_>>(),
    );
    let mut seen = vec![opening];
    let (mut history, mut settled) = (None, false);
    while history.is_none() || !settled {
        let event = stream.next().expect("the stream goes on");
        let data: Value = serde_json::from_str(&event.data).unwrap();
        match event.kind.as_str() {
            "history" if data["to"] == moved.to_string().as_str() => history = Some(data),
            "status" => {
                let t = topology(&data, "t");
                settled = t["commit"] == moved.to_string().as_str() && t["phase"] == "idle";
            }
            _ => {}
        }
        seen.push(event);
    }
    let elapsed = started.elapsed();
    let ids: Vec<u64> = seen.iter().map(|e| e.id.unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "numbered in order: {ids:?}"
    );
    let statuses: Vec<&WireEvent> = seen.iter().filter(|e| e.kind == "status").collect();
    let allowed = (elapsed.as_millis() / 500) as usize + 2;
    assert!(
        statuses.len() <= allowed,
        "{} status events in {elapsed:?}: more than one per 500 ms",
        statuses.len()
    );
    assert!(
        statuses.windows(2).all(|w| w[0].data != w[1].data),
        "an unchanged status is never sent again"
    );
    let history = history.unwrap();
    assert_eq!(history["message"], "tag records");
    assert_eq!(history["topology"], "t");
    // The gzipped stream carried the same events, each decoded on its own.
    let gzipped_history = std::iter::from_fn(|| gzipped.next())
        .find(|e| e.kind == "history")
        .expect("the gzipped stream has the history event");
    assert_eq!(
        serde_json::from_str::<Value>(&gzipped_history.data).unwrap(),
        history
    );

    // A daemon that restarts ends the stream; connecting again starts with the status.
    daemon.stop();
    assert!(stream.next().is_none(), "the stream ends with the daemon");
    let rest = gzipped.read_to_end();
    assert!(
        rest.is_ok(),
        "the gzipped stream ends with the daemon, with its gzip trailer: {rest:?}"
    );
    let daemon = Daemon::start(&repo, &broker, state.path(), port);
    daemon.wait_status("the restarted daemon runs the new commit", |s| {
        topology(s, "t")["commit"] == moved.to_string().as_str()
    });
    watched("the restarted daemon's status", &|d| {
        topology(d, "t")["commit"] == moved.to_string().as_str()
    });
    watcher.kill();
    let mut again = EventStream::connect(&daemon.api);
    let reopened = again.next().unwrap();
    assert_eq!(
        (reopened.kind.as_str(), reopened.retry),
        ("status", Some(2000))
    );
    let document: Value = serde_json::from_str(&reopened.data).unwrap();
    assert_eq!(
        topology(&document, "t")["commit"],
        moved.to_string().as_str()
    );
}
