//! Plans between real commits: change classes, identities, and the exact order of the cutover
//! actions for the cases SPEC §4 describes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use common::{TestRepo, remove, run, validate_commit, write};
use plumber::plan::{Action, Change, Plan, StartPosition, plan};

const SOURCE: &str = "kind: source\ntopic: in\n";
const SINK: &str = "kind: sink\ntopic: out\ninput: b\n";

fn processor(input: &str, jq: &str, extra: &str) -> String {
    format!("kind: processor\ninput: {input}\njq: '{jq}'\n{extra}")
}

/// `in → a → b → out`, committed on `main`.
fn linear(repo: &TestRepo, topology_yaml: &str) -> git2::Oid {
    repo.commit(
        "main",
        "linear",
        &[
            write("topologies/t/topology.yaml", topology_yaml),
            write("topologies/t/sources/in.yaml", SOURCE),
            write("topologies/t/steps/a.yaml", processor("in", ".", "")),
            write("topologies/t/steps/b.yaml", processor("a", ".", "")),
            write("topologies/t/sinks/out.yaml", SINK),
        ],
    )
}

fn plan_between(repo: &TestRepo, from: Option<git2::Oid>, to: git2::Oid) -> Plan {
    let old = from.map(|c| validate_commit(repo, c));
    let new = validate_commit(repo, to);
    let new_graphs = new.topologies.expect("valid `to`");
    let old_graphs = old.map(|v| v.topologies.expect("valid `from`"));
    let from_sha = from.map(|c| c.to_string());
    let to_sha = to.to_string();
    plan(
        from_sha.as_deref().zip(old_graphs.as_deref()),
        (&to_sha, &new_graphs),
    )
}

/// Actions as short strings: `verb step-or-topic`, with groups abbreviated by step name.
fn script(plan: &Plan) -> Vec<String> {
    plan.topologies
        .iter()
        .flat_map(|t| &t.actions)
        .map(|action| match action {
            Action::CreateTopic { topic, .. } => format!("create {}", abbreviate(topic)),
            Action::HandOff { step, .. } => format!("hand-off {step}"),
            Action::StartProcessor(s) | Action::StartWarm(s) => {
                let inputs: Vec<String> = s
                    .inputs
                    .iter()
                    .map(|i| {
                        let from = match i.from {
                            StartPosition::Earliest => "earliest",
                            StartPosition::Latest => "latest",
                            StartPosition::Cutover => "cutover",
                        };
                        format!("{}@{from}", abbreviate(&i.topic))
                    })
                    .collect();
                let verb = if matches!(action, Action::StartWarm(_)) {
                    "start-warm"
                } else {
                    "start"
                };
                format!("{verb} {} [{}]", s.step, inputs.join(" "))
            }
            Action::UpdateProcessor { step, scale, .. } => {
                format!("scale {step} {}..{}", scale.min, scale.max)
            }
            Action::DrainProcessor { step, topics, .. } => format!(
                "drain {step} [{}]",
                topics
                    .iter()
                    .map(|t| abbreviate(t))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Action::StopProcessor {
                step,
                group,
                successor,
                hand_over,
                ..
            } => match successor {
                Some(successor) => {
                    assert_ne!(group, successor);
                    format!(
                        "stop {step} hand-over [{}]",
                        hand_over
                            .iter()
                            .map(|t| abbreviate(t))
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                }
                None => format!("stop {step}"),
            },
            Action::DeleteTopic { topic } => format!("delete {}", abbreviate(topic)),
            Action::DeleteGroups { base, .. } => format!("delete-groups {}", abbreviate(base)),
        })
        .collect()
}

/// `plumber.t.a.0123456789ab` → `a.0123`; user topics stay as they are.
fn abbreviate(topic: &str) -> String {
    match topic.strip_prefix("plumber.t.") {
        Some(rest) => match rest.split_once('.') {
            Some((step, id)) => format!("{step}.{}", &id[..4.min(id.len())]),
            None => rest.to_owned(),
        },
        None => topic.to_owned(),
    }
}

fn changes(plan: &Plan) -> Vec<(String, Change)> {
    plan.topologies
        .iter()
        .flat_map(|t| &t.steps)
        .map(|s| (s.name.clone(), s.change))
        .collect()
}

fn group_id(plan: &Plan, step: &str, new: bool) -> String {
    let s = plan.topologies[0]
        .steps
        .iter()
        .find(|s| s.name == step)
        .unwrap();
    let id = if new { s.identity.to } else { s.identity.from };
    format!("{step}.{}", &id.unwrap().short()[..4])
}

#[test]
fn the_plan_from_a_commit_to_itself_is_empty() {
    let repo = TestRepo::new();
    let c = linear(&repo, "cutover: parallel\n");
    let p = plan_between(&repo, Some(c), c);
    assert!(p.is_empty());
    assert!(script(&p).is_empty());
    assert!(changes(&p).iter().all(|(_, c)| *c == Change::Unchanged));
}

#[test]
fn first_deploy_creates_topics_and_starts_downstream_first() {
    let repo = TestRepo::new();
    let c = linear(&repo, "cutover: parallel\n");
    let p = plan_between(&repo, None, c);
    let a = group_id(&p, "a", true);
    assert_eq!(
        script(&p),
        vec![
            format!("create {a}"),
            "create a.dlq".to_string(),
            "create b.dlq".to_string(),
            format!("start b [{a}@earliest]"),
            "start a [in@latest]".to_string(),
        ]
    );
    assert!(changes(&p).iter().all(|(_, c)| *c == Change::Added));
}

#[test]
fn internal_and_dead_letter_topics_get_the_replication_and_settings_of_the_defaults() {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        "replicated",
        &[write(
            "plumber.yaml",
            "clusters: { default: { bootstrap: \"b:9092\" } }\ndefaults:\n  replication: 3\n  topicConfig: { retention.ms: 86400000, min.insync.replicas: 2 }\n",
        )],
    );
    let c = linear(
        &repo,
        "defaults: { replication: 2, topicConfig: { retention.ms: 3600000 } }\n",
    );
    let p = plan_between(&repo, None, c);
    let replicas: Vec<(String, Option<u32>)> = p.topologies[0]
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateTopic {
                topic, replication, ..
            } => Some((topic.clone(), *replication)),
            _ => None,
        })
        .collect();
    assert_eq!(replicas.len(), 3);
    assert!(
        replicas.iter().all(|(_, r)| *r == Some(2)),
        "topology.yaml overrides plumber.yaml: {replicas:?}"
    );
    let Action::CreateTopic { config, .. } = &p.topologies[0].actions[0] else {
        panic!("the first action creates a topic");
    };
    assert_eq!(
        config,
        &std::collections::BTreeMap::from([
            ("min.insync.replicas".to_owned(), "2".to_owned()),
            ("retention.ms".to_owned(), "3600000".to_owned()),
        ]),
        "settings merge, topology.yaml's win"
    );
    let text = plumber::output::plan::describe(&p.topologies[0].actions[0]);
    assert!(text.contains("2 replicas"), "{text}");
    // Out of range: an error at the key.
    let bad = repo.commit(
        "main",
        "zero replicas",
        &[write(
            "topologies/t/topology.yaml",
            "defaults: { replication: 0 }\n",
        )],
    );
    let validation = validate_commit(&repo, bad);
    let error = validation.errors().next().expect("an error");
    assert_eq!(error.file, "topologies/t/topology.yaml");
    assert!(error.to_string().contains("invalid-value"), "{error}");
    // A compacted internal topic could drop records before their readers saw them.
    let compacted = repo.commit(
        "main",
        "compacted",
        &[write(
            "topologies/t/topology.yaml",
            "defaults:\n  topicConfig:\n    cleanup.policy: compact\n",
        )],
    );
    let validation = validate_commit(&repo, compacted);
    let error = validation.errors().next().expect("an error");
    assert_eq!(
        (error.file.as_str(), error.line),
        ("topologies/t/topology.yaml", Some(3))
    );
    assert!(error.to_string().contains("cleanup.policy"), "{error}");
}

#[test]
fn replacing_a_source_connected_step_hands_over_offsets_and_drains_the_old_subtree() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "cutover: parallel\n");
    let c2 = repo.commit(
        "main",
        "change a",
        &[write(
            "topologies/t/steps/a.yaml",
            processor("in", "select(.x)", ""),
        )],
    );
    let p = plan_between(&repo, Some(c1), c2);
    assert_eq!(
        changes(&p),
        vec![
            ("in".to_string(), Change::Unchanged),
            ("a".to_string(), Change::Replaced),
            ("b".to_string(), Change::Replaced),
            ("out".to_string(), Change::Unchanged),
        ]
    );
    let (old_a, new_a) = (group_id(&p, "a", false), group_id(&p, "a", true));
    assert_eq!(
        script(&p),
        vec![
            format!("create {new_a}"),
            format!("start b [{new_a}@earliest]"),
            // The new `a` joins its group before the old one stops, and reads from where
            // the old one stopped once it is handed its offsets.
            "start-warm a [in@cutover]".to_string(),
            "stop a hand-over [in]".to_string(),
            "hand-off a".to_string(),
            format!("drain b [{old_a}]"),
            "stop b".to_string(),
            format!("delete {old_a}"),
        ]
    );
}

#[test]
fn ordered_cutover_holds_new_steps_until_the_old_subtree_drained() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "cutover: ordered\n");
    let c2 = repo.commit(
        "main",
        "change a",
        &[write(
            "topologies/t/steps/a.yaml",
            processor("in", "select(.x)", ""),
        )],
    );
    let p = plan_between(&repo, Some(c1), c2);
    let (old_a, new_a) = (group_id(&p, "a", false), group_id(&p, "a", true));
    assert_eq!(
        script(&p),
        vec![
            format!("create {new_a}"),
            // Warm at once; handed off only once the old subtree stopped.
            "start-warm a [in@cutover]".to_string(),
            "stop a hand-over [in]".to_string(),
            format!("drain b [{old_a}]"),
            "stop b".to_string(),
            format!("start b [{new_a}@earliest]"),
            "hand-off a".to_string(),
            format!("delete {old_a}"),
        ]
    );
}

#[test]
fn replacing_a_leaf_touches_nothing_upstream() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "cutover: parallel\n");
    let c2 = repo.commit(
        "main",
        "change b",
        &[write(
            "topologies/t/steps/b.yaml",
            processor("a", "select(.y)", ""),
        )],
    );
    let p = plan_between(&repo, Some(c1), c2);
    let a = group_id(&p, "a", true);
    assert_eq!(
        script(&p),
        vec![
            format!("start-warm b [{a}@cutover]"),
            format!("stop b hand-over [{a}]"),
            "hand-off b".to_string(),
        ]
    );
    assert_eq!(changes(&p)[1], ("a".to_string(), Change::Unchanged));
}

#[test]
fn scale_changes_apply_in_place() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "cutover: parallel\n");
    let c2 = repo.commit(
        "main",
        "scale a",
        &[write(
            "topologies/t/steps/a.yaml",
            processor("in", ".", "scale: { min: 2, max: 8 }\n"),
        )],
    );
    let p = plan_between(&repo, Some(c1), c2);
    assert_eq!(script(&p), vec!["scale a 2..8".to_string()]);
    assert_eq!(changes(&p)[1], ("a".to_string(), Change::Updated));
    assert_eq!(p.topologies[0].change, Change::Changed);
}

#[test]
fn moving_a_file_or_reordering_keys_changes_nothing() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "cutover: parallel\n");
    let c2 = repo.commit(
        "main",
        "reorganise",
        &[
            remove("topologies/t/steps/a.yaml"),
            write(
                "topologies/t/steps/deeper/a.yml",
                "jq: '.'\n# same step, moved and reordered\ninput: [in]\nkind: processor\n",
            ),
        ],
    );
    let p = plan_between(&repo, Some(c1), c2);
    assert!(p.is_empty(), "{:#?}", p);
}

#[test]
fn added_steps_start_at_start_from_and_removed_topologies_drain_and_delete() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "cutover: parallel\n");
    let c2 = repo.commit(
        "main",
        "add c",
        &[
            write(
                "topologies/t/steps/c.yaml",
                processor("a", ".", "startFrom: earliest\n"),
            ),
            write(
                "topologies/t/sinks/c-out.yaml",
                "kind: sink\ntopic: c-out\ninput: c\n",
            ),
        ],
    );
    let p = plan_between(&repo, Some(c1), c2);
    let a = group_id(&p, "a", true);
    assert_eq!(
        script(&p),
        vec![
            "create c.dlq".to_string(),
            format!("start c [{a}@earliest]")
        ]
    );

    let c3 = repo.commit_snapshot("main", "remove everything", &[]);
    let p = plan_between(&repo, Some(c2), c3);
    assert_eq!(p.topologies[0].change, Change::Removed);
    let a_old = group_id(&p, "a", false);
    assert_eq!(
        script(&p),
        vec![
            "stop a".to_string(),
            format!("drain b [{a_old}]"),
            "stop b".to_string(),
            format!("drain c [{a_old}]"),
            "stop c".to_string(),
            format!("delete {a_old}"),
        ]
    );
}

#[test]
fn plan_cli_merge_preview_and_conflicts() {
    let repo = TestRepo::new();
    let base = linear(&repo, "cutover: parallel\n");
    repo.git
        .branch("feature", &repo.git.find_commit(base).unwrap(), false)
        .unwrap();
    repo.commit(
        "feature",
        "change b",
        &[write(
            "topologies/t/steps/b.yaml",
            processor("a", "select(.y)", ""),
        )],
    );
    let objects_before = count_files(&repo.path().join(".git/objects"));
    let (code, stdout, stderr) = run(&[
        "plan",
        &repo.location(),
        "--base",
        "main",
        "--head",
        "feature",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["valid"], true);
    assert_eq!(json["topologies"][0]["steps"][2]["name"], "b");
    assert_eq!(json["topologies"][0]["steps"][2]["change"], "replaced");
    assert_eq!(
        count_files(&repo.path().join(".git/objects")),
        objects_before,
        "a merge preview writes nothing to the repository"
    );

    // Both branches change b differently: a conflict, exit 1, the file named.
    repo.commit(
        "main",
        "change b on main",
        &[write(
            "topologies/t/steps/b.yaml",
            processor("a", "select(.z)", ""),
        )],
    );
    let (code, _, stderr) = run(&[
        "plan",
        &repo.location(),
        "--base",
        "main",
        "--head",
        "feature",
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("topologies/t/steps/b.yaml"), "{stderr}");
}

#[test]
fn plan_cli_refuses_invalid_commits_with_their_errors() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "cutover: parallel\n");
    repo.commit(
        "main",
        "break b",
        &[write(
            "topologies/t/steps/b.yaml",
            processor("nope", ".", ""),
        )],
    );
    let (code, stdout, _) = run(&[
        "plan",
        &repo.location(),
        "--from",
        &c1.to_string(),
        "--to",
        "HEAD",
        "--format",
        "json",
    ]);
    assert_eq!(code, 1);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["valid"], false);
    assert_eq!(json["errors"][0]["code"], "unknown-input");
    assert_eq!(json["topologies"], serde_json::json!([]));
}

fn count_files(dir: &std::path::Path) -> usize {
    let mut count = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                count += 1;
            }
        }
    }
    count
}

/// `in → counts → out`, where `counts` keeps state.
fn counting(repo: &TestRepo, counts: &str) -> git2::Oid {
    repo.commit(
        "main",
        "counting",
        &[
            write("topologies/t/sources/in.yaml", SOURCE),
            write("topologies/t/steps/counts.yaml", counts),
            write(
                "topologies/t/sinks/out.yaml",
                "kind: sink\ntopic: out\ninput: counts\n",
            ),
        ],
    )
}

fn stateful(sql: &str, extra: &str) -> String {
    format!("kind: processor\ninput: in\nsql: \"{sql}\"\n{extra}")
}

/// The start of `step` in `plan`, and what its state starts from.
fn state_of(plan: &Plan, step: &str) -> plumber::plan::StateRun {
    plan.topologies
        .iter()
        .flat_map(|t| &t.actions)
        .find_map(|a| match a {
            Action::StartProcessor(s) if s.step == step => s.state.clone(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no stateful start of {step}: {:?}", script(plan)))
}

/// Per stateful step, the plan says what its new life's state starts from: the same state
/// restores the old changelog; a changed windowed query rebuilds over its window and grace
/// into a new one (the old one deleted once its life stopped); a changed running aggregate
/// cannot be carried over, and the move waits until the step file chooses; with the choice,
/// it goes.
#[test]
fn a_stateful_step_s_plan_says_what_its_state_starts_from() {
    const WINDOWED: &str =
        "SELECT _key, COUNT(*) AS n FROM in GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)";
    let repo = TestRepo::new();
    let c1 = counting(&repo, &stateful(WINDOWED, "grace: 10s\n"));
    let first = plan_between(&repo, None, c1);
    let created = state_of(&first, "counts");
    assert_eq!(created.carry, plumber::plan::Carry::Empty);
    assert!(
        first.topologies[0].actions.iter().any(|a| matches!(a,
            Action::CreateTopic { topic, like: Some(like), config, .. }
                if *topic == created.topic && like == "in"
                    && config.get("cleanup.policy").map(String::as_str) == Some("compact"))),
        "the changelog is created compacted, with the input's partitions: {:?}",
        script(&first)
    );
    assert!(created.topic.starts_with("plumber.t.counts.") && created.topic.ends_with(".state"));

    // Only the select list changes: the same state, under the same changelog.
    let c2 = repo.commit(
        "main",
        "rename",
        &[write(
            "topologies/t/steps/counts.yaml",
            stateful(&WINDOWED.replace("AS n", "AS clicks"), "grace: 10s\n"),
        )],
    );
    let renamed = plan_between(&repo, Some(c1), c2);
    let kept = state_of(&renamed, "counts");
    assert_eq!(
        kept,
        plumber::plan::StateRun {
            topic: created.topic.clone(),
            carry: plumber::plan::Carry::Restore
        }
    );
    assert!(
        !script(&renamed).iter().any(|a| a.contains(".state")),
        "{:?}",
        script(&renamed)
    );

    // A new WHERE: rebuilt over the window and the grace, into a new changelog.
    let c3 = repo.commit(
        "main",
        "filter",
        &[write(
            "topologies/t/steps/counts.yaml",
            stateful(
                &WINDOWED.replace("FROM in", "FROM in WHERE ok"),
                "grace: 10s\n",
            ),
        )],
    );
    let filtered = plan_between(&repo, Some(c1), c3);
    let rebuilt = state_of(&filtered, "counts");
    assert_eq!(
        rebuilt.carry,
        plumber::plan::Carry::Rebuild { span_ms: 70_000 }
    );
    assert_ne!(rebuilt.topic, created.topic);
    let steps = script(&filtered);
    let stop = steps
        .iter()
        .position(|a| a.starts_with("stop counts"))
        .unwrap();
    let delete = steps
        .iter()
        .position(|a| {
            *a == format!(
                "delete {}",
                created
                    .topic
                    .trim_start_matches("plumber.t.")
                    .split_once('.')
                    .map(|(s, id)| format!("{s}.{}", &id[..4]))
                    .unwrap()
            )
        })
        .unwrap_or_else(|| panic!("the old changelog is deleted: {steps:?}"));
    assert!(stop < delete, "{steps:?}");
    let text = plumber::output::plan::describe(
        filtered.topologies[0]
            .actions
            .iter()
            .find(|a| matches!(a, Action::StartProcessor(_)))
            .unwrap(),
    );
    assert!(text.contains("state: rebuilt into"), "{text}");
    assert!(text.contains("1m 10s before the cutover offsets"), "{text}");

    // A running count whose WHERE changes: no bounded history rebuilds it.
    const RUNNING: &str = "SELECT _key, COUNT(*) AS n FROM in GROUP BY _key";
    let c4 = counting(&repo, &stateful(RUNNING, ""));
    let c5 = repo.commit(
        "main",
        "filter the running count",
        &[write(
            "topologies/t/steps/counts.yaml",
            stateful(&RUNNING.replace("FROM in", "FROM in WHERE ok"), ""),
        )],
    );
    let waiting = plan_between(&repo, Some(c4), c5);
    let plumber::plan::Carry::Cannot { why } = state_of(&waiting, "counts").carry else {
        panic!("{:?}", state_of(&waiting, "counts"));
    };
    assert!(why.contains("covers every record ever read"), "{why}");
    let text = plumber::output::plan::describe(
        waiting.topologies[0]
            .actions
            .iter()
            .find(|a| matches!(a, Action::StartProcessor(_)))
            .unwrap(),
    );
    assert!(
        text.contains("CANNOT be carried over") && text.contains("stateStart: empty"),
        "{text}"
    );
    // The pull request comment says it apart from the actions, whatever its budget cuts.
    let comment = plumber::output::plan::markdown(
        &waiting,
        &validate_commit(&repo, c5).topologies.unwrap(),
        &validate_commit(&repo, c4).topologies.unwrap(),
    );
    assert!(
        comment.contains(
            "State of the stateful steps that start:\n\n- `counts`: CANNOT be carried over"
        ),
        "{comment}"
    );
    // The engine makes no move until the step file chooses.
    let old = validate_commit(&repo, c4).topologies.unwrap();
    let new = validate_commit(&repo, c5).topologies.unwrap();
    let deployed = plumber::plan::deployment::Deployment::of(&old[0]);
    let pending = plumber::plan::moves::remaining("t", &deployed, Some(&new[0]));
    assert!(!pending.is_empty());
    assert!(
        pending.iter().all(|p| p.blocked_by.is_some()),
        "{pending:?}"
    );
    assert!(
        pending
            .iter()
            .any(|p| matches!(p.action, Action::StopProcessor { .. })
                && p.blocked_by
                    .as_deref()
                    .is_some_and(|b| b.contains("set `stateStart: empty`"))),
        "the old life keeps running, and the wait says why: {pending:?}"
    );

    let c6 = repo.commit(
        "main",
        "start the filtered count empty",
        &[write(
            "topologies/t/steps/counts.yaml",
            stateful(
                &RUNNING.replace("FROM in", "FROM in WHERE ok"),
                "stateStart: empty\n",
            ),
        )],
    );
    assert_eq!(
        state_of(&plan_between(&repo, Some(c4), c6), "counts").carry,
        plumber::plan::Carry::Empty
    );
    let c7 = repo.commit(
        "main",
        "rebuild the filtered count from the earliest",
        &[write(
            "topologies/t/steps/counts.yaml",
            stateful(
                &RUNNING.replace("FROM in", "FROM in WHERE ok"),
                "stateStart: earliest\n",
            ),
        )],
    );
    assert_eq!(
        state_of(&plan_between(&repo, Some(c4), c7), "counts").carry,
        plumber::plan::Carry::Earliest
    );
}

/// A stateful step's own `partitions` (its output's) and `scale` keep its state: the
/// changelog is keyed by the input's partitions, which neither changes. An upstream step
/// replaced gives it another input topic, whose offsets the old state knows nothing of: the
/// plan says it cannot carry the state over, and why.
#[test]
fn a_stateful_step_keeps_its_state_across_its_own_partitions_and_scale_not_a_new_input() {
    const WINDOWED: &str =
        "SELECT _key, COUNT(*) AS n FROM in GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)";
    let repo = TestRepo::new();
    let c1 = counting(&repo, &stateful(WINDOWED, ""));
    let first = state_of(&plan_between(&repo, None, c1), "counts");
    let c2 = repo.commit(
        "main",
        "more partitions and instances",
        &[write(
            "topologies/t/steps/counts.yaml",
            stateful(WINDOWED, "partitions: 12\nscale: { min: 2, max: 4 }\n"),
        )],
    );
    let resized = plan_between(&repo, Some(c1), c2);
    assert_eq!(
        state_of(&resized, "counts"),
        plumber::plan::StateRun {
            topic: first.topic.clone(),
            carry: plumber::plan::Carry::Restore
        },
        "{:?}",
        script(&resized)
    );

    let upstream = |jq: &str| {
        [
            write("topologies/t/sources/in.yaml", SOURCE),
            write(
                "topologies/t/steps/clean.yaml",
                format!("kind: processor\ninput: in\njq: '{jq}'\n"),
            ),
            write(
                "topologies/t/steps/counts.yaml",
                "kind: processor\ninput: clean\nsql: \"SELECT _key, COUNT(*) AS n FROM clean \
                 GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)\"\n",
            ),
            write(
                "topologies/t/sinks/out.yaml",
                "kind: sink\ntopic: out\ninput: counts\n",
            ),
        ]
    };
    let repo = TestRepo::new();
    let u1 = repo.commit("main", "clean, then count", &upstream("."));
    let u2 = repo.commit("main", "clean more", &upstream("select(.ok)"));
    let moved = state_of(&plan_between(&repo, Some(u1), u2), "counts");
    match moved.carry {
        plumber::plan::Carry::Cannot { why } => {
            assert!(why.contains("is new in this move"), "{why}")
        }
        other => panic!("a new input topic cannot keep the state: {other:?}"),
    }
}
