//! `--exec -- CMD…`: a long-lived child process speaking a line protocol.
//!
//! For each input the processor writes one line to the child's stdin: the JSON envelope
//! (`id`, `topic`, `partition`, `offset`, `timestamp`, `key`, `headers`, `value`). The child
//! answers with **one line** naming the same `id`: `{"id": N, "outputs": [output objects…]}`
//! (`[]` filters the record out) or `{"id": N, "error": "why"}` to dead-letter it. Output
//! objects are `{"value": …}`, optionally with `"key"` and `"headers"`. Blank lines are
//! ignored, and so is a second answer to a record answered before. An answer counts only for
//! the record whose id it names, so nothing the child prints can shift outputs onto another
//! record: a line that is not an answer, an answer for an id not sent yet, or a line longer
//! than [`MAX_ANSWER`] dead-letters the record in hand as `protocol` and restarts the child
//! (which may be out of step). stderr is passed through.
//!
//! A child that exits, or does not answer within `--transform-timeout`, is restarted with
//! exponential backoff and the record is tried again, for up to `--attempts` attempts and
//! within `--record-timeout`; then the record is dead-lettered (`exec-failed`, or `timeout`
//! when the record's time ran out).
//!
//! Lines go to the child from a thread of their own and come back through another, so a
//! child that stops reading or writing never blocks the processor past the deadline.

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use super::child::{self, Child};
use super::{Error, MAX_ANSWER, Outcome, Retries, Transform, timed_out};
use crate::metrics::Metrics;
use crate::record::{Envelope, ExecAnswer, Input, Rejection, display_bounded};
use crate::stop::Stop;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How much of a line that is not an answer the dead letter quotes.
const QUOTED: usize = 200;

pub struct Exec {
    command: Vec<String>,
    child: Option<Running>,
    retries: Retries,
    /// Consecutive failed starts or crashes, for the backoff; reset by a handled record.
    failures: u32,
    started_once: bool,
    /// The id of the next record sent; ids never repeat, across restarts of the child too.
    next_id: u64,
    metrics: Metrics,
}

struct Running {
    child: Child,
    to_child: Sender<Vec<u8>>,
    lines: Receiver<Line>,
}

/// What the stdout thread read.
enum Line {
    Text(Vec<u8>),
    /// A line longer than [`MAX_ANSWER`]; the thread stopped reading.
    TooLong,
    Failed(std::io::Error),
}

/// How one attempt ended, when it did not give an answer.
enum Failure {
    /// The child exited or closed a pipe: restart and retry.
    Crashed(String),
    /// No answer before the call's deadline: restart and retry.
    TimedOut(String),
    /// The child wrote something that is not the answer to the record in hand.
    Protocol(String),
    /// A stop asked to abandon the record.
    Abandoned,
}

impl Exec {
    pub fn new(command: Vec<String>, retries: Retries, metrics: Metrics) -> Result<Self, Error> {
        let mut exec = Exec {
            command,
            child: None,
            retries,
            failures: 0,
            started_once: false,
            next_id: 1,
            metrics,
        };
        // Start now, so a wrong command is a start-up error, not a dead-lettered record.
        exec.ensure_running()?;
        Ok(exec)
    }

    fn spawn_error(&self, source: std::io::Error) -> Error {
        Error::Spawn {
            command: self.command.join(" "),
            source,
        }
    }

    fn ensure_running(&mut self) -> Result<&mut Running, Error> {
        if self.child.is_none() {
            let (mut child, stdin, stdout) =
                child::spawn(&self.command).map_err(|source| self.spawn_error(source))?;
            let (to_child, jobs) = channel();
            let (sender, lines) = channel();
            let threads = std::thread::Builder::new()
                .name("exec-stdin".into())
                .spawn(move || write_lines(stdin, &jobs))
                .and_then(|_| {
                    std::thread::Builder::new()
                        .name("exec-stdout".into())
                        .spawn(move || read_lines(stdout, &sender))
                });
            if let Err(source) = threads {
                child.kill();
                return Err(self.spawn_error(source));
            }
            if self.started_once {
                self.metrics.exec_restarts.inc();
            }
            self.started_once = true;
            tracing::info!(pid = child.id(), command = %self.command.join(" "), "exec child started");
            self.child = Some(Running {
                child,
                to_child,
                lines,
            });
        }
        self.child.as_mut().ok_or_else(|| Error::Spawn {
            command: String::new(),
            source: std::io::Error::other("child vanished"),
        })
    }

    /// Sends `line` and waits for the answer naming `id` until `until`.
    fn attempt(
        &mut self,
        line: &[u8],
        id: u64,
        until: Instant,
        stop: &Stop,
    ) -> Result<Result<ExecAnswer, Failure>, Error> {
        let call_timeout = self.retries.call_timeout;
        let running = self.ensure_running()?;
        if running.to_child.send(line.to_vec()).is_err() {
            return Ok(Err(Failure::Crashed(
                "the child's stdin is closed".to_owned(),
            )));
        }
        loop {
            if stop.abandon_in_flight() {
                return Ok(Err(Failure::Abandoned));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Err(Failure::TimedOut(format!(
                    "no answer within {} s",
                    call_timeout.as_secs()
                ))));
            }
            let failure = match running
                .lines
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(Line::Text(text)) if text.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(Line::Text(text)) => match serde_json::from_slice::<ExecAnswer>(&text) {
                    Ok(answer) if answer.id == id => return Ok(Ok(answer)),
                    Ok(answer) if answer.id < id => {
                        // A second answer to a record already answered: it names its
                        // record, so it cannot shift anything.
                        tracing::warn!(
                            answered = answer.id,
                            in_hand = id,
                            "exec child answered a record twice; the late answer is ignored"
                        );
                        continue;
                    }
                    Ok(answer) => Failure::Protocol(format!(
                        "the child answered id {} while the record in hand has id {id}",
                        answer.id
                    )),
                    Err(e) => Failure::Protocol(format!(
                        "the child wrote a line that is not an answer ({e}): {}; \
                         answer each input line with one line \
                         {{\"id\": …, \"outputs\": […]}}, and write logs to stderr",
                        quote(&text)
                    )),
                },
                Ok(Line::TooLong) => Failure::Protocol(format!(
                    "the child wrote a line longer than {MAX_ANSWER} bytes"
                )),
                Ok(Line::Failed(e)) => {
                    Failure::Crashed(format!("reading from the child failed: {e}"))
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    Failure::Crashed(format!("the child exited ({})", running.child.wait()))
                }
            };
            return Ok(Err(failure));
        }
    }

    fn kill_child(&mut self) {
        if let Some(mut running) = self.child.take() {
            running.child.kill();
        }
    }

    fn backoff(&self) -> Duration {
        FIRST_BACKOFF
            .saturating_mul(1 << self.failures.min(10))
            .min(MAX_BACKOFF)
    }
}

/// Writes each line to the child until the child or the processor is gone.
fn write_lines(mut stdin: File, jobs: &Receiver<Vec<u8>>) {
    for line in jobs {
        if stdin.write_all(&line).and_then(|()| stdin.flush()).is_err() {
            return;
        }
    }
}

/// Sends each line of the child's stdout, without its newline; stops at the end of the
/// output, or after a line longer than [`MAX_ANSWER`] (so memory stays bounded).
fn read_lines(stdout: File, lines: &Sender<Line>) {
    let mut reader = BufReader::with_capacity(64 << 10, stdout);
    let mut line = Vec::new();
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = lines.send(Line::Failed(e));
                return;
            }
        };
        if available.is_empty() {
            // A line cut by the child's exit is no answer: the exit is what is reported.
            return;
        }
        let (taken, complete) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (end + 1, true),
            None => (available.len(), false),
        };
        let text = &available[..if complete { taken - 1 } else { taken }];
        if line.len() + text.len() > MAX_ANSWER {
            let _ = lines.send(Line::TooLong);
            return;
        }
        line.extend_from_slice(text);
        reader.consume(taken);
        if complete && lines.send(Line::Text(std::mem::take(&mut line))).is_err() {
            return;
        }
    }
}

fn quote(text: &[u8]) -> String {
    let cut = &text[..text.len().min(QUOTED)];
    let more = if text.len() > QUOTED { "…" } else { "" };
    format!("`{}{more}`", display_bounded(&String::from_utf8_lossy(cut)))
}

impl Transform for Exec {
    fn apply(
        &mut self,
        input: &Input<'_>,
        stop: &Stop,
        deadline: Instant,
    ) -> Result<Outcome, Error> {
        let mut envelope = match Envelope::of(input) {
            Ok(envelope) => envelope,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let id = self.next_id;
        self.next_id += 1;
        envelope.id = Some(id);
        let mut line = envelope.to_json();
        line.push(b'\n');
        let mut last_failure = String::new();
        for attempt in 1..=self.retries.attempts {
            if attempt > 1 {
                self.metrics.transform_retries.inc();
            }
            let until = deadline.min(Instant::now() + self.retries.call_timeout);
            let why = match self.attempt(&line, id, until, stop)? {
                Ok(answer) => {
                    self.failures = 0;
                    return Ok(match answer.into_outputs() {
                        Ok(outputs) => Outcome::Outputs(outputs),
                        Err(rejection) => Outcome::Rejected(rejection),
                    });
                }
                Err(Failure::Abandoned) => {
                    self.kill_child();
                    return Ok(Outcome::Abandoned);
                }
                Err(Failure::Protocol(why)) => {
                    tracing::warn!(error = %why, topic = input.topic, partition = input.partition, offset = input.offset, "exec child broke the protocol; restarting it");
                    self.kill_child();
                    return Ok(Outcome::Rejected(Rejection::new("protocol", why)));
                }
                Err(Failure::Crashed(why) | Failure::TimedOut(why)) => why,
            };
            tracing::warn!(attempt, error = %why, topic = input.topic, partition = input.partition, offset = input.offset, "exec child failed on a record");
            self.kill_child();
            self.failures += 1;
            if stop.requested() {
                // No new child while stopping (a signal to the process group may have ended
                // this one): the group's next owner processes the record.
                return Ok(Outcome::Abandoned);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let detail = format!("; attempt {attempt}: {why}");
                return Ok(Outcome::Rejected(timed_out(self.retries.budget, &detail)));
            }
            if attempt < self.retries.attempts && !stop.sleep(self.backoff().min(left)) {
                return Ok(Outcome::Abandoned);
            }
            last_failure = why;
        }
        Ok(Outcome::Rejected(Rejection::new(
            "exec-failed",
            format!(
                "{} attempts failed; last: {last_failure}",
                self.retries.attempts
            ),
        )))
    }

    fn interruptible(&self) -> bool {
        true
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        // Closing stdin is the child's signal to finish; give it a moment before killing it.
        if let Some(Running {
            mut child,
            to_child,
            ..
        }) = self.child.take()
        {
            drop(to_child);
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                if child.try_wait().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            child.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe: what the test writes comes out of `read_lines` as lines.
    fn lines_of(write: impl FnOnce(File) + Send + 'static) -> Vec<Line> {
        let (read, written) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let writer = std::thread::spawn(move || write(File::from(written)));
        let (sender, lines) = channel();
        read_lines(File::from(read), &sender);
        writer.join().unwrap();
        lines.try_iter().collect()
    }

    fn text(line: &Line) -> &[u8] {
        match line {
            Line::Text(text) => text,
            Line::TooLong => b"<too long>",
            Line::Failed(_) => b"<failed>",
        }
    }

    #[test]
    fn lines_come_whole_and_a_cut_last_line_is_dropped() {
        let lines = lines_of(|mut out| {
            out.write_all(b"first\n\nsec").unwrap();
            out.write_all(b"ond\nno newline").unwrap();
        });
        let texts: Vec<&[u8]> = lines.iter().map(text).collect();
        assert_eq!(texts, [&b"first"[..], b"", b"second"]);
    }

    #[test]
    fn a_line_longer_than_the_bound_stops_the_reading() {
        let lines = lines_of(|mut out| {
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..=MAX_ANSWER >> 20 {
                if out.write_all(&chunk).is_err() {
                    return; // the reader stopped, as it should
                }
            }
            let _ = out.write_all(b"\n");
        });
        assert_eq!(lines.len(), 1);
        assert!(matches!(lines[0], Line::TooLong));
    }
}
