//! One worker thread per topology, so one topology's move never holds up another's. Its slot
//! holds the desired revision: the newest wins, and a worker that waits (for a drain, a
//! topic, a retry) wakes for it at once. Failures are retried with exponential backoff, a
//! policy kept apart from the reconcile step itself (STYLE K1).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::facts::Fact;
use super::reconcile::{Step, reconcile};
use super::status::OutcomeLabels;
use super::{Context, Error, Revision};
use crate::cutover::{self, Waits};

/// A topology's worker and the slot its desired revision goes into.
pub(super) struct Worker {
    slot: Arc<(Mutex<Slot>, Condvar)>,
    handle: JoinHandle<()>,
}

#[derive(Default)]
struct Slot {
    desired: Option<Arc<Revision>>,
    /// Bumped whenever `desired` changes, so a waiting worker wakes for it.
    generation: u64,
}

impl Worker {
    pub(super) fn spawn(name: &str, context: &Arc<Context>) -> Result<Worker, Error> {
        let slot = Arc::new((Mutex::new(Slot::default()), Condvar::new()));
        let handle = {
            let threads = &context.threads;
            let (name, context, slot) = (name.to_owned(), context.clone(), slot.clone());
            super::spawn(
                threads,
                &format!("topology-{name}"),
                super::health::Kind::Transient,
                move || work(&name, &context, &slot),
            )?
        };
        Ok(Worker { slot, handle })
    }

    pub(super) fn desire(&self, revision: Arc<Revision>) {
        let (lock, wake) = &*self.slot;
        let mut slot = lock.lock().unwrap_or_else(PoisonError::into_inner);
        slot.desired = Some(revision);
        slot.generation += 1;
        wake.notify_all();
    }

    pub(super) fn wake(&self) {
        let (lock, wake) = &*self.slot;
        let mut slot = lock.lock().unwrap_or_else(PoisonError::into_inner);
        slot.generation += 1;
        wake.notify_all();
    }

    pub(super) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    pub(super) fn join(self) {
        let _ = self.handle.join();
    }
}

/// Backoff of failed reconcile steps: from the first to the longest delay.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// How often a replica without the lease looks again.
const STANDBY_RETRY: Duration = Duration::from_secs(1);

fn work(name: &str, context: &Arc<Context>, slot: &(Mutex<Slot>, Condvar)) {
    let (lock, wake) = slot;
    let mut backoff = BACKOFF.0;
    let mut waits = Waits::default();
    loop {
        if context.is_stopping() {
            return;
        }
        let (desired, generation) = {
            let slot = lock.lock().unwrap_or_else(PoisonError::into_inner);
            (slot.desired.clone(), slot.generation)
        };
        // Nothing to move to yet (the branch is not read yet): wait for it.
        let until = match desired {
            None => None,
            // A standby replica: the holder of the lease moves the topology. Look again soon,
            // so that a takeover resumes a move within moments of getting the lease.
            Some(_) if !context.records.may_act() => Some(Instant::now() + STANDBY_RETRY),
            Some(desired) => match reconcile(name, context, &desired, &mut waits) {
                Ok(Step::Progressed) => {
                    backoff = BACKOFF.0;
                    continue;
                }
                Ok(Step::Settled) => {
                    backoff = BACKOFF.0;
                    None
                }
                Ok(Step::Removed) => {
                    context.store.apply(Fact::Removed(name.to_owned()));
                    tracing::info!(topology = name, "topology removed");
                    return;
                }
                Ok(Step::Waiting(until)) => {
                    backoff = BACKOFF.0;
                    Some(until)
                }
                // The lease went in the middle of the step: not a failure of the topology.
                Err(error) if error.is_not_leader() => {
                    tracing::debug!(topology = name, "not the lease holder; looking again soon");
                    Some(Instant::now() + STANDBY_RETRY)
                }
                Err(error) => {
                    // What retrying cannot mend waits for a new commit (which wakes the
                    // worker at once) or a person, so it is looked at again only rarely.
                    if !error.is_retryable() {
                        backoff = BACKOFF.1;
                    }
                    report_failure(name, context, &error, backoff);
                    let until = Instant::now() + backoff;
                    backoff = (backoff * 2).min(BACKOFF.1);
                    Some(until)
                }
            },
        };
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let unchanged = |s: &mut Slot| s.generation == generation && !context.is_stopping();
        match until {
            // Settled: sleep until a new desired revision (or a stop) arrives.
            None => drop(
                wake.wait_while(guard, unchanged)
                    .unwrap_or_else(PoisonError::into_inner),
            ),
            // Waiting or failed: look again then, or earlier for a new revision.
            Some(until) => drop(
                wake.wait_timeout_while(
                    guard,
                    until.saturating_duration_since(Instant::now()),
                    unchanged,
                )
                .unwrap_or_else(PoisonError::into_inner),
            ),
        }
    }
}

fn report_failure(name: &str, context: &Context, error: &Error, retry_in: Duration) {
    tracing::error!(topology = name, %error, retry_in = ?retry_in, retryable = error.is_retryable(), "reconciling failed");
    context.store.apply(Fact::Failed {
        topology: name.to_owned(),
        message: error.to_string(),
        at: cutover::now(),
    });
    context
        .store
        .metrics
        .cutovers
        .get_or_create(&OutcomeLabels {
            topology: name.to_owned(),
            outcome: "failed-attempt".into(),
        })
        .inc();
}
