//! How long a step's output stops while its instances come and go: the eager rebalance
//! protocol against the cooperative one (KIP-429), on the same broker in the same run. Run
//! through `bench/rebalance.sh`, which builds the processor in release mode first.
//!
//! Each phase runs one protocol on topics of its own: records flow into a 6-partition input
//! at a steady rate, `plumber-processor --jq .` instances are started and stopped (SIGTERM)
//! one at a time following the plan (1,2,1,2,1 instances by default), and afterwards the
//! output is read back. For each change it reports the longest time between consecutive
//! output records (by the producer's timestamp, which the processor stamps when it sends)
//! from the change until the group settled, and the longest any one input partition went
//! without output. Every record is checked to come out exactly once.
//!
//! Environment: `BENCH_ROUNDS` (phases per protocol, default 5; the protocols take turns
//! going first), `BENCH_RATE` (records/s, default 2000), `BENCH_PLAN` (instances after each
//! change, default `1,2,1,2,1`), `BENCH_SETTLE_SECS` (a change's window, default 8),
//! `PLUMBER_TEST_BOOTSTRAP` (a real cluster instead of tansu), `BENCH_OUT` (default
//! bench/results/rebalance.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use plumber_testkit::{Broker, Process, unique};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};
use rdkafka::{Message as _, Offset, TopicPartitionList};

const PARTITIONS: i32 = 6;

/// What the numbers on tansu can and cannot show, written under them.
const TANSU_NOTE: &str = "On tansu the two protocols stop a step's output about equally. \
Under both, the instance that keeps running pauses only while its revocation commits (it \
waits for the acknowledgements in flight and commits, about 0.1 s on tansu), and the \
partitions that move wait about as long for their new owner (the longest partition gap). \
What the eager protocol adds on Kafka, every member waiting for the last one to rejoin \
before any reads again, tansu 0.6 does not do: its coordinator answers each JoinGroup at \
once, without waiting for the other members. The same defect is why the plan stops at two \
instances: with three, tansu hands a partition to one member while another still reads it \
(processor/README.md, Rebalances), and records are processed twice under either protocol. \
`PLUMBER_TEST_BOOTSTRAP=host:port BENCH_PLAN=1,2,3,2,1 bash bench/rebalance.sh` measures \
a real cluster.";
const PATIENCE: Duration = Duration::from_secs(120);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn processor_binary() -> PathBuf {
    let examples = std::env::current_exe().unwrap();
    examples
        .parent()
        .and_then(|examples| examples.parent())
        .unwrap()
        .join("plumber-processor")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Protocol {
    Eager,
    Cooperative,
}

impl Protocol {
    fn flag(self) -> &'static str {
        match self {
            Protocol::Eager => "eager",
            Protocol::Cooperative => "cooperative",
        }
    }
}

/// Writes `{"seq":i,"p":partition}` to the input at `rate` records per second, round robin
/// over the partitions, until stopped; returns how many it wrote.
struct Load {
    running: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Load {
    fn start(broker: &Broker, topic: &str, rate: u64) -> Load {
        let running = Arc::new(AtomicBool::new(true));
        let (mut client, topic, flag) = (broker.client(), topic.to_owned(), running.clone());
        let thread = std::thread::spawn(move || {
            let producer: BaseProducer = client.set("linger.ms", "5").create().unwrap();
            let start = Instant::now();
            let mut i = 0u64;
            while flag.load(Ordering::SeqCst) {
                let due = start + Duration::from_micros(i * 1_000_000 / rate);
                while Instant::now() < due {
                    producer.poll(due.saturating_duration_since(Instant::now()));
                }
                let partition = (i % PARTITIONS as u64) as i32;
                let value = format!(r#"{{"seq":{i},"p":{partition}}}"#);
                let key = format!("k{i}");
                let mut record = BaseRecord::to(&topic)
                    .key(&key)
                    .payload(&value)
                    .partition(partition);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((_, back)) => {
                            record = back;
                            producer.poll(Duration::from_millis(5));
                        }
                    }
                }
                i += 1;
            }
            producer.flush(PATIENCE).unwrap();
            i
        });
        Load { running, thread }
    }

    fn finish(self) -> u64 {
        self.running.store(false, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// One `plumber-processor` instance and its log.
struct Instance {
    process: Process,
    log: PathBuf,
}

impl Instance {
    fn start(broker: &Broker, group: &str, input: &str, output: &str, protocol: Protocol) -> Self {
        let log = std::env::temp_dir().join(format!("{}.log", unique(group)));
        let mut command = Command::new(processor_binary());
        command
            .args(["--bootstrap", broker.bootstrap(), "--group", group])
            .args(["--input", input, "--output", output, "--jq", "."])
            .args(["--assignor", protocol.flag()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let process = Process::spawn("plumber-processor", &mut command);
        Instance { process, log }
    }

    /// The partitions it owns by its last assignment (0 once revoked under eager).
    fn owned(&self) -> u64 {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut owned = 0;
        for line in log.lines() {
            let Ok(line) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            match line["message"].as_str() {
                Some("partitions assigned") => owned = line["owned"].as_u64().unwrap_or(0),
                Some("partitions revoked") => owned = line["kept"].as_u64().unwrap_or(0),
                _ => {}
            }
        }
        owned
    }

    fn stop(mut self) {
        self.process.signal(Signal::SIGTERM);
        let status = self.process.wait_exit(Duration::from_secs(15));
        assert!(
            status.is_some_and(|s| s.success()),
            "a graceful stop exits 0 ({status:?}); log {}",
            self.log.display()
        );
    }
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An output record: when it was sent, and the input it came from.
struct Out {
    at: i64,
    seq: u64,
    partition: i64,
}

fn read_output(broker: &Broker, topic: &str) -> Vec<Out> {
    let consumer: BaseConsumer = broker
        .client()
        .set("group.id", unique("bench-reader"))
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut ended = std::collections::BTreeSet::new();
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1800);
    while ended.len() < PARTITIONS as usize {
        assert!(Instant::now() < deadline, "reading {topic} took too long");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                let value: serde_json::Value =
                    serde_json::from_slice(message.payload().unwrap_or_default()).unwrap();
                records.push(Out {
                    at: message.timestamp().to_millis().unwrap_or(0),
                    seq: value["seq"].as_u64().unwrap(),
                    partition: value["p"].as_i64().unwrap(),
                });
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(error)) => eprintln!("reading {topic}: {error}"),
            None => {}
        }
    }
    records
}

/// The longest time without a record from `from` to `to`, over sorted timestamps: between
/// consecutive records, the first of which may come before the window.
fn longest_gap(sorted: &[i64], from: i64, to: i64) -> i64 {
    let first = sorted.partition_point(|t| *t < from);
    let last = sorted.partition_point(|t| *t <= to);
    let mut longest = 0;
    let mut previous = if first > 0 { sorted[first - 1] } else { from };
    for &t in &sorted[first..last] {
        longest = longest.max(t - previous);
        previous = t;
    }
    longest.max(to.min(sorted.last().copied().unwrap_or(to)) - previous)
}

/// What one change did to the output.
struct Change {
    /// Instances before → after.
    from: usize,
    to: usize,
    /// The longest gap in the step's output, ms.
    step_gap: i64,
    /// The longest any one input partition went without output, ms.
    partition_gap: i64,
    /// From the change until every partition had an owner again, ms.
    settled_ms: i64,
}

struct Phase {
    protocol: Protocol,
    changes: Vec<Change>,
    /// Before the first change, the same window length: the steady state.
    steady_step_gap: i64,
    steady_partition_gap: i64,
    written: u64,
    lost: u64,
    duplicated: u64,
}

fn phase(broker: &Broker, protocol: Protocol, plan: &[usize], rate: u64, settle: i64) -> Phase {
    let (input, output) = (unique("rebal-in"), unique("rebal-out"));
    broker.create_topic(&input, PARTITIONS);
    broker.create_topic(&output, PARTITIONS);
    let group = unique(&format!("bench-{}", protocol.flag()));
    let load = Load::start(broker, &input, rate);
    let mut running: Vec<Instance> = Vec::new();
    let mut windows = Vec::new();
    let mut steady = (0, 0);
    for (change, &instances) in plan.iter().enumerate() {
        let at = now_ms();
        let before = running.len();
        while running.len() < instances {
            running.push(Instance::start(broker, &group, &input, &output, protocol));
        }
        while running.len() > instances {
            running.pop().expect("an instance runs").stop();
        }
        // A new instance owns some, and the others let go of them.
        wait_until(
            &format!("{protocol:?}: every partition has an owner after change {change}"),
            || {
                running.iter().map(Instance::owned).sum::<u64>() == PARTITIONS as u64
                    && running.last().is_some_and(|newest| newest.owned() > 0)
            },
        );
        let settled = now_ms();
        if change == 0 {
            // Warm up, then a window of the steady state.
            std::thread::sleep(Duration::from_secs(3));
            let from = now_ms();
            std::thread::sleep(Duration::from_millis(settle as u64));
            steady = (from, now_ms());
        } else {
            let until = (at + settle).max(settled + 1000);
            std::thread::sleep(Duration::from_millis((until - now_ms()).max(0) as u64));
            windows.push((before, instances, at, until, settled - at));
        }
        eprintln!(
            "{protocol:?}: {before} → {instances} instances, settled in {} ms",
            settled - at
        );
    }
    let written = load.finish();
    // Drained: the group committed the whole input.
    let deadline = Instant::now() + PATIENCE;
    while broker
        .committed(&group, &input, PARTITIONS)
        .values()
        .sum::<i64>()
        < written as i64
    {
        assert!(
            Instant::now() < deadline,
            "{protocol:?}: the input was not drained"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for instance in running.into_iter().rev() {
        instance.stop();
    }

    let records = read_output(broker, &output);
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    for record in &records {
        *seen.entry(record.seq).or_default() += 1;
    }
    let lost = (0..written).filter(|seq| !seen.contains_key(seq)).count() as u64;
    let duplicated = seen.values().map(|n| n.saturating_sub(1)).sum();
    let mut all: Vec<i64> = records.iter().map(|r| r.at).collect();
    all.sort_unstable();
    let mut by_partition: Vec<Vec<i64>> = vec![Vec::new(); PARTITIONS as usize];
    for record in &records {
        if let Some(stamps) = usize::try_from(record.partition)
            .ok()
            .and_then(|p| by_partition.get_mut(p))
        {
            stamps.push(record.at);
        }
    }
    for stamps in &mut by_partition {
        stamps.sort_unstable();
    }
    let partition_gap = |from: i64, to: i64| {
        by_partition
            .iter()
            .map(|stamps| longest_gap(stamps, from, to))
            .max()
            .unwrap_or(0)
    };
    let changes = windows
        .iter()
        .map(|&(from, to, at, until, settled_ms)| Change {
            from,
            to,
            step_gap: longest_gap(&all, at, until),
            partition_gap: partition_gap(at, until),
            settled_ms,
        })
        .collect();
    Phase {
        protocol,
        changes,
        steady_step_gap: longest_gap(&all, steady.0, steady.1),
        steady_partition_gap: partition_gap(steady.0, steady.1),
        written,
        lost,
        duplicated,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn range(values: &[f64]) -> (f64, f64) {
    values.iter().fold((f64::MAX, f64::MIN), |(low, high), &x| {
        (low.min(x), high.max(x))
    })
}

fn main() {
    let rounds = env_or("BENCH_ROUNDS", 5);
    let rate = env_or("BENCH_RATE", 2000);
    let settle = env_or("BENCH_SETTLE_SECS", 8) as i64 * 1000;
    let plan: Vec<usize> = std::env::var("BENCH_PLAN")
        .unwrap_or_else(|_| "1,2,1,2,1".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("BENCH_PLAN: instance counts, e.g. 1,2,1")
        })
        .collect();
    assert!(
        plan.len() >= 2 && plan.iter().all(|n| *n > 0),
        "BENCH_PLAN needs two or more counts above 0"
    );
    let out = PathBuf::from(
        std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/rebalance.md".into()),
    );
    let broker = Broker::start();
    let mut phases = Vec::new();
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [Protocol::Eager, Protocol::Cooperative]
        } else {
            [Protocol::Cooperative, Protocol::Eager]
        };
        for protocol in order {
            eprintln!("round {round}: {protocol:?}");
            phases.push(phase(&broker, protocol, &plan, rate, settle));
        }
    }

    let kind = if broker.is_tansu() {
        "tansu 0.6 (SQLite storage)"
    } else {
        "the PLUMBER_TEST_BOOTSTRAP cluster"
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let plan_text = plan
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" → ");
    let mut report = String::new();
    writeln!(report, "# Rebalance benchmark\n").unwrap();
    writeln!(
        report,
        "`plumber-processor --jq .` on a 6-partition input with {rate} records/s offered, on {kind}; {cores} cores. Instances are started and stopped (SIGTERM) one at a time, {plan_text}, under each protocol in turn ({rounds} rounds, the protocols taking turns going first; each on topics of its own). For each change: the longest time between consecutive output records of the step (by the time the processor sent them) from the change until {} s later or 1 s after every partition had an owner again, whichever is later; and the longest any one input partition went without output in the same window. Rerun: `bash bench/rebalance.sh`.\n",
        settle / 1000
    )
    .unwrap();
    writeln!(
        report,
        "| protocol | changes | longest step output gap, median | (range) | longest partition gap, median | (range) | settled, median | steady step gap | lost | duplicated |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    .unwrap();
    for protocol in [Protocol::Eager, Protocol::Cooperative] {
        let of: Vec<&Phase> = phases.iter().filter(|p| p.protocol == protocol).collect();
        let changes: Vec<&Change> = of.iter().flat_map(|p| p.changes.iter()).collect();
        let step: Vec<f64> = changes.iter().map(|c| c.step_gap as f64).collect();
        let partition: Vec<f64> = changes.iter().map(|c| c.partition_gap as f64).collect();
        let settled: Vec<f64> = changes.iter().map(|c| c.settled_ms as f64).collect();
        let steady: Vec<f64> = of.iter().map(|p| p.steady_step_gap as f64).collect();
        let (step_low, step_high) = range(&step);
        let (part_low, part_high) = range(&partition);
        writeln!(
            report,
            "| {} | {} | **{:.0} ms** | {step_low:.0}–{step_high:.0} | {:.0} ms | {part_low:.0}–{part_high:.0} | {:.0} ms | {:.0} ms | {} | {} |",
            protocol.flag(),
            changes.len(),
            median(step.clone()),
            median(partition.clone()),
            median(settled),
            median(steady),
            of.iter().map(|p| p.lost).sum::<u64>(),
            of.iter().map(|p| p.duplicated).sum::<u64>(),
        )
        .unwrap();
    }
    if broker.is_tansu() {
        writeln!(report, "\n{TANSU_NOTE}").unwrap();
    }
    writeln!(
        report,
        "\nBy change (medians over the rounds, step gap / partition gap, ms):\n"
    )
    .unwrap();
    writeln!(report, "| change | eager | cooperative |\n|---|---:|---:|").unwrap();
    let Some(first) = phases.first() else {
        return;
    };
    for (i, change) in first.changes.iter().enumerate() {
        let cell = |protocol: Protocol| {
            let of: Vec<&Change> = phases
                .iter()
                .filter(|p| p.protocol == protocol)
                .filter_map(|p| p.changes.get(i))
                .collect();
            format!(
                "{:.0} / {:.0}",
                median(of.iter().map(|c| c.step_gap as f64).collect()),
                median(of.iter().map(|c| c.partition_gap as f64).collect())
            )
        };
        writeln!(
            report,
            "| {} → {} | {} | {} |",
            change.from,
            change.to,
            cell(Protocol::Eager),
            cell(Protocol::Cooperative)
        )
        .unwrap();
    }
    writeln!(
        report,
        "\nPer phase (step gaps of its changes, ms; records written):\n"
    )
    .unwrap();
    for (i, phase) in phases.iter().enumerate() {
        let gaps: Vec<i64> = phase.changes.iter().map(|c| c.step_gap).collect();
        let partition: Vec<i64> = phase.changes.iter().map(|c| c.partition_gap).collect();
        writeln!(
            report,
            "- round {}, {}: step {gaps:?}, partition {partition:?}; steady {} / {} ms; {} records, {} lost, {} duplicated",
            i / 2,
            phase.protocol.flag(),
            phase.steady_step_gap,
            phase.steady_partition_gap,
            phase.written,
            phase.lost,
            phase.duplicated
        )
        .unwrap();
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, &report).unwrap();
    println!("{report}");
    eprintln!("written to {}", out.display());
}
