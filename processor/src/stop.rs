//! Stop requests: the first SIGTERM/SIGINT asks for a graceful stop, a second one forces it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long the record in hand may still take after a stop request before it is abandoned
/// (uncommitted, so the group's next owner processes it). Leaves room within the 10 s promise
/// for the flush, the commit and leaving the group.
pub const IN_FLIGHT_GRACE: Duration = Duration::from_secs(5);

/// A cloneable stop flag, set by signals or by tests.
#[derive(Clone, Default)]
pub struct Stop {
    requests: Arc<AtomicUsize>,
    first_request: Arc<Mutex<Option<Instant>>>,
}

impl Stop {
    /// A flag that SIGTERM and SIGINT set.
    pub fn on_signals() -> std::io::Result<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let stop = Stop::default();
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        let handle = stop.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    tracing::info!(signal, "stop requested");
                    handle.request();
                }
            })?;
        Ok(stop)
    }

    pub fn request(&self) {
        let mut first = self
            .first_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first.get_or_insert_with(Instant::now);
        self.requests.fetch_add(1, Ordering::SeqCst);
    }

    /// Stop fetching new records.
    pub fn requested(&self) -> bool {
        self.requests.load(Ordering::SeqCst) > 0
    }

    /// Abandon the record in hand: the grace period is over or a second signal came.
    pub fn abandon_in_flight(&self) -> bool {
        if self.requests.load(Ordering::SeqCst) > 1 {
            return true;
        }
        let first = self
            .first_request
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        first.is_some_and(|at| at.elapsed() >= IN_FLIGHT_GRACE)
    }

    /// Sleeps up to `duration`, waking early when the record in hand must be abandoned.
    /// Returns false when it woke for that reason.
    pub fn sleep(&self, duration: Duration) -> bool {
        let until = Instant::now() + duration;
        loop {
            if self.abandon_in_flight() {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_request_abandons_in_flight_work_at_once() {
        let stop = Stop::default();
        assert!(!stop.requested());
        stop.request();
        assert!(stop.requested());
        assert!(
            !stop.abandon_in_flight(),
            "the first request grants a grace period"
        );
        stop.request();
        assert!(stop.abandon_in_flight());
        assert!(!stop.sleep(Duration::from_secs(60)), "sleep wakes at once");
    }
}
