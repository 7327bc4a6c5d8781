//! The cutover engine: moves one topology's deployment towards a target graph, action by
//! action, against a [`Runtime`] and Kafka ([`Admin`]), saving what the actions did through a
//! [`CutoverStore`]. It is the only writer of cutover state.
//!
//! # Expected flow
//!
//! The daemon calls [`Engine::advance`] with the target (the newest valid commit's graph of
//! the topology) until it answers [`Advance::Settled`]. Each call reads the topology's record,
//! asks the planner ([`moves::remaining`]) what is left between the deployment and the target,
//! runs every action that can run and does not wait, and saves their effects in one write
//! (two when it starts new lives: their offsets are saved before any of them runs). A newer
//! commit simply becomes the next call's target: the planner moves on from whatever the deployment
//! is, half-way through a move or not.
//!
//! # Guarantees
//!
//! - Every action is idempotent and its effect is saved only once it took effect, so redoing
//!   those a crash interrupted (run since the last save) is safe: topics are created or
//!   deleted if needed, stopping a stopped processor does nothing, starting a running one
//!   does nothing.
//! - A group's offsets are set only before its life first starts (the life is saved as
//!   prepared, not running, in between), so a resumed move never rewinds or skips a running
//!   processor. A warm life's are not set at all: it holds every partition until its own
//!   group has an offset there, which its instances commit from the hand-off group the
//!   engine writes once the predecessor stopped (redone after a crash with the same offsets,
//!   which an instance that took them already ignores).
//! - A stopped life's committed offsets are read only after all its instances exited or made
//!   their final commit (a runtime that can tell: the local one) and its group has no
//!   members, and saved in the same write that forgets the life: its step's next life starts
//!   exactly there, whichever commit that life belongs to.
//! - An action that cannot run yet (a drain not finished, a missing source topic, a failing
//!   call) never holds up the actions that do not depend on it.
//!
//! # Assumptions
//!
//! Only this engine starts processors of this topology's groups, and a stopped processor has
//! committed everything it produced (the processor's graceful stop guarantees it; a killed one
//! may have produced past its last commit, which at-least-once processing then duplicates and
//! exactly-once aborts).
//!
//! # Errors
//!
//! Kafka and runtime failures of an action are retried with backoff (the action waits, the
//! others go on) and reported in [`Advance::Waiting`]. Only failing to read or write the
//! store returns [`Error`]: nothing can safely happen without it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::kafka::{self, Admin};
use crate::plan::deployment::{TopicKind, handoff_group, life_name};
use crate::plan::{
    Action, Deployment, Effect, PartitionOffset, StartPosition, StartProcessor, moves, preview,
};
pub use crate::runtime::Target;
use crate::runtime::{self, ProcessorSpec, Runtime};
use crate::store::{self, CutoverStore, Handover, HistoryEntry, Move, Outcome, TopologyRecord};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{topology}: cannot read or save its cutover state: {source}")]
    Store {
        topology: String,
        #[source]
        source: store::Error,
    },
    #[error(
        "{topology} runs on {deployed}; moving it to {wanted} is not supported: remove the topology in one commit and add it back in the next"
    )]
    OtherCluster {
        topology: String,
        deployed: String,
        wanted: String,
    },
}

impl Error {
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Store { source, .. } => source.is_retryable(),
            Error::OtherCluster { .. } => false,
        }
    }
}

/// Settings of the engine.
#[derive(Debug, Clone)]
pub struct CutoverConfig {
    /// How often a drain checks the lag.
    pub poll: Duration,
    /// How often a start looks again for a source topic that does not exist yet.
    pub topic_poll: Duration,
    /// Keep retired internal topics instead of deleting them. For brokers whose topic
    /// deletion is unsafe: once any topic is deleted, the topics that existed beside it read
    /// as empty on tansu 0.6, even after more records are produced to them.
    pub keep_topics: bool,
    /// How long a stop waits for the group to have no members once its instances exited.
    pub group_empty_timeout: Duration,
    /// Retry delays of a failing action: the first, and the longest.
    pub retry: (Duration, Duration),
    /// At most this many actions per call of [`Engine::advance`], and none begins once the
    /// call has run `batch_for`: a newer commit is taken between calls, and a call stays
    /// well within the daemon's `--wedged-after` (a stop alone may wait tens of seconds).
    pub batch: usize,
    pub batch_for: Duration,
}

impl Default for CutoverConfig {
    fn default() -> Self {
        CutoverConfig {
            poll: Duration::from_millis(250),
            topic_poll: Duration::from_secs(2),
            keep_topics: false,
            // Longer than the processor's session timeout (10 s): a member that died without
            // leaving is gone by then.
            group_empty_timeout: Duration::from_secs(15),
            retry: (Duration::from_millis(500), Duration::from_secs(30)),
            // A first deploy of 20 steps is 45 actions.
            batch: 64,
            batch_for: Duration::from_secs(10),
        }
    }
}

/// What the engine reports as it goes, for status, logs and metrics.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// A move towards `to` begins (`superseded`: it takes over a move towards that commit).
    Started {
        from: Option<&'a str>,
        to: &'a str,
        superseded: Option<&'a str>,
    },
    /// `action` is about to run; `remaining` actions are left, this one included.
    Action {
        done: usize,
        remaining: usize,
        action: &'a Action,
    },
    /// These actions took effect and were saved (one call's batch); `done` and `left` count
    /// the move's actions after them.
    Progressed {
        actions: &'a [String],
        done: usize,
        left: usize,
    },
    /// What remains of the move, each action with what holds it up (at the start of every
    /// call that has something left, and at its end).
    Remaining {
        moving: &'a Move,
        actions: &'a [Outlook],
    },
    /// The deployment matches the target and runs the graph of `to`: the target's commit
    /// when this call finished a move (`moved`), else the commit that last changed the
    /// topology (`started_at`: when the move began, in seconds since the Unix epoch).
    Finished {
        to: &'a str,
        started_at: Option<u64>,
        moved: bool,
    },
}

fn lost_wait(group: &str, error: &runtime::Error) -> Wait {
    Wait {
        action: format!("start `{group}` again (gone from the runtime)"),
        reason: error.to_string(),
        failures: 1,
    }
}

/// What one call to [`Engine::advance`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Advance {
    /// The deployment matches the target (`moved`: this call finished a move).
    Settled { moved: bool },
    /// The topology is gone: nothing of it runs or exists any more (its record remains, so a
    /// topology of the same name that comes back never reuses the names of this one).
    Removed,
    /// At least one action took effect.
    Progressed,
    /// Every action left waits; look again at `until`.
    Waiting { until: Instant, waits: Vec<Wait> },
}

/// An action that cannot run now, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Wait {
    pub action: String,
    pub reason: String,
    /// Failed attempts so far (0: it waits for something, e.g. a drain or another action).
    pub failures: u32,
}

/// One action that remains, as status shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outlook {
    pub action: String,
    /// It was tried and waits, or failed and is retried: why.
    pub waiting: Option<String>,
    pub failures: u32,
    /// It cannot run before another action: which.
    pub blocked_by: Option<String>,
}

/// What the engine remembers between calls: actions that wait, and until when.
#[derive(Debug, Default)]
pub struct Waits {
    entries: BTreeMap<String, WaitEntry>,
}

#[derive(Debug, Clone)]
struct WaitEntry {
    until: Instant,
    reason: String,
    failures: u32,
}

impl Waits {
    fn blocks(&self, key: &str, now: Instant) -> bool {
        self.entries.get(key).is_some_and(|w| w.until > now)
    }
}

/// Why an action did not take effect.
enum NotYet {
    /// It waits for something outside the engine (a drain, a topic); look again after the
    /// delay.
    Waiting(String, Duration),
    /// A call failed.
    Failed(String),
}

/// What one call to [`Engine::advance`] did so far: the actions it announced, finished, and
/// tried without effect (not tried again in the same call), and the move's count of done and
/// left actions as they stand.
struct Batch {
    done: usize,
    left: usize,
    announced: Vec<String>,
    finished: Vec<String>,
    failed: Vec<String>,
    /// Effects not saved yet.
    unsaved: bool,
}

/// Everything a move of one topology needs.
pub struct Engine<'a> {
    pub topology: &'a str,
    pub admin: &'a dyn Admin,
    pub runtime: &'a dyn Runtime,
    pub store: &'a dyn CutoverStore,
    pub config: &'a CutoverConfig,
    pub on_event: &'a (dyn Fn(Event<'_>) + Sync),
}

impl Engine<'_> {
    fn store_error(&self, source: store::Error) -> Error {
        Error::Store {
            topology: self.topology.to_owned(),
            source,
        }
    }

    fn save(&self, record: &TopologyRecord) -> Result<(), Error> {
        self.store
            .save(self.topology, record)
            .map_err(|e| self.store_error(e))
    }

    /// Runs every action towards `target` that can run now (the planner's unblocked ones, which
    /// do not depend on each other), or settles when none is left.
    pub fn advance(&self, target: &Target<'_>, waits: &mut Waits) -> Result<Advance, Error> {
        let mut record = self
            .store
            .load(self.topology)
            .map_err(|e| self.store_error(e))?;
        if let Some(entry) = record.unrecorded.take() {
            self.store
                .append_history(&entry)
                .map_err(|e| self.store_error(e))?;
            self.save(&record)?;
        }
        if let (Some(deployed), Some(wanted)) = (
            &record.bootstrap,
            target.cluster.map(|c| c.bootstrap.as_str()),
        ) && deployed != wanted
            && !record.deployment.is_empty()
        {
            return Err(Error::OtherCluster {
                topology: self.topology.to_owned(),
                deployed: deployed.clone(),
                wanted: wanted.to_owned(),
            });
        }
        let mut remaining = moves::remaining(self.topology, &record.deployment, target.topology);
        if remaining.is_empty() {
            return self.settle(record, target);
        }
        self.begin_move(&mut record, target)?;

        let now = Instant::now();
        waits
            .entries
            .retain(|key, _| remaining.iter().any(|p| describe(&p.action) == *key));
        self.show_remaining(&record, &remaining, waits);
        let before = record.clone();
        let mut batch = Batch {
            done: record.moving.as_ref().map_or(0, |m| m.done),
            left: remaining.len(),
            announced: Vec::new(),
            finished: Vec::new(),
            failed: Vec::new(),
            unsaved: false,
        };
        // The actions run in the planner's order, as one per call would run them, and their
        // effects are saved together at the end: each is idempotent, so a crash before the
        // save redoes them. The one write that must come before an action is a new life's
        // offsets, durable before its processor runs: those of every new life that can start
        // now are set and saved together before the first of them starts.
        while let Some((action, key)) = remaining
            .iter()
            .filter(|p| p.blocked_by.is_none())
            .map(|p| (&p.action, describe(&p.action)))
            .find(|(_, key)| !waits.blocks(key, now) && !batch.failed.contains(key))
        {
            // (Planned again after it took effect: the next call looks again.)
            if batch.finished.contains(&key)
                || batch.finished.len() >= self.config.batch
                || (!batch.finished.is_empty() && now.elapsed() >= self.config.batch_for)
            {
                break;
            }
            // Redoing an action after a deletion that followed it may find what it needs
            // gone (a drain, the topic it looks at): a deletion runs with every effect before
            // it saved, so a crash redoes deletions and what follows them only.
            if batch.unsaved
                && matches!(
                    action,
                    Action::DeleteTopic { .. } | Action::DeleteGroups { .. }
                )
            {
                self.save(&record)?;
                batch.unsaved = false;
            }
            if let Action::StartProcessor(start) = action
                && record.deployment.life(&start.group).is_none()
            {
                self.prepare_starts(&remaining, &mut record, waits, &mut batch, now)?;
                if batch.failed.contains(&key) {
                    continue;
                }
            }
            self.announce(action, &key, waits, &mut batch)?;
            match self.execute(action, &mut record, target) {
                Ok(()) => {
                    waits.entries.remove(&key);
                    if let Some(m) = &mut record.moving {
                        m.done += 1;
                    }
                    batch.done += 1;
                    batch.finished.push(key);
                    batch.unsaved = true;
                    remaining =
                        moves::remaining(self.topology, &record.deployment, target.topology);
                    batch.left = remaining.len();
                }
                Err(not_yet) => {
                    self.wait(&key, not_yet, waits, now);
                    batch.failed.push(key);
                }
            }
        }
        if batch.unsaved {
            self.save(&record)?;
        }
        if record != before {
            if !batch.finished.is_empty() {
                (self.on_event)(Event::Progressed {
                    actions: &batch.finished,
                    done: batch.done,
                    left: batch.left,
                });
            }
            self.show_remaining(&record, &remaining, waits);
            return Ok(Advance::Progressed);
        }
        self.show_remaining(&record, &remaining, waits);
        let mut reported: Vec<Wait> = waits
            .entries
            .iter()
            .map(|(action, w)| Wait {
                action: action.clone(),
                reason: w.reason.clone(),
                failures: w.failures,
            })
            .collect();
        for pending in &remaining {
            if let Some(reason) = &pending.blocked_by {
                reported.push(Wait {
                    action: describe(&pending.action),
                    reason: format!("waits for {reason}"),
                    failures: 0,
                });
            }
        }
        let until = waits
            .entries
            .values()
            .map(|w| w.until)
            .min()
            .unwrap_or(now + self.config.poll);
        Ok(Advance::Waiting {
            until,
            waits: reported,
        })
    }

    /// Tells what remains of the move.
    fn show_remaining(&self, record: &TopologyRecord, remaining: &[moves::Pending], waits: &Waits) {
        let Some(moving) = &record.moving else {
            return;
        };
        let actions: Vec<Outlook> = remaining
            .iter()
            .map(|pending| {
                let action = describe(&pending.action);
                let wait = waits.entries.get(&action);
                Outlook {
                    waiting: wait.map(|w| w.reason.clone()),
                    failures: wait.map_or(0, |w| w.failures),
                    blocked_by: pending.blocked_by.clone(),
                    action,
                }
            })
            .collect();
        (self.on_event)(Event::Remaining {
            moving,
            actions: &actions,
        });
    }

    /// Starts recording a move towards the target, superseding one towards another commit.
    fn begin_move(&self, record: &mut TopologyRecord, target: &Target<'_>) -> Result<(), Error> {
        if record
            .moving
            .as_ref()
            .is_some_and(|m| m.to == target.commit)
        {
            return Ok(());
        }
        let superseded = record.moving.take();
        if let Some(old) = &superseded {
            tracing::info!(topology = self.topology, from = ?old.from, to = %old.to, by = target.commit, "a newer commit takes over the move");
            self.store
                .append_history(&HistoryEntry {
                    topology: self.topology.to_owned(),
                    from: old.from.clone(),
                    to: old.to.clone(),
                    outcome: Outcome::Superseded,
                    started_at: old.started_at,
                    finished_at: now(),
                    actions: old.done,
                    handovers: old.handovers.clone(),
                })
                .map_err(|e| self.store_error(e))?;
        }
        (self.on_event)(Event::Started {
            from: record.commit.as_deref(),
            to: target.commit,
            superseded: superseded.as_ref().map(|m| m.to.as_str()),
        });
        record.moving = Some(Move {
            from: record.commit.clone(),
            to: target.commit.to_owned(),
            started_at: now(),
            done: 0,
            handovers: Vec::new(),
        });
        if record.bootstrap.is_none() {
            record.bootstrap = target.cluster.map(|c| c.bootstrap.clone());
        }
        self.save(record)
    }

    /// Nothing is left: the deployment matches the target.
    fn settle(&self, mut record: TopologyRecord, target: &Target<'_>) -> Result<Advance, Error> {
        // A commit that leaves the topology's graph as it runs is no move: the record keeps
        // the commit the graph came from, and nothing is written (a commit touching one of
        // 1,000 topologies writes one record, not 1,000).
        let moved = record.moving.is_some() || record.commit.is_none();
        let started_at = record.moving.as_ref().map(|m| m.started_at);
        if moved {
            record.deployment.settle();
            record.commit = Some(target.commit.to_owned());
            if target.cluster.is_some() {
                record.bootstrap = target.cluster.map(|c| c.bootstrap.clone());
            }
            let entry = record.moving.take().map(|m| finished(self.topology, m));
            // Saved with the entry first: a crash before the history line is written leaves
            // it to the next start, a crash after it cannot write it twice.
            record.unrecorded = entry.clone();
            self.save(&record)?;
            if let Some(entry) = entry {
                self.store
                    .append_history(&entry)
                    .map_err(|e| self.store_error(e))?;
                record.unrecorded = None;
                self.save(&record)?;
            }
        }
        if !moved && let Some(wait) = self.start_lost(&record, target) {
            return Ok(Advance::Waiting {
                until: Instant::now() + self.config.retry.1,
                waits: vec![wait],
            });
        }
        (self.on_event)(Event::Finished {
            to: record.commit.as_deref().unwrap_or(target.commit),
            started_at,
            moved,
        });
        if target.topology.is_none() {
            // The record stays, without lives: should the topology come back, its
            // identities get new lives, never the names of the ones that ran here.
            return Ok(Advance::Removed);
        }
        Ok(Advance::Settled { moved })
    }

    /// Starts again every running life of the target that the runtime does not run: its
    /// objects or records were deleted while no daemon looked (what a daemon that looks
    /// puts back itself). The group resumes at its committed offsets. What cannot start is
    /// a wait, retried.
    fn start_lost(&self, record: &TopologyRecord, target: &Target<'_>) -> Option<Wait> {
        let cluster = target.cluster?;
        for life in record.deployment.lives.iter().filter(|l| l.running) {
            let lost = match self.runtime.runs(life.group()) {
                Ok(runs) => !runs,
                Err(error) => return Some(lost_wait(life.group(), &error)),
            };
            if !lost {
                continue;
            }
            tracing::warn!(
                topology = self.topology,
                group = life.group(),
                "a running processor is gone from the runtime; starting it again"
            );
            let spec = ProcessorSpec::starting(self.topology, &life.start, cluster, target);
            if let Err(error) = self.runtime.start(&spec) {
                return Some(lost_wait(life.group(), &error));
            }
        }
        None
    }

    fn execute(
        &self,
        action: &Action,
        record: &mut TopologyRecord,
        target: &Target<'_>,
    ) -> Result<(), NotYet> {
        let failed = |e: &dyn std::fmt::Display| NotYet::Failed(e.to_string());
        let effect = match action {
            Action::CreateTopic {
                topic,
                partitions,
                replication,
                config,
                kind,
                like,
                ..
            } => {
                // A shadow topic has as many partitions as the users' topic it stands in
                // for, a changelog as its input (read now: the plan is made without Kafka).
                let like = match (kind, like) {
                    (_, Some(like)) => Some(like.as_str()),
                    (TopicKind::Shadow, None) => preview::shadow_of(self.topology, topic),
                    _ => None,
                };
                let partitions = match like {
                    Some(like) => {
                        let count = self.admin.partitions(like).map_err(|e| failed(&e))?;
                        u32::try_from(count.max(1)).unwrap_or(1)
                    }
                    None => *partitions,
                };
                self.admin
                    .create_topic(topic, partitions, *replication, config)
                    .map_err(|e| failed(&e))?;
                Effect::Done
            }
            Action::DeleteGroups { base, lives } => {
                for life in 1..=*lives {
                    let group = life_name(base, life);
                    match self.admin.delete_group(&group) {
                        Ok(()) => {}
                        // The broker refuses for good (authorization, an old broker): the
                        // group's offsets expire by its offsets.retention.minutes instead. A
                        // life started later under this name has its offsets set first.
                        Err(kafka::Error::DeleteGroup {
                            retryable: false,
                            message,
                            ..
                        }) => tracing::warn!(
                            topology = self.topology,
                            group,
                            error = %message,
                            "cannot delete the group; leaving it to expire"
                        ),
                        Err(error) => return Err(failed(&error)),
                    }
                }
                Effect::Done
            }
            Action::DeleteTopic { topic } => {
                if self.config.keep_topics {
                    tracing::info!(
                        topology = self.topology,
                        topic,
                        "retired topic kept (--keep-topics)"
                    );
                } else {
                    self.admin.delete_topic(topic).map_err(|e| failed(&e))?;
                }
                Effect::Done
            }
            Action::UpdateProcessor {
                group,
                scale,
                resources,
                ..
            } => {
                self.runtime
                    .update(group, scale, resources.as_ref())
                    .map_err(|e| failed(&e))?;
                Effect::Done
            }
            Action::DrainProcessor { group, topics, .. } => {
                // A warm life reads nothing until its hand-off group names its start. A
                // retiring one is handed nothing more: with no hand-off written it never
                // reads, and has nothing to drain (its group would show the whole topic as
                // lag for good). With one written (a crash after the hand-off's commit and
                // before its record) it reads, or will, and drains like any other.
                let never_reads = record.deployment.life(group).is_some_and(|l| l.held)
                    && self
                        .admin
                        .committed(&handoff_group(group), topics)
                        .map_err(|e| failed(&e))?
                        .is_empty();
                if !never_reads {
                    self.drained(group, topics)?;
                }
                Effect::Done
            }
            Action::StopProcessor {
                group, successor, ..
            } => {
                // A predecessor stops only once its warm successor holds every partition:
                // one that never gets there (a crash loop, a refused start) leaves the old
                // life running, and the wait says why.
                if let Some(successor) = successor
                    .as_deref()
                    .and_then(|s| record.deployment.life(s))
                    .filter(|l| l.held)
                {
                    let inputs: Vec<String> = successor.inputs().map(str::to_owned).collect();
                    self.warm(successor.group(), &inputs)?;
                }
                Effect::Stopped(self.stop(group, &record.deployment)?)
            }
            Action::StartWarm(start) => {
                let Some(cluster) = target.cluster else {
                    return Err(NotYet::Failed("no cluster to start it on".into()));
                };
                if record.deployment.life(&start.group).is_none() {
                    // Recorded before it runs, so that a newer commit that does not want it
                    // finds it to stop.
                    self.topics_exist(start.inputs.iter().map(|i| &i.topic))?;
                    self.topics_exist(start.outputs.iter().chain([&start.dlq]))?;
                    record.deployment.apply(action, Effect::Prepared);
                    self.save(record).map_err(|e| failed(&e))?;
                }
                let spec = ProcessorSpec::starting(self.topology, start, cluster, target).warm();
                self.runtime.start(&spec).map_err(|e| failed(&e))?;
                Effect::Done
            }
            Action::HandOff { group, .. } => {
                let Some(life) = record.deployment.life(group).filter(|l| l.held) else {
                    return Ok(());
                };
                let start = life.start.clone();
                let offsets = self.start_offsets(&start, &record.deployment)?;
                self.hand_off(group, &offsets)?;
                let taken = handovers(&start, &record.deployment, &offsets);
                if let Some(m) = &mut record.moving {
                    m.handovers.extend(taken);
                }
                Effect::Done
            }
            Action::StartProcessor(start) => {
                let Some(cluster) = target.cluster else {
                    return Err(NotYet::Failed("no cluster to start it on".into()));
                };
                if record.deployment.life(&start.group).is_none() {
                    self.prepare(action, start, record)?;
                    self.save(record).map_err(|e| failed(&e))?;
                }
                let spec = ProcessorSpec::starting(self.topology, start, cluster, target);
                self.runtime.start(&spec).map_err(|e| failed(&e))?;
                Effect::Done
            }
        };
        record.deployment.apply(action, effect);
        Ok(())
    }

    /// Prepares every new life that can start now (not waiting), and saves them in one write
    /// before any of them runs.
    fn prepare_starts(
        &self,
        remaining: &[moves::Pending],
        record: &mut TopologyRecord,
        waits: &mut Waits,
        batch: &mut Batch,
        now: Instant,
    ) -> Result<(), Error> {
        let unprepared = remaining.iter().filter_map(|p| match &p.action {
            Action::StartProcessor(start) if p.blocked_by.is_none() => Some((&p.action, start)),
            _ => None,
        });
        let before = record.deployment.lives.len();
        for (action, start) in unprepared {
            let key = describe(action);
            if waits.blocks(&key, now)
                || batch.failed.contains(&key)
                || record.deployment.life(&start.group).is_some()
            {
                continue;
            }
            self.announce(action, &key, waits, batch)?;
            if let Err(not_yet) = self.prepare(action, start, record) {
                self.wait(&key, not_yet, waits, now);
                batch.failed.push(key);
            }
        }
        if record.deployment.lives.len() != before {
            self.save(record)?;
            batch.unsaved = false;
        }
        Ok(())
    }

    /// Sets a new life's offsets, once and for all, and records it as prepared (not running):
    /// the record must be saved before its processor starts.
    fn prepare(
        &self,
        action: &Action,
        start: &StartProcessor,
        record: &mut TopologyRecord,
    ) -> Result<(), NotYet> {
        let offsets = self.start_offsets(start, &record.deployment)?;
        self.admin
            .commit(&start.group, &offsets)
            .map_err(|e| NotYet::Failed(e.to_string()))?;
        let taken = handovers(start, &record.deployment, &offsets);
        if let Some(m) = &mut record.moving {
            m.handovers.extend(taken);
        }
        record.deployment.apply(action, Effect::Prepared);
        Ok(())
    }

    /// Tells once that an action is about to run, and checks, before each of its writes,
    /// that this replica still holds the lease: one that lost it stops before the next one.
    fn announce(
        &self,
        action: &Action,
        key: &str,
        waits: &Waits,
        batch: &mut Batch,
    ) -> Result<(), Error> {
        // Once per action, not per look at a drain or a missing topic.
        if !waits.entries.contains_key(key) && !batch.announced.iter().any(|k| k == key) {
            (self.on_event)(Event::Action {
                done: batch.done,
                remaining: batch.left,
                action,
            });
            tracing::info!(topology = self.topology, action = %key, "cutover action");
            batch.announced.push(key.to_owned());
        }
        if !self.store.may_act() {
            return Err(self.store_error(store::Error::NotLeader {
                topology: self.topology.to_owned(),
            }));
        }
        Ok(())
    }

    /// Remembers why an action did not take effect, and when to try it again: a failed call
    /// backs off exponentially.
    fn wait(&self, key: &str, not_yet: NotYet, waits: &mut Waits, now: Instant) {
        let entry = match not_yet {
            NotYet::Waiting(reason, retry_in) => {
                tracing::debug!(topology = self.topology, action = %key, %reason, "waiting");
                WaitEntry {
                    until: now + retry_in,
                    reason,
                    failures: 0,
                }
            }
            NotYet::Failed(reason) => {
                let failures = waits.entries.get(key).map_or(0, |w| w.failures) + 1;
                let (first, longest) = self.config.retry;
                let delay = first
                    .saturating_mul(1 << (failures - 1).min(16))
                    .min(longest);
                tracing::warn!(topology = self.topology, action = %key, error = %reason, failures, retry_in = ?delay, "cutover action failed; the others go on");
                WaitEntry {
                    until: now + delay,
                    reason,
                    failures,
                }
            }
        };
        waits.entries.insert(key.to_owned(), entry);
    }

    /// Stops the life gracefully, waits until its group is empty, and reads where it stood.
    fn stop(&self, group: &str, deployment: &Deployment) -> Result<Vec<PartitionOffset>, NotYet> {
        self.runtime
            .stop(group)
            .map_err(|e: runtime::Error| NotYet::Failed(e.to_string()))?;
        let deadline = Instant::now() + self.config.group_empty_timeout;
        // Instances that made their final commit may still be leaving (a replaced step's
        // output waits on this): asked again soon at first.
        let mut pause = Duration::from_millis(10);
        loop {
            match self.admin.members(group) {
                Ok(None | Some(0)) => break,
                Ok(Some(members)) if Instant::now() >= deadline => {
                    return Err(NotYet::Failed(format!(
                        "its instances stopped, but group {group} still has {members} members"
                    )));
                }
                Ok(Some(_)) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(self.config.poll);
                }
                Err(error) => {
                    tracing::debug!(%error, group, "cannot describe the group; its instances exited");
                    break;
                }
            }
        }
        let inputs: Vec<String> = deployment
            .life(group)
            .map(|l| l.inputs().map(str::to_owned).collect())
            .unwrap_or_default();
        let offsets = self
            .admin
            .committed(group, &inputs)
            .map_err(|e| NotYet::Failed(e.to_string()))?;
        tracing::info!(topology = self.topology, group, offsets = ?offsets, "stopped; cutover offsets recorded");
        Ok(offsets)
    }

    /// Whether every input partition of the warm life of `group` has an owner ready to read
    /// it: held for the hand-off, or started already (a crash after the hand-off redoes the
    /// stop before it). Looked at again after [`CutoverConfig::poll`] while not. A runtime
    /// that cannot tell lets the stop go on: the successor still takes over exactly, later.
    fn warm(&self, group: &str, inputs: &[String]) -> Result<(), NotYet> {
        let failed = |e: &dyn std::fmt::Display| NotYet::Failed(e.to_string());
        let held = match self.runtime.held(group).map_err(|e| failed(&e))? {
            Some(held) => held,
            None => return Ok(()),
        };
        let mut partitions = 0;
        for topic in inputs {
            partitions +=
                u64::try_from(self.admin.partitions(topic).map_err(|e| failed(&e))?).unwrap_or(0);
        }
        let started = self
            .admin
            .committed(group, inputs)
            .map_err(|e| failed(&e))?
            .len() as u64;
        if held + started >= partitions {
            // The hand-off group is read once before the predecessor stops: its client is
            // then ready (coordinator found, connected), and the hand-off the successor's
            // output waits for is one request.
            self.admin
                .committed(&handoff_group(group), inputs)
                .map_err(|e| failed(&e))?;
            return Ok(());
        }
        Err(NotYet::Waiting(
            format!(
                "{group} to start warm: its instances hold {held} of its {partitions} input partitions"
            ),
            self.config.poll,
        ))
    }

    /// Hands a warm life its start through its hand-off group, and waits until its group
    /// has committed one on every input partition: its instances commit the hand-off before
    /// they read, so from then on the group's offsets say where it is, whoever owns each
    /// partition next. Redone after a crash, it commits the same start again, which an
    /// instance that has one already ignores.
    fn hand_off(&self, group: &str, offsets: &[PartitionOffset]) -> Result<(), NotYet> {
        let failed = |e: &dyn std::fmt::Display| NotYet::Failed(e.to_string());
        self.admin
            .commit(&handoff_group(group), offsets)
            .map_err(|e| failed(&e))?;
        let mut topics: Vec<String> = offsets.iter().map(|p| p.topic.clone()).collect();
        topics.dedup();
        let committed = self
            .admin
            .committed(group, &topics)
            .map_err(|e| failed(&e))?;
        let waiting = offsets
            .iter()
            .filter(|p| {
                !committed
                    .iter()
                    .any(|c| c.topic == p.topic && c.partition == p.partition)
            })
            .count();
        if waiting == 0 {
            tracing::info!(topology = self.topology, group, offsets = ?offsets, "handed off: the warm life reads");
            return Ok(());
        }
        Err(NotYet::Waiting(
            format!(
                "{group} to take its hand-off: {waiting} of its {} input partitions not started yet",
                offsets.len()
            ),
            self.config.poll,
        ))
    }

    /// Waits until every one of `topics` exists: the processor refuses to start without one.
    fn topics_exist<'t>(&self, topics: impl Iterator<Item = &'t String>) -> Result<(), NotYet> {
        for topic in topics {
            match self.admin.partitions(topic) {
                Ok(_) => {}
                Err(kafka::Error::NoSuchTopic { topic }) => {
                    return Err(NotYet::Waiting(
                        format!("topic {topic} does not exist yet; the step starts once it does"),
                        self.config.topic_poll,
                    ));
                }
                Err(e) => return Err(NotYet::Failed(e.to_string())),
            }
        }
        Ok(())
    }

    /// Waits (without blocking the engine) until `group` consumed everything on `topics`.
    fn drained(&self, group: &str, topics: &[String]) -> Result<(), NotYet> {
        let failed = |e: kafka::Error| NotYet::Failed(e.to_string());
        let lag = self.admin.lag(group, topics).map_err(failed)?;
        // Behind transactional writers the lag includes transaction markers: look closer.
        if lag == 0 || self.admin.drained(group, topics).map_err(failed)? {
            return Ok(());
        }
        Err(NotYet::Waiting(
            format!("{group} has {lag} records left on {}", topics.join(", ")),
            self.config.poll,
        ))
    }

    /// Where the group starts on each input partition: always explicit.
    fn start_offsets(
        &self,
        start: &StartProcessor,
        deployment: &Deployment,
    ) -> Result<Vec<PartitionOffset>, NotYet> {
        // The processor refuses to start without every topic it writes (it never creates
        // one) or reads as a join's table: a sink the data engineers have not made yet is
        // waited for, like a source.
        self.topics_exist(start.outputs.iter().chain([&start.dlq]).chain(&start.table))?;
        let mut offsets = Vec::new();
        for input in &start.inputs {
            let marks = match self.admin.watermarks(&input.topic) {
                Ok(marks) => marks,
                Err(kafka::Error::NoSuchTopic { topic }) => {
                    return Err(NotYet::Waiting(
                        format!("topic {topic} does not exist yet; the step starts once it does"),
                        self.config.topic_poll,
                    ));
                }
                Err(e) => return Err(NotYet::Failed(e.to_string())),
            };
            let recorded = deployment
                .positions
                .get(&start.step)
                .and_then(|p| p.get(&input.topic));
            for (partition, (low, high)) in marks.into_iter().enumerate() {
                let partition = partition as i32;
                let offset = match input.from {
                    StartPosition::Earliest => low,
                    StartPosition::Latest => high,
                    StartPosition::Cutover => recorded
                        .and_then(|r| r.offsets.iter().find(|p| p.partition == partition))
                        .map(|p| p.offset.max(low))
                        // The previous life never committed here, so it consumed nothing
                        // here: the partition's beginning is where it stood.
                        .unwrap_or(low),
                };
                offsets.push(PartitionOffset {
                    topic: input.topic.clone(),
                    partition,
                    offset,
                });
            }
        }
        Ok(offsets)
    }
}

/// The history entry of a move that ended with the deployment matching its target.
fn finished(topology: &str, m: Move) -> HistoryEntry {
    HistoryEntry {
        topology: topology.to_owned(),
        from: m.from,
        to: m.to,
        outcome: Outcome::Applied,
        started_at: m.started_at,
        finished_at: now(),
        actions: m.done,
        handovers: m.handovers,
    }
}

/// The cutover offsets a starting life takes over, per previous life, for the history.
fn handovers(
    start: &StartProcessor,
    deployment: &Deployment,
    offsets: &[PartitionOffset],
) -> Vec<Handover> {
    let mut by_group: BTreeMap<String, Vec<PartitionOffset>> = BTreeMap::new();
    for input in start
        .inputs
        .iter()
        .filter(|i| i.from == StartPosition::Cutover)
    {
        let Some(recorded) = deployment
            .positions
            .get(&start.step)
            .and_then(|p| p.get(&input.topic))
        else {
            continue;
        };
        by_group
            .entry(recorded.group.clone())
            .or_default()
            .extend(offsets.iter().filter(|p| p.topic == input.topic).cloned());
    }
    by_group
        .into_iter()
        .map(|(from_group, offsets)| Handover {
            step: start.step.clone(),
            from_group,
            to_group: start.group.clone(),
            offsets,
        })
        .collect()
}

/// A one-line description of an action for logs, status and errors.
pub fn describe(action: &Action) -> String {
    match action {
        Action::CreateTopic {
            topic,
            kind: TopicKind::Shadow,
            ..
        } => format!("create-topic {topic} (shadow: the partitions of the users' topic)"),
        Action::CreateTopic {
            topic,
            like: Some(like),
            ..
        } => format!("create-topic {topic} (the partitions of {like})"),
        Action::CreateTopic {
            topic, partitions, ..
        } => {
            format!("create-topic {topic} ({partitions} partitions)")
        }
        Action::StartProcessor(start) => {
            format!("start-processor {} as {}", start.step, start.group)
        }
        Action::UpdateProcessor { group, scale, .. } => {
            format!("update-processor {group} to {}", scale.min)
        }
        Action::DrainProcessor { group, topics, .. } => {
            format!("drain-processor {group} on {}", topics.join(","))
        }
        Action::StartWarm(start) => {
            format!("start-warm {} as {}", start.step, start.group)
        }
        Action::HandOff { group, .. } => format!("hand-off {group}"),
        Action::StopProcessor { group, .. } => format!("stop-processor {group}"),
        Action::DeleteTopic { topic } => format!("delete-topic {topic}"),
        Action::DeleteGroups { base, lives } => {
            let lives = if *lives == 1 {
                "1 life".to_owned()
            } else {
                format!("{lives} lives")
            };
            format!("delete-groups {base} ({lives})")
        }
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
