//! Property tests over random DAGs: identities depend on exactly what SPEC §4 says, and every
//! plan orders its actions so that nothing is read before it exists or lost before it drained.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::collections::{BTreeMap, BTreeSet};

use plumber::graph::{Identity, Kind, Topology};
use plumber::plan::{Action, Carry, Deployment, Effect, Plan, StartPosition, moves, plan};
use plumber::spec::{FileContent, SourceFile};
use proptest::prelude::*;

/// A generated topology: sources, then processors that read earlier steps.
#[derive(Debug, Clone)]
struct Dag {
    sources: usize,
    processors: Vec<Proc>,
    /// `cutover: ordered` (a successor waits for the old subtree below its predecessor).
    ordered: bool,
}

#[derive(Debug, Clone)]
struct Proc {
    /// Indices into sources (0..sources) then processors.
    inputs: Vec<usize>,
    program: usize,
    partitions: u32,
    sink: bool,
    min: u32,
}

const PROGRAMS: [&str; 4] = [".", "select(.x > 1)", "{id, v: .value}", ".items[]"];
/// Stateful programs of a step with one input (`{}`: its name): a windowed count, whose state
/// a successor rebuilds or carries over, and a filtered one.
const STATEFUL: [&str; 2] = [
    "SELECT _key, COUNT(*) AS n FROM {} GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)",
    "SELECT _key, COUNT(*) AS n FROM {} WHERE ok GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)",
];

fn dag() -> impl Strategy<Value = Dag> {
    (1usize..=3, 1usize..=7, any::<bool>()).prop_flat_map(|(sources, n, ordered)| {
        let procs: Vec<_> = (0..n)
            .map(|i| {
                (
                    prop::collection::btree_set(0..sources + i, 1..=3),
                    0..PROGRAMS.len() + STATEFUL.len(),
                    1u32..=3,
                    any::<bool>(),
                    0u32..=2,
                )
                    .prop_map(|(inputs, program, partitions, sink, min)| Proc {
                        inputs: inputs.into_iter().collect(),
                        program,
                        partitions,
                        sink,
                        min,
                    })
            })
            .collect();
        procs.prop_map(move |processors| Dag {
            sources,
            processors,
            ordered,
        })
    })
}

fn name(dag: &Dag, index: usize) -> String {
    if index < dag.sources {
        format!("src{index}")
    } else {
        format!("p{}", index - dag.sources)
    }
}

/// How files are laid out: which directory each goes in, key order, input order.
#[derive(Debug, Clone, Copy)]
struct Layout {
    seed: u64,
}

impl Layout {
    fn pick(&self, salt: usize, n: usize) -> usize {
        let x = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add((salt as u64).wrapping_mul(1442695040888963407));
        ((x >> 33) as usize) % n
    }
}

fn render(dag: &Dag, layout: Layout) -> Vec<SourceFile> {
    let dirs = ["", "steps/", "steps/deep/", "a/b/c/"];
    let mut files = Vec::new();
    let mut push = |i: usize, step: &str, mut lines: Vec<String>| {
        // Rotate keys: order of keys must not matter.
        let rotate = layout.pick(i * 7 + 1, lines.len());
        lines.rotate_left(rotate);
        let ext = if layout.pick(i * 7 + 2, 2) == 0 {
            "yaml"
        } else {
            "yml"
        };
        let dir = dirs[layout.pick(i * 7 + 3, dirs.len())];
        files.push(SourceFile {
            path: format!("topologies/t/{dir}{step}.{ext}"),
            content: FileContent::Bytes((lines.join("\n") + "\n").into_bytes()),
        });
    };
    for s in 0..dag.sources {
        push(
            s,
            &name(dag, s),
            vec!["kind: source".into(), format!("topic: in-{s}")],
        );
    }
    for (p, proc) in dag.processors.iter().enumerate() {
        let index = dag.sources + p;
        let mut inputs: Vec<String> = proc.inputs.iter().map(|&i| name(dag, i)).collect();
        let turn = layout.pick(index * 7 + 4, inputs.len());
        inputs.rotate_left(turn);
        push(
            index,
            &name(dag, index),
            vec![
                "kind: processor".into(),
                format!("input: [{}]", inputs.join(", ")),
                match (proc.program.checked_sub(PROGRAMS.len()), &inputs[..]) {
                    (Some(sql), [input]) => format!(
                        "sql: \"{}\"\ngrace: 10s",
                        STATEFUL[sql].replace("{}", input)
                    ),
                    _ => format!("jq: '{}'", PROGRAMS[proc.program % PROGRAMS.len()]),
                },
                format!("partitions: {}", proc.partitions),
                format!("scale: {{ min: {}, max: 5 }}", proc.min),
            ],
        );
        if proc.sink {
            push(
                1000 + p,
                &format!("out-{p}"),
                vec![
                    "kind: sink".into(),
                    format!("topic: out-{p}"),
                    format!("input: {}", name(dag, index)),
                ],
            );
        }
    }
    if dag.ordered {
        files.push(SourceFile {
            path: "topologies/t/topology.yaml".into(),
            content: FileContent::Bytes(b"cutover: ordered\n".to_vec()),
        });
    }
    files
}

fn build(dag: &Dag, layout: Layout) -> Vec<Topology> {
    let validation = plumber::validate(&render(dag, layout));
    validation
        .topologies
        .unwrap_or_else(|| panic!("generated DAG is valid: {:#?}", validation.diagnostics))
}

fn identities(topologies: &[Topology]) -> BTreeMap<String, Identity> {
    topologies
        .iter()
        .flat_map(|t| t.steps().map(|(_, s)| (s.name.clone(), s.identity)))
        .collect()
}

fn plan_of(old: &[Topology], new: &[Topology]) -> Plan {
    plan(Some(("old", old)), ("new", new))
}

/// Steps downstream of processor `p` (by index), including `p`.
fn downstream(dag: &Dag, p: usize) -> BTreeSet<String> {
    let mut names = BTreeSet::from([name(dag, dag.sources + p)]);
    for (q, proc) in dag.processors.iter().enumerate().skip(p + 1) {
        if proc.inputs.iter().any(|&i| names.contains(&name(dag, i))) {
            names.insert(name(dag, dag.sources + q));
        }
    }
    let sinks: Vec<String> = dag
        .processors
        .iter()
        .enumerate()
        .filter(|(q, proc)| proc.sink && names.contains(&name(dag, dag.sources + q)))
        .map(|(q, _)| format!("out-{q}"))
        .collect();
    names.extend(sinks);
    names
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn identities_ignore_layout_key_order_and_input_order(dag in dag(), a in any::<u64>(), b in any::<u64>()) {
        let one = build(&dag, Layout { seed: a });
        let two = build(&dag, Layout { seed: b });
        prop_assert_eq!(identities(&one), identities(&two));
        let p = plan_of(&one, &two);
        prop_assert!(p.is_empty(), "{:#?}", p);
    }

    #[test]
    fn changing_a_transform_changes_exactly_that_step_and_everything_downstream(
        dag in dag(), which in any::<prop::sample::Index>(), seed in any::<u64>()
    ) {
        let p = which.index(dag.processors.len());
        let mut changed = dag.clone();
        changed.processors[p].program = (dag.processors[p].program + 1) % PROGRAMS.len();
        let before = identities(&build(&dag, Layout { seed }));
        let after = identities(&build(&changed, Layout { seed }));
        let expected = downstream(&dag, p);
        let differing: BTreeSet<String> = before
            .iter()
            .filter(|(name, id)| after.get(*name) != Some(id))
            .map(|(name, _)| name.clone())
            .collect();
        prop_assert_eq!(differing, expected);
    }

    #[test]
    fn scale_never_changes_an_identity(dag in dag(), which in any::<prop::sample::Index>(), seed in any::<u64>()) {
        let p = which.index(dag.processors.len());
        let mut changed = dag.clone();
        changed.processors[p].min = (dag.processors[p].min + 1) % 3;
        let before = build(&dag, Layout { seed });
        let after = build(&changed, Layout { seed });
        prop_assert_eq!(identities(&before), identities(&after));
        let plan = plan_of(&before, &after);
        let actions: Vec<&Action> = plan.topologies.iter().flat_map(|t| &t.actions).collect();
        prop_assert_eq!(actions.len(), 1);
        let is_scale = matches!(actions[0], Action::UpdateProcessor { .. });
        prop_assert!(is_scale);
    }

    /// From a deployment half-way through a move (a newer commit takes over), towards a
    /// third graph and towards nothing: the plan is the engine's actions one by one.
    #[test]
    fn a_plan_is_the_next_action_applied_until_none_remains(
        a in dag(),
        b in dag(),
        c in dag(),
        seed in any::<u64>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let layout = || Layout { seed };
        let (a, b, c) = (build(&a, layout()), build(&b, layout()), build(&c, layout()));
        let name = a[0].name.clone();
        let mut deployment = Deployment::of(&a[0]);
        let towards_b = moves::plan(&name, &deployment, Some(&b[0]));
        if !waits_for_a_reviewer(&towards_b) {
            prop_assert_eq!(&towards_b, &stepwise(&name, &deployment, Some(&b[0])));
        }
        prop_assert!(deployment.in_data_flow_order());
        for action in towards_b.iter().take(cut.index(towards_b.len() + 1)) {
            deployment.apply(action, effect_of(action));
            prop_assert!(deployment.in_data_flow_order(), "after {action:?}");
        }
        for target in [Some(&c[0]), Some(&b[0]), Some(&a[0]), None] {
            let plan = moves::plan(&name, &deployment, target);
            if !waits_for_a_reviewer(&plan) {
                prop_assert_eq!(&plan, &stepwise(&name, &deployment, target));
            }
            // The engine keeps the lives in data-flow order through any move.
            let mut after = deployment.clone();
            for action in &plan {
                after.apply(action, effect_of(action));
                prop_assert!(after.in_data_flow_order(), "after {action:?}");
            }
        }
    }

    #[test]
    fn every_plan_orders_its_actions_safely(old in dag(), new in dag(), seed in any::<u64>()) {
        let before = build(&old, Layout { seed });
        let after = build(&new, Layout { seed });
        check_plan(&before, &after);
        check_plan(&after, &before);
        check_plan(&[], &after);
    }
}

/// A record from before the engine kept lives in data-flow order (a start went last) is
/// sorted at its next start; until then it is planned look by look, the same plan.
#[test]
fn a_record_s_lives_are_put_in_data_flow_order_at_its_next_start() {
    let chain = |program| Dag {
        sources: 1,
        processors: (0..4)
            .map(|i| Proc {
                inputs: vec![i],
                program,
                partitions: 1,
                sink: i == 3,
                min: 1,
            })
            .collect(),
        ordered: false,
    };
    let layout = Layout { seed: 0 };
    let (a, b) = (build(&chain(0), layout), build(&chain(1), layout));
    let name = a[0].name.clone();
    let mut deployment = Deployment::of(&a[0]);
    assert!(deployment.in_data_flow_order());
    deployment.lives.reverse();
    assert!(!deployment.in_data_flow_order());
    let plan = moves::plan(&name, &deployment, Some(&b[0]));
    assert_eq!(plan, stepwise(&name, &deployment, Some(&b[0])));
    let first_start = plan
        .iter()
        .position(|a| matches!(a, Action::StartProcessor(_) | Action::StartWarm(_)))
        .expect("every step is replaced");
    for action in &plan[..=first_start] {
        deployment.apply(action, effect_of(action));
    }
    assert!(deployment.in_data_flow_order());
}

/// What [`moves::plan`] stands for: [`moves::next`] applied to a simulated deployment until
/// nothing remains (each stop recording no offsets), as the engine runs a move when nothing
/// waits.
fn stepwise(name: &str, deployment: &Deployment, target: Option<&Topology>) -> Vec<Action> {
    let mut simulated = deployment.clone();
    let mut actions = Vec::new();
    while let Some(action) = moves::next(name, &simulated, target, &|_| false) {
        assert!(
            actions.len() < 10_000,
            "the plan does not end: {actions:#?}"
        );
        simulated.apply(&action, effect_of(&action));
        actions.push(action);
    }
    actions
}

/// Whether a stateful step's state cannot be carried over: the engine holds the move until
/// the step file says what it starts from, where the plan shows what it would do once it does.
fn waits_for_a_reviewer(plan: &[Action]) -> bool {
    plan.iter().any(|a| {
        matches!(a, Action::StartProcessor(s) | Action::StartWarm(s)
            if matches!(s.state.as_ref().map(|s| &s.carry), Some(Carry::Cannot { .. })))
    })
}

fn effect_of(action: &Action) -> Effect {
    match action {
        Action::StopProcessor { .. } => Effect::Stopped(Vec::new()),
        _ => Effect::Done,
    }
}

/// Replays a plan's actions and checks the ordering rules of SPEC §4.
fn check_plan(old: &[Topology], new: &[Topology]) {
    let plan = if old.is_empty() {
        plan(None, ("new", new))
    } else {
        plan_of(old, new)
    };
    let old_t = old.first();
    let new_t = new.first();
    let groups = |t: Option<&Topology>| -> BTreeMap<String, String> {
        t.into_iter()
            .flat_map(|t| {
                t.steps()
                    .filter(|(_, s)| s.kind() == Kind::Processor)
                    .map(|(id, _)| (t.internal_name(id), t.step(id).name.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let old_groups = groups(old_t);
    let new_groups = groups(new_t);
    let retiring: BTreeSet<&String> = old_groups
        .keys()
        .filter(|g| !new_groups.contains_key(*g))
        .collect();
    let starting: BTreeSet<&String> = new_groups
        .keys()
        .filter(|g| !old_groups.contains_key(*g))
        .collect();

    let mut existing_topics: BTreeSet<String> = old_t
        .map(|t| {
            t.steps()
                .filter(|(id, s)| s.kind() == Kind::Processor && t.feeds_processor(*id))
                .map(|(id, _)| t.internal_name(id))
                .collect()
        })
        .unwrap_or_default();
    let changelogs: BTreeMap<String, String> = old_t
        .map(|t| {
            Deployment::of(t)
                .lives
                .iter()
                .filter_map(|l| Some((l.start.state.as_ref()?.topic.clone(), l.group().to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let mut stopped: BTreeSet<String> = BTreeSet::new();
    let mut started: BTreeSet<String> = BTreeSet::new();
    let mut handed_over: BTreeSet<String> = BTreeSet::new();
    // Started warm and not handed off yet; handed off (they read).
    let mut warm: BTreeSet<String> = BTreeSet::new();
    let mut reading: BTreeSet<String> = BTreeSet::new();
    let actions: Vec<&Action> = plan.topologies.iter().flat_map(|t| &t.actions).collect();
    let starts_warm: BTreeSet<&String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::StartWarm(s) => Some(&s.group),
            _ => None,
        })
        .collect();
    for action in &actions {
        match action {
            Action::CreateTopic { topic, .. } => {
                existing_topics.insert(topic.clone());
            }
            Action::HandOff { group, .. } => {
                assert!(warm.remove(group), "{group} handed off but not warm");
                assert!(
                    handed_over.contains(group),
                    "{group} handed off before its predecessor stopped"
                );
                reading.insert(group.clone());
            }
            Action::StartProcessor(s) | Action::StartWarm(s) => {
                if matches!(action, Action::StartWarm(_)) {
                    warm.insert(s.group.clone());
                } else {
                    reading.insert(s.group.clone());
                }
                assert!(
                    starting.contains(&s.group),
                    "only new identities start: {}",
                    s.group
                );
                assert!(
                    started.insert(s.group.clone()),
                    "started twice: {}",
                    s.group
                );
                for input in &s.inputs {
                    if input.topic.starts_with("plumber.") {
                        assert!(
                            existing_topics.contains(&input.topic),
                            "{} read before created",
                            input.topic
                        );
                    }
                    if input.from == StartPosition::Cutover && !warm.contains(&s.group) {
                        assert!(
                            handed_over.contains(&s.group),
                            "{} starts at cutover offsets never handed over",
                            s.group
                        );
                    }
                }
            }
            Action::StopProcessor {
                group, successor, ..
            } => {
                assert!(
                    retiring.contains(group),
                    "only old identities stop: {group}"
                );
                assert!(stopped.insert(group.clone()), "stopped twice: {group}");
                if let Some(successor) = successor {
                    assert!(
                        !reading.contains(successor),
                        "{successor} reads before {group} handed over"
                    );
                    assert!(
                        !starts_warm.contains(successor) || warm.contains(successor),
                        "{group} stops before its successor {successor} is warm"
                    );
                    handed_over.insert(successor.clone());
                }
            }
            Action::DrainProcessor { group, topics, .. } => {
                assert!(!stopped.contains(group));
                for topic in topics {
                    // A drained topic's writer (the group of the same name) has stopped.
                    assert!(
                        stopped.contains(topic),
                        "{group} drains {topic} while its writer runs"
                    );
                }
            }
            Action::DeleteTopic { topic } => {
                // An internal topic is named like the group that writes it; a changelog is
                // its life's.
                let writer = changelogs.get(topic).unwrap_or(topic);
                assert!(
                    stopped.contains(writer),
                    "{topic} deleted while its writer runs"
                );
                let t = old_t.expect("only old topics are deleted");
                for (id, _) in t.steps().filter(|(_, s)| s.kind() == Kind::Processor) {
                    if t.input_topics(id).contains(topic) {
                        assert!(
                            stopped.contains(&t.internal_name(id)),
                            "{topic} deleted before its reader stopped"
                        );
                    }
                }
                existing_topics.remove(topic);
            }
            Action::UpdateProcessor { group, .. } => {
                assert!(old_groups.contains_key(group) && new_groups.contains_key(group));
            }
            Action::DeleteGroups { base, .. } => {
                panic!("only a retired preview's groups are deleted, never {base}'s")
            }
        }
    }
    assert!(warm.is_empty(), "never handed off: {warm:?}");
    // Deletions run last: a rollback cannot undo them.
    let deletion = |a: &&&Action| matches!(a, Action::DeleteTopic { .. });
    if let Some(first) = actions.iter().position(|a| deletion(&a)) {
        assert!(
            actions[first..].iter().all(|a| deletion(&a)),
            "an action after a deletion: {:?}",
            &actions[first..]
        );
    }
    assert_eq!(
        stopped.iter().collect::<BTreeSet<_>>(),
        retiring,
        "every old identity stops"
    );
    assert_eq!(
        started.iter().collect::<BTreeSet<_>>(),
        starting,
        "every new identity starts"
    );
    // After the cutover, every topic a new processor reads exists.
    if let Some(t) = new_t {
        for (id, _) in t.steps().filter(|(_, s)| s.kind() == Kind::Processor) {
            for topic in t
                .input_topics(id)
                .iter()
                .filter(|t| t.starts_with("plumber."))
            {
                assert!(
                    existing_topics.contains(topic),
                    "{topic} missing after the cutover"
                );
            }
        }
    }
}

#[test]
fn arbitrary_bytes_never_panic_the_validator() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(512));
    runner
        .run(&prop::collection::vec(any::<u8>(), 0..400), |bytes| {
            let files = vec![SourceFile {
                path: "topologies/t/x.yaml".into(),
                content: FileContent::Bytes(bytes),
            }];
            let _ = plumber::validate(&files);
            Ok(())
        })
        .unwrap();
    let yamlish = "(kind|input|jq|topic|exec|http|scale|\\[|\\]|\\{|\\}|:|,|-| |\\n|'|\"|&|\\*|!|#|---|source|processor|sink|[a-z]){0,60}";
    runner
        .run(&yamlish, |text| {
            let files = vec![SourceFile {
                path: "topologies/t/x.yaml".into(),
                content: FileContent::Bytes(text.into_bytes()),
            }];
            let _ = plumber::validate(&files);
            Ok(())
        })
        .unwrap();
}
