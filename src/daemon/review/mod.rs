//! The review side of the daemon, apart from the commit path: what a change would do before
//! it is merged. [`plans`] plans every watched ref against the branch, [`publish`] puts each
//! plan on the forge (a comment and a commit status), [`previews`] runs a labelled pull
//! request's changed steps beside production. None of them moves what runs: only the
//! followed branch's commits reach the workers and the cutover engine.

pub mod plans;
pub mod previews;
pub mod publish;

use std::sync::Arc;
use std::thread::JoinHandle;

/// The publisher's or the previews thread, running; dropping it ends it (after the
/// publication or action in hand: the forge clients' waits end at once).
pub(crate) struct Running {
    thread: Option<JoinHandle<()>>,
    clock: Arc<crate::forge::StoppableClock>,
    /// Closes the thread's mailbox, so that its wait for requests ends.
    detach: Box<dyn Fn() + Send + Sync>,
}

impl Running {
    fn new(
        thread: JoinHandle<()>,
        clock: Arc<crate::forge::StoppableClock>,
        detach: impl Fn() + Send + Sync + 'static,
    ) -> Running {
        Running {
            thread: Some(thread),
            clock,
            detach: Box::new(detach),
        }
    }

    /// Tells the thread to end and hands it over to be waited for.
    pub(crate) fn stopping(mut self) -> Option<JoinHandle<()>> {
        self.stop();
        self.thread.take()
    }

    fn stop(&self) {
        self.clock.stop();
        (self.detach)();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
