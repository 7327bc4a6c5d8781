//! Throughput, CPU, memory and latency of `plumber-processor` against the hand-written
//! baseline (`baseline_loop`), on the same broker in the same run. Run through
//! `bench/processor.sh`, which builds both in release mode first.
//!
//! Environment: `BENCH_RECORDS` (default 100000), `BENCH_ROUNDS` (default 3),
//! `BENCH_LATENCY_SECS` (default 20; 0 skips it), `BENCH_LATENCY_ROUNDS` (default 3),
//! `BENCH_BROKERS` (default `tansu,mock`),
//! `BENCH_PROCESSOR_ARGS` (extra processor arguments, e.g. `-X queued.min.messages=1000`, to
//! try settings), `PLUMBER_TEST_BOOTSTRAP` (a real cluster instead of tansu), `BENCH_OUT`
//! (default bench/results/processor.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use plumber_testkit::{Broker, Process, TestRecord, Usage, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn binaries() -> (PathBuf, PathBuf) {
    let examples = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let release = examples.parent().unwrap().to_path_buf();
    (
        release.join("plumber-processor"),
        examples.join("baseline_loop"),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Baseline,
    Processor,
    ProcessorExactlyOnce,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Baseline => "baseline (hand-written loop)",
            Variant::Processor => "plumber-processor --jq . (at-least-once)",
            Variant::ProcessorExactlyOnce => "plumber-processor --jq . (exactly-once)",
        }
    }

    /// Starts the variant; its stderr goes to the returned log file.
    fn start(self, bootstrap: &str, input: &str, output: &str) -> (Process, PathBuf) {
        let (processor, baseline) = binaries();
        let group = unique("bench");
        let mut command = match self {
            Variant::Baseline => {
                let mut c = Command::new(baseline);
                c.args([bootstrap, &group, input, output]);
                c
            }
            Variant::Processor | Variant::ProcessorExactlyOnce => {
                let mut c = Command::new(processor);
                c.args([
                    "--bootstrap",
                    bootstrap,
                    "--group",
                    &group,
                    "--input",
                    input,
                    "--output",
                    output,
                    "--jq",
                    ".",
                ]);
                let extra = std::env::var("BENCH_PROCESSOR_ARGS").unwrap_or_default();
                c.args(extra.split_whitespace());
                c.args([
                    "--delivery",
                    if self == Variant::Processor {
                        "at-least-once"
                    } else {
                        "exactly-once"
                    },
                ]);
                c
            }
        };
        let log = std::env::temp_dir().join(format!("{group}.log"));
        eprintln!("{}: log {}", self.label(), log.display());
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        (Process::spawn(self.label(), &mut command), log)
    }
}

/// The high watermarks of a topic, read by one long-lived client.
struct Watermarks {
    consumer: BaseConsumer,
    topic: String,
}

impl Watermarks {
    fn new(broker: &Broker, topic: &str) -> Self {
        Watermarks {
            consumer: broker.client().create().unwrap(),
            topic: topic.to_owned(),
        }
    }

    fn total(&self) -> i64 {
        (0..PARTITIONS)
            .map(|p| {
                self.consumer
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(10))
                    .map(|w| w.1)
                    .unwrap_or(0)
            })
            .sum()
    }
}

struct Throughput {
    records_per_second: f64,
    cpu_microseconds_per_record: f64,
    peak_rss_mb: f64,
}

/// CPU seconds a variant spends starting up (client set-up, jq compile, group join) with
/// nothing to read: subtracted from a run's CPU, so that CPU per record counts records only.
/// Measured once it has been idle for half a second, before it is asked to stop.
fn start_up_cpu(variant: Variant, broker: &Broker, make_topic: &dyn Fn(&str) -> String) -> f64 {
    let (input, output) = (make_topic("idle-in"), make_topic("idle-out"));
    let (mut process, _) = variant.start(broker.bootstrap(), &input, &output);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = -1.0;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = Usage::of(process.pid()).cpu_seconds;
        if now == last || Instant::now() > deadline {
            process.signal(Signal::SIGTERM);
            process.wait_exit(Duration::from_secs(15)).expect("stops");
            return now;
        }
        last = now;
    }
}

/// Copies `records` already on `input` to a new topic. Throughput is catching up on that
/// backlog: from the moment the variant owns its partitions (its log says `partitions
/// assigned`; start-up and group join excluded) to the last output. Timing from the first
/// output instead would leave out whatever a variant prefetched before it: with librdkafka's
/// default prefetch that is the whole backlog, so a variant that fetches in smaller pieces
/// would look slower for paying its fetches inside the window. CPU per record is the CPU used
/// until the last output, less `start_up_cpu`, over all records.
fn throughput(
    variant: Variant,
    broker: &Broker,
    make_topic: &dyn Fn(&str) -> String,
    input: &str,
    records: i64,
    start_up_cpu: f64,
) -> Throughput {
    let output = make_topic("bench-out");
    let marks = Watermarks::new(broker, &output);
    let (mut process, log) = variant.start(broker.bootstrap(), input, &output);
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut assigned_at = None;
    loop {
        if assigned_at.is_none() && assigned(&log) {
            assigned_at = Some(Instant::now());
        }
        let done = marks.total();
        if done >= records {
            break;
        }
        assert!(Instant::now() < deadline, "{variant:?} did not finish");
        if let Some(status) = process.wait_exit(Duration::from_millis(20)) {
            panic!("{variant:?} exited early ({status}); see its log above");
        }
    }
    let elapsed = assigned_at
        .unwrap_or_else(|| panic!("{variant:?} never logged `partitions assigned`: {log:?}"))
        .elapsed()
        .as_secs_f64();
    let used = Usage::of(process.pid());
    process.signal(Signal::SIGTERM);
    process.wait_exit(Duration::from_secs(15)).expect("stops");
    Throughput {
        records_per_second: records as f64 / elapsed,
        cpu_microseconds_per_record: (used.cpu_seconds - start_up_cpu).max(0.0) * 1e6
            / records as f64,
        peak_rss_mb: used.peak_rss_kb as f64 / 1024.0,
    }
}

/// Whether the variant logging to `log` owns its partitions.
fn assigned(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains("partitions assigned"))
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Sends `rate` records per second for `seconds` and measures send → arrival at the output.
/// Without a variant the reader reads the input itself: the broker's own share.
fn latency(
    variant: Option<Variant>,
    broker: &Broker,
    make_topic: &dyn Fn(&str) -> String,
    rate: u64,
    seconds: u64,
) -> (f64, f64, Option<f64>) {
    let input = make_topic("lat-in");
    let output = if variant.is_some() {
        make_topic("lat-out")
    } else {
        input.clone()
    };
    let mut process = variant.map(|v| {
        let (process, log) = v.start(broker.bootstrap(), &input, &output);
        // Records sent while the loop joins its group would measure the join, not the loop.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !assigned(&log) {
            assert!(
                Instant::now() < deadline,
                "{v:?} never owned its partitions: {log:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        process
    });
    let reader: BaseConsumer = broker
        .client()
        .set("group.id", unique("lat-reader"))
        .set("fetch.wait.max.ms", "10")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment
            .add_partition_offset(&output, p, Offset::Beginning)
            .unwrap();
    }
    reader.assign(&assignment).unwrap();
    let running = Arc::new(AtomicBool::new(true));
    let total = rate * seconds;
    let writer = {
        let (client, input, running) = (broker.client(), input.clone(), running.clone());
        std::thread::spawn(move || {
            let producer: BaseProducer = client.clone().set("linger.ms", "0").create().unwrap();
            let start = Instant::now();
            for i in 0..total {
                let due = start + Duration::from_micros(i * 1_000_000 / rate);
                while Instant::now() < due {
                    producer.poll(due.saturating_duration_since(Instant::now()));
                }
                let value = format!(r#"{{"id":{i},"sent_us":{}}}"#, now_micros());
                let key = format!("k{i}");
                let _ = producer.send(BaseRecord::to(&input).key(&key).payload(&value));
            }
            producer.flush(Duration::from_secs(30)).unwrap();
            running.store(false, Ordering::SeqCst);
        })
    };
    let mut latencies = Vec::new();
    let warmup = rate; // one second of records: connections and first fetches
    let deadline = Instant::now() + Duration::from_secs(seconds + 60);
    while (latencies.len() as u64) < total - warmup && Instant::now() < deadline {
        if let Some(Ok(message)) = reader.poll(Duration::from_millis(50)) {
            let arrived = now_micros();
            let value: serde_json::Value =
                serde_json::from_slice(message.payload().unwrap()).unwrap();
            if value["id"].as_u64().unwrap() >= warmup {
                latencies.push(arrived.saturating_sub(value["sent_us"].as_u64().unwrap()));
            }
        }
    }
    writer.join().unwrap();
    let mut peak_rss_mb = None;
    if let Some(process) = &mut process {
        peak_rss_mb = Some(Usage::of(process.pid()).peak_rss_kb as f64 / 1024.0);
        process.signal(Signal::SIGTERM);
        process.wait_exit(Duration::from_secs(15)).expect("stops");
    }
    latencies.sort_unstable();
    let pick = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    (pick(0.5), pick(0.99), peak_rss_mb)
}

/// The smallest and the largest of `values`.
fn range(values: &[f64]) -> (f64, f64) {
    values.iter().fold((f64::MAX, f64::MIN), |(low, high), &x| {
        (low.min(x), high.max(x))
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn preload(broker: &Broker, topic: &str, records: i64) {
    let batch: Vec<TestRecord> = (0..records)
        .map(|i| {
            TestRecord::new(
                &format!("k{i}"),
                &format!(
                    r#"{{"id":{i},"user":"u{}","page":"/a/b/c","ms":{}}}"#,
                    i % 97,
                    i * 7
                ),
            )
        })
        .collect();
    broker.produce(topic, &batch);
}

/// Alternating runs of the baseline and the processor on one broker, as a Markdown section.
fn compare(
    report: &mut String,
    label: &str,
    broker: &Broker,
    make: &dyn Fn(&str) -> String,
    input: &str,
    records: i64,
    rounds: u64,
) {
    let start_up: Vec<f64> = [Variant::Baseline, Variant::Processor]
        .into_iter()
        .map(|variant| {
            let cpu = median(
                (0..2)
                    .map(|_| start_up_cpu(variant, broker, make))
                    .collect(),
            );
            eprintln!("{label} {variant:?}: start-up CPU {:.0} ms", cpu * 1e3);
            cpu
        })
        .collect();
    let mut runs: Vec<(Variant, Throughput)> = Vec::new();
    for round in 0..rounds {
        for (variant, start_up) in [Variant::Baseline, Variant::Processor]
            .into_iter()
            .zip(&start_up)
        {
            let t = throughput(variant, broker, make, input, records, *start_up);
            eprintln!(
                "{label} round {round} {variant:?}: {:.0} rec/s, {:.1} µs CPU/rec, {:.1} MB peak",
                t.records_per_second, t.cpu_microseconds_per_record, t.peak_rss_mb
            );
            runs.push((variant, t));
        }
    }
    let med = |variant: Variant, f: &dyn Fn(&Throughput) -> f64| {
        median(
            runs.iter()
                .filter(|(v, _)| *v == variant)
                .map(|(_, t)| f(t))
                .collect(),
        )
    };
    let spread = |variant: Variant, f: &dyn Fn(&Throughput) -> f64| {
        let values: Vec<f64> = runs
            .iter()
            .filter(|(v, _)| *v == variant)
            .map(|(_, t)| f(t))
            .collect();
        range(&values)
    };
    writeln!(report, "### {label}\n").unwrap();
    writeln!(
        report,
        "| | records/s | (range) | CPU µs/record | (range) | peak RSS MB |\n|---|---:|---:|---:|---:|---:|"
    )
    .unwrap();
    for variant in [Variant::Baseline, Variant::Processor] {
        let rate = spread(variant, &|t| t.records_per_second);
        let cpu = spread(variant, &|t| t.cpu_microseconds_per_record);
        writeln!(
            report,
            "| {} | {:.0} | {:.0}–{:.0} | {:.1} | {:.1}–{:.1} | {:.1} |",
            variant.label(),
            med(variant, &|t| t.records_per_second),
            rate.0,
            rate.1,
            med(variant, &|t| t.cpu_microseconds_per_record),
            cpu.0,
            cpu.1,
            med(variant, &|t| t.peak_rss_mb)
        )
        .unwrap();
    }
    // Runs alternate, so each round's pair shares the machine's mood of the moment.
    let rounds: Vec<String> = runs
        .chunks(2)
        .map(|pair| {
            format!(
                "{:.2}",
                pair[1].1.records_per_second / pair[0].1.records_per_second
            )
        })
        .collect();
    writeln!(
        report,
        "\nThroughput ratio of each round (processor / baseline run just before it): {}.",
        rounds.join(", ")
    )
    .unwrap();
    let ratio = med(Variant::Processor, &|t| t.records_per_second)
        / med(Variant::Baseline, &|t| t.records_per_second);
    let cpu_ratio = med(Variant::Processor, &|t| t.cpu_microseconds_per_record)
        / med(Variant::Baseline, &|t| t.cpu_microseconds_per_record);
    writeln!(report, "\nThroughput ratio processor / baseline: **{ratio:.2}** (target ≥ 0.9). CPU per record ratio: **{cpu_ratio:.2}** (target ≤ 1.3). Peak RSS of the processor: **{:.1} MB** (target ≤ 40).\n", med(Variant::Processor, &|t| t.peak_rss_mb)).unwrap();
}

fn make_topic(broker: &Broker, prefix: &str) -> String {
    let name = unique(prefix);
    broker.create_topic(&name, PARTITIONS);
    name
}

/// At-least-once throughput against the baseline on tansu (or a real cluster), then latency.
fn on_tansu(
    report: &mut String,
    records: i64,
    rounds: u64,
    latency_secs: u64,
    latency_rounds: u64,
) {
    let kind = |broker: &Broker| {
        if broker.is_tansu() {
            "tansu 0.6 (SQLite storage)"
        } else {
            "PLUMBER_TEST_BOOTSTRAP cluster"
        }
    };
    {
        let broker = Broker::start();
        let make = |prefix: &str| make_topic(&broker, prefix);
        let input = make("bench-in");
        eprintln!("preloading {records} records…");
        preload(&broker, &input, records);
        writeln!(
            report,
            "## Throughput, at-least-once\n\nRecords per second catching up on the backlog, from the moment the program owns its partitions to the last output; CPU per record is the run's CPU less the same program's CPU for starting up with no input, over all records.\n"
        )
        .unwrap();
        compare(
            report,
            kind(&broker),
            &broker,
            &make,
            &input,
            records,
            rounds,
        );
    }
    if latency_secs == 0 {
        return;
    }
    // A broker of its own: tansu slows down as its database grows, and each throughput round
    // wrote the whole backlog again.
    let broker = Broker::start();
    let kind = kind(&broker);
    let make = |prefix: &str| make_topic(&broker, prefix);
    compare_latency(report, kind, &broker, &make, latency_secs, latency_rounds);
}

/// Latency at 1,000 records/s: the broker alone, the baseline and the processor. tansu slows
/// down as its database grows, so the variants take turns going first, and each round pairs
/// the processor with the baseline next to it.
fn compare_latency(
    report: &mut String,
    kind: &str,
    broker: &Broker,
    make: &dyn Fn(&str) -> String,
    latency_secs: u64,
    latency_rounds: u64,
) {
    let variants = [None, Some(Variant::Baseline), Some(Variant::Processor)];
    let mut runs: Vec<Vec<(f64, f64, Option<f64>)>> = vec![Vec::new(); variants.len()];
    let mut added = Vec::new();
    for round in 0..latency_rounds {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        order.rotate_left(round as usize % variants.len());
        for &v in &order {
            let run = latency(variants[v], broker, make, 1000, latency_secs);
            let label = variants[v].map_or("broker only (one hop, no loop)", Variant::label);
            eprintln!(
                "latency round {round} {label}: p50 {:.2} ms, p99 {:.2} ms, peak RSS {:?} MB",
                run.0, run.1, run.2
            );
            runs[v].push(run);
        }
        let (baseline, processor) = (runs[1][round as usize], runs[2][round as usize]);
        added.push((processor.0 - baseline.0, processor.1 - baseline.1));
    }
    writeln!(report, "## Latency on {kind} at 1,000 records/s (send → arrival at the output, through the broker twice)\n\nMedians of {latency_rounds} rounds of {latency_secs} s; the variants take turns going first.\n").unwrap();
    writeln!(
        report,
        "| | p50 ms | (range) | p99 ms | peak RSS MB |\n|---|---:|---:|---:|---:|"
    )
    .unwrap();
    for (v, variant) in variants.iter().enumerate() {
        let label = variant.map_or("broker only (one hop, no loop)", Variant::label);
        let p50s: Vec<f64> = runs[v].iter().map(|r| r.0).collect();
        let (low, high) = range(&p50s);
        let p99 = median(runs[v].iter().map(|r| r.1).collect());
        let rss: Vec<f64> = runs[v].iter().filter_map(|r| r.2).collect();
        let rss = if rss.is_empty() {
            String::new()
        } else {
            format!("{:.1}", median(rss))
        };
        writeln!(
            report,
            "| {label} | {:.0} | {low:.0}–{high:.0} | {p99:.0} | {rss} |",
            median(p50s.clone())
        )
        .unwrap();
    }
    writeln!(
        report,
        "\nAdded by the processor over the baseline run beside it (median of the rounds): p50 **{:+.0} ms**, p99 **{:+.0} ms**.\n",
        median(added.iter().map(|a| a.0).collect()),
        median(added.iter().map(|a| a.1).collect())
    )
    .unwrap();
}

/// The same on librdkafka's MockCluster, and exactly-once against at-least-once.
fn on_mock(report: &mut String, records: i64, rounds: u64, latency_secs: u64, latency_rounds: u64) {
    let cluster: MockCluster<'static, DefaultProducerContext> = MockCluster::new(1).unwrap();
    let mock = Broker::external(cluster.bootstrap_servers());
    let make_mock = |prefix: &str| {
        let name = unique(prefix);
        cluster.create_topic(&name, PARTITIONS, 1).unwrap();
        name
    };
    let mock_input = make_mock("bench-in");
    preload(&mock, &mock_input, records);
    writeln!(report, "## The same on librdkafka's MockCluster\n").unwrap();
    writeln!(report, "In memory, in the benchmark process: the broker is not the bottleneck, so this shows the processor's own cost. tansu 0.6 has no transactions, so exactly-once is measured here too; the mock speaks the transaction protocol but writes no transaction markers, so that ratio is the client-side cost of transactions (100 ms transactions), not a real broker's.\n").unwrap();
    compare(
        report,
        "Throughput, at-least-once",
        &mock,
        &make_mock,
        &mock_input,
        records,
        rounds,
    );
    let mut eos_runs: Vec<(Variant, f64)> = Vec::new();
    for _ in 0..rounds {
        for variant in [Variant::Processor, Variant::ProcessorExactlyOnce] {
            let t = throughput(variant, &mock, &make_mock, &mock_input, records, 0.0);
            eprintln!("mock {variant:?}: {:.0} rec/s", t.records_per_second);
            eos_runs.push((variant, t.records_per_second));
        }
    }
    let eos_med = |variant: Variant| {
        median(
            eos_runs
                .iter()
                .filter(|(v, _)| *v == variant)
                .map(|(_, r)| *r)
                .collect(),
        )
    };
    writeln!(report, "### Exactly-once against at-least-once\n").unwrap();
    writeln!(report, "| | records/s |\n|---|---:|").unwrap();
    for variant in [Variant::Processor, Variant::ProcessorExactlyOnce] {
        writeln!(report, "| {} | {:.0} |", variant.label(), eos_med(variant)).unwrap();
    }
    writeln!(
        report,
        "\nRatio exactly-once / at-least-once: **{:.2}**.",
        eos_med(Variant::ProcessorExactlyOnce) / eos_med(Variant::Processor)
    )
    .unwrap();
    if latency_secs > 0 {
        // Without a database behind it, the mock shows the latency the loop itself adds.
        writeln!(report).unwrap();
        compare_latency(
            report,
            "librdkafka's MockCluster",
            &mock,
            &make_mock,
            latency_secs,
            latency_rounds,
        );
    }
}

fn main() {
    let records = env_or("BENCH_RECORDS", 100_000) as i64;
    let rounds = env_or("BENCH_ROUNDS", 3);
    let latency_secs = env_or("BENCH_LATENCY_SECS", 20);
    let latency_rounds = env_or("BENCH_LATENCY_ROUNDS", 3).max(1);
    let out = PathBuf::from(
        std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/processor.md".into()),
    );
    let mut report = String::new();
    let machine = format!(
        "{} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    writeln!(&mut report, "# plumber-processor benchmark\n").unwrap();
    writeln!(&mut report, "{PARTITIONS} partitions; {records} JSON records of ~70 bytes; {machine}; medians of {rounds} alternating runs. Rerun: `bash bench/processor.sh`.\n").unwrap();
    let brokers = std::env::var("BENCH_BROKERS").unwrap_or_else(|_| "tansu,mock".into());
    if brokers.contains("tansu") {
        on_tansu(&mut report, records, rounds, latency_secs, latency_rounds);
    }
    if brokers.contains("mock") {
        on_mock(&mut report, records, rounds, latency_secs, latency_rounds);
    }

    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, &report).unwrap();
    println!("{report}");
    eprintln!("written to {}", Path::new(&out).display());
}
