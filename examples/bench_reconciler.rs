//! The reconciler's numbers on a 10-step topology at 2,000 records/s: commit → cutover start
//! (a local repository, notify), the longest gap in the output of a replaced source-connected
//! step during a `parallel` cutover (its stop → its successor's first output), and the
//! daemon's own RSS and CPU while nothing changes. Run through `bench/reconciler.sh`, which
//! builds the release binaries first.
//!
//! Environment: `BENCH_ROUNDS` (cutovers, default 5), `BENCH_RATE` (records/s, default 2000),
//! `PLUMBER_TEST_BOOTSTRAP` (a real cluster instead of tansu), `BENCH_OUT` (default
//! bench/results/reconciler.md), `BENCH_KEEP` (keep the state directory and logs),
//! `BENCH_STATEFUL=1` (`a` is a stateful sql step, a running count per key emitted on every
//! update, whose select list changes each round: its new life restores the old state from
//! the changelog before its first output).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use git2::{Repository, RepositoryInitOptions, Signature};
use plumber_testkit::{Broker, Process, Usage, unique, wait_until};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(300);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn release_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// src → a → out1; a → b → c → out2; src → d → e → f → out3: ten steps, `a` feeding a sink
/// directly so that its own output is visible.
fn files(version: u32, src: &str, outs: &[String; 3], stateful: bool) -> Vec<(String, String)> {
    let processor = |input: &str, tag: &str| {
        format!("kind: processor\ninput: {input}\njq: '.{tag} = true'\npartitions: 3\n")
    };
    let a = if stateful {
        // The same state every round (a running count per key): the new life restores it.
        format!(
            "kind: processor\ninput: src\nsql: \"SELECT _key AS k, COUNT(*) AS n, 'a{version}' AS v \
             FROM src GROUP BY _key\"\npartitions: 3\n"
        )
    } else {
        processor("src", &format!("a{version}"))
    };
    vec![
        (
            "topologies/t/src.yaml".into(),
            format!("kind: source\ntopic: {src}\n"),
        ),
        ("topologies/t/a.yaml".into(), a),
        ("topologies/t/b.yaml".into(), processor("a", "b")),
        ("topologies/t/c.yaml".into(), processor("b", "c")),
        ("topologies/t/d.yaml".into(), processor("src", "d")),
        ("topologies/t/e.yaml".into(), processor("d", "e")),
        ("topologies/t/f.yaml".into(), processor("e", "f")),
        (
            "topologies/t/out1.yaml".into(),
            format!("kind: sink\ntopic: {}\ninput: a\n", outs[0]),
        ),
        (
            "topologies/t/out2.yaml".into(),
            format!("kind: sink\ntopic: {}\ninput: c\n", outs[1]),
        ),
        (
            "topologies/t/out3.yaml".into(),
            format!("kind: sink\ntopic: {}\ninput: f\n", outs[2]),
        ),
    ]
}

fn commit(git: &Repository, message: &str, files: &[(String, String)]) -> String {
    let mut index = git.index().unwrap();
    let root = git.workdir().unwrap().to_path_buf();
    for (path, content) in files {
        let full = root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, content).unwrap();
        index.add_path(Path::new(path)).unwrap();
    }
    index.write().unwrap();
    let tree = git.find_tree(index.write_tree().unwrap()).unwrap();
    let signature = Signature::now("bench", "bench@localhost").unwrap();
    let parent = git.head().ok().and_then(|h| h.peel_to_commit().ok());
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    git.commit(
        Some("HEAD"),
        &signature,
        &signature,
        message,
        &tree,
        &parents,
    )
    .unwrap()
    .to_string()
}

fn status(server: &str) -> Option<Value> {
    ureq::get(&format!("{server}/api/status"))
        .call()
        .ok()?
        .body_mut()
        .read_json()
        .ok()
}

fn topology(status: &Value) -> &Value {
    &status["topologies"][0]
}

/// The longest time between consecutive records (by producer timestamp) within a window.
fn longest_gap(timestamps: &[i64], from: i64, to: i64) -> i64 {
    let inside: Vec<i64> = timestamps
        .iter()
        .copied()
        .filter(|t| *t >= from && *t <= to)
        .collect();
    inside
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(to - from)
}

/// The producer timestamps of every record of `topic` (slow on tansu: minutes for 100k+).
fn timestamps(broker: &Broker, topic: &str) -> Vec<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::{Message as _, Offset, TopicPartitionList};
    let consumer: BaseConsumer = broker
        .client()
        .set("group.id", unique("bench-reader"))
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..3 {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut ended = std::collections::BTreeSet::new();
    let mut stamps = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1800);
    while ended.len() < 3 {
        assert!(Instant::now() < deadline, "reading {topic} took too long");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => stamps.extend(message.timestamp().to_millis()),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(error)) => eprintln!("reading {topic}: {error}"),
            None => {}
        }
    }
    stamps
}

/// `plumber up`, stopped gracefully when dropped (also on a panic), so that it stops its
/// processors: killing it outright would leave them running.
struct Daemon(Process);

impl Drop for Daemon {
    fn drop(&mut self) {
        self.0.signal(nix::sys::signal::Signal::SIGTERM);
        if self.0.wait_exit(PATIENCE).is_none() {
            eprintln!("the daemon did not stop within {PATIENCE:?}");
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds = env_or("BENCH_ROUNDS", 5);
    let stateful = std::env::var_os("BENCH_STATEFUL").is_some();
    let rate = env_or("BENCH_RATE", 2000);
    let out = PathBuf::from(
        std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/reconciler.md".into()),
    );
    let broker = Broker::start();
    let src = unique("bench-src");
    broker.create_topic(&src, 3);
    let outs: [String; 3] = std::array::from_fn(|i| {
        let name = unique(&format!("bench-out{}", i + 1));
        broker.create_topic(&name, 3);
        name
    });

    let work = tempfile::tempdir().unwrap();
    if std::env::var_os("BENCH_KEEP").is_some() {
        eprintln!("keeping {} (BENCH_KEEP)", work.path().display());
    }
    let git = Repository::init_opts(
        work.path().join("repo"),
        RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    let first = commit(&git, "first", &files(1, &src, &outs, stateful));

    // Load: `rate` records per second into the source, for the whole run.
    let running = Arc::new(AtomicBool::new(true));
    let writer = {
        let (mut client, src, running) = (broker.client(), src.clone(), running.clone());
        std::thread::spawn(move || {
            let producer: BaseProducer = client.set("linger.ms", "5").create().unwrap();
            let start = Instant::now();
            let mut i = 0u64;
            while running.load(Ordering::SeqCst) {
                let due = start + Duration::from_micros(i * 1_000_000 / rate);
                while Instant::now() < due {
                    producer.poll(due.saturating_duration_since(Instant::now()));
                }
                let value = format!(r#"{{"seq":{i}}}"#);
                let key = format!("k{}", i % 64);
                if producer
                    .send(BaseRecord::to(&src).key(&key).payload(&value))
                    .is_err()
                {
                    producer.poll(Duration::from_millis(10));
                }
                i += 1;
            }
            if let Err(error) = producer.flush(Duration::from_secs(120)) {
                eprintln!(
                    "load: {error} ({} records still queued)",
                    producer.in_flight_count()
                );
            }
            (i, start.elapsed())
        })
    };

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("http://127.0.0.1:{port}");
    let log = std::fs::File::create(work.path().join("daemon.log")).unwrap();
    eprintln!("daemon log: {}", work.path().join("daemon.log").display());
    let mut command = Command::new(release_dir().join("plumber"));
    command
        .arg("up")
        .arg(work.path().join("repo"))
        .args(["--bootstrap", broker.bootstrap()])
        .arg("--state-dir")
        .arg(work.path().join("state"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("PLUMBER_PROCESSOR", release_dir().join("plumber-processor"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    if broker.is_tansu() {
        command.arg("--keep-topics");
    }
    let daemon = Daemon(Process::spawn("plumber up", &mut command));
    let applied = |commit: &str| {
        let commit = commit.to_owned();
        wait_until(&format!("{commit} applied"), PATIENCE, || {
            status(&server).is_some_and(|s| {
                topology(&s)["commit"] == commit.as_str() && topology(&s)["phase"] == "idle"
            })
        });
    };
    applied(&first);
    eprintln!("deployed; warming up");
    std::thread::sleep(Duration::from_secs(10));

    // The daemon while nothing changes (its processors keep working).
    let idle_secs = 20.0;
    let before = Usage::of(daemon.0.pid());
    std::thread::sleep(Duration::from_secs_f64(idle_secs));
    let after = Usage::of(daemon.0.pid());
    let idle_cpu = (after.cpu_seconds - before.cpu_seconds) / idle_secs * 100.0;
    let idle_rss = after.rss_kb as f64 / 1024.0;
    eprintln!("idle: {idle_cpu:.2}% CPU, {idle_rss:.1} MB RSS");

    let mut to_start = Vec::new();
    let mut windows = Vec::new();
    for round in 0..rounds {
        let version = round as u32 + 2;
        let committed_at = Instant::now();
        let window_from = now_ms();
        let sha = commit(
            &git,
            &format!("a v{version}"),
            &files(version, &src, &outs, stateful),
        );
        let started = {
            let deadline = Instant::now() + PATIENCE;
            loop {
                if let Some(s) = status(&server) {
                    let t = topology(&s);
                    if t["cutover"]["to"] == sha.as_str() || t["commit"] == sha.as_str() {
                        break committed_at.elapsed();
                    }
                }
                assert!(Instant::now() < deadline, "cutover to {sha} never started");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        applied(&sha);
        // Let the successor's output settle before the window closes.
        std::thread::sleep(Duration::from_secs(5));
        let window_to = now_ms();
        eprintln!(
            "round {round}: commit → cutover start {:.0} ms",
            started.as_secs_f64() * 1000.0
        );
        to_start.push(started.as_secs_f64() * 1000.0);
        windows.push((window_from, window_to));
        std::thread::sleep(Duration::from_secs(5));
    }
    // Steady-state windows of the same length, between cutovers, as the baseline.
    running.store(false, Ordering::SeqCst);
    let (sent, sending) = writer.join().unwrap();
    let achieved = sent as f64 / sending.as_secs_f64();
    eprintln!("load: {sent} records at {achieved:.0}/s");
    // A stateful step's outputs carry their inputs' timestamps (docs/stateful-sql.md), which
    // show no gap: its gap is measured after `b` and `c` (jq, stamped when they produce).
    let measured = if stateful { &outs[1] } else { &outs[0] };
    let mut stamps = timestamps(&broker, measured);
    stamps.sort_unstable();
    let gaps: Vec<f64> = windows
        .iter()
        .map(|(from, to)| longest_gap(&stamps, *from, *to) as f64)
        .collect();
    let steady: Vec<f64> = windows
        .windows(2)
        .map(|w| {
            // From 1 s after a cutover's window closed to 1 s before the next one opened.
            longest_gap(&stamps, w[0].1 + 1000, w[1].0 - 1000) as f64
        })
        .collect();
    for (i, gap) in gaps.iter().enumerate() {
        eprintln!("round {i}: longest gap in a's output {gap:.0} ms");
    }
    drop(daemon);

    let kind = if broker.is_tansu() {
        "tansu 0.6 (SQLite storage)"
    } else {
        "the PLUMBER_TEST_BOOTSTRAP cluster"
    };
    let machine = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut report = String::new();
    if stateful {
        writeln!(report, "# Cutover of a stateful step\n").unwrap();
        writeln!(report, "Gaps are measured on `out2` (src → a → b → c), since `a`'s outputs carry their inputs' timestamps; `b` and `c` are replaced with `a`.\n").unwrap();
        writeln!(report, "A 10-step topology (one source, a stateful sql step `a` counting records per key over 64 keys and emitting on every update, five jq processors, three sinks) with {rate} records/s offered to its source on {kind}; {machine} cores; {rounds} parallel cutovers replacing `a` with a query whose select list changes (the same state: the new life restores the old one's changelog before its first output) and the two below it; medians. Rerun: `bash bench/stateful-sql.sh` (or `BENCH_STATEFUL=1 BENCH_OUT=… bash bench/reconciler.sh`).\n").unwrap();
    } else {
        writeln!(report, "# Reconciler benchmark\n").unwrap();
        writeln!(report, "A 10-step topology (one source, six jq processors, three sinks) with {rate} records/s offered to its source on {kind}; {machine} cores; {rounds} parallel cutovers replacing the source-connected step `a` (and the two below it); medians. Rerun: `bash bench/reconciler.sh`.\n").unwrap();
    }
    writeln!(report, "| measure | median | target |\n|---|---:|---:|").unwrap();
    writeln!(
        report,
        "| commit → cutover start (local repository, notify) | {:.0} ms | ≤ 1000 ms |",
        median(to_start.clone())
    )
    .unwrap();
    writeln!(
        report,
        "| longest gap in `a`'s output during a cutover (its stop → its successor's first output) | {:.0} ms | ≤ 2000 ms |",
        median(gaps.clone())
    )
    .unwrap();
    if !steady.is_empty() {
        writeln!(
            report,
            "| baseline: longest gap in `a`'s output between cutovers (same window length) | {:.0} ms | |",
            median(steady.clone())
        )
        .unwrap();
        writeln!(
            report,
            "| ratio cutover gap / steady gap | {:.1} | |",
            median(gaps.clone()) / median(steady.clone()).max(1.0)
        )
        .unwrap();
    }
    writeln!(
        report,
        "| daemon RSS while idle (processors running, no commit) | {idle_rss:.1} MB | ≤ 50 MB |"
    )
    .unwrap();
    writeln!(
        report,
        "| daemon CPU while idle (over {idle_secs:.0} s) | {idle_cpu:.2} % | ≈ 0 |"
    )
    .unwrap();
    writeln!(
        report,
        "\nThe load generator sent {sent} records at {achieved:.0} records/s on average (the broker, six processors and the generator share the cores)."
    )
    .unwrap();
    writeln!(report, "\nPer round: commit → start {to_start:.0?} ms; gaps {gaps:.0?} ms; steady gaps {steady:.0?} ms.").unwrap();
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, &report).unwrap();
    println!("{report}");
    eprintln!("written to {}", out.display());
    if std::env::var_os("BENCH_KEEP").is_some() {
        let _ = work.keep();
    }
}
