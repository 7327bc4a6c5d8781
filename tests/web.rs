//! The web page (SPEC §10) in a real browser: Debian's `chromium`, headless, driven over
//! WebDriver (`chromedriver`, through fantoccini), against `plumber up` running the example
//! repository on a broker (tansu unless `PLUMBER_TEST_BOOTSTRAP` names another), with real
//! processors and a real git repository.
//!
//! What it checks, in one page load (a marker set in the page at the start must survive, so
//! nothing below reloads it): every topology and step shows; a commit that replaces a step
//! and adds one whose source topic does not exist yet shows the cutover action by action,
//! waiting for that topic, then (the topic created) finishing with the new history entry; a
//! broken commit shows its error with file and line; a restarted daemon is reconnected to.
//!
//! Screenshots (the overview, a topology, its cutover, the overview with an error) are
//! written to `PLUMBER_WEB_SCREENSHOTS` (a directory; `docs/` for the README) when it is set.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestRepo, processor_binary, write};
use plumber_testkit::browser::Browser;
use plumber_testkit::browser::fantoccini::key::Key;
use plumber_testkit::{Broker, Process, TestRecord, free_port, unique};
use serde_json::{Value, json};

/// A cutover on a slow broker and a busy machine.
const PATIENCE: Duration = Duration::from_secs(180);

/// `plumber up` on the repository, as a process of its own.
struct Daemon {
    /// `None` once stopped.
    process: Option<Process>,
    api: String,
}

/// Stopped as a person stops it (SIGTERM), so it stops its processors: killed, it would leave
/// them running after the test.
impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(nix::sys::signal::Signal::SIGTERM);
            if process.wait_exit(PATIENCE).is_none() {
                eprintln!("plumber up did not stop within {PATIENCE:?}");
            }
        }
    }
}

impl Daemon {
    fn start(repo: &TestRepo, broker: &Broker, state: &Path, port: u16) -> Daemon {
        let log = state.join(format!("daemon-{}.log", unique("run")));
        eprintln!("daemon log: {}", log.display());
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .args(["up", &repo.location(), "--branch", "main"])
            .args(["--bootstrap", broker.bootstrap()])
            .arg("--state-dir")
            .arg(state.join("state"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--poll-interval", "1"])
            .env("PLUMBER_PROCESSOR", processor_binary())
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if broker.is_tansu() {
            command.arg("--keep-topics");
            command.env("PLUMBER_ASSIGNOR", "eager");
        }
        Daemon {
            process: Some(Process::spawn("plumber up", &mut command)),
            api: format!("http://127.0.0.1:{port}"),
        }
    }

    fn status(&self) -> Option<Value> {
        let mut response = ureq::get(&format!("{}/api/status", self.api)).call().ok()?;
        response.body_mut().read_json().ok()
    }

    /// The status once `condition` holds of it.
    fn wait_status(&self, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        while Instant::now() < deadline {
            if let Some(status) = self.status() {
                if condition(&status) {
                    return status;
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out waiting until {what}; last status: {last:#}");
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(nix::sys::signal::Signal::SIGTERM);
            assert!(
                process.wait_exit(Duration::from_secs(60)).is_some(),
                "plumber up stops on SIGTERM"
            );
        }
    }
}

fn topology<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["topologies"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .unwrap_or(&Value::Null)
}

/// What this test does in the page besides loading it and waiting on it.
trait PageActions {
    /// `(attribute value, text)` of every element matching `selector`.
    fn elements(&self, selector: &str, attribute: &str) -> Vec<(String, String)>;
    /// Presses `key` where the focus is, as a person at the keyboard does.
    fn press(&self, key: Key);
    /// The whole page at 1280 px wide (the window is made as tall as the page for it).
    fn screenshot(&self, file: &Path);
    fn resize(&self, width: u32, height: u32);
}

impl PageActions for Browser {
    fn elements(&self, selector: &str, attribute: &str) -> Vec<(String, String)> {
        let selector = serde_json::to_string(selector).unwrap();
        let attribute = serde_json::to_string(attribute).unwrap();
        let found = self.script(&format!(
            "return [...document.querySelectorAll({selector})]\
             .map(e => [e.getAttribute({attribute}) || '', e.textContent || '']);"
        ));
        serde_json::from_value(found).unwrap()
    }

    fn press(&self, key: Key) {
        self.block_on(async {
            let focused = self.client().active_element().await?;
            focused.send_keys(&key.to_string()).await
        })
        .unwrap();
    }

    fn screenshot(&self, file: &Path) {
        let height = self
            .script("return document.documentElement.scrollHeight;")
            .as_u64()
            .unwrap_or(900)
            .clamp(600, 4000);
        // The window's frame takes some of its height in headless Chromium too.
        self.resize(1280, height as u32 + 90);
        let png = self.block_on(self.client().screenshot()).unwrap();
        std::fs::write(file, png).unwrap();
        self.resize(1280, 900);
    }

    fn resize(&self, width: u32, height: u32) {
        self.block_on(self.client().set_window_size(width, height))
            .unwrap();
    }
}

fn step_names(topology: &Value) -> Vec<String> {
    topology["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_page_shows_the_example_live_through_a_cutover_a_broken_commit_and_a_restart() {
    let broker = Broker::start();
    let repo = TestRepo::new();
    let main = repo.commit_snapshot("main", "The example topologies", &common::example_files());
    let state = tempfile::tempdir().unwrap();
    let (code, out, err) = common::run(&[
        "dev",
        "topics",
        &repo.location(),
        "--bootstrap",
        broker.bootstrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let records: Vec<TestRecord> = (0..20)
        .map(|n| {
            TestRecord::new(
                &format!("v{n}"),
                &json!({"vehicle": format!("v{n}"), "speed": 5 * n, "ts": n}).to_string(),
            )
        })
        .collect();
    broker.produce("vehicles.telemetry", &records);

    let port = free_port();
    let mut daemon = Daemon::start(&repo, &broker, state.path(), port);
    let status = daemon.wait_status("both example topologies run the first commit", |s| {
        ["clicks", "vehicle-telemetry"].iter().all(|name| {
            let t = topology(s, name);
            t["commit"] == main.to_string().as_str()
                && t["phase"] == "idle"
                && t["steps"].as_array().is_some_and(|steps| {
                    !steps.is_empty()
                        && steps.iter().all(|s| {
                            ["external", "running"].contains(&s["state"].as_str().unwrap_or(""))
                        })
                })
        })
    });

    // Sample records keep flowing, as in `scripts/demo`, so records/s show.
    let _load = Process::spawn(
        "plumber dev load",
        Command::new(env!("CARGO_BIN_EXE_plumber"))
            .args(["dev", "load", "--bootstrap", broker.bootstrap()])
            .args(["--topic", "clicks.raw", "--topic", "vehicles.telemetry"])
            .args(["--rate", "20"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );

    let browser = Browser::start(PATIENCE);
    browser.goto(&format!("{}/", daemon.api));
    browser.wait_for(
        "the page is live",
        "document.querySelector('[data-connection]')?.dataset.connection",
        |v| v == "live",
    );
    browser.script("window.plumberTestMarker = 'not reloaded'; return null;");

    // Every topology on the overview.
    let rows = browser.wait_for(
        "every topology is listed",
        "[...document.querySelectorAll('[data-topology]')].map(e => e.dataset.topology)",
        |v| v.as_array().is_some_and(|a| a.len() >= 2),
    );
    assert_eq!(rows, json!(["clicks", "vehicle-telemetry"]));
    let screenshots = std::env::var_os("PLUMBER_WEB_SCREENSHOTS").map(PathBuf::from);
    if let Some(dir) = &screenshots {
        std::fs::create_dir_all(dir).unwrap();
        browser.screenshot(&dir.join("overview.png"));
    }

    // Every step of each topology, with its state as status says.
    for name in ["clicks", "vehicle-telemetry"] {
        browser.script(&format!(
            "location.hash = '#/topology/{name}'; return null;"
        ));
        let mut wanted = step_names(topology(&status, name));
        wanted.sort();
        assert!(wanted.len() >= 6, "{status:#}");
        browser.wait_for(
            &format!("every step of {name} is drawn"),
            "[...document.querySelectorAll('svg [data-step]')].map(e => e.dataset.step).sort()",
            |v| *v == json!(wanted),
        );
        for (state, text) in browser.elements("svg [data-step][data-kind=processor]", "data-state")
        {
            assert!(
                ["running", "starting"].contains(&state.as_str()),
                "a processor of {name} is {state}: {text}"
            );
            assert!(
                text.contains("replica"),
                "replicas on each processor: {text}"
            );
            assert!(text.contains("lag"), "lag on each processor: {text}");
            assert!(
                text.contains("rec/s"),
                "records/s on each processor: {text}"
            );
        }
    }
    // Records/s as the processors' own metrics count them.
    browser.wait_for(
        "moving shows the records it reads per second",
        "document.querySelector(\"svg [data-step='moving']\")?.textContent ?? ''",
        |v| {
            v.as_str()
                .and_then(|t| t.split(" rec/s").next())
                .and_then(|t| t.rsplit(' ').next())
                .and_then(|rate| rate.parse::<f64>().ok())
                .is_some_and(|rate| rate > 0.0)
        },
    );

    // From the keyboard: Tab reaches the `moving` step, Enter opens its details.
    let mut focused = Value::Null;
    for _ in 0..60 {
        browser.press(Key::Tab);
        focused = browser.script("return document.activeElement?.dataset?.step ?? null;");
        if focused == "moving" {
            break;
        }
    }
    assert_eq!(focused, "moving", "Tab reaches every step of the DAG");
    browser.press(Key::Enter);
    let group = topology(&status, "vehicle-telemetry")["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["name"] == "moving"))
        .map(|s| s["group"].as_str().unwrap().to_owned())
        .unwrap();
    browser.wait_for(
        "Enter shows the step's details: its group and dead-letter topic",
        "document.querySelector('aside.details')?.textContent ?? ''",
        |v| {
            v.as_str().is_some_and(|t| {
                t.contains(&group) && t.contains("plumber.vehicle-telemetry.moving.dlq")
            })
        },
    );

    browser.wait_for(
        "the first deployment is in the history",
        "[...document.querySelectorAll('[data-history]')].map(e => e.dataset.to)",
        |v| {
            v.as_array()
                .is_some_and(|a| a.contains(&json!(main.to_string())))
        },
    );
    if let Some(dir) = &screenshots {
        browser.screenshot(&dir.join("topology.png"));
    }

    // A commit that replaces `moving` and adds a step whose source topic does not exist yet:
    // the cutover waits for it, action by action on the page.
    let late = unique("vehicles-late");
    let late_out = unique("vehicles-late-out");
    broker.create_topic(&late_out, 1);
    let replaced = repo.commit(
        "main",
        "Only fast vehicles, and late readings",
        &[
            write(
                "topologies/vehicle-telemetry/steps/moving.yaml",
                "kind: processor\ninput: telemetry\njq: 'select(.speed > 20)'\n\
                 scale: { min: 1, max: 10, lagThreshold: 500 }\n",
            ),
            write(
                "topologies/vehicle-telemetry/sources/late.yaml",
                format!("kind: source\ntopic: {late}\n"),
            ),
            write(
                "topologies/vehicle-telemetry/steps/late-copy.yaml",
                "kind: processor\ninput: late\njq: '.'\n",
            ),
            write(
                "topologies/vehicle-telemetry/sinks/late-out.yaml",
                format!("kind: sink\ntopic: {late_out}\ninput: late-copy\n"),
            ),
        ],
    );
    let waiting = browser.wait_for(
        "the cutover waits for the missing topic, action by action",
        "[...document.querySelectorAll('[data-cutover] [data-action]')]\
         .map(e => [e.dataset.actionState, e.textContent])",
        |v| {
            v.as_array().is_some_and(|actions| {
                actions
                    .iter()
                    .any(|a| a[0] == "waiting" && a[1].as_str().is_some_and(|t| t.contains(&late)))
            })
        },
    );
    eprintln!("cutover actions on the page: {waiting:#}");
    browser.wait_for(
        "the new step is drawn during the move",
        "!!document.querySelector(\"svg [data-step='late-copy']\")",
        |v| v == true,
    );
    if let Some(dir) = &screenshots {
        browser.screenshot(&dir.join("cutover.png"));
    }
    broker.create_topic(&late, 1);
    browser.wait_for(
        "the cutover finishes and its history entry shows",
        "[!document.querySelector('[data-cutover]'), \
          [...document.querySelectorAll('[data-history]')].map(e => e.dataset.to)]",
        |v| {
            v[0] == true
                && v[1]
                    .as_array()
                    .is_some_and(|a| a.contains(&json!(replaced.to_string())))
        },
    );
    let history = browser.elements(&format!("[data-history][data-to='{replaced}']"), "data-to");
    assert!(
        history[0].1.contains("Only fast vehicles"),
        "the entry shows the commit's message: {history:?}"
    );

    // A broken commit: its error with file and line, on the overview too.
    let broken = repo.commit(
        "main",
        "A typo",
        &[write(
            "topologies/clicks/steps/normalize.yaml",
            "kind: processor\ninput: raw-clicks\njq: '.'\npartitons: 3\n",
        )],
    );
    browser.script("location.hash = '#/'; return null;");
    let error = browser.wait_for(
        "the broken commit's error shows with its file and line",
        "[...document.querySelectorAll('[data-error]')].map(e => e.textContent).join('\\n')",
        |v| {
            v.as_str()
                .is_some_and(|t| t.contains("topologies/clicks/steps/normalize.yaml:4"))
        },
    );
    assert!(error.as_str().unwrap().contains("partitons"), "{error}");
    if let Some(dir) = &screenshots {
        browser.screenshot(&dir.join("error.png"));
    }
    let status = daemon.status().unwrap();
    assert_eq!(status["lastError"]["commit"], broken.to_string().as_str());

    // The daemon goes away and comes back: the page reconnects by itself.
    daemon.stop();
    browser.wait_for(
        "the page says it lost the daemon",
        "document.querySelector('[data-connection]')?.dataset.connection",
        |v| v == "reconnecting",
    );
    let daemon = Daemon::start(&repo, &broker, state.path(), port);
    daemon.wait_status("the restarted daemon knows the broken head", |s| {
        s["lastError"]["commit"] == broken.to_string().as_str()
    });
    browser.wait_for(
        "the page is live again and shows the error again",
        "[document.querySelector('[data-connection]')?.dataset.connection, \
          [...document.querySelectorAll('[data-error]')].map(e => e.textContent).join('\\n')]",
        |v| {
            v[0] == "live"
                && v[1]
                    .as_str()
                    .is_some_and(|t| t.contains("normalize.yaml:4"))
        },
    );
    assert_eq!(
        browser.script("return window.plumberTestMarker ?? null;"),
        "not reloaded",
        "everything above happened without a reload"
    );
    let elsewhere = browser.script(&format!(
        "return performance.getEntriesByType('resource').map(e => e.name)\
         .filter(u => !u.startsWith({:?}) && !u.startsWith('data:'));",
        daemon.api
    ));
    assert_eq!(
        elsewhere,
        json!([]),
        "the page asks nothing of anyone but the daemon"
    );

    // At a phone's width the page still shows every topology.
    browser.resize(390, 844);
    browser.wait_for(
        "the overview at a phone's width",
        "document.querySelectorAll('[data-topology]').length",
        |v| v == 2,
    );
    drop(daemon);
}

/// One Server-Sent Event as read off the wire.
#[derive(Debug, Default, Clone)]
struct WireEvent {
    id: Option<u64>,
    kind: String,
    data: String,
    retry: Option<u64>,
}

/// Reads `/api/events`, event by event.
struct EventStream {
    lines: Box<dyn Iterator<Item = std::io::Result<String>>>,
}

impl EventStream {
    fn connect(api: &str) -> EventStream {
        EventStream::open(api, false)
    }

    /// Asking for gzip, as browsers do; the stream is decoded here as it arrives (an event
    /// the daemon did not flush whole would hang the read).
    fn connect_gzip(api: &str) -> EventStream {
        EventStream::open(api, true)
    }

    fn open(api: &str, gzip: bool) -> EventStream {
        use std::io::BufRead as _;
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
        let encoding = response
            .headers()
            .get("content-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(encoding.as_deref(), gzip.then_some("gzip"));
        let body = response.into_body().into_reader();
        let reader: Box<dyn std::io::Read> = if gzip {
            Box::new(flate2::read::GzDecoder::new(body))
        } else {
            Box::new(body)
        };
        EventStream {
            lines: Box::new(std::io::BufReader::new(reader).lines()),
        }
    }

    /// Reads what is left until the daemon ends the stream; an error if it did not end
    /// cleanly (for a gzipped stream: without the gzip trailer).
    fn read_to_end(&mut self) -> std::io::Result<()> {
        for line in self.lines.by_ref() {
            line?;
        }
        Ok(())
    }

    /// The next event; `None` when the daemon closed the stream.
    fn next(&mut self) -> Option<WireEvent> {
        let mut event = WireEvent::default();
        let mut any = false;
        for line in self.lines.by_ref() {
            let Ok(line) = line else { return None };
            if line.is_empty() {
                if any {
                    return Some(event);
                }
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            // A comment (the keep-alive) is no field.
            any |= !field.is_empty();
            match field {
                "id" => event.id = value.parse().ok(),
                "event" => event.kind = value.to_owned(),
                "data" => event.data.push_str(value),
                "retry" => event.retry = value.parse().ok(),
                _ => {}
            }
        }
        None
    }
}

#[test]
fn the_event_stream_sends_the_status_first_then_numbered_events_at_a_bounded_rate_and_again_after_a_restart()
 {
    let broker = Broker::start();
    let source = unique("events-in");
    let sink = unique("events-out");
    broker.create_topic(&source, 1);
    broker.create_topic(&sink, 1);
    let repo = TestRepo::new();
    let files = |program: &str| {
        vec![
            write(
                "topologies/t/in.yaml",
                format!("kind: source\ntopic: {source}\n"),
            ),
            write(
                "topologies/t/clean.yaml",
                format!("kind: processor\ninput: in\njq: '{program}'\n"),
            ),
            write(
                "topologies/t/out.yaml",
                format!("kind: sink\ntopic: {sink}\ninput: clean\n"),
            ),
        ]
    };
    let first = repo.commit("main", "first", &files("."));
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut daemon = Daemon::start(&repo, &broker, state.path(), port);
    daemon.wait_status("t runs the first commit", |s| {
        topology(s, "t")["commit"] == first.to_string().as_str()
            && topology(s, "t")["phase"] == "idle"
    });

    // `plumber status --watch` follows the same stream, one document per line in JSON.
    let mut watch_command = Command::new(env!("CARGO_BIN_EXE_plumber"));
    watch_command
        .args([
            "status",
            "--watch",
            "--format",
            "json",
            "--server",
            &daemon.api,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut watcher = Process::spawn("plumber status --watch", &mut watch_command);
    let documents = {
        use std::io::BufRead as _;
        let stdout = watcher.stdout().unwrap();
        let (sender, receiver) = std::sync::mpsc::channel::<Value>();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(serde_json::from_str(&line).unwrap()).is_err() {
                    return;
                }
            }
        });
        receiver
    };
    let watched = |what: &str, condition: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let document = documents
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("plumber status --watch never printed {what}"));
            if condition(&document) {
                return document;
            }
        }
    };
    watched("the status", &|d| {
        topology(d, "t")["commit"] == first.to_string().as_str()
    });

    let mut stream = EventStream::connect(&daemon.api);
    let opening = stream.next().unwrap();
    assert_eq!(opening.kind, "status", "{opening:?}");
    assert_eq!(
        opening.retry,
        Some(2000),
        "the browser's reconnection delay comes first"
    );
    let document: Value = serde_json::from_str(&opening.data).unwrap();
    assert_eq!(document["branch"], "main");
    assert_eq!(
        topology(&document, "t")["commit"],
        first.to_string().as_str()
    );

    // Gzipped as a browser asks for it: the same status first, decoded as it arrives.
    let mut gzipped = EventStream::connect_gzip(&daemon.api);
    let opening_gzipped = gzipped.next().unwrap();
    assert_eq!(opening_gzipped.kind, "status");
    assert_eq!(opening_gzipped.retry, Some(2000));
    let document_gzipped: Value = serde_json::from_str(&opening_gzipped.data).unwrap();
    assert_eq!(
        topology(&document_gzipped, "t")["commit"],
        first.to_string().as_str()
    );
    // And the API's other answers, gzipped when asked for.
    let status = ureq::get(&format!("{}/api/status", daemon.api))
        .header("Accept-Encoding", "gzip")
        .call()
        .unwrap();
    assert_eq!(status.headers()["content-encoding"], "gzip");
    let status: Value = serde_json::from_reader(flate2::read::GzDecoder::new(
        status.into_body().into_reader(),
    ))
    .unwrap();
    assert_eq!(status["branch"], "main");

    // Records flow while a commit moves the topology: many status changes, one history event.
    let started = Instant::now();
    let moved = repo.commit("main", "tag records", &files(".tagged = true"));
    broker.produce(
        &source,
        &(0..50)
            .map(|n| TestRecord::new(&format!("k{n}"), &format!("{{\"n\":{n}}}")))
            .collect::<Vec<_>>(),
    );
    let mut seen = vec![opening];
    let (mut history, mut settled) = (None, false);
    while history.is_none() || !settled {
        let event = stream.next().expect("the stream goes on");
        let data: Value = serde_json::from_str(&event.data).unwrap();
        match event.kind.as_str() {
            "history" if data["to"] == moved.to_string().as_str() => history = Some(data),
            "status" => {
                let t = topology(&data, "t");
                settled = t["commit"] == moved.to_string().as_str() && t["phase"] == "idle";
            }
            _ => {}
        }
        seen.push(event);
    }
    let elapsed = started.elapsed();
    let ids: Vec<u64> = seen.iter().map(|e| e.id.unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "numbered in order: {ids:?}"
    );
    let statuses: Vec<&WireEvent> = seen.iter().filter(|e| e.kind == "status").collect();
    let allowed = (elapsed.as_millis() / 500) as usize + 2;
    assert!(
        statuses.len() <= allowed,
        "{} status events in {elapsed:?}: more than one per 500 ms",
        statuses.len()
    );
    assert!(
        statuses.windows(2).all(|w| w[0].data != w[1].data),
        "an unchanged status is never sent again"
    );
    let history = history.unwrap();
    assert_eq!(history["message"], "tag records");
    assert_eq!(history["topology"], "t");
    // The gzipped stream carried the same events, each decoded on its own.
    let gzipped_history = std::iter::from_fn(|| gzipped.next())
        .find(|e| e.kind == "history")
        .expect("the gzipped stream has the history event");
    assert_eq!(
        serde_json::from_str::<Value>(&gzipped_history.data).unwrap(),
        history
    );

    // A daemon that restarts ends the stream; connecting again starts with the status.
    daemon.stop();
    assert!(stream.next().is_none(), "the stream ends with the daemon");
    let rest = gzipped.read_to_end();
    assert!(
        rest.is_ok(),
        "the gzipped stream ends with the daemon, with its gzip trailer: {rest:?}"
    );
    let daemon = Daemon::start(&repo, &broker, state.path(), port);
    daemon.wait_status("the restarted daemon runs the new commit", |s| {
        topology(s, "t")["commit"] == moved.to_string().as_str()
    });
    watched("the restarted daemon's status", &|d| {
        topology(d, "t")["commit"] == moved.to_string().as_str()
    });
    watcher.kill();
    let mut again = EventStream::connect(&daemon.api);
    let reopened = again.next().unwrap();
    assert_eq!(
        (reopened.kind.as_str(), reopened.retry),
        ("status", Some(2000))
    );
    let document: Value = serde_json::from_str(&reopened.data).unwrap();
    assert_eq!(
        topology(&document, "t")["commit"],
        moved.to_string().as_str()
    );
}
