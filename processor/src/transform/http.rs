//! `--http URL`: the sidecar model. Each input is POSTed to the user's container as the JSON
//! envelope (the same object the exec protocol writes, `Content-Type: application/json`).
//!
//! The answer decides the record's fate:
//! - `200` with a JSON array of output objects (`[{"value": …}, …]`, `[]` to filter), or
//!   `204 No Content` for no output;
//! - `4xx`: the record is dead-lettered with the status and the start of the body;
//! - `5xx`, a timeout or a refused connection: retried with exponential backoff, then
//!   dead-lettered after the last attempt (`http-failed`), or when the record's time
//!   (`--record-timeout`) runs out (`timeout`).
//!
//! Calls run on a worker thread so that neither a stop nor the record's deadline waits for a
//! slow sidecar: an abandoned call is left to finish on its own (it ends at its own timeout,
//! which is never past the record's deadline) and its answer is ignored.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use super::{Error, MAX_ANSWER, Outcome, Retries, Transform, timed_out};
use crate::metrics::Metrics;
use crate::record::{Envelope, Input, Output, Rejection, WireOutput};
use crate::stop::Stop;

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long past its timeout a call may still report before it is given up.
const CALL_GRACE: Duration = Duration::from_millis(500);
/// Status lines and bodies quoted in dead-letter headers are cut to this many bytes.
const QUOTED_BODY: usize = 512;

pub struct Http {
    url: String,
    agent: ureq::Agent,
    retries: Retries,
    metrics: Metrics,
    worker: Option<Worker>,
}

struct Worker {
    requests: Sender<Call>,
    answers: Receiver<Answer>,
}

/// One request for the worker: the body, and how long the call may take.
struct Call {
    body: Vec<u8>,
    timeout: Duration,
}

/// What one call gave.
enum Answer {
    Status(u16, Vec<u8>),
    Failed(String),
}

/// Why a call gave no answer.
enum NoAnswer {
    Abandoned,
    TimedOut,
}

impl Http {
    pub fn new(url: String, retries: Retries, metrics: Metrics) -> Result<Self, Error> {
        url.parse::<ureq::http::Uri>()
            .map_err(|e| Error::Url(url.clone(), e.to_string()))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(retries.call_timeout.min(Duration::from_secs(5))))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Http {
            url,
            agent,
            retries,
            metrics,
            worker: None,
        })
    }

    fn worker(&mut self) -> Result<&Worker, Error> {
        if self.worker.is_none() {
            let (requests, jobs) = channel::<Call>();
            let (replies, answers) = channel();
            let (agent, url) = (self.agent.clone(), self.url.clone());
            std::thread::Builder::new()
                .name("http-client".into())
                .spawn(move || {
                    for job in jobs {
                        if replies.send(call(&agent, &url, job)).is_err() {
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

    /// One call that must end by `until`.
    fn call(
        &mut self,
        body: &[u8],
        until: Instant,
        stop: &Stop,
    ) -> Result<Result<Answer, NoAnswer>, Error> {
        let timeout = until.saturating_duration_since(Instant::now());
        let worker = self.worker()?;
        let job = Call {
            body: body.to_vec(),
            timeout,
        };
        if worker.requests.send(job).is_err() {
            self.worker = None;
            return Ok(Ok(Answer::Failed("the http worker stopped".into())));
        }
        // The call's own timeout ends it at `until`; this is for one that does not return in
        // time anyway. Dropping its worker keeps its late answer from meeting the next call.
        let given_up_at = until + CALL_GRACE;
        loop {
            match worker.answers.recv_timeout(Duration::from_millis(100)) {
                Ok(answer) => return Ok(Ok(answer)),
                Err(RecvTimeoutError::Timeout) if stop.abandon_in_flight() => {
                    self.worker = None;
                    return Ok(Err(NoAnswer::Abandoned));
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() >= given_up_at => {
                    self.worker = None;
                    return Ok(Err(NoAnswer::TimedOut));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.worker = None;
                    return Ok(Ok(Answer::Failed("the http worker stopped".into())));
                }
            }
        }
    }
}

fn call(agent: &ureq::Agent, url: &str, job: Call) -> Answer {
    if job.timeout.is_zero() {
        return Answer::Failed("no time left for the call".into());
    }
    let response = agent
        .post(url)
        .config()
        .timeout_global(Some(job.timeout))
        .build()
        .header("content-type", "application/json")
        .send(&job.body[..]);
    match response {
        Ok(mut response) => {
            let status = response.status().as_u16();
            match response
                .body_mut()
                .with_config()
                .limit(MAX_ANSWER as u64)
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
    fn apply(
        &mut self,
        input: &Input<'_>,
        stop: &Stop,
        deadline: Instant,
    ) -> Result<Outcome, Error> {
        let envelope = match Envelope::of(input) {
            Ok(envelope) => envelope,
            Err(rejection) => return Ok(Outcome::Rejected(rejection)),
        };
        let body = envelope.to_json();
        let mut last_failure = String::new();
        for attempt in 1..=self.retries.attempts {
            if attempt > 1 {
                self.metrics.transform_retries.inc();
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << (attempt - 2).min(10))
                    .min(MAX_BACKOFF);
                let left = deadline.saturating_duration_since(Instant::now());
                if !stop.sleep(backoff.min(left)) {
                    return Ok(Outcome::Abandoned);
                }
            }
            if Instant::now() >= deadline {
                let detail = format!("; {} attempts, last: {last_failure}", attempt - 1);
                return Ok(Outcome::Rejected(timed_out(self.retries.budget, &detail)));
            }
            let until = deadline.min(Instant::now() + self.retries.call_timeout);
            let answer = match self.call(&body, until, stop)? {
                Ok(answer) => answer,
                Err(NoAnswer::Abandoned) => return Ok(Outcome::Abandoned),
                Err(NoAnswer::TimedOut) => Answer::Failed(format!(
                    "no answer within {} s",
                    self.retries.call_timeout.as_secs()
                )),
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
            if stop.requested() {
                // No retry while stopping: the group's next owner processes the record.
                return Ok(Outcome::Abandoned);
            }
        }
        if Instant::now() >= deadline {
            let detail = format!("; last attempt: {last_failure}");
            return Ok(Outcome::Rejected(timed_out(self.retries.budget, &detail)));
        }
        Ok(Outcome::Rejected(Rejection::new(
            "http-failed",
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
