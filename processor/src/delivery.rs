//! When an input counts as done, and committing it.
//!
//! **At-least-once.** An input is done once every record sent for it (its outputs, or its
//! dead-letter copy) is acknowledged by the brokers. Acknowledgements arrive out of input
//! order (outputs land on different partitions), so the [`Tracker`] keeps, per input
//! partition, the inputs still in flight; the committable offset is the first one not done.
//! Offsets are committed every commit interval by a background thread (a commit waits for the
//! group coordinator, which must not stall the loop), and on the loop's own thread before a
//! partition is revoked and on stop after a flush. A crash loses no record: at worst the inputs
//! since the last commit are processed again.
//!
//! **Exactly-once.** Outputs and input offsets go into one Kafka transaction (KIP-98/447),
//! committed every commit interval, before a revocation and on stop. A crash aborts the open
//! transaction (the next instance with the same transactional id fences and aborts it, or the
//! broker times it out), and read_committed readers never see its records.
//!
//! Either way a graceful stop leaves the group's committed offsets exactly after the last
//! input whose outputs are durable, which is what the cutover hands to a successor.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use rdkafka::producer::BaseRecord;

use crate::config::DeliveryMode;
use crate::kafka::{ConsumerContext, OutputProducer, Refused, Sent, SentAs};
use crate::metrics::Metrics;
use crate::state::{PartitionChanges, Stores};

/// How long a flush, a commit or a transaction call may take.
pub const KAFKA_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What an at-least-once processor logs when the group refused the commit before a
/// revocation.
pub const REFUSED_REVOCATION_COMMIT: &str = "the commit before revocation was refused: what was done on the revoked partitions since the last commit is processed again by their next owner";

/// What an at-least-once processor logs when its final commit could not be made, with the
/// input ranges done and not committed (`uncommitted`): their next owner processes them again.
pub const UNCOMMITTED_AT_STOP: &str = "the final commit could not be made: what was done since the last commit is processed again by the partitions' next owner";

/// How long to wait before committing again while the group rebalances.
const REBALANCE_RETRY: Duration = Duration::from_millis(100);

/// Transactions aborted in a row (each followed by processing its records again) before the
/// processor gives up: the cause is then not a record but the brokers.
const MAX_ABORTS_IN_A_ROW: u32 = 5;

/// The inputs in flight per input partition, the records the brokers refused, and the first
/// failure seen by a callback.
#[derive(Debug, Default)]
pub struct Tracker {
    partitions: Vec<PartitionTrack>,
    refused: Vec<Refused>,
    failure: Option<String>,
}

#[derive(Debug)]
struct PartitionTrack {
    topic: String,
    partition: i32,
    /// (offset, sends not yet acknowledged), in offset order.
    pending: VecDeque<(i64, u32)>,
    /// The offset to commit: one past the last input done with all before it done.
    done_until: Option<i64>,
    committed: Option<i64>,
    /// The first and last input handled since the partition was assigned.
    handled: Option<(i64, i64)>,
    /// A stateful step's inputs up to here are in the changelog: their reservations
    /// ([`Tracker::release`]) are gone.
    released: Option<i64>,
}

impl Tracker {
    /// A small number standing for an input partition, carried in delivery callbacks.
    pub fn slot(&mut self, topic: &str, partition: i32) -> usize {
        // A linear scan: a step has few input partitions, and it allocates nothing per record.
        if let Some(slot) = self
            .partitions
            .iter()
            .position(|t| t.partition == partition && t.topic == topic)
        {
            return slot;
        }
        let slot = self.partitions.len();
        self.partitions.push(PartitionTrack {
            topic: topic.to_owned(),
            partition,
            pending: VecDeque::new(),
            done_until: None,
            committed: None,
            handled: None,
            released: None,
        });
        slot
    }

    /// The slot of `topic`/`partition` if it has one.
    pub fn slot_of(&self, topic: &str, partition: i32) -> Option<usize> {
        self.partitions
            .iter()
            .position(|t| t.partition == partition && t.topic == topic)
    }

    /// A stateful step's changelog holds the effect of the inputs up to `offset`: each of
    /// them handled since the last release gives up the one send it reserved for that
    /// ([`Committer::handled`]), so its offset can be committed.
    pub fn release(&mut self, slot: usize, offset: i64) {
        let Some(track) = self.partitions.get_mut(slot) else {
            return;
        };
        let from = track.released;
        for (at, left) in track.pending.iter_mut() {
            if *at > offset {
                break;
            }
            if from.is_none_or(|released| *at > released) {
                *left = left.saturating_sub(1);
            }
        }
        track.released = Some(from.map_or(offset, |released| released.max(offset)));
        track.advance();
    }

    /// An input was handled and `sends` records were sent for it.
    pub fn handled(&mut self, slot: usize, offset: i64, sends: u32) {
        if let Some(track) = self.partitions.get_mut(slot) {
            track.pending.push_back((offset, sends));
            let first = track.handled.map_or(offset, |(first, _)| first);
            track.handled = Some((first, offset));
            track.advance();
        }
    }

    /// The inputs of `topic`/`partition` handled and not committed since it was assigned:
    /// `[from, until)`, which its next owner processes again when this one cannot commit.
    pub fn uncommitted(&self, topic: &str, partition: i32) -> Option<(i64, i64)> {
        let track = self
            .partitions
            .iter()
            .find(|t| t.partition == partition && t.topic == topic)?;
        let (first, last) = track.handled?;
        let from = track.committed.unwrap_or(first);
        (from <= last).then_some((from, last + 1))
    }

    /// Every partition's inputs handled and not committed, as `topic/partition:from..until`
    /// separated by spaces (how [`REFUSED_REVOCATION_COMMIT`] and [`UNCOMMITTED_AT_STOP`]
    /// name them).
    pub fn uncommitted_ranges(&self) -> String {
        self.partitions
            .iter()
            .filter_map(|t| {
                let (from, until) = self.uncommitted(&t.topic, t.partition)?;
                Some(format!("{}/{}:{from}..{until}", t.topic, t.partition))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One record sent for the input at `offset` was acknowledged.
    pub fn acknowledged(&mut self, slot: usize, offset: i64) {
        let Some(track) = self.partitions.get_mut(slot) else {
            return;
        };
        if let Ok(at) = track.pending.binary_search_by_key(&offset, |(o, _)| *o)
            && let Some((_, left)) = track.pending.get_mut(at)
        {
            *left = left.saturating_sub(1);
            track.advance();
        }
    }

    pub fn fail(&mut self, why: String) {
        self.failure.get_or_insert(why);
    }

    /// The topic and partition of `slot`.
    pub fn partition_of(&self, slot: usize) -> Option<(&str, i32)> {
        self.partitions
            .get(slot)
            .map(|t| (t.topic.as_str(), t.partition))
    }

    /// The brokers refused a record sent for an input; it stays in flight.
    pub fn refuse(&mut self, refused: Refused) {
        self.refused.push(refused);
    }

    pub fn take_refused(&mut self) -> Vec<Refused> {
        std::mem::take(&mut self.refused)
    }

    pub fn has_refused(&self) -> bool {
        !self.refused.is_empty()
    }

    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Records sent and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.partitions
            .iter()
            .flat_map(|t| t.pending.iter())
            .map(|(_, left)| u64::from(*left))
            .sum()
    }

    /// Offsets that moved since the last commit: (topic, partition, offset to commit).
    pub fn committable(&self) -> Vec<(String, i32, i64)> {
        self.partitions
            .iter()
            .filter_map(|t| match t.done_until {
                Some(offset) if t.committed.is_none_or(|c| c < offset) => {
                    Some((t.topic.clone(), t.partition, offset))
                }
                _ => None,
            })
            .collect()
    }

    pub fn committed(&mut self, offsets: &[(String, i32, i64)]) {
        for (topic, partition, offset) in offsets {
            if let Some(track) = self.find(topic, *partition) {
                track.committed = Some(*offset);
            }
        }
    }

    /// The partition was revoked: its remaining state belongs to its next owner.
    pub fn forget(&mut self, topic: &str, partition: i32) {
        if let Some(track) = self.find(topic, partition) {
            track.pending.clear();
            track.done_until = None;
            track.committed = None;
            track.handled = None;
            track.released = None;
        }
    }
}

impl Tracker {
    fn find(&mut self, topic: &str, partition: i32) -> Option<&mut PartitionTrack> {
        self.partitions
            .iter_mut()
            .find(|t| t.partition == partition && t.topic == topic)
    }
}

impl PartitionTrack {
    fn advance(&mut self) {
        while let Some((offset, 0)) = self.pending.front() {
            self.done_until = Some(offset + 1);
            self.pending.pop_front();
        }
    }
}

/// The records and offsets of the open transaction.
#[derive(Debug, Default)]
struct Transaction {
    open: bool,
    /// The input partitions with records in it: a linear scan, as in the tracker, allocates
    /// nothing per record.
    partitions: Vec<InTransaction>,
    opened_at: Option<Instant>,
}

#[derive(Debug)]
struct InTransaction {
    topic: String,
    partition: i32,
    /// Where its records in the transaction start: an abort rewinds the partition there.
    first: i64,
    /// The offset to commit.
    next: i64,
}

/// State shared with the Kafka callbacks.
pub struct Books {
    pub tracker: Mutex<Tracker>,
    pub metrics: Metrics,
}

impl Books {
    pub fn new(metrics: Metrics) -> Self {
        Books {
            tracker: Mutex::new(Tracker::default()),
            metrics,
        }
    }

    pub fn tracker(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("committing offsets failed: {0}")]
    Commit(#[source] KafkaError),
    #[error("the transaction could not {step}: {source}")]
    Transaction {
        step: &'static str,
        #[source]
        source: KafkaError,
    },
    /// What the delivery callbacks or a rebalance recorded (the message says which).
    #[error("{0}")]
    Failed(String),
    #[error("the consumer has no group metadata for the transaction")]
    NoGroupMetadata,
    #[error("{MAX_ABORTS_IN_A_ROW} transactions in a row had to be aborted; the last: {0}")]
    Aborts(String),
    #[error("cannot send the state's changes to the changelog {topic}: {source}")]
    Changelog {
        topic: String,
        #[source]
        source: KafkaError,
    },
}

impl Error {
    /// The transaction failed in a way that aborting it and processing its records again
    /// can cure (a record the brokers refused, a transient broker error).
    pub fn requires_abort(&self) -> bool {
        matches!(self, Error::Transaction { source: KafkaError::Transaction(e), .. } if e.txn_requires_abort())
    }
}

/// Commits inputs as done, in the chosen mode. Called from the processing loop, from the
/// consumer's rebalance callback (inside `poll`, so never at once with the loop) and, for
/// at-least-once, from the background commit thread ([`Committer::run_background_commits`]).
pub struct Committer {
    mode: DeliveryMode,
    producer: Arc<OutputProducer>,
    books: Arc<Books>,
    interval: Duration,
    /// How long a revocation's commit is tried while the coordinator says the group
    /// rebalances: a member inside its revocation callback has not rejoined, and a
    /// coordinator that refuses commits until every member rejoined (librdkafka's mock)
    /// would drop it from the group if it kept trying.
    revocation_patience: Duration,
    transaction: Mutex<Transaction>,
    last_commit: Mutex<Instant>,
    /// Held from reading the offsets off the books until the commit is answered (and, on a
    /// revocation, until the partitions are forgotten): commits never interleave, so a
    /// background commit can never move offsets back behind a revocation's.
    committing: Mutex<()>,
    background: Mutex<BackgroundCommits>,
    background_wake: Condvar,
    /// A commit away from the loop's thread found the transaction abortable: the loop aborts
    /// it and rewinds ([`Committer::recover`]) before it sends anything else.
    needs_recovery: AtomicBool,
    aborts_in_a_row: AtomicU32,
    /// A stateful step's state: every commit writes what changed of it to the changelog
    /// first ([`Committer::write_state`]).
    stores: Option<Arc<Stores>>,
}

#[derive(Debug, Default)]
struct BackgroundCommits {
    requested: bool,
    closed: bool,
}

pub type Consumer = BaseConsumer<ConsumerContext>;

impl Committer {
    pub fn new(
        mode: DeliveryMode,
        producer: Arc<OutputProducer>,
        books: Arc<Books>,
        interval: Duration,
        session_timeout: Duration,
    ) -> Self {
        Committer {
            mode,
            producer,
            books,
            interval,
            revocation_patience: (session_timeout / 3).min(KAFKA_CALL_TIMEOUT),
            transaction: Mutex::new(Transaction::default()),
            last_commit: Mutex::new(Instant::now()),
            committing: Mutex::new(()),
            background: Mutex::new(BackgroundCommits::default()),
            background_wake: Condvar::new(),
            needs_recovery: AtomicBool::new(false),
            aborts_in_a_row: AtomicU32::new(0),
            stores: None,
        }
    }

    /// Makes every commit write `stores`' changes to its changelog first.
    pub fn with_state(mut self, stores: Arc<Stores>) -> Self {
        self.stores = Some(stores);
        self
    }

    pub fn mode(&self) -> DeliveryMode {
        self.mode
    }

    fn committing(&self) -> MutexGuard<'_, ()> {
        self.committing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn background(&self) -> MutexGuard<'_, BackgroundCommits> {
        self.background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The at-least-once background commit thread: commits what is done whenever the loop
    /// asks, until [`Committer::close_background`]. A failed commit is logged, counted and
    /// retried at the next interval; the commit on stop or revocation covers it anyway.
    pub fn run_background_commits(&self, consumer: &Consumer) {
        loop {
            {
                let mut state = self.background();
                while !state.requested && !state.closed {
                    state = self
                        .background_wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if state.closed {
                    return;
                }
                state.requested = false;
            }
            if let Err(error) = self.commit_offsets(consumer, &self.committing(), Instant::now()) {
                self.books.metrics.commit_failures.inc();
                tracing::warn!(%error, "offset commit failed; retrying at the next interval");
            }
        }
    }

    /// Ends [`Committer::run_background_commits`] (it finishes a commit under way first).
    pub fn close_background(&self) {
        self.background().closed = true;
        self.background_wake.notify_all();
    }

    fn transaction(&self) -> MutexGuard<'_, Transaction> {
        self.transaction
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Before sending anything for an input: exactly-once opens a transaction if none is open.
    pub fn begin(&self) -> Result<(), Error> {
        if self.mode == DeliveryMode::ExactlyOnce {
            let mut transaction = self.transaction();
            if !transaction.open {
                self.producer
                    .begin_transaction()
                    .map_err(|source| Error::Transaction {
                        step: "begin",
                        source,
                    })?;
                transaction.open = true;
                transaction.opened_at = Some(Instant::now());
            }
        }
        Ok(())
    }

    /// After sending `sends` records for the input at `offset` of `slot`. At least once, a
    /// stateful step's input reserves one more send, given up when the changelog holds its
    /// effect ([`Tracker::release`]): its offset is not committed before its state is.
    pub fn handled(&self, topic: &str, partition: i32, slot: usize, offset: i64, sends: u32) {
        match self.mode {
            DeliveryMode::AtLeastOnce => {
                let reserved = u32::from(self.stores.is_some());
                self.books.tracker().handled(slot, offset, sends + reserved);
            }
            DeliveryMode::ExactlyOnce => {
                let mut transaction = self.transaction();
                let partitions = &mut transaction.partitions;
                match partitions
                    .iter_mut()
                    .find(|t| t.partition == partition && t.topic == topic)
                {
                    Some(booked) => booked.next = offset + 1,
                    None => partitions.push(InTransaction {
                        topic: topic.to_owned(),
                        partition,
                        first: offset,
                        next: offset + 1,
                    }),
                }
            }
        }
        if let Some(stores) = &self.stores {
            stores.settle();
        }
    }

    /// Whether a commit away from the loop's thread left the transaction to abort.
    pub fn needs_recovery(&self) -> bool {
        self.needs_recovery.load(Ordering::SeqCst)
    }

    /// From a thread other than the loop's: a failed commit that an abort can cure is left
    /// to the loop; any other failure stops it.
    pub fn commit_failed_elsewhere(&self, error: Error) {
        if error.requires_abort() {
            tracing::warn!(%error, "the transaction must be aborted; its records are processed again");
            self.needs_recovery.store(true, Ordering::SeqCst);
        } else {
            self.books.tracker().fail(error.to_string());
        }
    }

    /// Aborts the open transaction and rewinds its input partitions (and that of
    /// `in_hand`, the record the loop holds, which is dropped) to where the transaction
    /// started, so its records are processed again. Returns the records the brokers refused,
    /// whose inputs must be dead-lettered when they come again.
    pub fn recover(
        &self,
        consumer: &Consumer,
        why: &str,
        in_hand: Option<(&str, i32, i64)>,
    ) -> Result<Vec<(String, i32, Refused)>, Error> {
        let aborts = self.aborts_in_a_row.fetch_add(1, Ordering::SeqCst) + 1;
        if aborts > MAX_ABORTS_IN_A_ROW {
            return Err(Error::Aborts(why.to_owned()));
        }
        let mut transaction = self.transaction();
        tracing::warn!(
            error = why,
            partitions = transaction.partitions.len(),
            "aborting the transaction; its records are processed again"
        );
        // The abort waits for every delivery report, which only polling serves; they also
        // tell which records were refused.
        self.await_deliveries(KAFKA_CALL_TIMEOUT);
        self.producer
            .abort_transaction(KAFKA_CALL_TIMEOUT)
            .map_err(|source| Error::Transaction {
                step: "abort",
                source,
            })?;
        let mut rewinds: Vec<(String, i32, i64)> = transaction
            .partitions
            .iter()
            .map(|t| (t.topic.clone(), t.partition, t.first))
            .collect();
        if let Some((topic, partition, offset)) = in_hand
            && !rewinds
                .iter()
                .any(|(t, p, _)| *p == partition && t == topic)
        {
            rewinds.push((topic.to_owned(), partition, offset));
        }
        for (topic, partition, offset) in &rewinds {
            if let Err(error) = consumer.seek(
                topic,
                *partition,
                Offset::Offset(*offset),
                KAFKA_CALL_TIMEOUT,
            ) {
                // Revoked meanwhile: its next owner starts from the last commit anyway.
                tracing::warn!(%error, topic, partition, offset, "cannot rewind the partition");
            }
        }
        *transaction = Transaction::default();
        if let Some(stores) = &self.stores {
            // The state reflects the aborted records: restored again from what committed.
            stores.forget_all();
        }
        self.needs_recovery.store(false, Ordering::SeqCst);
        self.books.metrics.transaction_aborts.inc();
        let mut tracker = self.books.tracker();
        let refused = tracker.take_refused();
        Ok(refused
            .into_iter()
            .filter_map(|r| {
                let (topic, partition) = tracker.partition_of(r.slot)?;
                Some((topic.to_owned(), partition, r))
            })
            .collect())
    }

    /// Commits when the interval has passed: at-least-once asks the background thread,
    /// exactly-once commits the transaction here (it must not overlap the loop's sends).
    pub fn maybe_commit(&self, consumer: &Consumer) -> Result<(), Error> {
        if self.needs_recovery() {
            // The transaction is to be aborted, not committed: the loop does that next.
            return Ok(());
        }
        let due = {
            let mut last = self
                .last_commit
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let due = last.elapsed() >= self.interval;
            if due {
                *last = Instant::now();
            }
            due
        };
        if due {
            match self.mode {
                DeliveryMode::AtLeastOnce => {
                    self.write_state()?;
                    self.background().requested = true;
                    self.background_wake.notify_all();
                }
                DeliveryMode::ExactlyOnce => self.commit(consumer)?,
            }
        }
        Ok(())
    }

    /// Commits what is done now. At-least-once commits what is acknowledged (without waiting
    /// for the rest); exactly-once commits the open transaction.
    pub fn commit(&self, consumer: &Consumer) -> Result<(), Error> {
        self.commit_locked(
            consumer,
            &self.committing(),
            Instant::now() + KAFKA_CALL_TIMEOUT,
        )
    }

    /// `until`: how long an offset commit the coordinator answers with REBALANCE_IN_PROGRESS
    /// is tried again.
    fn commit_locked(
        &self,
        consumer: &Consumer,
        committing: &MutexGuard<'_, ()>,
        until: Instant,
    ) -> Result<(), Error> {
        *self
            .last_commit
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        if let Some(why) = self.books.tracker().failure() {
            return Err(Error::Failed(why.to_owned()));
        }
        match self.mode {
            DeliveryMode::AtLeastOnce => self.commit_offsets(consumer, committing, until),
            DeliveryMode::ExactlyOnce => self.commit_transaction(consumer),
        }
    }

    /// Commits the offsets done since the last commit; `_committing` proves the caller holds
    /// the commit lock.
    ///
    /// A coordinator refuses commits with REBALANCE_IN_PROGRESS between a rebalance's
    /// JoinGroup and SyncGroup (Kafka; librdkafka's mock for the whole rebalance): it takes
    /// them again once the group has its new generation, which librdkafka joins by itself.
    /// The cooperative protocol rebalances in two rounds and each member rejoins, so a stop
    /// often comes in such a moment; its commit is tried again until `until`, or its records
    /// would be processed twice. A periodic commit passes `until` now: the next covers it.
    fn commit_offsets(
        &self,
        consumer: &Consumer,
        _committing: &MutexGuard<'_, ()>,
        until: Instant,
    ) -> Result<(), Error> {
        let due = self.books.tracker().committable();
        if due.is_empty() {
            return Ok(());
        }
        let mut offsets = TopicPartitionList::with_capacity(due.len());
        for (topic, partition, offset) in &due {
            offsets
                .add_partition_offset(topic, *partition, Offset::Offset(*offset))
                .map_err(Error::Commit)?;
        }
        let started = Instant::now();
        loop {
            match consumer.commit(&offsets, CommitMode::Sync) {
                Ok(()) => break,
                Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::RebalanceInProgress))
                    if Instant::now() + REBALANCE_RETRY < until =>
                {
                    tracing::debug!("the group is rebalancing; committing again");
                    std::thread::sleep(REBALANCE_RETRY);
                }
                Err(error) => return Err(Error::Commit(error)),
            }
        }
        self.books
            .metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        self.books.metrics.commits.inc();
        self.books.tracker().committed(&due);
        tracing::debug!(partitions = due.len(), "offsets committed");
        Ok(())
    }

    fn commit_transaction(&self, consumer: &Consumer) -> Result<(), Error> {
        let mut transaction = self.transaction();
        if !transaction.open {
            return Ok(());
        }
        let started = Instant::now();
        tracing::debug!(
            partitions = transaction.partitions.len(),
            "committing transaction"
        );
        if let Some(stores) = &self.stores {
            // The state's changes commit with the records and offsets that made them. A
            // record in hand (a commit from the overseer) reflected in the state but not in
            // the transaction puts the commit off: the transaction stays open.
            let Some(all) = stores.take_changes() else {
                tracing::debug!("a record is in hand; the transaction is committed after it");
                return Ok(());
            };
            for changes in &all {
                self.send_changes(stores.changelog(), changes)?;
            }
        }
        if !transaction.partitions.is_empty() {
            let mut offsets = TopicPartitionList::with_capacity(transaction.partitions.len());
            for booked in &transaction.partitions {
                offsets
                    .add_partition_offset(
                        &booked.topic,
                        booked.partition,
                        Offset::Offset(booked.next),
                    )
                    .map_err(|source| Error::Transaction {
                        step: "add offsets",
                        source,
                    })?;
            }
            let metadata = consumer.group_metadata().ok_or(Error::NoGroupMetadata)?;
            self.producer
                .send_offsets_to_transaction(&offsets, &metadata, KAFKA_CALL_TIMEOUT)
                .map_err(|source| Error::Transaction {
                    step: "send offsets",
                    source,
                })?;
        }
        self.await_deliveries(KAFKA_CALL_TIMEOUT);
        self.producer
            .commit_transaction(KAFKA_CALL_TIMEOUT)
            .map_err(|source| Error::Transaction {
                step: "commit",
                source,
            })?;
        let metrics = &self.books.metrics;
        if let Some(opened_at) = transaction.opened_at {
            metrics
                .transaction_open_seconds
                .observe(opened_at.elapsed().as_secs_f64());
        }
        *transaction = Transaction::default();
        self.aborts_in_a_row.store(0, Ordering::SeqCst);
        metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        metrics.commits.inc();
        Ok(())
    }

    /// Serves delivery reports until nothing is in flight or `timeout` passes. rdkafka's own
    /// flush (also inside `commit_transaction`) polls in 100 ms slices whatever arrives, which
    /// would put a floor of 100 ms under every transaction.
    fn await_deliveries(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.producer.in_flight_count() > 0 && Instant::now() < deadline {
            self.producer.poll(Duration::from_millis(1));
        }
    }

    /// Graceful end: wait for what is in flight (until `until` at most), then commit it.
    pub fn finish(&self, consumer: &Consumer, until: Instant) -> Result<(), Error> {
        self.finish_locked(consumer, &self.committing(), until)
    }

    fn finish_locked(
        &self,
        consumer: &Consumer,
        committing: &MutexGuard<'_, ()>,
        until: Instant,
    ) -> Result<(), Error> {
        if self.mode == DeliveryMode::AtLeastOnce {
            self.await_deliveries(until.saturating_duration_since(Instant::now()));
            self.write_state()?;
            let in_flight = self.books.tracker().in_flight();
            if in_flight > 0 {
                // Unacknowledged inputs stay uncommitted: processed again by the next owner.
                tracing::warn!(in_flight, "deliveries still pending on stop");
            }
        }
        self.commit_locked(consumer, committing, until)
    }

    /// After a fatal error: commit what is certainly done (at-least-once) or abort the open
    /// transaction so downstream read_committed readers are not held up.
    pub fn fail(&self, consumer: &Consumer) {
        match self.mode {
            DeliveryMode::AtLeastOnce => {
                self.await_deliveries(KAFKA_CALL_TIMEOUT);
                let until = Instant::now() + KAFKA_CALL_TIMEOUT;
                if let Err(error) = self.commit_offsets(consumer, &self.committing(), until) {
                    tracing::warn!(%error, "commit after failure failed");
                }
            }
            DeliveryMode::ExactlyOnce => {
                let mut transaction = self.transaction();
                if transaction.open {
                    self.await_deliveries(KAFKA_CALL_TIMEOUT);
                    if let Err(error) = self.producer.abort_transaction(KAFKA_CALL_TIMEOUT) {
                        tracing::warn!(%error, "abort after failure failed");
                    }
                    *transaction = Transaction::default();
                }
            }
        }
    }

    /// Partitions are being taken away: everything done on them is committed first, so their
    /// next owner starts right after it. Under the cooperative protocol these are only the
    /// partitions that change owner; the commit covers every partition anyway (it is one
    /// call, and the records of the kept ones are as done), and the loop goes on with the
    /// kept ones. It runs inside the loop's poll, between two records, so it covers whole
    /// records.
    ///
    /// `lost`: the group gave them to other members already (this one missed its session or
    /// its generation). Their offsets cannot be committed any more (the coordinator refuses
    /// a stale generation), and their next owner starts from the last commit: at-least-once
    /// forgets them; exactly-once aborts the open transaction, whose records of those
    /// partitions their next owner processes again, and rewinds the partitions it keeps.
    pub fn revoke(&self, consumer: &Consumer, partitions: &TopicPartitionList, lost: bool) {
        let committing = self.committing();
        let until = Instant::now() + self.revocation_patience;
        let result = match (self.mode, lost) {
            (DeliveryMode::AtLeastOnce, false) => self.finish_locked(consumer, &committing, until),
            (DeliveryMode::ExactlyOnce, false) => self.commit_locked(consumer, &committing, until),
            (DeliveryMode::AtLeastOnce, true) => {
                tracing::warn!(
                    partitions = partitions.count(),
                    "partitions lost: what was done on them since the last commit is processed again by their next owner"
                );
                Ok(())
            }
            (DeliveryMode::ExactlyOnce, true) => {
                if self.transaction().open {
                    tracing::warn!(
                        partitions = partitions.count(),
                        "partitions lost: the open transaction is aborted, their next owner processes its records again"
                    );
                    self.needs_recovery.store(true, Ordering::SeqCst);
                }
                Ok(())
            }
        };
        match result {
            Ok(()) => {}
            // The revoked partitions' next owner starts from the last commit; the loop
            // aborts the transaction and rewinds the partitions it keeps.
            Err(error) if error.requires_abort() => self.commit_failed_elsewhere(error),
            // At-least-once allows what a refused commit leaves: the next owner starts from
            // the last commit. Stopping the processor would only move every partition.
            Err(Error::Commit(error)) if self.mode == DeliveryMode::AtLeastOnce => {
                let tracker = self.books.tracker();
                let uncommitted: Vec<String> = partitions
                    .elements()
                    .iter()
                    .filter_map(|element| {
                        let (from, until) =
                            tracker.uncommitted(element.topic(), element.partition())?;
                        Some(format!(
                            "{}/{}:{from}..{until}",
                            element.topic(),
                            element.partition()
                        ))
                    })
                    .collect();
                tracing::warn!(
                    %error,
                    uncommitted = uncommitted.join(" "),
                    "{REFUSED_REVOCATION_COMMIT}"
                );
            }
            Err(error) => {
                tracing::error!(%error, "commit before revocation failed");
                self.books
                    .tracker()
                    .fail(format!("commit before revocation failed: {error}"));
            }
        }
        let mut tracker = self.books.tracker();
        for element in partitions.elements() {
            tracker.forget(element.topic(), element.partition());
            if let Some(stores) = &self.stores {
                stores.forget(element.topic(), element.partition());
            }
        }
    }

    /// At least once: writes what changed of the state to the changelog, once every output
    /// sent so far is acknowledged (a changelog entry says its records' outputs are on the
    /// brokers: a restore skips those records), and releases the inputs it covers for
    /// commit. Outputs still unacknowledged, or refused records whose dead letters are still
    /// to be sent, put it off to the next commit. Entries not acknowledged within
    /// [`STATE_WRITE_TIMEOUT`] fail the processor: the changes are taken, and the offsets
    /// they cover must not be committed.
    fn write_state(&self) -> Result<(), Error> {
        let Some(stores) = &self.stores else {
            return Ok(());
        };
        if self.mode != DeliveryMode::AtLeastOnce {
            return Ok(());
        }
        self.await_deliveries(STATE_WRITE_TIMEOUT);
        if self.producer.in_flight_count() > 0 || self.books.tracker().has_refused() {
            tracing::debug!("outputs still in flight; the state is written at the next commit");
            return Ok(());
        }
        let Some(all) = stores.take_changes() else {
            tracing::debug!("a record is in hand; the state is written at the next commit");
            return Ok(());
        };
        for changes in &all {
            self.send_changes(stores.changelog(), changes)?;
        }
        self.await_deliveries(STATE_WRITE_TIMEOUT);
        if let Some(why) = self.books.tracker().failure() {
            return Err(Error::Failed(why.to_owned()));
        }
        if self.producer.in_flight_count() > 0 {
            return Err(Error::Failed(format!(
                "the changelog {} did not acknowledge the state's changes within {} s; \
                 the inputs since the last commit are processed again by the next owner",
                stores.changelog(),
                STATE_WRITE_TIMEOUT.as_secs()
            )));
        }
        let mut tracker = self.books.tracker();
        for changes in &all {
            if let (Some(slot), Some(reflects)) = (
                tracker.slot_of(&changes.topic, changes.partition),
                changes.reflects,
            ) {
                tracker.release(slot, reflects);
            }
        }
        Ok(())
    }

    /// Sends one partition's changelog entries to the changelog's partition of its number.
    fn send_changes(&self, changelog: &str, changes: &PartitionChanges) -> Result<(), Error> {
        for (key, value) in &changes.changes {
            let sent = Box::new(Sent {
                slot: usize::MAX,
                offset: changes.reflects.unwrap_or(-1),
                copy: SentAs::Changelog,
            });
            let mut record = BaseRecord::with_opaque_to(changelog, sent)
                .partition(changes.partition)
                .key(&key[..]);
            if let Some(value) = value {
                record = record.payload(&value[..]);
            }
            let deadline = Instant::now() + STATE_WRITE_TIMEOUT;
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                        if Instant::now() < deadline =>
                    {
                        record = back;
                        self.producer.poll(Duration::from_millis(10));
                    }
                    Err((source, _)) => {
                        return Err(Error::Changelog {
                            topic: changelog.to_owned(),
                            source,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// How long the changelog may take to acknowledge the state's changes at a commit.
const STATE_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    /// A stateful step's input reserves one send for the changelog: its offset is
    /// committable only once a changelog write covering it released it, and a later
    /// release does not take a second send from inputs released before.
    #[test]
    fn a_stateful_input_waits_for_the_changelog_write_that_covers_it() {
        let mut tracker = Tracker::default();
        let p0 = tracker.slot("in", 0);
        tracker.handled(p0, 0, 1 + 1);
        tracker.handled(p0, 1, 1);
        tracker.acknowledged(p0, 0);
        assert!(tracker.committable().is_empty(), "its state is not written");
        tracker.release(p0, 0);
        assert_eq!(tracker.committable(), [("in".to_owned(), 0, 1)]);
        tracker.handled(p0, 2, 2 + 1);
        tracker.release(p0, 1);
        assert_eq!(tracker.committable(), [("in".to_owned(), 0, 2)]);
        tracker.release(p0, 2);
        assert_eq!(
            tracker.committable(),
            [("in".to_owned(), 0, 2)],
            "offset 2's outputs are in flight"
        );
        tracker.acknowledged(p0, 2);
        tracker.acknowledged(p0, 2);
        assert_eq!(tracker.committable(), [("in".to_owned(), 0, 3)]);
        assert_eq!(tracker.slot_of("in", 0), Some(p0));
        assert_eq!(tracker.slot_of("in", 1), None);
    }

    /// What a failed final commit leaves to the next owner, as the logs name it.
    #[test]
    fn uncommitted_ranges_name_each_partition_since_its_last_commit() {
        let mut tracker = Tracker::default();
        let p0 = tracker.slot("in", 0);
        let p1 = tracker.slot("in", 1);
        tracker.handled(p0, 5, 0);
        tracker.handled(p0, 6, 0);
        tracker.committed(&[("in".to_owned(), 0, 6)]);
        tracker.handled(p1, 9, 1);
        assert_eq!(tracker.uncommitted_ranges(), "in/0:6..7 in/1:9..10");
    }

    #[test]
    fn commit_waits_for_the_oldest_input_in_flight() {
        let mut tracker = Tracker::default();
        let p0 = tracker.slot("in", 0);
        tracker.handled(p0, 10, 2);
        tracker.handled(p0, 11, 0); // filtered: done at once, but behind offset 10
        tracker.handled(p0, 12, 1);
        assert!(tracker.committable().is_empty());
        tracker.acknowledged(p0, 12);
        tracker.acknowledged(p0, 10);
        assert!(
            tracker.committable().is_empty(),
            "offset 10 still has one send in flight"
        );
        tracker.acknowledged(p0, 10);
        assert_eq!(tracker.committable(), vec![("in".to_owned(), 0, 13)]);
        assert_eq!(tracker.in_flight(), 0);
    }

    #[test]
    fn uncommitted_inputs_run_from_the_last_commit_or_the_first_handled() {
        let mut tracker = Tracker::default();
        let p0 = tracker.slot("in", 0);
        assert_eq!(tracker.uncommitted("in", 0), None);
        tracker.handled(p0, 40, 1);
        tracker.handled(p0, 41, 1);
        assert_eq!(tracker.uncommitted("in", 0), Some((40, 42)));
        tracker.acknowledged(p0, 40);
        let due = tracker.committable();
        tracker.committed(&due);
        tracker.handled(p0, 42, 0);
        assert_eq!(tracker.uncommitted("in", 0), Some((41, 43)));
        tracker.forget("in", 0);
        assert_eq!(tracker.uncommitted("in", 0), None);
        assert_eq!(tracker.uncommitted("other", 0), None);
    }

    #[test]
    fn partitions_are_independent_and_commits_are_not_repeated() {
        let mut tracker = Tracker::default();
        let p0 = tracker.slot("in", 0);
        let p1 = tracker.slot("in", 1);
        assert_eq!(tracker.slot("in", 0), p0);
        tracker.handled(p0, 0, 1);
        tracker.handled(p1, 5, 1);
        tracker.acknowledged(p1, 5);
        let due = tracker.committable();
        assert_eq!(due, vec![("in".to_owned(), 1, 6)]);
        tracker.committed(&due);
        assert!(tracker.committable().is_empty());
    }

    #[test]
    fn revoked_partitions_ignore_late_acknowledgements() {
        let mut tracker = Tracker::default();
        let p0 = tracker.slot("in", 0);
        tracker.handled(p0, 3, 1);
        tracker.forget("in", 0);
        tracker.acknowledged(p0, 3);
        assert!(tracker.committable().is_empty());
        tracker.handled(p0, 8, 0);
        assert_eq!(tracker.committable(), vec![("in".to_owned(), 0, 9)]);
    }

    #[test]
    fn the_first_failure_is_kept() {
        let mut tracker = Tracker::default();
        tracker.fail("first".into());
        tracker.fail("second".into());
        assert_eq!(tracker.failure(), Some("first"));
    }
}
