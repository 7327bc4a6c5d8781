//! A daemon thread stuck inside a call (issue 24): `/healthz` tells, naming the thread and
//! what it does, once the call has run longer than `wedged_after`; a stop is bounded all the
//! same (it says which thread it left); and the local runtime starts nothing once `plumber
//! up` has stopped its processors.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use plumber::daemon::{Context, Daemon, DaemonConfig};
use plumber::kafka::{self, Admin};
use plumber::plan::PartitionOffset;
use plumber::runtime::local::{LocalConfig, LocalRuntime};
use plumber::runtime::{Cluster, ProcessorSpec, Runtime as _, Settings};
use plumber::spec::{Scale, Transform};

const PATIENCE: Duration = Duration::from_secs(60);

/// A Kafka admin whose calls wait until the test opens its gate: a cutover action that takes
/// long (a broker that stopped answering, a huge topic to create). A call made by a topology's
/// worker tells the test it is inside one.
struct Held {
    open: Mutex<bool>,
    opened: Condvar,
    entered: Mutex<Option<SyncSender<String>>>,
}

impl Held {
    fn new() -> (Arc<Held>, Receiver<String>) {
        let (entered, receiver) = mpsc::sync_channel(64);
        let held = Arc::new(Held {
            open: Mutex::new(false),
            opened: Condvar::new(),
            entered: Mutex::new(Some(entered)),
        });
        (held, receiver)
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn wait<T>(&self, call: &str) -> kafka::Result<T> {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        if thread.starts_with("topology-")
            && let Some(entered) = &*self.entered.lock().unwrap_or_else(PoisonError::into_inner)
        {
            let _ = entered.try_send(format!("{thread} {call}"));
        }
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        while !*open {
            open = self
                .opened
                .wait(open)
                .unwrap_or_else(PoisonError::into_inner);
        }
        Err(kafka::Error::NoAnswer {
            bootstrap: "held".into(),
        })
    }
}

impl Admin for Held {
    fn create_topic(
        &self,
        _: &str,
        _: u32,
        _: Option<u32>,
        _: &BTreeMap<String, String>,
    ) -> kafka::Result<()> {
        self.wait("create_topic")
    }
    fn delete_topic(&self, _: &str) -> kafka::Result<()> {
        self.wait("delete_topic")
    }
    fn partitions(&self, _: &str) -> kafka::Result<i32> {
        self.wait("partitions")
    }
    fn watermarks(&self, _: &str) -> kafka::Result<Vec<(i64, i64)>> {
        self.wait("watermarks")
    }
    fn committed(&self, _: &str, _: &[String]) -> kafka::Result<Vec<PartitionOffset>> {
        self.wait("committed")
    }
    fn commit(&self, _: &str, _: &[PartitionOffset]) -> kafka::Result<()> {
        self.wait("commit")
    }
    fn delete_group(&self, _: &str) -> kafka::Result<()> {
        self.wait("delete_group")
    }
    fn supports_transactions(&self) -> kafka::Result<bool> {
        Ok(false)
    }
}

/// `GET path` on `addr`: the status and the body.
fn probe(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn local_runtime(state_dir: &std::path::Path) -> Arc<LocalRuntime> {
    Arc::new(
        LocalRuntime::open(
            state_dir,
            LocalConfig {
                checkouts: plumber::store::checkouts_dir(state_dir),
                ..LocalConfig::default()
            },
        )
        .unwrap(),
    )
}

#[test]
fn a_worker_stuck_in_an_action_is_unhealthy_and_a_stop_leaves_it_and_says_so() {
    let repo = common::one_topology();
    let state = tempfile::tempdir().unwrap();
    let mut config = DaemonConfig::new(&repo.location(), state.path().join("state"));
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.wedged_after = Duration::from_secs(3);
    let runtime = local_runtime(&config.state_dir);
    let (held, entered) = Held::new();
    let admin = held.clone();
    let context = Context::with_admin(
        config,
        runtime,
        Box::new(move |_| Ok(admin.clone() as Arc<dyn Admin>)),
    )
    .unwrap();
    let mut daemon = Daemon::start(context).unwrap();
    let call = entered
        .recv_timeout(PATIENCE)
        .expect("the topology's worker calls Kafka in its first action");
    assert!(call.starts_with("topology-t "), "{call}");
    let addr = daemon.listening;
    // Healthy while the call is young (a unit of work may take its time)…
    let (status, body) = probe(addr, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    // …then wedged, naming the thread and what it does.
    plumber_testkit::wait_until("/healthz says the worker is wedged", PATIENCE, || {
        probe(addr, "/healthz").0 == 503
    });
    let (_, body) = probe(addr, "/healthz");
    assert!(
        body.contains("topology-t (a step of the cutover engine for")
            && body.contains("--wedged-after"),
        "{body}"
    );
    assert_eq!(probe(addr, "/readyz"), (503, body));

    let stopping = Instant::now();
    let (stopped, busy) = mpsc::channel();
    let stop = std::thread::spawn(move || {
        let busy = daemon.shutdown_within(Some(Instant::now() + Duration::from_millis(300)));
        let _ = stopped.send(busy);
        daemon
    });
    let busy = busy.recv_timeout(PATIENCE);
    let took = stopping.elapsed();
    // Whatever happened, the worker may go now (an unbounded stop would wait forever).
    held.open();
    let daemon = stop.join().unwrap();
    // The follower waits for its workers: it is what is left busy.
    assert_eq!(busy, Ok(vec!["follow"]), "after {took:?}");

    // Once the action ends the worker stops on its own: nothing is left behind for a daemon
    // that lives on (tests, and `plumber up` stopping its processors next).
    held.open();
    let threads = daemon.context().threads.clone();
    plumber_testkit::wait_until("the worker and the follower end", PATIENCE, || {
        !threads
            .running()
            .iter()
            .any(|name| name == "follow" || name.starts_with("topology-"))
    });
}

#[test]
fn the_local_runtime_starts_nothing_once_every_processor_was_stopped() {
    let state = tempfile::tempdir().unwrap();
    let runtime = local_runtime(state.path());
    runtime.stop_all();
    let spec = ProcessorSpec {
        topology: "t".into(),
        step: "clean".into(),
        identity: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
            .parse()
            .unwrap(),
        group: "plumber.t.clean.0123456789ab".into(),
        cluster: Cluster::at("127.0.0.1:1"),
        inputs: vec!["t-in".into()],
        input_steps: BTreeMap::new(),
        outputs: vec!["plumber.t.clean.0123456789ab".into()],
        dlq: "plumber.t.clean.dlq".into(),
        transform: Transform::Jq {
            program: ".".into(),
        },
        env: BTreeMap::new(),
        scale: Scale {
            min: 1,
            max: 1,
            lag_threshold: 100,
        },
        resources: None,
        commit: "c0ffee".into(),
        dir: "topologies/t".into(),
        settings: Settings::default(),
        state: None,
        table: None,
        handoff_group: None,
    };
    let error = runtime.start(&spec).unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(
        error.to_string().contains("the daemon is stopping"),
        "{error}"
    );
    assert!(runtime.processors().unwrap().is_empty());
}
