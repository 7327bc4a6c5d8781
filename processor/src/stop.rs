//! Stop requests: the first SIGTERM/SIGINT asks for a graceful stop, a second one forces it.
//!
//! Signals are blocked in every thread and taken from a signalfd by one thread, under a lock
//! that a re-exec of the processor also holds ([`Stop::exec_unless_stopping`]): a signal is
//! either recorded before the exec, which then does not happen, or still pending when the
//! process image is replaced; the mask and pending signals survive the exec, so the new image
//! reads it from its own signalfd and stops. A signal is never lost. (Exec children start
//! with a clean mask: `transform::child`.)

use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// How long the record in hand may still take after a stop request before it is abandoned
/// (uncommitted, so the group's next owner processes it). Leaves room within the 10 s promise
/// for the flush, the commit and leaving the group.
pub const IN_FLIGHT_GRACE: Duration = Duration::from_secs(5);

/// After this long from the first stop request the processor exits whatever it is waiting
/// for (a broker that is gone, a commit that does not return): SPEC §5 promises 10 s.
pub const STOP_LIMIT: Duration = Duration::from_secs(9);

/// A cloneable stop flag, set by signals or by tests.
#[derive(Clone, Default)]
pub struct Stop {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    requests: AtomicUsize,
    first_request: Mutex<Option<Instant>>,
    requested: Condvar,
    /// Held while a signal is read and recorded, and by a re-exec.
    signals: Mutex<()>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Stop {
    /// A flag that SIGTERM and SIGINT set. Call it before any other thread starts: it blocks
    /// the two signals in the calling thread, and threads inherit that.
    pub fn on_signals() -> std::io::Result<Self> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        set.thread_block().map_err(std::io::Error::from)?;
        let signals = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(std::io::Error::from)?;
        let stop = Stop::default();
        let handle = stop.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || handle.take_signals(&signals))?;
        Ok(stop)
    }

    fn take_signals(&self, signals: &SignalFd) {
        loop {
            let mut ready = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
            if let Err(error) = poll(&mut ready, PollTimeout::from(1000u16))
                && error != nix::errno::Errno::EINTR
            {
                tracing::error!(%error, "cannot wait for signals");
                return;
            }
            let _recording = lock(&self.inner.signals);
            while let Ok(Some(info)) = signals.read_signal() {
                tracing::info!(signal = info.ssi_signo, "stop requested");
                self.request();
            }
        }
    }

    pub fn request(&self) {
        let mut first = lock(&self.inner.first_request);
        first.get_or_insert_with(Instant::now);
        self.inner.requests.fetch_add(1, Ordering::SeqCst);
        self.inner.requested.notify_all();
    }

    /// Stop fetching new records.
    pub fn requested(&self) -> bool {
        self.inner.requests.load(Ordering::SeqCst) > 0
    }

    /// When the first stop request came.
    pub fn first_request(&self) -> Option<Instant> {
        *lock(&self.inner.first_request)
    }

    /// Abandon the record in hand: the grace period is over or a second signal came.
    pub fn abandon_in_flight(&self) -> bool {
        if self.inner.requests.load(Ordering::SeqCst) > 1 {
            return true;
        }
        self.first_request()
            .is_some_and(|at| at.elapsed() >= IN_FLIGHT_GRACE)
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

    /// Waits up to `duration` for a stop request; true when one came (or had come).
    pub fn wait(&self, duration: Duration) -> bool {
        let first = lock(&self.inner.first_request);
        let (first, _) = self
            .inner
            .requested
            .wait_timeout_while(first, duration, |first| first.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        first.is_some()
    }

    /// Replaces the process with `command` unless a stop was requested; then it returns
    /// `None` and the caller ends the process itself. `Some` is the error of a failed exec.
    pub fn exec_unless_stopping(&self, command: &mut Command) -> Option<std::io::Error> {
        let _no_signal_is_taken = lock(&self.inner.signals);
        if self.requested() {
            return None;
        }
        Some(command.exec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_request_abandons_in_flight_work_at_once() {
        let stop = Stop::default();
        assert!(!stop.requested());
        assert!(!stop.wait(Duration::from_millis(1)));
        stop.request();
        assert!(stop.requested());
        assert!(
            stop.wait(Duration::from_secs(60)),
            "a request wakes a waiter"
        );
        assert!(
            !stop.abandon_in_flight(),
            "the first request grants a grace period"
        );
        stop.request();
        assert!(stop.abandon_in_flight());
        assert!(!stop.sleep(Duration::from_secs(60)), "sleep wakes at once");
    }

    #[test]
    fn no_exec_once_a_stop_was_requested() {
        let stop = Stop::default();
        stop.request();
        assert!(
            stop.exec_unless_stopping(&mut Command::new("/nonexistent"))
                .is_none()
        );
    }
}
