//! A stream–table join through `plumber up`: the step joins a second table topic under
//! load. The table is read whole, outside the group, so the cutover hands over the stream's
//! offsets only: every record before the cutover offsets is joined by the old life to the
//! old table, every record after them by the new life to the new table, none twice, none
//! missing.

use std::collections::BTreeMap;

use plumber_testkit::TestRecord;

use crate::harness::{Model, Plumber, World, processors_at};

/// The load's keys, `k0` … `k9`.
const KEYS: u32 = 10;

fn files(world: &World, table_topic: &str, table: &str) -> Vec<(String, String)> {
    vec![
        (
            format!("topologies/t/sources/{table}.yaml"),
            format!("kind: source\ntopic: {table_topic}\n"),
        ),
        (
            "topologies/t/steps/enrich.yaml".into(),
            format!(
                "kind: processor\ninput: [src, {table}]\n\
                 sql: SELECT s.seq, c.tier FROM src s JOIN {table} c ON _key = c._key\n\
                 startFrom: earliest\n"
            ),
        ),
        (
            "topologies/t/sinks/out1.yaml".into(),
            format!(
                "kind: sink\ntopic: {}\ninput: enrich\n",
                world.sink_topic("out1")
            ),
        ),
    ]
}

/// A table topic with a row for every key: `{"tier": tier}`.
fn table(world: &World, prefix: &str, tier: &str) -> String {
    let topic = world.topic(prefix);
    let rows: Vec<TestRecord> = (0..KEYS)
        .map(|k| TestRecord::new(&format!("k{k}"), &format!(r#"{{"tier":"{tier}"}}"#)))
        .collect();
    world.broker.produce(&topic, &rows);
    topic
}

#[test]
fn a_join_whose_table_changes_under_load_joins_each_record_once_to_one_table() {
    let world = World::new("join");
    let v1 = table(&world, "tiers-v1", "v1");
    let v2 = table(&world, "tiers-v2", "v2");
    let r1 = world.commit_with("join v1", &Model::new(), &files(&world, &v1, "tiers"));
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    let load = world.start_load(200);
    load.wait_for(600);

    let r2 = world.commit_with("join v2", &Model::new(), &files(&world, &v2, "tiers2"));
    plumber.wait_applied("t", r2);
    let at_cutover = load.sent();
    // Status shows the new life's table: its topic, its rows, loaded.
    plumber.wait_until("the join's table in status", |status| {
        status["topologies"][0]["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == "enrich")
            .is_some_and(|s| {
                let table = &s["keepsTable"];
                table["topic"] == v2.as_str()
                    && table["rows"] == u64::from(KEYS)
                    && table["bytes"].as_u64().is_some_and(|b| b > 0)
                    && table["loadingRecords"] == 0
            })
    });
    load.wait_for(at_cutover + 600);
    let sent = load.stop();

    let old = &processors_at(world.repo_path(), "t", r1)["enrich"];
    let old_group = format!("plumber.t.enrich.{}", &old[..12]);
    let cutover = world.broker.committed(&old_group, world.source_topic(), 3);
    // Where each record is on the source.
    let placed: BTreeMap<u64, (i32, i64)> = world
        .broker
        .read_all(world.source_topic())
        .into_iter()
        .map(|r| {
            let value: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (
                value["seq"].as_u64().unwrap(),
                (r.partition.unwrap(), r.offset.unwrap()),
            )
        })
        .collect();
    assert_eq!(placed.len() as u64, sent);

    let sink = world.sink_topic("out1").to_owned();
    let records = world
        .broker
        .wait_for_records(&sink, "every record joined", |records| {
            records.len() as u64 >= sent
        });
    let mut tiers: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for record in &records {
        let value: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        tiers
            .entry(value["seq"].as_u64().unwrap())
            .or_default()
            .push(value["tier"].as_str().unwrap().to_owned());
    }
    let mut problems = Vec::new();
    let (mut old_table, mut new_table) = (0, 0);
    for (seq, (partition, offset)) in &placed {
        let before = cutover.get(partition).is_some_and(|c| offset < c);
        let wanted = if before { "v1" } else { "v2" };
        match tiers.get(seq).map(Vec::as_slice) {
            Some([tier]) if tier == wanted => {
                if before {
                    old_table += 1;
                } else {
                    new_table += 1;
                }
            }
            got => problems.push(format!(
                "record {seq} at {partition}/{offset}: wanted once with {wanted}, got {got:?}"
            )),
        }
    }
    assert!(
        problems.is_empty(),
        "each record once, joined to the table of the life that owned its offset (cutover \
         at {cutover:?}): {problems:#?}"
    );
    assert_eq!(records.len() as u64, sent, "nothing more than the records");
    assert!(
        old_table > 0 && new_table > 0,
        "both lives joined records: {old_table} and {new_table}"
    );
    eprintln!("{old_table} records joined to v1, {new_table} to v2, cutover at {cutover:?}");
}
