//! The processing loop: poll one record, transform it, send its outputs (or its dead-letter
//! copy), book it for commit. Single-threaded on purpose: a record is never half-way through
//! the transform when a rebalance callback commits, so every commit covers whole records.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};

use crate::config::{Config, DeliveryChoice, DeliveryMode};
use crate::delivery::{self, Books, Committer, Consumer};
use crate::kafka::{self, OutputProducer, Sent};
use crate::metrics::Metrics;
use crate::record::{Input, Output, Rejection, dead_letter_headers};
use crate::stop::Stop;
use crate::transform::{self, Outcome, Transform};

/// How long one poll waits for a record; bounds how late a stop request is noticed.
const POLL: Duration = Duration::from_millis(100);

/// Housekeeping (serving delivery reports, liveness beat, commit due) runs every this many
/// records, and whenever a poll comes back empty: per record it costs more than the rest.
const HOUSEKEEPING_EVERY: u64 = 32;

/// How long to serve delivery reports before sending again when the producer queue is full.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(50);

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
        "--delivery exactly-once was asked for, but the brokers do not support transactions; use --delivery auto or at-least-once"
    )]
    NoTransactions,
    #[error("the transactional producer could not start: {0}")]
    InitTransactions(#[source] KafkaError),
    #[error("sending to {topic} failed: {source}")]
    Send {
        topic: String,
        #[source]
        source: KafkaError,
    },
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
    #[error("cannot start the commit thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("cannot serve metrics: {0}")]
    Metrics(#[source] std::io::Error),
}

/// What a run did, for the last log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub mode: DeliveryMode,
    pub consumed: u64,
    pub produced: u64,
    pub filtered: u64,
    pub dead_lettered: u64,
    pub abandoned: u64,
}

/// Resolves `--delivery auto` against the brokers.
pub fn delivery_mode(config: &Config) -> Result<DeliveryMode, Error> {
    let probe = || kafka::brokers_support_transactions(config, Duration::from_secs(10));
    match config.delivery {
        DeliveryChoice::AtLeastOnce => Ok(DeliveryMode::AtLeastOnce),
        DeliveryChoice::ExactlyOnce => match probe() {
            Some(false) => Err(Error::NoTransactions),
            _ => Ok(DeliveryMode::ExactlyOnce),
        },
        DeliveryChoice::Auto => Ok(match probe() {
            Some(true) => DeliveryMode::ExactlyOnce,
            Some(false) => {
                tracing::warn!(
                    "the brokers do not support transactions: running at-least-once (a crash may duplicate, never lose)"
                );
                DeliveryMode::AtLeastOnce
            }
            None => {
                tracing::warn!("no broker answered the transaction check: running at-least-once");
                DeliveryMode::AtLeastOnce
            }
        }),
    }
}

/// Runs the step until `stop` is requested (then stops gracefully) or a fatal error.
pub fn run(config: &Config, stop: &Stop, metrics: &Metrics) -> Result<Summary, Error> {
    if let Some(addr) = config.metrics {
        let bound = metrics.serve(addr).map_err(Error::Metrics)?;
        tracing::info!(%bound, "serving /metrics and /healthz");
    }
    let mode = delivery_mode(config)?;
    let mut transform = transform::build(config, metrics)?;
    let books = Arc::new(Books::new(metrics.clone()));
    let producer = Arc::new(
        kafka::producer(config, mode == DeliveryMode::ExactlyOnce, books.clone()).map_err(
            |source| Error::Client {
                client: "producer",
                source,
            },
        )?,
    );
    if mode == DeliveryMode::ExactlyOnce {
        producer
            .init_transactions(Duration::from_secs(30))
            .map_err(Error::InitTransactions)?;
    }
    let committer = Arc::new(Committer::new(
        mode,
        producer.clone(),
        books.clone(),
        config.commit_interval(mode),
    ));
    let consumer = kafka::consumer(
        config,
        committer.clone(),
        books.clone(),
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
        mode = ?mode,
        group = %config.group,
        inputs = %config.inputs.join(","),
        outputs = %config.outputs.join(","),
        dlq = config.dlq.as_deref().unwrap_or("none"),
        "processing"
    );

    let mut pipeline = Pipeline {
        config,
        consumer: &consumer,
        producer: &producer,
        committer: &committer,
        books: &books,
        transform: transform.as_mut(),
    };
    let processed = std::thread::scope(|scope| {
        if mode == DeliveryMode::AtLeastOnce {
            std::thread::Builder::new()
                .name("committer".into())
                .spawn_scoped(scope, || committer.run_background_commits(&consumer))
                .map_err(Error::Thread)?;
        }
        let _closing = CloseBackgroundCommits(&committer);
        pipeline.process(stop)
    });
    let finished = match &processed {
        Ok(()) => committer.finish(&consumer).map_err(Error::from),
        Err(_) => {
            committer.fail(&consumer);
            Ok(())
        }
    };
    // Dropping the consumer leaves the group; its revocation callback finds nothing new.
    drop(consumer);
    processed.and(finished)?;
    Ok(Summary {
        mode,
        consumed: metrics.consumed.get(),
        produced: metrics.produced.get(),
        filtered: metrics.filtered.get(),
        dead_lettered: metrics.dead_lettered_total.get(),
        abandoned: metrics.abandoned.get(),
    })
}

/// Ends the background committer however the loop ends, a panic included: the scope joins
/// that thread, and would otherwise wait for it forever.
struct CloseBackgroundCommits<'a>(&'a Committer);

impl Drop for CloseBackgroundCommits<'_> {
    fn drop(&mut self) {
        self.0.close_background();
    }
}

struct Pipeline<'a> {
    config: &'a Config,
    consumer: &'a Consumer,
    producer: &'a OutputProducer,
    committer: &'a Committer,
    books: &'a Books,
    transform: &'a mut dyn Transform,
}

impl Pipeline<'_> {
    fn process(&mut self, stop: &Stop) -> Result<(), Error> {
        let metrics = &self.books.metrics;
        let mut handled: u64 = 0;
        while !stop.requested() {
            if let Some(why) = self.books.tracker().failure() {
                return Err(delivery::Error::Delivery(why.to_owned()).into());
            }
            let message = match self.consumer.poll(POLL) {
                None => {
                    metrics.beat();
                    self.producer.poll(Duration::ZERO);
                    self.committer.maybe_commit(self.consumer)?;
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
            let started = Instant::now();
            let outcome = self.transform.apply(&input, stop)?;
            metrics
                .transform_seconds
                .observe(started.elapsed().as_secs_f64());
            if matches!(outcome, Outcome::Abandoned) {
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
            let slot = self.books.tracker().slot(input.topic, input.partition);
            let sends = self.send(&input, outcome, slot)?;
            self.committer
                .handled(input.topic, input.partition, slot, input.offset, sends);
            handled += 1;
            if handled.is_multiple_of(HOUSEKEEPING_EVERY) {
                self.producer.poll(Duration::ZERO);
                metrics.beat();
                self.committer.maybe_commit(self.consumer)?;
            }
        }
        Ok(())
    }

    /// Sends what `outcome` asks for; returns how many records were sent.
    fn send(&self, input: &Input<'_>, outcome: Outcome, slot: usize) -> Result<u32, Error> {
        let metrics = &self.books.metrics;
        let sent = |dead_letter| {
            Box::new(Sent {
                slot,
                offset: input.offset,
                dead_letter,
            })
        };
        match outcome {
            Outcome::Outputs(outputs) => {
                if outputs.is_empty() {
                    metrics.filtered.inc();
                }
                let mut sends = 0;
                for output in &outputs {
                    let headers = output_headers(input, output);
                    let key = match &output.key {
                        None => input.key,
                        Some(key) => key.as_deref(),
                    };
                    for topic in &self.config.outputs {
                        let mut record = BaseRecord::with_opaque_to(topic, sent(false))
                            .payload(&output.value[..]);
                        if let Some(headers) = &headers {
                            record = record.headers(headers.clone());
                        }
                        if let Some(key) = key {
                            record = record.key(key);
                        }
                        self.produce(record)?;
                        sends += 1;
                    }
                }
                Ok(sends)
            }
            Outcome::Rejected(rejection) => {
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
                let mut headers = input_headers(input);
                for (name, value) in dead_letter_headers(input, &rejection, &self.config.group) {
                    headers = headers.insert(Header {
                        key: name,
                        value: Some(value.as_bytes()),
                    });
                }
                let mut record = BaseRecord::with_opaque_to(dlq, sent(true)).headers(headers);
                if let Some(value) = input.value {
                    record = record.payload(value);
                }
                if let Some(key) = input.key {
                    record = record.key(key);
                }
                self.produce(record)?;
                metrics.dead_lettered(rejection.kind);
                Ok(1)
            }
            Outcome::Abandoned => Ok(0),
        }
    }

    /// Sends one record, waiting while librdkafka's queue is full.
    fn produce(&self, mut record: BaseRecord<'_, [u8], [u8], Box<Sent>>) -> Result<(), Error> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    // rdkafka's poll serves deliveries until the timeout ends and spins through
                    // its last millisecond; at 10 ms that doubled the CPU per record while the
                    // queue was full. A full queue holds far more than QUEUE_FULL_WAIT of sends.
                    self.producer.poll(QUEUE_FULL_WAIT);
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

fn input_of<'a>(message: &'a BorrowedMessage<'a>) -> Input<'a> {
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
        OwnedHeaders::new_with_capacity(input.headers.len() + 6),
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
