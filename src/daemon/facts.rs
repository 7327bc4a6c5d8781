//! The one writer of the status document (`GET /api/status`): the daemon's parts send the
//! [`Fact`]s they learn, and [`reduce`] alone turns them into the document, each under the
//! same write lock ([`Store::apply`]; the [`Store`] lets nothing else write). So a topology's `phase`, its error and
//! the daemon's overall phase follow from facts in one place, whichever thread learnt them:
//! the follower (the branch), a topology's worker and its engine (cutovers), the observer
//! (what runs), the previews thread and the forge publisher.

use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::status::{
    ActionState, ActionStatus, CutoverStatus, Failed, ForgeStatus, LastError, Metrics, Phase,
    PreviewOf, Published, SignatureStatus, Status, StepStatus, TopologyStatus, WaitStatus,
};
use crate::cutover::Outlook;
use crate::runtime::Delivery;

/// Something one part of the daemon learnt.
#[derive(Debug, Clone)]
pub enum Fact {
    /// The branch followed.
    Branch(String),
    /// The branch's newest valid commit: what the topologies move to.
    Desired(String),
    /// The trusted keys' verdict on the branch's head.
    Signature(SignatureStatus),
    /// The branch cannot be followed, or its head is refused (invalid, not signed).
    RepositoryFailed(LastError),
    /// A head the daemon accepts: the repository's error is over (a topology's stays).
    RepositoryRecovered,
    /// How the topology's processors deliver (decided per cluster).
    Delivery {
        topology: String,
        delivery: Delivery,
    },
    /// What the observer read of the topology's steps.
    Observed {
        topology: String,
        steps: Vec<StepStatus>,
    },
    /// What a replica that does not act (a standby) reads of the topology's record: the
    /// commit it runs and the move in progress, if any. Its engine sends no facts, so without
    /// this a standby would show a move half-way as done (its steps are the target's).
    Recorded {
        topology: String,
        commit: Option<String>,
        moving: Option<crate::store::Move>,
    },
    /// The observer cannot read the topology's record.
    RecordUnreadable {
        topology: String,
        message: String,
    },
    /// A step of the topology's reconciling failed (it is tried again after a backoff).
    Failed {
        topology: String,
        message: String,
        at: u64,
    },
    /// Every action left waits: why, each.
    Waiting {
        topology: String,
        waits: Vec<WaitStatus>,
    },
    /// A move began.
    Started {
        topology: String,
        from: Option<String>,
        to: String,
        at: u64,
    },
    /// One action took effect.
    Acted {
        topology: String,
        done: usize,
        remaining: usize,
        action: String,
    },
    /// What is left of the move in hand, in the engine's order.
    Remaining {
        topology: String,
        from: Option<String>,
        to: String,
        started_at: u64,
        done: usize,
        left: Vec<Outlook>,
    },
    /// The topology runs the graph of `commit`, nothing moving.
    Settled {
        topology: String,
        commit: String,
    },
    /// Nothing of the topology runs or exists any more.
    Removed(String),
    /// A pull request's preview environment runs as this topology.
    PreviewRuns {
        topology: String,
        of: PreviewOf,
    },
    /// A preview cannot start (tried again at the next look).
    PreviewFailed {
        topology: String,
        message: String,
    },
    /// Plans are published on this forge.
    ForgeConnected {
        kind: String,
        repo: String,
    },
    ForgePublished(Published),
    ForgeFailed(Failed),
}

/// The shared status; cheap to clone.
#[derive(Clone)]
pub struct Store {
    status: Arc<RwLock<Status>>,
    /// Counts writes, so readers that push status (the event stream) learn of changes.
    written: Arc<tokio::sync::watch::Sender<u64>>,
    pub metrics: Metrics,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            status: Arc::default(),
            written: Arc::new(tokio::sync::watch::Sender::new(0)),
            metrics: Metrics::default(),
        }
    }
}

/// A write to the status; readers are told when it ends (they find the lock free within
/// microseconds of being woken).
pub struct StatusWrite<'a> {
    guard: RwLockWriteGuard<'a, Status>,
    written: &'a tokio::sync::watch::Sender<u64>,
}

impl std::ops::Deref for StatusWrite<'_> {
    type Target = Status;
    fn deref(&self) -> &Status {
        &self.guard
    }
}

impl std::ops::DerefMut for StatusWrite<'_> {
    fn deref_mut(&mut self) -> &mut Status {
        &mut self.guard
    }
}

impl Drop for StatusWrite<'_> {
    fn drop(&mut self) {
        self.written
            .send_modify(|count| *count = count.wrapping_add(1));
    }
}

impl Store {
    pub fn read(&self) -> RwLockReadGuard<'_, Status> {
        self.status.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> StatusWrite<'_> {
        StatusWrite {
            guard: self.status.write().unwrap_or_else(PoisonError::into_inner),
            written: &self.written,
        }
    }

    /// Changes whenever the status was written (maybe to the same value).
    pub fn writes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// Holds the document as a write would, without writing: every reader waits until the
    /// guard drops. For tests of what must not wait for the status (health, the listener).
    pub fn hold(&self) -> impl Drop + '_ {
        self.write()
    }

    /// Applies what a part of the daemon learnt: the one way the document is written.
    pub fn apply(&self, fact: Fact) {
        reduce(&mut self.write(), fact);
    }

    /// Applies several facts in one write (readers, the event stream among them, see one
    /// change): what one look of the observer learnt. Nothing is written for none.
    pub fn apply_all(&self, facts: Vec<Fact>) {
        if facts.is_empty() {
            return;
        }
        let mut status = self.write();
        for fact in facts {
            reduce(&mut status, fact);
        }
    }
}

/// Applies `fact` to `status`, then the daemon's overall phase.
pub fn reduce(status: &mut Status, fact: Fact) {
    match fact {
        Fact::Branch(branch) => status.branch = branch,
        Fact::Desired(commit) => status.commit = Some(commit),
        Fact::Signature(signature) => status.signature = Some(signature),
        Fact::RepositoryFailed(error) => status.last_error = Some(error),
        Fact::RepositoryRecovered => {
            status.last_error = status.last_error.take().filter(|e| e.topology.is_some());
        }
        Fact::Delivery { topology, delivery } => {
            topology_mut(status, &topology).delivery = Some(delivery);
        }
        Fact::Observed { topology, steps } => topology_mut(status, &topology).steps = steps,
        Fact::Recorded {
            topology,
            commit,
            moving,
        } => {
            let t = topology_mut(status, &topology);
            match moving {
                Some(moving) => {
                    t.phase = Phase::Cutover;
                    t.commit = moving.from.clone();
                    let c = t.cutover.get_or_insert_with(CutoverStatus::default);
                    c.from = moving.from;
                    c.to = moving.to;
                    c.started_at = Some(moving.started_at);
                    c.done = moving.done;
                }
                None => {
                    if t.phase == Phase::Cutover {
                        t.phase = Phase::Idle;
                    }
                    t.commit = commit;
                    t.cutover = None;
                }
            }
        }
        Fact::RecordUnreadable { topology, message } => {
            let t = topology_mut(status, &topology);
            t.phase = Phase::Error;
            t.last_error = Some(message);
        }
        Fact::Failed {
            topology,
            message,
            at,
        } => {
            let t = topology_mut(status, &topology);
            t.phase = Phase::Error;
            t.last_error = Some(message.clone());
            status.last_error = Some(LastError {
                commit: None,
                topology: Some(topology),
                message,
                at,
                place: None,
            });
        }
        Fact::Waiting { topology, waits } => {
            let t = topology_mut(status, &topology);
            t.last_error = waits
                .iter()
                .find(|w| w.failures > 0)
                .map(|w| format!("{}: {}", w.action, w.reason));
            if let Some(c) = &mut t.cutover {
                c.waiting = waits;
            }
        }
        Fact::Started {
            topology,
            from,
            to,
            at,
        } => {
            let t = topology_mut(status, &topology);
            t.phase = Phase::Cutover;
            t.commit.clone_from(&from);
            t.cutover = Some(CutoverStatus {
                from,
                to,
                started_at: Some(at),
                ..CutoverStatus::default()
            });
        }
        Fact::Acted {
            topology,
            done,
            remaining,
            action,
        } => {
            let t = topology_mut(status, &topology);
            t.phase = Phase::Cutover;
            let c = t.cutover.get_or_insert_with(CutoverStatus::default);
            c.done = done;
            c.remaining = remaining;
            for a in &mut c.actions {
                if a.action == action {
                    a.state = ActionState::Running;
                    a.reason = None;
                }
            }
            c.current = Some(action);
        }
        Fact::Remaining {
            topology,
            from,
            to,
            started_at,
            done,
            left,
        } => {
            let t = topology_mut(status, &topology);
            t.phase = Phase::Cutover;
            let c = t.cutover.get_or_insert_with(CutoverStatus::default);
            c.from = from;
            c.to = to;
            c.started_at = Some(started_at);
            c.done = done;
            c.remaining = left.len();
            c.actions = shown_actions(&c.actions, &left);
        }
        Fact::Settled { topology, commit } => {
            let t = topology_mut(status, &topology);
            t.phase = Phase::Idle;
            t.commit = Some(commit);
            t.cutover = None;
            t.last_error = None;
            clear_error_of(status, &topology);
        }
        Fact::Removed(topology) => status.topologies.retain(|t| t.name != topology),
        Fact::PreviewRuns { topology, of } => {
            let t = topology_mut(status, &topology);
            t.preview_of = Some(of);
            t.last_error = None;
        }
        Fact::PreviewFailed { topology, message } => {
            topology_mut(status, &topology).last_error = Some(message);
        }
        Fact::ForgeConnected { kind, repo } => {
            status.forge = Some(ForgeStatus {
                kind,
                repo,
                ..ForgeStatus::default()
            });
        }
        Fact::ForgePublished(published) => {
            let forge = status.forge.get_or_insert_with(ForgeStatus::default);
            forge.published += 1;
            forge.last_published = Some(published);
        }
        Fact::ForgeFailed(failed) => {
            let forge = status.forge.get_or_insert_with(ForgeStatus::default);
            forge.failures += 1;
            forge.last_error = Some(failed);
        }
    }
    status.phase = overall(status);
}

/// The topology's entry, created (in name order) if it has none yet.
fn topology_mut<'s>(status: &'s mut Status, name: &str) -> &'s mut TopologyStatus {
    let at = match status
        .topologies
        .binary_search_by(|t| t.name.as_str().cmp(name))
    {
        Ok(at) => at,
        Err(at) => {
            status.topologies.insert(
                at,
                TopologyStatus {
                    name: name.to_owned(),
                    ..TopologyStatus::default()
                },
            );
            at
        }
    };
    &mut status.topologies[at]
}

/// A topology recovered: its error, if it is the last one, is over.
fn clear_error_of(status: &mut Status, topology: &str) {
    if status
        .last_error
        .as_ref()
        .is_some_and(|e| e.topology.as_deref() == Some(topology))
    {
        status.last_error = None;
    }
}

fn overall(status: &Status) -> Phase {
    let phases: Vec<Phase> = status.topologies.iter().map(|t| t.phase).collect();
    if phases.contains(&Phase::Cutover) {
        Phase::Cutover
    } else if phases.contains(&Phase::Error) || status.last_error.is_some() {
        Phase::Error
    } else {
        Phase::Idle
    }
}

/// Action by action: those shown before that are no longer left are done (in the order they
/// were shown), then what is left.
fn shown_actions(before: &[ActionStatus], left: &[Outlook]) -> Vec<ActionStatus> {
    let mut shown: Vec<ActionStatus> = before
        .iter()
        .filter(|a| a.state == ActionState::Done || !left.iter().any(|l| l.action == a.action))
        .map(|a| ActionStatus {
            state: ActionState::Done,
            reason: None,
            ..a.clone()
        })
        .collect();
    shown.extend(left.iter().map(|l| {
        let (state, reason) = match (&l.waiting, &l.blocked_by) {
            (Some(reason), _) => (ActionState::Waiting, Some(reason.clone())),
            (None, Some(blocker)) => (ActionState::Pending, Some(format!("waits for {blocker}"))),
            (None, None) => (ActionState::Pending, None),
        };
        ActionStatus {
            action: l.action.clone(),
            state,
            reason,
            failures: l.failures,
        }
    }));
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(status: &mut Status, facts: impl IntoIterator<Item = Fact>) {
        for fact in facts {
            reduce(status, fact);
        }
    }

    fn failed(topology: &str) -> Fact {
        Fact::Failed {
            topology: topology.into(),
            message: "boom".into(),
            at: 0,
        }
    }

    fn settled(topology: &str) -> Fact {
        Fact::Settled {
            topology: topology.into(),
            commit: "c".into(),
        }
    }

    #[test]
    fn the_phase_follows_topologies_and_errors() {
        let mut status = Status::default();
        let started = Fact::Started {
            topology: "t".into(),
            from: None,
            to: "c".into(),
            at: 0,
        };
        apply(&mut status, [started]);
        assert_eq!(status.phase, Phase::Cutover);
        apply(&mut status, [settled("t")]);
        assert_eq!(status.phase, Phase::Idle);
        apply(&mut status, [failed("t")]);
        assert_eq!(status.phase, Phase::Error);
        assert_eq!(status.topologies[0].phase, Phase::Error);
        // Settling again ends the topology's error, and with it the daemon's.
        apply(&mut status, [settled("t")]);
        assert_eq!(status.phase, Phase::Idle);
        assert!(status.last_error.is_none());
    }

    #[test]
    fn a_recovered_topology_clears_only_its_own_error() {
        let mut status = Status::default();
        apply(&mut status, [failed("t"), settled("x")]);
        assert!(status.last_error.is_some());
        assert_eq!(status.phase, Phase::Error);
        apply(&mut status, [settled("t")]);
        assert!(status.last_error.is_none());
        assert_eq!(status.phase, Phase::Idle);
        // A repository-level error (an invalid commit) is not a topology's to clear, and a
        // valid head clears only it.
        let invalid = LastError {
            commit: Some("c".into()),
            topology: None,
            message: "not valid".into(),
            at: 0,
            place: None,
        };
        apply(&mut status, [Fact::RepositoryFailed(invalid), settled("t")]);
        assert!(status.last_error.is_some());
        apply(&mut status, [failed("t"), Fact::RepositoryRecovered]);
        assert_eq!(
            status
                .last_error
                .as_ref()
                .and_then(|e| e.topology.as_deref()),
            Some("t")
        );
    }

    /// A standby's engine sends nothing: what it shows of a move comes from the record.
    #[test]
    fn a_standby_shows_the_move_its_record_holds_until_the_record_settles() {
        let mut status = Status::default();
        let moving = crate::store::Move {
            from: Some("a".into()),
            to: "b".into(),
            started_at: 7,
            done: 3,
            handovers: Vec::new(),
        };
        let recorded = |commit: &str, moving: Option<crate::store::Move>| Fact::Recorded {
            topology: "t".into(),
            commit: Some(commit.into()),
            moving,
        };
        apply(&mut status, [recorded("a", Some(moving))]);
        let t = &status.topologies[0];
        assert_eq!((t.phase, t.commit.as_deref()), (Phase::Cutover, Some("a")));
        let cutover = t.cutover.as_ref().map(|c| (c.to.as_str(), c.done));
        assert_eq!(cutover, Some(("b", 3)));
        assert_eq!(status.phase, Phase::Cutover);
        apply(&mut status, [recorded("b", None)]);
        let t = &status.topologies[0];
        assert_eq!((t.phase, t.commit.as_deref()), (Phase::Idle, Some("b")));
        assert!(t.cutover.is_none());
        assert_eq!(status.phase, Phase::Idle);
    }

    #[test]
    fn topologies_stay_in_name_order() {
        let mut status = Status::default();
        apply(&mut status, [settled("b"), settled("c"), settled("a")]);
        apply(&mut status, [Fact::Removed("b".into())]);
        let names: Vec<&str> = status.topologies.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
    }

    fn outlook(action: &str, waiting: Option<&str>, blocked_by: Option<&str>) -> Outlook {
        Outlook {
            action: action.into(),
            waiting: waiting.map(str::to_owned),
            failures: u32::from(waiting.is_some()),
            blocked_by: blocked_by.map(str::to_owned),
        }
    }

    #[test]
    fn actions_shown_before_and_no_longer_left_are_done_in_the_order_shown() {
        let first = shown_actions(
            &[],
            &[
                outlook("start b", None, None),
                outlook("drain a", Some("lag 4"), None),
                outlook("stop a", None, Some("drain a")),
            ],
        );
        let states: Vec<_> = first
            .iter()
            .map(|a| (a.state, a.reason.as_deref()))
            .collect();
        assert_eq!(
            states,
            [
                (ActionState::Pending, None),
                (ActionState::Waiting, Some("lag 4")),
                (ActionState::Pending, Some("waits for drain a")),
            ]
        );
        // `start b` took effect, then `drain a`: both done, in the order they were shown.
        let second = shown_actions(&first, &[outlook("stop a", None, None)]);
        let third = shown_actions(&second, &[]);
        let shown: Vec<_> = third.iter().map(|a| (a.action.as_str(), a.state)).collect();
        assert_eq!(
            shown,
            [
                ("start b", ActionState::Done),
                ("drain a", ActionState::Done),
                ("stop a", ActionState::Done),
            ]
        );
        assert!(third.iter().all(|a| a.reason.is_none()));
    }
}
