//! The changelog of a stateful SQL step (`docs/stateful-sql.md`): one changelog partition per
//! input partition, whose entries ([`plumber_sql::Change`]: a key, and the latest value or a
//! tombstone) fold back into the partition's state. [`restore`] reads a changelog partition
//! from its beginning to its end, outside any consumer group, and folds it.
//!
//! The processor does not run stateful steps yet; this is the restore they will start from,
//! tested against a broker (`tests/state_restore.rs`).

use std::time::{Duration, Instant};

use plumber_sql::{Change, PartitionState};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("cannot read the changelog {topic}/{partition}: {source}")]
    Read {
        topic: String,
        partition: i32,
        #[source]
        source: KafkaError,
    },
    #[error(
        "the changelog {topic}/{partition} was not read to its end within {} s ({entries} entries read); is the broker reachable?",
        timeout.as_secs()
    )]
    Timeout {
        topic: String,
        partition: i32,
        entries: usize,
        timeout: Duration,
    },
    #[error("the changelog {topic}/{partition} holds an entry this version cannot read: {reason}")]
    Entry {
        topic: String,
        partition: i32,
        reason: String,
    },
}

impl RestoreError {
    /// Whether reading again can help (a broker that answers later); an entry this version
    /// cannot read stays unreadable.
    pub fn retryable(&self) -> bool {
        !matches!(self, RestoreError::Entry { .. })
    }
}

/// How long one poll waits; bounds how late the timeout is noticed.
const POLL: Duration = Duration::from_millis(100);

/// The state of input partition `partition`, from changelog `topic`'s partition of that
/// number, read to its end (`read_committed`: a transaction the previous owner left open or
/// aborted is not state). `client` holds the connection settings (bootstrap, security); its
/// `group.id` names no group this consumer joins or commits to.
pub fn restore(
    mut client: ClientConfig,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<PartitionState, RestoreError> {
    let read_error = |source| RestoreError::Read {
        topic: topic.to_owned(),
        partition,
        source,
    };
    if client.get("group.id").is_none() {
        // librdkafka assigns partitions only to a consumer with a group id; this one never
        // subscribes nor commits.
        client.set("group.id", format!("plumber.restore.{topic}"));
    }
    let consumer: BaseConsumer = client
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(read_error)?;
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Beginning)
        .map_err(read_error)?;
    consumer.assign(&assignment).map_err(read_error)?;
    let until = Instant::now() + timeout;
    let mut changes: Vec<Change> = Vec::new();
    loop {
        if Instant::now() >= until {
            return Err(RestoreError::Timeout {
                topic: topic.to_owned(),
                partition,
                entries: changes.len(),
                timeout,
            });
        }
        match consumer.poll(POLL) {
            Some(Ok(message)) => {
                let Some(key) = message.key() else {
                    return Err(RestoreError::Entry {
                        topic: topic.to_owned(),
                        partition,
                        reason: format!("the entry at offset {} has no key", message.offset()),
                    });
                };
                changes.push((key.to_vec(), message.payload().map(<[u8]>::to_vec)));
            }
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            // Transient (a broker restarting): polled again until the timeout.
            Some(Err(error)) => tracing::debug!(%error, topic, partition, "reading the changelog"),
            None => {}
        }
    }
    PartitionState::restore(changes).map_err(|reason| RestoreError::Entry {
        topic: topic.to_owned(),
        partition,
        reason,
    })
}
