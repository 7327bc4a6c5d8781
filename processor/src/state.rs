//! The changelog of a stateful SQL step (`docs/stateful-sql.md`): one changelog partition per
//! input partition, whose entries ([`plumber_sql::Change`]: a key, and the latest value or a
//! tombstone) fold back into the partition's state. [`restore`] reads a changelog partition
//! from its beginning to its end, outside any consumer group, and folds it.
//!
//! [`Stores`] holds the state of the partitions an instance reads. The loop feeds it; the
//! [`crate::delivery::Committer`] writes what changed to the changelog with every commit
//! (before the offsets, so a committed offset never runs ahead of the state that reflects
//! it), and drops a partition's state when the partition goes, or when a transaction that
//! changed it is aborted: the next record of the partition restores it again.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use plumber_sql::{Change, PartitionState};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::reader::{Reader, ReaderContext, to_the_end};

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

/// How long a restore may take before the processor gives up (and exits, to be restarted):
/// a million groups take about 35 s from tansu.
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);

/// One input partition's changes since the last commit, for changelog partition
/// `partition`: the last is the partition's own entry, which names `reflects`.
#[derive(Debug)]
pub struct PartitionChanges {
    pub topic: String,
    pub partition: i32,
    /// The input offset of the last record the changes reflect.
    pub reflects: Option<i64>,
    pub changes: Vec<Change>,
}

/// The state of the input partitions an instance reads, by partition: a stateful query reads
/// one input topic.
pub struct Stores {
    /// The input topic.
    input: String,
    changelog: String,
    client: ClientConfig,
    max_groups: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    partitions: HashMap<i32, PartitionState>,
    /// Partitions restored without state, whose first record has not come yet: what a
    /// rebuild (`--rebuild`) fills.
    without_state: std::collections::HashSet<i32>,
    /// A record was fed and is not booked yet (its outputs unsent): the state reflects it,
    /// so no commit may write the state until it is ([`Stores::settle`]).
    in_hand: bool,
}

/// What the metrics show of the state.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub partitions: usize,
    pub groups: usize,
    /// The smallest stream time of the partitions held (the watermark below which every
    /// window of this instance has closed), ms.
    pub stream_time: Option<i64>,
}

impl Stores {
    /// The state of `input`'s partitions, kept in `changelog`; `client`: connection settings
    /// for restores (bootstrap, security).
    pub fn new(
        input: String,
        changelog: String,
        client: ClientConfig,
        max_groups: usize,
    ) -> Stores {
        Stores {
            input,
            changelog,
            client,
            max_groups,
            held: Mutex::new(Held::default()),
        }
    }

    pub fn changelog(&self) -> &str {
        &self.changelog
    }

    /// The most open groups the instance keeps.
    pub fn max_groups(&self) -> usize {
        self.max_groups
    }

    /// Connection settings for reading outside the step's group.
    pub fn client(&self) -> &ClientConfig {
        &self.client
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `partition`'s state is held and ready for its next record (not restored
    /// without state and waiting for a rebuild).
    pub fn ready(&self, partition: i32) -> bool {
        let held = self.held();
        held.partitions.contains_key(&partition) && !held.without_state.contains(&partition)
    }

    /// Restores from the changelog the state of each of `partitions` not held already, all
    /// at once. `progress` is called while it reads (a liveness beat).
    pub fn ensure(&self, partitions: &[i32], progress: &dyn Fn(usize)) -> Result<(), RestoreError> {
        let missing: Vec<i32> = {
            let held = self.held();
            let mut missing: Vec<i32> = partitions
                .iter()
                .copied()
                .filter(|p| !held.partitions.contains_key(p))
                .collect();
            missing.sort_unstable();
            missing.dedup();
            missing
        };
        if missing.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let restored = restore_many(
            self.client.clone(),
            &self.changelog,
            &missing,
            RESTORE_TIMEOUT,
            progress,
        )?;
        let mut held = self.held();
        for (partition, state) in restored {
            tracing::info!(
                topic = %self.input,
                partition,
                changelog = %self.changelog,
                groups = state.open_groups(),
                reflects = state.offset(),
                seconds = started.elapsed().as_secs_f64(),
                "state restored"
            );
            if state.offset().is_none() {
                held.without_state.insert(partition);
            }
            held.partitions.insert(partition, state);
        }
        Ok(())
    }

    /// Whether `partition` was restored without state and nothing was fed to it since; true
    /// once.
    pub fn take_without_state(&self, partition: i32) -> bool {
        self.held().without_state.remove(&partition)
    }

    /// Runs `f` on `partition`'s state outside the processing of a record (a rebuild);
    /// `None` when it is not held.
    pub fn with<R>(&self, partition: i32, f: impl FnOnce(&mut PartitionState) -> R) -> Option<R> {
        self.held().partitions.get_mut(&partition).map(f)
    }

    /// Feeds a record: runs `f` on `partition`'s state with the room it has (the bound minus
    /// what the other partitions hold), and holds every commit of the state off until the
    /// record is booked ([`Stores::settle`]). `None` when the partition's state is not held
    /// ([`Stores::ensure`] first).
    pub fn feed<R>(
        &self,
        partition: i32,
        f: impl FnOnce(&mut PartitionState, usize) -> R,
    ) -> Option<R> {
        let mut held = self.held();
        let others: usize = held
            .partitions
            .iter()
            .filter(|(p, _)| **p != partition)
            .map(|(_, state)| state.entries())
            .sum();
        let room = self.max_groups.saturating_sub(others);
        let state = held.partitions.get_mut(&partition)?;
        let result = f(state, room);
        held.in_hand = true;
        Some(result)
    }

    /// The record last fed is booked (its outputs sent): the state may be written.
    pub fn settle(&self) {
        self.held().in_hand = false;
    }

    /// What changed since the last call, for every partition held (its changes may be
    /// none; `reflects` still says what it covers); `None` while a record fed is not booked
    /// or is being fed: the state reflects records whose outputs are not sent.
    pub fn take_changes(&self) -> Option<Vec<PartitionChanges>> {
        // A feed that holds the lock is a record in hand: no waiting for it.
        let mut held = match self.held.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if held.in_hand {
            return None;
        }
        Some(
            held.partitions
                .iter_mut()
                .map(|(partition, state)| PartitionChanges {
                    topic: self.input.clone(),
                    partition: *partition,
                    changes: state.take_changes(),
                    reflects: state.offset(),
                })
                .collect(),
        )
    }

    /// The partition went to another instance (or was lost): its state is theirs to restore.
    pub fn forget(&self, topic: &str, partition: i32) {
        if topic != self.input {
            return;
        }
        let mut held = self.held();
        held.partitions.remove(&partition);
        held.without_state.remove(&partition);
    }

    /// A transaction was aborted: the state of every partition may reflect records it
    /// rolled back, and is restored again from what was committed.
    pub fn forget_all(&self) {
        let mut held = self.held();
        held.partitions.clear();
        held.without_state.clear();
        held.in_hand = false;
    }

    pub fn size(&self) -> Size {
        let held = self.held();
        let partitions = &held.partitions;
        Size {
            partitions: partitions.len(),
            groups: partitions.values().map(PartitionState::open_groups).sum(),
            stream_time: partitions
                .values()
                .filter_map(PartitionState::stream_time)
                .min(),
        }
    }
}

/// Where a rebuild starts reading an input partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    Earliest,
    /// The first record at or after this timestamp, ms (the earliest when none is before).
    Time(i64),
}

/// Feeds `feed` the records of `topic`/`partition` from `from` up to (not including) offset
/// `until`, outside any group (`read_committed`): a rebuild's reading of the input.
/// `progress` is called with the records read so far every 100 ms or so.
#[allow(clippy::too_many_arguments)]
pub fn read_input(
    mut client: ClientConfig,
    topic: &str,
    partition: i32,
    from: ReadFrom,
    until: i64,
    timeout: Duration,
    progress: &dyn Fn(usize),
    feed: &mut dyn FnMut(&rdkafka::message::BorrowedMessage<'_>),
) -> Result<usize, RestoreError> {
    let read_error = |source| RestoreError::Read {
        topic: topic.to_owned(),
        partition,
        source,
    };
    if client.get("group.id").is_none() {
        client.set("group.id", format!("plumber.rebuild.{topic}"));
    }
    let consumer: Reader = to_the_end(&mut client)
        .create_with_context(ReaderContext)
        .map_err(read_error)?;
    let start = match from {
        ReadFrom::Earliest => Offset::Beginning,
        ReadFrom::Time(ms) => {
            let mut times = TopicPartitionList::new();
            times
                .add_partition_offset(topic, partition, Offset::Offset(ms))
                .map_err(read_error)?;
            consumer
                .offsets_for_times(times, timeout)
                .map_err(read_error)?
                .find_partition(topic, partition)
                .map(|p| p.offset())
                // `End`: no record that recent; nothing to read.
                .filter(|o| matches!(o, Offset::Offset(_) | Offset::End))
                .unwrap_or(Offset::Beginning)
        }
    };
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, start)
        .map_err(read_error)?;
    consumer.assign(&assignment).map_err(read_error)?;
    let deadline = Instant::now() + timeout;
    let mut read = 0;
    let mut next_progress = Instant::now();
    loop {
        if Instant::now() >= next_progress {
            progress(read);
            next_progress = Instant::now() + POLL;
        }
        if Instant::now() >= deadline {
            return Err(RestoreError::Timeout {
                topic: topic.to_owned(),
                partition,
                entries: read,
                timeout,
            });
        }
        match consumer.poll(POLL) {
            Some(Ok(message)) if message.offset() < until => {
                feed(&message);
                read += 1;
                if message.offset() + 1 >= until {
                    return Ok(read);
                }
            }
            Some(Ok(_)) | Some(Err(KafkaError::PartitionEOF(_))) => return Ok(read),
            Some(Err(error)) => {
                tracing::debug!(%error, topic, partition, "reading the input to rebuild")
            }
            None => {}
        }
    }
}

/// The state of input partition `partition`, from changelog `topic`'s partition of that
/// number, read to its end (`read_committed`: a transaction the previous owner left open or
/// aborted is not state). `client` holds the connection settings (bootstrap, security); its
/// `group.id` names no group this consumer joins or commits to.
pub fn restore(
    client: ClientConfig,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<PartitionState, RestoreError> {
    let mut restored = restore_many(client, topic, &[partition], timeout, &|_| {})?;
    Ok(restored.pop().map(|(_, state)| state).unwrap_or_default())
}

/// The states of several partitions, read by one consumer at once: a new owner of several
/// partitions waits for the longest, not for their sum.
fn restore_many(
    mut client: ClientConfig,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
    progress: &dyn Fn(usize),
) -> Result<Vec<(i32, PartitionState)>, RestoreError> {
    let first = partitions.first().copied().unwrap_or(0);
    let read_error = |partition, source| RestoreError::Read {
        topic: topic.to_owned(),
        partition,
        source,
    };
    if client.get("group.id").is_none() {
        // librdkafka assigns partitions only to a consumer with a group id; this one never
        // subscribes nor commits.
        client.set("group.id", format!("plumber.restore.{topic}"));
    }
    let consumer: Reader = to_the_end(&mut client)
        .create_with_context(ReaderContext)
        .map_err(|e| read_error(first, e))?;
    let mut assignment = TopicPartitionList::new();
    for partition in partitions {
        assignment
            .add_partition_offset(topic, *partition, Offset::Beginning)
            .map_err(|e| read_error(*partition, e))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| read_error(first, e))?;
    let until = Instant::now() + timeout;
    let mut changes: HashMap<i32, Vec<Change>> =
        partitions.iter().map(|p| (*p, Vec::new())).collect();
    let mut ended: Vec<i32> = Vec::new();
    let read = |changes: &HashMap<i32, Vec<Change>>| changes.values().map(Vec::len).sum();
    let mut next_progress = Instant::now();
    while ended.len() < partitions.len() {
        if Instant::now() >= next_progress {
            progress(read(&changes));
            next_progress = Instant::now() + POLL;
        }
        if Instant::now() >= until {
            return Err(RestoreError::Timeout {
                topic: topic.to_owned(),
                partition: partitions
                    .iter()
                    .copied()
                    .find(|p| !ended.contains(p))
                    .unwrap_or(first),
                entries: read(&changes),
                timeout,
            });
        }
        match consumer.poll(POLL) {
            Some(Ok(message)) => {
                let partition = message.partition();
                let Some(key) = message.key() else {
                    return Err(RestoreError::Entry {
                        topic: topic.to_owned(),
                        partition,
                        reason: format!("the entry at offset {} has no key", message.offset()),
                    });
                };
                changes
                    .entry(partition)
                    .or_default()
                    .push((key.to_vec(), message.payload().map(<[u8]>::to_vec)));
            }
            Some(Err(KafkaError::PartitionEOF(partition))) if !ended.contains(&partition) => {
                ended.push(partition);
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            // Transient (a broker restarting): polled again until the timeout.
            Some(Err(error)) => tracing::debug!(%error, topic, "reading the changelog"),
            None => {}
        }
    }
    partitions
        .iter()
        .map(|partition| {
            let state = PartitionState::restore(changes.remove(partition).unwrap_or_default())
                .map_err(|reason| RestoreError::Entry {
                    topic: topic.to_owned(),
                    partition: *partition,
                    reason,
                })?;
            Ok((*partition, state))
        })
        .collect()
}
