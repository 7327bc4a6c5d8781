//! What `GET /healthz` answers: whether every long-lived thread of the daemon still runs.
//!
//! Each thread holds an [`Alive`] from before it starts until it ends. A thread that panics
//! drops it while unwinding and is recorded as dead; so is an essential thread (the follower,
//! the planner, the observer, the publisher, the previews thread, the API's) that returns
//! while the daemon runs. A topology's worker may end (its topology was removed) and is then
//! forgotten; a new worker of the same name (the follower starts one at the next commit)
//! replaces a dead one. A thread that hangs without dying is not seen here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The daemon's threads and whether each lives.
#[derive(Debug, Default)]
pub struct Threads {
    lives: Mutex<BTreeMap<String, Life>>,
    stopping: AtomicBool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Running,
    Panicked,
    /// An essential thread returned while the daemon ran.
    Returned,
}

/// How a thread's end is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Runs as long as the daemon: returning early is dying.
    Essential,
    /// May end when its work is done (a removed topology's worker).
    Transient,
}

/// What `/healthz` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// The daemon is shutting down.
    Stopping,
    /// The threads that died, and how (`panicked`, `returned`).
    Dead(Vec<(String, &'static str)>),
}

impl Health {
    /// The answer's text, one line.
    pub fn text(&self) -> String {
        match self {
            Health::Ok => "ok\n".into(),
            Health::Stopping => "stopping\n".into(),
            Health::Dead(dead) => {
                let names: Vec<String> = dead
                    .iter()
                    .map(|(name, how)| format!("{name} ({how})"))
                    .collect();
                format!("dead threads: {}\n", names.join(", "))
            }
        }
    }
}

impl Threads {
    /// Registers thread `name` as running; the returned guard goes into the thread.
    pub fn enter(self: &Arc<Self>, name: &str, kind: Kind) -> Alive {
        self.lives
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned(), Life::Running);
        Alive {
            threads: self.clone(),
            name: name.to_owned(),
            kind,
        }
    }

    /// From now on the daemon stops: threads end as they should, and health says so.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    pub fn health(&self) -> Health {
        if self.stopping.load(Ordering::SeqCst) {
            return Health::Stopping;
        }
        let lives = self.lives.lock().unwrap_or_else(PoisonError::into_inner);
        let dead: Vec<(String, &'static str)> = lives
            .iter()
            .filter_map(|(name, life)| match life {
                Life::Running => None,
                Life::Panicked => Some((name.clone(), "panicked")),
                Life::Returned => Some((name.clone(), "returned")),
            })
            .collect();
        if dead.is_empty() {
            Health::Ok
        } else {
            Health::Dead(dead)
        }
    }

    /// The threads registered as running now.
    pub fn running(&self) -> Vec<String> {
        self.lives
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, life)| **life == Life::Running)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// Held by a running thread; its drop records how the thread ended.
#[derive(Debug)]
pub struct Alive {
    threads: Arc<Threads>,
    name: String,
    kind: Kind,
}

impl Drop for Alive {
    fn drop(&mut self) {
        let stopping = self.threads.stopping.load(Ordering::SeqCst);
        let end = if std::thread::panicking() {
            Some(Life::Panicked)
        } else if self.kind == Kind::Essential && !stopping {
            Some(Life::Returned)
        } else {
            None
        };
        let mut lives = self
            .threads
            .lives
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match end {
            Some(life) => {
                tracing::error!(thread = %self.name, how = ?life, "a daemon thread died: /healthz answers 503 until the daemon is restarted");
                lives.insert(self.name.clone(), life);
            }
            None => {
                lives.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicked_or_returned_essential_thread_is_dead_and_a_finished_worker_is_forgotten() {
        let threads = Arc::new(Threads::default());
        let follow = threads.enter("follow", Kind::Essential);
        let worker = threads.enter("topology-a", Kind::Transient);
        assert_eq!(threads.health(), Health::Ok);
        assert_eq!(threads.running(), ["follow", "topology-a"]);

        // A worker whose topology went away: no death.
        drop(worker);
        assert_eq!(threads.health(), Health::Ok);
        assert_eq!(threads.running(), ["follow"]);

        // A worker that panics is dead until another of its name starts.
        let alive = threads.enter("topology-b", Kind::Transient);
        let panicked = std::thread::spawn(move || {
            let _alive = alive;
            panic!("injected");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(
            threads.health(),
            Health::Dead(vec![("topology-b".into(), "panicked")])
        );
        assert_eq!(
            threads.health().text(),
            "dead threads: topology-b (panicked)\n"
        );
        let again = threads.enter("topology-b", Kind::Transient);
        assert_eq!(threads.health(), Health::Ok);

        // An essential thread that returns while the daemon runs is dead too.
        drop(follow);
        assert_eq!(
            threads.health(),
            Health::Dead(vec![("follow".into(), "returned")])
        );

        // Once stopping, threads end as they should.
        threads.stop();
        drop(again);
        let plans = threads.enter("plans", Kind::Essential);
        drop(plans);
        assert_eq!(threads.health(), Health::Stopping);
        assert_eq!(threads.running(), Vec::<String>::new());
    }
}
