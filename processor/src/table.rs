//! The table of a stream–table join (`--table STEP=TOPIC`, `docs/stateful-sql.md`).
//!
//! Every instance reads the table's topic whole, outside the consumer group (a stream
//! partition may name any key of the table), to its end before the instance joins the group,
//! then keeps reading it on a thread of its own: a stream record is joined to the table as
//! it stands when the record is processed. The topic is the table's only copy, so a restart
//! or a new life reads it again; nothing is committed for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plumber_sql::{Join, Table};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::TableConfig;
use crate::reader::{Reader, ReaderContext, to_the_end};
use crate::state::RESTORE_TIMEOUT;
use crate::stop::Stop;

/// Why the table cannot be read or kept: the processor stops (and is restarted).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TableError {
    #[error("cannot read the table topic `{topic}`: {reason}")]
    Read { topic: String, reason: String },
    #[error("the table topic `{topic}` does not exist; create it, or name another table")]
    Missing { topic: String },
    #[error(
        "the table `{topic}` takes more than --table-max-bytes ({max} bytes) at {rows} rows; \
         raise `tableMaxBytes` in the step file (and the step's memory), or join a smaller table"
    )]
    TooLarge {
        topic: String,
        rows: usize,
        max: usize,
    },
    #[error(
        "the table topic `{topic}` was not read to its end within {} s ({records} records read); is the broker reachable?",
        timeout.as_secs()
    )]
    Timeout {
        topic: String,
        records: u64,
        timeout: Duration,
    },
}

/// How long one poll waits: bounds how late a stop or a timeout is noticed.
const POLL: Duration = Duration::from_millis(100);

/// How often a load under way says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What a table reports: its gauges (the processor's `plumber_processor_table_*`), and the
/// liveness beat a load keeps up.
#[derive(Clone)]
pub struct Gauges {
    pub rows: Gauge,
    pub bytes: Gauge,
    pub loading: Gauge,
    pub skipped: Counter,
    pub beat: Arc<dyn Fn() + Send + Sync>,
}

/// What takes a table record into the table: shared by the load and the thread that keeps
/// reading.
#[derive(Clone)]
struct Keeper {
    topic: String,
    max_bytes: usize,
    /// Parses a table record into a row (the join's own rules).
    join: Join,
    metrics: Gauges,
    table: Arc<RwLock<Table>>,
}

/// A join's table, loaded and kept current.
pub struct TableFeed {
    keeper: Keeper,
    client: ClientConfig,
    /// Set by the reading thread when the table can no longer be kept.
    failed: Arc<Mutex<Option<TableError>>>,
    closing: Arc<AtomicBool>,
    tail: Mutex<Option<JoinHandle<()>>>,
}

impl TableFeed {
    /// `client` holds the connection settings; its `group.id` names no group this reader
    /// joins or commits to.
    pub fn new(config: &TableConfig, client: ClientConfig, join: Join, metrics: Gauges) -> Self {
        TableFeed {
            keeper: Keeper {
                topic: config.topic.clone(),
                max_bytes: config.max_bytes,
                join,
                metrics,
                table: Arc::default(),
            },
            client,
            failed: Arc::default(),
            closing: Arc::default(),
            tail: Mutex::default(),
        }
    }

    /// Reads the table's topic to its end, then keeps reading it on a thread. False when a
    /// stop came first.
    pub fn load(&self, stop: &Stop) -> Result<bool, TableError> {
        let keeper = &self.keeper;
        let read_error = |e: KafkaError| TableError::Read {
            topic: keeper.topic.clone(),
            reason: e.to_string(),
        };
        let mut client = self.client.clone();
        let consumer: Reader = to_the_end(&mut client)
            .create_with_context(ReaderContext)
            .map_err(read_error)?;
        let metadata = consumer
            .fetch_metadata(
                Some(&keeper.topic),
                RESTORE_TIMEOUT.min(Duration::from_secs(30)),
            )
            .map_err(read_error)?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == keeper.topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(TableError::Missing {
                topic: keeper.topic.clone(),
            });
        }
        let mut assignment = TopicPartitionList::new();
        for partition in &partitions {
            assignment
                .add_partition_offset(&keeper.topic, *partition, Offset::Beginning)
                .map_err(read_error)?;
        }
        consumer.assign(&assignment).map_err(read_error)?;
        tracing::info!(topic = %keeper.topic, partitions = partitions.len(), "loading the join's table");
        let started = Instant::now();
        let mut ended: Vec<i32> = Vec::new();
        let mut records: u64 = 0;
        let mut next_progress = started + PROGRESS_EVERY;
        while ended.len() < partitions.len() {
            if stop.requested() {
                return Ok(false);
            }
            let now = Instant::now();
            if now >= started + RESTORE_TIMEOUT {
                return Err(TableError::Timeout {
                    topic: keeper.topic.clone(),
                    records,
                    timeout: RESTORE_TIMEOUT,
                });
            }
            if now >= next_progress {
                tracing::info!(topic = %keeper.topic, records, rows = keeper.rows(), partitions_read = ended.len(), "loading the join's table");
                next_progress = now + PROGRESS_EVERY;
            }
            // Loading is the processor's work now: its health page must not call it stuck.
            (keeper.metrics.beat)();
            match consumer.poll(POLL) {
                Some(Ok(message)) => {
                    records += 1;
                    keeper
                        .metrics
                        .loading
                        .set(i64::try_from(records).unwrap_or(i64::MAX));
                    keeper.take(&message)?;
                }
                Some(Err(KafkaError::PartitionEOF(partition))) if !ended.contains(&partition) => {
                    ended.push(partition);
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                // Transient (a broker restarting): polled again until the timeout.
                Some(Err(error)) => {
                    tracing::debug!(%error, topic = %keeper.topic, "reading the table")
                }
                None => {}
            }
        }
        keeper.metrics.loading.set(0);
        tracing::info!(
            topic = %keeper.topic,
            records,
            rows = keeper.rows(),
            bytes = keeper.bytes(),
            seconds = started.elapsed().as_secs_f64(),
            "the join's table is loaded"
        );
        self.keep_reading(consumer);
        Ok(true)
    }

    /// Runs `f` on the table as it stands; `Err` once the table can no longer be kept.
    pub fn with<R>(&self, f: impl FnOnce(&Table) -> R) -> Result<R, TableError> {
        if let Some(error) = self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Err(error);
        }
        Ok(f(&self.keeper.read()))
    }

    fn keep_reading(&self, consumer: Reader) {
        let keeper = self.keeper.clone();
        let failed = self.failed.clone();
        let closing = self.closing.clone();
        let spawned = std::thread::Builder::new()
            .name("table".into())
            .spawn(move || {
                while !closing.load(Ordering::Relaxed) {
                    match consumer.poll(POLL) {
                        Some(Ok(message)) => {
                            if let Err(error) = keeper.take(&message) {
                                tracing::error!(%error, "the join's table can no longer be kept");
                                *failed.lock().unwrap_or_else(PoisonError::into_inner) =
                                    Some(error);
                                return;
                            }
                        }
                        Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                        Some(Err(error)) => {
                            tracing::debug!(%error, topic = %keeper.topic, "reading the table")
                        }
                    }
                }
            });
        match spawned {
            Ok(handle) => {
                *self.tail.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
            }
            Err(error) => {
                *self.failed.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(TableError::Read {
                        topic: self.keeper.topic.clone(),
                        reason: format!("no thread to keep reading it: {error}"),
                    });
            }
        }
    }
}

impl Drop for TableFeed {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        if let Some(handle) = self
            .tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            // It notices within one poll.
            let _ = handle.join();
        }
    }
}

impl Keeper {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn rows(&self) -> usize {
        self.read().len()
    }

    fn bytes(&self) -> usize {
        self.read().bytes()
    }

    /// Takes one record of the table's topic. A record that is no row (no key, not a JSON
    /// object) is skipped and counted: every instance reads every table record, at every
    /// start, so a dead letter would be written many times over.
    fn take(&self, message: &BorrowedMessage<'_>) -> Result<(), TableError> {
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if let Err(error) = self
            .join
            .update_table(&mut table, message.key(), message.payload())
        {
            self.metrics.skipped.inc();
            tracing::warn!(
                topic = %self.topic,
                partition = message.partition(),
                offset = message.offset(),
                reason = %error.message,
                "a table record is no row; skipped"
            );
            return Ok(());
        }
        self.metrics
            .rows
            .set(i64::try_from(table.len()).unwrap_or(i64::MAX));
        self.metrics
            .bytes
            .set(i64::try_from(table.bytes()).unwrap_or(i64::MAX));
        if table.bytes() > self.max_bytes {
            return Err(TableError::TooLarge {
                topic: self.topic.clone(),
                rows: table.len(),
                max: self.max_bytes,
            });
        }
        Ok(())
    }
}
