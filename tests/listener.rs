//! The listener holds (SPEC §11): each test makes what a stranger on the port can make, then
//! checks that `/healthz` still answers, that the daemon closes what it must not keep, and
//! that what it holds meanwhile is bounded.
//!
//! The daemon runs in this process (`common::daemon`, no Kafka), where its heap is counted
//! (`HEAP`), and as `plumber up` where its memory is that of a process of its own. Every wait
//! is on a condition.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Harness;
use peak_alloc::PeakAlloc;
use plumber::daemon::health::Kind;
use plumber_testkit::{Process, Usage, free_port, wait_until};

/// Every allocation of this process: the in-process daemon's heap, and the little the test's
/// clients use.
#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const PATIENCE: Duration = Duration::from_secs(60);
const MB: usize = 1024 * 1024;

/// A repository with one topology (source → jq → sink).
/// An HTTP/1.1 request on a connection of its own; the answer's status (its first line only
/// is read: the rest stays unread, as a client that stops reading leaves it).
fn ask(addr: SocketAddr, request: &str) -> (TcpStream, u16) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        assert_eq!(
            stream.read(&mut byte).unwrap(),
            1,
            "the answer was cut short"
        );
        line.push(byte[0]);
    }
    let line = String::from_utf8(line).unwrap();
    let status = line.split(' ').nth(1).unwrap().parse().unwrap();
    (stream, status)
}

fn get(addr: SocketAddr, path: &str, host: &str) -> u16 {
    ask(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .1
}

/// The whole answer to `GET path`, read within `within` (`None`: it did not come).
fn answer_within(addr: SocketAddr, path: &str, within: Duration) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(within)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// Whether the daemon closed `stream`: reading what it sent ends (the end, or a reset)
/// within `within`.
fn closed_within(mut stream: &TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// `/healthz` answers `ok` at once.
fn healthy(addr: SocketAddr) {
    let answer = answer_within(addr, "/healthz", Duration::from_secs(2));
    assert_eq!(
        answer,
        Some((200, "ok\n".to_owned())),
        "/healthz answers at once"
    );
}

/// Slowloris: 400 connections each send most of a large request head and never finish it.
/// Before, all of them stayed open, each holding what it had sent. Now a head longer than the
/// listener's buffer is refused at once, and one that does not end within the header timeout
/// is closed; `/healthz` answers throughout, and the daemon's memory stays small.
#[test]
fn half_sent_request_heads_are_closed_and_cost_little_while_health_answers() {
    let repo = common::one_topology();
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let daemon = Process::spawn(
        "plumber up",
        Command::new(env!("CARGO_BIN_EXE_plumber"))
            .args(["up", &repo.location(), "--branch", "main"])
            .args(["--bootstrap", "127.0.0.1:1"])
            .arg("--state-dir")
            .arg(state.path().join("state"))
            .args(["--listen", &addr.to_string()])
            .args(["--header-timeout", "3"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(state.path().join("stderr")).unwrap()),
    );
    wait_until("the daemon answers", PATIENCE, || {
        answer_within(addr, "/healthz", Duration::from_secs(1)).is_some()
    });
    let before = Usage::of(daemon.pid());

    // Half of them send 300 KB of head (what hyper would otherwise buffer), half 2 KB, then
    // nothing more.
    let started = Instant::now();
    let attackers: Vec<TcpStream> = (0..400)
        .map(|n| {
            let mut stream = TcpStream::connect(addr).unwrap();
            let padding = if n % 2 == 0 { 300 * 1024 } else { 2 * 1024 };
            let head = format!(
                "GET /api/status HTTP/1.1\r\nHost: localhost\r\nX-Padding: {}",
                "a".repeat(padding)
            );
            // The daemon may close a connection before it took it all.
            let _ = stream.write_all(head.as_bytes());
            stream
        })
        .collect();
    healthy(addr);
    let open = attackers
        .iter()
        .filter(|s| !closed_within(s, PATIENCE))
        .count();
    let took = started.elapsed();
    assert_eq!(open, 0, "every half-sent request was closed");
    assert!(took < PATIENCE, "closed within {took:?}");
    healthy(addr);
    let metrics = answer_within(addr, "/metrics", PATIENCE).unwrap().1;
    let refused = |reason: &str| {
        let line = format!("plumber_http_refused_total{{reason=\"{reason}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap())
    };
    assert_eq!(
        (refused("header-size"), refused("header-timeout")),
        (200, 200),
        "the long heads refused at once, the short ones at the header timeout"
    );
    let after = Usage::of(daemon.pid());
    let grew = after.peak_rss_kb.saturating_sub(before.rss_kb) / 1024;
    eprintln!(
        "daemon RSS: {} MB before, peak {} MB during 400 half-sent heads (closed after {took:?})",
        before.rss_kb / 1024,
        after.peak_rss_kb / 1024
    );
    // Before, with no limit below hyper's 400 KB and no timeout, it grew by about 80 MB.
    assert!(
        grew < 40,
        "the daemon grew by {grew} MB while 400 connections sent half a request"
    );
}

/// Event-stream clients that never read: 200 of them (half asking for gzip), then events of
/// 2 MB each (a status document of about 1,000 topologies). Before, every client was served,
/// each formatting its own copy of every event it had not read, and none was ever closed.
/// Now only `max_event_streams` are served (the rest get 503), what they have not read is
/// shared but for their own gzip window and output, each is closed once nothing moved for
/// the idle timeout, and `/healthz` answers throughout.
#[test]
fn event_streams_never_read_are_capped_closed_and_cost_little() {
    const STREAMS: usize = 16;
    const EVENT: usize = 2 * MB;
    let repo = common::one_topology();
    let harness = Harness::start(&repo.location(), |config| {
        config.listener.max_event_streams = STREAMS;
        config.listener.idle_timeout = Duration::from_secs(2);
    });
    let addr = harness.daemon.listening;
    let metrics = &harness.context().store.metrics.listener;
    healthy(addr);
    let baseline = HEAP.current_usage();
    HEAP.reset_peak_usage();

    let clients: Vec<(TcpStream, u16)> = (0..200)
        .map(|n| {
            let gzip = if n % 2 == 0 {
                "Accept-Encoding: gzip\r\n"
            } else {
                ""
            };
            ask(
                addr,
                &format!("GET /api/events HTTP/1.1\r\nHost: localhost\r\n{gzip}\r\n"),
            )
        })
        .collect();
    let served = clients.iter().filter(|(_, status)| *status == 200).count();
    let refused = clients.iter().filter(|(_, status)| *status == 503).count();
    assert_eq!((served, refused), (STREAMS, 200 - STREAMS));
    assert_eq!(metrics.event_streams.get(), STREAMS as i64);

    // Letters that compress about as well as a status document with many numbers does not.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for n in 0..8 {
        let filler: String = (0..EVENT)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b'a' + (seed % 26) as u8)
            })
            .collect();
        harness
            .context()
            .events
            .publish("status", &serde_json::json!({ "n": n, "filler": filler }));
    }
    healthy(addr);
    wait_until("every stream nobody reads is closed", PATIENCE, || {
        metrics.event_streams.get() == 0
    });
    healthy(addr);
    let peak = HEAP.peak_usage().saturating_sub(baseline);
    eprintln!(
        "heap: {} MB before, {} MB more at the peak",
        baseline / MB,
        peak / MB
    );
    let open = clients
        .iter()
        .filter(|(_, status)| *status == 200)
        .filter(|(stream, _)| !closed_within(stream, PATIENCE))
        .count();
    assert_eq!(open, 0, "the daemon closed every stream nobody read");
    // 8 events of 2 MB in the channel (shared), and per served gzip client its window and
    // three events gzipped at most (about 50 MB in all); before, 200 clients grew it by 120 MB.
    assert!(
        peak < 80 * MB,
        "the heap grew by {} MB for {STREAMS} streams nobody reads",
        peak / MB
    );
    // A client that reads gets its stream.
    let (_, status) = ask(addr, "GET /api/events HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(status, 200);
}

/// `/healthz` is answered on the listener's own thread: the API's runtime stuck in a handler
/// (here: `/api/status` waiting for the status store, which the test holds) does not keep it
/// from answering. Before, health shared that runtime and waited with it. Health watches the
/// daemon's threads and names one that died.
#[test]
fn health_answers_while_the_api_is_stuck_and_names_a_thread_that_died() {
    let repo = common::one_topology();
    let harness = Harness::start(&repo.location(), |_| {});
    let addr = harness.daemon.listening;
    let context = harness.context().clone();
    wait_until("the topology's worker runs", PATIENCE, || {
        context.threads.running().contains(&"topology-t".to_owned())
    });
    for thread in ["follow", "observe", "plans", "api"] {
        assert!(
            context.threads.running().contains(&thread.to_owned()),
            "{thread} is watched: {:?}",
            context.threads.running()
        );
    }
    healthy(addr);

    let held = context.store.hold();
    let stuck = std::thread::spawn(move || answer_within(addr, "/api/status", PATIENCE));
    wait_until("the API's runtime is stuck", PATIENCE, || {
        answer_within(addr, "/api/plans", Duration::from_secs(1)).is_none()
    });
    healthy(addr);
    drop(held);
    assert_eq!(stuck.join().unwrap().map(|(status, _)| status), Some(200));

    let alive = context.threads.enter("injected", Kind::Essential);
    let died = std::thread::spawn(move || {
        let _alive = alive;
        panic!("a thread of the daemon dies (injected)");
    })
    .join();
    assert!(died.is_err());
    assert_eq!(
        answer_within(addr, "/healthz", Duration::from_secs(2)),
        Some((503, "dead threads: injected (panicked)\n".to_owned()))
    );
}

/// DNS rebinding: a page whose name resolves to 127.0.0.1 asks the loopback listener with its
/// own name as `Host`. Before, it was answered (so the page could read the plans). Now only
/// `localhost`, IP addresses and allowed names are; the webhook takes posts by any name.
#[test]
fn a_loopback_listener_answers_only_to_its_own_names() {
    let repo = common::one_topology();
    let harness = Harness::start(&repo.location(), |config| {
        config.listener.allowed_hosts = vec!["plumber.test".into()];
    });
    let addr = harness.daemon.listening;
    let port = addr.port();
    assert_eq!(
        get(addr, "/api/plans", &format!("evil.example:{port}")),
        403
    );
    assert_eq!(get(addr, "/", "evil.example"), 403);
    assert_eq!(get(addr, "/api/plans", "127.0.0.1.nip.io"), 403);
    assert_eq!(get(addr, "/api/plans", &format!("localhost:{port}")), 200);
    assert_eq!(get(addr, "/api/plans", &format!("127.0.0.1:{port}")), 200);
    assert_eq!(get(addr, "/api/plans", &format!("[::1]:{port}")), 200);
    assert_eq!(get(addr, "/api/plans", "plumber.test"), 200);
    let (_, hook) = ask(
        addr,
        "POST /hooks/git HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\n\
         Connection: close\r\n\r\n{}",
    );
    assert_eq!(hook, 202, "the webhook is not checked");
    let refused = harness
        .context()
        .store
        .metrics
        .listener
        .refused
        .get_or_create(&plumber::daemon::listener::ReasonLabel {
            reason: "host".into(),
        })
        .get();
    assert_eq!(refused, 3);
}

/// Connections past the maximum are answered 503 and closed, but `/healthz` still answers on
/// them, so a probe gets through a daemon whose connections a stranger holds. Before, there
/// was no maximum.
#[test]
fn connections_past_the_maximum_are_turned_away_but_health_answers() {
    let repo = common::one_topology();
    let harness = Harness::start(&repo.location(), |config| {
        config.listener.max_connections = 8;
        config.listener.header_timeout = Duration::from_secs(60);
    });
    let addr = harness.daemon.listening;
    let metrics = &harness.context().store.metrics.listener;
    let held: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    wait_until("the daemon holds 8 connections", PATIENCE, || {
        metrics.connections.get() == 8
    });
    let (turned, status) = ask(addr, "GET /api/status HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(status, 503);
    assert!(
        closed_within(&turned, PATIENCE),
        "a connection past the maximum is closed after its answer"
    );
    healthy(addr);
    drop(held);
    wait_until("the held connections are gone", PATIENCE, || {
        metrics.connections.get() == 0
    });
    assert_eq!(get(addr, "/api/status", "localhost"), 200);
}

/// A webhook's body is bounded in size and in time: a stranger cannot make the daemon hold a
/// large body, nor one that never ends.
#[test]
fn webhook_bodies_over_the_limit_or_too_slow_are_refused() {
    let repo = common::one_topology();
    let harness = Harness::start(&repo.location(), |config| {
        config.listener.max_webhook_body = 64 * 1024;
        config.listener.header_timeout = Duration::from_secs(1);
    });
    let addr = harness.daemon.listening;
    let (_, declared) = ask(
        addr,
        "POST /hooks/git HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000\r\n\r\n",
    );
    assert_eq!(declared, 413);
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /hooks/git HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    let chunk = "a".repeat(16 * 1024);
    // The daemon may answer and close before it took every chunk.
    let mut refused = false;
    for _ in 0..8 {
        if write!(stream, "{:x}\r\n{chunk}\r\n", chunk.len()).is_err() {
            refused = true;
            break;
        }
    }
    if !refused {
        refused = stream.write_all(b"0\r\n\r\n").is_err();
    }
    let mut answer = String::new();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let _ = stream.read_to_string(&mut answer);
    assert!(
        refused || answer.starts_with("HTTP/1.1 413"),
        "a chunked body over the limit: {answer}"
    );
    let (_, slow) = ask(
        addr,
        "POST /hooks/git HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"ref\":",
    );
    assert_eq!(
        slow, 408,
        "a body that does not arrive within the header timeout"
    );
    healthy(addr);
}
