//! The processing loop: poll one record, transform it, send its outputs (or its dead-letter
//! copy), book it for commit. Single-threaded on purpose: a record is never half-way through
//! the transform when a rebalance callback commits, so every commit covers whole records.
//!
//! The loop runs on a thread of its own with a large stack ([`LOOP_STACK`]): jq evaluates
//! there, and jaq recurses as deep as the values a program builds. The [`overseer`] watches
//! it for records past their deadline and stops that a transform holds up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};

use crate::config::{Config, DeliveryChoice, DeliveryMode};
use crate::delivery::{self, Books, Committer, Consumer, KAFKA_CALL_TIMEOUT};
use crate::kafka::{self, OutputProducer, Refused, Sent, SentAs};
use crate::metrics::Metrics;
use crate::overseer::{self, Hand, InHand, Overseer};
use crate::record::{
    Input, Output, Rejection, bounded, dead_letter_headers, dlq_header, wire_size,
};
use crate::state::Stores;
use crate::stop::{STOP_LIMIT, Stop};
use crate::transform::{self, Outcome, Transform};

/// The stack of the processing thread. Only what a program touches becomes memory; deep
/// values cost jaq about 50 bytes a level to drop and 2 KB to display, so this takes values
/// of ten million levels (a gigabyte of heap to build) through a drop.
pub const LOOP_STACK: usize = 1 << 30;

/// The stack if the system refuses [`LOOP_STACK`] (a low `ulimit -v`).
const SMALL_STACK: usize = 64 << 20;

/// How long one poll waits for a record; bounds how late a stop request is noticed.
const POLL: Duration = Duration::from_millis(100);

/// Housekeeping (serving delivery reports, liveness beat, commit due) runs every this many
/// records, at least this often, and whenever a poll comes back empty: per record it costs
/// more than the rest.
const HOUSEKEEPING_EVERY: u64 = 32;
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(50);

/// How long to serve delivery reports before sending again when the producer queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(50);

/// How long the transaction check and the topic check wait for the brokers each time.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// `--delivery auto` asks again after 1 s, 2 s, … up to this.
const MAX_PROBE_BACKOFF: Duration = Duration::from_secs(30);
/// A topic just created may take a moment to appear in every broker's metadata.
const TOPIC_PROPAGATION: Duration = Duration::from_secs(5);

/// The kind of a record whose output or dead-letter copy the brokers would refuse.
pub const TOO_LARGE: &str = "too-large";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Transform(#[from] transform::Error),
    #[error("cannot create the Kafka {client}: {source}")]
    Client {
        client: &'static str,
        #[source]
        source: KafkaError,
    },
    #[error("cannot subscribe to {topics:?}: {source}")]
    Subscribe {
        topics: Vec<String>,
        #[source]
        source: KafkaError,
    },
    #[error(
        "--delivery exactly-once was asked for, but the brokers do not support transactions; use --delivery at-least-once"
    )]
    NoTransactions,
    #[error("the transactional producer could not start: {0}")]
    InitTransactions(#[source] KafkaError),
    #[error(
        "topic(s) {} do not exist; the processor never creates topics: create them first (plumber does before it starts a step)",
        .0.join(", ")
    )]
    MissingTopics(Vec<String>),
    #[error("sending to {topic} failed: {source}")]
    Send {
        topic: String,
        #[source]
        source: KafkaError,
    },
    #[error(
        "stopped while the brokers took no outputs of {topic}/{partition} offset {offset}; \
         the open transaction is aborted"
    )]
    SendAbandoned {
        topic: String,
        partition: i32,
        offset: i64,
    },
    /// A send found the transaction in a state that only an abort ends; the loop recovers.
    #[error("the transaction must be aborted")]
    TransactionAbortable,
    #[error(
        "the record at {topic}/{partition} offset {offset} cannot be handled ({}: {}); \
         without --dlq the processor stops here instead of dropping it",
        rejection.kind, rejection.message
    )]
    Undeliverable {
        topic: String,
        partition: i32,
        offset: i64,
        rejection: Rejection,
    },
    #[error(transparent)]
    Delivery(#[from] delivery::Error),
    #[error(transparent)]
    HandOff(#[from] crate::handoff::Error),
    #[error(
        "the final commit could not be made ({0}); the records since the last commit will be processed again by the group's next owner"
    )]
    FinalCommit(#[source] delivery::Error),
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("cannot serve metrics: {0}")]
    Metrics(#[source] std::io::Error),
}

/// What a run did, for the last log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// `None` when a stop came before the mode was known.
    pub mode: Option<DeliveryMode>,
    pub consumed: u64,
    pub produced: u64,
    pub filtered: u64,
    pub dead_lettered: u64,
    pub abandoned: u64,
}

pub fn summary(mode: Option<DeliveryMode>, metrics: &Metrics) -> Summary {
    Summary {
        mode,
        consumed: metrics.consumed.get(),
        produced: metrics.produced.get(),
        filtered: metrics.filtered.get(),
        dead_lettered: metrics.dead_lettered_total.get(),
        abandoned: metrics.abandoned.get(),
    }
}

/// Logs how the run ended, as the process's last line, and returns the exit code: 0 after a
/// graceful stop, 1 when processing failed or the final commit could not be made.
/// `stop_seconds` is how long the stop took by the processor's own clock.
pub fn report(result: Result<Summary, Error>, stop: &Stop) -> i32 {
    let stop_seconds = stop
        .first_request()
        .map(|first| first.elapsed().as_secs_f64());
    match result {
        Ok(summary) => {
            tracing::info!(
                mode = summary.mode.map(DeliveryMode::as_str),
                consumed = summary.consumed,
                produced = summary.produced,
                filtered = summary.filtered,
                dead_lettered = summary.dead_lettered,
                abandoned = summary.abandoned,
                stop_seconds,
                "stopped"
            );
            0
        }
        Err(error) => {
            // Every error's message already names its cause.
            tracing::error!(%error, stop_seconds, "processor failed");
            1
        }
    }
}

/// How far the run got, for the exit at [`STOP_LIMIT`].
#[derive(Default)]
pub struct Progress(AtomicU8);

const FINAL_COMMIT_MADE: u8 = 1;
const FINISHED: u8 = 2;

impl Progress {
    pub fn final_commit_made(&self) {
        self.0.fetch_max(FINAL_COMMIT_MADE, Ordering::SeqCst);
    }

    fn finished(&self) {
        self.0.store(FINISHED, Ordering::SeqCst);
    }

    fn get(&self) -> u8 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Ends the process [`STOP_LIMIT`] after the first stop request if it is still running then:
/// a broker that is gone may never answer the final commit or the LeaveGroup.
fn enforce_stop_limit(stop: Stop, progress: Arc<Progress>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("stop-limit".into())
        .spawn(move || {
            while !stop.wait(Duration::from_secs(3600)) {}
            let Some(first) = stop.first_request() else {
                return;
            };
            std::thread::sleep((first + STOP_LIMIT).saturating_duration_since(Instant::now()));
            let stop_seconds = first.elapsed().as_secs_f64();
            match progress.get() {
                FINISHED => {}
                FINAL_COMMIT_MADE => {
                    tracing::warn!(
                        stop_seconds,
                        "stopped: the final commit was made, but leaving the group did not finish in time (the brokers did not answer); its partitions move after the session timeout"
                    );
                    std::process::exit(0);
                }
                _ => {
                    tracing::error!(
                        stop_seconds,
                        "processor failed: the stop could not finish within {} s (the brokers did not answer); the final commit could not be made, the records since the last commit will be processed again by the group's next owner",
                        STOP_LIMIT.as_secs()
                    );
                    std::process::exit(1);
                }
            }
        })?;
    Ok(())
}

/// Resolves `--delivery` against the brokers; `None` when a stop came first. `auto` asks
/// until the brokers answer: a guess would run at-least-once for the processor's life.
pub fn delivery_mode(config: &Config, stop: &Stop) -> Result<Option<DeliveryMode>, Error> {
    let probe = || kafka::brokers_support_transactions(config, PROBE_TIMEOUT);
    match config.delivery {
        DeliveryChoice::AtLeastOnce => Ok(Some(DeliveryMode::AtLeastOnce)),
        DeliveryChoice::ExactlyOnce => match probe() {
            Some(false) => Err(Error::NoTransactions),
            _ => Ok(Some(DeliveryMode::ExactlyOnce)),
        },
        DeliveryChoice::Auto => {
            let mut wait = Duration::from_secs(1);
            loop {
                match probe() {
                    Some(true) => return Ok(Some(DeliveryMode::ExactlyOnce)),
                    Some(false) => {
                        tracing::warn!(
                            "the brokers do not support transactions: running at-least-once (a crash may duplicate, never lose)"
                        );
                        return Ok(Some(DeliveryMode::AtLeastOnce));
                    }
                    None => {
                        tracing::warn!(
                            retry_in_seconds = wait.as_secs(),
                            "no broker answered the transaction check; --delivery auto asks again rather than guess"
                        );
                        if stop.wait(wait) {
                            return Ok(None);
                        }
                        wait = (wait * 2).min(MAX_PROBE_BACKOFF);
                    }
                }
            }
        }
    }
}

/// Runs the step until `stop` is requested (then stops gracefully) or a fatal error. The
/// process ends at the latest [`STOP_LIMIT`] after the first stop request.
pub fn run(config: &Config, stop: &Stop, metrics: &Metrics) -> Result<Summary, Error> {
    let progress = Arc::new(Progress::default());
    enforce_stop_limit(stop.clone(), progress.clone()).map_err(Error::Thread)?;
    let result = std::thread::scope(|scope| {
        let body = || run_here(config, stop, metrics, &progress);
        let processing = |stack| {
            std::thread::Builder::new()
                .name("processing".into())
                .stack_size(stack)
                .spawn_scoped(scope, body)
        };
        let thread = match processing(LOOP_STACK) {
            Ok(thread) => thread,
            Err(error) => {
                tracing::warn!(%error, "no processing thread with a 1 GiB stack; using 64 MiB (jq values nested a million levels deep may crash the processor)");
                processing(SMALL_STACK).map_err(Error::Thread)?
            }
        };
        thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    progress.finished();
    result
}

fn run_here(
    config: &Config,
    stop: &Stop,
    metrics: &Metrics,
    progress: &Progress,
) -> Result<Summary, Error> {
    if let Some(addr) = config.metrics {
        let stuck_after = overseer::max_record_time(config) + Duration::from_secs(60);
        let bound = metrics.serve(addr, stuck_after).map_err(Error::Metrics)?;
        tracing::info!(%bound, "serving /metrics and /healthz");
    }
    let Some(mode) = delivery_mode(config, stop)? else {
        return Ok(summary(None, metrics));
    };
    metrics.set_delivery_mode(mode);
    let stores = config.state.as_ref().map(|state| {
        Arc::new(Stores::new(
            config.inputs.first().cloned().unwrap_or_default(),
            state.topic.clone(),
            kafka::reader_config(config),
            state.max_groups,
        ))
    });
    let (mut transform, table) = transform::build(config, metrics, stores.clone())?;
    let books = Arc::new(Books::new(metrics.clone()));
    let producer = Arc::new(
        kafka::producer(config, mode == DeliveryMode::ExactlyOnce, books.clone()).map_err(
            |source| Error::Client {
                client: "producer",
                source,
            },
        )?,
    );
    check_topics(config, &producer, stop)?;
    // Before joining the group: a join's first record must meet the whole table, and the
    // group's partitions wait for no load.
    if let Some(table) = &table
        && !table.load(stop).map_err(transform::Error::from)?
    {
        return Ok(summary(Some(mode), metrics));
    }
    if mode == DeliveryMode::ExactlyOnce && !init_transactions(&producer, stop)? {
        return Ok(summary(Some(mode), metrics));
    }
    let committer = Committer::new(
        mode,
        producer.clone(),
        books.clone(),
        config.commit_interval(mode),
        kafka::session_timeout(config),
    );
    let committer = Arc::new(match &stores {
        Some(stores) => committer.with_state(stores.clone()),
        None => committer,
    });
    let handoff = crate::handoff::HandOff::of(config, metrics)?.map(Arc::new);
    let consumer = kafka::consumer(
        config,
        committer.clone(),
        books.clone(),
        handoff.clone(),
        config.metrics.is_some(),
    )
    .map_err(|source| Error::Client {
        client: "consumer",
        source,
    })?;
    let topics: Vec<&str> = config.inputs.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|source| Error::Subscribe {
            topics: config.inputs.clone(),
            source,
        })?;
    tracing::info!(
        mode = %mode,
        group = %config.group,
        inputs = %config.inputs.join(","),
        outputs = %config.outputs.join(","),
        dlq = config.dlq.as_deref().unwrap_or("none"),
        state = config.state.as_ref().map_or("none", |state| state.topic.as_str()),
        table = config.table.as_ref().map_or("none", |table| table.topic.as_str()),
        record_timeout_seconds = config.record_timeout.as_secs(),
        max_record_seconds = overseer::max_record_time(config).as_secs(),
        "processing"
    );

    let outbox = Outbox {
        config,
        producer: &producer,
        committer: &committer,
        books: &books,
        stop,
        limit: kafka::message_limit(config),
    };
    let hand = Hand::default();
    let processed = std::thread::scope(|scope| {
        if mode == DeliveryMode::AtLeastOnce {
            std::thread::Builder::new()
                .name("committer".into())
                .spawn_scoped(scope, || committer.run_background_commits(&consumer))
                .map_err(Error::Thread)?;
        }
        let _closing = CloseThreads(&committer, &hand);
        let overseer = Overseer {
            config,
            stop,
            consumer: &consumer,
            committer: &committer,
            books: &books,
            outbox: &outbox,
            hand: &hand,
            progress,
        };
        std::thread::Builder::new()
            .name("overseer".into())
            .spawn_scoped(scope, move || overseer.watch())
            .map_err(Error::Thread)?;
        let mut pipeline = Pipeline {
            config,
            consumer: &consumer,
            committer: &committer,
            books: &books,
            outbox: &outbox,
            hand: &hand,
            transform: transform.as_mut(),
            poisoned: Vec::new(),
            stores: stores.as_deref(),
            handoff: handoff.as_deref(),
        };
        pipeline.process(stop)?;
        pipeline.resend_refused()
    });
    // An exec child has nothing more to do: it ends while the processor commits.
    drop(transform);
    let until = match stop.first_request() {
        Some(first) => (first + STOP_LIMIT)
            .checked_sub(Duration::from_secs(1))
            .unwrap_or_else(Instant::now)
            .max(Instant::now()),
        None => Instant::now() + KAFKA_CALL_TIMEOUT * 2,
    };
    let finished = match &processed {
        Ok(()) => committer.finish(&consumer, until).map_err(|error| {
            if committer.mode() == DeliveryMode::AtLeastOnce {
                tracing::warn!(
                    %error,
                    uncommitted = books.tracker().uncommitted_ranges(),
                    "{}",
                    delivery::UNCOMMITTED_AT_STOP
                );
            }
            // Exactly-once: the open transaction is aborted rather than left to time out.
            committer.fail(&consumer);
            Error::FinalCommit(error)
        }),
        Err(_) => {
            committer.fail(&consumer);
            Ok(())
        }
    };
    if processed.is_ok() && finished.is_ok() {
        progress.final_commit_made();
        // A delivery report still to come would move the commit on in the revocation
        // callback, and a stateful step's state may still be written there (its write waits
        // while anything is in flight): only without either is nothing moved after this.
        if config.state.is_none()
            && books.tracker().in_flight() == 0
            && producer.in_flight_count() == 0
        {
            metrics.final_commit_made.set(1);
        }
    }
    if !kafka::drop_within(consumer, until.max(Instant::now() + Duration::from_secs(1))) {
        tracing::warn!(
            "leaving the group did not finish; its partitions move after the session timeout"
        );
    }
    processed.and(finished)?;
    Ok(summary(Some(mode), metrics))
}

/// Fails when an output, dead-letter, changelog or table topic does not exist, rather than at the
/// first send (or a restore that waits for a topic that never comes).
fn check_topics(config: &Config, producer: &OutputProducer, stop: &Stop) -> Result<(), Error> {
    let until = Instant::now() + TOPIC_PROPAGATION;
    loop {
        let topics = config
            .outputs
            .iter()
            .chain(config.dlq.iter())
            .chain(config.state.iter().map(|state| &state.topic))
            .chain(config.table.iter().map(|table| &table.topic));
        let missing = kafka::unknown_topics(producer, topics, PROBE_TIMEOUT);
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() >= until || stop.wait(Duration::from_millis(500)) {
            return Err(Error::MissingTopics(missing));
        }
    }
}

/// Initialises the transactional producer, trying again while the brokers do not answer;
/// false when a stop came first.
fn init_transactions(producer: &OutputProducer, stop: &Stop) -> Result<bool, Error> {
    loop {
        match producer.init_transactions(Duration::from_secs(2)) {
            Ok(()) => return Ok(true),
            Err(KafkaError::Transaction(error)) if error.is_retriable() => {
                tracing::warn!(%error, "the transaction coordinator did not answer yet; asking again");
                if stop.requested() {
                    return Ok(false);
                }
            }
            Err(error) => return Err(Error::InitTransactions(error)),
        }
    }
}

/// Closes the background committer and the overseer however the loop ends, a panic included:
/// the scope joins those threads, and would otherwise wait for them forever.
struct CloseThreads<'a>(&'a Committer, &'a Hand);

impl Drop for CloseThreads<'_> {
    fn drop(&mut self) {
        self.0.close_background();
        self.1.close();
    }
}

/// The sending half of the loop, shared with the overseer: outputs and dead letters, never
/// larger than the producer takes.
pub struct Outbox<'a> {
    config: &'a Config,
    producer: &'a OutputProducer,
    committer: &'a Committer,
    books: &'a Books,
    stop: &'a Stop,
    /// `message.max.bytes`.
    limit: usize,
}

/// The form of a dead-letter copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Whole,
    WithoutValue,
    /// Without the input's value, key and headers.
    Smallest,
}

impl Outbox<'_> {
    /// Sends what `outcome` asks for; returns how many records were sent.
    fn send(&self, input: &Input<'_>, outcome: Outcome, slot: usize) -> Result<u32, Error> {
        match outcome {
            Outcome::Outputs(outputs) => self.outputs(input, &outputs, slot),
            Outcome::Rejected(rejection) => self.dead_letter(input, rejection, slot, None),
            Outcome::Emitted { outputs, failed } => {
                let mut sends = 0;
                if !outputs.is_empty() {
                    sends += self.outputs(input, &outputs, slot)?;
                }
                for rejection in failed {
                    sends += self.dead_letter(input, rejection, slot, None)?;
                }
                Ok(sends)
            }
            Outcome::Reflected | Outcome::Abandoned => Ok(0),
        }
    }

    fn outputs(&self, input: &Input<'_>, outputs: &[Output], slot: usize) -> Result<u32, Error> {
        if outputs.is_empty() {
            self.books.metrics.filtered.inc();
            return Ok(0);
        }
        // All or nothing: an input whose outputs cannot all be sent sends none.
        if let Some(rejection) = self.too_large(input, outputs) {
            return self.dead_letter(input, rejection, slot, None);
        }
        let mut sends = 0;
        for output in outputs {
            let headers = output_headers(input, output);
            let key = match &output.key {
                None => input.key,
                Some(key) => key.as_deref(),
            };
            for topic in &self.config.outputs {
                let sent = Box::new(Sent {
                    slot,
                    offset: input.offset,
                    copy: SentAs::Output,
                });
                let mut record = BaseRecord::with_opaque_to(topic, sent).payload(&output.value[..]);
                if let Some(timestamp) = output.timestamp {
                    record = record.timestamp(timestamp);
                }
                if let Some(headers) = &headers {
                    record = record.headers(headers.clone());
                }
                if let Some(key) = key {
                    record = record.key(key);
                }
                self.produce(record, input)?;
                sends += 1;
            }
        }
        Ok(sends)
    }

    /// Why one of `outputs` cannot be sent: larger than `message.max.bytes`.
    fn too_large(&self, input: &Input<'_>, outputs: &[Output]) -> Option<Rejection> {
        for (at, output) in outputs.iter().enumerate() {
            let key = match &output.key {
                None => input.key.map_or(0, <[u8]>::len),
                Some(key) => key.as_ref().map_or(0, Vec::len),
            };
            let size = match &output.headers {
                None => wire_size(
                    key,
                    output.value.len(),
                    input
                        .headers
                        .iter()
                        .map(|(name, value)| (*name, value.map_or(0, <[u8]>::len))),
                ),
                Some(headers) => wire_size(
                    key,
                    output.value.len(),
                    headers
                        .iter()
                        .map(|(name, value)| (name.as_str(), value.len())),
                ),
            };
            if size > self.limit {
                return Some(Rejection::new(
                    TOO_LARGE,
                    format!(
                        "output {} of {} would be a record of {size} bytes, over the producer's limit of {} bytes (message.max.bytes; raise it with -X message.max.bytes=… where the brokers and topics take larger records)",
                        at + 1,
                        outputs.len(),
                        self.limit
                    ),
                ));
            }
        }
        None
    }

    /// Sends the dead-letter copy of `input` in a form the producer takes: whole if it fits
    /// `message.max.bytes`, else without its value, else without its key and headers too
    /// (header `plumber.value.omitted` says why, and where the original is). `omitted`: the
    /// input's content is not at hand, for this reason; the smallest form is sent.
    pub fn dead_letter(
        &self,
        input: &Input<'_>,
        rejection: Rejection,
        slot: usize,
        omitted: Option<String>,
    ) -> Result<u32, Error> {
        let Some(dlq) = &self.config.dlq else {
            return Err(Error::Undeliverable {
                topic: input.topic.to_owned(),
                partition: input.partition,
                offset: input.offset,
                rejection,
            });
        };
        tracing::warn!(
            topic = input.topic,
            partition = input.partition,
            offset = input.offset,
            kind = rejection.kind,
            error = %rejection.message,
            dlq = %dlq,
            "record dead-lettered"
        );
        let ours = dead_letter_headers(input, &rejection, &self.config.group);
        let ours_sizes = || ours.iter().map(|(name, value)| (*name, value.len()));
        let theirs = || {
            input
                .headers
                .iter()
                .map(|(name, value)| (*name, value.map_or(0, <[u8]>::len)))
        };
        let (key, value) = (
            input.key.map_or(0, <[u8]>::len),
            input.value.map_or(0, <[u8]>::len),
        );
        let whole = wire_size(key, value, theirs().chain(ours_sizes()));
        let at = format!("{}/{}/{}", input.topic, input.partition, input.offset);
        let limit = self.limit;
        let without_value_note = bounded(format!(
            "the value ({value} bytes) would make this copy {whole} bytes, over the limit of {limit} (message.max.bytes); it is at {at}"
        ));
        let note_size = |note: &str| std::iter::once((dlq_header::OMITTED, note.len()));
        let without_value = wire_size(
            key,
            0,
            theirs()
                .chain(ours_sizes())
                .chain(note_size(&without_value_note)),
        );
        let (form, note) = match omitted {
            Some(why) => (
                Form::Smallest,
                Some(bounded(format!("{why}; the record is at {at}"))),
            ),
            None if whole <= limit => (Form::Whole, None),
            None if without_value <= limit => (Form::WithoutValue, Some(without_value_note)),
            None => (
                Form::Smallest,
                Some(bounded(format!(
                    "the key, value and headers would make this copy {whole} bytes, over the limit of {limit} (message.max.bytes); the record is at {at}"
                ))),
            ),
        };
        let mut headers = OwnedHeaders::new_with_capacity(input.headers.len() + ours.len() + 1);
        if form != Form::Smallest {
            for (key, value) in &input.headers {
                headers = headers.insert(Header { key, value: *value });
            }
        }
        for (name, value) in &ours {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        if let Some(note) = &note {
            headers = headers.insert(Header {
                key: dlq_header::OMITTED,
                value: Some(note.as_bytes()),
            });
        }
        let sent = Box::new(Sent {
            slot,
            offset: input.offset,
            copy: SentAs::DeadLetter {
                kind: rejection.kind,
                message: rejection.message.clone(),
                smallest: form == Form::Smallest,
            },
        });
        let mut record = BaseRecord::with_opaque_to(dlq, sent).headers(headers);
        if form == Form::Whole
            && let Some(value) = input.value
        {
            record = record.payload(value);
        }
        if form != Form::Smallest
            && let Some(key) = input.key
        {
            record = record.key(key);
        }
        self.produce(record, input)?;
        self.books.metrics.dead_lettered(rejection.kind);
        Ok(1)
    }

    /// Sends one record, waiting while librdkafka's queue is full (until a stop abandons the
    /// record in hand).
    fn produce(
        &self,
        mut record: BaseRecord<'_, [u8], [u8], Box<Sent>>,
        input: &Input<'_>,
    ) -> Result<(), Error> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    if self.stop.abandon_in_flight() {
                        return Err(Error::SendAbandoned {
                            topic: input.topic.to_owned(),
                            partition: input.partition,
                            offset: input.offset,
                        });
                    }
                    record = back;
                    // rdkafka's poll serves deliveries until the timeout ends and spins through
                    // its last millisecond; at 10 ms that doubled the CPU per record while the
                    // queue was full. A full queue holds far more than QUEUE_FULL_WAIT of sends.
                    self.producer.poll(QUEUE_FULL_WAIT);
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::State), _))
                    if self.committer.mode() == DeliveryMode::ExactlyOnce =>
                {
                    return Err(Error::TransactionAbortable);
                }
                Err((source, back)) => {
                    return Err(Error::Send {
                        topic: back.topic.to_owned(),
                        source,
                    });
                }
            }
        }
    }
}

/// An input whose output or dead-letter copy the brokers refused inside a transaction that
/// was aborted: it is dead-lettered when it comes again.
struct Poisoned {
    topic: String,
    partition: i32,
    offset: i64,
    rejection: Rejection,
    /// Why the dead letter carries none of the input's content, if it must not.
    omitted: Option<String>,
}

/// The dead letter that stands for a refused record: the rejection, and whether the input's
/// content must be left out (its copy with content was what the brokers refused).
fn stand_in(refused: &Refused) -> (Rejection, Option<String>) {
    match &refused.copy {
        // A refused changelog entry fails the processor instead (it is the step's own
        // state, no record stands for it); it never reaches here.
        SentAs::Output | SentAs::Changelog => (
            Rejection::new(
                TOO_LARGE,
                format!(
                    "the brokers refused its output to {}: {}",
                    refused.to, refused.error
                ),
            ),
            None,
        ),
        SentAs::DeadLetter { kind, message, .. } => (
            Rejection::new(kind, message.clone()),
            Some(format!(
                "the brokers refused the copy with the record's content ({})",
                refused.error
            )),
        ),
    }
}

/// What the loop does with a record.
enum Next {
    Send(Outcome),
    /// A poisoned record's dead letter, without transforming it again.
    DeadLetter(Rejection, Option<String>),
}

struct Pipeline<'a> {
    config: &'a Config,
    consumer: &'a Consumer,
    committer: &'a Committer,
    books: &'a Books,
    outbox: &'a Outbox<'a>,
    hand: &'a Hand,
    transform: &'a mut dyn Transform,
    poisoned: Vec<Poisoned>,
    stores: Option<&'a Stores>,
    handoff: Option<&'a crate::handoff::HandOff>,
}

impl Pipeline<'_> {
    fn process(&mut self, stop: &Stop) -> Result<(), Error> {
        let consumer = self.consumer;
        let metrics = &self.books.metrics;
        let interruptible = self.transform.interruptible();
        let mut handled: u64 = 0;
        let mut next_housekeeping = Instant::now() + HOUSEKEEPING_INTERVAL;
        while !stop.requested() {
            if let Some(why) = self.books.tracker().failure() {
                return Err(delivery::Error::Failed(why.to_owned()).into());
            }
            if self.committer.needs_recovery() {
                self.recover("a commit found the transaction abortable", None)?;
            }
            if let Some(handoff) = self.handoff {
                handoff.start_held(consumer)?;
            }
            // Partitions waiting for their hand-off are asked about more often than POLL.
            let wait = self
                .handoff
                .and_then(crate::handoff::HandOff::next_probe_in)
                .map_or(POLL, |due| due.min(POLL));
            let message = match consumer.poll(wait) {
                None => {
                    self.housekeeping()?;
                    next_housekeeping = Instant::now() + HOUSEKEEPING_INTERVAL;
                    continue;
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "consume error");
                    continue;
                }
                Some(Ok(message)) => message,
            };
            metrics.consumed.inc();
            let input = input_of(&message);
            let slot = self.books.tracker().slot(input.topic, input.partition);
            // Before the record's budget: a stateful step restores its partition's state.
            let assigned = |topic: &str| assigned_partitions(consumer, topic);
            self.transform.prepare(&input, &assigned, metrics)?;
            let started = Instant::now();
            let poisoned = self.take_poisoned(&input);
            let next = match &poisoned {
                Some(p) => Next::DeadLetter(p.rejection.clone(), p.omitted.clone()),
                None => {
                    let deadline = started + self.config.record_timeout;
                    self.hand.begin(InHand {
                        slot,
                        offset: input.offset,
                        started,
                        deadline,
                        interruptible,
                    });
                    let outcome = self.transform.apply(&input, stop, deadline);
                    if !self.hand.end() {
                        // The overseer took over: it ends or replaces the process.
                        loop {
                            std::thread::park();
                        }
                    }
                    Next::Send(outcome?)
                }
            };
            let finished = Instant::now();
            metrics
                .transform_seconds
                .observe(finished.duration_since(started).as_secs_f64());
            if self.committer.needs_recovery() {
                // The record comes again after the rewind.
                self.poisoned.extend(poisoned);
                self.recover("a commit found the transaction abortable", Some(&input))?;
                continue;
            }
            if let Next::Send(Outcome::Abandoned) = next {
                metrics.abandoned.inc();
                tracing::info!(
                    topic = input.topic,
                    partition = input.partition,
                    offset = input.offset,
                    "record abandoned by the stop; left uncommitted"
                );
                break;
            }
            self.committer.begin()?;
            let sent = match next {
                Next::DeadLetter(rejection, omitted) => {
                    self.outbox.dead_letter(&input, rejection, slot, omitted)
                }
                Next::Send(outcome) => self.outbox.send(&input, outcome, slot),
            };
            let sends = match sent {
                Ok(sends) => sends,
                Err(Error::TransactionAbortable) => {
                    self.poisoned.extend(poisoned);
                    self.recover("a send found the transaction abortable", Some(&input))?;
                    continue;
                }
                Err(Error::SendAbandoned { .. })
                    if self.committer.mode() == DeliveryMode::AtLeastOnce =>
                {
                    // Unbooked, so uncommitted: the group's next owner processes it.
                    metrics.abandoned.inc();
                    tracing::info!(
                        topic = input.topic,
                        partition = input.partition,
                        offset = input.offset,
                        "record abandoned by the stop while the brokers took no outputs; left uncommitted"
                    );
                    break;
                }
                Err(error) => return Err(error),
            };
            self.committer
                .handled(input.topic, input.partition, slot, input.offset, sends);
            handled += 1;
            if handled.is_multiple_of(HOUSEKEEPING_EVERY) || finished >= next_housekeeping {
                self.housekeeping()?;
                next_housekeeping = finished + HOUSEKEEPING_INTERVAL;
            }
        }
        if self.committer.needs_recovery() {
            // A transaction to abort (its partitions were lost, or a commit found it
            // abortable) is aborted before the final commit, which then commits what came
            // before it: the group's next owner processes its records again.
            self.recover("the transaction must be aborted before the stop", None)?;
        }
        Ok(())
    }

    fn housekeeping(&mut self) -> Result<(), Error> {
        self.outbox.producer.poll(Duration::ZERO);
        self.books.metrics.beat();
        if let Some(stores) = self.stores {
            let size = stores.size();
            let metrics = &self.books.metrics;
            metrics
                .state_groups
                .set(i64::try_from(size.groups).unwrap_or(i64::MAX));
            if let Some(stream_time) = size.stream_time {
                metrics.state_stream_time.set(stream_time);
            }
        }
        self.resend_refused()?;
        match self.committer.maybe_commit(self.consumer) {
            Ok(()) => Ok(()),
            Err(error) if error.requires_abort() => self.recover(&error.to_string(), None),
            Err(error) => Err(error.into()),
        }
    }

    fn take_poisoned(&mut self, input: &Input<'_>) -> Option<Poisoned> {
        if self.poisoned.is_empty() {
            return None;
        }
        let at = self.poisoned.iter().position(|p| {
            p.offset == input.offset && p.partition == input.partition && p.topic == input.topic
        })?;
        Some(self.poisoned.swap_remove(at))
    }

    /// Aborts the transaction and rewinds (exactly-once); the inputs of records the brokers
    /// refused are dead-lettered when they come again.
    fn recover(&mut self, why: &str, in_hand: Option<&Input<'_>>) -> Result<(), Error> {
        let in_hand = in_hand.map(|input| (input.topic, input.partition, input.offset));
        let refused = self.committer.recover(self.consumer, why, in_hand)?;
        for (topic, partition, refused) in refused {
            let (rejection, omitted) = stand_in(&refused);
            self.poisoned.push(Poisoned {
                topic,
                partition,
                offset: refused.offset,
                rejection,
                omitted,
            });
        }
        Ok(())
    }

    /// At-least-once: sends a dead letter for each record the brokers refused. Its input is
    /// booked already, the refused send still counted in flight: the dead letter's
    /// acknowledgement stands for it. Its other outputs, if any, were sent.
    fn resend_refused(&self) -> Result<(), Error> {
        if self.committer.mode() != DeliveryMode::AtLeastOnce {
            return Ok(());
        }
        let refused = {
            let mut tracker = self.books.tracker();
            if !tracker.has_refused() {
                return Ok(());
            }
            tracker
                .take_refused()
                .into_iter()
                .filter_map(|r| {
                    let (topic, partition) = tracker.partition_of(r.slot)?;
                    Some((topic.to_owned(), partition, r))
                })
                .collect::<Vec<_>>()
        };
        for (topic, partition, refused) in refused {
            let (rejection, omitted) = stand_in(&refused);
            let reference = Input::reference(&topic, partition, refused.offset);
            if omitted.is_some() {
                self.outbox
                    .dead_letter(&reference, rejection, refused.slot, omitted)?;
                continue;
            }
            match kafka::fetch_record(
                self.config,
                &topic,
                partition,
                refused.offset,
                KAFKA_CALL_TIMEOUT,
            ) {
                Ok(message) => {
                    self.outbox
                        .dead_letter(&input_of(&message), rejection, refused.slot, None)?
                }
                Err(why) => self.outbox.dead_letter(
                    &reference,
                    rejection,
                    refused.slot,
                    Some(format!("the record could not be read again ({why})")),
                )?,
            };
        }
        Ok(())
    }
}

/// The partitions of `topic` the consumer is assigned now.
fn assigned_partitions(consumer: &Consumer, topic: &str) -> Vec<i32> {
    consumer
        .assignment()
        .map(|list| {
            list.elements_for_topic(topic)
                .iter()
                .map(|element| element.partition())
                .collect()
        })
        .unwrap_or_default()
}

/// A consumed record as transforms see it.
pub fn input_of<M: Message>(message: &M) -> Input<'_> {
    let headers = message
        .headers()
        .map(|headers| headers.iter().map(|h| (h.key, h.value)).collect())
        .unwrap_or_default();
    Input {
        topic: message.topic(),
        partition: message.partition(),
        offset: message.offset(),
        timestamp: message.timestamp().to_millis(),
        key: message.key(),
        value: message.payload(),
        headers,
    }
}

fn input_headers(input: &Input<'_>) -> OwnedHeaders {
    input.headers.iter().fold(
        OwnedHeaders::new_with_capacity(input.headers.len()),
        |headers, (key, value)| headers.insert(Header { key, value: *value }),
    )
}

/// The headers of an output record; `None` when it has none (saves building an empty list).
fn output_headers(input: &Input<'_>, output: &Output) -> Option<OwnedHeaders> {
    match &output.headers {
        None if input.headers.is_empty() => None,
        None => Some(input_headers(input)),
        Some(headers) if headers.is_empty() => None,
        Some(headers) => Some(headers.iter().fold(
            OwnedHeaders::new_with_capacity(headers.len()),
            |all, (key, value)| {
                all.insert(Header {
                    key,
                    value: Some(value),
                })
            },
        )),
    }
}
