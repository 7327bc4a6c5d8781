//! What `GET /healthz` answers: whether every long-lived thread of the daemon still runs,
//! and none is wedged.
//!
//! Each thread holds an [`Alive`] from before it starts until it ends. A thread that panics
//! drops it while unwinding and is recorded as dead; so is an essential thread (the follower,
//! the planner, the observer, the publisher, the previews thread, the API's) that returns
//! while the daemon runs. A topology's worker may end (its topology was removed) and is then
//! forgotten; a new worker of the same name (the follower starts one at the next commit)
//! replaces a dead one.
//!
//! A thread that hangs without dying is seen through [`Threads::busy`]: each unit of work
//! (an engine step, a look at the branch, a plan pass, an observer look) is marked while it
//! runs, and one that runs longer than `wedged_after` (every call in it has a timeout well
//! below it) makes the daemon unhealthy, naming the thread and what it does. Waiting between
//! units is not work: a worker whose cutover waits for a drain is healthy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// What the daemon still waits for before it can serve (the runtime's watches not listed
/// yet); `None` once it can.
pub type Readiness = dyn Fn() -> Option<String> + Send + Sync;

/// How long one unit of a thread's work may run before the daemon is unhealthy, by default.
pub const DEFAULT_WEDGED_AFTER: Duration = Duration::from_secs(300);

/// The daemon's threads and whether each lives.
pub struct Threads {
    lives: Mutex<BTreeMap<String, Life>>,
    /// What each thread is busy with, and since when.
    busy: Mutex<BTreeMap<String, (&'static str, Instant)>>,
    wedged_after: Duration,
    stopping: AtomicBool,
    readiness: OnceLock<Arc<Readiness>>,
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads")
            .field("lives", &self.lives)
            .field("busy", &self.busy)
            .finish_non_exhaustive()
    }
}

impl Default for Threads {
    fn default() -> Self {
        Threads::new(DEFAULT_WEDGED_AFTER)
    }
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
    /// Threads alive but busy with one unit of work for longer than `wedged_after`.
    Wedged {
        /// Thread, what it does, for how many seconds.
        threads: Vec<(String, &'static str, u64)>,
        limit: Duration,
    },
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
            Health::Wedged { threads, limit } => {
                let names: Vec<String> = threads
                    .iter()
                    .map(|(name, doing, seconds)| format!("{name} ({doing} for {seconds} s)"))
                    .collect();
                format!(
                    "wedged threads: {} (limit {} s: --wedged-after, wedgedAfter in the daemon's configuration)\n",
                    names.join(", "),
                    limit.as_secs()
                )
            }
        }
    }
}

impl Threads {
    /// Threads whose units of work may each run `wedged_after` at most.
    pub fn new(wedged_after: Duration) -> Threads {
        Threads {
            lives: Mutex::default(),
            busy: Mutex::default(),
            wedged_after,
            stopping: AtomicBool::new(false),
            readiness: OnceLock::new(),
        }
    }

    /// What `/readyz` asks besides health (set once, when the daemon is built).
    pub fn wait_for(&self, readiness: Arc<Readiness>) {
        let _ = self.readiness.set(readiness);
    }

    /// What `GET /readyz` answers: ready when healthy and nothing is waited for; else why not.
    pub fn ready(&self) -> Result<(), String> {
        let health = self.health();
        if health != Health::Ok {
            return Err(health.text());
        }
        match self.readiness.get().and_then(|waits| waits()) {
            Some(waiting) => Err(format!("not ready: {waiting}\n")),
            None => Ok(()),
        }
    }

    /// Marks the calling thread busy with `doing` until the guard drops. Nested marks keep
    /// the outer one (its start is what counts).
    pub fn busy(self: &Arc<Self>, doing: &'static str) -> Busy {
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if busy.contains_key(&name) {
            return Busy { mark: None };
        }
        busy.insert(name.clone(), (doing, Instant::now()));
        Busy {
            mark: Some((self.clone(), name)),
        }
    }

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
        if !dead.is_empty() {
            return Health::Dead(dead);
        }
        drop(lives);
        let now = Instant::now();
        let wedged: Vec<(String, &'static str, u64)> = self
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, (_, since))| now.duration_since(*since) > self.wedged_after)
            .map(|(name, (doing, since))| {
                (name.clone(), *doing, now.duration_since(*since).as_secs())
            })
            .collect();
        if wedged.is_empty() {
            Health::Ok
        } else {
            Health::Wedged {
                threads: wedged,
                limit: self.wedged_after,
            }
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

/// Held while a thread does one unit of work ([`Threads::busy`]).
#[derive(Debug)]
pub struct Busy {
    mark: Option<(Arc<Threads>, String)>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some((threads, name)) = self.mark.take() {
            threads
                .busy
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&name);
        }
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

    #[test]
    fn a_unit_of_work_longer_than_the_limit_is_wedged_and_waiting_is_not() {
        let threads = Arc::new(Threads::new(Duration::from_millis(50)));
        let (started, wait) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("topology-a".into())
            .spawn({
                let threads = threads.clone();
                move || {
                    let _alive = threads.enter("topology-a", Kind::Transient);
                    {
                        let _busy = threads.busy("a step of the cutover engine");
                        // Nested: the outer mark stays.
                        drop(threads.busy("a Kafka call"));
                        let _ = started.send(());
                        let _ = released.recv();
                    }
                    // Idle between units: not wedged however long it waits.
                    let _ = released.recv();
                }
            })
            .unwrap();
        wait.recv().unwrap();
        plumber_testkit::wait_until("the step is wedged", Duration::from_secs(60), || {
            matches!(threads.health(), Health::Wedged { .. })
        });
        let Health::Wedged {
            threads: wedged, ..
        } = threads.health()
        else {
            unreachable!()
        };
        assert_eq!(wedged.len(), 1);
        assert_eq!(
            (wedged[0].0.as_str(), wedged[0].1),
            ("topology-a", "a step of the cutover engine")
        );
        assert!(threads.health().text().contains("--wedged-after"));
        release.send(()).unwrap();
        plumber_testkit::wait_until("the step ended", Duration::from_secs(60), || {
            threads.health() == Health::Ok
        });
        release.send(()).unwrap();
        worker.join().unwrap();
    }
}
