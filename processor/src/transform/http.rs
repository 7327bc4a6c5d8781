//! `--http URL`: the sidecar model. Each input is POSTed to the user's container as the JSON
//! envelope (the same object the exec protocol writes, `Content-Type: application/json`).
//!
//! The answer decides the record's fate:
//! - `200` with a JSON array of output objects (`[{"value": …}, …]`, `[]` to filter), or
//!   `204 No Content` for no output;
//! - `4xx`: the record is dead-lettered with the status and the start of the body;
//! - `5xx`, a timeout or a refused connection: retried with exponential backoff, then
//!   dead-lettered after the last attempt.
//!
//! Calls run on a worker thread so that a stop never waits for a slow sidecar: an abandoned
//! call is left to finish on its own and its answer is ignored.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use super::{Error, Outcome, Transform};
use crate::metrics::Metrics;
use crate::record::{Envelope, Input, Output, Rejection, WireOutput};
use crate::stop::Stop;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Status lines and bodies quoted in dead-letter headers are cut to this many bytes.
const QUOTED_BODY: usize = 512;

pub struct Http {
    url: String,
    agent: ureq::Agent,
    attempts: u32,
    metrics: Metrics,
    worker: Option<Worker>,
}

struct Worker {
    requests: Sender<Vec<u8>>,
    answers: Receiver<Answer>,
}

/// What one call gave.
enum Answer {
    Status(u16, Vec<u8>),
    Failed(String),
}

impl Http {
    pub fn new(
        url: String,
        timeout: Duration,
        attempts: u32,
        metrics: Metrics,
    ) -> Result<Self, Error> {
        url.parse::<ureq::http::Uri>()
            .map_err(|e| Error::Url(url.clone(), e.to_string()))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .timeout_connect(Some(timeout.min(Duration::from_secs(5))))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Http {
            url,
            agent,
            attempts,
            metrics,
            worker: None,
        })
    }

    fn worker(&mut self) -> Result<&Worker, Error> {
        if self.worker.is_none() {
            let (requests, jobs) = channel::<Vec<u8>>();
            let (replies, answers) = channel();
            let (agent, url) = (self.agent.clone(), self.url.clone());
            std::thread::Builder::new()
                .name("http-client".into())
                .spawn(move || {
                    for body in jobs {
                        if replies.send(call(&agent, &url, body)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| Error::Url(self.url.clone(), e.to_string()))?;
            self.worker = Some(Worker { requests, answers });
        }
        self.worker
            .as_ref()
            .ok_or_else(|| Error::Url(self.url.clone(), "no worker".into()))
    }

    /// One call, or `None` when a stop abandoned it.
    fn call(&mut self, body: &[u8], stop: &Stop) -> Result<Option<Answer>, Error> {
        let worker = self.worker()?;
        if worker.requests.send(body.to_vec()).is_err() {
            self.worker = None;
            return Ok(Some(Answer::Failed("the http worker stopped".into())));
        }
        loop {
            match worker.answers.recv_timeout(Duration::from_millis(100)) {
                Ok(answer) => return Ok(Some(answer)),
                Err(RecvTimeoutError::Timeout) if stop.abandon_in_flight() => {
                    self.worker = None;
                    return Ok(None);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.worker = None;
                    return Ok(Some(Answer::Failed("the http worker stopped".into())));
                }
            }
        }
    }
}

fn call(agent: &ureq::Agent, url: &str, body: Vec<u8>) -> Answer {
    let response = agent
        .post(url)
        .header("content-type", "application/json")
        .send(&body[..]);
    match response {
        Ok(mut response) => {
            let status = response.status().as_u16();
            match response
                .body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_vec()
            {
                Ok(body) => Answer::Status(status, body),
                Err(e) => Answer::Failed(format!("reading the response failed: {e}")),
            }
        }
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// The outputs of a 2xx answer.
fn outputs(status: u16, body: &[u8]) -> Result<Vec<Output>, Rejection> {
    if status == 204 || body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let objects: Vec<WireOutput> = serde_json::from_slice(body).map_err(|e| {
        Rejection::new(
            "protocol",
            format!("a {status} answer must be a JSON array of output objects: {e}"),
        )
    })?;
    objects
        .into_iter()
        .map(|object| object.into_output("http-error"))
        .collect()
}

fn quote(body: &[u8]) -> String {
    let cut = &body[..body.len().min(QUOTED_BODY)];
    String::from_utf8_lossy(cut).trim().to_owned()
}

impl Transform for Http {
    fn apply(&mut self, input: &Input<'_>, stop: &Stop) -> Result<Outcome, Error> {
        let envelope = match Envelope::of(input) {
            Ok(envelope) => envelope,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let body = envelope.to_json();
        let mut last_failure = String::new();
        for attempt in 1..=self.attempts {
            if attempt > 1 {
                self.metrics.transform_retries.inc();
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << (attempt - 2).min(10))
                    .min(MAX_BACKOFF);
                if !stop.sleep(backoff) {
                    return Ok(Outcome::Abandoned);
                }
            }
            let Some(answer) = self.call(&body, stop)? else {
                return Ok(Outcome::Abandoned);
            };
            match answer {
                Answer::Status(status @ 200..=299, body) => {
                    return Ok(match outputs(status, &body) {
                        Ok(outputs) => Outcome::Outputs(outputs),
                        Err(rejection) => Outcome::Rejected(rejection),
                    });
                }
                Answer::Status(status @ 400..=499, body) => {
                    return Ok(Outcome::Rejected(Rejection::new(
                        "http-status",
                        format!("{} answered {status}: {}", self.url, quote(&body)),
                    )));
                }
                Answer::Status(status, body) => {
                    last_failure = format!("{} answered {status}: {}", self.url, quote(&body));
                }
                Answer::Failed(why) => last_failure = format!("{}: {why}", self.url),
            }
            tracing::warn!(attempt, error = %last_failure, topic = input.topic, partition = input.partition, offset = input.offset, "http call failed");
        }
        Ok(Outcome::Rejected(Rejection::new(
            "http-failed",
            format!("{} attempts failed; last: {last_failure}", self.attempts),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_outputs() {
        assert_eq!(outputs(204, b"").unwrap(), vec![]);
        assert_eq!(outputs(200, b"[]").unwrap(), vec![]);
        assert_eq!(
            outputs(200, br#"[{"value": 1}, {"value": {"a": 2}}]"#).unwrap(),
            vec![
                Output::value(b"1".to_vec()),
                Output::value(br#"{"a": 2}"#.to_vec())
            ]
        );
        assert_eq!(
            outputs(200, br#"{"value": 1}"#).unwrap_err().kind,
            "protocol"
        );
    }
}
