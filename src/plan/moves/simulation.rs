//! [`super::plan`] without a whole look at the deployment after every action.
//!
//! The plan is [`super::next`] applied to a simulated deployment until nothing remains; a
//! look resolves the whole target, so asked after every action it makes a plan cost its
//! length times the topology's size. Here the actions of each target processor and each
//! retiring life are kept between actions, and only those of the units an action touched
//! are worked out again: the same actions in the same order (the property tests compare the
//! two), at a cost that grows with the plan's length.
//!
//! It needs the lives in data-flow order (the engine keeps them so): the retiring lives keep
//! their order as others stop, so each keeps its place for the whole plan.

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::Topology;
use crate::plan::Action;
use crate::plan::deployment::Deployment;
use crate::spec::CutoverMode;

use super::{
    Key, Look, Pending, Resolved, Topics, in_data_flow_order, resolve_with, retire_life,
    shadow_sinks, wanted_actions,
};

pub(super) struct Simulation<'t> {
    topology: &'t Topology,
    /// The simulated deployment, whose lives keep their indices: a stopped life stays in
    /// `lives` (nothing the look knows refers to it any more), a started one goes last.
    deployment: Deployment,
    stopped: BTreeSet<usize>,
    resolved: Resolved,
    topics: Topics,
    /// Every action left but deletions, by key; the keys of those that can run now.
    pending: BTreeMap<Key, Pending>,
    ready: BTreeSet<Key>,
    /// Per target processor, the keys of its actions, and whether it starts warm.
    keys_of_wanted: Vec<Vec<Key>>,
    warm: Vec<bool>,
    /// Retiring lives by group: their step and key (their place in the data-flow order).
    retiring: BTreeMap<String, (String, Key)>,
    /// Target processors by step, and by a topic they read, write or create.
    wanted_of_step: BTreeMap<String, usize>,
    wanted_of_topic: BTreeMap<String, Vec<usize>>,
    /// A preview's shadow topics, with the sink that names each.
    shadows: Vec<(String, String)>,
}

impl<'t> Simulation<'t> {
    /// `None` when the lives are not in data-flow order (a record from before the engine kept
    /// them so): the plan is then worked out look by look.
    pub(super) fn new(deployment: &Deployment, topology: &'t Topology) -> Option<Self> {
        let topics = Topics::of(&deployment.lives);
        if !in_data_flow_order(&deployment.lives, &topics) {
            return None;
        }
        let resolved = resolve_with(deployment, Some(topology), &topics);
        let mut wanted_of_step = BTreeMap::new();
        let mut wanted_of_topic: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (w, wanted) in resolved.wanted.iter().enumerate() {
            wanted_of_step.insert(wanted.step.clone(), w);
            let topics = wanted
                .inputs
                .iter()
                .map(|(t, _)| t.clone())
                .chain(wanted.outputs.iter().cloned())
                .chain([wanted.group.clone(), topology.dlq_topic(wanted.id)]);
            for topic in topics {
                let of = wanted_of_topic.entry(topic).or_default();
                if of.last() != Some(&w) {
                    of.push(w);
                }
            }
        }
        let retiring = resolved
            .retiring
            .iter()
            .enumerate()
            .map(|(place, &r)| {
                let life = &deployment.lives[r];
                let at: Key = (5, place, 0);
                (life.group().to_owned(), (life.step().to_owned(), at))
            })
            .collect();
        let shadows = shadow_sinks(topology)
            .into_iter()
            .map(|(topic, step)| (topic.to_owned(), step.to_owned()))
            .collect();
        let wanted = resolved.wanted.len();
        let mut simulation = Simulation {
            topology,
            deployment: deployment.clone(),
            stopped: BTreeSet::new(),
            resolved,
            topics,
            pending: BTreeMap::new(),
            ready: BTreeSet::new(),
            keys_of_wanted: vec![Vec::new(); wanted],
            warm: vec![false; wanted],
            retiring,
            wanted_of_step,
            wanted_of_topic,
            shadows,
        };
        for w in 0..wanted {
            simulation.wanted_again(w);
        }
        for j in 0..simulation.shadows.len() {
            simulation.shadow_again(j);
        }
        let groups: Vec<String> = simulation.retiring.keys().cloned().collect();
        for group in &groups {
            simulation.retiring_again(group);
        }
        Some(simulation)
    }

    /// The actions up to the deletions, in order, at most `bound` of them; and the deployment
    /// they leave.
    pub(super) fn run(mut self, bound: usize) -> (Vec<Action>, Deployment) {
        let mut actions = Vec::new();
        while let Some(key) = self.ready.first().copied() {
            if actions.len() >= bound {
                break;
            }
            let Some(action) = self.pending.get(&key).map(|p| p.action.clone()) else {
                break;
            };
            self.apply(&action);
            actions.push(action);
        }
        let mut deployment = self.deployment;
        let mut index = 0;
        deployment.lives.retain(|_| {
            index += 1;
            !self.stopped.contains(&(index - 1))
        });
        (actions, deployment)
    }

    fn look(&self) -> Look<'_> {
        Look {
            deployment: &self.deployment,
            resolved: &self.resolved,
            topics: &self.topics,
        }
    }

    /// The index of retiring life `group` of `step`; `None` once it stopped.
    fn retiring_index(&self, step: &str, group: &str) -> Option<usize> {
        let lives = &self.deployment.lives;
        self.resolved
            .retiring_of(step)
            .iter()
            .copied()
            .find(|&r| lives[r].group() == group)
    }

    /// The index of the life that is `step`'s target processor, once started.
    fn kept_index(&self, step: &str) -> Option<usize> {
        let w = self.wanted_of_step.get(step)?;
        self.resolved.wanted[*w].kept
    }

    fn put(&mut self, key: Key, pending: Pending) {
        if pending.blocked_by.is_none() {
            self.ready.insert(key);
        }
        self.pending.insert(key, pending);
    }

    fn take(&mut self, key: &Key) {
        self.pending.remove(key);
        self.ready.remove(key);
    }

    /// Works out target processor `w`'s actions again; whether it now starts warm or no
    /// longer does (its step's retiring lives wait for that).
    fn wanted_again(&mut self, w: usize) -> bool {
        for key in std::mem::take(&mut self.keys_of_wanted[w]) {
            self.take(&key);
        }
        let mut out = Vec::new();
        let warm = wanted_actions(&self.look(), self.topology, w, &mut out);
        for (key, pending) in out {
            self.keys_of_wanted[w].push(key);
            self.put(key, pending);
        }
        std::mem::replace(&mut self.warm[w], warm) != warm
    }

    fn shadow_again(&mut self, j: usize) {
        let key: Key = (2, self.resolved.wanted.len() + j, 0);
        self.take(&key);
        let (topic, step) = &self.shadows[j];
        if let Some(create) = super::shadow_create(&self.deployment, self.topology, topic, step) {
            self.put(key, create);
        }
    }

    fn retiring_again(&mut self, group: &str) {
        let Some((step, key)) = self.retiring.get(group).cloned() else {
            return;
        };
        self.take(&key);
        let Some(r) = self.retiring_index(&step, group) else {
            // Stopped.
            self.retiring.remove(group);
            return;
        };
        let warm = self
            .wanted_of_step
            .get(&step)
            .is_some_and(|&w| self.warm[w]);
        let pending = retire_life(&self.look(), r, warm);
        self.put(key, pending);
    }

    fn retiring_of_step(&self, step: &str) -> Vec<String> {
        self.resolved
            .retiring_of(step)
            .iter()
            .map(|&r| self.deployment.lives[r].group().to_owned())
            .collect()
    }

    /// Applies `action` to the simulated deployment, and works out again the actions of
    /// every unit it may have changed.
    fn apply(&mut self, action: &Action) {
        let effect = super::simulated_effect(action);
        let mut wanted: BTreeSet<usize> = BTreeSet::new();
        let mut retiring: BTreeSet<String> = BTreeSet::new();
        let mut shadows: Vec<usize> = Vec::new();
        let of_step = |s: &Self, step: &str| s.wanted_of_step.get(step).copied();
        let ordered = self.topology.cutover == CutoverMode::Ordered;
        match action {
            Action::StopProcessor { step, group, .. } => {
                let at = self.retiring_index(step, group);
                self.deployment.apply_keeping_lives(action, effect, at);
                if let Some(at) = at {
                    self.stopped.insert(at);
                    let life = &self.deployment.lives[at];
                    self.topics.remove(at, life);
                    self.resolved.retiring.retain(|&r| r != at);
                    if let Some(lives) = self.resolved.retiring_of.get_mut(step) {
                        lives.retain(|&r| r != at);
                    }
                    // Its readers drain what it wrote.
                    for topic in &life.start.outputs {
                        for &reader in self.topics.readers(topic) {
                            retiring.insert(self.deployment.lives[reader].group().to_owned());
                        }
                    }
                }
                retiring.insert(group.clone());
                // Its step's next life takes over from it.
                retiring.extend(self.retiring_of_step(step));
                wanted.extend(of_step(self, step));
                if ordered {
                    wanted.extend(0..self.resolved.wanted.len());
                }
            }
            Action::StartProcessor(start) | Action::StartWarm(start) => {
                let w = of_step(self, &start.step);
                let kept = w.and_then(|w| self.resolved.wanted[w].kept);
                // A new life goes last.
                let hint = kept.unwrap_or(self.deployment.lives.len());
                self.deployment
                    .apply_keeping_lives(action, effect, Some(hint));
                let at = match kept {
                    Some(at) => at,
                    None => {
                        let at = self.deployment.lives.len() - 1;
                        self.topics.add(at, &self.deployment.lives[at]);
                        at
                    }
                };
                if let Some(w) = w {
                    self.resolved.wanted[w].kept = Some(at);
                    if !self.deployment.lives[at].held {
                        self.resolved.new_of.remove(&start.step);
                    }
                    wanted.insert(w);
                }
                retiring.extend(self.retiring_of_step(&start.step));
                if ordered {
                    wanted.extend(0..self.resolved.wanted.len());
                }
            }
            Action::HandOff { step, .. } => {
                let at = self.kept_index(step);
                self.deployment.apply_keeping_lives(action, effect, at);
                self.resolved.new_of.remove(step);
                wanted.extend(of_step(self, step));
                retiring.extend(self.retiring_of_step(step));
            }
            Action::DrainProcessor { step, group, .. } => {
                let at = self.retiring_index(step, group);
                self.deployment.apply_keeping_lives(action, effect, at);
                retiring.insert(group.clone());
            }
            Action::UpdateProcessor { step, .. } => {
                let at = self.kept_index(step);
                self.deployment.apply_keeping_lives(action, effect, at);
                wanted.extend(of_step(self, step));
            }
            Action::CreateTopic { topic, step, .. } => {
                self.deployment.apply_keeping_lives(action, effect, None);
                wanted.extend(of_step(self, step));
                wanted.extend(self.wanted_of_topic.get(topic).into_iter().flatten());
                shadows.extend(
                    self.shadows
                        .iter()
                        .enumerate()
                        .filter(|(_, (t, _))| t == topic)
                        .map(|(j, _)| j),
                );
                for &reader in self.topics.readers(topic) {
                    retiring.insert(self.deployment.lives[reader].group().to_owned());
                }
            }
            Action::DeleteTopic { .. } | Action::DeleteGroups { .. } => {
                // Deletions run last, after this simulation.
                self.deployment.apply_keeping_lives(action, effect, None);
            }
        }
        for w in wanted {
            if self.wanted_again(w) {
                let step = self.resolved.wanted[w].step.clone();
                retiring.extend(self.retiring_of_step(&step));
            }
        }
        for j in shadows {
            self.shadow_again(j);
        }
        for group in retiring {
            self.retiring_again(&group);
        }
    }
}
