//! A stateful SQL step through `plumber up`: a windowed count whose `WHERE` changes under
//! load. The plan rebuilds the new life's state from the records before the cutover offsets
//! (without emitting), so every window closed before the cutover comes from the old query,
//! every window closed after it from the new query over all of its records: none twice, none
//! missing.

use std::collections::{BTreeMap, BTreeSet};

use crate::harness::{Model, Plumber, World, processors_at};

/// A count of each key's records per second of their timestamps.
const COUNT: &str = "SELECT _key AS k, COUNT(*) AS n, MIN(seq) AS first, window_start FROM src \
                     GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' SECOND)";

fn files(world: &World, query: &str) -> Vec<(String, String)> {
    vec![
        (
            "topologies/t/steps/counts.yaml".into(),
            format!("kind: processor\ninput: src\nsql: \"{query}\"\nstartFrom: earliest\n"),
        ),
        (
            "topologies/t/sinks/out1.yaml".into(),
            format!(
                "kind: sink\ntopic: {}\ninput: counts\n",
                world.sink_topic("out1")
            ),
        ),
    ]
}

/// One window's output.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Window {
    key: String,
    start: i64,
    n: u64,
    first: u64,
}

/// A source record: its partition, offset, timestamp, key and `seq`.
struct Input {
    partition: i32,
    offset: i64,
    timestamp: i64,
    key: String,
    seq: u64,
}

/// The windows `keep`'s records make, each with the partition and offset of the record that
/// closes it (the partition's first at or after its end); windows still open are left out.
fn windows(inputs: &[Input], keep: impl Fn(u64) -> bool) -> BTreeMap<Window, (i32, i64)> {
    let mut groups: BTreeMap<(String, i64), (u64, u64, i32)> = BTreeMap::new();
    for input in inputs.iter().filter(|i| keep(i.seq)) {
        let start = input.timestamp.div_euclid(1000) * 1000;
        let group =
            groups
                .entry((input.key.clone(), start))
                .or_insert((0, u64::MAX, input.partition));
        group.0 += 1;
        group.1 = group.1.min(input.seq);
    }
    groups
        .into_iter()
        .filter_map(|((key, start), (n, first, partition))| {
            let closer = inputs
                .iter()
                .filter(|i| keep(i.seq) && i.partition == partition && i.timestamp >= start + 1000)
                .map(|i| i.offset)
                .min()?;
            Some((
                Window {
                    key,
                    start,
                    n,
                    first,
                },
                (partition, closer),
            ))
        })
        .collect()
}

fn emitted(records: &[plumber_testkit::TestRecord]) -> Vec<Window> {
    records
        .iter()
        .map(|r| {
            let value: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            Window {
                key: value["k"].as_str().unwrap().to_owned(),
                start: value["window_start"].as_i64().unwrap(),
                n: value["n"].as_u64().unwrap(),
                first: value["first"].as_u64().unwrap(),
            }
        })
        .collect()
}

#[test]
fn a_windowed_count_whose_where_changes_under_load_emits_every_window_once() {
    let world = World::new("stateful");
    let r1 = world.commit_with("count", &Model::new(), &files(&world, COUNT));
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    let load = world.start_load(200);
    load.wait_for(800);

    let filtered = COUNT.replace("FROM src", "FROM src WHERE seq % 5 <> 1");
    let r2 = world.commit_with("count fewer", &Model::new(), &files(&world, &filtered));
    plumber.wait_applied("t", r2);
    let at_cutover = load.sent();
    // Status shows the state: rebuilt, its groups and its watermark.
    plumber.wait_until("the step's state in status", |status| {
        status["topologies"][0]["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == "counts")
            .is_some_and(|s| {
                let kept = &s["keepsState"];
                kept["startedFrom"] == "rebuild"
                    && kept["groups"].as_u64().is_some_and(|g| g > 0)
                    && kept["watermarkMs"].as_i64().is_some_and(|w| w > 0)
                    && kept["changelog"].as_str().is_some_and(|c| {
                        c.starts_with("plumber.t.counts.") && c.ends_with(".state")
                    })
            })
    });
    load.wait_for(at_cutover + 800);
    let sent = load.stop();

    let old = &processors_at(world.repo_path(), "t", r1)["counts"];
    let old_group = format!("plumber.t.counts.{}", &old[..12]);
    let cutover = world.broker.committed(&old_group, world.source_topic(), 3);
    let inputs: Vec<Input> = world
        .broker
        .read_all(world.source_topic())
        .into_iter()
        .map(|r| {
            let value: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            Input {
                partition: r.partition.unwrap(),
                offset: r.offset.unwrap(),
                timestamp: r.timestamp.unwrap(),
                key: String::from_utf8(r.key.clone().unwrap()).unwrap(),
                seq: value["seq"].as_u64().unwrap(),
            }
        })
        .collect();
    assert_eq!(inputs.len() as u64, sent);
    let before_cutover =
        |(partition, closer): &(i32, i64)| cutover.get(partition).is_some_and(|c| closer < c);
    let mut wanted: Vec<Window> = windows(&inputs, |_| true)
        .into_iter()
        .filter(|(_, closer)| before_cutover(closer))
        .map(|(w, _)| w)
        .collect();
    let after: Vec<Window> = windows(&inputs, |seq| seq % 5 != 1)
        .into_iter()
        .filter(|(_, closer)| !before_cutover(closer))
        .map(|(w, _)| w)
        .collect();
    let straddling = after.iter().filter(|w| w.first < at_cutover).count();
    wanted.extend(after);
    wanted.sort();
    let sink = world.sink_topic("out1").to_owned();
    let records = world
        .broker
        .wait_for_records(&sink, "every closed window", |records| {
            records.len() >= wanted.len()
        });
    let mut got = emitted(&records);
    got.sort();
    let distinct: BTreeSet<&Window> = got.iter().collect();
    assert_eq!(distinct.len(), got.len(), "a window emitted twice");
    assert_eq!(
        got, wanted,
        "every window once: the old query's before the cutover offsets ({cutover:?}), the new \
         one's after"
    );
    // Counted whole by the new life: its state was rebuilt from before the cutover.
    assert!(straddling > 0, "some window straddles the cutover");
    eprintln!(
        "{} windows, {straddling} straddling the cutover at {cutover:?}",
        got.len()
    );
}
