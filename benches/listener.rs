//! What holding connections costs the daemon (SPEC §11): `plumber up`'s peak RSS while it
//! holds 1,000 idle connections (each answered once, then kept alive), 1,000 connections that
//! sent half a request head, and its maximum of gzipped event streams that never read, each
//! against an idle daemon in the same run. Every measurement is a fresh daemon (peak RSS only
//! grows), the conditions interleaved in each round.
//!
//! `bash bench/listener.sh` builds the release binary and writes `bench/results/listener.md`.
//! Knobs: BENCH_CONNECTIONS (1000), BENCH_ROUNDS (5), BENCH_HOLD (seconds a load is held
//! before the daemon's memory is read, 5), BENCH_OUT.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails loudly

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use git2::{Repository, RepositoryInitOptions, Signature};
use plumber_testkit::{Process, Usage, free_port, wait_until};

const PATIENCE: Duration = Duration::from_secs(120);

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `median [min–max]` with `decimals` digits.
fn summary(values: &[f64], decimals: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.d$} [{min:.d$}–{max:.d$}]", median(values), d = decimals)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Condition {
    Idle,
    IdleConnections,
    HalfHeads,
    EventStreams,
}

impl Condition {
    const ALL: [Condition; 4] = [
        Condition::Idle,
        Condition::IdleConnections,
        Condition::HalfHeads,
        Condition::EventStreams,
    ];

    fn describe(self, connections: usize, streams: usize) -> String {
        match self {
            Condition::Idle => "(a) idle: no connection".into(),
            Condition::IdleConnections => {
                format!("(b) {connections} idle connections (each answered once, kept alive)")
            }
            Condition::HalfHeads => {
                format!("(c) {connections} connections that sent 2 KB of a request head")
            }
            Condition::EventStreams => {
                format!("(d) {streams} gzipped event streams (the maximum) never read")
            }
        }
    }
}

/// `plumber up` on `repo`, stopped gracefully when dropped.
struct Daemon {
    process: Process,
    port: u16,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.process.signal(nix::sys::signal::Signal::SIGTERM);
        if self.process.wait_exit(PATIENCE).is_none() {
            eprintln!("the daemon did not stop within {PATIENCE:?}");
        }
    }
}

/// The whole answer to `GET path` on a connection of its own.
fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}

/// A gauge of the daemon's `/metrics`.
fn gauge(port: u16, name: &str) -> i64 {
    get(port, "/metrics")
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(-1)
}

fn start(plumber: &Path, repo: &Path, work: &Path, head: &str, connections: usize) -> Daemon {
    let port = free_port();
    let state = work.join(format!("state-{port}"));
    let process = Process::spawn(
        "plumber up",
        Command::new(plumber)
            .arg("up")
            .arg(repo)
            .args(["--branch", "main", "--bootstrap", "127.0.0.1:1"])
            .arg("--state-dir")
            .arg(&state)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--poll-interval", "3600"])
            // The same limits in every condition: room for the load, held for good.
            .args(["--max-connections", &(connections * 2).to_string()])
            .args(["--header-timeout", "3600", "--idle-timeout", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let daemon = Daemon { process, port };
    wait_until("the daemon has read the branch", PATIENCE, || {
        get(port, "/api/status").is_some_and(|text| text.contains(head))
    });
    daemon
}

/// Puts `condition`'s load on the daemon; the connections stay open while returned.
fn load(condition: Condition, port: u16, connections: usize, streams: usize) -> Vec<TcpStream> {
    let connect = || TcpStream::connect(("127.0.0.1", port)).unwrap();
    match condition {
        Condition::Idle => Vec::new(),
        Condition::IdleConnections => (0..connections)
            .map(|_| {
                let mut stream = connect();
                stream
                    .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    .unwrap();
                // The answer, whole: `ok\n` after the head.
                let mut answer = Vec::new();
                let mut buffer = [0u8; 512];
                while !answer.ends_with(b"ok\n") {
                    let n = stream.read(&mut buffer).unwrap();
                    assert!(n > 0, "the daemon closed a kept-alive connection");
                    answer.extend_from_slice(&buffer[..n]);
                }
                stream
            })
            .collect(),
        Condition::HalfHeads => (0..connections)
            .map(|_| {
                let mut stream = connect();
                let head = format!(
                    "GET /api/status HTTP/1.1\r\nHost: localhost\r\nX-Padding: {}",
                    "a".repeat(2048)
                );
                stream.write_all(head.as_bytes()).unwrap();
                stream
            })
            .collect(),
        Condition::EventStreams => (0..streams)
            .map(|_| {
                let mut stream = connect();
                stream
                    .write_all(
                        b"GET /api/events HTTP/1.1\r\nHost: localhost\r\n\
                          Accept-Encoding: gzip\r\n\r\n",
                    )
                    .unwrap();
                let mut buffer = [0u8; 512];
                assert!(stream.read(&mut buffer).unwrap() > 0);
                stream
            })
            .collect(),
    }
}

struct Measured {
    peak_mb: f64,
    rss_mb: f64,
    held: i64,
}

fn main() {
    let connections = knob("BENCH_CONNECTIONS", 1000) as usize;
    let rounds = knob("BENCH_ROUNDS", 5) as usize;
    let hold = Duration::from_secs(knob("BENCH_HOLD", 5));
    let out = std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/listener.md".into());
    // The daemon's default.
    let streams = plumber::daemon::ListenerConfig::default().max_event_streams;
    let plumber = Path::new(env!("CARGO_BIN_EXE_plumber"));
    let started = Instant::now();

    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("repo");
    let git =
        Repository::init_opts(&repo, RepositoryInitOptions::new().initial_head("main")).unwrap();
    let mut index = git.index().unwrap();
    for (path, content) in [
        ("topologies/t/in.yaml", "kind: source\ntopic: t-in\n"),
        (
            "topologies/t/clean.yaml",
            "kind: processor\ninput: in\njq: '.'\n",
        ),
        (
            "topologies/t/out.yaml",
            "kind: sink\ntopic: t-out\ninput: clean\n",
        ),
    ] {
        let full = repo.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, content).unwrap();
        index.add_path(Path::new(path)).unwrap();
    }
    index.write().unwrap();
    let tree = git.find_tree(index.write_tree().unwrap()).unwrap();
    let signature = Signature::now("bench", "bench@localhost").unwrap();
    let head = git
        .commit(
            Some("HEAD"),
            &signature,
            &signature,
            "one topology",
            &tree,
            &[],
        )
        .unwrap()
        .to_string();

    let mut measured: Vec<Vec<Measured>> = Condition::ALL.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        // Interleaved, each round in another order.
        for offset in 0..Condition::ALL.len() {
            let index = (round + offset) % Condition::ALL.len();
            let condition = Condition::ALL[index];
            let daemon = start(plumber, &repo, work.path(), &head, connections);
            let held_connections = load(condition, daemon.port, connections, streams);
            let gauge_name = if condition == Condition::EventStreams {
                "plumber_http_event_streams"
            } else {
                "plumber_http_connections"
            };
            let expected = match condition {
                Condition::Idle => 0,
                Condition::EventStreams => streams as i64,
                _ => connections as i64,
            };
            // The gauge's own request is a connection too.
            wait_until("the daemon holds the load", PATIENCE, || {
                gauge(daemon.port, gauge_name) >= expected
            });
            std::thread::sleep(hold);
            let held = gauge(daemon.port, gauge_name);
            let usage = Usage::of(daemon.process.pid());
            eprintln!(
                "round {round}: {}: peak {} MB, RSS {} MB, {gauge_name} {held}",
                condition.describe(connections, streams),
                usage.peak_rss_kb / 1024,
                usage.rss_kb / 1024
            );
            measured[index].push(Measured {
                peak_mb: usage.peak_rss_kb as f64 / 1024.0,
                rss_mb: usage.rss_kb as f64 / 1024.0,
                held,
            });
            drop(held_connections);
            drop(daemon);
        }
    }

    let commit_id = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let peaks = |i: usize| measured[i].iter().map(|m| m.peak_mb).collect::<Vec<_>>();
    let idle_peak = median(&peaks(0));
    let mut r = String::new();
    writeln!(r, "# What holding connections costs the daemon\n").unwrap();
    writeln!(
        r,
        "{date}, {cores} cores, commit {commit_id}{}. Rerun: `bash bench/listener.sh` (knobs: \
         BENCH_CONNECTIONS, BENCH_ROUNDS, BENCH_HOLD). The whole run took {:.0} s.\n",
        if dirty { " (with local changes)" } else { "" },
        started.elapsed().as_secs_f64()
    )
    .unwrap();
    writeln!(
        r,
        "Setup: `plumber up` (release build) on a local git repository of one topology, with no \
         broker (`--bootstrap 127.0.0.1:1`: nothing runs, the daemon only follows the branch and \
         serves its API), `--max-connections {}`, `--header-timeout` and `--idle-timeout` 3600 \
         (so the load is held), in every condition. Each measurement is a daemon of its own, \
         started, asked for its status until it has read the branch, loaded, then left {} s \
         before its memory is read from `/proc` (`VmHWM`, the peak RSS, and `VmRSS`); {rounds} \
         rounds, the four conditions interleaved in each (in another order each round). Median \
         [range]; the ratio is of the medians, to (a).\n",
        connections * 2,
        hold.as_secs()
    )
    .unwrap();
    writeln!(
        r,
        "| condition | daemon peak RSS MB | ratio | daemon RSS MB | held (the daemon's gauge) | per connection, KB |"
    )
    .unwrap();
    writeln!(r, "|---|---:|---:|---:|---:|---:|").unwrap();
    for (index, condition) in Condition::ALL.iter().enumerate() {
        let peak = median(&peaks(index));
        let rss: Vec<f64> = measured[index].iter().map(|m| m.rss_mb).collect();
        let held: Vec<f64> = measured[index].iter().map(|m| m.held as f64).collect();
        let count = match condition {
            Condition::Idle => 0,
            Condition::EventStreams => streams,
            _ => connections,
        };
        let per = if count == 0 {
            "–".to_owned()
        } else {
            format!("{:.0}", (peak - idle_peak) * 1024.0 / count as f64)
        };
        writeln!(
            r,
            "| {} | {} | {:.2}× | {} | {} | {per} |",
            condition.describe(connections, streams),
            summary(&peaks(index), 1),
            peak / idle_peak,
            summary(&rss, 1),
            summary(&held, 0),
        )
        .unwrap();
    }
    writeln!(
        r,
        "\n*Per connection*: the difference of the median peaks to (a), divided by the \
         connections (or streams) held. The held count is `plumber_http_connections` \
         ((d): `plumber_http_event_streams`) read once the load was in place, the reading's \
         own connection included.\n"
    )
    .unwrap();
    std::fs::write(&out, r).unwrap();
    eprintln!("wrote {out}");
}
