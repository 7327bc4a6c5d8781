//! The local runtime: each processor instance is a `plumber-processor` process on this
//! machine (plus its sidecar for an `http` step with a `command`), supervised by a thread that
//! restarts crashed instances with exponential backoff.
//!
//! What should run is recorded in `STATE_DIR/processes/`: `<group>.json` (the spec) and
//! `<group>.<n>.pid` (the running instance's pid and start time, and on a second line
//! `metrics <address>`, where it serves `/metrics`). Instances run in their own
//! process groups, so a daemon killed outright leaves them running; the next daemon on the
//! same state directory adopts the live ones (same pid and start time) and restarts the others,
//! so one instance never runs twice. A daemon killed between starting an instance and
//! recording its pid leaves an instance no pid file names: every instance carries
//! [`INSTANCE_ENV`] in its environment, and the next daemon stops the ones it cannot adopt.
//! Adoption checks that the recorded pid is still this runtime's instance: the same start time,
//! [`INSTANCE_ENV`] and [`INSTANCE_OF_ENV`] in its environment and, for a processor, its group
//! on its command line, so a reused pid of a stranger is never adopted or signalled.
//!
//! An instance stops in order: SIGTERM to the processor, and only once it has exited (its
//! last record may still need the server) SIGTERM to its sidecar. Whatever outlives the stop
//! timeout is killed with its whole process group (an `exec` transform's children too), and
//! what is left in a group once its leader has exited is killed as well. Every child is
//! reaped. A stop returns once each processor has exited or its `/metrics` says its final
//! commit is made (its group's offsets do not move again: a replaced step's successor need
//! not wait for it to leave its group and close); the supervisor finishes the rest.
//!
//! Logs go to `STATE_DIR/logs/<group>.<n>.log`; past [`LocalConfig::max_log_bytes`] a log is
//! copied to `<group>.<n>.log.1` (replacing the previous one) and emptied.

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use super::args::{Placement, plain_env, processor_args};
use super::{Error, MetricsEndpoint, ProcessorSpec, ProcessorStatus, Result, Runtime};

/// Set on every processor and sidecar to the runtime's `processes` directory, so that a later
/// daemon on the same state directory finds the instances it has no pid file for.
pub const INSTANCE_ENV: &str = "PLUMBER_LOCAL_RUNTIME";

/// Set on every processor and sidecar to `<group>.<index>`: which instance it is, checked
/// before a recorded pid is adopted.
pub const INSTANCE_OF_ENV: &str = "PLUMBER_LOCAL_INSTANCE";

/// What processors, their `exec` children and their `http` servers see of the daemon's own
/// environment: enough to find programs and speak the user's language, nothing that could
/// hold a secret (`PLUMBER_GIT_PASSWORD`, cloud credentials, tokens of the daemon's shell).
/// Everything else they get is what Plumber passes and what the step's `env:` declares.
pub const INHERITED_ENV: [&str; 9] = [
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "RUST_LOG",
    "RUST_BACKTRACE",
];

/// The daemon's values of [`INHERITED_ENV`].
pub(crate) fn inherited_env() -> impl Iterator<Item = (&'static str, std::ffi::OsString)> {
    INHERITED_ENV
        .into_iter()
        .filter_map(|name| std::env::var_os(name).map(|value| (name, value)))
}

/// How long a process killed with SIGKILL may take to disappear before it is given up on (it
/// can only be stuck in the kernel, e.g. on a dead network file system).
const KILL_GRACE: Duration = Duration::from_secs(5);
use crate::durable;
use crate::spec::{EnvValue, Resources, Scale, Transform};

/// Settings of the local runtime.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The `plumber-processor` executable.
    pub processor: PathBuf,
    /// How long a graceful stop may take before the instance is killed. The processor exits
    /// within 10 s of SIGTERM; the rest is slack for a loaded machine.
    pub stop_timeout: Duration,
    /// The longest wait before restarting an instance that keeps crashing.
    pub max_backoff: Duration,
    /// A log larger than this is rotated (one previous file is kept), so logs take at most
    /// about twice this per instance.
    pub max_log_bytes: u64,
    /// Where the checkouts of commits are (`<checkouts>/<commit>`): `exec` and `http`
    /// commands run in their step's directory there.
    pub checkouts: PathBuf,
    /// `plumber up --secrets DIR`: the value of `secretKeyRef: { name, key }` is the file
    /// `DIR/<name>/<key>`.
    pub secrets: Option<PathBuf>,
    /// `plumber up --kafka-credentials DIR`: the credentials of every cluster that has some.
    pub kafka_credentials: Option<PathBuf>,
}

impl LocalConfig {
    /// `$PLUMBER_PROCESSOR`, else `plumber-processor` next to the running executable (as
    /// cargo and the release archive lay them out), else from `PATH`.
    pub fn find_processor() -> PathBuf {
        if let Some(explicit) = std::env::var_os("PLUMBER_PROCESSOR") {
            return PathBuf::from(explicit);
        }
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("plumber-processor")))
            .filter(|candidate| candidate.is_file())
            .unwrap_or_else(|| PathBuf::from("plumber-processor"))
    }
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            processor: Self::find_processor(),
            stop_timeout: Duration::from_secs(30),
            max_backoff: Duration::from_secs(30),
            max_log_bytes: 16 * 1024 * 1024,
            checkouts: PathBuf::from("checkouts"),
            secrets: None,
            kafka_credentials: None,
        }
    }
}

pub struct LocalRuntime {
    shared: Arc<Shared>,
    supervisor: Option<JoinHandle<()>>,
}

struct Shared {
    config: LocalConfig,
    processes: PathBuf,
    logs: PathBuf,
    managed: Mutex<BTreeMap<String, Managed>>,
    /// Stopped instances whose processor has made its final commit, still exiting.
    lingering: Mutex<Vec<Stopping>>,
    shutdown: AtomicBool,
    /// Set by [`LocalRuntime::stop_all`] with `managed` held: nothing starts afterwards (a
    /// worker still in an action when the daemon stops would leave its processor behind).
    closed: AtomicBool,
}

struct Managed {
    spec: ProcessorSpec,
    instances: Vec<Instance>,
    restarts: u32,
}

struct Instance {
    index: u32,
    running: Option<Running>,
    /// The previous run, still stopping: no new run starts before it is gone.
    stopping: Option<Stopping>,
    /// Consecutive failed runs, for the backoff.
    failures: u32,
    next_start: Instant,
    /// Asked to restart: its exit is not a failure.
    planned_restart: bool,
}

struct Running {
    processor: Proc,
    sidecar: Option<Proc>,
    since: Instant,
    /// Where the processor serves `/metrics` (on loopback); `None` for one adopted from a
    /// daemon that did not record it.
    metrics: Option<SocketAddr>,
}

/// A process we started (and reap), or one a previous daemon started (adopted by pid). Each
/// leads its own process group.
enum Proc {
    /// `status` is set once it has been reaped: from then on its pid is no longer ours.
    Child {
        child: Child,
        status: Option<String>,
    },
    Adopted {
        pid: i32,
        start_time: u64,
    },
}

impl Proc {
    fn child(child: Child) -> Proc {
        Proc::Child {
            child,
            status: None,
        }
    }

    fn pid(&self) -> i32 {
        match self {
            Proc::Child { child, .. } => child.id() as i32,
            Proc::Adopted { pid, .. } => *pid,
        }
    }

    fn start_time(&self) -> u64 {
        process_start_time(self.pid()).unwrap_or(0)
    }

    /// Whether its pid still names it: an unreaped child (running or a zombie), or an adopted
    /// process with its start time.
    fn owns_pid(&self) -> bool {
        match self {
            Proc::Child { status, .. } => status.is_none(),
            Proc::Adopted { pid, start_time } => process_start_time(*pid) == Some(*start_time),
        }
    }

    /// `None` while running; the exit description once it has exited (a child is reaped).
    fn exited(&mut self) -> Option<String> {
        match self {
            Proc::Child { child, status } => {
                if status.is_none() {
                    *status = match child.try_wait() {
                        Ok(None) => None,
                        Ok(Some(exit)) => Some(exit.to_string()),
                        Err(error) => Some(format!("cannot wait for it: {error}")),
                    };
                }
                status.clone()
            }
            Proc::Adopted { .. } => {
                (!self.owns_pid()).then(|| "exited (adopted, status unknown)".into())
            }
        }
    }

    /// Signals the process itself; nothing once its pid may belong to another process.
    fn signal(&self, signal: Signal) {
        if self.owns_pid() {
            // An instance that exited meanwhile is fine: that is what a stop wants.
            let _ = kill(Pid::from_raw(self.pid()), signal);
        }
    }

    /// SIGKILLs its whole process group: its children (an `exec` transform, a server's
    /// workers) die with it.
    fn kill_group(&self) {
        if self.owns_pid() {
            let _ = killpg(Pid::from_raw(self.pid()), Signal::SIGKILL);
        }
    }
}

/// SIGKILLs what is left of the process group `leader` led once the leader is gone: only
/// processes tagged as this runtime's, so a stranger is never hit.
fn kill_leftovers(processes: &Path, leader: i32) {
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| process_group(*pid) == Some(leader) && is_tagged(*pid, processes))
    {
        tracing::warn!(pid, leader, "killing a process its instance left behind");
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// An instance being stopped: the processor first, its sidecar once the processor is gone,
/// each with SIGTERM, then SIGKILL to its group after the timeout, then reaped.
struct Stopping {
    /// What is still to stop, in order.
    procs: Vec<Proc>,
    /// When the first of `procs` got its current signal; `None` before it got one.
    signalled: Option<(Signal, Instant)>,
    /// Something had to be killed.
    killed: bool,
    /// Where the processor serves `/metrics` while it stops.
    metrics: Option<SocketAddr>,
    /// The processor exited, or said after SIGTERM that its final commit is made: its
    /// group's offsets will not move again (what is left is leaving the group and closing).
    settled: bool,
}

impl Stopping {
    fn new(running: Running) -> Stopping {
        Stopping {
            procs: std::iter::once(running.processor)
                .chain(running.sidecar)
                .collect(),
            signalled: None,
            killed: false,
            metrics: running.metrics,
            settled: false,
        }
    }

    /// Whether the processor is settled ([`Stopping::settled`]); reads its page when it may
    /// have become so.
    fn is_settled(&mut self) -> bool {
        if !self.settled
            && let (Some(addr), Some((Signal::SIGTERM, _))) = (self.metrics, self.signalled)
        {
            self.settled = super::metrics::final_commit_made(addr);
        }
        self.settled
    }

    /// Moves the stop on without blocking; true once everything has exited and been reaped.
    fn advance(&mut self, timeout: Duration, processes: &Path) -> bool {
        while let Some(current) = self.procs.first_mut() {
            if current.exited().is_some() {
                kill_leftovers(processes, current.pid());
                self.procs.remove(0);
                self.signalled = None;
                // The processor goes first.
                self.settled = true;
                continue;
            }
            match self.signalled {
                None => {
                    current.signal(Signal::SIGTERM);
                    self.signalled = Some((Signal::SIGTERM, Instant::now()));
                }
                Some((Signal::SIGTERM, since)) if since.elapsed() >= timeout => {
                    tracing::warn!(
                        pid = current.pid(),
                        seconds = timeout.as_secs(),
                        "did not stop in time; killing its process group"
                    );
                    current.kill_group();
                    self.killed = true;
                    self.signalled = Some((Signal::SIGKILL, Instant::now()));
                }
                Some((Signal::SIGKILL, since)) if since.elapsed() >= KILL_GRACE => {
                    tracing::error!(
                        pid = current.pid(),
                        "still there after SIGKILL (stuck in the kernel); giving up on it"
                    );
                    self.procs.remove(0);
                    self.signalled = None;
                    self.settled = true;
                    continue;
                }
                Some(_) => {}
            }
            return false;
        }
        true
    }

    /// Stops everything in `stops` together, blocking until all are done. True if something
    /// had to be killed.
    fn finish_all(mut stops: Vec<Stopping>, timeout: Duration, processes: &Path) -> bool {
        loop {
            let mut done = true;
            for stop in &mut stops {
                done &= stop.advance(timeout, processes);
            }
            if done {
                return stops.iter().any(|stop| stop.killed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops everything in `stops` together, blocking until every processor is settled;
    /// returns whether something had to be killed, and what is still to exit (processors
    /// leaving their group, sidecars), which the supervisor finishes.
    fn settle_all(
        mut stops: Vec<Stopping>,
        timeout: Duration,
        processes: &Path,
    ) -> (bool, Vec<Stopping>) {
        let mut killed = false;
        loop {
            stops.retain_mut(|stop| {
                let done = stop.advance(timeout, processes);
                killed |= done && stop.killed;
                !done
            });
            if stops.iter_mut().all(Stopping::is_settled) {
                killed |= stops.iter().any(|stop| stop.killed);
                return (killed, stops);
            }
            // A replaced step's output waits on this look.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The fields of `/proc/PID/stat` after the command, from the state (field 3) on; `None` for
/// a process that is gone or a zombie.
fn live_stat(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<String> = after.split_whitespace().map(str::to_owned).collect();
    (fields.first().is_some_and(|state| state != "Z")).then_some(fields)
}

/// The start time of a live process (field 22), in clock ticks since boot: with the pid, it
/// identifies a process across pid reuse.
fn process_start_time(pid: i32) -> Option<u64> {
    live_stat(pid)?.get(19)?.parse().ok()
}

/// The process group of a live process (field 5).
fn process_group(pid: i32) -> Option<i32> {
    live_stat(pid)?.get(2)?.parse().ok()
}

/// The `NAME=value` strings of a live process's environment (as it started); empty when it
/// cannot be read.
fn environment(pid: i32) -> Vec<Vec<u8>> {
    fs::read(format!("/proc/{pid}/environ"))
        .map(|environ| environ.split(|b| *b == 0).map(<[u8]>::to_vec).collect())
        .unwrap_or_default()
}

fn env_entry(name: &str, value: &[u8]) -> Vec<u8> {
    let mut entry = format!("{name}=").into_bytes();
    entry.extend_from_slice(value);
    entry
}

/// Whether `pid` carries this runtime's tag ([`INSTANCE_ENV`] = `processes`).
fn is_tagged(pid: i32, processes: &Path) -> bool {
    let tag = env_entry(INSTANCE_ENV, processes.as_os_str().as_encoded_bytes());
    environment(pid).contains(&tag)
}

/// Whether `pid`, started at `start_time`, is instance `index` of `group` of this runtime:
/// its processor (`sidecar` false; its command line names the group) or its sidecar.
fn is_instance(
    pid: i32,
    start_time: u64,
    processes: &Path,
    group: &str,
    index: u32,
    sidecar: bool,
) -> bool {
    if process_start_time(pid) != Some(start_time) || !is_tagged(pid, processes) {
        return false;
    }
    let instance = env_entry(INSTANCE_OF_ENV, format!("{group}.{index}").as_bytes());
    if !environment(pid).contains(&instance) {
        return false;
    }
    sidecar
        || fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.windows(2)
                .any(|pair| pair[0] == b"--group" && pair[1] == group.as_bytes())
        })
}

/// Stops the instances of this runtime (tagged with [`INSTANCE_ENV`] = `processes`) that are
/// not `adopted`: a daemon killed after starting them but before recording their pids left
/// them running, and the supervisor is about to start their replacements. Gracefully, within
/// `timeout`, then SIGKILL. Only process-group leaders count: an exec transform's child or a
/// sidecar's workers inherit the tag but go with their leader.
fn stop_unrecorded(processes: &Path, adopted: &[i32], timeout: Duration) {
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    let unrecorded: Vec<(i32, u64)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !adopted.contains(pid) && process_group(*pid) == Some(*pid))
        .filter(|pid| is_tagged(*pid, processes))
        .filter_map(|pid| Some((pid, process_start_time(pid)?)))
        .collect();
    for (pid, _) in &unrecorded {
        tracing::warn!(
            pid,
            "stopping an instance a killed daemon started but did not record"
        );
        let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + timeout;
    for (pid, start_time) in unrecorded {
        while process_start_time(pid) == Some(start_time) {
            if Instant::now() >= deadline {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl LocalRuntime {
    /// Opens the runtime on `state_dir`, adopting the instances a previous daemon left running
    /// and restarting the others.
    pub fn open(state_dir: &Path, config: LocalConfig) -> Result<Self> {
        let processes = state_dir.join("processes");
        let logs = state_dir.join("logs");
        for dir in [&processes, &logs] {
            fs::create_dir_all(dir).map_err(|e| Error::Backend {
                operation: "record processes in",
                group: dir.display().to_string(),
                message: e.to_string(),
                retryable: false,
            })?;
        }
        // Canonical, as it is also the tag of this runtime's instances (`INSTANCE_ENV`).
        let processes = fs::canonicalize(&processes).unwrap_or(processes);
        let mut managed = BTreeMap::new();
        for spec in recorded_specs(&processes) {
            let instances = (0..instances_of(&spec))
                .map(|index| {
                    let running = adopt(&processes, &spec.group, index);
                    if let Some(r) = &running {
                        tracing::info!(group = %spec.group, index, pid = r.processor.pid(), "adopted a running instance");
                    }
                    Instance {
                        index,
                        running,
                        stopping: None,
                        failures: 0,
                        next_start: Instant::now(),
                        planned_restart: false,
                    }
                })
                .collect();
            managed.insert(
                spec.group.clone(),
                Managed {
                    spec,
                    instances,
                    restarts: 0,
                },
            );
        }
        let adopted: Vec<i32> = managed
            .values()
            .flat_map(|m| &m.instances)
            .filter_map(|i| i.running.as_ref())
            .flat_map(|r| std::iter::once(&r.processor).chain(&r.sidecar))
            .map(Proc::pid)
            .collect();
        stop_unrecorded(&processes, &adopted, config.stop_timeout);
        let shared = Arc::new(Shared {
            config,
            processes,
            logs,
            managed: Mutex::new(managed),
            lingering: Mutex::default(),
            shutdown: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        let supervisor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("local-runtime".into())
                .spawn(move || shared.supervise())
                .map_err(|e| Error::Start {
                    group: "-".into(),
                    message: format!("cannot start the supervisor thread: {e}"),
                    retryable: false,
                })?
        };
        Ok(LocalRuntime {
            shared,
            supervisor: Some(supervisor),
        })
    }

    /// Stops every processor gracefully (the daemon is stopping), and starts nothing more.
    /// Their records stay, so the next daemon starts them again.
    pub fn stop_all(&self) {
        let taken: Vec<Managed> = {
            let mut managed = self.shared.managed();
            self.shared.closed.store(true, Ordering::SeqCst);
            std::mem::take(&mut *managed).into_values().collect()
        };
        // All at once: each may take its full graceful-stop time.
        std::thread::scope(|scope| {
            for mut m in taken {
                scope.spawn(move || {
                    if let Err(error) = self.shared.terminate(&mut m) {
                        tracing::warn!(%error, "stopping on shutdown");
                    }
                });
            }
        });
        // Nothing outlives the daemon unreaped.
        let lingering = std::mem::take(&mut *self.shared.lingering());
        Stopping::finish_all(
            lingering,
            self.shared.config.stop_timeout,
            &self.shared.processes,
        );
    }
}

impl Drop for LocalRuntime {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        if let Some(supervisor) = self.supervisor.take() {
            let _ = supervisor.join();
        }
    }
}

/// How many instances run locally: `scale.min`, at least one (nothing scales on lag here).
fn instances_of(spec: &ProcessorSpec) -> u32 {
    spec.scale.min.max(1)
}

fn recorded_specs(processes: &Path) -> Vec<ProcessorSpec> {
    let Ok(entries) = fs::read_dir(processes) else {
        return Vec::new();
    };
    let mut specs = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            match fs::read(&path).map(|b| serde_json::from_slice::<ProcessorSpec>(&b)) {
                Ok(Ok(spec)) => specs.push(spec),
                Ok(Err(error)) => {
                    tracing::error!(path = %path.display(), %error, "damaged process record; move it away")
                }
                Err(error) => {
                    tracing::error!(path = %path.display(), %error, "cannot read process record")
                }
            }
        }
    }
    specs
}

fn pid_file(processes: &Path, group: &str, index: u32) -> PathBuf {
    processes.join(format!("{group}.{index}.pid"))
}

/// The instance a previous daemon recorded, if it still runs and is still that instance.
fn adopt(processes: &Path, group: &str, index: u32) -> Option<Running> {
    let text = fs::read_to_string(pid_file(processes, group, index)).ok()?;
    let numbers: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let live = |pid: u64, start: u64, sidecar: bool| {
        let pid = i32::try_from(pid).ok()?;
        if is_instance(pid, start, processes, group, index, sidecar) {
            return Some(Proc::Adopted {
                pid,
                start_time: start,
            });
        }
        if process_start_time(pid).is_some() {
            tracing::warn!(
                group,
                index,
                pid,
                "the recorded pid now belongs to another process; not adopting it"
            );
        }
        None
    };
    let processor = live(*numbers.first()?, *numbers.get(1)?, false)?;
    // The pair or neither: a processor whose sidecar is gone is stopped as unrecorded, and
    // the pair starts again.
    let sidecar = match (numbers.get(2), numbers.get(3)) {
        (Some(&pid), Some(&start)) => Some(live(pid, start, true)?),
        _ => None,
    };
    Some(Running {
        processor,
        sidecar,
        since: Instant::now(),
        metrics: recorded_metrics(&text),
    })
}

/// The line of a pid file that says where the instance serves `/metrics`.
const METRICS_RECORD: &str = "metrics";

/// Where a pid file says its instance serves `/metrics`.
fn recorded_metrics(pid_file: &str) -> Option<SocketAddr> {
    pid_file.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == METRICS_RECORD).then(|| value.trim().parse().ok())?
    })
}

impl Shared {
    fn managed(&self) -> MutexGuard<'_, BTreeMap<String, Managed>> {
        self.managed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lingering(&self) -> MutexGuard<'_, Vec<Stopping>> {
        self.lingering
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn supervise(&self) {
        while !self.shutdown.load(Ordering::SeqCst) {
            {
                let mut managed = self.managed();
                for m in managed.values_mut() {
                    self.tend(m);
                    for instance in &m.instances {
                        self.rotate_log(&m.spec.group, instance.index);
                    }
                }
            }
            self.lingering()
                .retain_mut(|stop| !stop.advance(self.config.stop_timeout, &self.processes));
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Notices exits, moves stops on and starts what is due. Never blocks on a process.
    fn tend(&self, m: &mut Managed) {
        for instance in &mut m.instances {
            if let Some(stopping) = &mut instance.stopping
                && stopping.advance(self.config.stop_timeout, &self.processes)
            {
                instance.stopping = None;
            }
            if let Some(running) = &mut instance.running {
                let processor_exit = running.processor.exited();
                let sidecar_exit = running.sidecar.as_mut().and_then(Proc::exited);
                if processor_exit.is_none() && sidecar_exit.is_none() {
                    continue;
                }
                tracing::warn!(
                    group = %m.spec.group,
                    index = instance.index,
                    processor = processor_exit.as_deref().unwrap_or("running"),
                    sidecar = sidecar_exit.as_deref().unwrap_or("running or none"),
                    "instance exited; restarting"
                );
                // A run that lasted a minute was healthy: the backoff starts over.
                if running.since.elapsed() > Duration::from_secs(60) || instance.planned_restart {
                    instance.failures = 0;
                }
                if !instance.planned_restart {
                    instance.failures += 1;
                }
                instance.planned_restart = false;
                let backoff = match instance.failures {
                    0 => Duration::ZERO,
                    n => Duration::from_millis(250)
                        .saturating_mul(1 << n.min(10))
                        .min(self.config.max_backoff),
                };
                instance.next_start = Instant::now() + backoff;
                // The pair runs together: a processor without its sidecar only fails records,
                // so what is left of it stops (processor first) before the next run starts.
                if let Some(running) = instance.running.take() {
                    let mut stopping = Stopping::new(running);
                    if !stopping.advance(self.config.stop_timeout, &self.processes) {
                        instance.stopping = Some(stopping);
                    }
                }
                m.restarts += 1;
            }
            if instance.running.is_none()
                && instance.stopping.is_none()
                && Instant::now() >= instance.next_start
            {
                match self.spawn(&m.spec, instance.index) {
                    Ok(running) => instance.running = Some(running),
                    Err(error) => {
                        tracing::error!(%error, group = %m.spec.group, index = instance.index, "cannot start instance");
                        instance.failures += 1;
                        instance.next_start = Instant::now() + self.config.max_backoff;
                    }
                }
            }
        }
    }

    fn log_path(&self, group: &str, index: u32) -> PathBuf {
        self.logs.join(format!("{group}.{index}.log"))
    }

    /// Past the size limit, the log is copied to `<log>.1` and emptied. Copied, not renamed:
    /// the instance keeps writing to the file it inherited (opened to append, so it goes on at
    /// the new end). Lines written between the copy and the truncation are lost.
    fn rotate_log(&self, group: &str, index: u32) {
        let log = self.log_path(group, index);
        if fs::metadata(&log).map_or(true, |m| m.len() <= self.config.max_log_bytes) {
            return;
        }
        let previous = self.logs.join(format!("{group}.{index}.log.1"));
        let rotated = fs::copy(&log, &previous).and_then(|_| {
            fs::OpenOptions::new()
                .write(true)
                .open(&log)
                .and_then(|file| file.set_len(0))
        });
        if let Err(error) = rotated {
            tracing::warn!(log = %log.display(), %error, "cannot rotate the log");
        }
    }

    fn spawn(&self, spec: &ProcessorSpec, index: u32) -> Result<Running> {
        let start_error = |message: String| Error::Start {
            group: spec.group.clone(),
            message,
            retryable: true,
        };
        // Checkouts hold only the directories of steps that run commands there.
        let workdir = match &spec.transform {
            Transform::Exec { .. } | Transform::Http { .. } => {
                self.config.checkouts.join(&spec.commit).join(&spec.dir)
            }
            Transform::Jq { .. } | Transform::Sql { .. } => {
                self.config.checkouts.join(&spec.commit)
            }
        };
        let env = self.environment(spec)?;
        let credentials = self.credentials(spec)?;
        let log_path = self.log_path(&spec.group, index);
        let instance_of = format!("{}.{index}", spec.group);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| start_error(format!("cannot open {}: {e}", log_path.display())))?;
        let stderr = log
            .try_clone()
            .map_err(|e| start_error(format!("cannot open {}: {e}", log_path.display())))?;
        let mut sidecar = None;
        let mut http_port = None;
        if let Transform::Http {
            command: Some(server),
            ..
        } = &spec.transform
        {
            // Each instance gets its own server on a free port, given as $PORT.
            let port = free_port().map_err(|e| start_error(format!("no free port: {e}")))?;
            let (program, args) = server
                .split_first()
                .ok_or_else(|| start_error("empty http command".into()))?;
            let child = Command::new(program)
                .args(args)
                .current_dir(&workdir)
                .env_clear()
                .envs(inherited_env())
                .envs(&env)
                .env("PORT", port.to_string())
                .env(INSTANCE_ENV, &self.processes)
                .env(INSTANCE_OF_ENV, &instance_of)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| start_error(e.to_string()))?)
                .stderr(log.try_clone().map_err(|e| start_error(e.to_string()))?)
                .process_group(0)
                .spawn()
                .map_err(|e| start_error(format!("cannot run the http server {program}: {e}")))?;
            sidecar = Some(Proc::child(child));
            http_port = Some(port);
        }
        let index_name = index.to_string();
        // A free loopback port per instance, as for the sidecar: should another process take
        // it first, the processor exits for want of it and its next run gets another.
        let metrics = SocketAddr::from((
            std::net::Ipv4Addr::LOCALHOST,
            free_port().map_err(|e| start_error(format!("no free port: {e}")))?,
        ));
        let metrics_arg = metrics.to_string();
        let placement = Placement {
            instance: Some(&index_name),
            http_port,
            credentials,
            metrics: Some(&metrics_arg),
        };
        let mut command = Command::new(&self.config.processor);
        command.args(processor_args(spec, &placement));
        let processor = command
            .current_dir(&workdir)
            .env_clear()
            .envs(inherited_env())
            .envs(&env)
            .env(INSTANCE_ENV, &self.processes)
            .env(INSTANCE_OF_ENV, &instance_of)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            // Its own process group: a Ctrl-C meant for the daemon does not reach it, and it
            // outlives a daemon killed outright (the next one adopts it).
            .process_group(0)
            .spawn()
            .map_err(|e| {
                start_error(format!(
                    "cannot run {}: {e}",
                    self.config.processor.display()
                ))
            })?;
        let running = Running {
            processor: Proc::child(processor),
            sidecar,
            since: Instant::now(),
            metrics: Some(metrics),
        };
        let mut record = format!(
            "{} {}",
            running.processor.pid(),
            running.processor.start_time()
        );
        if let Some(sidecar) = &running.sidecar {
            record.push_str(&format!(" {} {}", sidecar.pid(), sidecar.start_time()));
        }
        // On a line of its own: a daemon that knows only the pids reads the first line.
        record.push_str(&format!("\n{METRICS_RECORD} {metrics}\n"));
        let path = pid_file(&self.processes, &spec.group, index);
        if let Err(source) = durable::write(&path, record.as_bytes()) {
            tracing::warn!(error = %source, "cannot record the pid; a restarted daemon will not adopt this instance");
        }
        tracing::info!(group = %spec.group, index, pid = running.processor.pid(), log = %log_path.display(), %metrics, "instance started");
        Ok(running)
    }

    /// Stops every instance of `m` gracefully and waits (each processor before its sidecar,
    /// all instances together); kills what outlives the timeout, and reaps everything.
    fn terminate(&self, m: &mut Managed) -> Result<()> {
        let stops: Vec<Stopping> = m
            .instances
            .iter_mut()
            .flat_map(|instance| {
                let previous = instance.stopping.take();
                previous
                    .into_iter()
                    .chain(instance.running.take().map(Stopping::new))
            })
            .collect();
        let (killed, lingering) =
            Stopping::settle_all(stops, self.config.stop_timeout, &self.processes);
        self.lingering().extend(lingering);
        for instance in &m.instances {
            let _ = fs::remove_file(pid_file(&self.processes, &m.spec.group, instance.index));
        }
        if killed {
            return Err(Error::Stop {
                group: m.spec.group.clone(),
                message: format!(
                    "its instances did not exit within {} s of SIGTERM and were killed",
                    self.config.stop_timeout.as_secs()
                ),
            });
        }
        Ok(())
    }

    fn record(&self, spec: &ProcessorSpec) -> Result<()> {
        let path = self.processes.join(format!("{}.json", spec.group));
        let failed = |message: String| Error::Backend {
            operation: "record",
            group: spec.group.clone(),
            message: format!("{}: {message}", path.display()),
            retryable: true,
        };
        let bytes = serde_json::to_vec_pretty(spec).map_err(|e| failed(e.to_string()))?;
        durable::write(&path, &bytes).map_err(|e| failed(e.to_string()))
    }

    /// The credentials directory for the processor's cluster, if it has credentials.
    fn credentials(&self, spec: &ProcessorSpec) -> Result<Option<&Path>> {
        match (&spec.cluster.credentials, &self.config.kafka_credentials) {
            (None, _) => Ok(None),
            (Some(_), Some(dir)) => Ok(Some(dir.as_path())),
            (Some(secret), None) => Err(Error::Start {
                group: spec.group.clone(),
                message: format!(
                    "its cluster takes its credentials from `{secret}`: give them to \
                     `plumber up --kafka-credentials DIR`, one file per property"
                ),
                retryable: false,
            }),
        }
    }

    /// The step's `env:` with its secret references read from `--secrets DIR`.
    fn environment(&self, spec: &ProcessorSpec) -> Result<BTreeMap<String, String>> {
        let mut env: BTreeMap<String, String> = plain_env(spec)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        for (name, value) in &spec.env {
            let EnvValue::Secret { secret_key_ref } = value else {
                continue;
            };
            let missing = |message: String| Error::Start {
                group: spec.group.clone(),
                message,
                // Creating the file fixes it; no commit needed.
                retryable: true,
            };
            let Some(dir) = &self.config.secrets else {
                return Err(missing(format!(
                    "`{name}` comes from secret `{}`: give `plumber up --secrets DIR` with \
                     the file DIR/{}/{}",
                    secret_key_ref.name, secret_key_ref.name, secret_key_ref.key
                )));
            };
            let path = dir.join(&secret_key_ref.name).join(&secret_key_ref.key);
            let value = fs::read_to_string(&path)
                .map_err(|e| missing(format!("`{name}` comes from {}: {e}", path.display())))?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            env.insert(name.clone(), value.to_owned());
        }
        Ok(env)
    }
}

pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Runtime for LocalRuntime {
    fn start(&self, spec: &ProcessorSpec) -> Result<()> {
        let mut managed = self.shared.managed();
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(Error::Start {
                group: spec.group.clone(),
                message: "the daemon is stopping: nothing starts any more (the next start of the daemon starts it)".into(),
                retryable: true,
            });
        }
        if let Some(existing) = managed.get(&spec.group) {
            if existing.spec.identity == spec.identity {
                return Ok(());
            }
            return Err(Error::Start {
                group: spec.group.clone(),
                message: "another identity runs under this group name".into(),
                retryable: false,
            });
        }
        // What every instance needs is checked here, so the engine sees (and status shows)
        // why a processor cannot start, instead of instances failing in the background.
        self.shared.environment(spec)?;
        self.shared.credentials(spec)?;
        self.shared.record(spec)?;
        let mut m = Managed {
            spec: spec.clone(),
            instances: (0..instances_of(spec))
                .map(|index| Instance {
                    index,
                    running: None,
                    stopping: None,
                    failures: 0,
                    next_start: Instant::now(),
                    planned_restart: false,
                })
                .collect(),
            restarts: 0,
        };
        self.shared.tend(&mut m);
        managed.insert(spec.group.clone(), m);
        Ok(())
    }

    fn stop(&self, group: &str) -> Result<()> {
        // Out of the map first, so the supervisor does not restart what is stopping.
        let taken = self.shared.managed().remove(group);
        let result = match taken {
            Some(mut m) => self.shared.terminate(&mut m),
            None => Ok(()),
        };
        let _ = fs::remove_file(self.shared.processes.join(format!("{group}.json")));
        result
    }

    fn restart(&self, group: &str) -> Result<()> {
        // In place: the group stays managed, so a concurrent stop() still stops it for good.
        let mut managed = self.shared.managed();
        if let Some(m) = managed.get_mut(group) {
            for instance in &mut m.instances {
                if let Some(running) = &instance.running {
                    running.processor.signal(Signal::SIGTERM);
                    instance.planned_restart = true;
                }
            }
        }
        Ok(())
    }

    fn update(&self, group: &str, scale: &Scale, resources: Option<&Resources>) -> Result<()> {
        let mut removed = Vec::new();
        {
            let mut managed = self.shared.managed();
            let Some(m) = managed.get_mut(group) else {
                return Ok(());
            };
            // Resources mean nothing to local processes; they are kept for the record.
            m.spec.scale = *scale;
            m.spec.resources = resources.cloned();
            self.shared.record(&m.spec)?;
            let replicas = instances_of(&m.spec);
            while m.instances.len() as u32 > replicas {
                if let Some(instance) = m.instances.pop() {
                    removed.push(instance);
                }
            }
            while (m.instances.len() as u32) < replicas {
                m.instances.push(Instance {
                    index: m.instances.len() as u32,
                    running: None,
                    stopping: None,
                    failures: 0,
                    next_start: Instant::now(),
                    planned_restart: false,
                });
            }
        }
        if !removed.is_empty() {
            let spec = self.shared.managed().get(group).map(|m| m.spec.clone());
            if let Some(spec) = spec {
                let mut leaving = Managed {
                    spec,
                    instances: removed,
                    restarts: 0,
                };
                self.shared.terminate(&mut leaving)?;
            }
        }
        Ok(())
    }

    fn runs(&self, group: &str) -> Result<bool> {
        Ok(self.shared.managed().contains_key(group))
    }

    fn metrics_endpoints(&self) -> Result<BTreeMap<String, Vec<MetricsEndpoint>>> {
        Ok(self
            .shared
            .managed()
            .values()
            .map(|m| {
                let endpoints = m
                    .instances
                    .iter()
                    .filter_map(|instance| {
                        let running = instance.running.as_ref()?;
                        Some(MetricsEndpoint {
                            // A restarted instance has another pid, and counts from zero.
                            instance: format!("{}:{}", instance.index, running.processor.pid()),
                            addr: running.metrics?,
                        })
                    })
                    .collect();
                (m.spec.group.clone(), endpoints)
            })
            .collect())
    }

    fn processors(&self) -> Result<Vec<ProcessorStatus>> {
        Ok(self
            .shared
            .managed()
            .values()
            .map(|m| ProcessorStatus {
                topology: m.spec.topology.clone(),
                step: m.spec.step.clone(),
                identity: m.spec.identity.to_string(),
                group: m.spec.group.clone(),
                replicas: instances_of(&m.spec),
                running: m.instances.iter().filter(|i| i.running.is_some()).count() as u32,
                restarts: m.restarts,
                commit: Some(m.spec.commit.clone()),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sleeper(tag: Option<&Path>, own_group: bool) -> Child {
        let mut command = Command::new("sleep");
        command.arg("300");
        if let Some(tag) = tag {
            command.env(INSTANCE_ENV, tag);
        }
        if own_group {
            command.process_group(0);
        }
        command.spawn().unwrap()
    }

    #[test]
    fn the_metrics_address_is_read_from_its_own_line_of_the_pid_file() {
        assert_eq!(
            recorded_metrics("12 345 13 346\nmetrics 127.0.0.1:4040\n"),
            Some("127.0.0.1:4040".parse().unwrap())
        );
        // Recorded by a daemon before addresses were: the instance is adopted without one.
        assert_eq!(recorded_metrics("12 345"), None);
        assert_eq!(recorded_metrics("12 345\nmetrics nowhere\n"), None);
    }

    #[test]
    fn opening_stops_instances_a_killed_daemon_did_not_record() {
        let state = tempfile::tempdir().unwrap();
        let processes = state.path().join("processes");
        fs::create_dir_all(&processes).unwrap();
        let processes = fs::canonicalize(processes).unwrap();
        let other = state.path().join("elsewhere");
        // Started and tagged, but its pid never reached a pid file.
        let mut unrecorded = sleeper(Some(&processes), true);
        // An exec transform's child: tagged by inheritance, in its processor's group.
        let mut inherited = sleeper(Some(&processes), false);
        // Another runtime's instance, and a stranger.
        let mut foreign = sleeper(Some(&other), true);
        let mut stranger = sleeper(None, true);
        // A killed daemon's instance has long been running; this one has just been spawned,
        // so wait until /proc shows it as such (tagged, leading its group) before opening.
        let pid = unrecorded.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(is_tagged(pid, &processes) && process_group(pid) == Some(pid)) {
            assert!(
                Instant::now() < deadline,
                "the unrecorded instance shows its tag and group in /proc: {:?}",
                fs::read(format!("/proc/{pid}/environ")).map(|e| e.len())
            );
            std::thread::sleep(Duration::from_millis(20));
        }

        let config = LocalConfig {
            stop_timeout: Duration::from_secs(20),
            ..LocalConfig::default()
        };
        let runtime = LocalRuntime::open(state.path(), config).unwrap();

        // Signalled by `open`; it exits when the kernel gets to it (a loaded machine lags).
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            match unrecorded.try_wait().unwrap() {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => break None,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        assert!(
            status.is_some_and(|s| !s.success()),
            "the unrecorded instance is stopped: {status:?}"
        );
        for survivor in [&mut inherited, &mut foreign, &mut stranger] {
            assert!(survivor.try_wait().unwrap().is_none(), "left alone");
            survivor.kill().unwrap();
            survivor.wait().unwrap();
        }
        drop(runtime);
    }
}
