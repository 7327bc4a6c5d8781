//! Kafka clients: their settings, the callbacks that feed the delivery books and metrics, and
//! the start-up check whether the brokers support transactions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer as _, RebalanceProtocol};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, OwnedMessage};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext as RdProducerContext};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

use crate::config::Config;
use crate::delivery::{Books, Committer, KAFKA_CALL_TIMEOUT};
use crate::reader::{Reader, ReaderContext, log_to_tracing};

/// What a delivery callback needs to know about a sent record.
#[derive(Debug)]
pub struct Sent {
    pub slot: usize,
    pub offset: i64,
    pub copy: SentAs,
}

/// What a sent record is to its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentAs {
    Output,
    /// The input's dead-letter copy, with its error; `smallest` when it already is the
    /// smallest form (no value, key or headers of the input).
    DeadLetter {
        kind: &'static str,
        message: String,
        smallest: bool,
    },
    /// A stateful step's changelog entry: its acknowledgement is awaited by the commit that
    /// sent it, not booked to an input.
    Changelog,
}

/// A record the brokers refused as it is (too large): its input gets a dead letter instead.
#[derive(Debug, Clone)]
pub struct Refused {
    pub slot: usize,
    pub offset: i64,
    /// The topic the refused record was sent to.
    pub to: String,
    pub error: String,
    pub copy: SentAs,
}

/// librdkafka's default `message.max.bytes`.
const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// The largest record the producer sends: `message.max.bytes`, as set with -X or librdkafka's
/// default. Larger outputs and dead-letter copies are never handed to librdkafka.
pub fn message_limit(config: &Config) -> usize {
    config
        .kafka
        .iter()
        .rev()
        .find(|(key, _)| key == "message.max.bytes")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES)
}

/// Whether the brokers refused a record for what it is, not for a failure that concerns every
/// record (an unknown topic, authorisation, a broker gone).
fn refuses_the_record(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

/// Whether a record was dropped from the producer's queue unsent: librdkafka purges what is
/// queued or in flight when a transaction is aborted (we never purge otherwise). An abort can
/// come while deliveries are still pending, as under load.
fn purged_by_an_abort(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageProduction(
            RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight
        )
    )
}

/// `transaction.timeout.ms`: how long a transaction may stay open before the broker aborts
/// it. A transaction holds the sends of the records between two commits (one commit interval
/// at most: while a transform runs longer, the overseer commits what came before it), plus
/// its commit: sending the offsets, waiting for deliveries and ending the transaction, each
/// bounded by [`KAFKA_CALL_TIMEOUT`]. The slack covers a producer queue slowed by the brokers.
/// The transform's own time is not in it, whatever `--record-timeout` is.
pub fn transaction_timeout(commit_interval: Duration) -> Duration {
    const SLACK: Duration = Duration::from_secs(10);
    commit_interval + KAFKA_CALL_TIMEOUT * 3 + SLACK
}

pub type OutputProducer = BaseProducer<ProducerContext>;

pub struct ProducerContext {
    books: Arc<Books>,
}

impl ClientContext for ProducerContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log_to_tracing(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(%error, reason, "producer error");
    }
}

impl RdProducerContext for ProducerContext {
    type DeliveryOpaque = Box<Sent>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<Sent>) {
        match result {
            Ok(_) => match sent.copy {
                SentAs::Changelog => {}
                SentAs::Output => {
                    self.books.metrics.produced.inc();
                    self.books.tracker().acknowledged(sent.slot, sent.offset);
                }
                SentAs::DeadLetter { .. } => {
                    self.books.tracker().acknowledged(sent.slot, sent.offset);
                }
            },
            Err((error, message)) => {
                if purged_by_an_abort(error) {
                    // Neither a failure nor an acknowledgement: the aborted transaction's
                    // inputs are rewound and processed again.
                    tracing::debug!(
                        topic = message.topic(),
                        offset = sent.offset,
                        "a record of an aborted transaction was purged"
                    );
                    return;
                }
                let smallest = matches!(
                    sent.copy,
                    SentAs::DeadLetter { smallest: true, .. } | SentAs::Changelog
                );
                if refuses_the_record(error) && !smallest {
                    // Not acknowledged: the input stays in flight until its dead letter is.
                    tracing::warn!(%error, topic = message.topic(), offset = sent.offset, "the brokers refused a record; its input is dead-lettered instead");
                    self.books.tracker().refuse(Refused {
                        slot: sent.slot,
                        offset: sent.offset,
                        to: message.topic().to_owned(),
                        error: error.to_string(),
                        copy: sent.copy,
                    });
                    return;
                }
                let what = match sent.copy {
                    SentAs::Output => "an output record",
                    SentAs::DeadLetter { .. } => "a dead-letter copy",
                    SentAs::Changelog => "a changelog entry (the state is not written)",
                };
                let why = format!(
                    "{what} could not be delivered to {}: {error}",
                    message.topic()
                );
                tracing::error!(%error, topic = message.topic(), "delivery failed");
                self.books.tracker().fail(why);
            }
        }
    }
}

pub struct ConsumerContext {
    committer: Arc<Committer>,
    books: Arc<Books>,
    /// A warm start: assigned partitions are held until the hand-off.
    handoff: Option<Arc<crate::handoff::HandOff>>,
}

impl ClientContext for ConsumerContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log_to_tracing(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(%error, reason, "consumer error");
    }

    fn stats(&self, statistics: Statistics) {
        for (topic, stats) in &statistics.topics {
            for (partition, p) in &stats.partitions {
                // -1 is librdkafka's internal "unassigned" partition; lag -1 means unknown.
                if *partition >= 0 && p.consumer_lag >= 0 {
                    self.books
                        .metrics
                        .set_lag(topic, *partition, p.consumer_lag);
                }
            }
        }
    }
}

/// The rebalance protocol as logs name it.
fn protocol_name(protocol: &RebalanceProtocol) -> &'static str {
    match protocol {
        RebalanceProtocol::Cooperative => "cooperative",
        RebalanceProtocol::Eager => "eager",
        RebalanceProtocol::None => "none",
    }
}

impl rdkafka::consumer::ConsumerContext for ConsumerContext {
    /// Replaces rust-rdkafka's default, which picks the same calls (incremental under the
    /// cooperative protocol, whole assignments under eager) but drops their errors: a
    /// partition the group gave this member that librdkafka did not take would then sit
    /// unread, and one it did not let go would be read twice.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        event: RDKafkaRespErr,
        partitions: &mut TopicPartitionList,
    ) {
        // What librdkafka itself checks the calls against; None before the first join, when
        // either call is accepted.
        let protocol = consumer.rebalance_protocol();
        let incremental = matches!(protocol, RebalanceProtocol::Cooperative);
        let protocol = protocol_name(&protocol);
        let count = partitions.count();
        let (call, result) = match event {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let result = if incremental {
                    consumer.incremental_assign(partitions)
                } else {
                    consumer.assign(partitions)
                };
                let owned = consumer.assignment().map_or(0, |a| a.count());
                tracing::info!(partitions = count, owned, protocol, "partitions assigned");
                // A warm start holds them until the hand-off names their start.
                let result = match &self.handoff {
                    Some(handoff) => result.and_then(|()| handoff.assigned(consumer, partitions)),
                    None => result,
                };
                ("assign", result)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // Lost: the group already gave them to others (this member missed its
                // session or its generation), so they are not committed.
                let lost = consumer.assignment_lost();
                // Under the cooperative protocol a member keeps what does not move.
                let kept = consumer
                    .assignment()
                    .map_or(0, |a| a.count())
                    .saturating_sub(count);
                tracing::info!(
                    partitions = count,
                    kept,
                    lost,
                    protocol,
                    "partitions revoked"
                );
                if let Some(handoff) = &self.handoff {
                    handoff.revoked(partitions);
                }
                self.committer.revoke(consumer, partitions, lost);
                let result = if incremental {
                    consumer.incremental_unassign(partitions)
                } else {
                    consumer.unassign()
                };
                ("unassign", result)
            }
            other => {
                // librdkafka only ever calls with one of the two above.
                tracing::error!(event = ?other, protocol, "unexpected rebalance event");
                let result = if incremental {
                    consumer.incremental_unassign(partitions)
                } else {
                    consumer.unassign()
                };
                ("unassign", result)
            }
        };
        if let Err(error) = result {
            tracing::error!(%error, call, partitions = count, protocol, "the rebalance could not be applied");
            // The group and this member would disagree on what it reads: stop (exit 1) and let
            // a fresh start join again.
            self.books
                .tracker()
                .fail(format!("the rebalance's {call} failed: {error}"));
        }
    }
}

fn common(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.bootstrap)
        .set("client.id", format!("plumber-processor.{}", config.group))
        .set_log_level(RDKafkaLogLevel::Info);
    client
}

/// The consumers' session timeout unless `-X session.timeout.ms=…` says otherwise.
const SESSION_TIMEOUT_MS: &str = "10000";

/// The session timeout the consumer runs with.
pub fn session_timeout(config: &Config) -> Duration {
    let ms = config
        .kafka
        .iter()
        .rev()
        .find(|(key, _)| key == "session.timeout.ms")
        .map_or(SESSION_TIMEOUT_MS, |(_, value)| value.as_str());
    // librdkafka refuses a malformed value when the consumer is created.
    Duration::from_millis(ms.parse().unwrap_or(10_000))
}

fn with_overrides(mut client: ClientConfig, config: &Config) -> ClientConfig {
    for (key, value) in &config.kafka {
        client.set(key, value);
    }
    client
}

/// The producer for outputs and dead letters.
///
/// Exactly-once is transactional (hence idempotent). At-least-once is not idempotent: it keeps
/// one request in flight per broker instead, so retries cannot reorder a partition, and a retry
/// of a request whose answer was lost may duplicate, which at-least-once allows. librdkafka's
/// idempotent producer busy-waits whenever a partition has its five requests in flight; against
/// a broker that acknowledges slowly (tansu) that burned a core per processor, about 20 µs of
/// CPU per record instead of 3 (bench/results/processor.md).
pub fn producer(
    config: &Config,
    transactional: bool,
    books: Arc<Books>,
) -> Result<OutputProducer, KafkaError> {
    let mut client = common(config);
    client
        // Java clients' partitioner, so keys land where the rest of the Kafka world expects.
        .set("partitioner", "murmur2_random")
        // Topics are the daemon's to create; a missing one is an error, never a new topic
        // with the broker's defaults (librdkafka's producer default is to create it).
        .set("allow.auto.create.topics", "false")
        .set("linger.ms", "5")
        // Bounds memory: librdkafka's default allows a gigabyte of queued records.
        .set("queue.buffering.max.kbytes", "16384");
    if transactional {
        let timeout = transaction_timeout(config.commit_interval(crate::DeliveryMode::ExactlyOnce));
        client
            .set("transactional.id", config.transactional_id())
            // Also how long a crashed instance's open transaction can hold up readers (its
            // restart with the same --instance aborts it at once).
            .set("transaction.timeout.ms", timeout.as_millis().to_string());
    } else {
        client
            .set("enable.idempotence", "false")
            .set("max.in.flight.requests.per.connection", "1");
    }
    with_overrides(client, config).create_with_context(ProducerContext { books })
}

pub fn consumer(
    config: &Config,
    committer: Arc<Committer>,
    books: Arc<Books>,
    handoff: Option<Arc<crate::handoff::HandOff>>,
    with_stats: bool,
) -> Result<BaseConsumer<ConsumerContext>, KafkaError> {
    let mut client = common(config);
    client
        .set("group.id", &config.group)
        .set("partition.assignment.strategy", config.assignor.strategy())
        .set("enable.auto.commit", "false")
        // The engine always sets a group's offsets before it starts; a partition without any
        // (added later) is read from its start rather than skipped.
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        // Brokers answer a fetch as soon as data arrives; some (tansu) wait the whole
        // fetch.wait.max.ms (librdkafka: 500 ms) first, which would be each step's latency.
        .set("fetch.wait.max.ms", "100")
        // Bounds memory while catching up on a backlog. librdkafka keeps each prefetched
        // record as an operation of a few hundred bytes, and by default prefetches up to
        // 100,000 records per partition, 64 MB of them, and fetches 50 MB at a time: 100,000
        // small records took 55 MB. A 1 MB fetch on top of 1 MB of queued records keeps the
        // processor under 40 MB at the baseline loop's pace (bench/results/processor.md). A
        // record larger than a fetch is still fetched whole (KIP-74).
        .set("fetch.max.bytes", "1048576")
        .set("queued.max.messages.kbytes", "1024")
        // Fetches again as soon as the prefetch drains (librdkafka waits up to a second).
        .set("fetch.queue.backoff.ms", "10")
        // A crashed instance's partitions move to the others (or its restart) after 10 s,
        // not librdkafka's default 45 s. A graceful stop leaves the group at once anyway.
        .set("session.timeout.ms", SESSION_TIMEOUT_MS)
        .set("heartbeat.interval.ms", "2000");
    if with_stats {
        client.set("statistics.interval.ms", "5000");
    }
    with_overrides(client, config).create_with_context(ConsumerContext {
        committer,
        books,
        handoff,
    })
}

/// Connection settings (bootstrap, security, `-X` overrides) for a consumer outside the
/// step's group, such as a state restore.
pub fn reader_config(config: &Config) -> ClientConfig {
    let mut client = common(config);
    client.set("group.id", format!("{}.restore", config.group));
    with_overrides(client, config)
}

/// Reads the record at `offset` of `topic`/`partition` again, outside any group: for the
/// dead letter of a record whose value is no longer at hand.
pub fn fetch_record(
    config: &Config,
    topic: &str,
    partition: i32,
    offset: i64,
    timeout: Duration,
) -> Result<OwnedMessage, String> {
    let mut client = common(config);
    client
        // librdkafka assigns partitions only to a consumer with a group; this one never
        // joins it (no subscription) nor commits.
        .set("group.id", format!("{}.reread", config.group))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true");
    let consumer: Reader = with_overrides(client, config)
        .create_with_context(ReaderContext)
        .map_err(|e| e.to_string())?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(offset))
        .map_err(|e| e.to_string())?;
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    let until = Instant::now() + timeout;
    let mut last_error = String::from("no answer");
    let read = loop {
        if Instant::now() >= until {
            break Err(format!(
                "not read within {} s: {last_error}",
                timeout.as_secs()
            ));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) if message.offset() == offset => break Ok(message.detach()),
            Some(Ok(message)) if message.offset() > offset => {
                break Err(format!("offset {offset} is no longer in the partition"));
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {
                break Err(format!("the partition ends before offset {offset}"));
            }
            Some(Err(error)) => last_error = error.to_string(),
            _ => {}
        }
    };
    drop_within(consumer, Instant::now() + KAFKA_CALL_TIMEOUT);
    read
}

/// Drops `consumer` on a thread of its own, which closes it (the revocation callback
/// commits, then it leaves its group), and waits for that until `until`; false when it did
/// not finish (a broker that is gone): the drop, which waits for the close without end, is
/// left to the end of the process.
pub fn drop_within<C: rdkafka::consumer::ConsumerContext + 'static>(
    consumer: BaseConsumer<C>,
    until: Instant,
) -> bool {
    let (closed, done) = std::sync::mpsc::channel();
    let closing = std::thread::Builder::new()
        .name("consumer-close".into())
        .spawn(move || {
            drop(consumer);
            let _ = closed.send(());
        });
    closing.is_ok()
        && done
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .is_ok()
}

/// Closes the consumer: the revocation callback commits, then it leaves the group. Returns
/// false when that did not finish by `until` (a broker that is gone): such a consumer must
/// not be dropped, its drop would wait for the close without end.
pub fn close(consumer: &BaseConsumer<ConsumerContext>, until: Instant) -> bool {
    if consumer.close_queue().is_err() {
        return true;
    }
    while !consumer.closed() {
        if Instant::now() >= until {
            return false;
        }
        consumer.poll(Duration::from_millis(100));
    }
    true
}

/// Which of `topics` the brokers do not know; none when they did not answer within
/// `timeout` (the first send then reports the problem).
pub fn unknown_topics<'t>(
    producer: &OutputProducer,
    topics: impl Iterator<Item = &'t String>,
    timeout: Duration,
) -> Vec<String> {
    let Ok(metadata) = producer.client().fetch_metadata(None, timeout) else {
        return Vec::new();
    };
    topics
        .filter(|name| !metadata.topics().iter().any(|t| t.name() == name.as_str()))
        .cloned()
        .collect()
}

/// Whether every broker reached supports the transaction APIs; `None` when none answered.
pub fn brokers_support_transactions(config: &Config, timeout: Duration) -> Option<bool> {
    plumber_kafka_probe::brokers_support_transactions(
        &with_overrides(common(config), config),
        timeout,
    )
}
