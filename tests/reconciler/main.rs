//! The reconciler end to end: `plumber up` (the real binary, local runtime) following a real
//! git repository, real processors, a real broker (tansu, or `PLUMBER_TEST_BOOTSTRAP`), and
//! the oracle: each input record reaches each sink once per route (the steps it passed), with
//! the versions one revision gives that route; exactly once on routes every revision has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod join;
mod stateful;

use harness::{Killed, Load, Model, Plumber, Proc, World};

/// Records per second of the load; one second is also the processors' at-least-once commit
/// interval (`plumber-processor`'s default), so one interval holds this many inputs.
const RATE: u64 = 100;

/// The input topics of a killed instance's group.
fn inputs_of(killed: &Killed) -> Vec<String> {
    let mut topics: Vec<String> = killed.committed.keys().map(|(t, _)| t.clone()).collect();
    topics.dedup();
    topics
}

/// R1: src → a → b → out1, a → c → out2.
fn first() -> Model {
    Model::new()
        .processor(Proc::new("a", 1, &["src"]))
        .processor(Proc::new("b", 1, &["a"]))
        .processor(Proc::new("c", 1, &["a"]))
        .sink("out1", &["b"])
        .sink("out2", &["c"])
}

/// A world with the first revision running and `records` of continuous load (100/s) through
/// it; the revisions so far.
fn deployed(name: &str, records: u64) -> (World, Plumber, Load, Vec<Model>) {
    deployed_with(name, records, &[])
}

/// As [`deployed`], with extra arguments to `plumber up`.
fn deployed_with(name: &str, records: u64, extra: &[&str]) -> (World, Plumber, Load, Vec<Model>) {
    let world = World::new(name);
    let revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    let plumber = Plumber::start(&world, &world.repo_location(), extra);
    plumber.wait_applied("t", r1);
    let load = world.start_load(RATE);
    load.wait_for(records);
    (world, plumber, load, revisions)
}

/// The records/s `step` of `t` shows in a status document.
fn records_per_second(status: &serde_json::Value, step: &str) -> Option<f64> {
    status["topologies"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == "t")?["steps"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == step)?["recordsPerSecond"]
        .as_f64()
}

/// Records/s per step come from the processors' own `/metrics` (each local instance serves
/// them on a loopback port of its own), in status and on the daemon's `/metrics`; and still
/// after a daemon killed outright is replaced by one that adopts the running instances.
#[test]
fn records_per_second_are_read_from_the_processors_and_after_their_adoption() {
    let (world, mut plumber, load, _) = deployed("rates", 100);
    let flowing = |status: &serde_json::Value| {
        ["a", "b", "c"]
            .iter()
            .all(|step| records_per_second(status, step).is_some_and(|rate| rate > 0.0))
    };
    plumber.wait_until("every step shows its records/s", flowing);
    let metrics = plumber.metrics();
    for step in ["a", "b", "c"] {
        let gauge =
            format!(r#"plumber_processor_records_per_second{{topology="t",step="{step}"}} "#);
        let counter = format!(r#"plumber_processor_records_total{{topology="t",step="{step}"}} "#);
        assert!(metrics.contains(&gauge), "{gauge} in\n{metrics}");
        assert!(metrics.contains(&counter), "{counter} in\n{metrics}");
    }

    let instances = world.recorded_instances();
    assert_eq!(instances.len(), 3, "{instances:?}");
    plumber.kill();
    let plumber = Plumber::up(&world);
    plumber.wait_until("the adopted instances' records/s are read", flowing);
    assert_eq!(
        world.recorded_instances(),
        instances,
        "the same processes run: adopted, not restarted"
    );
    world.assert_one_instance_per_group();
    load.stop();
    drop(plumber);
}

#[test]
fn every_record_follows_one_revision_through_a_series_of_cutovers() {
    let (world, plumber, load, mut revisions) = deployed("oracle", 200);

    // Replace the head step: everything below it is replaced too (parallel cutover).
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    plumber.wait_applied("t", r2);
    load.wait_for(load.sent() + 200);
    // The new `a` started warm and was handed the old one's offsets.
    assert!(
        world
            .daemon_log()
            .contains("handed off: the warm life reads"),
        "no warm hand-off in the daemon's log"
    );

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
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
    let history = plumber.history();
    assert_eq!(history.as_array().map(Vec::len), Some(5), "{history:#}");
}

/// The cooperative assignor (KIP-429, Plumber's default; every other scenario runs eager
/// because of tansu): a step scaled in place to two instances takes its partitions
/// incrementally, and a cutover replaces every step below the source, exactly once. On
/// tansu only in the shape its coordinator handles (two instances at most, no kill -9:
/// README, tansu); librdkafka's MockCluster, where the assignor works, has no CreateTopics,
/// DeleteTopics or DescribeGroups, so `plumber up` cannot run on it.
#[test]
fn a_step_scaled_and_replaced_under_the_cooperative_assignor_delivers_exactly_once() {
    let (world, plumber, load, mut revisions) =
        deployed_with("cooperative", 200, &["--assignor", "cooperative"]);
    let m = revisions[0].clone().scale("b", 2);
    let r2 = world.commit("scale b", &m);
    revisions.push(m);
    plumber.wait_applied("t", r2);
    world.assert_one_instance_per_group();
    load.wait_for(load.sent() + 200);
    let m = revisions[1].clone().replace("a", 2);
    let r3 = world.commit("a v2", &m);
    revisions.push(m);
    plumber.wait_applied("t", r3);
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
    let assignors = world.recorded_assignors();
    assert!(
        !assignors.is_empty() && assignors.values().all(|a| a == "cooperative"),
        "every life runs the cooperative assignor: {assignors:?}"
    );
}

/// Topic deletion end to end. Every other scenario keeps retired topics on tansu
/// (`--keep-topics`): deleting a topic there breaks every other topic of the broker (README,
/// tansu). Here the daemon deletes. Replacing `a` retires the internal topic of its first
/// life: the engine deletes it only once that life and its readers (the first lives of b
/// and c) have stopped with their offsets recorded, and deletes no topic the new lives use.
/// On a real cluster (`PLUMBER_TEST_BOOTSTRAP`) the load runs through the cutover and the
/// oracle holds after the deletion. tansu's deletion takes the source and sinks with it, so
/// there the load stops before the cutover and the test checks the order and that the
/// retired topic is gone (the world's broker is its own: no other test's topics go too).
#[test]
fn a_retired_internal_topic_is_deleted_once_its_lives_have_stopped() {
    let mut world = World::new("delete");
    let mut revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    let plumber = Plumber::deleting_topics(&world);
    plumber.wait_applied("t", r1);
    let load = world.start_load(RATE);
    load.wait_for(200);
    let tansu = world.broker.is_tansu();
    let load = if tansu {
        // Read the sinks while they can be read: the deletion breaks them.
        let sent = load.stop();
        world.assert_oracle(&revisions, sent, sent);
        None
    } else {
        Some(load)
    };
    let retired = world.internal_topic(&revisions[0], "a");
    assert!(
        world.topic_exists(&retired),
        "{retired} runs before the cutover"
    );
    let m = revisions[0].clone().replace("a", 2);
    let used = world.internal_topic(&m, "a");
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    plumber.wait_applied("t", r2);
    if tansu {
        // A client asking tansu for the offsets of a topic it has just deleted panics its
        // storage task ("more or less than one row"), and it answers nothing more until it
        // restarts (docs/tansu.md). The new lives ask all the time: once the cutover with
        // the deletion has finished, the broker is restarted on its data.
        plumber_testkit::wait_until(
            "the cutover that deletes the retired topic has finished",
            plumber_testkit::PATIENCE,
            || {
                let log = world.daemon_log();
                log.find(&format!("delete-topic {retired}"))
                    .is_some_and(|at| log[at..].contains("cutover finished"))
            },
        );
        world.broker.restart();
    }
    plumber_testkit::wait_until(
        &format!("{retired} is deleted"),
        std::time::Duration::from_secs(60),
        || !world.topic_exists(&retired),
    );

    let log: Vec<String> = world.daemon_log().lines().map(str::to_owned).collect();
    let line_of = |what: &dyn Fn(&str) -> bool| log.iter().position(|l| what(l));
    let deleted = line_of(&|l| {
        l.contains("cutover action") && l.contains(&format!("delete-topic {retired}"))
    })
    .unwrap_or_else(|| panic!("the daemon never deleted {retired}"));
    for step in ["a", "b", "c"] {
        let group = world.internal_topic(&revisions[0], step);
        let stopped =
            line_of(&|l| l.contains("stopped; cutover offsets recorded") && l.contains(&group))
                .unwrap_or_else(|| panic!("{group} never recorded its stop"));
        assert!(
            stopped < deleted,
            "{retired} deleted (log line {deleted}) before {group} stopped (line {stopped})"
        );
    }
    assert!(
        !log.iter()
            .any(|l| l.contains(&format!("delete-topic {used}"))),
        "{used} is the new life's topic, never deleted"
    );

    if let Some(load) = load {
        assert!(world.topic_exists(&used), "{used} outlives the deletion");
        let (sent, final_from) = load.finish(200);
        world.assert_oracle(&revisions, sent, final_from);
    }
}

/// A revert (A → B → A) and a step removed then put back run their identities again: each
/// in a new life, so the kept internal topics of the earlier life (`--keep-topics` on tansu)
/// are never read again. Exactly once at every sink, branches included.
#[test]
fn a_revert_and_a_step_put_back_deliver_exactly_once() {
    let (world, plumber, load, mut revisions) = deployed("revert", 200);
    let with_branch = |m: Model| {
        m.processor(Proc::new("d", 1, &["a"]))
            .sink("out1", &["b", "d"])
    };
    let steps: Vec<(&str, Model)> = vec![
        ("a v2", revisions[0].clone().replace("a", 2)),
        (
            "add d reading a",
            with_branch(revisions[0].clone().replace("a", 2)),
        ),
        ("a v3", with_branch(revisions[0].clone().replace("a", 3))),
        (
            "revert a to v2",
            with_branch(revisions[0].clone().replace("a", 2)),
        ),
        (
            "remove d",
            revisions[0].clone().replace("a", 2).sink("out1", &["b"]),
        ),
        (
            "put d back",
            with_branch(revisions[0].clone().replace("a", 2)),
        ),
    ];
    for (message, model) in steps {
        let commit = world.commit(message, &model);
        revisions.push(model);
        plumber.wait_applied("t", commit);
        load.wait_for(load.sent() + 100);
    }
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
    // The revert ran a's v2 identity again, in its second life.
    let status = plumber.topology("t");
    let a = status["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == "a")
        .cloned()
        .unwrap_or_default();
    assert!(
        a["group"].as_str().is_some_and(|g| g.ends_with(".2")),
        "a runs in a new life: {a:#}"
    );
}

/// Kills the daemon (kill -9) after every action of the cutover to `commit` and starts it
/// again, each time also killing a processor when `processors_too`; returns the daemon that
/// saw the cutover end, how many times it was killed, and the processors killed.
fn kill_after_every_action(
    world: &World,
    mut plumber: Plumber,
    commit: git2::Oid,
    processors_too: bool,
) -> (Plumber, usize, Vec<Killed>) {
    let mut kills = 0;
    let mut killed = Vec::new();
    for done in 1.. {
        let finished = std::cell::Cell::new(false);
        plumber.wait_until(&format!("{done} cutover actions done"), |status| {
            let t = &status["topologies"][0];
            finished.set(t["commit"] == commit.to_string().as_str());
            finished.get() || t["cutover"]["done"].as_u64().is_some_and(|d| d >= done)
        });
        if finished.get() {
            break;
        }
        if processors_too {
            killed.push(world.kill_any_processor(kills));
        }
        plumber.kill();
        kills += 1;
        plumber = Plumber::up(world);
    }
    (plumber, kills, killed)
}

/// The most duplicates at the sinks that the crashes of `killed` can cause: each may repeat
/// the input records it had not committed, each of which reaches the sinks once per route
/// from its step (in any revision: the crash may come before or after the cutover).
fn duplicates_bound(revisions: &[Model], killed: &[(String, u64)]) -> u64 {
    killed
        .iter()
        .map(|(step, uncommitted)| {
            let routes = revisions.iter().map(|m| m.routes_from(step)).max();
            uncommitted * routes.unwrap_or(0) as u64
        })
        .sum()
}

#[test]
fn a_daemon_killed_mid_cutover_resumes_it_without_loss_or_duplicates() {
    let (world, plumber, load, mut revisions) = deployed("resume", 200);
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    let (plumber, kills, _) = kill_after_every_action(&world, plumber, r2, false);
    assert!(
        kills >= 3,
        "the cutover has several actions; killed only {kills} times"
    );
    plumber.wait_applied("t", r2);
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
    // Never two live instances of one step: the adopted processors were not started twice.
    world.assert_one_instance_per_group();
}

/// kill -9 of the daemon after every action of a cutover, and each time of one of the
/// processors too (old and new ones in turn). Nothing is lost; with transactions (a real
/// cluster) nothing is duplicated either; without (tansu) a killed processor repeats at most
/// what it had not committed.
#[test]
fn processors_and_the_daemon_killed_at_every_cutover_phase_lose_nothing() {
    let (world, plumber, load, mut revisions) = deployed("chaos", 200);
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    let (plumber, kills, killed) = kill_after_every_action(&world, plumber, r2, true);
    assert!(kills >= 3, "killed only {kills} times");
    assert_eq!(killed.len(), kills, "a processor killed with every daemon");
    plumber.wait_applied("t", r2);
    let (sent, final_from) = load.finish(200);
    let duplicates = world.assert_oracle_allowing_duplicates(&revisions, sent, final_from);
    let exposure: Vec<(String, u64)> = killed
        .iter()
        .map(|k| (k.step.clone(), k.uncommitted))
        .collect();
    let bound = duplicates_bound(&revisions, &exposure);
    eprintln!(
        "duplicates after {kills} kills of the daemon and a processor: {duplicates} (at most {bound}: {exposure:?})"
    );
    if world.broker.is_tansu() {
        assert!(
            duplicates as u64 <= bound,
            "{duplicates} duplicates; the crashes left only {bound} uncommitted: {killed:#?}"
        );
    } else {
        assert_eq!(duplicates, 0, "exactly-once processors duplicate nothing");
    }
    world.assert_one_instance_per_group();
}

#[test]
fn a_processor_killed_during_a_cutover_loses_nothing() {
    let (world, plumber, load, mut revisions) = deployed("crash", 300);
    let m = revisions[0].clone().replace("c", 2);
    let r2 = world.commit("c v2", &m);
    revisions.push(m);
    // The old b keeps running through this cutover; kill it hard while it happens.
    let killed = world.kill_processor("b");
    plumber.wait_applied("t", r2);
    let (sent, final_from) = load.finish(300);
    // At-least-once without transactions: a killed processor may duplicate what it had not
    // committed, never lose.
    let duplicates = world.assert_oracle_allowing_duplicates(&revisions, sent, final_from);
    let bound = duplicates_bound(&revisions, &[("b".into(), killed.uncommitted)]);
    eprintln!("duplicates after kill -9 of b: {duplicates} (at most {bound})");
    if world.broker.is_tansu() {
        assert!(
            duplicates as u64 <= bound,
            "{duplicates} duplicates; b had only {bound} records past its commits: {killed:#?}"
        );
    } else {
        assert_eq!(duplicates, 0, "exactly-once processors duplicate nothing");
    }
    // Its successor went on from where it had committed, never from further back.
    let after = world.committed(&killed.group, &inputs_of(&killed));
    for (partition, before) in &killed.committed {
        assert!(
            after[partition] >= *before,
            "{} committed {} on {partition:?} after the restart, {before} before the kill",
            killed.group,
            after[partition]
        );
    }
}

/// At least 20 commits of random graph edits under continuous load: replace, add, remove,
/// re-wire and scale steps, and invalid commits; some applied one by one, some in quick
/// succession (coalesced). `PLUMBER_TEST_SEED` replays a run; the seed is printed.
#[test]
fn random_edits_under_load_keep_the_oracle() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    let seed: u64 = std::env::var("PLUMBER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("random_edits_under_load_keep_the_oracle: PLUMBER_TEST_SEED={seed}");
    let _report = harness::SeedReport(seed);
    let mut rng = StdRng::seed_from_u64(seed);

    let world = World::new("random");
    let mut model = first();
    let mut revisions = vec![model.clone()];
    let r1 = world.commit("first", &model);
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    // tansu serves every storage request through one task: with up to ten processors and
    // their retiring lives polling it, 50 records a second outran it (the old lives never
    // drained: seed 1796374745773653315, before and after the warm successor).
    let load = world.start_load(20);
    let mut next_name = 0;
    let mut last = r1;
    let mut commit = 0;
    while commit < 22 {
        let procs: Vec<harness::Proc> = model.processors().into_iter().cloned().collect();
        let edit = rng.random_range(0..6);
        let (message, next) = match edit {
            0 => {
                let p = &procs[rng.random_range(0..procs.len())];
                (
                    format!("replace {}", p.name),
                    model.clone().replace(&p.name, p.version + 1),
                )
            }
            1 if procs.len() < 6 => {
                next_name += 1;
                let name = format!("n{next_name}");
                let mut upstream: Vec<String> = vec!["src".into()];
                upstream.extend(procs.iter().map(|p| p.name.clone()));
                let input = upstream[rng.random_range(0..upstream.len())].clone();
                let sink = if rng.random_bool(0.5) { "out1" } else { "out2" };
                let mut inputs = model.sink_inputs(sink).to_vec();
                inputs.push(name.clone());
                (
                    format!("add {name} reading {input} into {sink}"),
                    model
                        .clone()
                        .processor(Proc::new(&name, 1, &[input.as_str()]))
                        .sink_from(sink, inputs),
                )
            }
            2 => {
                // Remove a processor nobody reads, if the sinks keep an input.
                let removable: Vec<&harness::Proc> = procs
                    .iter()
                    .filter(|p| !model.is_read(&p.name))
                    .filter(|p| {
                        ["out1", "out2"]
                            .iter()
                            .all(|s| model.sink_inputs(s).iter().any(|i| i != &p.name))
                    })
                    .collect();
                let Some(p) = removable.first() else { continue };
                let mut next = model.clone().without(&p.name);
                for sink in ["out1", "out2"] {
                    let inputs: Vec<String> = model
                        .sink_inputs(sink)
                        .iter()
                        .filter(|i| *i != &p.name)
                        .cloned()
                        .collect();
                    next = next.sink_from(sink, inputs);
                }
                (format!("remove {}", p.name), next)
            }
            3 => {
                // Re-wire a processor to something created before it.
                let at = rng.random_range(0..procs.len());
                let p = &procs[at];
                let mut upstream: Vec<String> = vec!["src".into()];
                upstream.extend(procs[..at].iter().map(|q| q.name.clone()));
                let input = upstream[rng.random_range(0..upstream.len())].clone();
                if p.inputs == [input.clone()] {
                    continue;
                }
                (
                    format!("re-wire {} to {input}", p.name),
                    model.clone().rewire(&p.name, &[input]),
                )
            }
            4 => {
                let p = &procs[rng.random_range(0..procs.len())];
                let replicas = if p.replicas == 1 { 2 } else { 1 };
                (
                    format!("scale {} to {replicas}", p.name),
                    model.clone().scale(&p.name, replicas),
                )
            }
            _ => {
                let p = &procs[rng.random_range(0..procs.len())];
                let broken = world.commit_raw(
                    &format!("break {}", p.name),
                    &format!("topologies/t/steps/{}.yaml", p.name),
                    "kind: processor\ninput: src\njq: '.path += ['\n",
                );
                eprintln!("commit {commit}: invalid {broken}");
                commit += 1;
                continue;
            }
        };
        last = world.commit(&message, &next);
        eprintln!("commit {commit}: {message} ({last})");
        commit += 1;
        model = next;
        revisions.push(model.clone());
        if rng.random_bool(0.6) {
            plumber.wait_applied("t", last);
        }
    }
    plumber.wait_applied("t", last);
    let (sent, final_from) = load.finish(100);
    world.assert_oracle(&revisions, sent, final_from);
}

#[test]
fn a_broker_restart_during_a_cutover_loses_nothing() {
    let (mut world, plumber, load, mut revisions) = deployed("broker", 300);
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    plumber.wait_until("the cutover has begun", |status| {
        let t = &status["topologies"][0];
        t["cutover"]["done"].as_u64().is_some_and(|d| d >= 1)
            || t["commit"] == r2.to_string().as_str()
    });
    let groups = world.running_groups();
    world.broker.restart();
    // What each group had not committed when the broker went away, plus one commit interval
    // of input (records read after it came back, before a rebalance its return caused).
    let exposure: Vec<(String, u64)> = groups
        .iter()
        .map(|(step, committed)| (step.clone(), world.uncommitted(committed) + RATE))
        .collect();
    plumber.wait_applied("t", r2);
    let (sent, final_from) = load.finish(300);
    // Processors that lost the broker may have produced past their last commit.
    let duplicates = world.assert_oracle_allowing_duplicates(&revisions, sent, final_from);
    let bound = duplicates_bound(&revisions, &exposure);
    eprintln!("duplicates after a broker restart: {duplicates} (at most {bound}: {exposure:?})");
    if world.broker.is_tansu() {
        assert!(
            duplicates as u64 <= bound,
            "{duplicates} duplicates; the processors had {bound} records past their commits"
        );
    } else {
        assert_eq!(duplicates, 0, "exactly-once processors duplicate nothing");
    }
}

#[test]
fn a_remote_repository_is_mirrored_and_fetched_on_a_signed_push_webhook() {
    use hmac::{Hmac, Mac};
    let world = World::new("hook");
    let r1 = world.commit("first", &first());
    let secret = world.scratch_file("secret", "s3cret\n");
    let plumber = Plumber::start(
        &world,
        &world.repo_url(),
        &[
            "--poll-interval",
            "3600",
            "--webhook-secret-file",
            secret.to_str().unwrap(),
        ],
    );
    plumber.wait_applied("t", r1);
    let r2 = world.commit("a v2", &first().replace("a", 2));
    let body = br#"{"ref":"refs/heads/main"}"#;
    assert_eq!(plumber.hook(body, None), 401, "an unsigned push is refused");
    assert_eq!(
        plumber.hook(body, Some("sha256=00")),
        401,
        "a wrong signature is refused"
    );
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"s3cret").unwrap();
    mac.update(body);
    let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(plumber.hook(body, Some(&signature)), 202);
    plumber.wait_applied("t", r2);
}

#[test]
fn a_remote_repository_is_polled() {
    let world = World::new("poll");
    let r1 = world.commit("first", &first());
    let plumber = Plumber::start(&world, &world.repo_url(), &["--poll-interval", "1"]);
    plumber.wait_applied("t", r1);
    let r2 = world.commit("a v2", &first().replace("a", 2));
    plumber.wait_applied("t", r2);
}

/// A successor that never gets warm (its command does not exist, so its processor exits
/// before it joins its group, again and again) leaves the old life running: the old `a` goes
/// on consuming, status says what its stop waits for, and a fixing commit then cuts over
/// from where it got to, nothing lost.
#[test]
fn a_successor_that_never_gets_warm_leaves_the_old_life_running() {
    let (world, plumber, load, mut revisions) = deployed("never-warm", 200);
    let old_a = world.internal_topic(&revisions[0], "a");
    world.commit_raw(
        "a: a command that does not exist",
        "topologies/t/steps/a.yaml",
        "kind: processor\ninput: src\nexec:\n  command: [plumber-test-no-such-command]\n",
    );
    plumber.wait_until("the old a's stop waits for its warm successor", |status| {
        waits_for(status, "t", "to start warm")
    });
    let source = [world.source_topic().to_owned()];
    let consumed = |offsets: &harness::Offsets| offsets.values().sum::<i64>();
    let before = consumed(&world.committed(&old_a, &source));
    load.wait_for(load.sent() + 200);
    plumber_testkit::wait_until("the old a goes on consuming", harness::PATIENCE, || {
        consumed(&world.committed(&old_a, &source)) >= before + 200
    });
    let m = revisions[0].clone().replace("a", 2);
    let fixed = world.commit("a v2", &m);
    revisions.push(m);
    plumber.wait_applied("t", fixed);
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
}

/// Topology `x` whose second step never answers (an exec child that hangs), so any cutover
/// that must drain it cannot finish.
fn stuck_topology(world: &World, p1_version: u32, sink: &str) -> Vec<(String, String)> {
    vec![
        (
            "topologies/x/src.yaml".into(),
            format!("kind: source\ntopic: {}\n", world.source_topic()),
        ),
        (
            "topologies/x/p1.yaml".into(),
            format!("kind: processor\ninput: src\njq: '.p1 = {p1_version}'\nstartFrom: earliest\n"),
        ),
        (
            "topologies/x/p2.yaml".into(),
            "kind: processor\ninput: p1\nexec:\n  command: [python3, -c, 'import time; time.sleep(10**9)']\n".into(),
        ),
        (
            "topologies/x/out.yaml".into(),
            format!("kind: sink\ntopic: {sink}\ninput: p2\n"),
        ),
    ]
}

#[test]
fn a_stuck_cutover_does_not_hold_up_another_topology() {
    let world = World::new("isolated");
    let sink = world.topic("isolated-x-out");
    let r1 = world.commit_with("t and x", &first(), &stuck_topology(&world, 1, &sink));
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    plumber.wait_applied("x", r1);
    let load = world.start_load(50);
    load.wait_for(100);
    // Replacing x's p1 makes the old p2 drain, which never happens.
    world.commit_with("x: p1 v2", &first(), &stuck_topology(&world, 2, &sink));
    plumber.wait_until("x drains its stuck step", |status| {
        status["topologies"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| {
                t["name"] == "x"
                    && t["cutover"]["current"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("drain-processor"))
            })
    });
    // Meanwhile t moves on.
    let m = first().replace("a", 2);
    let r3 = world.commit_with("t: a v2", &m, &stuck_topology(&world, 2, &sink));
    plumber.wait_applied("t", r3);
    // x moves to the newest commit too (nothing changed for it), still waiting for its drain,
    // and says so.
    plumber.wait_until("x waits for its drain on the way to r3", |status| {
        status["topologies"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| {
                t["name"] == "x"
                    && t["phase"] == "cutover"
                    && t["cutover"]["to"] == r3.to_string().as_str()
                    && t["cutover"]["waiting"].as_array().is_some_and(|w| {
                        w.iter().any(|w| {
                            w["action"]
                                .as_str()
                                .is_some_and(|a| a.starts_with("drain-processor plumber.x.p2."))
                        })
                    })
            })
    });
    let (sent, final_from) = load.finish(100);
    world.assert_oracle(&[first(), m], sent, final_from);
}

/// Whether `topology`'s cutover waits for an action whose reason contains `reason`.
fn waits_for(status: &serde_json::Value, topology: &str, reason: &str) -> bool {
    status["topologies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["name"] == topology)
        .flat_map(|t| {
            t["cutover"]["waiting"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .any(|w| w["reason"].as_str().is_some_and(|r| r.contains(reason)))
}

/// Stuck: a source topic that does not exist. Its step waits (status says for what), the
/// rest of the topology and the other topology run; once the topic exists the step starts
/// by itself and nothing written to it is lost.
#[test]
fn a_missing_source_topic_holds_only_its_steps_until_it_exists() {
    let world = World::new("missing");
    let late = plumber_testkit::unique("missing-late");
    let late_out = world.topic("missing-late-out");
    let late_topology = vec![
        (
            "topologies/y/late.yaml".to_owned(),
            format!("kind: source\ntopic: {late}\n"),
        ),
        (
            "topologies/y/copy.yaml".to_owned(),
            "kind: processor\ninput: late\njq: '.'\nstartFrom: earliest\n".to_owned(),
        ),
        (
            "topologies/y/out.yaml".to_owned(),
            format!("kind: sink\ntopic: {late_out}\ninput: copy\n"),
        ),
    ];
    let r1 = world.commit_with("t, and y on a topic not made yet", &first(), &late_topology);
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r1);
    let load = world.start_load(50);
    plumber.wait_until("y waits for its source topic", |status| {
        waits_for(status, "y", &format!("topic {late} does not exist"))
    });
    // Meanwhile t moves on.
    let m = first().replace("a", 2);
    let r2 = world.commit_with("t: a v2", &m, &late_topology);
    plumber.wait_applied("t", r2);
    // The data engineer creates the topic and writes to it: y starts by itself.
    world.broker.create_topic(&late, 2);
    let records: Vec<plumber_testkit::TestRecord> = (0..50)
        .map(|i| plumber_testkit::TestRecord::new(&format!("k{i}"), &format!("{{\"n\":{i}}}")))
        .collect();
    world.broker.produce(&late, &records);
    plumber.wait_applied("y", r2);
    plumber_testkit::wait_until(
        "y copied every record",
        std::time::Duration::from_secs(180),
        || world.broker.read_all(&late_out).len() >= 50,
    );
    assert_eq!(
        world.broker.read_all(&late_out).len(),
        50,
        "each record once"
    );
    let (sent, final_from) = load.finish(100);
    world.assert_oracle(&[first(), m], sent, final_from);
}

/// Stuck: an action that fails again and again (the internal topic exists with another
/// partition count, made by hand). Status shows the failure; a commit that changes the step
/// (a new identity, so a new topic) is applied, and nothing is lost.
#[test]
fn a_topic_with_another_partition_count_is_reported_and_a_fixing_commit_applies() {
    let world = World::new("partitions");
    let broken = first();
    world
        .broker
        .create_topic(&world.internal_topic(&broken, "a"), 1);
    let load = world.start_load(50);
    load.wait_for(100);
    world.commit("first, onto a squatted topic", &broken);
    let plumber = Plumber::up(&world);
    plumber.wait_until("the failing create-topic is reported", |status| {
        waits_for(status, "t", "partitions, but 2 are wanted")
            && status["topologies"][0]["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("create-topic"))
    });
    let fixed = first().replace("a", 2);
    let r2 = world.commit("a v2: its own topic", &fixed);
    plumber.wait_applied("t", r2);
    let (sent, final_from) = load.finish(100);
    world.assert_oracle(&[fixed], sent, final_from);
}

/// Stuck before: the commit a topology last ran can no longer be read (the branch was
/// force-pushed and the old commits pruned). The daemon plans from what runs, not from that
/// commit's files, so the new head is applied and nothing is lost.
#[test]
fn a_force_push_that_drops_the_running_commit_is_followed() {
    let (world, mut plumber, load, mut revisions) = deployed("force", 200);
    let r1 = plumber.applied("t").expect("r1 applied");
    let m = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &m);
    revisions.push(m);
    plumber.wait_applied("t", r2);
    load.wait_for(load.sent() + 100);
    // Rewrite history: main goes back to r1 and on from there; r2 is gone for good.
    world.force_main(git2::Oid::from_str(&r1).unwrap());
    let m = revisions[0].clone().replace("a", 3);
    let r3 = world.commit("a v3, on top of r1", &m);
    revisions.push(m);
    // A daemon that starts now has never seen r2: nothing of it can be read any more.
    plumber.kill();
    world.prune_unreachable();
    let plumber = Plumber::up(&world);
    plumber.wait_applied("t", r3);
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
}
