//! The event stream of `GET /api/events` (Server-Sent Events), which the web page follows:
//! `status` (the whole status document, whenever it changed, at most one per
//! [`STATUS_INTERVAL`], always the newest), `plan` (a watched ref's plan changed or went) and
//! `history` (a move finished: its history entry). Every event is numbered in the one order
//! all clients see; a client that connects (or reconnects after a restart) gets the status as
//! it is then first.
//!
//! An event is encoded once, for every client: its SSE lines ([`Outgoing::frame`]) are
//! shared, so a client costs the daemon no copy of what it has not read yet.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use serde::Serialize;
use tokio::sync::broadcast;

use super::facts::Store;

/// The shortest time between two `status` events: lag and records/s change every look, and a
/// page redraws nothing faster than a person reads.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(500);

/// Events a client that falls this far behind misses (it is sent the status again and told
/// to read the rest afresh).
const BACKLOG: usize = 256;

/// One event as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Increasing within one daemon run.
    pub id: u64,
    /// `status`, `plan`, `history` or `resync`.
    pub kind: &'static str,
    /// JSON on one line (serde_json writes no line breaks): a part of `frame`.
    pub data: Bytes,
    /// The event as Server-Sent Events lines: `id: N`, `event: KIND`, `data: JSON`, a blank
    /// line. One piece, so that it travels as one chunk.
    frame: Bytes,
}

impl Outgoing {
    fn new(id: u64, kind: &'static str, data: String) -> Outgoing {
        let head = format!("id: {id}\nevent: {kind}\ndata: ");
        let mut frame = Vec::with_capacity(head.len() + data.len() + 2);
        frame.extend_from_slice(head.as_bytes());
        frame.extend_from_slice(data.as_bytes());
        frame.extend_from_slice(b"\n\n");
        let frame = Bytes::from(frame);
        Outgoing {
            id,
            kind,
            data: frame.slice(head.len()..frame.len() - 2),
            frame,
        }
    }

    /// The data as text.
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.data).unwrap_or_default()
    }

    /// The event as Server-Sent Events lines, sharing the event's bytes.
    pub fn frame(&self) -> Bytes {
        self.frame.clone()
    }
}

/// Numbers the events and hands them to every client.
pub struct Events {
    /// The next event's number; held while an event is numbered and sent, so numbers reach
    /// every client in order.
    next: std::sync::Mutex<u64>,
    sender: broadcast::Sender<Arc<Outgoing>>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            next: std::sync::Mutex::new(1),
            sender: broadcast::Sender::new(BACKLOG),
        }
    }
}

impl Events {
    /// Sends an event to every client connected now.
    pub fn publish(&self, kind: &'static str, data: &impl Serialize) {
        match serde_json::to_string(data) {
            Ok(data) => self.send(kind, data),
            Err(error) => tracing::warn!(%error, kind, "cannot encode an event"),
        }
    }

    fn send(&self, kind: &'static str, data: String) {
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let event = Arc::new(Outgoing::new(*next, kind, data));
        *next += 1;
        // No receiver (no page open) is no error.
        let _ = self.sender.send(event);
    }

    /// A client's stream: the status as it is now (numbered as the last event sent, so every
    /// later event has a greater number), then every event from now on.
    pub fn subscribe(&self, store: &Store) -> (Outgoing, broadcast::Receiver<Arc<Outgoing>>) {
        let next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        // Subscribed before the status is read: nothing written after the read is missed.
        let receiver = self.sender.subscribe();
        (self.snapshot(store, *next - 1), receiver)
    }

    /// The status as it is now, for a client that fell behind (numbered as the last event
    /// it was sent).
    pub fn snapshot(&self, store: &Store, id: u64) -> Outgoing {
        let data = serde_json::to_string(&*store.read()).unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot encode the status");
            "{}".into()
        });
        Outgoing::new(id, "status", data)
    }

    /// Sends `status` events as the store is written, at most one per `interval`, never the
    /// same document twice in a row, and none while no client listens. Runs until the store
    /// is gone or `stop` turns true.
    pub async fn follow_status(
        &self,
        store: &Store,
        interval: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut writes = store.writes();
        let mut last = String::new();
        loop {
            // Nobody listens: nothing is encoded (at 1,000 topologies the document is
            // megabytes). A client that connects is sent the status as it is then.
            if self.sender.receiver_count() == 0 {
                last.clear();
            } else {
                let document = match serde_json::to_string(&*store.read()) {
                    Ok(document) => document,
                    Err(error) => {
                        tracing::warn!(%error, "cannot encode the status");
                        String::new()
                    }
                };
                if !document.is_empty() && document != last {
                    self.send("status", document.clone());
                    last = document;
                }
            }
            // Writes during the pause are coalesced: the next document has them all.
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
            tokio::select! {
                changed = writes.changed() => if changed.is_err() { return },
                _ = stop.wait_for(|stop| *stop) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn status_events_are_coalesced_to_the_interval_numbered_in_order_and_never_repeated() {
        let runtime = runtime();
        let store = Store::default();
        let events = Arc::new(Events::default());
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let interval = Duration::from_millis(100);
        runtime.block_on(async {
            let follower = {
                let (events, store) = (events.clone(), store.clone());
                tokio::spawn(async move { events.follow_status(&store, interval, stopping).await })
            };
            let (first, mut receiver) = events.subscribe(&store);
            assert_eq!(first.kind, "status");

            // 2,000 writes as fast as they come, interleaved with a plan event.
            let started = Instant::now();
            for n in 0..2_000 {
                store.apply(crate::daemon::facts::Fact::Branch(format!("b{n}")));
                if n == 1_000 {
                    events.publish("plan", &serde_json::json!({"ref": "refs/heads/x"}));
                }
                if n % 100 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            // Unchanged writes send nothing new.
            for _ in 0..100 {
                store.apply(crate::daemon::facts::Fact::Branch("b1999".into()));
            }
            let mut seen = vec![Arc::new(first)];
            let last = loop {
                let event = tokio::time::timeout(Duration::from_secs(30), receiver.recv())
                    .await
                    .expect("the last write's status arrives")
                    .unwrap();
                seen.push(event.clone());
                if event.kind == "status" && event.text().contains("\"b1999\"") {
                    break event;
                }
            };
            let elapsed = started.elapsed();
            let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
            let statuses = seen.iter().filter(|e| e.kind == "status").count();
            // At most one per interval (and the first at once).
            let allowed = (elapsed.as_millis() / interval.as_millis()) as usize + 2;
            assert!(
                statuses <= allowed,
                "{statuses} status events in {elapsed:?}"
            );
            assert!(
                statuses < 100,
                "2,000 writes were not coalesced: {statuses}"
            );
            assert_eq!(seen.iter().filter(|e| e.kind == "plan").count(), 1);
            let statuses: Vec<&Arc<Outgoing>> =
                seen.iter().filter(|e| e.kind == "status").collect();
            assert!(statuses.windows(2).all(|w| w[0].data != w[1].data));

            // Nothing changes any more: no status event within a few intervals.
            let quiet = tokio::time::timeout(interval * 5, receiver.recv()).await;
            assert!(
                quiet.is_err(),
                "an unchanged status was sent again: {quiet:?}"
            );

            // A client connecting now gets the status as it is, numbered before what follows.
            let (again, _) = events.subscribe(&store);
            assert_eq!((again.kind, &again.data), ("status", &last.data));
            assert_eq!(again.id, last.id);
            stop.send(true).unwrap();
            follower.await.unwrap();
        });
    }
}
