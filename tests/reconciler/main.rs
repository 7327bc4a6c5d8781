//! The reconciler end to end: `plumber up` (the real binary, local runtime) following a real
//! git repository, real processors, a real broker (tansu, or `PLUMBER_TEST_BOOTSTRAP`), and
//! the oracle: each input record reaches each sink once per route (the steps it passed), with
//! the versions one revision gives that route; exactly once on routes every revision has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod harness;

use harness::{Model, Plumber, Proc, World};

/// R1: src → a → b → out1, a → c → out2.
fn first() -> Model {
    Model::new()
        .processor(Proc::new("a", 1, &["src"]))
        .processor(Proc::new("b", 1, &["a"]))
        .processor(Proc::new("c", 1, &["a"]))
        .sink("out1", &["b"])
        .sink("out2", &["c"])
}

#[test]
fn every_record_follows_one_revision_through_a_series_of_cutovers() {
    let world = World::new("oracle");
    let mut revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    let load = world.start_load(100);
    load.wait_for(200);

    // Replace the head step: everything below it is replaced too (parallel cutover).
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    plumber.wait_applied("t", r2);
    load.wait_for(load.sent() + 200);

    // Replace one branch only.
    let m = revisions[1].clone().replace("c", 2);
    let r3 = world.commit("c v2", &m);
    revisions.push(m);
    plumber.wait_applied("t", r3);

    // Add a second path into out1, straight from the source.
    let m = revisions[2]
        .clone()
        .processor(Proc::new("d", 1, &["src"]))
        .sink("out1", &["b", "d"]);
    let r4 = world.commit("add d", &m);
    revisions.push(m);
    plumber.wait_applied("t", r4);
    load.wait_for(load.sent() + 200);

    // An invalid commit is never applied; the next valid one is.
    let broken = world.commit_raw(
        "broken jq",
        "topologies/t/steps/b.yaml",
        "kind: processor\ninput: a\njq: 'select('\n",
    );
    plumber.wait_until("the invalid commit is reported", |status| {
        status["lastError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&broken.to_string()))
    });
    assert_eq!(
        plumber.applied("t"),
        Some(r4.to_string()),
        "the invalid commit must not be applied"
    );

    // Remove d and scale b in place (same identity, two instances).
    let m = revisions[3]
        .clone()
        .without("d")
        .sink("out1", &["b"])
        .scale("b", 2);
    let r6 = world.commit("remove d, scale b", &m);
    revisions.push(m);
    plumber.wait_applied("t", r6);
    let final_from = load.sent();
    load.wait_for(final_from + 200);

    let sent = load.stop();
    world.assert_oracle(&revisions, sent, final_from);
    let history = plumber.history();
    assert_eq!(history.as_array().map(Vec::len), Some(5), "{history:#}");
}

#[test]
fn a_daemon_killed_mid_cutover_resumes_it_without_loss_or_duplicates() {
    let world = World::new("resume");
    let mut revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    let mut plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    let load = world.start_load(100);
    load.wait_for(200);

    // Kill the daemon at successive points of one cutover, restarting it each time.
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    for done in [1, 3, 5] {
        plumber.wait_until(&format!("{done} cutover actions done"), |status| {
            let t = &status["topologies"][0];
            t["cutover"]["done"].as_u64().is_some_and(|d| d >= done)
                || t["commit"] == r2.to_string()
        });
        plumber.kill();
        plumber = Plumber::up(&world);
    }
    plumber.wait_applied("t", r2);
    let final_from = load.sent();
    load.wait_for(final_from + 200);
    let sent = load.stop();
    world.assert_oracle(&revisions, sent, final_from);
    // Never two live instances of one step: the adopted processors were not started twice.
    world.assert_one_instance_per_group();
}

#[test]
fn a_processor_killed_during_a_cutover_loses_nothing() {
    let world = World::new("crash");
    let mut revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    let load = world.start_load(100);
    load.wait_for(300);
    let m = revisions[0].clone().replace("c", 2);
    let r2 = world.commit("c v2", &m);
    revisions.push(m);
    // The old b keeps running through this cutover; kill it hard while it happens.
    world.kill_processor("b");
    plumber.wait_applied("t", r2);
    let final_from = load.sent();
    load.wait_for(final_from + 300);
    let sent = load.stop();
    // At-least-once without transactions: a killed processor may duplicate, never lose.
    let duplicates = world.assert_oracle_allowing_duplicates(&revisions, sent, final_from);
    eprintln!("duplicates after kill -9 of b: {duplicates}");
}
