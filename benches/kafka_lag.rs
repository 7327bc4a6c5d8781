//! What the observer's Kafka reads cost per processor group (`Admin::progress`: committed
//! offsets and watermarks, every look, for every group), on a real broker (tansu, or
//! `PLUMBER_TEST_BOOTSTRAP`). The baseline, measured in the same run: one metadata request,
//! the cheapest round trip a client makes.
//!
//! `bash bench/kafka-lag.sh` writes `bench/results/kafka-lag.md`. Knobs: BENCH_GROUPS (200),
//! BENCH_PARTITIONS (6), BENCH_REPS (3).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails loudly

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use plumber::kafka::{Admin, KafkaAdmin};
use plumber::plan::PartitionOffset;
use plumber_testkit::{Broker, TestRecord, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn range(values: &[f64]) -> (f64, f64) {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// Milliseconds per call of `call` over `items`.
fn per_call(items: &[(String, String)], mut call: impl FnMut(&str, &str)) -> f64 {
    let started = Instant::now();
    for (group, topic) in items {
        call(group, topic);
    }
    started.elapsed().as_secs_f64() * 1000.0 / items.len() as f64
}

fn main() {
    let groups = knob("BENCH_GROUPS", 200);
    let partitions = knob("BENCH_PARTITIONS", 6);
    let reps = knob("BENCH_REPS", 3);
    let broker = Broker::start();
    let admin = KafkaAdmin::connect(broker.bootstrap()).unwrap();
    eprintln!("creating {groups} topics of {partitions} partitions and their groups");
    let items: Vec<(String, String)> = (0..groups)
        .map(|n| {
            let topic = unique(&format!("lag{n}"));
            admin
                .create_topic(&topic, partitions as u32, None, &BTreeMap::new())
                .unwrap();
            broker.produce(
                &topic,
                &[TestRecord::new("k", "v"), TestRecord::new("k", "w")],
            );
            let group = unique(&format!("lag{n}"));
            let offsets: Vec<PartitionOffset> = (0..partitions as i32)
                .map(|partition| PartitionOffset {
                    topic: topic.clone(),
                    partition,
                    offset: 0,
                })
                .collect();
            admin.commit(&group, &offsets).unwrap();
            (group, topic)
        })
        .collect();
    let metadata: BaseConsumer = broker.client().create().unwrap();
    let mut rows: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for rep in 0..reps {
        eprintln!("rep {}/{reps}", rep + 1);
        // A fresh admin per rep: its group clients are created on the first look (cold),
        // reused on the second (warm) while they fit its cache.
        let admin = KafkaAdmin::connect(broker.bootstrap()).unwrap();
        rows.entry("baseline: one metadata request")
            .or_default()
            .push(per_call(&items, |_, topic| {
                metadata
                    .fetch_metadata(Some(topic), Duration::from_secs(15))
                    .unwrap();
            }));
        rows.entry("progress, first look (new group clients)")
            .or_default()
            .push(per_call(&items, |group, topic| {
                admin.progress(group, &[topic.to_owned()]).unwrap();
            }));
        rows.entry("progress, next look")
            .or_default()
            .push(per_call(&items, |group, topic| {
                admin.progress(group, &[topic.to_owned()]).unwrap();
            }));
        rows.entry("watermarks alone")
            .or_default()
            .push(per_call(&items, |_, topic| {
                admin.watermarks(topic).unwrap();
            }));
        rows.entry("committed alone")
            .or_default()
            .push(per_call(&items, |group, topic| {
                admin.committed(group, &[topic.to_owned()]).unwrap();
            }));
    }
    let baseline = median(rows["baseline: one metadata request"].clone());
    let mut out = String::new();
    writeln!(
        out,
        "# The observer's Kafka reads per group\n\n`bash bench/kafka-lag.sh` \
         ({groups} groups, each on its own topic of {partitions} partitions, {reps} runs; \
         broker: {}). Milliseconds per group, median [range]; the ratio is to one metadata \
         request in the same run. At 1,000 topologies × 20 steps the observer makes these \
         reads for about 18,000 groups every look.\n",
        if broker.is_tansu() {
            "tansu"
        } else {
            "PLUMBER_TEST_BOOTSTRAP"
        }
    )
    .unwrap();
    writeln!(out, "| per group | ms | ratio | 18,000 groups, s |").unwrap();
    writeln!(out, "|---|---:|---:|---:|").unwrap();
    for (name, values) in &rows {
        let m = median(values.clone());
        let (low, high) = range(values);
        writeln!(
            out,
            "| {name} | {m:.2} [{low:.2}–{high:.2}] | {:.1}× | {:.0} |",
            m / baseline,
            m * 18.0
        )
        .unwrap();
    }
    print!("{out}");
    let path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "bench/results/kafka-lag.md".into());
    std::fs::write(&path, out).unwrap();
    eprintln!("wrote {path}");
}
