//! Starting `plumber-processor` against a test broker.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use plumber_testkit::{Broker, Process, TestRecord};

pub const BIN: &str = env!("CARGO_BIN_EXE_plumber-processor");

/// SPEC §5: a processor exits within 10 s of SIGTERM.
pub const STOP_PROMISE: Duration = Duration::from_secs(10);

/// One processor invocation: the step's topics plus extra arguments.
pub struct Step {
    pub group: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub dlq: Option<String>,
    pub args: Vec<String>,
    /// Names the log file; instances of one group that run together need their own.
    pub log_name: String,
}

impl Step {
    pub fn new(group: &str, input: &str, output: &str) -> Self {
        Step {
            group: group.to_owned(),
            inputs: vec![input.to_owned()],
            outputs: vec![output.to_owned()],
            dlq: None,
            args: Vec::new(),
            log_name: group.to_owned(),
        }
    }

    pub fn log_as(mut self, name: &str) -> Self {
        self.log_name = name.to_owned();
        self
    }

    pub fn dlq(mut self, topic: &str) -> Self {
        self.dlq = Some(topic.to_owned());
        self
    }

    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Starts the processor; its log goes to a file named in panics.
    pub fn start(&self, broker: &Broker) -> Process {
        let log = self.log_path();
        let mut command = Command::new(BIN);
        command.args(["--bootstrap", broker.bootstrap(), "--group", &self.group]);
        for input in &self.inputs {
            command.args(["--input", input]);
        }
        for output in &self.outputs {
            command.args(["--output", output]);
        }
        if let Some(dlq) = &self.dlq {
            command.args(["--dlq", dlq]);
        }
        command
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .expect("processor log"),
            );
        eprintln!("processor log: {}", log.display());
        Process::spawn("plumber-processor", &mut command)
    }

    pub fn log_path(&self) -> PathBuf {
        std::env::temp_dir().join(format!("{}.log", self.log_name))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

/// Writes numbered records to `topic` in acknowledged batches until told to stop.
pub struct Load {
    running: Arc<AtomicBool>,
    written: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    pub fn start(bootstrap: &str, topic: &str) -> Load {
        let running = Arc::new(AtomicBool::new(true));
        let written = Arc::new(AtomicU32::new(0));
        let (flag, count) = (running.clone(), written.clone());
        let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
        let thread = std::thread::spawn(move || {
            let broker = Broker::external(bootstrap);
            while flag.load(Ordering::SeqCst) {
                let from = count.load(Ordering::SeqCst);
                broker.produce(&topic, &numbered(from..from + 200));
                count.store(from + 200, Ordering::SeqCst);
            }
        });
        Load {
            running,
            written,
            thread: Some(thread),
        }
    }

    /// Stops writing; returns how many records were written.
    pub fn finish(mut self) -> u32 {
        self.running.store(false, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("load thread");
        }
        self.written.load(Ordering::SeqCst)
    }
}

/// `n` JSON records `{"id": i}` keyed `k<i>`, spread over partitions by key.
pub fn numbered(range: std::ops::Range<u32>) -> Vec<TestRecord> {
    range
        .map(|i| TestRecord::new(&format!("k{i}"), &format!(r#"{{"id":{i}}}"#)))
        .collect()
}

/// The `id` field of each record's JSON value.
pub fn ids(records: &[TestRecord]) -> Vec<u32> {
    records
        .iter()
        .map(|r| {
            let value: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap_or_default())
                    .unwrap_or_else(|e| panic!("output is not JSON ({e}): {:?}", r.value_str()));
            value["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("no id in {value}")) as u32
        })
        .collect()
}

/// How often each id occurs.
pub fn counts(ids: &[u32]) -> std::collections::BTreeMap<u32, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for id in ids {
        *counts.entry(*id).or_default() += 1;
    }
    counts
}

/// The processor's report of how it ended: its last line with `stop_seconds` (librdkafka's
/// threads may still log after it).
pub fn final_report(log: &str) -> serde_json::Value {
    let line = log
        .lines()
        .rev()
        .find(|line| line.contains("\"stop_seconds\""))
        .unwrap_or_else(|| panic!("no final report in the log:\n{log}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// The processor's own clock, which a loaded test machine does not slow: its final report
/// says how long the stop took (SPEC §5: within 10 s of SIGTERM).
pub fn assert_stop_took_under_ten_seconds(log: &str) {
    let report = final_report(log);
    let seconds = report["stop_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("no stop_seconds in {report}"));
    assert!(seconds < 10.0, "the stop took {seconds} s: {report}");
}

/// Starts a processor and waits until the group gave it partitions.
///
/// tansu 0.6 sometimes completes a rebalance with a member that was killed (-9) and, once that
/// member's session expires, never gives its partitions to the live one. A fresh member
/// joining after the expiry gets them, so a member left with none is stopped and replaced.
/// Real clusters (PLUMBER_TEST_BOOTSTRAP) pass on the first attempt.
pub fn start_assigned(broker: &Broker, step: &Step) -> Process {
    let assigned = || {
        step.log()
            .lines()
            .filter(|line| line.contains("partitions assigned"))
            .map(|line| !line.contains(r#""partitions":0"#))
            .collect::<Vec<_>>()
    };
    for _ in 0..5 {
        let before = assigned().len();
        let mut process = step.start(broker);
        plumber_testkit::wait_until(
            "the new member is assigned partitions",
            Duration::from_secs(60),
            || assigned().len() > before,
        );
        if assigned()[before] {
            return process;
        }
        process.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(process.wait_exit(STOP_PROMISE).expect("exits").success());
    }
    panic!(
        "no member of {} was ever assigned partitions; log:\n{}",
        step.group,
        step.log()
    );
}
