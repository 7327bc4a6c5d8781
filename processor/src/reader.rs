//! Logging librdkafka through `tracing`, and the consumer that reads partitions to their end
//! outside any group (a state restore, a rebuild, a record read again).

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// librdkafka's log lines, at their level, under target `librdkafka`.
pub fn log_to_tracing(level: RDKafkaLogLevel, facility: &str, message: &str) {
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

/// The context of a consumer that reads a partition to its end outside any group (a state
/// restore, a rebuild, a record read again): reaching the end is what it waits for, not an
/// error, though librdkafka reports it as one.
pub struct ReaderContext;

impl ClientContext for ReaderContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log_to_tracing(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_))
            && error.rdkafka_error_code() != Some(RDKafkaErrorCode::PartitionEOF)
        {
            tracing::warn!(%error, reason, "reader error");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// A consumer that reads outside any group.
pub type Reader = BaseConsumer<ReaderContext>;

/// Settings of a consumer outside any group that reads to the end of what it is assigned
/// (`read_committed`): the end is known when a fetch comes back empty, and a broker may
/// hold an empty fetch for `fetch.wait.max.ms` (tansu holds it whole: librdkafka's 500 ms
/// made an empty changelog take 1.1 s to restore).
pub fn to_the_end(client: &mut ClientConfig) -> &mut ClientConfig {
    client
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "10")
}
