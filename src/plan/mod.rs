//! The plan between two commits: what changes per topology and step, and the ordered cutover
//! actions the engine executes (SPEC §4). Pure data from pure functions.
//!
//! A plan is computed from a [`Deployment`] (what runs: processor lives, internal topics,
//! recorded cutover offsets) to a target graph, by [`moves`]. `plumber plan A B` plans from
//! A's graph as if it were deployed ([`Deployment::of`]); the daemon plans from the deployment
//! it recorded, whatever state a crash, a stuck action or a newer commit left it in. The first
//! deploy is a plan from nothing.
//!
//! # How the actions are ordered
//!
//! Per topology, with *retiring* = deployed lives the target does not keep, and *starting* =
//! target processors no deployed life already is:
//!
//! 1. scale processors whose identity is unchanged but whose `scale` changed, in place;
//! 2. create the internal topics of starting processors (and the dead-letter topic of new step
//!    names);
//! 3. start every starting processor that waits for nothing (downstream first, so consumers
//!    are ready before data arrives), and **warm** every stateless successor that shares an
//!    input with its running predecessor: it joins its group and holds its partitions unread;
//! 4. retire old lives in data-flow order: a life that reads a topic whose writer retired
//!    first **drains** it (its writer has stopped, so lag 0 is final), then **stops** (once
//!    its warm successor holds every partition), and its committed offsets are recorded: the
//!    *cutover offsets* of its step's next life. After each stop, a successor whose
//!    predecessor has stopped starts from them, or a warm one is **handed** them; an old topic
//!    whose writer and readers have all stopped is deleted.
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
//! new readers, which start at its beginning. Unchanged identities are never touched. An
//! identity that runs again after it retired gets a new life: new group, new internal topic,
//! so nothing of its earlier life (kept records, committed offsets, members) reaches it.

pub mod deployment;
pub mod moves;
pub mod preview;
pub mod reason;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::graph::{Identity, Kind, Topology};
use crate::spec::{CutoverMode, EnvValue, Resources, Scale, Transform};
pub use deployment::{Deployment, Effect, Life, PartitionOffset, Recorded, TopicKind};
pub use reason::{FieldChange, Reason};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub from: Option<String>,
    pub to: String,
    pub topologies: Vec<TopologyPlan>,
    /// Planned for a daemon that keeps retired topics (`plumber up --keep-topics`): see
    /// [`Plan::keeping_topics`].
    #[serde(rename = "keepTopics")]
    pub keep_topics: bool,
}

impl Plan {
    /// Whether applying the plan changes anything.
    pub fn is_empty(&self) -> bool {
        self.topologies
            .iter()
            .all(|t| t.change == Change::Unchanged && t.actions.is_empty())
    }

    /// The plan as a daemon with `--keep-topics` runs it: its engine skips every
    /// `delete-topic` (the topic stays on the broker), so those actions move from `actions`
    /// to `kept_topics`.
    pub fn keeping_topics(mut self) -> Self {
        self.keep_topics = true;
        for topology in &mut self.topologies {
            let (kept, actions): (Vec<Action>, Vec<Action>) = std::mem::take(&mut topology.actions)
                .into_iter()
                .partition(|a| matches!(a, Action::DeleteTopic { .. }));
            topology.actions = actions;
            topology
                .kept_topics
                .extend(kept.into_iter().filter_map(|a| match a {
                    Action::DeleteTopic { topic } => Some(topic),
                    _ => None,
                }));
        }
        self
    }

    /// Names each step's owners: `owners_of` maps a step file (repository-relative, as
    /// [`StepPlan::file`]) to them, e.g. from `CODEOWNERS`. Unchanged steps get none: the
    /// owners are whom a change asks for review.
    pub fn with_owners(mut self, owners_of: impl Fn(&str) -> Vec<String>) -> Self {
        for step in self.topologies.iter_mut().flat_map(|t| &mut t.steps) {
            if step.change != Change::Unchanged {
                step.owners = owners_of(&step.file);
            }
        }
        self
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
    /// Retired topics the daemon keeps instead of deleting (`--keep-topics`).
    #[serde(rename = "keptTopics", skip_serializing_if = "Vec::is_empty")]
    pub kept_topics: Vec<String>,
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
    /// A processor is `added`, `removed`, `replaced`, `updated` or `unchanged`. Sources and
    /// sinks are topics their users own, never replaced: `added`, `removed`, `updated` (their
    /// own file changed: topic, inputs, description…) or `unchanged`, whatever happens to the
    /// processors around them.
    pub change: Change,
    pub identity: IdentityChange,
    /// The step file (the old one when the step is removed).
    pub file: String,
    /// Why a `replaced` or `updated` step is; `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// The steps it reads (in the old graph when the step is removed): a plan's diagram.
    pub inputs: Vec<String>,
    /// Who owns the step file (`CODEOWNERS`), for changed steps.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<String>,
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
    CreateTopic {
        topic: String,
        /// The step whose records it holds.
        step: String,
        partitions: u32,
        /// `None`: the broker's default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replication: Option<u32>,
        /// Topic settings over the broker's defaults.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        config: BTreeMap<String, String>,
        kind: TopicKind,
        /// As many partitions as this topic has when it is created (a changelog, for an
        /// input whose partitions the plan cannot know): `partitions` is then 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        like: Option<String>,
    },
    /// Set the group's offsets on each input as given, then run the processor.
    #[serde(rename_all = "camelCase")]
    StartProcessor(Box<StartProcessor>),
    /// Run a replaced step's next life before its predecessor stops, *warm*: its instances
    /// connect, join the group and hold every partition they are given, unread, until
    /// `hand-off` says where each starts. No offsets are set: the predecessor still runs.
    #[serde(rename_all = "camelCase")]
    StartWarm(Box<StartProcessor>),
    /// Give a warm life its start (what `start-processor` would have set: its predecessor's
    /// recorded offsets, or where a new topic begins) through its hand-off group
    /// ([`deployment::handoff_group`]), and wait until its group has committed a start on
    /// every input partition: from then on it reads.
    HandOff {
        step: String,
        identity: Identity,
        group: String,
    },
    /// Change the replica bounds and resources of a running identity in place.
    UpdateProcessor {
        step: String,
        identity: Identity,
        group: String,
        scale: Scale,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resources: Option<Resources>,
    },
    /// Wait until the group has consumed everything on `topics` (their writers have stopped).
    DrainProcessor {
        step: String,
        identity: Identity,
        group: String,
        topics: Vec<String>,
    },
    /// Stop gracefully (finish in-flight records, flush, commit), wait until every instance
    /// has exited and the group has no members, then record its committed offsets on its
    /// inputs: the cutover offsets of its step's next life (`successor`, on `hand_over`).
    #[serde(rename_all = "camelCase")]
    StopProcessor {
        step: String,
        identity: Identity,
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        successor: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hand_over: Vec<String>,
    },
    /// Delete the topic: its writer and readers have stopped.
    DeleteTopic { topic: String },
    /// Delete the consumer groups of every life of processor `base` (`base`, `base.2`, …
    /// `base.<lives>`): a retired preview's, none of whose lives runs.
    DeleteGroups { base: String, lives: u32 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartProcessor {
    pub step: String,
    pub identity: Identity,
    /// Also its internal topic, if it writes one.
    pub group: String,
    /// Which life of its identity this is (1: the first; its names then carry no number).
    pub life: u32,
    pub inputs: Vec<StartInput>,
    pub outputs: Vec<String>,
    pub dlq: String,
    pub transform: Transform,
    pub env: BTreeMap<String, EnvValue>,
    pub scale: Scale,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// A stateful step's changelog, and what its state starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateRun>,
    /// A join's table topic (the transform names its step): each instance reads it whole,
    /// outside the group. Not among `inputs`: nothing drains it, nothing hands it over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
}

/// Where a stateful step keeps its state, and what a new life's state starts from
/// (`docs/stateful-sql.md`, "Cutover of a stateful step").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateRun {
    /// The changelog topic: `plumber.<topology>.<step>.<state12>.state`, named by what the
    /// state is made of, so a life whose state is the same as the old one's reads the old
    /// one's changelog.
    pub topic: String,
    pub carry: Carry,
}

/// What a life's state starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Carry {
    /// The changelog exists: the old life's (the same state), or its own.
    Restore,
    /// A new state, rebuilt from each input partition's records from `span_ms` before the
    /// cutover offsets, without emitting.
    #[serde(rename_all = "camelCase")]
    Rebuild { span_ms: i64 },
    /// Rebuilt from the earliest offset the input holds (`stateStart: earliest`).
    Earliest,
    /// Nothing before its start offsets (a new step, or `stateStart: empty`).
    Empty,
    /// Neither is possible and the step file does not say what to do: the move waits for
    /// the reviewer's `stateStart`.
    Cannot { why: String },
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
    /// Where the step's previous life stopped on this input (its recorded committed offsets).
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
        keep_topics: false,
    }
}

/// Plans one topology; at least one side is present.
pub fn plan_topology(old: Option<&Topology>, new: Option<&Topology>) -> TopologyPlan {
    let deployed = old.map(Deployment::of).unwrap_or_default();
    plan_topology_from(old, &deployed, new)
}

/// Plans one topology from what runs of it (`deployed`, as the engine would: its actions are
/// the ones the engine runs), with `old` the graph it runs (to tell each step's change).
pub fn plan_topology_from(
    old: Option<&Topology>,
    deployed: &Deployment,
    new: Option<&Topology>,
) -> TopologyPlan {
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
    let name = shown.map(|t| t.name.clone()).unwrap_or_default();
    TopologyPlan {
        actions: moves::plan(&name, deployed, new),
        name,
        change,
        cutover: shown.map(|t| t.cutover).unwrap_or_default(),
        cluster: shown.map(|t| t.cluster.clone()).unwrap_or_default(),
        steps,
        kept_topics: Vec::new(),
    }
}

fn input_names(topology: &Topology, id: crate::graph::StepId) -> Vec<String> {
    topology
        .inputs(id)
        .into_iter()
        .map(|i| topology.step(i).name.clone())
        .collect()
}

/// Steps of the new graph in data-flow order, then removed steps in their old order.
fn step_changes(old: Option<&Topology>, new: Option<&Topology>) -> Vec<StepPlan> {
    let mut out = Vec::new();
    if let Some(new) = new {
        for (new_id, step) in new.steps() {
            let before = old.and_then(|o| o.find(&step.name).map(|id| (o, id)));
            let (change, reason) = match before {
                None => (Change::Added, None),
                Some((old, old_id)) => {
                    let reason = reason::between(old, old_id, new, new_id);
                    let b = old.step(old_id);
                    let processor = b.kind() == Kind::Processor || step.kind() == Kind::Processor;
                    let change =
                        if processor && (b.identity != step.identity || b.kind() != step.kind()) {
                            Change::Replaced
                        } else if !reason.changed.is_empty() {
                            Change::Updated
                        } else {
                            Change::Unchanged
                        };
                    (change, (change != Change::Unchanged).then_some(reason))
                }
            };
            out.push(StepPlan {
                name: step.name.clone(),
                kind: step.kind(),
                change,
                identity: IdentityChange {
                    from: before.map(|(o, id)| o.step(id).identity),
                    to: Some(step.identity),
                },
                file: step.file.clone(),
                reason,
                inputs: input_names(new, new_id),
                owners: Vec::new(),
            });
        }
    }
    if let Some(old) = old {
        for (old_id, step) in old.steps() {
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
                file: step.file.clone(),
                reason: None,
                inputs: input_names(old, old_id),
                owners: Vec::new(),
            });
        }
    }
    out
}
