//! What the cutover engine asks of Kafka: topics, a group's committed offsets, setting a
//! group's offsets, and end offsets (for lag and drains). [`Admin`] is the trait the engine
//! uses; [`KafkaAdmin`] implements it with rdkafka, blocking (the engine runs on its own
//! threads).
//!
//! Setting a group's offsets commits them from a client that joins no group: that works only
//! while the group has no live member, which the engine guarantees by starting a processor
//! only after its offsets are set and by setting offsets only on groups it has not started.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::plan::PartitionOffset;

/// How long one admin or offset call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// How long describing a group may take. It is asked right after a processor's instances
/// exited (they left the group as they did), on the path of every cutover, so a broker slow
/// to answer counts as one that cannot say rather than holding the cutover up.
const MEMBERS_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot use the credentials of {bootstrap}: {message}")]
    Credentials { bootstrap: String, message: String },
    #[error("cannot create a Kafka client for {bootstrap}: {source}")]
    Client {
        bootstrap: String,
        #[source]
        source: KafkaError,
    },
    #[error("cannot {operation} topic {topic}: {message}")]
    Topic {
        operation: &'static str,
        topic: String,
        message: String,
    },
    #[error("cannot read the partitions of {topic}: {message}")]
    Metadata { topic: String, message: String },
    #[error("topic {topic} does not exist")]
    NoSuchTopic { topic: String },
    #[error(
        "topic {topic} exists with {found} partitions, but {wanted} are wanted; it is not this life's (another tool or an older plumber made it): delete it, or change the step's `partitions`"
    )]
    PartitionMismatch {
        topic: String,
        found: i32,
        wanted: i32,
    },
    #[error(
        "no broker of {bootstrap} answered the transaction check (the delivery mode of its processors depends on it); asking again"
    )]
    NoAnswer { bootstrap: String },
    #[error("cannot describe group {group}: {source}")]
    Describe {
        group: String,
        #[source]
        source: KafkaError,
    },
    #[error("cannot read the end offsets of {topic}/{partition}: {source}")]
    Watermarks {
        topic: String,
        partition: i32,
        #[source]
        source: KafkaError,
    },
    #[error("cannot read the committed offsets of group {group}: {source}")]
    Committed {
        group: String,
        #[source]
        source: KafkaError,
    },
    #[error("cannot set the offsets of group {group}: {source}")]
    Commit {
        group: String,
        #[source]
        source: KafkaError,
    },
    #[error("cannot delete group {group}: {message}")]
    DeleteGroup {
        group: String,
        message: String,
        /// Whether asking again can help: the group still has members, its coordinator
        /// moved, or no broker answered.
        retryable: bool,
    },
    #[error("{operation} {target}: not done, this replica no longer holds the lease")]
    Fenced {
        operation: &'static str,
        target: String,
    },
    #[error("{message}")]
    Sample { message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The Kafka operations of a cutover. Each is idempotent.
pub trait Admin: Send + Sync {
    /// Creates the topic unless it exists with these partitions (another count is an
    /// error); `replication: None` takes the broker's default, `config` are topic settings.
    fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: Option<u32>,
        config: &BTreeMap<String, String>,
    ) -> Result<()>;
    /// Deletes the topic if it exists.
    fn delete_topic(&self, topic: &str) -> Result<()>;
    /// The topic's partition count; an error if it does not exist.
    fn partitions(&self, topic: &str) -> Result<i32>;
    /// `(low, high)` watermarks per partition.
    fn watermarks(&self, topic: &str) -> Result<Vec<(i64, i64)>>;
    /// The group's committed offsets on `topics`; partitions without one are left out.
    fn committed(&self, group: &str, topics: &[String]) -> Result<Vec<PartitionOffset>>;
    /// Sets the group's offsets. The group must have no live member.
    fn commit(&self, group: &str, offsets: &[PartitionOffset]) -> Result<()>;
    /// Deletes the group with its committed offsets; a group that does not exist is no
    /// error. It must have no member.
    fn delete_group(&self, group: &str) -> Result<()>;

    /// Whether the cluster supports transactions (its processors then run exactly-once).
    /// No answer is an error, never a "no".
    fn supports_transactions(&self) -> Result<bool>;
    /// The most recent records of `inputs` (the input step each topic feeds, the topic),
    /// within `limits`, read without a group: partitions are assigned, nothing is committed,
    /// so no group's offsets or lag move. A client that cannot read records says so.
    fn recent_records(
        &self,
        _inputs: &[(String, String)],
        _limits: &SampleLimits,
    ) -> Result<Vec<Sampled>> {
        Err(Error::Sample {
            message: "this Kafka client does not read records".into(),
        })
    }

    /// How many members the group has; `None` when the broker does not say (it cannot
    /// describe groups). A stopped processor's group empties as its instances leave it.
    fn members(&self, _group: &str) -> Result<Option<usize>> {
        Ok(None)
    }

    /// Whether the group has consumed everything on `topics`. Without transactions that is a
    /// lag of 0; with them, transaction markers and aborted records sit between a group's
    /// committed offset and the end, so [`KafkaAdmin`] looks for a readable record instead.
    fn drained(&self, group: &str, topics: &[String]) -> Result<bool> {
        Ok(self.lag(group, topics)? == 0)
    }

    /// Records the group has not consumed on `topics` (end offset − committed, or the whole
    /// partition when nothing is committed).
    fn lag(&self, group: &str, topics: &[String]) -> Result<i64> {
        Ok(self.progress(group, topics)?.lag)
    }

    /// Where the group stands on `topics`: its lag, and the sum of its committed offsets
    /// (which moves while it makes progress).
    fn progress(&self, group: &str, topics: &[String]) -> Result<Progress> {
        let standings = self.standings(group, topics)?;
        Ok(Progress {
            lag: standings.iter().map(|s| (s.end - s.at).max(0)).sum(),
            position: standings.iter().map(|s| s.at).sum(),
        })
    }

    /// Per partition of `topics`: where the group stands (its committed offset, or the
    /// partition's start when it has none) and where the partition ends.
    fn standings(&self, group: &str, topics: &[String]) -> Result<Vec<Standing>> {
        let committed: BTreeMap<(String, i32), i64> = self
            .committed(group, topics)?
            .into_iter()
            .map(|p| ((p.topic, p.partition), p.offset))
            .collect();
        let mut standings = Vec::new();
        for topic in topics {
            for (partition, (low, high)) in self.watermarks(topic)?.into_iter().enumerate() {
                let partition = partition as i32;
                let at = committed
                    .get(&(topic.clone(), partition))
                    .copied()
                    .unwrap_or(low)
                    .max(low);
                standings.push(Standing {
                    topic: topic.clone(),
                    partition,
                    at,
                    end: high,
                });
            }
        }
        Ok(standings)
    }
}

/// One partition as a group stands on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub topic: String,
    pub partition: i32,
    pub at: i64,
    pub end: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub lag: i64,
    pub position: i64,
}

/// An [`Admin`] whose writes (topics created and deleted, offsets set, groups deleted) each ask
/// the lease immediately before they are made: a daemon replica deposed in the middle of an
/// action changes nothing more on Kafka, as its Kubernetes writes are fenced
/// (`KubeRuntime::fenced_by`). Reads go through.
pub struct Fenced {
    inner: Arc<dyn Admin>,
    may_write: Arc<crate::runtime::Guard>,
}

impl Fenced {
    pub fn new(inner: Arc<dyn Admin>, may_write: Arc<crate::runtime::Guard>) -> Fenced {
        Fenced { inner, may_write }
    }

    fn fence(&self, operation: &'static str, target: &str) -> Result<()> {
        if (self.may_write)() {
            return Ok(());
        }
        tracing::warn!(
            operation,
            target,
            "not written: this replica no longer holds the lease"
        );
        Err(Error::Fenced {
            operation,
            target: target.to_owned(),
        })
    }
}

impl Admin for Fenced {
    // Reading writes nothing: a standby may sample too.
    fn recent_records(
        &self,
        inputs: &[(String, String)],
        limits: &SampleLimits,
    ) -> Result<Vec<Sampled>> {
        self.inner.recent_records(inputs, limits)
    }
    fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: Option<u32>,
        config: &BTreeMap<String, String>,
    ) -> Result<()> {
        self.fence("create topic", topic)?;
        self.inner
            .create_topic(topic, partitions, replication, config)
    }
    fn delete_topic(&self, topic: &str) -> Result<()> {
        self.fence("delete topic", topic)?;
        self.inner.delete_topic(topic)
    }
    fn commit(&self, group: &str, offsets: &[PartitionOffset]) -> Result<()> {
        self.fence("set the offsets of group", group)?;
        self.inner.commit(group, offsets)
    }
    fn delete_group(&self, group: &str) -> Result<()> {
        self.fence("delete group", group)?;
        self.inner.delete_group(group)
    }
    // Reads, each delegated (the inner admin may answer them better than the defaults do).
    fn partitions(&self, topic: &str) -> Result<i32> {
        self.inner.partitions(topic)
    }
    fn watermarks(&self, topic: &str) -> Result<Vec<(i64, i64)>> {
        self.inner.watermarks(topic)
    }
    fn committed(&self, group: &str, topics: &[String]) -> Result<Vec<PartitionOffset>> {
        self.inner.committed(group, topics)
    }
    fn supports_transactions(&self) -> Result<bool> {
        self.inner.supports_transactions()
    }
    fn members(&self, group: &str) -> Result<Option<usize>> {
        self.inner.members(group)
    }
    fn drained(&self, group: &str, topics: &[String]) -> Result<bool> {
        self.inner.drained(group, topics)
    }
    fn lag(&self, group: &str, topics: &[String]) -> Result<i64> {
        self.inner.lag(group, topics)
    }
    fn progress(&self, group: &str, topics: &[String]) -> Result<Progress> {
        self.inner.progress(group, topics)
    }
    fn standings(&self, group: &str, topics: &[String]) -> Result<Vec<Standing>> {
        self.inner.standings(group, topics)
    }
}

/// [`Admin`] over rdkafka.
pub struct KafkaAdmin {
    bootstrap: String,
    admin: AdminClient<DefaultClientContext>,
    /// For metadata and watermarks; joins no group.
    metadata: BaseConsumer,
    /// One client per group whose offsets are read or set: creating a client costs threads
    /// and connections, and the daemon reads every group's offsets every few seconds.
    groups: std::sync::Mutex<BTreeMap<String, Arc<BaseConsumer>>>,
    /// See [`KafkaAdmin::known_partitions`].
    partition_counts: std::sync::Mutex<BTreeMap<String, i32>>,
    runtime: tokio::runtime::Runtime,
    /// What every client of this cluster is created from.
    client: ClientConfig,
}

/// Group clients kept at most; beyond, the cache starts over (stopped groups drop out).
const MAX_GROUP_CLIENTS: usize = 256;

/// Partition counts kept at most (a few bytes each); beyond, the cache starts over.
const MAX_PARTITION_COUNTS: usize = 100_000;

impl KafkaAdmin {
    /// A client of the cluster at `bootstrap`, with no other settings.
    pub fn connect(bootstrap: &str) -> Result<Self> {
        KafkaAdmin::connect_to(&crate::runtime::Cluster::at(bootstrap), None)
    }

    /// A client of `cluster`, with its `properties`, and the credentials files of
    /// `credentials` when the cluster has some (SPEC §2).
    pub fn connect_to(
        cluster: &crate::runtime::Cluster,
        credentials: Option<&std::path::Path>,
    ) -> Result<Self> {
        let bootstrap = cluster.bootstrap.as_str();
        let client_error = |source| Error::Client {
            bootstrap: bootstrap.to_owned(),
            source,
        };
        let mut client = base(bootstrap);
        for (key, value) in &cluster.properties {
            client.set(key, value);
        }
        if let (Some(secret), None) = (&cluster.credentials, credentials) {
            return Err(Error::Credentials {
                bootstrap: bootstrap.to_owned(),
                message: format!(
                    "the cluster takes its credentials from `{secret}`, but the daemon was given \
                     none (`plumber up --kafka-credentials DIR`, or the Secret mounted by the \
                     daemon's config)"
                ),
            });
        }
        if let (Some(_), Some(dir)) = (&cluster.credentials, credentials) {
            let properties = plumber_kafka_probe::credentials::properties(dir).map_err(|e| {
                Error::Credentials {
                    bootstrap: bootstrap.to_owned(),
                    message: e.to_string(),
                }
            })?;
            for (key, value) in properties {
                client.set(key, value);
            }
        }
        let admin = client.create().map_err(client_error)?;
        let metadata = client.create().map_err(client_error)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| client_error(KafkaError::ClientCreation(e.to_string())))?;
        Ok(KafkaAdmin {
            bootstrap: bootstrap.to_owned(),
            admin,
            metadata,
            groups: std::sync::Mutex::new(BTreeMap::new()),
            partition_counts: std::sync::Mutex::new(BTreeMap::new()),
            runtime,
            client,
        })
    }

    /// A client of `group` that never joins it: reads and commits its offsets.
    fn group_client(&self, group: &str) -> Result<Arc<BaseConsumer>> {
        let mut groups = self
            .groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(client) = groups.get(group) {
            return Ok(client.clone());
        }
        if groups.len() >= MAX_GROUP_CLIENTS {
            groups.clear();
        }
        let client: BaseConsumer = self
            .client
            .clone()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|source| Error::Client {
                bootstrap: self.bootstrap.clone(),
                source,
            })?;
        let client = Arc::new(client);
        groups.insert(group.to_owned(), client.clone());
        Ok(client)
    }

    /// The partition count of `topic` as last looked up by the read paths (watermarks,
    /// committed offsets): a topic's count never changes under Plumber (another count is an
    /// error), and the observer reads every group's topics at every look. Forgotten when the
    /// topic is deleted or a read of it fails.
    fn known_partitions(&self, topic: &str) -> Result<i32> {
        let cached = self
            .partition_counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(topic)
            .copied();
        if let Some(count) = cached {
            return Ok(count);
        }
        let count = self.partitions(topic)?;
        let mut counts = self
            .partition_counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if counts.len() >= MAX_PARTITION_COUNTS {
            counts.clear();
        }
        counts.insert(topic.to_owned(), count);
        Ok(count)
    }

    fn forget_partitions(&self, topic: &str) {
        self.partition_counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(topic);
    }

    /// Per partition `0..partitions` of `topic`, its offset at `at` (the beginning or the
    /// end), in one ListOffsets request per partition leader.
    fn list_offsets(&self, topic: &str, partitions: i32, at: Offset) -> Result<Vec<i64>> {
        let error = |partition: i32, source: KafkaError| Error::Watermarks {
            topic: topic.to_owned(),
            partition,
            source,
        };
        let mut wanted = TopicPartitionList::new();
        for partition in 0..partitions {
            // The offset of a ListOffsets query is its timestamp: the beginning (-2) and the
            // end (-1) are the special timestamps of the earliest and the latest offset.
            wanted
                .add_partition_offset(topic, partition, at)
                .map_err(|e| error(partition, e))?;
        }
        let found = self
            .metadata
            .offsets_for_times(wanted, CALL_TIMEOUT)
            .map_err(|e| error(0, e))?;
        (0..partitions)
            .map(|partition| {
                let element = found.find_partition(topic, partition).ok_or_else(|| {
                    error(
                        partition,
                        KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition),
                    )
                })?;
                element.error().map_err(|e| error(partition, e))?;
                match element.offset() {
                    Offset::Offset(offset) => Ok(offset),
                    _ => Err(error(
                        partition,
                        KafkaError::OffsetFetch(RDKafkaErrorCode::NoOffset),
                    )),
                }
            })
            .collect()
    }

    fn topic_exists(&self, topic: &str) -> Result<bool> {
        match self.partitions(topic) {
            Ok(_) => Ok(true),
            Err(Error::NoSuchTopic { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn base(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "plumber")
        // Metadata for a topic that does not exist must not create it.
        .set("allow.auto.create.topics", "false");
    config
}

impl Admin for KafkaAdmin {
    fn recent_records(
        &self,
        inputs: &[(String, String)],
        limits: &SampleLimits,
    ) -> Result<Vec<Sampled>> {
        read_recent(&self.client, inputs, limits).map_err(|message| Error::Sample { message })
    }
    fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        replication: Option<u32>,
        config: &BTreeMap<String, String>,
    ) -> Result<()> {
        let topic_error = |message: String| Error::Topic {
            operation: "create",
            topic: topic.to_owned(),
            message,
        };
        let count = i32::try_from(partitions).map_err(|e| topic_error(e.to_string()))?;
        // -1: the broker's default.replication.factor (KIP-464).
        let replicas = match replication {
            Some(n) => i32::try_from(n).map_err(|e| topic_error(e.to_string()))?,
            None => -1,
        };
        let mut new = NewTopic::new(topic, count, TopicReplication::Fixed(replicas));
        for (key, value) in config {
            new = new.set(key, value);
        }
        let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
        let results = self
            .runtime
            .block_on(self.admin.create_topics([&new], &options))
            .map_err(|e| topic_error(e.to_string()))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(topic_error(code.to_string())),
            }
        }
        // Metadata reaches clients eventually: wait until the partitions are visible, so the
        // processors started next find them.
        let deadline = std::time::Instant::now() + CALL_TIMEOUT;
        loop {
            match self.partitions(topic) {
                Ok(n) if n == count => return Ok(()),
                Ok(found) => {
                    return Err(Error::PartitionMismatch {
                        topic: topic.to_owned(),
                        found,
                        wanted: count,
                    });
                }
                _ if std::time::Instant::now() > deadline => {
                    return Err(topic_error("created, but not visible in metadata".into()));
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn delete_topic(&self, topic: &str) -> Result<()> {
        self.forget_partitions(topic);
        if !self.topic_exists(topic)? {
            return Ok(());
        }
        let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
        let results = self
            .runtime
            .block_on(self.admin.delete_topics(&[topic], &options))
            .map_err(|e| Error::Topic {
                operation: "delete",
                topic: topic.to_owned(),
                message: e.to_string(),
            })?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((_, code)) => {
                    return Err(Error::Topic {
                        operation: "delete",
                        topic: topic.to_owned(),
                        message: code.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    fn delete_group(&self, group: &str) -> Result<()> {
        let failed = |message: String, retryable| Error::DeleteGroup {
            group: group.to_owned(),
            message,
            retryable,
        };
        let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
        let results = self
            .runtime
            .block_on(self.admin.delete_groups(&[group], &options))
            .map_err(|e| failed(e.to_string(), true))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::GroupIdNotFound)) => {}
                Err((_, code)) => {
                    let retryable = matches!(
                        code,
                        RDKafkaErrorCode::NonEmptyGroup
                            | RDKafkaErrorCode::CoordinatorNotAvailable
                            | RDKafkaErrorCode::NotCoordinator
                            | RDKafkaErrorCode::CoordinatorLoadInProgress
                    );
                    return Err(failed(code.to_string(), retryable));
                }
            }
        }
        Ok(())
    }

    fn partitions(&self, topic: &str) -> Result<i32> {
        let metadata_error = |message: String| Error::Metadata {
            topic: topic.to_owned(),
            message,
        };
        let metadata = self
            .metadata
            .fetch_metadata(Some(topic), CALL_TIMEOUT)
            .map_err(|e| metadata_error(e.to_string()))?;
        let no_such_topic = || Error::NoSuchTopic {
            topic: topic.to_owned(),
        };
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(no_such_topic());
        };
        match found.error().map(RDKafkaErrorCode::from) {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Err(no_such_topic()),
            Some(code) => return Err(metadata_error(code.to_string())),
            None => {}
        }
        match found.partitions().len() {
            0 => Err(no_such_topic()),
            n => Ok(n as i32),
        }
    }

    fn drained(&self, group: &str, topics: &[String]) -> Result<bool> {
        let mut behind = TopicPartitionList::new();
        for s in self.standings(group, topics)? {
            if s.at < s.end {
                behind
                    .add_partition_offset(&s.topic, s.partition, Offset::Offset(s.at))
                    .map_err(|source| Error::Committed {
                        group: group.to_owned(),
                        source,
                    })?;
            }
        }
        if behind.count() == 0 {
            return Ok(true);
        }
        // Between the committed offset and the end: is there a record a read_committed reader
        // would get, or only transaction markers and aborted records?
        let read_error = |source| Error::Committed {
            group: group.to_owned(),
            source,
        };
        let reader: BaseConsumer = self
            .client
            .clone()
            .set("group.id", "plumber-drain-check")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .create()
            .map_err(read_error)?;
        reader.assign(&behind).map_err(read_error)?;
        let mut ended = 0;
        let deadline = std::time::Instant::now() + CALL_TIMEOUT;
        while ended < behind.count() {
            if std::time::Instant::now() > deadline {
                return Ok(false);
            }
            match reader.poll(Duration::from_millis(100)) {
                Some(Ok(_)) => return Ok(false),
                Some(Err(KafkaError::PartitionEOF(_))) => ended += 1,
                Some(Err(error)) => return Err(read_error(error)),
                None => {}
            }
        }
        Ok(true)
    }

    fn watermarks(&self, topic: &str) -> Result<Vec<(i64, i64)>> {
        let partitions = self.known_partitions(topic)?;
        // Two ListOffsets requests (per partition leader) for all partitions, not two per
        // partition: the observer reads every group's inputs at every look.
        let read = || -> Result<Vec<(i64, i64)>> {
            let low = self.list_offsets(topic, partitions, Offset::Beginning)?;
            let high = self.list_offsets(topic, partitions, Offset::End)?;
            Ok(low.into_iter().zip(high).collect())
        };
        read().inspect_err(|_| self.forget_partitions(topic))
    }

    fn committed(&self, group: &str, topics: &[String]) -> Result<Vec<PartitionOffset>> {
        let mut wanted = TopicPartitionList::new();
        for topic in topics {
            for partition in 0..self.known_partitions(topic)? {
                wanted.add_partition(topic, partition);
            }
        }
        let client = self.group_client(group)?;
        let committed = client
            .committed_offsets(wanted, CALL_TIMEOUT)
            .map_err(|source| Error::Committed {
                group: group.to_owned(),
                source,
            })?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(offset) => Some(PartitionOffset {
                    topic: e.topic().to_owned(),
                    partition: e.partition(),
                    offset,
                }),
                _ => None,
            })
            .collect())
    }

    fn supports_transactions(&self) -> Result<bool> {
        plumber_kafka_probe::brokers_support_transactions(&self.client.clone(), CALL_TIMEOUT)
            .ok_or_else(|| Error::NoAnswer {
                bootstrap: self.bootstrap.clone(),
            })
    }

    fn members(&self, group: &str) -> Result<Option<usize>> {
        match self.metadata.fetch_group_list(Some(group), MEMBERS_TIMEOUT) {
            Ok(list) => Ok(Some(
                list.groups()
                    .iter()
                    .filter(|g| g.name() == group)
                    .map(|g| g.members().len())
                    .sum(),
            )),
            // Brokers without DescribeGroups cannot say: librdkafka finds no version of it
            // to use (its mock cluster: "required feature not supported by broker").
            Err(KafkaError::GroupListFetch(
                RDKafkaErrorCode::UnsupportedVersion | RDKafkaErrorCode::UnsupportedFeature,
            )) => Ok(None),
            Err(source) => Err(Error::Describe {
                group: group.to_owned(),
                source,
            }),
        }
    }

    fn commit(&self, group: &str, offsets: &[PartitionOffset]) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let commit_error = |source| Error::Commit {
            group: group.to_owned(),
            source,
        };
        let mut list = TopicPartitionList::new();
        for p in offsets {
            list.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.offset))
                .map_err(commit_error)?;
        }
        let client = self.group_client(group)?;
        client.commit(&list, CommitMode::Sync).map_err(commit_error)
    }
}

/// What sampling one step may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleLimits {
    /// Records, over all of its inputs' partitions (the most recent of each).
    pub records: usize,
    /// Bytes of keys and values.
    pub bytes: u64,
    /// Time to read them.
    pub time: Duration,
}

impl Default for SampleLimits {
    fn default() -> SampleLimits {
        SampleLimits {
            records: 100,
            bytes: 8 << 20,
            time: Duration::from_secs(10),
        }
    }
}

/// A record read for the sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sampled {
    /// The input step it feeds the processor from.
    pub from: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch, when the record has a timestamp.
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

/// Reads the most recent records of `inputs` (input step, topic), at most `limits`, without
/// joining a group or committing anything.
fn read_recent(
    client: &ClientConfig,
    inputs: &[(String, String)],
    limits: &SampleLimits,
) -> std::result::Result<Vec<Sampled>, String> {
    let consumer: BaseConsumer = client
        .clone()
        // Names the client only: partitions are assigned, never subscribed, and no offset is
        // stored or committed.
        .set("group.id", "plumber-plan-sample")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|e| format!("cannot make a Kafka client: {e}"))?;
    let timeout = limits.time;
    let mut partitions: Vec<(String, String, i32, i64, i64)> = Vec::new();
    for (from, topic) in inputs {
        let metadata = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| format!("cannot read the partitions of `{topic}`: {e}"))?;
        for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
            let (low, high) = consumer
                .fetch_watermarks(topic, partition.id(), timeout)
                .map_err(|e| format!("cannot read the offsets of `{topic}`: {e}"))?;
            partitions.push((from.clone(), topic.clone(), partition.id(), low, high));
        }
    }
    if partitions.is_empty() {
        return Err("its inputs have no partitions (do the topics exist?)".into());
    }
    // An even share of the records per partition; what a short partition leaves goes to
    // the others.
    partitions.retain(|(_, _, _, low, high)| high > low);
    partitions.sort_by_key(|(_, _, _, low, high)| high - low);
    let mut left = limits.records as i64;
    let mut assignment = TopicPartitionList::new();
    let mut ends: BTreeMap<(String, i32), (String, i64)> = BTreeMap::new();
    let count = partitions.len() as i64;
    for (i, (from, topic, partition, low, high)) in partitions.iter().enumerate() {
        let share = (left + (count - i as i64) - 1) / (count - i as i64);
        let take = share.min(high - low);
        left -= take;
        let start = high - take;
        assignment
            .add_partition_offset(topic, *partition, Offset::Offset(start))
            .map_err(|e| e.to_string())?;
        ends.insert((topic.clone(), *partition), (from.clone(), *high));
    }
    if ends.is_empty() {
        return Ok(Vec::new());
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("cannot read the inputs: {e}"))?;
    let deadline = Instant::now() + limits.time;
    let mut records = Vec::new();
    let mut bytes = 0u64;
    let mut open: BTreeSet<(String, i32)> = ends.keys().cloned().collect();
    while !open.is_empty() && records.len() < limits.records && Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            // A partition whose last offsets are transaction markers (an exactly-once
            // writer's) gives no record at its end: its position says it is read.
            if let Ok(positions) = consumer.position() {
                for element in positions.elements() {
                    let place = (element.topic().to_owned(), element.partition());
                    if let (Offset::Offset(at), Some((_, end))) =
                        (element.offset(), ends.get(&place))
                        && at >= *end
                    {
                        open.remove(&place);
                    }
                }
            }
            continue;
        };
        let message = message.map_err(|e| format!("reading the inputs: {e}"))?;
        let place = (message.topic().to_owned(), message.partition());
        let Some((from, end)) = ends.get(&place) else {
            continue;
        };
        if message.offset() + 1 >= *end {
            open.remove(&place);
        }
        let key = message.key().map(<[u8]>::to_vec);
        let value = message.payload().map(<[u8]>::to_vec).unwrap_or_default();
        bytes += (key.as_ref().map_or(0, Vec::len) + value.len()) as u64;
        if bytes > limits.bytes {
            break;
        }
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        records.push(Sampled {
            from: from.clone(),
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            key,
            value,
            headers,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Records the calls that reach it.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl Recorded {
        fn call<T>(&self, call: String, answer: T) -> Result<T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(call);
            Ok(answer)
        }
    }

    impl Admin for Recorded {
        fn create_topic(
            &self,
            topic: &str,
            _: u32,
            _: Option<u32>,
            _: &BTreeMap<String, String>,
        ) -> Result<()> {
            self.call(format!("create {topic}"), ())
        }
        fn delete_topic(&self, topic: &str) -> Result<()> {
            self.call(format!("delete {topic}"), ())
        }
        fn partitions(&self, topic: &str) -> Result<i32> {
            self.call(format!("partitions {topic}"), 1)
        }
        fn watermarks(&self, topic: &str) -> Result<Vec<(i64, i64)>> {
            self.call(format!("watermarks {topic}"), vec![(0, 5)])
        }
        fn committed(&self, group: &str, _: &[String]) -> Result<Vec<PartitionOffset>> {
            self.call(format!("committed {group}"), Vec::new())
        }
        fn commit(&self, group: &str, _: &[PartitionOffset]) -> Result<()> {
            self.call(format!("commit {group}"), ())
        }
        fn delete_group(&self, group: &str) -> Result<()> {
            self.call(format!("delete-group {group}"), ())
        }
        fn supports_transactions(&self) -> Result<bool> {
            self.call("transactions?".into(), true)
        }
        fn members(&self, group: &str) -> Result<Option<usize>> {
            self.call(format!("members {group}"), Some(0))
        }
    }

    #[test]
    fn a_deposed_replica_writes_nothing_to_kafka_and_still_reads() {
        let recorded = Arc::new(Recorded::default());
        let holds = Arc::new(AtomicBool::new(true));
        let fenced = Fenced::new(recorded.clone(), {
            let holds = holds.clone();
            Arc::new(move || holds.load(Ordering::SeqCst))
        });
        let writes = |admin: &Fenced| {
            [
                admin.create_topic("t", 1, None, &BTreeMap::new()),
                admin.delete_topic("t"),
                admin.commit("g", &[]),
                admin.delete_group("g"),
            ]
        };
        assert!(writes(&fenced).iter().all(Result::is_ok));
        holds.store(false, Ordering::SeqCst);
        for refused in writes(&fenced) {
            assert!(matches!(refused, Err(Error::Fenced { .. })), "{refused:?}");
        }
        // Reads go through, to the inner admin's own answers (not the trait's defaults).
        assert_eq!(fenced.partitions("t").ok(), Some(1));
        assert_eq!(fenced.members("g").ok(), Some(Some(0)));
        assert_eq!(fenced.supports_transactions().ok(), Some(true));
        let calls = recorded.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(
            calls,
            [
                "create t",
                "delete t",
                "commit g",
                "delete-group g",
                "partitions t",
                "members g",
                "transactions?"
            ]
        );
    }
}
