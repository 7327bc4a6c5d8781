//! A test kubelet: for every Pod the in-memory API server's workload controller makes, the
//! real `plumber-processor` runs as a process, from the Pod's container exactly as rendered
//! (its `args`, its `env` with `secretKeyRef`s resolved from the Secrets in the API,
//! `HOSTNAME` = the Pod's name, as a container runtime sets it), so that what the Kubernetes
//! runtime renders is what runs.
//!
//! # What it models
//! - **Graceful termination.** The Pods carry [`FINALIZER`] ([`FakeApi::with_pod_finalizer`]):
//!   a deleted Pod stays `Terminating` while its process gets SIGTERM and finishes (flush,
//!   commit, leave the group), then SIGKILL after the Pod's `terminationGracePeriodSeconds`;
//!   only once the process exited is the finalizer removed and the Pod gone. A runtime's stop
//!   that waits for the Pods to be gone has therefore waited for the processes to exit, as on
//!   a cluster. (tansu 0.6 cannot describe a group that has members, so the engine's
//!   group-empty wait cannot stand in for this there: see `tests/kafka_admin.rs`.)
//! - **Readiness**: the Pod is marked ready once `/healthz` answers on the readiness probe's
//!   port, and not ready when the process exits.
//! - **`preStop` hooks**, on request ([`Kubelet::delay_terminations`]): a terminating Pod's
//!   process runs on for a while before SIGTERM.
//! - **`restartPolicy: Always`**: a process that exits while its Pod is not terminating is
//!   started again, with backoff.
//! - **One IP per Pod**: each Pod gets a loopback address of its own (127.0.0.0/8 is all
//!   local on Linux), set as its `status.podIP` before its process starts, and the
//!   `--metrics` address is the one argument changed: from the rendered `0.0.0.0:<port>` (all
//!   of the Pod's own network namespace) to `<podIP>:<port>`, so what the daemon reads at
//!   `podIP:METRICS_PORT` is the process's own `/metrics`.
//!
//! # What it refuses
//! Only `jq` and `sql` steps run here: a Pod with init containers (an `exec` step), with more
//! than one container (an `http` step's sidecar) or a command other than the processor image's
//! `/plumber-processor` is not started; [`Kubelet::refused`] says why, and the tests assert
//! that nothing was refused.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use plumber_testkit::kube_api::{FakeApi, PodChange, PodEvent};

/// The finalizer that keeps a Pod until its process exited.
pub const FINALIZER: &str = "test.plumber.dev/kubelet";

/// The processor image's binary, as `render.rs` names it.
const PROCESSOR_IN_IMAGE: &str = "/plumber-processor";

/// When the Pod does not say (`terminationGracePeriodSeconds`), as on a cluster.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// One running process of a Pod, as [`Kubelet::processes`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Running {
    pub pod: String,
    /// The processor's `--group`.
    pub group: String,
    pub pid: u32,
}

pub struct Kubelet {
    shared: Arc<Shared>,
    manager: Option<JoinHandle<()>>,
}

struct Shared {
    fake: FakeApi,
    namespace: String,
    binary: PathBuf,
    logs: PathBuf,
    stopping: AtomicBool,
    /// Per Pod uid: its runner.
    pods: Mutex<BTreeMap<String, PodRunner>>,
    refused: Mutex<Vec<String>>,
    /// By Pod uid (a terminating Pod and its replacement may share a name).
    running: Mutex<BTreeMap<String, Running>>,
    /// How long a terminating Pod's process runs on before SIGTERM.
    termination_delay: Mutex<Duration>,
}

impl Shared {
    fn termination_delay(&self) -> Duration {
        *self
            .termination_delay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

struct PodRunner {
    terminate: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Kubelet {
    /// Runs the Pods of `namespace` with `binary` as the processor image's
    /// `/plumber-processor`; each process's output goes to `logs/<pod>.<uid>.log`.
    pub fn start(fake: &FakeApi, namespace: &str, binary: &Path, logs: &Path) -> Kubelet {
        std::fs::create_dir_all(logs).expect("the kubelet's log directory");
        let (sender, events) = mpsc::channel::<PodEvent>();
        let sender = Mutex::new(sender);
        // Called under a request of the code under test: only hand the event over.
        fake.on_pods_changed(move |event| {
            let _ = sender
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .send(event.clone());
        });
        let shared = Arc::new(Shared {
            fake: fake.clone(),
            namespace: namespace.to_owned(),
            binary: binary.to_owned(),
            logs: logs.to_owned(),
            stopping: AtomicBool::new(false),
            pods: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(Vec::new()),
            running: Mutex::new(BTreeMap::new()),
            termination_delay: Mutex::new(Duration::ZERO),
        });
        let manager = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("kubelet".into())
                .spawn(move || manage(&shared, &events))
                .expect("the kubelet's thread")
        };
        Kubelet {
            shared,
            manager: Some(manager),
        }
    }

    /// From now on a terminating Pod's process runs on for `delay` before it gets SIGTERM,
    /// as behind a `preStop: sleep` hook: processing and committing all along.
    pub fn delay_terminations(&self, delay: Duration) {
        *self
            .shared
            .termination_delay
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = delay;
    }

    /// Why Pods were not run (empty when every Pod ran).
    pub fn refused(&self) -> Vec<String> {
        self.shared
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The processes running now, by Pod.
    pub fn processes(&self) -> Vec<Running> {
        self.shared
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Stops every process (SIGTERM, then SIGKILL after the grace period), as a node that
    /// drains; the Pods are left as they are.
    pub fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(manager) = self.manager.take() {
            let _ = manager.join();
        }
        let runners: Vec<PodRunner> = std::mem::take(
            &mut *self
                .shared
                .pods
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
        .into_values()
        .collect();
        for runner in &runners {
            runner.terminate.store(true, Ordering::SeqCst);
        }
        for runner in runners {
            let _ = runner.thread.join();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn manage(shared: &Arc<Shared>, events: &Receiver<PodEvent>) {
    while !shared.stopping.load(Ordering::SeqCst) {
        let event = match events.recv_timeout(Duration::from_millis(100)) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if event.namespace != shared.namespace {
            continue;
        }
        let pod: Pod = match serde_json::from_value(event.pod.clone()) {
            Ok(pod) => pod,
            Err(error) => {
                refuse(shared, &event.name, &format!("not a Pod: {error}"));
                continue;
            }
        };
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        let mut pods = shared.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.retain(|_, runner| !runner.thread.is_finished());
        match event.change {
            PodChange::Added => {
                let terminate = Arc::new(AtomicBool::new(false));
                let thread = {
                    let (shared, terminate) = (shared.clone(), terminate.clone());
                    std::thread::Builder::new()
                        .name(format!("pod-{}", event.name))
                        .spawn(move || run_pod(&shared, &pod, &terminate))
                        .expect("a pod's thread")
                };
                pods.insert(uid, PodRunner { terminate, thread });
            }
            PodChange::Terminating | PodChange::Deleted => {
                if let Some(runner) = pods.get(&uid) {
                    runner.terminate.store(true, Ordering::SeqCst);
                }
            }
        }
    }
}

fn refuse(shared: &Shared, pod: &str, why: &str) {
    eprintln!("kubelet: not running pod {pod}: {why}");
    shared
        .refused
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(format!("{pod}: {why}"));
}

/// Whether the Pod named so is still the one with `uid`.
fn is_current(shared: &Shared, name: &str, uid: &str) -> bool {
    shared
        .fake
        .get::<Pod>(&shared.namespace, name)
        .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid))
}

/// Runs one Pod until it is terminated, then lets it go.
fn run_pod(shared: &Shared, pod: &Pod, terminate: &AtomicBool) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_GRACE, Duration::from_secs);
    match command(shared, pod) {
        Ok((command, group, health)) => supervise(
            shared, &name, &uid, command, &group, &health, grace, terminate,
        ),
        Err(why) => {
            refuse(shared, &name, &why);
            while !terminate.load(Ordering::SeqCst) && !shared.stopping.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // The containers stopped: the Pod may go (unless its name is another Pod's by now).
    if !shared.stopping.load(Ordering::SeqCst) && is_current(shared, &name, &uid) {
        shared
            .fake
            .finish_termination(&shared.namespace, &name, FINALIZER);
    }
}

/// The process a Pod's container runs, its group and the URL of its readiness probe.
fn command(shared: &Shared, pod: &Pod) -> Result<(Command, String, String), String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.as_ref().ok_or("no spec")?;
    if spec.init_containers.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err("init containers (an exec step): only jq and sql steps run here".into());
    }
    let [container] = spec.containers.as_slice() else {
        return Err(format!(
            "{} containers (an http step's sidecar?): only jq and sql steps run here",
            spec.containers.len()
        ));
    };
    if container.command.as_deref() != Some(&[PROCESSOR_IN_IMAGE.to_owned()][..]) {
        return Err(format!(
            "command {:?} is not the processor image's {PROCESSOR_IN_IMAGE}",
            container.command
        ));
    }
    let mut args = container.args.clone().unwrap_or_default();
    let metrics = args
        .iter()
        .position(|a| a == "--metrics")
        .ok_or("no --metrics: the readiness probe has nothing to ask")?;
    let rendered: SocketAddr = args
        .get(metrics + 1)
        .ok_or("--metrics without an address")?
        .parse()
        .map_err(|e| format!("--metrics: {e}"))?;
    let ip = pod_ip(rendered.port());
    let served = SocketAddr::from((ip, rendered.port()));
    if let Some(address) = args.get_mut(metrics + 1) {
        *address = served.to_string();
    }
    // As a kubelet does once the Pod's sandbox has its network, before the containers start.
    shared.fake.patch::<Pod>(
        &shared.namespace,
        &name,
        serde_json::json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}}),
    );
    let group = args
        .iter()
        .position(|a| a == "--group")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .ok_or("no --group")?;
    let health = health_url(container, served)?;
    let mut command = Command::new(&shared.binary);
    command.args(&args).env_clear().env("HOSTNAME", &name);
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => {
                let selector = from.secret_key_ref.as_ref().ok_or_else(|| {
                    format!("env {}: only values and secretKeyRefs run here", var.name)
                })?;
                secret_value(shared, &selector.name, &selector.key).ok_or_else(|| {
                    format!(
                        "CreateContainerConfigError: env {}: no key {} in Secret {}",
                        var.name, selector.key, selector.name
                    )
                })?
            }
            (None, None) => String::new(),
        };
        command.env(&var.name, value);
    }
    let log = shared.logs.join(format!(
        "{name}.{uid}.log",
        uid = pod.metadata.uid.as_deref().unwrap_or("-")
    ));
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    Ok((command, group, health))
}

/// The readiness probe's URL: its path on the container port it names, which the Pod's
/// `--metrics` serves.
fn health_url(container: &Container, served: SocketAddr) -> Result<String, String> {
    let get = container
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .ok_or("no HTTP readiness probe")?;
    let path = get.path.clone().unwrap_or_else(|| "/".into());
    Ok(format!("http://{served}{path}"))
}

fn secret_value(shared: &Shared, name: &str, key: &str) -> Option<String> {
    let secret = shared.fake.get::<Secret>(&shared.namespace, name)?;
    if let Some(value) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
        return Some(value.clone());
    }
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The next Pod's IP: a loopback address 127.X.Y.1 (X ≥ 1) whose `port` is free. Taken
/// in turn by every kubelet of the process, from a point of its own so that test processes
/// running side by side rarely try the same ones.
fn pod_ip(port: u16) -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const ADDRESSES: u32 = 255 * 256;
    let start = std::process::id().wrapping_mul(97) % ADDRESSES;
    for _ in 0..ADDRESSES {
        let n = (start + NEXT.fetch_add(1, Ordering::SeqCst)) % ADDRESSES;
        let ip = Ipv4Addr::new(127, 1 + (n / 256) as u8, (n % 256) as u8, 1);
        // The listener is closed again at once: the processor binds the address next.
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            return ip;
        }
    }
    panic!("no loopback address has port {port} free")
}

/// `restartPolicy: Always` until the Pod terminates: starts the process, marks the Pod ready
/// once its probe answers, restarts it with backoff when it exits, and stops it gracefully.
#[allow(clippy::too_many_arguments)]
fn supervise(
    shared: &Shared,
    name: &str,
    uid: &str,
    mut command: Command,
    group: &str,
    health: &str,
    grace: Duration,
    terminate: &AtomicBool,
) {
    let mut backoff = Duration::from_millis(500);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(1)))
        .build()
        .into();
    let terminating = || terminate.load(Ordering::SeqCst) || shared.stopping.load(Ordering::SeqCst);
    while !terminating() {
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                refuse(
                    shared,
                    name,
                    &format!("cannot start the processor: {error}"),
                );
                return;
            }
        };
        shared
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                uid.to_owned(),
                Running {
                    pod: name.to_owned(),
                    group: group.to_owned(),
                    pid: child.id(),
                },
            );
        let started = Instant::now();
        let mut ready = false;
        let mut next_probe = Instant::now();
        let exited = loop {
            if terminating() {
                // A preStop hook's sleep: the process serves on meanwhile.
                let until = Instant::now() + shared.termination_delay();
                while Instant::now() < until
                    && !shared.stopping.load(Ordering::SeqCst)
                    && matches!(child.try_wait(), Ok(None))
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                stop(&mut child, grace);
                break None;
            }
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) => {}
                Err(error) => {
                    eprintln!("kubelet: pod {name}: cannot wait for the processor: {error}");
                    break None;
                }
            }
            if !ready && Instant::now() >= next_probe {
                next_probe = Instant::now() + Duration::from_millis(250);
                if agent.get(health).call().is_ok() && is_current(shared, name, uid) {
                    shared.fake.set_pod_ready(&shared.namespace, name, true);
                    ready = true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        shared
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
        if ready && is_current(shared, name, uid) {
            shared.fake.set_pod_ready(&shared.namespace, name, false);
        }
        let Some(status) = exited else {
            return;
        };
        eprintln!(
            "kubelet: pod {name}: the processor exited ({status}); restarting it in {backoff:?}"
        );
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(500);
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until && !terminating() {
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// SIGTERM, then SIGKILL to the process group once `grace` has passed; reaps the process.
fn stop(child: &mut Child, grace: Duration) {
    // Exited and reaped already: its pid may be another process's by now.
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("kubelet: pid {pid} outlived its grace period of {grace:?}: SIGKILL");
    let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
    let _ = child.wait();
}
