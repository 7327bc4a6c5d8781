//! Kafka clients: their settings, the callbacks that feed the delivery books and metrics, and
//! the start-up check whether the brokers support transactions.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext as RdProducerContext};
use rdkafka::statistics::Statistics;

use crate::config::Config;
use crate::delivery::{Books, Committer};

/// What a delivery callback needs to know about a sent record.
#[derive(Debug)]
pub struct Sent {
    pub slot: usize,
    pub offset: i64,
    /// A dead-letter copy, not an output.
    pub dead_letter: bool,
}

pub type OutputProducer = BaseProducer<ProducerContext>;

fn log_to_tracing(level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", facility, message),
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, message),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", facility, message)
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, message),
    }
}

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
            Ok(_) => {
                if !sent.dead_letter {
                    self.books.metrics.produced.inc();
                }
                self.books.tracker().acknowledged(sent.slot, sent.offset);
            }
            Err((error, message)) => {
                use rdkafka::Message;
                let why = format!("to {} failed: {error}", message.topic());
                tracing::error!(%error, topic = message.topic(), "delivery failed");
                self.books.tracker().fail(why);
            }
        }
    }
}

pub struct ConsumerContext {
    committer: Arc<Committer>,
    books: Arc<Books>,
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

impl rdkafka::consumer::ConsumerContext for ConsumerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(partitions) => {
                tracing::info!(partitions = partitions.count(), "partitions revoked");
                self.committer.revoke(consumer, partitions);
            }
            Rebalance::Assign(partitions) => {
                tracing::info!(partitions = partitions.count(), "partitions assigned");
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
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
        .set("linger.ms", "5")
        // Bounds memory: librdkafka's default allows a gigabyte of queued records.
        .set("queue.buffering.max.kbytes", "16384");
    if transactional {
        client
            .set("transactional.id", config.transactional_id())
            // Bounds how long a crashed instance's open transaction holds up readers.
            .set("transaction.timeout.ms", "10000");
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
    with_stats: bool,
) -> Result<BaseConsumer<ConsumerContext>, KafkaError> {
    let mut client = common(config);
    client
        .set("group.id", &config.group)
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
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "2000");
    if with_stats {
        client.set("statistics.interval.ms", "5000");
    }
    with_overrides(client, config).create_with_context(ConsumerContext { committer, books })
}

/// Whether every broker the client reached supports the transaction APIs, from the API
/// versions they announced. librdkafka exposes those only in its `feature` debug log, so a
/// short-lived client records that log. `None` when no broker answered within `timeout`.
pub fn brokers_support_transactions(config: &Config, timeout: Duration) -> Option<bool> {
    let probe = ApiProbe::default();
    let mut client = common(config);
    client
        .set("debug", "feature")
        .set_log_level(RDKafkaLogLevel::Debug);
    let client = with_overrides(client, config);
    let producer: BaseProducer<ApiProbe> = client.create_with_context(probe).ok()?;
    let reached = producer.client().fetch_metadata(None, timeout).is_ok();
    // The log lines travel through the client's queue: serve it.
    for _ in 0..3 {
        producer.poll(Duration::from_millis(50));
    }
    let seen = producer
        .context()
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if !reached || seen.brokers == 0 {
        return None;
    }
    Some(
        TRANSACTION_APIS
            .iter()
            .all(|api| seen.apis.iter().any(|seen| seen == api)),
    )
}

/// Produce with transactions, commit offsets in them, and end them (KIP-98, KIP-447).
const TRANSACTION_APIS: [&str; 5] = [
    "InitProducerId",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "EndTxn",
    "TxnOffsetCommit",
];

#[derive(Default)]
struct ApiProbe {
    seen: Mutex<SeenApis>,
}

#[derive(Default, Clone)]
struct SeenApis {
    brokers: usize,
    apis: Vec<String>,
}

impl ClientContext for ApiProbe {
    fn log(&self, _level: RDKafkaLogLevel, facility: &str, message: &str) {
        if facility != "APIVERSION" {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if message.ends_with("Broker API support:") {
            seen.brokers += 1;
        } else if let Some(api) = api_name(message) {
            seen.apis.push(api.to_owned());
        }
    }
}

impl RdProducerContext for ApiProbe {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// `…:   ApiKey EndTxn (26) Versions 0..3` → `EndTxn`.
fn api_name(line: &str) -> Option<&str> {
    let rest = &line[line.find("ApiKey ")? + "ApiKey ".len()..];
    rest.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_names_are_read_from_librdkafka_feature_lines() {
        let line = "127.0.0.1:9092/1:   ApiKey EndTxn (26) Versions 0..3";
        assert_eq!(api_name(line), Some("EndTxn"));
        assert_eq!(api_name("Broker API support:"), None);
    }
}
