//! Test harness shared by Plumber's crates: a real Kafka-compatible broker, topics, records
//! in and out, child processes and condition waits.
//!
//! [`Broker::start`] uses the cluster in `PLUMBER_TEST_BOOTSTRAP` when set, and otherwise
//! starts tansu (an Apache Kafka compatible broker) with SQLite storage on a free loopback
//! port, in a temporary directory removed afterwards. Every helper panics with a message
//! saying what it waited for: a harness failure must fail the test, loudly.
//!
//! [`kube_api`] is an in-memory Kubernetes API server behind a real `kube::Client`;
//! `browser` (with the `browser` feature) is headless Chromium driven over WebDriver.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(feature = "browser")]
pub mod browser;
pub mod kube_api;

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// How long harness waits may take before the test fails. Generous: CI machines are shared.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A Kafka endpoint for one test.
pub struct Broker {
    bootstrap: String,
    tansu: Option<Child>,
    data: Option<tempfile::TempDir>,
}

impl Broker {
    /// `PLUMBER_TEST_BOOTSTRAP` if set, else a fresh tansu.
    pub fn start() -> Broker {
        if let Ok(bootstrap) = std::env::var("PLUMBER_TEST_BOOTSTRAP")
            && !bootstrap.is_empty()
        {
            return Broker::external(bootstrap);
        }
        Broker::tansu()
    }

    /// An already running cluster (a real one, or rdkafka's `MockCluster`).
    pub fn external(bootstrap: String) -> Broker {
        let broker = Broker {
            bootstrap,
            tansu: None,
            data: None,
        };
        broker.wait_ready();
        broker
    }

    fn tansu() -> Broker {
        let data = tempfile::tempdir().expect("temporary directory for the broker");
        let port = free_port();
        let child = spawn_tansu(data.path(), port);
        let broker = Broker {
            bootstrap: format!("127.0.0.1:{port}"),
            tansu: Some(child),
            data: Some(data),
        };
        broker.wait_ready();
        broker
    }

    /// Kills the harness's tansu (kill -9: the broker is gone) and leaves it dead; `restart`
    /// brings it back. Does nothing for an external cluster.
    pub fn kill(&mut self) {
        if let Some(child) = &mut self.tansu {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the harness's tansu (kill -9: a crash) and starts it again on the same port and
    /// data; returns once it answers. Does nothing for an external cluster.
    pub fn restart(&mut self) {
        let (Some(child), Some(data)) = (&mut self.tansu, &self.data) else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
        let port: u16 = self
            .bootstrap
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the harness's bootstrap has a port");
        *child = spawn_tansu(data.path(), port);
        self.wait_ready();
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Whether this is the harness's own tansu (no transactions, DescribeGroups unreliable).
    pub fn is_tansu(&self) -> bool {
        self.tansu.is_some()
    }

    fn wait_ready(&self) {
        let producer: BaseProducer = self.client().create().expect("probe client");
        wait_until("the broker answers metadata requests", PATIENCE, || {
            producer
                .client()
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok()
        });
    }

    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }

    pub fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> =
            self.client().create().expect("admin client");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let results = runtime
            .block_on(admin.create_topics([&topic], &AdminOptions::new()))
            .unwrap_or_else(|e| panic!("creating topic {name}: {e}"));
        for result in results {
            if let Err((topic, code)) = result {
                panic!("creating topic {topic}: {code}");
            }
        }
        // Metadata reaches every client eventually; wait until the partitions are visible.
        let producer: BaseProducer = self.client().create().expect("metadata client");
        wait_until(
            &format!("topic {name} has {partitions} partitions"),
            PATIENCE,
            || {
                producer
                    .client()
                    .fetch_metadata(Some(name), Duration::from_secs(2))
                    .ok()
                    .and_then(|m| {
                        m.topics().first().map(|t| {
                            t.partitions().len() as i32 == partitions && t.error().is_none()
                        })
                    })
                    .unwrap_or(false)
            },
        );
    }

    /// The names of the topics the broker lists with partitions and no error. Listing all
    /// topics (asking for one by name may create it); a failed metadata request is retried
    /// until `PATIENCE`, since tansu drops connections while it deletes topics; by a new
    /// client each time, so that one whose connection broke is not waited on again.
    pub fn topic_names(&self) -> BTreeSet<String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let consumer: BaseConsumer = self.client().create().expect("metadata client");
            match consumer.fetch_metadata(None, Duration::from_secs(10)) {
                Ok(metadata) => {
                    return metadata
                        .topics()
                        .iter()
                        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                        .map(|t| t.name().to_owned())
                        .collect();
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("listing topics failed, retrying: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("listing topics failed for {PATIENCE:?}: {e}"),
            }
        }
    }

    /// Produces `entries` (a key, and a value or a tombstone) to `topic`/`partition` in order,
    /// as many as the producer's queue takes at once, and waits until all are acknowledged:
    /// for changelogs and compacted topics of hundreds of thousands of entries.
    pub fn produce_keyed(
        &self,
        topic: &str,
        partition: i32,
        entries: &[(Vec<u8>, Option<Vec<u8>>)],
    ) {
        let producer: BaseProducer = self
            .client()
            .set("linger.ms", "20")
            .set("queue.buffering.max.messages", "1000000")
            .create()
            .expect("keyed producer");
        for (key, value) in entries {
            let mut record = BaseRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .key(key);
            if let Some(value) = value {
                record = record.payload(value);
            }
            while let Err((error, back)) = producer.send(record) {
                assert!(
                    matches!(
                        error.rdkafka_error_code(),
                        Some(RDKafkaErrorCode::QueueFull)
                    ),
                    "producing to {topic}/{partition}: {error}"
                );
                producer.poll(Duration::from_millis(10));
                record = back;
            }
        }
        producer
            .flush(Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("flushing to {topic}/{partition}: {e}"));
    }

    /// Produces `records` and waits until all are acknowledged.
    pub fn produce(&self, topic: &str, records: &[TestRecord]) {
        let producer: BaseProducer = self
            .client()
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            .create()
            .expect("test producer");
        for record in records {
            let mut headers = OwnedHeaders::new();
            for (key, value) in &record.headers {
                headers = headers.insert(Header {
                    key,
                    value: Some(value),
                });
            }
            let mut base: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).headers(headers);
            if let Some(partition) = record.partition {
                base = base.partition(partition);
            }
            if let Some(timestamp) = record.timestamp {
                base = base.timestamp(timestamp);
            }
            if let Some(key) = &record.key {
                base = base.key(key);
            }
            if let Some(value) = &record.value {
                base = base.payload(value);
            }
            let mut pending = base;
            loop {
                match producer.send(pending) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        pending = back;
                        producer.poll(Duration::from_millis(10));
                    }
                }
            }
        }
        producer
            .flush(PATIENCE)
            .unwrap_or_else(|e| panic!("producing to {topic}: {e}"));
    }

    /// Everything committed on `topic`, partition by partition up to its end, read_committed.
    pub fn read_all(&self, topic: &str) -> Vec<TestRecord> {
        let mut reader = self.reader(topic, "read_committed");
        reader.read_to_end();
        reader.records
    }

    /// Everything on `topic`, including records of open and aborted transactions.
    pub fn read_all_uncommitted(&self, topic: &str) -> Vec<TestRecord> {
        let mut reader = self.reader(topic, "read_uncommitted");
        reader.read_to_end();
        reader.records
    }

    /// Reads `topic` until `done(records)` holds, and returns the records; panics naming
    /// `what` after [`PATIENCE`].
    ///
    /// Each look is a fresh read from the beginning, taken when the topic has grown: on
    /// tansu 0.6 a long-lived consumer tailing a topic that is being written sometimes stops
    /// receiving one of its partitions for good, while a new consumer reads past the same
    /// offsets.
    pub fn wait_for_records(
        &self,
        topic: &str,
        what: &str,
        done: impl Fn(&[TestRecord]) -> bool,
    ) -> Vec<TestRecord> {
        let deadline = Instant::now() + PATIENCE;
        let mut looked_at = -1;
        loop {
            let end = self.end_offsets(topic);
            if end != looked_at {
                looked_at = end;
                let records = self.read_all(topic);
                if done(&records) {
                    return records;
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {PATIENCE:?} waiting for {what} on {topic} ({end} offsets written)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The sum of the high watermarks of `topic`'s partitions: how many offsets (records and
    /// transaction markers) were ever written to it.
    pub fn end_offsets(&self, topic: &str) -> i64 {
        let consumer: BaseConsumer = self.client().create().expect("watermark client");
        self.partitions(&consumer, topic)
            .into_iter()
            .map(|partition| {
                consumer
                    .fetch_watermarks(topic, partition, PATIENCE)
                    .unwrap_or_else(|e| panic!("watermarks of {topic}/{partition}: {e}"))
                    .1
            })
            .sum()
    }

    fn partitions(&self, consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
        let metadata = consumer
            .fetch_metadata(Some(topic), PATIENCE)
            .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
        metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect()
    }

    fn reader(&self, topic: &str, isolation: &str) -> Reader {
        let consumer: BaseConsumer = self
            .client()
            .set("group.id", "plumber-testkit-reader")
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .set("enable.partition.eof", "true")
            .create()
            .expect("test consumer");
        let partitions = self.partitions(&consumer, topic);
        let mut assignment = TopicPartitionList::new();
        for partition in &partitions {
            assignment
                .add_partition_offset(topic, *partition, Offset::Beginning)
                .expect("assignment");
        }
        consumer.assign(&assignment).expect("assign");
        Reader {
            consumer,
            partitions: partitions.len(),
            records: Vec::new(),
        }
    }

    /// The offsets `group` committed on `topic`, by partition.
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
        let consumer: BaseConsumer = self
            .client()
            .set("group.id", group)
            .create()
            .expect("offset reader");
        let mut list = TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, PATIENCE)
            .unwrap_or_else(|e| panic!("committed offsets of {group}: {e}"));
        committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(offset) => Some((e.partition(), offset)),
                _ => None,
            })
            .collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = &mut self.tansu {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failed test keeps the broker's log and data: the broker may be what failed.
        if std::thread::panicking()
            && let Some(data) = self.data.take()
        {
            eprintln!("broker log and data kept in {}", data.keep().display());
        }
    }
}

fn spawn_tansu(data: &std::path::Path, port: u16) -> Child {
    let binary = tansu_binary();
    let url = format!("tcp://127.0.0.1:{port}");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.join("tansu.log"))
        .expect("broker log file");
    // tansu 0.6 mangles absolute sqlite paths: run it inside its data directory.
    Command::new(&binary)
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "sqlite://./broker.db"])
        .current_dir(data)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

/// Reads one topic from its beginning, outside any group.
struct Reader {
    consumer: BaseConsumer,
    partitions: usize,
    records: Vec<TestRecord>,
}

impl Reader {
    /// Reads until every partition reported its end once.
    fn read_to_end(&mut self) {
        let mut ended = BTreeSet::new();
        let deadline = Instant::now() + PATIENCE;
        while ended.len() < self.partitions {
            assert!(Instant::now() < deadline, "timed out reading to the end");
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(message)) => self.records.push(TestRecord {
                    key: message.key().map(<[u8]>::to_vec),
                    value: message.payload().map(<[u8]>::to_vec),
                    headers: message
                        .headers()
                        .map(|headers| {
                            headers
                                .iter()
                                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                                .collect()
                        })
                        .unwrap_or_default(),
                    partition: Some(message.partition()),
                    offset: Some(message.offset()),
                    timestamp: message.timestamp().to_millis(),
                }),
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(partition))) => {
                    ended.insert(partition);
                }
                Some(Err(error)) => panic!("reading: {error}"),
                None => {}
            }
        }
    }
}

/// A record as tests write and read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// Milliseconds since the epoch, as the producer (or broker) stamped it when read; when
    /// produced, the timestamp to give it (`None`: the producer's clock).
    pub timestamp: Option<i64>,
}

impl TestRecord {
    pub fn new(key: &str, value: &str) -> Self {
        TestRecord {
            key: Some(key.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            ..TestRecord::default()
        }
    }

    pub fn header(mut self, key: &str, value: &str) -> Self {
        self.headers
            .push((key.to_owned(), value.as_bytes().to_vec()));
        self
    }

    pub fn value_str(&self) -> &str {
        std::str::from_utf8(self.value.as_deref().unwrap_or_default()).expect("UTF-8 value")
    }

    pub fn header_str(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| std::str::from_utf8(v).expect("UTF-8 header"))
    }
}

/// Processes on this machine (zombies aside) started for consumer group `group`: the
/// instances of a processor, whichever runtime started them.
pub fn live_instances(group: &str) -> usize {
    let needle = format!("--group\0{group}\0");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
                && !std::fs::read_to_string(e.path().join("stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true)
        })
        .count()
}

/// Polls `condition` every 20 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A name no other test (or earlier run against a shared cluster) uses.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A loopback port nothing listens on now (for a server a test starts).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn tansu_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TANSU") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain(std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo/bin")))
        .map(|dir| dir.join("tansu"))
        .find(|candidate| candidate.is_file());
    on_path.unwrap_or_else(|| {
        panic!(
            "these tests need a Kafka broker: install tansu with \
             `cargo install tansu --locked --version 0.6.0 --features libsql` \
             (or set TANSU=/path/to/tansu, or PLUMBER_TEST_BOOTSTRAP=host:port for a real cluster)"
        )
    })
}

/// A child process a test starts, signals and waits for. Killed on drop.
pub struct Process {
    child: Child,
    name: String,
}

impl Process {
    pub fn spawn(name: &str, command: &mut Command) -> Process {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Process {
            child,
            name: name.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's standard output, when it was piped (once).
    pub fn stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal)
            .unwrap_or_else(|e| panic!("cannot send {signal} to {}: {e}", self.name));
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CPU time and memory of a running process, from `/proc` (benchmarks).
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub rss_kb: u64,
    pub peak_rss_kb: u64,
}

impl Usage {
    pub fn of(pid: u32) -> Usage {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        let after = &stat[stat.rfind(')').expect("stat has a command") + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64;
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
        let kb = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Usage {
            cpu_seconds: (field(11) + field(12)) / ticks,
            rss_kb: kb("VmRSS:"),
            peak_rss_kb: kb("VmHWM:"),
        }
    }
}
