//! `--exec -- CMD…`: a long-lived child process speaking a line protocol.
//!
//! For each input the processor writes one line to the child's stdin: the JSON envelope
//! (`topic`, `partition`, `offset`, `timestamp`, `key`, `headers`, `value`). The child answers
//! on stdout with zero or more lines, each one output object (`{"value": …}`, optionally with
//! `"key"` and `"headers"`), or `{"error": "why"}` to dead-letter the input, and then an
//! **empty line**, which ends that input's outputs. Outputs are produced only once the empty
//! line arrives, so a child that dies half-way produces nothing for that record. stderr is
//! passed through.
//!
//! A child that exits or hangs past the timeout is restarted with exponential backoff and the
//! record is tried again; after the last attempt the record is dead-lettered.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use super::{Error, Outcome, Transform};
use crate::metrics::Metrics;
use crate::record::{Envelope, Input, Rejection, parse_wire_output};
use crate::stop::Stop;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub struct Exec {
    command: Vec<String>,
    child: Option<Running>,
    timeout: Duration,
    attempts: u32,
    /// Consecutive failed starts or crashes, for the backoff; reset by a handled record.
    failures: u32,
    started_once: bool,
    metrics: Metrics,
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
}

/// How one attempt ended, when it did not give the record's outputs.
enum Failure {
    /// The child exited, closed its output or timed out: restart and retry.
    Crashed(String),
    /// A stop asked to abandon the record.
    Abandoned,
}

impl Exec {
    pub fn new(
        command: Vec<String>,
        timeout: Duration,
        attempts: u32,
        metrics: Metrics,
    ) -> Result<Self, Error> {
        let mut exec = Exec {
            command,
            child: None,
            timeout,
            attempts,
            failures: 0,
            started_once: false,
            metrics,
        };
        // Start now, so a wrong command is a start-up error, not a dead-lettered record.
        exec.ensure_running()?;
        Ok(exec)
    }

    fn ensure_running(&mut self) -> Result<&mut Running, Error> {
        if self.child.is_none() {
            let program = self.command.first().map(String::as_str).unwrap_or_default();
            let mut child = Command::new(program)
                .args(self.command.iter().skip(1))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|source| Error::Spawn {
                    command: self.command.join(" "),
                    source,
                })?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                let _ = child.kill();
                return Err(Error::Spawn {
                    command: self.command.join(" "),
                    source: std::io::Error::other("no pipes to the child"),
                });
            };
            let (sender, lines) = channel();
            std::thread::Builder::new()
                .name("exec-stdout".into())
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        if sender.send(line).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|source| Error::Spawn {
                    command: self.command.join(" "),
                    source,
                })?;
            if self.started_once {
                self.metrics.exec_restarts.inc();
            }
            self.started_once = true;
            tracing::info!(pid = child.id(), command = %self.command.join(" "), "exec child started");
            self.child = Some(Running {
                child,
                stdin,
                lines,
            });
        }
        self.child.as_mut().ok_or_else(|| Error::Spawn {
            command: self.command.join(" "),
            source: std::io::Error::other("child vanished"),
        })
    }

    fn attempt(&mut self, line: &[u8], stop: &Stop) -> Result<Result<Vec<String>, Failure>, Error> {
        let timeout = self.timeout;
        let running = self.ensure_running()?;
        if let Err(e) = running
            .stdin
            .write_all(line)
            .and_then(|()| running.stdin.flush())
        {
            return Ok(Err(Failure::Crashed(format!(
                "writing to the child failed: {e}"
            ))));
        }
        let deadline = Instant::now() + timeout;
        let mut outputs = Vec::new();
        loop {
            if stop.abandon_in_flight() {
                return Ok(Err(Failure::Abandoned));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Err(Failure::Crashed(format!(
                    "no end-of-outputs line within {} s",
                    timeout.as_secs_f64()
                ))));
            }
            match running
                .lines
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(Ok(text)) if text.is_empty() => return Ok(Ok(outputs)),
                Ok(Ok(text)) => outputs.push(text),
                Ok(Err(e)) => {
                    return Ok(Err(Failure::Crashed(format!(
                        "reading from the child failed: {e}"
                    ))));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    let status = running
                        .child
                        .wait()
                        .map(|s| s.to_string())
                        .unwrap_or_else(|e| e.to_string());
                    return Ok(Err(Failure::Crashed(format!(
                        "the child exited ({status})"
                    ))));
                }
            }
        }
    }

    fn kill_child(&mut self) {
        if let Some(mut running) = self.child.take() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

impl Transform for Exec {
    fn apply(&mut self, input: &Input<'_>, stop: &Stop) -> Result<Outcome, Error> {
        let envelope = match Envelope::of(input) {
            Ok(envelope) => envelope,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let mut line = envelope.to_json();
        line.push(b'\n');
        let mut last_failure = String::new();
        for attempt in 1..=self.attempts {
            if attempt > 1 {
                self.metrics.transform_retries.inc();
            }
            match self.attempt(&line, stop)? {
                Ok(lines) => {
                    self.failures = 0;
                    let outputs: Result<Vec<_>, Rejection> = lines
                        .iter()
                        .map(|line| parse_wire_output(line.as_bytes(), "exec-error"))
                        .collect();
                    return Ok(match outputs {
                        Ok(outputs) => Outcome::Outputs(outputs),
                        Err(rejection) => Outcome::Rejected(rejection),
                    });
                }
                Err(Failure::Abandoned) => {
                    self.kill_child();
                    return Ok(Outcome::Abandoned);
                }
                Err(Failure::Crashed(why)) => {
                    tracing::warn!(attempt, error = %why, topic = input.topic, partition = input.partition, offset = input.offset, "exec child failed on a record");
                    self.kill_child();
                    self.failures += 1;
                    let backoff = FIRST_BACKOFF
                        .saturating_mul(1 << self.failures.min(10))
                        .min(MAX_BACKOFF);
                    if !stop.sleep(backoff) {
                        return Ok(Outcome::Abandoned);
                    }
                    last_failure = why;
                }
            }
        }
        Ok(Outcome::Rejected(Rejection::new(
            "exec-failed",
            format!("{} attempts failed; last: {last_failure}", self.attempts),
        )))
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        // Closing stdin is the child's signal to finish; give it a moment before killing it.
        if let Some(Running {
            mut child, stdin, ..
        }) = self.child.take()
        {
            drop(stdin);
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
