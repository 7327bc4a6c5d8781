//! The plan between two commits: what changes per topology and step, and the ordered cutover
//! actions the engine executes (SPEC §4). Pure data from pure functions; the first deploy is
//! a plan from nothing, and a rollback is the plan with the commits swapped.
//!
//! # How the actions are ordered
//!
//! Per topology, with *retiring* = old processors whose identity does not run in the new graph,
//! and *starting* = new processors whose identity did not run in the old one:
//!
//! 1. scale processors whose identity is unchanged but whose `scale` changed, in place;
//! 2. create the internal topics of starting processors (and the dead-letter topic of new step
//!    names);
//! 3. start every starting processor that waits for nothing (downstream first, so consumers
//!    are ready before data arrives);
//! 4. retire old processors in data-flow order: a processor that reads another retiring
//!    processor first **drains** those topics (its upstream has stopped, so lag 0 is final),
//!    then **stops**. After each stop, a successor whose predecessor has stopped gets the
//!    predecessor's committed offsets on the inputs they share (the *cutover offsets*) and
//!    starts; an old topic whose writer and readers have all stopped is deleted.
//!
//! A successor waits for its predecessor only when they share an input topic (otherwise no
//! record can be seen by both). With `cutover: ordered` it also waits until the predecessor's
//! old subtree has stopped, so records with one key reach the sinks in order.
//!
//! # Guarantees
//!
//! Each record of a shared input is processed by exactly one of predecessor (offsets below the
//! cutover offsets) and successor (offsets from them on). Each record on a retiring topic is
//! processed by the old readers, which drain it; each record on a new topic is processed by the
//! new readers, which start at its beginning. Unchanged identities are never touched.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::graph::{Identity, Kind, StepId, StepKind, Topology};
use crate::spec::{CutoverMode, Scale, StartFrom, Transform};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub from: Option<String>,
    pub to: String,
    pub topologies: Vec<TopologyPlan>,
}

impl Plan {
    /// Whether applying the plan changes anything.
    pub fn is_empty(&self) -> bool {
        self.topologies
            .iter()
            .all(|t| t.change == Change::Unchanged && t.actions.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopologyPlan {
    pub name: String,
    pub change: Change,
    /// Of the new revision (the old one's when the topology is removed).
    pub cutover: CutoverMode,
    pub cluster: String,
    pub steps: Vec<StepPlan>,
    pub actions: Vec<Action>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    Added,
    Removed,
    /// Identity changed: needs a cutover. (Topologies use `Changed` instead.)
    Replaced,
    /// Same identity, other settings changed (e.g. `scale`): applied in place.
    Updated,
    /// A topology with at least one step not unchanged.
    Changed,
    Unchanged,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPlan {
    pub name: String,
    pub kind: Kind,
    pub change: Change,
    pub identity: IdentityChange,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdentityChange {
    pub from: Option<Identity>,
    pub to: Option<Identity>,
}

/// One step of a cutover. Each is idempotent, so an engine that crashed mid-action can redo it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// Create the topic if it does not exist.
    CreateTopic { topic: String, partitions: u32 },
    /// Set the group's offsets on each input as given, then run the processor.
    #[serde(rename_all = "camelCase")]
    StartProcessor(Box<StartProcessor>),
    /// Change the replica bounds of a running identity in place.
    ScaleProcessor {
        step: String,
        identity: Identity,
        group: String,
        scale: Scale,
    },
    /// Wait until the group has consumed everything on `topics` (their writers have stopped).
    DrainProcessor {
        step: String,
        identity: Identity,
        group: String,
        topics: Vec<String>,
    },
    /// Stop gracefully (finish in-flight records, flush, commit) and wait until every
    /// instance has exited.
    StopProcessor {
        step: String,
        identity: Identity,
        group: String,
    },
    /// Read `from_group`'s committed offsets on `topics` (the cutover offsets), record them
    /// durably, and commit them for `to_group`.
    #[serde(rename_all = "camelCase")]
    HandOverOffsets {
        step: String,
        from_group: String,
        to_group: String,
        topics: Vec<String>,
    },
    /// Delete the topic: its writer and readers have stopped.
    DeleteTopic { topic: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartProcessor {
    pub step: String,
    pub identity: Identity,
    pub group: String,
    pub inputs: Vec<StartInput>,
    pub outputs: Vec<String>,
    pub dlq: String,
    pub transform: Transform,
    pub env: BTreeMap<String, String>,
    pub scale: Scale,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartInput {
    pub topic: String,
    pub from: StartPosition,
}

/// Where a starting group begins on an input. The engine always sets it explicitly: offsets a
/// group kept from an earlier life are never trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartPosition {
    /// A topic created in this cutover: all of it.
    Earliest,
    /// `startFrom: latest` on an existing topic: the end at start time.
    Latest,
    /// The offsets handed over by the predecessor (a preceding `hand-over-offsets`).
    Cutover,
}

/// Plans the move from `from` (nothing, for a first deploy) to `to`.
pub fn plan(from: Option<(&str, &[Topology])>, to: (&str, &[Topology])) -> Plan {
    let old: BTreeMap<&str, &Topology> = from
        .map(|(_, ts)| ts.iter().map(|t| (t.name.as_str(), t)).collect())
        .unwrap_or_default();
    let new: BTreeMap<&str, &Topology> = to.1.iter().map(|t| (t.name.as_str(), t)).collect();
    let names: BTreeSet<&str> = old.keys().chain(new.keys()).copied().collect();
    Plan {
        from: from.map(|(commit, _)| commit.to_owned()),
        to: to.0.to_owned(),
        topologies: names
            .into_iter()
            .map(|name| plan_topology(old.get(name).copied(), new.get(name).copied()))
            .collect(),
    }
}

/// Plans one topology; at least one side is present.
pub fn plan_topology(old: Option<&Topology>, new: Option<&Topology>) -> TopologyPlan {
    let steps = step_changes(old, new);
    let change = match (old, new) {
        (None, _) => Change::Added,
        (_, None) => Change::Removed,
        (Some(o), Some(n)) => {
            let same = steps.iter().all(|s| s.change == Change::Unchanged)
                && o.cutover == n.cutover
                && o.cluster == n.cluster;
            if same {
                Change::Unchanged
            } else {
                Change::Changed
            }
        }
    };
    let shown = new.or(old);
    TopologyPlan {
        name: shown.map(|t| t.name.clone()).unwrap_or_default(),
        change,
        cutover: shown.map(|t| t.cutover).unwrap_or_default(),
        cluster: shown.map(|t| t.cluster.clone()).unwrap_or_default(),
        steps,
        actions: Cutover::new(old, new).actions(),
    }
}

/// Steps of the new graph in data-flow order, then removed steps in their old order.
fn step_changes(old: Option<&Topology>, new: Option<&Topology>) -> Vec<StepPlan> {
    let mut out = Vec::new();
    if let Some(new) = new {
        for (_, step) in new.steps() {
            let before = old.and_then(|o| o.find(&step.name).map(|id| o.step(id)));
            let change = match before {
                None => Change::Added,
                Some(b) if b.identity != step.identity || b.kind() != step.kind() => {
                    Change::Replaced
                }
                Some(b)
                    if b.kind != step.kind
                        || b.description != step.description
                        || b.owner != step.owner =>
                {
                    Change::Updated
                }
                Some(_) => Change::Unchanged,
            };
            out.push(StepPlan {
                name: step.name.clone(),
                kind: step.kind(),
                change,
                identity: IdentityChange {
                    from: before.map(|b| b.identity),
                    to: Some(step.identity),
                },
            });
        }
    }
    if let Some(old) = old {
        for (_, step) in old.steps() {
            if new.is_some_and(|n| n.find(&step.name).is_some()) {
                continue;
            }
            out.push(StepPlan {
                name: step.name.clone(),
                kind: step.kind(),
                change: Change::Removed,
                identity: IdentityChange {
                    from: Some(step.identity),
                    to: None,
                },
            });
        }
    }
    out
}

/// The cutover of one topology, computed by simulating the engine's progress.
struct Cutover<'a> {
    old: Option<&'a Topology>,
    new: Option<&'a Topology>,
    /// Old processors whose identity does not run in the new graph, in data-flow order.
    retiring: Vec<StepId>,
    /// New processors whose identity did not run in the old graph, in data-flow order.
    starting: Vec<StepId>,
    /// For a starting processor: its predecessor (same name, retiring), if any.
    predecessor: BTreeMap<StepId, StepId>,
    /// For a starting processor: the retiring processors that must stop before it starts.
    gate: BTreeMap<StepId, BTreeSet<StepId>>,
}

impl<'a> Cutover<'a> {
    fn new(old: Option<&'a Topology>, new: Option<&'a Topology>) -> Self {
        let runs_in = |t: Option<&Topology>, name: &str, identity: Identity| {
            t.and_then(|t| t.find(name)).zip(t).is_some_and(|(id, t)| {
                let s = t.step(id);
                s.kind() == Kind::Processor && s.identity == identity
            })
        };
        let processors = |t: Option<&'a Topology>| {
            t.into_iter()
                .flat_map(|t| t.steps())
                .filter(|(_, s)| s.kind() == Kind::Processor)
        };
        let retiring: Vec<StepId> = processors(old)
            .filter(|(_, s)| !runs_in(new, &s.name, s.identity))
            .map(|(id, _)| id)
            .collect();
        let starting: Vec<StepId> = processors(new)
            .filter(|(_, s)| !runs_in(old, &s.name, s.identity))
            .map(|(id, _)| id)
            .collect();

        let mut cutover = Cutover {
            old,
            new,
            retiring,
            starting,
            predecessor: BTreeMap::new(),
            gate: BTreeMap::new(),
        };
        if let (Some(old), Some(new)) = (old, new) {
            let retiring: BTreeSet<StepId> = cutover.retiring.iter().copied().collect();
            for &n in &cutover.starting {
                let Some(p) = old.find(&new.step(n).name).filter(|p| retiring.contains(p)) else {
                    continue;
                };
                cutover.predecessor.insert(n, p);
                let mut gate = BTreeSet::new();
                if !cutover.shared_inputs(n).is_empty() {
                    gate.insert(p);
                }
                if new.cutover == CutoverMode::Ordered {
                    gate.insert(p);
                    gate.extend(old.descendants(p).intersection(&retiring));
                }
                cutover.gate.insert(n, gate);
            }
        }
        cutover
    }

    /// Topics both a starting processor and its predecessor read: these are handed over.
    fn shared_inputs(&self, n: StepId) -> Vec<String> {
        match (self.old, self.new, self.predecessor.get(&n)) {
            (Some(old), Some(new), Some(&p)) => {
                let before: BTreeSet<String> = old.input_topics(p).into_iter().collect();
                new.input_topics(n)
                    .into_iter()
                    .filter(|t| before.contains(t))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    fn actions(&self) -> Vec<Action> {
        let mut actions = Vec::new();
        self.scale_in_place(&mut actions);
        let new_topics = self.create_topics(&mut actions);

        let mut started: BTreeSet<StepId> = BTreeSet::new();
        let mut stopped: BTreeSet<StepId> = BTreeSet::new();
        self.start_ready(&stopped, &mut started, &new_topics, &mut actions);

        let Some(old) = self.old else {
            return actions;
        };
        let retiring: BTreeSet<StepId> = self.retiring.iter().copied().collect();
        let mut deleted: BTreeSet<StepId> = BTreeSet::new();
        for &o in &self.retiring {
            let step = old.step(o);
            let group = old.internal_name(o);
            let draining: Vec<String> = old
                .inputs(o)
                .into_iter()
                .filter(|i| retiring.contains(i))
                .map(|i| old.internal_name(i))
                .collect();
            if !draining.is_empty() {
                actions.push(Action::DrainProcessor {
                    step: step.name.clone(),
                    identity: step.identity,
                    group: group.clone(),
                    topics: draining,
                });
            }
            actions.push(Action::StopProcessor {
                step: step.name.clone(),
                identity: step.identity,
                group,
            });
            stopped.insert(o);
            self.start_ready(&stopped, &mut started, &new_topics, &mut actions);
            // Old internal topics whose writer and readers have all stopped.
            for &t in &self.retiring {
                let readers_done = old
                    .consumers(t)
                    .iter()
                    .all(|c| old.step(*c).kind() != Kind::Processor || stopped.contains(c));
                if stopped.contains(&t)
                    && readers_done
                    && old.feeds_processor(t)
                    && deleted.insert(t)
                {
                    actions.push(Action::DeleteTopic {
                        topic: old.internal_name(t),
                    });
                }
            }
        }
        actions
    }

    fn scale_in_place(&self, actions: &mut Vec<Action>) {
        let (Some(old), Some(new)) = (self.old, self.new) else {
            return;
        };
        for (n, step) in new.steps() {
            let StepKind::Processor { scale, .. } = &step.kind else {
                continue;
            };
            let Some(o) = old.find(&step.name) else {
                continue;
            };
            let before = old.step(o);
            if let StepKind::Processor {
                scale: old_scale, ..
            } = &before.kind
                && before.identity == step.identity
                && old_scale != scale
            {
                actions.push(Action::ScaleProcessor {
                    step: step.name.clone(),
                    identity: step.identity,
                    group: new.internal_name(n),
                    scale: *scale,
                });
            }
        }
    }

    /// Creates starting processors' internal topics and new step names' dead-letter topics;
    /// returns the internal topics created.
    fn create_topics(&self, actions: &mut Vec<Action>) -> BTreeSet<String> {
        let mut created = BTreeSet::new();
        let Some(new) = self.new else {
            return created;
        };
        for &n in &self.starting {
            let StepKind::Processor { partitions, .. } = &new.step(n).kind else {
                continue;
            };
            if new.feeds_processor(n) {
                let topic = new.internal_name(n);
                created.insert(topic.clone());
                actions.push(Action::CreateTopic {
                    topic,
                    partitions: *partitions,
                });
            }
            let name_is_new = self.old.is_none_or(|o| {
                o.find(&new.step(n).name)
                    .is_none_or(|p| o.step(p).kind() != Kind::Processor)
            });
            if name_is_new {
                actions.push(Action::CreateTopic {
                    topic: new.dlq_topic(n),
                    partitions: 1,
                });
            }
        }
        created
    }

    /// Starts, downstream first, every starting processor whose gate has stopped.
    fn start_ready(
        &self,
        stopped: &BTreeSet<StepId>,
        started: &mut BTreeSet<StepId>,
        new_topics: &BTreeSet<String>,
        actions: &mut Vec<Action>,
    ) {
        let Some(new) = self.new else { return };
        for &n in self.starting.iter().rev() {
            let ready = self.gate.get(&n).is_none_or(|gate| gate.is_subset(stopped));
            if !ready || started.contains(&n) {
                continue;
            }
            started.insert(n);
            let shared = self.shared_inputs(n);
            if let (Some(old), Some(&p), false) =
                (self.old, self.predecessor.get(&n), shared.is_empty())
            {
                actions.push(Action::HandOverOffsets {
                    step: new.step(n).name.clone(),
                    from_group: old.internal_name(p),
                    to_group: new.internal_name(n),
                    topics: shared.clone(),
                });
            }
            actions.extend(self.start(new, n, &shared, new_topics));
        }
    }

    /// The start action of a starting processor (only processors start).
    fn start(
        &self,
        new: &Topology,
        n: StepId,
        shared: &[String],
        new_topics: &BTreeSet<String>,
    ) -> Option<Action> {
        let step = new.step(n);
        let StepKind::Processor {
            transform,
            env,
            scale,
            start_from,
            ..
        } = &step.kind
        else {
            return None;
        };
        let inputs = new
            .input_topics(n)
            .into_iter()
            .map(|topic| {
                let from = if shared.contains(&topic) {
                    StartPosition::Cutover
                } else if new_topics.contains(&topic) {
                    StartPosition::Earliest
                } else {
                    match *start_from {
                        StartFrom::Latest => StartPosition::Latest,
                        StartFrom::Earliest => StartPosition::Earliest,
                    }
                };
                StartInput { topic, from }
            })
            .collect();
        Some(Action::StartProcessor(Box::new(StartProcessor {
            step: step.name.clone(),
            identity: step.identity,
            group: new.internal_name(n),
            inputs,
            outputs: new.output_topics(n),
            dlq: new.dlq_topic(n),
            transform: transform.clone(),
            env: env.clone(),
            scale: *scale,
        })))
    }
}
