//! The cutover engine: runs one topology's plan actions against a [`Runtime`] and Kafka
//! ([`Admin`]), persisting progress after every step so a daemon killed at any point resumes
//! exactly where it was.
//!
//! # Expected flow
//!
//! [`Engine::run`] takes a [`CutoverProgress`] (fresh from a plan, or read back from the state
//! directory after a restart) and executes `actions[done..]` in order. After each action it
//! persists `done + 1`; `start-processor` persists once more in between, after setting the
//! group's offsets (`prepared`). When all are done it records the commit as applied and appends
//! the cutover to the history.
//!
//! # Guarantees
//!
//! - Every action is idempotent, so redoing the one a crash interrupted is safe: topics are
//!   created or deleted if needed, stopping a stopped processor does nothing, starting a
//!   running one does nothing.
//! - A group's offsets are set only before its processor first starts (`prepared` is durable),
//!   so a resumed cutover never rewinds or skips a running processor.
//! - Cutover offsets are read only after the predecessor has stopped (the plan orders
//!   `stop-processor` before `hand-over-offsets`), and recorded durably before the successor
//!   gets them: a crash in between hands over the same offsets.
//!
//! # Assumptions
//!
//! Only this engine starts processors of this topology's groups, and a stopped processor has
//! committed everything it produced (the processor's graceful stop guarantees it; a killed one
//! may have produced past its last commit, which at-least-once processing then duplicates).
//!
//! # Errors
//!
//! An action that fails returns [`Error`] with the action's index; progress up to it is kept,
//! and the daemon retries the same cutover with backoff. Kafka and runtime errors are
//! retryable; none of them loses records.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::kafka::{self, Admin};
use crate::plan::{Action, StartPosition, StartProcessor};
use crate::runtime::{self, ProcessorSpec, Runtime};
use crate::state::{self, CutoverProgress, Handover, HistoryEntry, PartitionOffset, StateDir};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{topology}: action {index} ({action}) failed: {source}")]
    Kafka {
        topology: String,
        index: usize,
        action: String,
        #[source]
        source: Box<kafka::Error>,
    },
    #[error("{topology}: action {index} ({action}) failed: {source}")]
    Runtime {
        topology: String,
        index: usize,
        action: String,
        #[source]
        source: runtime::Error,
    },
    #[error("{topology}: cannot persist cutover progress: {source}")]
    State {
        topology: String,
        #[source]
        source: state::Error,
    },
    #[error("{topology}: the daemon is stopping; the cutover resumes on the next start")]
    Interrupted { topology: String },
}

/// Settings of the engine.
#[derive(Debug, Clone)]
pub struct CutoverConfig {
    /// How often a drain checks the lag.
    pub poll: Duration,
    /// Keep retired internal topics instead of deleting them. For brokers whose topic
    /// deletion is unsafe: once any topic is deleted, the topics that existed beside it read
    /// as empty on tansu 0.6, even after more records are produced to them.
    pub keep_topics: bool,
}

impl Default for CutoverConfig {
    fn default() -> Self {
        CutoverConfig {
            poll: Duration::from_millis(250),
            keep_topics: false,
        }
    }
}

/// What the engine reports as it goes, for status and metrics.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    Started {
        from: Option<&'a str>,
        to: &'a str,
        actions: usize,
    },
    Action {
        index: usize,
        action: &'a Action,
    },
    Draining {
        group: &'a str,
        lag: i64,
    },
    Finished {
        to: &'a str,
    },
}

/// Everything a cutover of one topology needs.
pub struct Engine<'a> {
    pub topology: &'a str,
    pub bootstrap: &'a str,
    pub admin: &'a dyn Admin,
    pub runtime: &'a dyn Runtime,
    pub state: &'a StateDir,
    pub config: &'a CutoverConfig,
    /// The directory of each new step's file in a checkout of the target commit.
    pub workdirs: &'a BTreeMap<String, PathBuf>,
    pub on_event: &'a (dyn Fn(Event<'_>) + Sync),
    /// Checked between actions and during drains.
    pub stopping: &'a (dyn Fn() -> bool + Sync),
}

impl Engine<'_> {
    /// Runs the cutover to its end, persisting progress; then records the commit as applied.
    pub fn run(&self, mut progress: CutoverProgress) -> Result<(), Error> {
        (self.on_event)(Event::Started {
            from: progress.from.as_deref(),
            to: &progress.to,
            actions: progress.actions.len(),
        });
        self.persist(Some(&progress), None)?;
        while progress.done < progress.actions.len() {
            if (self.stopping)() {
                return Err(Error::Interrupted {
                    topology: self.topology.to_owned(),
                });
            }
            let index = progress.done;
            let action = progress.actions[index].clone();
            (self.on_event)(Event::Action {
                index,
                action: &action,
            });
            tracing::info!(topology = self.topology, index, action = %describe(&action), "cutover action");
            self.execute(index, &action, &mut progress)?;
            progress.done += 1;
            progress.prepared = false;
            self.persist(Some(&progress), None)?;
        }
        let entry = HistoryEntry {
            topology: self.topology.to_owned(),
            from: progress.from.clone(),
            to: progress.to.clone(),
            started_at: progress.started_at,
            finished_at: now(),
            actions: progress.actions.len(),
            handovers: progress.handovers.clone(),
        };
        if !progress.actions.is_empty() {
            self.state
                .append_history(&entry)
                .map_err(|source| Error::State {
                    topology: self.topology.to_owned(),
                    source,
                })?;
        }
        self.persist(None, Some(&progress.to))?;
        (self.on_event)(Event::Finished { to: &progress.to });
        Ok(())
    }

    fn persist(
        &self,
        cutover: Option<&CutoverProgress>,
        applied: Option<&str>,
    ) -> Result<(), Error> {
        let state_error = |source| Error::State {
            topology: self.topology.to_owned(),
            source,
        };
        let mut state = self.state.topology(self.topology).map_err(state_error)?;
        state.cutover = cutover.cloned();
        if let Some(commit) = applied {
            state.commit = Some(commit.to_owned());
        }
        self.state
            .save_topology(self.topology, &state)
            .map_err(state_error)
    }

    fn execute(
        &self,
        index: usize,
        action: &Action,
        progress: &mut CutoverProgress,
    ) -> Result<(), Error> {
        let kafka_error = |source| Error::Kafka {
            topology: self.topology.to_owned(),
            index,
            action: describe(action),
            source: Box::new(source),
        };
        let runtime_error = |source| Error::Runtime {
            topology: self.topology.to_owned(),
            index,
            action: describe(action),
            source,
        };
        match action {
            Action::CreateTopic { topic, partitions } => self
                .admin
                .create_topic(topic, *partitions)
                .map_err(kafka_error),
            Action::DeleteTopic { topic } if self.config.keep_topics => {
                tracing::info!(
                    topology = self.topology,
                    topic,
                    "retired topic kept (--keep-topics)"
                );
                Ok(())
            }
            Action::DeleteTopic { topic } => self.admin.delete_topic(topic).map_err(kafka_error),
            Action::StopProcessor { group, .. } => self.runtime.stop(group).map_err(runtime_error),
            Action::ScaleProcessor { group, scale, .. } => {
                self.runtime.scale(group, scale.min).map_err(runtime_error)
            }
            Action::HandOverOffsets {
                step,
                from_group,
                to_group,
                topics,
            } => {
                let offsets = self
                    .admin
                    .committed(from_group, topics)
                    .map_err(kafka_error)?;
                tracing::info!(topology = self.topology, step, from_group, to_group, offsets = ?offsets, "cutover offsets");
                progress.handovers.retain(|h| &h.to_group != to_group);
                progress.handovers.push(Handover {
                    step: step.clone(),
                    from_group: from_group.clone(),
                    to_group: to_group.clone(),
                    offsets,
                });
                // Durable before anyone uses them.
                self.persist(Some(progress), None)
            }
            Action::DrainProcessor { group, topics, .. } => {
                self.drain(group, topics, index, action)
            }
            Action::StartProcessor(start) => {
                if !progress.prepared {
                    let offsets = self
                        .start_offsets(start, &progress.handovers)
                        .map_err(kafka_error)?;
                    self.admin
                        .commit(&start.group, &offsets)
                        .map_err(kafka_error)?;
                    progress.prepared = true;
                    self.persist(Some(progress), None)?;
                }
                self.runtime.start(&self.spec(start)).map_err(runtime_error)
            }
        }
    }

    /// Where the group starts on each input partition: always explicit.
    fn start_offsets(
        &self,
        start: &StartProcessor,
        handovers: &[Handover],
    ) -> Result<Vec<PartitionOffset>, kafka::Error> {
        let mut offsets = Vec::new();
        for input in &start.inputs {
            let marks = self.admin.watermarks(&input.topic)?;
            for (partition, (low, high)) in marks.into_iter().enumerate() {
                let partition = partition as i32;
                let offset = match input.from {
                    StartPosition::Earliest => low,
                    StartPosition::Latest => high,
                    StartPosition::Cutover => handovers
                        .iter()
                        .filter(|h| h.to_group == start.group)
                        .flat_map(|h| &h.offsets)
                        .find(|p| p.topic == input.topic && p.partition == partition)
                        .map(|p| p.offset)
                        .unwrap_or_else(|| {
                            // The predecessor never committed here, so it consumed nothing
                            // here: the partition's beginning is where it stood.
                            tracing::warn!(topology = self.topology, group = %start.group, topic = %input.topic, partition, "no cutover offset recorded; starting at the beginning");
                            low
                        }),
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

    fn spec(&self, start: &StartProcessor) -> ProcessorSpec {
        ProcessorSpec {
            topology: self.topology.to_owned(),
            step: start.step.clone(),
            identity: start.identity,
            group: start.group.clone(),
            bootstrap: self.bootstrap.to_owned(),
            inputs: start.inputs.iter().map(|i| i.topic.clone()).collect(),
            outputs: start.outputs.clone(),
            dlq: start.dlq.clone(),
            transform: start.transform.clone(),
            env: start.env.clone(),
            replicas: start.scale.min.max(1),
            workdir: self
                .workdirs
                .get(&start.step)
                .cloned()
                .unwrap_or_else(|| PathBuf::from(".")),
        }
    }

    /// Waits until `group` has consumed everything on `topics` (their writers have stopped).
    /// A group that stalls is restarted by the daemon's watchdog, not here.
    fn drain(
        &self,
        group: &str,
        topics: &[String],
        index: usize,
        action: &Action,
    ) -> Result<(), Error> {
        let mut previous = None;
        loop {
            let lag = self
                .admin
                .lag(group, topics)
                .map_err(|source| Error::Kafka {
                    topology: self.topology.to_owned(),
                    index,
                    action: describe(action),
                    source: Box::new(source),
                })?;
            (self.on_event)(Event::Draining { group, lag });
            // A lag that stays put may be transaction markers, not records: look closer then
            // (while it shrinks, the group is simply still reading).
            let drained = lag == 0
                || (previous == Some(lag)
                    && self
                        .admin
                        .drained(group, topics)
                        .map_err(|source| Error::Kafka {
                            topology: self.topology.to_owned(),
                            index,
                            action: describe(action),
                            source: Box::new(source),
                        })?);
            if drained {
                return Ok(());
            }
            previous = Some(lag);
            if (self.stopping)() {
                return Err(Error::Interrupted {
                    topology: self.topology.to_owned(),
                });
            }
            std::thread::sleep(self.config.poll);
        }
    }
}

/// A one-line description of an action for logs and errors.
pub fn describe(action: &Action) -> String {
    match action {
        Action::CreateTopic { topic, partitions } => {
            format!("create-topic {topic} ({partitions} partitions)")
        }
        Action::StartProcessor(start) => {
            format!("start-processor {} as {}", start.step, start.group)
        }
        Action::ScaleProcessor { group, scale, .. } => {
            format!("scale-processor {group} to {}", scale.min)
        }
        Action::DrainProcessor { group, topics, .. } => {
            format!("drain-processor {group} on {}", topics.join(","))
        }
        Action::StopProcessor { group, .. } => format!("stop-processor {group}"),
        Action::HandOverOffsets {
            from_group,
            to_group,
            ..
        } => format!("hand-over-offsets {from_group} → {to_group}"),
        Action::DeleteTopic { topic } => format!("delete-topic {topic}"),
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
