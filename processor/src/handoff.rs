//! A warm start (`--handoff-group`): a successor that joins its group before its predecessor
//! stops, and reads nothing until the cutover engine hands it the offsets to start from.
//!
//! The engine cannot set the offsets of a group that has members (the coordinator refuses a
//! commit from outside a non-empty group), so it writes them to a second group that nobody
//! joins, the *hand-off group*. Every partition this instance is given is paused at once
//! and held, unread, until its start is known: the group's own committed offset if it has
//! one (an instance took the hand-off already, or read past it), else the hand-off group's.
//! A partition that starts from the hand-off has it committed to the group, by this
//! instance, its owner, before anything is read: so whoever owns it next starts there too,
//! and the group's committed offsets end up what the hand-off said. Until the hand-off
//! comes, a partition without a committed offset is never read from anywhere.
//!
//! The engine commits the hand-off of every input partition in one request, which a group
//! coordinator writes whole, so a hand-off read is complete: a partition it does not name was
//! added to its topic after it was written, nothing read it before the cutover, and it
//! starts from its beginning (as any processor reads a partition without a committed
//! offset).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::delivery::{Consumer, KAFKA_CALL_TIMEOUT};
use crate::metrics::Metrics;

/// How often the hand-off group is asked while partitions wait for it: the wait is part of
/// the replaced step's output gap. One small request each time (its offsets of the held
/// partitions). Every 25 ms, twice in three full test runs a handed-off partition was read
/// from its beginning after it had been read from the hand-off (librdkafka's own start of
/// the partition applied after the seek, not understood yet): 100 ms, as before, until it is.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// How often, while partitions wait, the group's own offsets and the whole hand-off are read
/// too (and at once for newly assigned partitions): they show starts the probe of the held
/// partitions does not (an instance of this group took the hand-off already; the held
/// partitions were all added after it was written).
const FULL_LOOK_EVERY: Duration = Duration::from_secs(1);

/// One input partition.
type Partition = (String, i32);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read where the held partitions start (hand-off group {group}): {source}")]
    Read {
        group: String,
        #[source]
        source: KafkaError,
    },
    #[error("cannot commit the hand-off's offsets to the group before reading: {0}")]
    Commit(#[source] KafkaError),
    #[error("cannot order the start after librdkafka's own (reading the assignment): {0}")]
    Barrier(#[source] KafkaError),
    #[error("cannot start {topic}/{partition} where it was handed off: {source}")]
    Start {
        topic: String,
        partition: i32,
        #[source]
        source: KafkaError,
    },
}

/// What a warm start holds: the partitions waiting for their start, and the hand-off once
/// read.
pub struct HandOff {
    group: String,
    /// Never joins nor commits: it only reads the hand-off group's committed offsets.
    probe: BaseConsumer,
    inputs: Vec<String>,
    waiting: Mutex<Waiting>,
    metrics: Metrics,
}

#[derive(Default)]
struct Waiting {
    /// Assigned and paused, their start unknown.
    partitions: BTreeSet<Partition>,
    /// The hand-off, once it names every input partition.
    offsets: Option<BTreeMap<Partition, i64>>,
    next_probe: Option<Instant>,
    /// `None`: due at once.
    next_full_look: Option<Instant>,
}

impl HandOff {
    /// The warm start of `config`, if it asks for one.
    pub fn of(config: &Config, metrics: &Metrics) -> Result<Option<HandOff>, Error> {
        let Some(group) = &config.handoff_group else {
            return Ok(None);
        };
        let mut client = crate::kafka::reader_config(config);
        client
            .set("group.id", group)
            .set("enable.auto.commit", "false");
        let probe = client.create().map_err(|source| Error::Read {
            group: group.clone(),
            source,
        })?;
        tracing::info!(handoff_group = %group, "warm start: partitions are held until the hand-off");
        Ok(Some(HandOff {
            group: group.clone(),
            probe,
            inputs: config.inputs.clone(),
            waiting: Mutex::default(),
            metrics: metrics.clone(),
        }))
    }

    fn show_held(&self, waiting: &Waiting) {
        self.metrics
            .handoff_waiting
            .set(waiting.partitions.len() as i64);
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// In the rebalance callback, once `partitions` are assigned: holds them, unread, until
    /// [`HandOff::start_held`] knows where each starts. An error leaves them not held: the
    /// caller stops the processor rather than let them be read from wherever librdkafka
    /// would begin.
    pub fn assigned(
        &self,
        consumer: &Consumer,
        partitions: &TopicPartitionList,
    ) -> Result<(), KafkaError> {
        consumer.pause(partitions)?;
        let mut waiting = self.waiting();
        waiting.next_full_look = None;
        waiting.partitions.extend(
            partitions
                .elements()
                .iter()
                .map(|e| (e.topic().to_owned(), e.partition())),
        );
        tracing::info!(
            held = waiting.partitions.len(),
            handoff_known = waiting.offsets.is_some(),
            "partitions held until their start is known"
        );
        self.show_held(&waiting);
        Ok(())
    }

    /// In the rebalance callback, before `partitions` are revoked.
    pub fn revoked(&self, partitions: &TopicPartitionList) {
        let mut waiting = self.waiting();
        for element in partitions.elements() {
            waiting
                .partitions
                .remove(&(element.topic().to_owned(), element.partition()));
        }
        self.show_held(&waiting);
    }

    /// From the loop, after each poll: starts the partitions held whose start is known.
    pub fn start_held(&self, consumer: &Consumer) -> Result<(), Error> {
        let mut waiting = self.waiting();
        if waiting.partitions.is_empty() {
            return Ok(());
        }
        let held: Vec<Partition> = waiting.partitions.iter().cloned().collect();
        // Before the hand-off came: a probe every PROBE_EVERY, a full look when one names a
        // held partition (the engine writes the hand-off whole) or when one is due.
        if waiting.offsets.is_none() {
            let now = Instant::now();
            if waiting.next_probe.is_some_and(|at| now < at) {
                return Ok(());
            }
            waiting.next_probe = Some(now + PROBE_EVERY);
            if waiting.next_full_look.is_none_or(|at| now >= at) {
                waiting.next_full_look = Some(now + FULL_LOOK_EVERY);
            } else if !self.names_any(&held)? {
                return Ok(());
            }
        }
        let committed = self.committed(consumer, &held)?;
        if waiting.offsets.is_none() && held.iter().any(|p| !committed.contains_key(p)) {
            waiting.offsets = self.read_handoff(consumer)?;
            if waiting.offsets.is_some() {
                tracing::info!(handoff_group = %self.group, "the hand-off came");
            }
        }
        let mut to_commit = TopicPartitionList::new();
        // `None`: where the group's committed offset says, which is where librdkafka starts
        // the partition by itself (its own query at the assignment finds that offset: a
        // partition's previous owner commits before it lets go). A seek there could only race
        // with that start, which would move the partition back to it after records were read.
        let mut starts: Vec<(Partition, Option<Offset>)> = Vec::new();
        let mut newer = 0;
        for partition in &held {
            let start = match (committed.get(partition), &waiting.offsets) {
                (Some(_), _) => None,
                (None, Some(handed)) => match handed.get(partition) {
                    Some(&offset) => {
                        let (topic, number) = partition;
                        to_commit
                            .add_partition_offset(topic, *number, Offset::Offset(offset))
                            .map_err(|source| start_error(partition, source))?;
                        Some(Offset::Offset(offset))
                    }
                    None => {
                        newer += 1;
                        Some(Offset::Beginning)
                    }
                },
                // Neither yet: it waits.
                (None, None) => continue,
            };
            starts.push((partition.clone(), start));
        }
        if starts.is_empty() {
            return Ok(());
        }
        // Committed by its owner before it is read: the group holds the hand-off from now on.
        if to_commit.count() > 0 {
            consumer
                .commit(&to_commit, CommitMode::Sync)
                .map_err(Error::Commit)?;
        }
        // librdkafka applies the answer to its own query (sent at the assignment, which found
        // no offset: the partition's start would be its beginning) on its main thread: one
        // received before ours but applied after the seek below would move the partition
        // back (seen under load). A call that thread serves in turn makes sure every answer
        // received so far is applied first.
        if starts.iter().any(|(_, start)| start.is_some()) {
            consumer.assignment().map_err(Error::Barrier)?;
        }
        for ((topic, number), start) in &starts {
            let partition = (topic.clone(), *number);
            if let Some(offset) = start {
                consumer
                    .seek(topic, *number, *offset, KAFKA_CALL_TIMEOUT)
                    .map_err(|source| start_error(&partition, source))?;
            }
            let mut one = TopicPartitionList::new();
            one.add_partition(topic, *number);
            consumer
                .resume(&one)
                .map_err(|source| start_error(&partition, source))?;
            waiting.partitions.remove(&partition);
        }
        tracing::info!(
            partitions = starts.len(),
            from_handoff = to_commit.count(),
            newer_than_handoff = newer,
            still_held = waiting.partitions.len(),
            "held partitions started"
        );
        self.show_held(&waiting);
        Ok(())
    }

    /// How long the loop may wait for records before the next probe is due; `None` when no
    /// partition waits for the hand-off.
    pub fn next_probe_in(&self) -> Option<Duration> {
        let waiting = self.waiting();
        if waiting.partitions.is_empty() || waiting.offsets.is_some() {
            return None;
        }
        Some(waiting.next_probe.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        }))
    }

    /// Whether the hand-off group names one of `partitions`: then the hand-off is written.
    fn names_any(&self, partitions: &[Partition]) -> Result<bool, Error> {
        let mut list = TopicPartitionList::new();
        for (topic, number) in partitions {
            list.add_partition(topic, *number);
        }
        let named = self
            .probe
            .committed_offsets(list, KAFKA_CALL_TIMEOUT)
            .map_err(|source| Error::Read {
                group: self.group.clone(),
                source,
            })?;
        Ok(!offsets_of(&named).is_empty())
    }

    /// The group's committed offsets of `partitions` that it has.
    fn committed(
        &self,
        consumer: &Consumer,
        partitions: &[Partition],
    ) -> Result<BTreeMap<Partition, i64>, Error> {
        let mut list = TopicPartitionList::new();
        for (topic, number) in partitions {
            list.add_partition(topic, *number);
        }
        let committed = consumer
            .committed_offsets(list, KAFKA_CALL_TIMEOUT)
            .map_err(|source| Error::Read {
                group: self.group.clone(),
                source,
            })?;
        Ok(offsets_of(&committed))
    }

    /// The hand-off, once it is written: it names a partition of every input.
    fn read_handoff(&self, consumer: &Consumer) -> Result<Option<BTreeMap<Partition, i64>>, Error> {
        let client_error = |source| Error::Read {
            group: self.group.clone(),
            source,
        };
        let mut list = TopicPartitionList::new();
        for topic in &self.inputs {
            let metadata = consumer
                .fetch_metadata(Some(topic), KAFKA_CALL_TIMEOUT)
                .map_err(client_error)?;
            for found in metadata.topics() {
                for partition in found.partitions() {
                    list.add_partition(topic, partition.id());
                }
            }
        }
        let offsets = offsets_of(
            &self
                .probe
                .committed_offsets(list, KAFKA_CALL_TIMEOUT)
                .map_err(client_error)?,
        );
        let written = self
            .inputs
            .iter()
            .all(|input| offsets.keys().any(|(topic, _)| topic == input));
        Ok(written.then_some(offsets))
    }
}

/// The valid offsets of `list`.
fn offsets_of(list: &TopicPartitionList) -> BTreeMap<Partition, i64> {
    list.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some(((e.topic().to_owned(), e.partition()), offset)),
            _ => None,
        })
        .collect()
}

fn start_error(partition: &Partition, source: KafkaError) -> Error {
    Error::Start {
        topic: partition.0.clone(),
        partition: partition.1,
        source,
    }
}
