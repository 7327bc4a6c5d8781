//! Requests for a thread of the daemon that may not run (no forge, no previews): whoever
//! holds the [`Mailbox`] sends without waiting, and nothing happens until the thread attaches.

use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

pub struct Mailbox<T> {
    sender: Mutex<Option<UnboundedSender<T>>>,
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Mailbox {
            sender: Mutex::new(None),
        }
    }
}

impl<T> Mailbox<T> {
    /// Leaves `request` for the thread; dropped when none is attached (never waits).
    pub fn send(&self, request: T) {
        if let Some(sender) = self
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            let _ = sender.send(request);
        }
    }

    /// The thread's end: requests from now on.
    pub(super) fn attach(&self) -> UnboundedReceiver<T> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        *self.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
        receiver
    }

    /// Ends the thread's requests: its receiver sees the channel closed.
    pub(super) fn detach(&self) {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}
