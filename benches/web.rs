//! What the web page (SPEC §10) costs: the `plumber up` daemon's idle CPU and RSS with 10
//! topologies running and a trickle of records flowing, with no page open (the baseline, in
//! the same run), with the page open in headless Chromium on the overview, and on a
//! topology's DAG; the status events a client of `/api/events` receives; and the page's cold
//! and warm load (time, requests, bytes transferred and decoded).
//!
//! `bash bench/web.sh` builds the release binaries and writes `bench/results/web.md`. Knobs:
//! BENCH_TOPOLOGIES (10), BENCH_RATE (records/s per source, 5), BENCH_WINDOW (seconds per
//! measurement, 45), BENCH_ROUNDS (3), BENCH_LOADS (page loads of each kind, 5), BENCH_OUT,
//! PLUMBER_TEST_BOOTSTRAP (a real cluster instead of tansu), PLUMBER_CHROMIUM,
//! PLUMBER_CHROMEDRIVER.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails loudly

use std::fmt::Write as _;
use std::io::{BufRead as _, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use git2::{Repository, RepositoryInitOptions, Signature};
use plumber_testkit::browser::{Browser, BrowserOptions};
use plumber_testkit::{Broker, Process, Usage, free_port, unique, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(300);

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

fn range(values: &[f64]) -> (f64, f64) {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// `median [min–max]` with `decimals` digits.
fn summary(values: &[f64], decimals: usize) -> String {
    let (min, max) = range(values);
    format!("{:.d$} [{min:.d$}–{max:.d$}]", median(values), d = decimals)
}

/// target/release, where `bench/web.sh` built `plumber` and `plumber-processor`.
fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
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
    git.commit(Some("HEAD"), &signature, &signature, message, &tree, &[])
        .unwrap()
        .to_string()
}

/// Topology `n`: source → clean (jq) → fast (sql on even topologies, jq on odd ones) → out,
/// and clean → cleaned: five steps, two processors, own topics.
fn topology_files(n: usize, run: &str) -> Vec<(String, String)> {
    let dir = format!("topologies/t{n:02}");
    let second = if n.is_multiple_of(2) {
        "sql: SELECT vehicle, speed, platform FROM clean WHERE speed > 20\n".to_owned()
    } else {
        "jq: 'select(.speed > 20) | .fast = true'\n".to_owned()
    };
    vec![
        (
            format!("{dir}/topology.yaml"),
            format!("description: Bench topology {n}.\nowner: bench\n"),
        ),
        (
            format!("{dir}/sources/in.yaml"),
            format!("kind: source\ntopic: {run}-in-{n:02}\n"),
        ),
        (
            format!("{dir}/steps/clean.yaml"),
            "kind: processor\ninput: in\n\
             jq: 'select(.user != null) | {user, vehicle, speed, platform: (.platform | ascii_downcase)}'\n"
                .to_owned(),
        ),
        (
            format!("{dir}/steps/fast.yaml"),
            format!("kind: processor\ninput: clean\n{second}"),
        ),
        (
            format!("{dir}/sinks/out.yaml"),
            format!("kind: sink\ntopic: {run}-out-{n:02}\ninput: fast\n"),
        ),
        (
            format!("{dir}/sinks/cleaned.yaml"),
            format!("kind: sink\ntopic: {run}-cleaned-{n:02}\ninput: clean\n"),
        ),
    ]
}

const STEPS_PER_TOPOLOGY: usize = 5;

fn status(api: &str) -> Option<Value> {
    ureq::get(&format!("{api}/api/status"))
        .call()
        .ok()?
        .body_mut()
        .read_json()
        .ok()
}

/// Every topology runs its commit, idle, every step running.
fn all_idle(status: &Value, topologies: usize, commit: &str) -> bool {
    let Some(list) = status["topologies"].as_array() else {
        return false;
    };
    list.len() == topologies
        && list.iter().all(|t| {
            t["commit"] == commit
                && t["phase"] == "idle"
                && t["steps"].as_array().is_some_and(|steps| {
                    steps.len() == STEPS_PER_TOPOLOGY
                        && steps.iter().all(|s| {
                            ["external", "running"].contains(&s["state"].as_str().unwrap_or(""))
                        })
                })
        })
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

/// CPU seconds of `root` and all its descendants (chromedriver → chromium's processes).
fn tree_cpu_seconds(root: u32) -> f64 {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // ppid, and utime + stime in clock ticks (fields 4, 14 and 15 of proc(5)).
        parents.push((pid, field(1) as u32, field(11) + field(12)));
    }
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let mut tree = vec![root];
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, ppid, _) in &parents {
            if tree.contains(ppid) && !tree.contains(pid) {
                tree.push(*pid);
                grew = true;
            }
        }
    }
    parents
        .iter()
        .filter(|(pid, _, _)| tree.contains(pid))
        .map(|(_, _, cpu)| cpu / ticks)
        .sum()
}

/// Runs at the start of every document the browser opens: notes when the page is live with
/// every topology (`TOPOLOGIES`, replaced) in the DOM, at the next frame, and
/// any Content-Security-Policy violation (a request the page tried to make elsewhere).
const PROBE: &str = r#"
(() => {
  const bench = { dom: null, live: null, csp: [] };
  window.__bench = bench;
  document.addEventListener('securitypolicyviolation',
    (e) => bench.csp.push(`${e.violatedDirective} ${e.blockedURI}`));
  const wanted = () => document.querySelector('[data-connection="live"]')
    && document.querySelectorAll('[data-topology]').length >= TOPOLOGIES;
  const observer = new MutationObserver(() => {
    if (bench.dom === null && wanted()) {
      bench.dom = performance.now();
      observer.disconnect();
      requestAnimationFrame(() => { bench.live = performance.now(); });
    }
  });
  observer.observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
})();
"#;

/// Chromium on `profile`, logging every request it makes (for the check that none leaves the
/// listener), with [`PROBE`] in every document it opens.
fn start_browser(profile: &Path, topologies: usize) -> Browser {
    let browser = BrowserOptions::new(PATIENCE)
        .poll(Duration::from_millis(100))
        .profile(profile)
        .capability("goog:loggingPrefs", json!({"performance": "ALL"}))
        .start();
    browser.cdp(
        "Page.addScriptToEvaluateOnNewDocument",
        json!({ "source": PROBE.replace("TOPOLOGIES", &topologies.to_string()) }),
    );
    browser
}

/// What the benchmark asks of the browser besides loading a page and waiting on it.
trait BenchBrowser {
    /// A Chrome DevTools Protocol command, through chromedriver.
    fn cdp(&self, cmd: &str, params: Value) -> Value;
    /// The URL of every request the browser sent since the last call.
    fn requests(&self) -> Vec<String>;
    /// Opens the overview and waits until it is live with `topologies` rows.
    fn open_overview(&self, api: &str, topologies: usize);
    /// Switches to a topology's page (no reload) and waits until its DAG is drawn.
    fn open_topology(&self, name: &str, steps: usize);
    fn cpu_seconds(&self) -> f64;
}

impl BenchBrowser for Browser {
    fn cdp(&self, cmd: &str, params: Value) -> Value {
        ureq::post(&format!(
            "{}/session/{}/goog/cdp/execute",
            self.driver_url(),
            self.session_id()
        ))
        .send_json(json!({ "cmd": cmd, "params": params }))
        .unwrap_or_else(|e| panic!("CDP {cmd}: {e}"))
        .body_mut()
        .read_json()
        .unwrap()
    }

    fn requests(&self) -> Vec<String> {
        let log: Value = ureq::post(&format!(
            "{}/session/{}/se/log",
            self.driver_url(),
            self.session_id()
        ))
        .send_json(json!({ "type": "performance" }))
        .expect("chromedriver's performance log")
        .body_mut()
        .read_json()
        .unwrap();
        log["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|entry| serde_json::from_str::<Value>(entry["message"].as_str()?).ok())
            .filter(|m| m["message"]["method"] == "Network.requestWillBeSent")
            .filter_map(|m| {
                m["message"]["params"]["request"]["url"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    fn open_overview(&self, api: &str, topologies: usize) {
        self.goto(&format!("{api}/"));
        self.wait_for(
            "the overview is live with every topology",
            "document.querySelector('[data-connection]')?.dataset.connection === 'live' \
             && document.querySelectorAll('[data-topology]').length",
            |v| v.as_u64() == Some(topologies as u64),
        );
    }

    fn open_topology(&self, name: &str, steps: usize) {
        self.script(&format!(
            "location.hash = '#/topology/{name}'; return null;"
        ));
        self.wait_for(
            &format!("the DAG of {name} is drawn"),
            "document.querySelectorAll('svg [data-step]').length",
            |v| v.as_u64() == Some(steps as u64),
        );
    }

    fn cpu_seconds(&self) -> f64 {
        tree_cpu_seconds(self.driver_pid())
    }
}

/// A client of `/api/events` (plain, or asking for gzip as browsers do), counting what it
/// receives.
struct EventCounter {
    stop: Arc<AtomicBool>,
    reader: std::thread::JoinHandle<Vec<(Instant, String, usize)>>,
}

/// Counts the bytes read through it: what came over the wire, before any decoding.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicUsize>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n, Ordering::SeqCst);
        Ok(n)
    }
}

impl EventCounter {
    fn connect(api: &str, gzip: bool) -> EventCounter {
        let mut request =
            ureq::get(&format!("{api}/api/events")).header("Accept", "text/event-stream");
        if gzip {
            request = request.header("Accept-Encoding", "gzip");
        }
        let response = request
            .config()
            .timeout_global(None)
            .timeout_recv_body(Some(PATIENCE))
            .build()
            .call()
            .unwrap();
        assert_eq!(
            response.headers().contains_key("content-encoding"),
            gzip,
            "gzip only when asked for"
        );
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let wire = Arc::new(AtomicUsize::new(0));
                let body = Counting {
                    inner: response.into_body().into_reader(),
                    read: wire.clone(),
                };
                let body: Box<dyn Read> = if gzip {
                    Box::new(flate2::read::GzDecoder::new(body))
                } else {
                    Box::new(body)
                };
                let mut lines = std::io::BufReader::new(body).lines();
                // (when, kind, bytes on the wire since the event before)
                let mut events = Vec::new();
                let (mut kind, mut counted) = (String::new(), 0usize);
                while !stop.load(Ordering::SeqCst) {
                    let Some(Ok(line)) = lines.next() else { break };
                    if line.is_empty() {
                        if !kind.is_empty() {
                            let now = wire.load(Ordering::SeqCst);
                            events.push((Instant::now(), std::mem::take(&mut kind), now - counted));
                            counted = now;
                        }
                    } else if let Some(value) = line.strip_prefix("event:") {
                        kind = value.trim().to_owned();
                    }
                }
                events
            })
        };
        EventCounter { stop, reader }
    }

    /// The events received between `from` and `to`.
    fn finish(self, from: Instant, to: Instant) -> Vec<(String, usize)> {
        self.stop.store(true, Ordering::SeqCst);
        // The next status event (every 500 ms while lag and rates change) ends the read.
        self.reader
            .join()
            .unwrap()
            .into_iter()
            .filter(|(at, _, _)| *at >= from && *at <= to)
            .map(|(_, kind, bytes)| (kind, bytes))
            .collect()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Condition {
    Baseline,
    Overview,
    Topology,
    Events,
    GzipEvents,
}

impl Condition {
    const ALL: [Condition; 5] = [
        Condition::Baseline,
        Condition::Overview,
        Condition::Topology,
        Condition::Events,
        Condition::GzipEvents,
    ];

    fn label(self) -> &'static str {
        match self {
            Condition::Baseline => "(a) baseline: no page open",
            Condition::Overview => "(b) page open on the overview",
            Condition::Topology => "(c) page open on a topology (DAG)",
            Condition::Events => "(d) one plain client of /api/events",
            Condition::GzipEvents => "(e) one client of /api/events asking for gzip",
        }
    }
}

#[derive(Default)]
struct Idle {
    cpu: Vec<f64>,
    rss: Vec<f64>,
    browser_cpu: Vec<f64>,
    status_per_min: Vec<f64>,
    kb_per_min: Vec<f64>,
    bytes_per_status: Vec<f64>,
}

/// One page load, from the browser's own timing.
struct Load {
    response_end: f64,
    dom_content_loaded: f64,
    load_event: f64,
    live: f64,
    requests: usize,
    network_requests: usize,
    transfer: f64,
    encoded: f64,
    decoded: f64,
    /// Requests in Chromium's network log (the event stream included).
    logged: usize,
    outside: Vec<String>,
    resources: Vec<(String, f64, f64, f64)>,
}

/// Loads `/` in `browser` (whose profile is fresh or warm) and reads its timing.
fn load_page(browser: &Browser, api: &str, topologies: usize) -> Load {
    browser.requests(); // empties the log of the session's own start
    browser.goto(&format!("{api}/"));
    browser.wait_for(
        "the page is live with every topology",
        "window.__bench && window.__bench.live !== null \
         && document.querySelectorAll('[data-topology]').length",
        |v| v.as_u64() == Some(topologies as u64),
    );
    let timing = browser.script(
        "const nav = performance.getEntriesByType('navigation')[0];
         const entry = (r) => ({ name: r.name, transfer: r.transferSize, encoded: r.encodedBodySize,
                                 decoded: r.decodedBodySize });
         return { responseEnd: nav.responseEnd, dcl: nav.domContentLoadedEventEnd,
                  load: nav.loadEventEnd, live: window.__bench.live, dom: window.__bench.dom,
                  csp: window.__bench.csp,
                  entries: [entry(nav), ...performance.getEntriesByType('resource').map(entry)] };",
    );
    let urls = browser.requests();
    let origin = format!("{api}/");
    let mut outside: Vec<String> = urls
        .iter()
        .filter(|u| !u.starts_with(&origin) && !u.starts_with("data:"))
        .cloned()
        .collect();
    outside.extend(
        timing["csp"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| format!("CSP: {v}")),
    );
    let number = |v: &Value| v.as_f64().unwrap_or(0.0);
    let resources: Vec<(String, f64, f64, f64)> = timing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or("").replacen(&origin, "/", 1);
            (
                name,
                number(&e["transfer"]),
                number(&e["encoded"]),
                number(&e["decoded"]),
            )
        })
        .collect();
    Load {
        response_end: number(&timing["responseEnd"]),
        dom_content_loaded: number(&timing["dcl"]),
        load_event: number(&timing["load"]),
        live: number(&timing["live"]),
        requests: resources.len(),
        network_requests: resources.iter().filter(|r| r.1 > 0.0).count(),
        transfer: resources.iter().map(|r| r.1).sum(),
        encoded: resources.iter().map(|r| r.2).sum(),
        decoded: resources.iter().map(|r| r.3).sum(),
        logged: urls.len(),
        outside,
        resources,
    }
}

fn main() {
    let topologies = knob("BENCH_TOPOLOGIES", 10) as usize;
    let rate = knob("BENCH_RATE", 5);
    let window = Duration::from_secs(knob("BENCH_WINDOW", 45));
    let rounds = knob("BENCH_ROUNDS", 3) as usize;
    let loads = knob("BENCH_LOADS", 5) as usize;
    let out =
        PathBuf::from(std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/web.md".into()));
    let bench_started = Instant::now();
    let plumber = release_dir().join("plumber");
    let processor = release_dir().join("plumber-processor");
    assert!(
        plumber.is_file() && processor.is_file(),
        "build the release binaries first: bash bench/web.sh"
    );

    let broker = Broker::start();
    let work = tempfile::tempdir().unwrap();
    let git = Repository::init_opts(
        work.path().join("repo"),
        RepositoryInitOptions::new().initial_head("main"),
    )
    .unwrap();
    let run = unique("web");
    let mut files = vec![(
        "plumber.yaml".to_owned(),
        "defaults:\n  partitions: 1\n  scale: { min: 1, max: 1, lagThreshold: 100 }\n".to_owned(),
    )];
    for n in 0..topologies {
        files.extend(topology_files(n, &run));
    }
    let head = commit(&git, &format!("{topologies} topologies"), &files);
    let repo = work.path().join("repo");
    let topics = Command::new(&plumber)
        .arg("dev")
        .arg("topics")
        .arg(&repo)
        .args(["--bootstrap", broker.bootstrap(), "--partitions", "1"])
        .status()
        .unwrap();
    assert!(topics.success(), "plumber dev topics failed");

    // The trickle: `rate` records per second into every source, for the whole run.
    let mut load = Command::new(&plumber);
    load.args(["dev", "load", "--bootstrap", broker.bootstrap()])
        .args(["--rate", &rate.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for n in 0..topologies {
        load.args(["--topic", &format!("{run}-in-{n:02}")]);
    }
    let _load = Process::spawn("plumber dev load", &mut load);

    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let log = work.path().join("daemon.log");
    eprintln!("daemon log: {}", log.display());
    let mut command = Command::new(&plumber);
    command
        .arg("up")
        .arg(&repo)
        .args(["--branch", "main", "--bootstrap", broker.bootstrap()])
        .arg("--state-dir")
        .arg(work.path().join("state"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("PLUMBER_PROCESSOR", &processor)
        .env("RUST_LOG", "info,librdkafka=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if broker.is_tansu() {
        command.arg("--keep-topics");
        command.env("PLUMBER_ASSIGNOR", "eager");
    }
    let daemon = Daemon(Process::spawn("plumber up", &mut command));
    let pid = daemon.0.pid();
    let deployed = Instant::now();
    wait_until("every topology runs, idle", PATIENCE, || {
        status(&api).is_some_and(|s| all_idle(&s, topologies, &head))
    });
    let deploy_secs = deployed.elapsed().as_secs_f64();
    eprintln!("{topologies} topologies idle after {deploy_secs:.0} s; warming up");
    std::thread::sleep(Duration::from_secs(15));
    let status_bytes = ureq::get(&format!("{api}/api/status"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap()
        .len();

    // Idle windows, the conditions interleaved in every round so that the other load on the
    // machine falls on all of them alike.
    let mut idle: Vec<Idle> = Condition::ALL.iter().map(|_| Idle::default()).collect();
    for round in 0..rounds {
        for (c, condition) in Condition::ALL.iter().enumerate() {
            let profile = tempfile::tempdir().unwrap();
            let browser = match condition {
                Condition::Overview | Condition::Topology => {
                    let browser = start_browser(profile.path(), topologies);
                    browser.open_overview(&api, topologies);
                    if *condition == Condition::Topology {
                        browser.open_topology("t00", STEPS_PER_TOPOLOGY);
                    }
                    Some(browser)
                }
                _ => None,
            };
            let counter = matches!(condition, Condition::Events | Condition::GzipEvents)
                .then(|| EventCounter::connect(&api, *condition == Condition::GzipEvents));
            // Let the page's first load settle out of the window.
            std::thread::sleep(Duration::from_secs(5));
            let (before, browser_before, from) = (
                Usage::of(pid),
                browser.as_ref().map(BenchBrowser::cpu_seconds),
                Instant::now(),
            );
            std::thread::sleep(window);
            let (after, browser_after, to) = (
                Usage::of(pid),
                browser.as_ref().map(BenchBrowser::cpu_seconds),
                Instant::now(),
            );
            let secs = (to - from).as_secs_f64();
            let measured = &mut idle[c];
            measured
                .cpu
                .push((after.cpu_seconds - before.cpu_seconds) / secs * 100.0);
            measured.rss.push(after.rss_kb as f64 / 1024.0);
            if let (Some(b), Some(a)) = (browser_before, browser_after) {
                measured.browser_cpu.push((a - b) / secs * 100.0);
            }
            if let Some(counter) = counter {
                let events = counter.finish(from, to);
                let statuses: Vec<usize> = events
                    .iter()
                    .filter(|(kind, _)| kind == "status")
                    .map(|(_, bytes)| *bytes)
                    .collect();
                let bytes: usize = events.iter().map(|(_, b)| b).sum();
                measured
                    .status_per_min
                    .push(statuses.len() as f64 * 60.0 / secs);
                measured
                    .kb_per_min
                    .push(bytes as f64 / 1024.0 * 60.0 / secs);
                measured
                    .bytes_per_status
                    .push(statuses.iter().sum::<usize>() as f64 / statuses.len().max(1) as f64);
            }
            eprintln!(
                "round {round}, {}: daemon {:.2} % CPU, {:.1} MB",
                condition.label(),
                measured.cpu.last().unwrap(),
                measured.rss.last().unwrap()
            );
            drop(browser);
        }
    }

    // Page loads: a fresh profile (nothing cached), then the same profile again.
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for n in 0..loads {
        let profile = tempfile::tempdir().unwrap();
        {
            let browser = start_browser(profile.path(), topologies);
            cold.push(load_page(&browser, &api, topologies));
        }
        {
            let browser = start_browser(profile.path(), topologies);
            warm.push(load_page(&browser, &api, topologies));
        }
        eprintln!(
            "load {n}: cold {:.0} ms to live, {:.0} B; warm {:.0} ms, {:.0} B",
            cold[n].live, cold[n].transfer, warm[n].live, warm[n].transfer
        );
    }
    let final_status = status(&api).unwrap_or(Value::Null);
    let still_idle = all_idle(&final_status, topologies, &head);
    drop(daemon);
    let total_secs = bench_started.elapsed().as_secs_f64();

    // The report.
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
    let kind = if broker.is_tansu() {
        "tansu 0.6 (SQLite storage)"
    } else {
        "the PLUMBER_TEST_BOOTSTRAP cluster"
    };
    let mut r = String::new();
    writeln!(r, "# The web page's cost\n").unwrap();
    writeln!(
        r,
        "{date}, {cores} cores, commit {commit_id}{}, broker: {kind}. Rerun: `bash bench/web.sh` \
         (knobs: BENCH_TOPOLOGIES, BENCH_RATE, BENCH_WINDOW, BENCH_ROUNDS, BENCH_LOADS). \
         The whole run took {:.0} s.\n",
        if dirty { " (with local changes)" } else { "" },
        total_secs
    )
    .unwrap();
    writeln!(
        r,
        "Setup: `plumber up` (release build, `--keep-topics`, `PLUMBER_ASSIGNOR=eager`) on a \
         local git repository of {topologies} topologies (source → `clean` (jq) → `fast` (SQL \
         on even ones, jq on odd ones) → sink, and `clean` → a second sink: {} steps and {} \
         processors in all), `plumber dev load` writing {rate} records/s into each source \
         throughout, so lag and records/s change at every look. All ran idle {:.0} s after \
         start; the status document was {:.1} KB. Headless Chromium (Debian's), \
         1280×900.\n",
        topologies * STEPS_PER_TOPOLOGY,
        topologies * 2,
        deploy_secs,
        status_bytes as f64 / 1024.0
    )
    .unwrap();

    writeln!(r, "## The daemon while idle\n").unwrap();
    writeln!(
        r,
        "CPU (% of one core) and RSS of the `plumber up` process alone (not its processors, \
         not the broker, not the browser), over {} s windows, {rounds} rounds with the \
         conditions interleaved in each; the browser opened the page 5 s before each window. \
         Median [range]; the ratio is of the medians, to (a).\n",
        window.as_secs()
    )
    .unwrap();
    writeln!(
        r,
        "| condition | daemon CPU % | ratio | daemon RSS MB | ratio | browser CPU % |"
    )
    .unwrap();
    writeln!(r, "|---|---:|---:|---:|---:|---:|").unwrap();
    let base_cpu = median(&idle[0].cpu);
    let base_rss = median(&idle[0].rss);
    for (c, condition) in Condition::ALL.iter().enumerate() {
        let m = &idle[c];
        let browser = if m.browser_cpu.is_empty() {
            "–".to_owned()
        } else {
            summary(&m.browser_cpu, 1)
        };
        writeln!(
            r,
            "| {} | {} | {:.2}× | {} | {:.2}× | {browser} |",
            condition.label(),
            summary(&m.cpu, 2),
            median(&m.cpu) / base_cpu.max(0.001),
            summary(&m.rss, 1),
            median(&m.rss) / base_rss.max(0.001),
        )
        .unwrap();
    }
    let (plain, gzipped) = (&idle[3], &idle[4]);
    writeln!(
        r,
        "\nWhat a client of `/api/events` receives (the stream the page reads), median \
         [range]; a browser asks for gzip, as (e) does:\n\n\
         | | status events per minute (at most 120) | bytes on the wire per status event | \
         KB per minute in all |\n|---|---:|---:|---:|\n\
         | (d) plain | {} | {} | {} |\n\
         | (e) gzip (one deflate window over the stream, flushed per event) | {} | {} | {} |\n\
         | ratio (e)/(d) | | {:.3}× | {:.3}× |\n",
        summary(&plain.status_per_min, 0),
        summary(&plain.bytes_per_status, 0),
        summary(&plain.kb_per_min, 0),
        summary(&gzipped.status_per_min, 0),
        summary(&gzipped.bytes_per_status, 0),
        summary(&gzipped.kb_per_min, 1),
        median(&gzipped.bytes_per_status) / median(&plain.bytes_per_status).max(1.0),
        median(&gzipped.kb_per_min) / median(&plain.kb_per_min).max(0.001),
    )
    .unwrap();

    writeln!(r, "## Page load\n").unwrap();
    writeln!(
        r,
        "`/` until the page says live with all {topologies} topologies in the overview (at the \
         next frame), {loads} loads of each kind. *Cold*: a fresh profile, nothing cached. \
         *Warm*: a new browser on the same profile (the assets in its disk cache). Times in \
         ms from the navigation's start (Navigation Timing); bytes from Resource Timing, \
         summed over the document and every resource (`transferSize`: on the wire, headers \
         included, 0 when cached; `encodedBodySize`: the body as sent, gzip for the assets; \
         `decodedBodySize`: after decompression). The event stream's bytes are not in \
         these sums (its entry appears only when it ends): see above. Median [range].\n"
    )
    .unwrap();
    writeln!(r, "| | cold | warm | ratio warm/cold |").unwrap();
    writeln!(r, "|---|---:|---:|---:|").unwrap();
    type Pick = fn(&Load) -> f64;
    let rows: [(&str, Pick, usize); 10] = [
        ("document received (responseEnd), ms", |l| l.response_end, 0),
        ("DOMContentLoaded, ms", |l| l.dom_content_loaded, 0),
        ("load event, ms", |l| l.load_event, 0),
        ("live with every topology drawn, ms", |l| l.live, 0),
        ("requests (document + resources)", |l| l.requests as f64, 0),
        (
            "… of them over the network (transferSize > 0)",
            |l| l.network_requests as f64,
            0,
        ),
        (
            "requests in Chromium's network log (with the event stream)",
            |l| l.logged as f64,
            0,
        ),
        ("transferred (transferSize), KB", |l| l.transfer / 1024.0, 1),
        (
            "bodies as sent (encodedBodySize), KB",
            |l| l.encoded / 1024.0,
            1,
        ),
        (
            "bodies decoded (decodedBodySize), KB",
            |l| l.decoded / 1024.0,
            1,
        ),
    ];
    for (label, pick, decimals) in rows {
        let c: Vec<f64> = cold.iter().map(pick).collect();
        let w: Vec<f64> = warm.iter().map(pick).collect();
        writeln!(
            r,
            "| {label} | {} | {} | {:.2} |",
            summary(&c, decimals),
            summary(&w, decimals),
            median(&w) / median(&c).max(0.001)
        )
        .unwrap();
    }
    writeln!(
        r,
        "\nPer resource, the first cold load and the first warm load (bytes: transferred / \
         as sent / decoded):\n"
    )
    .unwrap();
    writeln!(r, "| resource | cold | warm |").unwrap();
    writeln!(r, "|---|---:|---:|").unwrap();
    for (n, (name, t, e, d)) in cold[0].resources.iter().enumerate() {
        let warm_cell = warm[0]
            .resources
            .iter()
            .find(|w| w.0 == *name)
            .or_else(|| warm[0].resources.get(n))
            .map(|(_, t, e, d)| format!("{t:.0} / {e:.0} / {d:.0}"))
            .unwrap_or_default();
        writeln!(r, "| `{name}` | {t:.0} / {e:.0} / {d:.0} | {warm_cell} |").unwrap();
    }
    let outside: Vec<&String> = cold.iter().chain(&warm).flat_map(|l| &l.outside).collect();
    writeln!(
        r,
        "\nRequests outside the daemon's listener (Chromium's network log of every load, and \
         Content-Security-Policy violations): {}.",
        if outside.is_empty() {
            "none".to_owned()
        } else {
            format!("{outside:?}")
        }
    )
    .unwrap();
    if !still_idle {
        writeln!(
            r,
            "\nNote: at the end of the run not every topology was idle with every step running \
             (see the daemon log with BENCH_KEEP)."
        )
        .unwrap();
    }
    writeln!(r, "\n## Reading\n\n(written by hand after the run)").unwrap();

    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, &r).unwrap();
    println!("{r}");
    eprintln!("written to {}", out.display());
    if std::env::var_os("BENCH_KEEP").is_some() {
        eprintln!("keeping {} (BENCH_KEEP)", work.path().display());
        let _ = work.keep();
    }
}
