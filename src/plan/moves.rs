//! From a [`Deployment`] to a target graph: which actions remain, which of them can run now,
//! and the plan (the order the engine runs them in when nothing waits).
//!
//! Everything here is a function of the deployment and the target, so the plan is the same
//! whether it is computed before a move, after a crash in the middle of one, or when a newer
//! commit takes over a move that is stuck: the engine asks [`next`] after every action, and
//! [`plan`] is [`next`] applied to a simulated deployment until nothing remains (worked out
//! by `simulation`, which looks again only at what each action touched).

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::{Identity, Kind, StepId, StepKind, Topology};
use crate::spec::{CutoverMode, StartFrom};

use super::deployment::{Deployment, Effect, Life, TopicKind, base_name, life_name};
use super::state::{OldState, Predecessor};
use super::{Action, Carry, StartInput, StartPosition, StartProcessor};

mod simulation;

/// A target processor, with the names it runs under.
#[derive(Debug, Clone)]
pub(super) struct Wanted {
    pub id: StepId,
    pub step: String,
    pub identity: Identity,
    /// `plumber.<topology>.<step>.<id12>`
    pub base: String,
    pub life: u32,
    pub group: String,
    /// Topics it reads (sorted), and which of them are internal.
    pub inputs: Vec<(String, bool)>,
    pub outputs: Vec<String>,
    pub writes_internal: bool,
    /// Index of the deployed life that already is this processor.
    pub kept: Option<usize>,
}

/// The target, resolved against a deployment.
#[derive(Debug, Clone, Default)]
pub(super) struct Resolved {
    /// In the target's data-flow order.
    pub wanted: Vec<Wanted>,
    /// Indices of deployed lives the target does not keep, in deployed data-flow order.
    pub retiring: Vec<usize>,
    /// [`Resolved::retiring`] by step: a step's retiring lives, in that order.
    retiring_of: BTreeMap<String, Vec<usize>>,
    /// Per step, the index in [`Resolved::wanted`] of its new life (not started, or warm and
    /// not handed off yet), if it gets one.
    new_of: BTreeMap<String, usize>,
    /// The internal topics the target writes.
    used: BTreeSet<String>,
}

impl Resolved {
    /// The retiring lives of `step`, in data-flow order.
    fn retiring_of(&self, step: &str) -> &[usize] {
        self.retiring_of.get(step).map_or(&[], Vec::as_slice)
    }
}

/// Which deployed lives write and read each topic (by index, ascending): built once per look
/// at a deployment, so that asking it for every step costs no walk over every life.
#[derive(Debug, Clone, Default)]
struct Topics {
    writers: BTreeMap<String, Vec<usize>>,
    readers: BTreeMap<String, Vec<usize>>,
}

impl Topics {
    fn of(lives: &[Life]) -> Topics {
        let mut topics = Topics::default();
        for (i, life) in lives.iter().enumerate() {
            topics.add(i, life);
        }
        topics
    }

    /// Life `i`.
    fn add(&mut self, i: usize, life: &Life) {
        let at = |map: &mut BTreeMap<String, Vec<usize>>, topic: &str| {
            let indices = map.entry(topic.to_owned()).or_default();
            if let Err(place) = indices.binary_search(&i) {
                indices.insert(place, i);
            }
        };
        for topic in &life.start.outputs {
            at(&mut self.writers, topic);
        }
        for topic in life.inputs() {
            at(&mut self.readers, topic);
        }
    }

    /// Forgets life `i` (which stopped).
    fn remove(&mut self, i: usize, life: &Life) {
        let at = |map: &mut BTreeMap<String, Vec<usize>>, topic: &str| {
            if let Some(indices) = map.get_mut(topic) {
                indices.retain(|&j| j != i);
            }
        };
        for topic in &life.start.outputs {
            at(&mut self.writers, topic);
        }
        for topic in life.inputs() {
            at(&mut self.readers, topic);
        }
    }

    fn writers(&self, topic: &str) -> &[usize] {
        self.writers.get(topic).map_or(&[], Vec::as_slice)
    }

    fn readers(&self, topic: &str) -> &[usize] {
        self.readers.get(topic).map_or(&[], Vec::as_slice)
    }

    /// The first life (by index) that writes `topic`.
    fn first_writer(&self, topic: &str) -> Option<usize> {
        self.writers(topic).first().copied()
    }

    /// The first life (by index) that writes or reads `topic`.
    fn first_user(&self, topic: &str) -> Option<usize> {
        let writer = self.first_writer(topic);
        let reader = self.readers(topic).first().copied();
        writer.into_iter().chain(reader).min()
    }
}

// Here rather than beside the rest of `Deployment`: it is what the planner resolves, so the
// deployment's own module needs nothing of the planner.
impl Deployment {
    /// Whether every life comes after the lives that write what it reads: the engine keeps
    /// them so ([`Deployment::apply`]), and the planner needs it to plan without a whole
    /// look per action.
    pub fn in_data_flow_order(&self) -> bool {
        in_data_flow_order(&self.lives, &Topics::of(&self.lives))
    }

    /// Adds a started life so that lives stay in data-flow order: before the first life that
    /// reads what it writes, or last; should a life it reads from come later (or a record
    /// from before the engine kept this order), all are sorted.
    pub(super) fn insert_in_data_flow_order(&mut self, life: Life) {
        let first_reader = self
            .lives
            .iter()
            .position(|l| l.inputs().any(|t| life.writes(t)));
        self.lives
            .insert(first_reader.unwrap_or(self.lives.len()), life);
        let order = data_flow_order(&self.lives, &Topics::of(&self.lives));
        if order.iter().enumerate().any(|(i, &j)| i != j) {
            let mut lives: Vec<Option<Life>> = std::mem::take(&mut self.lives)
                .into_iter()
                .map(Some)
                .collect();
            self.lives = order.into_iter().filter_map(|i| lives[i].take()).collect();
        }
    }

    /// A topology's graph as if it were fully deployed, every processor in its first life:
    /// how `plumber plan` sees a commit it plans from.
    pub fn of(topology: &Topology) -> Deployment {
        let mut deployment = Deployment::default();
        let target = resolve(&deployment, Some(topology));
        for wanted in &target.wanted {
            let start = wanted.start(topology, &deployment, &target);
            let group = start.group.clone();
            if wanted.writes_internal {
                deployment
                    .internal_topics
                    .insert(group.clone(), wanted.step.clone());
            }
            deployment.dead_letter_topics.insert(start.dlq.clone());
            if let Some(state) = &start.state {
                deployment.state_topics.insert(state.topic.clone());
            }
            deployment
                .lives_used
                .insert(wanted.base.clone(), wanted.life);
            deployment.lives.push(Life {
                start,
                life: wanted.life,
                running: true,
                held: false,
                drained: BTreeSet::new(),
            });
        }
        deployment
    }
}

/// Names every target processor: a deployed life with the same step, identity and input
/// topics is kept; any other gets a new life (the next number of its base name).
pub(super) fn resolve(deployment: &Deployment, target: Option<&Topology>) -> Resolved {
    resolve_with(deployment, target, &Topics::of(&deployment.lives))
}

/// [`resolve`], with the deployment's [`Topics`] at hand.
fn resolve_with(deployment: &Deployment, target: Option<&Topology>, topics: &Topics) -> Resolved {
    let mut wanted: Vec<Wanted> = Vec::new();
    let mut topic_of: BTreeMap<StepId, String> = BTreeMap::new();
    // The deployed lives of each step and identity, in index order.
    let mut lives_of: BTreeMap<(&str, Identity), Vec<usize>> = BTreeMap::new();
    for (i, life) in deployment.lives.iter().enumerate() {
        lives_of
            .entry((life.step(), life.identity()))
            .or_default()
            .push(i);
    }
    if let Some(topology) = target {
        for (id, step) in topology.steps() {
            match &step.kind {
                StepKind::Source { topic } => {
                    topic_of.insert(id, topic.clone());
                }
                StepKind::Sink { .. } => {}
                StepKind::Processor { .. } => {
                    let mut inputs: Vec<(String, bool)> = topology
                        .group_inputs(id)
                        .into_iter()
                        .filter_map(|i| {
                            let internal = topology.step(i).kind() == Kind::Processor;
                            topic_of.get(&i).map(|t| (t.clone(), internal))
                        })
                        .collect();
                    inputs.sort();
                    inputs.dedup();
                    let base = base_name(&topology.name, &step.name, step.identity);
                    let kept = lives_of
                        .get(&(step.name.as_str(), step.identity))
                        .into_iter()
                        .flatten()
                        .copied()
                        .find(|&l| {
                            deployment.lives[l]
                                .inputs()
                                .eq(inputs.iter().map(|(t, _)| t.as_str()))
                        });
                    let life = match kept {
                        Some(k) => deployment.lives[k].life,
                        None => deployment.lives_used.get(&base).copied().unwrap_or(0) + 1,
                    };
                    let group = match kept {
                        Some(k) => deployment.lives[k].group().to_owned(),
                        None => life_name(&base, life),
                    };
                    let writes_internal = topology.feeds_processor(id);
                    let mut outputs: Vec<String> = topology
                        .consumers(id)
                        .into_iter()
                        .filter_map(|c| match &topology.step(c).kind {
                            StepKind::Sink { topic } => Some(topic.clone()),
                            _ => None,
                        })
                        .collect();
                    if writes_internal {
                        outputs.push(group.clone());
                    }
                    outputs.sort();
                    outputs.dedup();
                    topic_of.insert(id, group.clone());
                    wanted.push(Wanted {
                        id,
                        step: step.name.clone(),
                        identity: step.identity,
                        base,
                        life,
                        group,
                        inputs,
                        outputs,
                        writes_internal,
                        kept,
                    });
                }
            }
        }
    }
    let kept: BTreeSet<usize> = wanted.iter().filter_map(|w| w.kept).collect();
    let retiring: Vec<usize> = data_flow_order(&deployment.lives, topics)
        .into_iter()
        .filter(|i| !kept.contains(i))
        .collect();
    let mut retiring_of: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &r in &retiring {
        retiring_of
            .entry(deployment.lives[r].step().to_owned())
            .or_default()
            .push(r);
    }
    // A life started warm is kept, but its predecessor still hands over to it.
    let mut new_of = BTreeMap::new();
    for (i, w) in wanted
        .iter()
        .enumerate()
        .filter(|(_, w)| w.kept.is_none_or(|k| deployment.lives[k].held))
    {
        new_of.entry(w.step.clone()).or_insert(i);
    }
    let used = wanted
        .iter()
        .filter(|w| w.writes_internal)
        .map(|w| w.group.clone())
        .collect();
    Resolved {
        wanted,
        retiring,
        retiring_of,
        new_of,
        used,
    }
}

/// Indices of `lives` so that a life comes after the lives whose topics it reads; ties by
/// index. The engine keeps lives in that order ([`Deployment::apply`] starts a life after
/// its writers and before its readers), so it is their index order, and stays so as lives
/// stop; an older record's order is sorted here.
fn data_flow_order(lives: &[Life], topics: &Topics) -> Vec<usize> {
    if in_data_flow_order(lives, topics) {
        return (0..lives.len()).collect();
    }
    // Per life, the other lives that write what it reads; the lives waiting for each.
    let mut waits_for: Vec<usize> = vec![0; lives.len()];
    let mut waiting: Vec<Vec<usize>> = vec![Vec::new(); lives.len()];
    for (i, life) in lives.iter().enumerate() {
        let writers: BTreeSet<usize> = life
            .inputs()
            .flat_map(|t| topics.writers(t).iter().copied())
            .filter(|&w| w != i)
            .collect();
        waits_for[i] = writers.len();
        for w in writers {
            waiting[w].push(i);
        }
    }
    let mut left: BTreeSet<usize> = (0..lives.len()).collect();
    let mut ready: BTreeSet<usize> = (0..lives.len()).filter(|&i| waits_for[i] == 0).collect();
    let mut placed: Vec<usize> = Vec::with_capacity(lives.len());
    // Lives are acyclic by construction; should a state file say otherwise, any order is
    // better than none: the first left.
    while let Some(i) = ready.pop_first().or_else(|| left.first().copied()) {
        left.remove(&i);
        placed.push(i);
        for &d in &waiting[i] {
            if left.contains(&d) {
                waits_for[d] -= 1;
                if waits_for[d] == 0 {
                    ready.insert(d);
                }
            }
        }
    }
    placed
}

/// Whether every life comes after the lives that write what it reads.
fn in_data_flow_order(lives: &[Life], topics: &Topics) -> bool {
    lives.iter().enumerate().all(|(i, life)| {
        life.inputs()
            .all(|t| topics.writers(t).iter().all(|&w| w <= i))
    })
}

impl Wanted {
    /// The start action of this processor, given where it must begin on each input.
    pub(super) fn start(
        &self,
        topology: &Topology,
        deployment: &Deployment,
        resolved: &Resolved,
    ) -> StartProcessor {
        let StepKind::Processor {
            transform,
            env,
            scale,
            resources,
            start_from,
            ..
        } = &topology.step(self.id).kind
        else {
            unreachable!("only processors are wanted")
        };
        let inputs = self
            .inputs
            .iter()
            .map(|(topic, internal)| StartInput {
                topic: topic.clone(),
                from: start_position(self, topic, *internal, *start_from, deployment, resolved),
            })
            .collect();
        let topics: Vec<String> = self.inputs.iter().map(|(t, _)| t.clone()).collect();
        // Internal topics new in this move (a replaced upstream step's): nothing before the
        // cutover is on them.
        let new_inputs: Vec<String> = self
            .inputs
            .iter()
            .filter(|(topic, internal)| *internal && is_new_internal(topic, deployment))
            .map(|(topic, _)| topic.clone())
            .collect();
        let state = super::state::run(
            &topology.name,
            &self.step,
            transform,
            &super::state::Inputs {
                topics: &topics,
                new: &new_inputs,
            },
            &|topic| {
                deployment.state_topics.contains(topic) && !deployment.fresh_topics.contains(topic)
            },
            self.predecessor(deployment, resolved),
        );
        StartProcessor {
            step: self.step.clone(),
            identity: self.identity,
            group: self.group.clone(),
            life: self.life,
            inputs,
            outputs: self.outputs.clone(),
            dlq: topology.dlq_topic(self.id),
            transform: transform.clone(),
            env: env.clone(),
            scale: *scale,
            resources: resources.clone(),
            state,
            table: topology
                .table_input(self.id)
                .map(|table| topology.topic_of(table)),
        }
    }

    /// The changelog this life keeps its state in, if it keeps state.
    fn state_topic(
        &self,
        topology: &Topology,
        deployment: &Deployment,
        resolved: &Resolved,
    ) -> Option<String> {
        // Only a stateful sql step has one: the others' starts are not worked out for it.
        let StepKind::Processor {
            transform: crate::spec::Transform::Sql { state: Some(_), .. },
            ..
        } = &topology.step(self.id).kind
        else {
            return None;
        };
        self.start(topology, deployment, resolved)
            .state
            .map(|state| state.topic)
    }

    /// What ran of this step before this life: a retiring life, or one stopped in this move
    /// (its recorded positions keep its state); `None` for a new step.
    fn predecessor(&self, deployment: &Deployment, resolved: &Resolved) -> Option<Predecessor> {
        let running = resolved
            .retiring_of(&self.step)
            .iter()
            .map(|&r| OldState::of(&deployment.lives[r].start));
        let stopped = deployment
            .positions
            .get(&self.step)
            .into_iter()
            .flat_map(|p| p.values())
            .map(|r| r.state.clone());
        let mut any = false;
        for state in running.chain(stopped) {
            any = true;
            if let Some(state) = state {
                return Some(Predecessor::Stateful(state));
            }
        }
        any.then_some(Predecessor::Stateless)
    }
}

/// Where a starting processor begins on one input: where its step's previous life stopped
/// (or will stop), else at the beginning of a topic created in this move, else `startFrom`.
fn start_position(
    wanted: &Wanted,
    topic: &str,
    internal: bool,
    start_from: StartFrom,
    deployment: &Deployment,
    resolved: &Resolved,
) -> StartPosition {
    let predecessor_reads = resolved
        .retiring_of(&wanted.step)
        .iter()
        .any(|&r| deployment.lives[r].reads(topic));
    let recorded = deployment
        .positions
        .get(&wanted.step)
        .is_some_and(|p| p.contains_key(topic));
    if predecessor_reads || recorded {
        StartPosition::Cutover
    } else if internal && is_new_internal(topic, deployment) {
        StartPosition::Earliest
    } else {
        match start_from {
            StartFrom::Latest => StartPosition::Latest,
            StartFrom::Earliest => StartPosition::Earliest,
        }
    }
}

/// Whether internal topic `topic` is created in this move (or is still to be).
fn is_new_internal(topic: &str, deployment: &Deployment) -> bool {
    deployment.fresh_topics.contains(topic) || !deployment.internal_topics.contains_key(topic)
}

/// An action that remains, and whether it can run in the deployment as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub action: Action,
    /// `None`: it can run now; else what it waits for.
    pub blocked_by: Option<String>,
}

/// Every action that remains between topology `name`'s `deployment` and `target`, in the
/// order the engine prefers them: in-place scaling, topic creation, starts (downstream
/// first), then retiring old lives in data-flow order (each drains the topics whose writers
/// stopped, then stops); deletions of topics nothing uses any more (and a retired preview's
/// consumer groups) wait until nothing else remains.
pub fn remaining(name: &str, deployment: &Deployment, target: Option<&Topology>) -> Vec<Pending> {
    let mut out = remaining_unheld(name, deployment, target);
    // A stateful step whose state cannot be carried over holds the whole move: nothing is
    // stopped or started until the step file says what its state starts from.
    let cannot = out.iter().find_map(|p| match &p.action {
        Action::StartProcessor(start) => match start.state.as_ref().map(|s| &s.carry) {
            Some(Carry::Cannot { why }) => Some(format!(
                "the reviewer's choice for step `{}`: its state cannot be carried over ({why}); \
                 set `stateStart: empty` or `stateStart: earliest` in its step file",
                start.step
            )),
            _ => None,
        },
        _ => None,
    });
    if let Some(why) = cannot {
        for pending in &mut out {
            pending.blocked_by.get_or_insert_with(|| why.clone());
        }
    }
    out
}

/// [`remaining`] without the hold a reviewer's missing choice puts on the move: what the
/// move would do once it is made (the plan shows it).
fn remaining_unheld(
    name: &str,
    deployment: &Deployment,
    target: Option<&Topology>,
) -> Vec<Pending> {
    let mut out = every_action(name, deployment, target);
    prune_last(&mut out);
    out
}

/// Deletions are the one part of a move a rollback cannot undo, so they wait until everything
/// else in it has run (like Argo CD's `PruneLast`): the new graph runs whole, hand-offs
/// included, before anything old is gone.
fn prune_last(out: &mut [Pending]) {
    let deletion =
        |a: &Action| matches!(a, Action::DeleteTopic { .. } | Action::DeleteGroups { .. });
    if out.iter().all(|p| deletion(&p.action)) {
        return;
    }
    for pending in out.iter_mut().filter(|p| deletion(&p.action)) {
        pending
            .blocked_by
            .get_or_insert_with(|| "the rest of the move (deletions run last)".to_owned());
    }
}

/// Where an action stands in the order the engine prefers: its section (1 in place, 2 topics,
/// 3 starts, 4 deletions, 5 retirements, 6 a retired preview's groups), then its place there.
type Key = (u8, usize, usize);

/// One look at a deployment: the target resolved against it, and who uses each topic.
struct Look<'a> {
    deployment: &'a Deployment,
    resolved: &'a Resolved,
    topics: &'a Topics,
}

/// [`remaining_unheld`] before deletions are put last: every unit's actions, in key order.
fn every_action(name: &str, deployment: &Deployment, target: Option<&Topology>) -> Vec<Pending> {
    let topics = Topics::of(&deployment.lives);
    let resolved = resolve_with(deployment, target, &topics);
    let look = Look {
        deployment,
        resolved: &resolved,
        topics: &topics,
    };
    let mut keyed: Vec<(Key, Pending)> = Vec::new();
    let mut warming: BTreeSet<&str> = BTreeSet::new();
    if let Some(topology) = target {
        for w in 0..resolved.wanted.len() {
            if wanted_actions(&look, topology, w, &mut keyed) {
                warming.insert(&resolved.wanted[w].step);
            }
        }
        for (j, (topic, step)) in shadow_sinks(topology).into_iter().enumerate() {
            if let Some(create) = shadow_create(deployment, topology, topic, step) {
                keyed.push(((2, resolved.wanted.len() + j, 0), create));
            }
        }
    }
    for (i, deletion) in deletions(name, &look, target).into_iter().enumerate() {
        keyed.push(((4, i, 0), deletion));
    }
    for (place, &r) in resolved.retiring.iter().enumerate() {
        let warm = warming.contains(deployment.lives[r].step());
        keyed.push(((5, place, 0), retire_life(&look, r, warm)));
    }
    if target.is_none() && deployment.lives.is_empty() && super::preview::is_preview(name) {
        // Only groups under its own names, whatever a record says.
        let own = format!("plumber.{name}.");
        for (i, (base, last)) in deployment.lives_used.iter().enumerate() {
            if base.starts_with(&own) && !deployment.groups_deleted.contains(base) {
                let action = Action::DeleteGroups {
                    base: base.clone(),
                    lives: *last,
                };
                keyed.push(((6, i, 0), ready(action)));
            }
        }
    }
    keyed.sort_by_key(|(key, _)| *key);
    keyed.into_iter().map(|(_, pending)| pending).collect()
}

fn ready(action: Action) -> Pending {
    Pending {
        action,
        blocked_by: None,
    }
}

/// What target processor `w` has left to do, keyed: its in-place update, the topics its new
/// life needs, and its start (cold or warm) or hand-off. Whether it starts warm.
fn wanted_actions(
    look: &Look<'_>,
    topology: &Topology,
    w: usize,
    out: &mut Vec<(Key, Pending)>,
) -> bool {
    let Look {
        deployment,
        resolved,
        topics,
    } = *look;
    let wanted = &resolved.wanted[w];
    let StepKind::Processor {
        scale,
        resources,
        partitions,
        ..
    } = &topology.step(wanted.id).kind
    else {
        return false;
    };
    // Starts downstream first, so readers are ready before data arrives.
    let start_key = (3, resolved.wanted.len() - 1 - w, 0);
    if let Some(life) = wanted.kept.map(|k| &deployment.lives[k]) {
        if life.start.scale != *scale || life.start.resources != *resources {
            let action = Action::UpdateProcessor {
                step: wanted.step.clone(),
                identity: wanted.identity,
                group: wanted.group.clone(),
                scale: *scale,
                resources: resources.clone(),
            };
            out.push(((1, w, 0), ready(action)));
        }
        if !life.running {
            let start = Box::new(life.start.clone());
            if life.held {
                out.push((start_key, ready(Action::StartWarm(start))));
                return true;
            }
            out.push((start_key, ready(Action::StartProcessor(start))));
        } else if life.held {
            let hand_off = Pending {
                action: Action::HandOff {
                    step: wanted.step.clone(),
                    identity: wanted.identity,
                    group: wanted.group.clone(),
                },
                blocked_by: predecessor_gate(wanted, topology, deployment, (resolved, topics)),
            };
            out.push((start_key, hand_off));
        }
        return false;
    }
    // The topics of the new life.
    if wanted.writes_internal && !deployment.internal_topics.contains_key(&wanted.group) {
        let action = Action::CreateTopic {
            topic: wanted.group.clone(),
            step: wanted.step.clone(),
            partitions: *partitions,
            replication: topology.replication,
            config: topology.topic_config.clone(),
            kind: TopicKind::Internal,
            like: None,
        };
        out.push(((2, w, 0), ready(action)));
    }
    let dlq = topology.dlq_topic(wanted.id);
    if !deployment.dead_letter_topics.contains(&dlq) {
        let action = Action::CreateTopic {
            topic: dlq,
            step: wanted.step.clone(),
            partitions: 1,
            replication: topology.replication,
            config: topology.topic_config.clone(),
            kind: TopicKind::DeadLetter,
            like: None,
        };
        out.push(((2, w, 1), ready(action)));
    }
    if let Some(state) = wanted.state_topic(topology, deployment, resolved)
        && !deployment.state_topics.contains(&state)
    {
        // One changelog partition per input partition: the input's count, read when the
        // topic is created when the input is a source.
        let (input, internal) = wanted.inputs.first().cloned().unwrap_or_default();
        let upstream = internal
            .then(|| {
                resolved
                    .wanted
                    .iter()
                    .find(|w| w.group == input)
                    .and_then(|w| match &topology.step(w.id).kind {
                        StepKind::Processor { partitions, .. } => Some(*partitions),
                        _ => None,
                    })
            })
            .flatten();
        let mut config = topology.topic_config.clone();
        config.insert("cleanup.policy".into(), "compact".into());
        let action = Action::CreateTopic {
            topic: state,
            step: wanted.step.clone(),
            partitions: upstream.unwrap_or(0),
            replication: topology.replication,
            config,
            kind: TopicKind::State,
            like: upstream.is_none().then_some(input),
        };
        out.push(((2, w, 2), ready(action)));
    }
    // A step's next life that takes over from a running predecessor starts warm (stateless
    // steps: a stateful one builds its state from the cutover offsets, so it starts once they
    // are known), and its predecessor stops only once it is: the hand-off follows the stop.
    let start = wanted.start(topology, deployment, resolved);
    let missing = missing_topic(wanted, &start, topology, deployment);
    let lives = &deployment.lives;
    let warm = start.state.is_none()
        && start.table.is_none()
        && resolved
            .retiring_of(&wanted.step)
            .iter()
            .any(|&p| wanted.inputs.iter().any(|(t, _)| lives[p].reads(t)));
    let pending = if warm {
        Pending {
            action: Action::StartWarm(Box::new(start)),
            blocked_by: missing,
        }
    } else {
        let gate = || predecessor_gate(wanted, topology, deployment, (resolved, topics));
        Pending {
            action: Action::StartProcessor(Box::new(start)),
            blocked_by: missing.or_else(gate),
        }
    };
    out.push((start_key, pending));
    warm
}

/// A preview's shadow topic, created before anything writes it.
fn shadow_create(
    deployment: &Deployment,
    topology: &Topology,
    topic: &str,
    step: &str,
) -> Option<Pending> {
    (!deployment.shadow_topics.contains(topic)).then(|| {
        ready(Action::CreateTopic {
            topic: topic.to_owned(),
            step: step.to_owned(),
            partitions: 0,
            replication: topology.replication,
            config: topology.topic_config.clone(),
            kind: TopicKind::Shadow,
            like: None,
        })
    })
}

/// A preview's shadow topics (its sinks' topics, [`super::preview::shadow_of`]), with the
/// sink step that names each.
fn shadow_sinks(topology: &Topology) -> BTreeMap<&str, &str> {
    topology
        .steps()
        .filter_map(|(_, step)| match &step.kind {
            StepKind::Sink { topic } => super::preview::shadow_of(&topology.name, topic)
                .map(|_| (topic.as_str(), step.name.as_str())),
            _ => None,
        })
        .collect()
}

/// What keeps a new life from starting at all: a topic it uses not created yet.
fn missing_topic(
    wanted: &Wanted,
    start: &StartProcessor,
    topology: &Topology,
    deployment: &Deployment,
) -> Option<String> {
    let missing = wanted
        .inputs
        .iter()
        .filter(|(_, internal)| *internal)
        .map(|(t, _)| t)
        .chain(wanted.outputs.iter().filter(|t| **t == wanted.group))
        .find(|t| !deployment.internal_topics.contains_key(*t));
    if let Some(topic) = missing {
        return Some(format!("topic {topic} to be created"));
    }
    let shadow = wanted.outputs.iter().find(|t| {
        super::preview::shadow_of(&topology.name, t).is_some()
            && !deployment.shadow_topics.contains(*t)
    });
    if let Some(topic) = shadow {
        return Some(format!("topic {topic} to be created"));
    }
    if !deployment.dead_letter_topics.contains(&start.dlq) {
        return Some(format!("topic {} to be created", start.dlq));
    }
    if let Some(state) = &start.state
        && !deployment.state_topics.contains(&state.topic)
    {
        return Some(format!("topic {} to be created", state.topic));
    }
    None
}

/// What keeps a new life from reading: a retiring life of the same step that must stop first
/// (it shares an input, or `cutover: ordered` holds the new life until the old subtree below
/// it stopped).
fn predecessor_gate(
    wanted: &Wanted,
    topology: &Topology,
    deployment: &Deployment,
    (resolved, topics): (&Resolved, &Topics),
) -> Option<String> {
    let lives = &deployment.lives;
    let predecessors = resolved.retiring_of(&wanted.step);
    let mut gate: BTreeSet<usize> = predecessors
        .iter()
        .copied()
        .filter(|&p| wanted.inputs.iter().any(|(t, _)| lives[p].reads(t)))
        .collect();
    if topology.cutover == CutoverMode::Ordered {
        // Everything the step's old lives wrote must have reached the sinks first, through
        // the old readers of their topics (the old lives may have stopped already).
        gate.extend(predecessors.iter().copied());
        let old_topics: Vec<&str> = deployment
            .internal_topics
            .iter()
            .filter(|(topic, step)| **step == wanted.step && **topic != wanted.group)
            .map(|(topic, _)| topic.as_str())
            .collect();
        let retiring: BTreeSet<usize> = resolved.retiring.iter().copied().collect();
        gate.extend(
            downstream(lives, topics, &old_topics)
                .into_iter()
                .filter(|d| retiring.contains(d)),
        );
    }
    gate.iter()
        .next()
        .map(|&g| format!("{} to stop", lives[g].group()))
}

/// Lives that read, directly or not, any of `of`.
fn downstream(lives: &[Life], topics: &Topics, of: &[&str]) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<usize> = of
        .iter()
        .flat_map(|t| topics.readers(t).iter().copied())
        .collect();
    seen.extend(stack.iter().copied());
    while let Some(next) = stack.pop() {
        for output in &lives[next].start.outputs {
            for &reader in topics.readers(output) {
                if seen.insert(reader) {
                    stack.push(reader);
                }
            }
        }
    }
    seen
}

/// Deletions of internal, state and shadow topics nothing in the target uses, each once
/// nothing that runs uses it.
fn deletions(name: &str, look: &Look<'_>, target: Option<&Topology>) -> Vec<Pending> {
    let Look {
        deployment,
        resolved,
        topics,
    } = *look;
    let lives = &deployment.lives;
    let to_stop = |i: usize| format!("{} to stop", lives[i].group());
    let mut out = Vec::new();
    let shadows = target.map(shadow_sinks).unwrap_or_default();
    for topic in &deployment.shadow_topics {
        // Only what is a shadow topic by its name is ever deleted: never a users' topic.
        if shadows.contains_key(topic.as_str()) || super::preview::shadow_of(name, topic).is_none()
        {
            continue;
        }
        out.push(Pending {
            action: Action::DeleteTopic {
                topic: topic.clone(),
            },
            blocked_by: topics.first_writer(topic).map(to_stop),
        });
    }
    for topic in deployment.internal_topics.keys() {
        if resolved.used.contains(topic) {
            continue;
        }
        out.push(Pending {
            action: Action::DeleteTopic {
                topic: topic.clone(),
            },
            blocked_by: topics.first_user(topic).map(to_stop),
        });
    }
    let states: BTreeSet<String> = target
        .map(|topology| {
            resolved
                .wanted
                .iter()
                .filter_map(|w| match w.kept {
                    Some(k) => lives[k].start.state.as_ref().map(|s| s.topic.clone()),
                    None => w.state_topic(topology, deployment, resolved),
                })
                .collect()
        })
        .unwrap_or_default();
    let mut keeper: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, life) in lives.iter().enumerate() {
        if let Some(state) = &life.start.state {
            keeper.entry(state.topic.as_str()).or_insert(i);
        }
    }
    for topic in &deployment.state_topics {
        if states.contains(topic) {
            continue;
        }
        out.push(Pending {
            action: Action::DeleteTopic {
                topic: topic.clone(),
            },
            blocked_by: keeper.get(topic.as_str()).map(|&i| to_stop(i)),
        });
    }
    out
}

/// The retirement of old life `r`: it drains the old topics whose writers stopped (it is their
/// last reader), then stops. A life whose successor is still to start warm (`warm`) waits
/// for it.
fn retire_life(look: &Look<'_>, r: usize, warm: bool) -> Pending {
    let Look {
        deployment,
        resolved,
        topics,
    } = *look;
    let life = &deployment.lives[r];
    let drains: Vec<String> = life
        .inputs()
        .filter(|t| deployment.internal_topics.contains_key(*t) && !resolved.used.contains(*t))
        .filter(|t| !life.drained.contains(*t))
        .map(str::to_owned)
        .collect();
    if drains.is_empty() {
        let successor = resolved
            .new_of
            .get(life.step())
            .map(|&w| &resolved.wanted[w]);
        let hand_over: Vec<String> = successor
            .map(|w| {
                life.inputs()
                    .filter(|t| w.inputs.iter().any(|(i, _)| i == t))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let successor = successor.filter(|_| !hand_over.is_empty());
        // The successor that starts warm is the step's new life.
        let blocked_by = successor
            .filter(|_| warm)
            .map(|w| format!("{} to start warm", w.group));
        Pending {
            action: Action::StopProcessor {
                step: life.step().to_owned(),
                identity: life.identity(),
                group: life.group().to_owned(),
                successor: successor.map(|w| w.group.clone()),
                hand_over,
            },
            blocked_by,
        }
    } else {
        let writer = drains
            .iter()
            .find_map(|t| topics.first_writer(t))
            .map(|i| format!("{} to stop", deployment.lives[i].group()));
        Pending {
            action: Action::DrainProcessor {
                step: life.step().to_owned(),
                identity: life.identity(),
                group: life.group().to_owned(),
                topics: drains,
            },
            blocked_by: writer,
        }
    }
}

/// The first action that can run now and that `skip` does not rule out (the engine skips
/// actions that wait for something outside the deployment: a drain, a missing topic).
pub fn next(
    name: &str,
    deployment: &Deployment,
    target: Option<&Topology>,
    skip: &dyn Fn(&Action) -> bool,
) -> Option<Action> {
    remaining(name, deployment, target)
        .into_iter()
        .find(|p| p.blocked_by.is_none() && !skip(&p.action))
        .map(|p| p.action)
}

/// Most actions one move can have: every life stops, starts, drains and creates or deletes
/// its topics once. A bound, should a bug ever make the simulation loop.
fn action_bound(deployment: &Deployment, target: Option<&Topology>) -> usize {
    8 * (deployment.lives.len() + target.map_or(0, Topology::len))
        + deployment.lives_used.len()
        + deployment.shadow_topics.len()
        + 16
}

/// The whole plan of topology `name`: the actions in the order the engine runs them when
/// nothing has to wait.
pub fn plan(name: &str, deployment: &Deployment, target: Option<&Topology>) -> Vec<Action> {
    let bound = action_bound(deployment, target);
    let simulation = target.and_then(|topology| simulation::Simulation::new(deployment, topology));
    let Some(simulation) = simulation else {
        return stepwise(name, deployment.clone(), target, Vec::new(), bound);
    };
    let (mut actions, mut simulated) = simulation.run(bound);
    // Deletions are left (or what waits for something): they hold up no other deletion and
    // free nothing, so one look lists them in the order they run.
    let last: Vec<Action> = remaining_unheld(name, &simulated, target)
        .into_iter()
        .filter(|p| p.blocked_by.is_none())
        .map(|p| p.action)
        .collect();
    if last.iter().all(|a| matches!(a, Action::DeleteTopic { .. })) {
        for action in last {
            simulated.apply(&action, Effect::Done);
            actions.push(action);
        }
    }
    stepwise(name, simulated, target, actions, bound)
}

/// What an action does to a simulated deployment: a stop records no offsets.
fn simulated_effect(action: &Action) -> Effect {
    match action {
        Action::StopProcessor { .. } => Effect::Stopped(Vec::new()),
        _ => Effect::Done,
    }
}

/// The rest of a plan, one whole look per action.
fn stepwise(
    name: &str,
    mut simulated: Deployment,
    target: Option<&Topology>,
    mut actions: Vec<Action>,
    bound: usize,
) -> Vec<Action> {
    while actions.len() < bound {
        // As the move will run once a reviewer's choice it waits for is made: the plan shows
        // the start that waits for it, and says why.
        let Some(action) = remaining_unheld(name, &simulated, target)
            .into_iter()
            .find(|p| p.blocked_by.is_none())
            .map(|p| p.action)
        else {
            break;
        };
        simulated.apply(&action, simulated_effect(&action));
        actions.push(action);
    }
    actions
}
