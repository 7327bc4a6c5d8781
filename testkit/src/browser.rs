//! Headless Chromium driven over WebDriver (`chromedriver`, through fantoccini), for the
//! tests and benchmarks of the web page: Debian's `/usr/bin/chromium` unless
//! `PLUMBER_CHROMIUM` names another, `chromedriver` from `PATH` unless `PLUMBER_CHROMEDRIVER`
//! does. Every call waits for its answer.
//!
//! [`Browser`] does what every caller needs (load a page, run a script, wait for the page to
//! show something, read its console); a caller drives the rest through [`Browser::client`]
//! and [`Browser::block_on`], or chromedriver itself through [`Browser::driver_url`] and
//! [`Browser::session_id`].

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use fantoccini;
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

use crate::{Process, free_port, wait_until};

/// How a [`Browser`] starts: [`BrowserOptions::new`], then the setters, then
/// [`BrowserOptions::start`].
pub struct BrowserOptions {
    patience: Duration,
    poll: Duration,
    profile: Option<PathBuf>,
    capabilities: serde_json::Map<String, Value>,
}

impl BrowserOptions {
    /// [`Browser::wait_for`] gives up after `patience`; the page is probed every 200 ms, in
    /// a fresh profile directory removed with the browser.
    pub fn new(patience: Duration) -> BrowserOptions {
        BrowserOptions {
            patience,
            poll: Duration::from_millis(200),
            profile: None,
            capabilities: serde_json::Map::new(),
        }
    }

    /// How often [`Browser::wait_for`] probes the page.
    pub fn poll(mut self, every: Duration) -> BrowserOptions {
        self.poll = every;
        self
    }

    /// Chromium's profile in `dir`, which the caller keeps (a second browser on it finds the
    /// first one's cache).
    pub fn profile(mut self, dir: &Path) -> BrowserOptions {
        self.profile = Some(dir.to_owned());
        self
    }

    /// A WebDriver capability besides Chromium's options (`goog:chromeOptions`).
    pub fn capability(mut self, name: &str, value: Value) -> BrowserOptions {
        self.capabilities.insert(name.to_owned(), value);
        self
    }

    /// Starts chromedriver on a free port and opens a Chromium session, 1280×900.
    pub fn start(self) -> Browser {
        let chromium =
            std::env::var("PLUMBER_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let chromedriver =
            std::env::var("PLUMBER_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        assert!(
            Path::new(&chromium).is_file(),
            "{chromium} is missing: install Debian's chromium and chromium-driver \
             (scripts/install-deps --tests does), or set PLUMBER_CHROMIUM"
        );
        let port = free_port();
        let driver = Process::spawn(
            "chromedriver",
            Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let driver_url = format!("http://127.0.0.1:{port}");
        wait_until("chromedriver answers", Duration::from_secs(30), || {
            ureq::get(&format!("{driver_url}/status")).call().is_ok()
        });
        let (profile, own_profile) = match self.profile {
            Some(dir) => (dir, None),
            None => {
                let dir = tempfile::tempdir().expect("a temporary Chromium profile");
                (dir.path().to_owned(), Some(dir))
            }
        };
        let mut capabilities = self.capabilities;
        // The console, for [`Browser::console`] (unless the caller asked for other logs).
        capabilities
            .entry("goog:loggingPrefs")
            .or_insert_with(|| json!({"browser": "ALL"}));
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                // Without the background-networking flags Chromium keeps calling out of this
                // machine's closed network (and those calls would count as the page's).
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the WebDriver client");
        let client = runtime
            .block_on(
                ClientBuilder::native()
                    .capabilities(capabilities)
                    .connect(&driver_url),
            )
            .expect("a chromium session");
        let session_id = runtime
            .block_on(client.session_id())
            .expect("the session's id")
            .expect("a session id");
        Browser {
            runtime,
            client,
            driver,
            driver_url,
            session_id,
            patience: self.patience,
            poll: self.poll,
            _profile: own_profile,
        }
    }
}

/// Chromium driven by chromedriver; the session is closed and chromedriver killed on drop.
pub struct Browser {
    runtime: tokio::runtime::Runtime,
    client: Client,
    driver: Process,
    driver_url: String,
    session_id: String,
    patience: Duration,
    poll: Duration,
    /// The profile [`BrowserOptions`] made when given none; removed after chromedriver stops.
    _profile: Option<tempfile::TempDir>,
}

impl Browser {
    /// With the defaults of [`BrowserOptions::new`].
    pub fn start(patience: Duration) -> Browser {
        BrowserOptions::new(patience).start()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `future` (a call on [`Browser::client`]) to its end.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// chromedriver's base URL, for its own commands (`{driver_url}/session/{session_id}/…`).
    pub fn driver_url(&self) -> &str {
        &self.driver_url
    }

    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// chromedriver's process id: Chromium's processes are its descendants.
    pub fn driver_pid(&self) -> u32 {
        self.driver.pid()
    }

    pub fn goto(&self, url: &str) {
        self.block_on(self.client.goto(url))
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    }

    /// Runs `script` in the page; its `return` value.
    pub fn script(&self, script: &str) -> Value {
        self.block_on(self.client.execute(script, Vec::new()))
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// The page's answer to `probe` (a JavaScript expression) once `condition` holds of it;
    /// panics with the page's text after the patience the browser was started with.
    pub fn wait_for(&self, what: &str, probe: &str, condition: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + self.patience;
        let script = format!("return {probe};");
        let mut last = Value::Null;
        while Instant::now() < deadline {
            last = self.script(&script);
            if condition(&last) {
                return last;
            }
            std::thread::sleep(self.poll);
        }
        let text = self.script("return document.body.innerText;");
        panic!("timed out waiting until {what}; last: {last}; the page says:\n{text}");
    }
}

/// One message of the browser's console: the page's `console` calls, its uncaught errors and
/// promise rejections, and what the browser says about it (a request that failed, a script it
/// blocked).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ConsoleEntry {
    /// `SEVERE` (an error), `WARNING`, `INFO` or `DEBUG`.
    pub level: String,
    /// Where it comes from: `console-api` (a `console` call), `javascript` (uncaught),
    /// `network`, …
    #[serde(default)]
    pub source: String,
    pub message: String,
    /// Milliseconds since the epoch.
    #[serde(default)]
    pub timestamp: u64,
}

impl ConsoleEntry {
    /// An error: `console.error`, an uncaught exception or rejection, a failed request.
    pub fn is_error(&self) -> bool {
        self.level == "SEVERE"
    }
}

impl Browser {
    /// The console's messages since the last call (chromedriver hands each out once), of
    /// every page this browser showed. Empty when the browser was started with a
    /// `goog:loggingPrefs` capability that keeps no `browser` log.
    pub fn console(&self) -> Vec<ConsoleEntry> {
        let url = format!("{}/session/{}/se/log", self.driver_url, self.session_id);
        let answer = ureq::post(&url)
            .header("Content-Type", "application/json")
            .send(r#"{"type":"browser"}"#)
            .and_then(|mut response| response.body_mut().read_to_string())
            .unwrap_or_else(|e| panic!("chromedriver does not give the console's log: {e}"));
        let log: Value = serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("chromedriver's log is not JSON ({e}): {answer}"));
        serde_json::from_value(log["value"].clone()).unwrap_or_else(|e| {
            panic!("chromedriver's log is not a list of entries ({e}): {answer}")
        })
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.runtime.block_on(self.client.clone().close());
    }
}
