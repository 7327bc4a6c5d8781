//! What runs of one topology, as the engine left it: the planner's starting point and the
//! whole of a topology's durable cutover state.
//!
//! A [`Deployment`] knows every processor *life* that runs (a life is one run of an identity
//! under one name: a revived identity gets a new life, SPEC §4 "Revived identities"), the
//! internal topics that exist, and where stopped lives stood on their inputs (the cutover
//! offsets their successors start from). It never refers to a commit's graph, so a move can
//! be planned from any state a crash, a stuck action or a newer commit left behind.
//!
//! [`Deployment::apply`] is the only way it changes: the engine calls it once an action took
//! effect (with what Kafka answered), the planner calls it to simulate the rest of a plan.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::state::OldState;
use super::{Action, StartPosition, StartProcessor};
use crate::graph::Identity;

/// One partition's offset: a group's committed offset, or where a group starts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// What runs of one topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    /// Processor lives that run, or whose offsets are set and which are about to run.
    pub lives: Vec<Life>,
    /// Internal topics that exist, with the step that writes them: Plumber's own, deleted
    /// once nothing reads or writes them.
    pub internal_topics: BTreeMap<String, String>,
    /// Dead-letter topics created; never deleted (they hold the users' rejected records).
    pub dead_letter_topics: BTreeSet<String>,
    /// Stateful steps' changelogs created; deleted once no life and nothing in the target
    /// uses them.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub state_topics: BTreeSet<String>,
    /// A preview's shadow topics created ([`super::preview::shadow_of`]); deleted once
    /// nothing writes them.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub shadow_topics: BTreeSet<String>,
    /// Processor names (of `lives_used`) whose consumer groups were deleted: a retired
    /// preview leaves none behind.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub groups_deleted: BTreeSet<String>,
    /// Internal topics created since the deployment last matched its target: a reader that
    /// starts on one starts at its beginning (SPEC §4: "earliest on topics created in the
    /// same cutover", which a newer commit taking over a cutover continues). Changelogs
    /// created since then too: they hold no old life's state.
    pub fresh_topics: BTreeSet<String>,
    /// Where stopped lives stood on their inputs, by step and topic: the cutover offsets of
    /// the step's next life on that topic. Forgotten once the deployment matches its target.
    pub positions: BTreeMap<String, BTreeMap<String, Recorded>>,
    /// The last life of each processor name (`plumber.<topology>.<step>.<id12>`), so that an
    /// identity that runs again gets names nothing of its earlier life can reach.
    pub lives_used: BTreeMap<String, u32>,
}

/// Where a stopped life stood on one input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recorded {
    /// The stopped life's group.
    pub group: String,
    /// Its committed offsets; a partition without one was never consumed by it.
    pub offsets: Vec<PartitionOffset>,
    /// A stateful life's state, which its successor may carry over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<OldState>,
}

/// One life of a processor identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Life {
    /// How it was started: names, inputs and where it began on them, transform, scale.
    pub start: StartProcessor,
    /// 1 for an identity's first life; its names carry the number from the second on.
    pub life: u32,
    /// False between setting its group's offsets (or, warm, recording it) and starting it.
    pub running: bool,
    /// Started warm and not handed off yet: its instances hold their partitions unread, and
    /// its group has no offsets of its own (`hand-off` gives them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// Inputs whose writers stopped and which it has read to their end.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub drained: BTreeSet<String>,
}

impl Life {
    pub fn step(&self) -> &str {
        &self.start.step
    }

    pub fn group(&self) -> &str {
        &self.start.group
    }

    pub fn identity(&self) -> Identity {
        self.start.identity
    }

    /// The topics it reads, sorted.
    pub fn inputs(&self) -> impl Iterator<Item = &str> {
        self.start.inputs.iter().map(|i| i.topic.as_str())
    }

    pub fn reads(&self, topic: &str) -> bool {
        self.inputs().any(|t| t == topic)
    }

    /// Whether it writes an internal topic (named like its group).
    pub fn writes(&self, topic: &str) -> bool {
        self.start.outputs.iter().any(|t| t == topic)
    }
}

/// The name of an identity's first life: `plumber.<topology>.<step>.<id12>`.
pub fn base_name(topology: &str, step: &str, identity: Identity) -> String {
    format!("plumber.{topology}.{step}.{}", identity.short())
}

/// The consumer group (and internal topic) of a life: the base name, then `.<life>` from
/// the second life on.
pub fn life_name(base: &str, life: u32) -> String {
    if life <= 1 {
        base.to_owned()
    } else {
        format!("{base}.{life}")
    }
}

/// The group a warm life's start is handed to (`hand-off`): nobody joins it, so offsets can
/// be committed to it while the life's own group has members. No life is ever named so.
pub fn handoff_group(group: &str) -> String {
    format!("{group}.handoff")
}

/// What an action did, as far as the deployment must remember it.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// The action took effect; nothing to add.
    Done,
    /// A start set its group's offsets (the first half of `start-processor`); the life
    /// exists but does not run yet.
    Prepared,
    /// A stop: the stopped group's committed offsets on its inputs.
    Stopped(Vec<PartitionOffset>),
}

impl Deployment {
    pub fn is_empty(&self) -> bool {
        self.lives.is_empty() && self.internal_topics.is_empty() && self.shadow_topics.is_empty()
    }

    pub fn life(&self, group: &str) -> Option<&Life> {
        self.lives.iter().find(|l| l.group() == group)
    }

    /// Records that `action` took effect with `effect`.
    pub fn apply(&mut self, action: &Action, effect: Effect) {
        self.apply_with(action, effect, false, None);
    }

    /// [`Deployment::apply`], except that a stopped life stays in `lives` and a started one
    /// goes last: every life keeps its index (the planner's simulation, which forgets the
    /// stopped lives itself and knows where the life an action names is: `at`).
    pub(super) fn apply_keeping_lives(
        &mut self,
        action: &Action,
        effect: Effect,
        at: Option<usize>,
    ) {
        self.apply_with(action, effect, true, at);
    }

    /// The index of the life of `group`. A `hint` is where it is, or would be once started
    /// (the simulation knows): nothing is searched.
    fn find(&self, group: &str, hint: Option<usize>) -> Option<usize> {
        match hint {
            Some(i) => self
                .lives
                .get(i)
                .is_some_and(|l| l.group() == group)
                .then_some(i),
            None => self.lives.iter().position(|l| l.group() == group),
        }
    }

    fn apply_with(
        &mut self,
        action: &Action,
        effect: Effect,
        keep_lives: bool,
        hint: Option<usize>,
    ) {
        match action {
            Action::CreateTopic {
                topic, step, kind, ..
            } => match kind {
                TopicKind::Internal => {
                    self.internal_topics.insert(topic.clone(), step.clone());
                    self.fresh_topics.insert(topic.clone());
                }
                TopicKind::DeadLetter => {
                    self.dead_letter_topics.insert(topic.clone());
                }
                TopicKind::Shadow => {
                    self.shadow_topics.insert(topic.clone());
                }
                TopicKind::State => {
                    // Fresh: empty, not an old life's state to restore.
                    self.state_topics.insert(topic.clone());
                    self.fresh_topics.insert(topic.clone());
                }
            },
            Action::DeleteTopic { topic } => {
                self.internal_topics.remove(topic);
                self.state_topics.remove(topic);
                self.fresh_topics.remove(topic);
                self.shadow_topics.remove(topic);
            }
            Action::DeleteGroups { base, .. } => {
                self.groups_deleted.insert(base.clone());
            }
            Action::UpdateProcessor {
                group,
                scale,
                resources,
                ..
            } => {
                if let Some(life) = self.find(group, hint).map(|i| &mut self.lives[i]) {
                    life.start.scale = *scale;
                    life.start.resources = resources.clone();
                }
            }
            Action::DrainProcessor { group, topics, .. } => {
                if let Some(life) = self.find(group, hint).map(|i| &mut self.lives[i]) {
                    life.drained.extend(topics.iter().cloned());
                }
            }
            Action::StartProcessor(start) | Action::StartWarm(start) => {
                let warm = matches!(action, Action::StartWarm(_));
                if self.find(&start.group, hint).is_none() {
                    // A cold start takes the step's recorded positions on these inputs now,
                    // a warm one at its hand-off.
                    if !warm {
                        self.take_positions(start);
                    }
                    let base = base_name_of(&start.group, start.life);
                    self.lives_used.insert(base, start.life);
                    let life = Life {
                        start: (**start).clone(),
                        life: start.life,
                        running: false,
                        held: warm,
                        drained: BTreeSet::new(),
                    };
                    if keep_lives {
                        self.lives.push(life);
                    } else {
                        self.insert_in_data_flow_order(life);
                    }
                }
                if effect != Effect::Prepared
                    && let Some(life) = self.find(&start.group, hint).map(|i| &mut self.lives[i])
                {
                    life.running = true;
                }
            }
            Action::HandOff { group, .. } => {
                let Some(start) = self
                    .find(group, hint)
                    .map(|i| &self.lives[i])
                    .filter(|l| l.held)
                    .map(|l| l.start.clone())
                else {
                    return;
                };
                self.take_positions(&start);
                if let Some(life) = self.find(group, hint).map(|i| &mut self.lives[i]) {
                    life.held = false;
                }
            }
            Action::StopProcessor { group, .. } => {
                let Some(at) = self.find(group, hint) else {
                    return;
                };
                let life = if keep_lives {
                    self.lives[at].clone()
                } else {
                    self.lives.remove(at)
                };
                let Effect::Stopped(offsets) = effect else {
                    return;
                };
                let positions = self.positions.entry(life.step().to_owned()).or_default();
                let state = OldState::of(&life.start);
                for topic in life.inputs() {
                    let on_topic: Vec<PartitionOffset> = offsets
                        .iter()
                        .filter(|p| p.topic == topic)
                        .cloned()
                        .collect();
                    if life.held {
                        // Stopped before its hand-off was recorded: it read at most from the
                        // hand-off on, so where it committed it is further than the step's
                        // recorded position, and where it did not, that position stands.
                        if on_topic.is_empty() {
                            continue;
                        }
                        let recorded = positions.entry(topic.to_owned()).or_insert(Recorded {
                            group: life.group().to_owned(),
                            offsets: Vec::new(),
                            state: None,
                        });
                        recorded.group = life.group().to_owned();
                        for offset in on_topic {
                            recorded.offsets.retain(|p| p.partition != offset.partition);
                            recorded.offsets.push(offset);
                        }
                        recorded.offsets.sort();
                        continue;
                    }
                    positions.insert(
                        topic.to_owned(),
                        Recorded {
                            group: life.group().to_owned(),
                            offsets: on_topic,
                            state: state.clone(),
                        },
                    );
                }
                if positions.is_empty() {
                    self.positions.remove(life.step());
                }
            }
        }
    }

    /// A starting life takes its step's recorded positions on the inputs it starts on from
    /// them: they are its offsets now, no other life's.
    fn take_positions(&mut self, start: &StartProcessor) {
        if let Some(positions) = self.positions.get_mut(&start.step) {
            for input in &start.inputs {
                if input.from == StartPosition::Cutover {
                    positions.remove(&input.topic);
                }
            }
            if positions.is_empty() {
                self.positions.remove(&start.step);
            }
        }
    }

    /// The deployment matches its target: what only a move needed is forgotten.
    pub fn settle(&mut self) {
        self.fresh_topics.clear();
        self.positions.clear();
        for life in &mut self.lives {
            life.drained.clear();
        }
    }
}

/// The base name of a life's group.
fn base_name_of(group: &str, life: u32) -> String {
    if life <= 1 {
        return group.to_owned();
    }
    group
        .strip_suffix(&format!(".{life}"))
        .unwrap_or(group)
        .to_owned()
}

/// What a created topic is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicKind {
    /// A processor's output, read by other processors.
    Internal,
    /// A step's dead letters.
    DeadLetter,
    /// A preview's stand-in for a users' sink topic, with as many partitions (the engine
    /// reads the count when it creates it).
    Shadow,
    /// A stateful step's changelog (compacted).
    State,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_life_keeps_the_plain_name_and_later_ones_are_numbered() {
        assert_eq!(
            life_name("plumber.t.a.0123456789ab", 1),
            "plumber.t.a.0123456789ab"
        );
        assert_eq!(
            life_name("plumber.t.a.0123456789ab", 3),
            "plumber.t.a.0123456789ab.3"
        );
        assert_eq!(
            base_name_of("plumber.t.a.0123456789ab.3", 3),
            "plumber.t.a.0123456789ab"
        );
        assert_eq!(
            base_name_of("plumber.t.a.0123456789ab", 1),
            "plumber.t.a.0123456789ab"
        );
    }
}
