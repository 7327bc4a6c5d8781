//! `plumber up` as a real process on a test repository, and what tests ask of it over HTTP.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use plumber_testkit::{Process, free_port, wait_until};
use serde_json::Value;

/// A cutover on a slow broker and a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(180);

pub struct Up {
    pub process: Process,
    pub api: String,
    pub log: PathBuf,
}

impl Up {
    /// `plumber up REPO --branch main` with `args`, its state directory and log in `scratch`;
    /// with a broker, its processors run on it (eagerly rebalanced on tansu, topics kept).
    pub fn start(
        repo: &str,
        broker: Option<&plumber_testkit::Broker>,
        scratch: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Up {
        let port = free_port();
        let log = scratch.join("daemon.log");
        eprintln!("daemon log: {}", log.display());
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .args(["up", repo, "--branch", "main"])
            .args([
                "--bootstrap",
                broker.map_or("127.0.0.1:1", |b| b.bootstrap()),
            ])
            .arg("--state-dir")
            .arg(scratch.join("state"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env("PLUMBER_PROCESSOR", super::common::processor_binary())
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log"));
        if broker.is_some_and(plumber_testkit::Broker::is_tansu) {
            command
                .arg("--keep-topics")
                .env("PLUMBER_ASSIGNOR", "eager");
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let up = Up {
            process: Process::spawn("plumber up", &mut command),
            api: format!("http://127.0.0.1:{port}"),
            log,
        };
        wait_until("the daemon answers", PATIENCE, || {
            up.get("/api/status").is_some()
        });
        up
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        let mut response = ureq::get(&format!("{}{path}", self.api)).call().ok()?;
        response.body_mut().read_json().ok()
    }

    /// The status once `condition` holds of it.
    pub fn wait_status(&self, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        while Instant::now() < deadline {
            if let Some(status) = self.get("/api/status") {
                if condition(&status) {
                    return status;
                }
                last = status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting until {what}; last status: {last:#}");
    }

    /// Topology `name` of the status once `condition` holds of it.
    pub fn wait_topology(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(&Value) -> bool,
    ) -> Value {
        let status = self.wait_status(what, |status| condition(&topology(status, name)));
        topology(&status, name)
    }

    /// The plan of `refname` once `condition` holds of it.
    pub fn wait_plan(
        &self,
        refname: &str,
        what: &str,
        condition: impl Fn(&Value) -> bool,
    ) -> Value {
        let path = format!("/api/plans/{}", refname.replace('/', "%2F"));
        wait_until(what, PATIENCE, || {
            self.get(&path).is_some_and(|p| condition(&p))
        });
        self.get(&path).unwrap_or(Value::Null)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        self.process.signal(nix::sys::signal::Signal::SIGTERM);
        if self.process.wait_exit(PATIENCE).is_none() {
            eprintln!("the daemon did not stop within {PATIENCE:?}");
        }
    }
}

/// Topology `name` of a status document (`null` when it has none).
pub fn topology(status: &Value, name: &str) -> Value {
    status["topologies"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The group of step `step` of a topology's status, while its processor runs.
pub fn running_group(topology: &Value, step: &str) -> Option<String> {
    topology["steps"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == step && s["state"] == "running")?["group"]
        .as_str()
        .map(str::to_owned)
}
