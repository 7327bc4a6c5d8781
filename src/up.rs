//! `plumber up`: the daemon with the local runtime, until SIGINT, SIGTERM or SIGHUP (the
//! terminal closed).
//!
//! The first signal stops reconciling (the cutover action in hand finishes and is persisted;
//! the next `up` resumes the cutover), then stops every processor gracefully, then exits. The
//! daemon's threads are waited for [`THREADS_WAIT`] at most: a plan of a large ref or a slow
//! fetch must not keep the processors running (what is still busy then ends with the
//! process, as in a crash the next `up` resumes from). So a stop takes at most that plus the
//! processors' graceful stop (30 s at most, then they are killed). Nothing of it writes
//! to stdout or needs the terminal: a pipe or terminal gone stops nothing half-way. A second
//! signal exits at once and leaves the processors running: the next `up` on the same state
//! directory adopts them.

use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing_subscriber::EnvFilter;

use plumber::daemon::{Context, Daemon, DaemonConfig};
use plumber::runtime::local::{LocalConfig, LocalRuntime};
use plumber::store::StateDir;

pub fn run(config: DaemonConfig, local: LocalConfig) -> Result<()> {
    init_logging();
    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    let _lock = StateDir::open(&config.state_dir)
        .and_then(|state| state.lock())
        .context("taking the state directory")?;
    let runtime = Arc::new(
        LocalRuntime::open(&config.state_dir, local).context("starting the local runtime")?,
    );
    let context = Context::new(config, runtime.clone())
        .context("preparing the daemon (state directory, trusted keys)")?;
    let mut daemon = Daemon::start(context).context("starting the daemon")?;
    eprintln!(
        "plumber is following the branch; status: `plumber status --server http://{}`",
        daemon.listening
    );
    let (received, signalled) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if received.send(signal).is_err() {
                return;
            }
        }
    });
    if let Ok(signal) = signalled.recv() {
        tracing::info!(
            signal,
            "stopping: finishing the current action, then stopping processors (signal again to leave them running)"
        );
    }
    // A second signal while stopping: leave at once, processors keep running.
    std::thread::spawn(move || {
        if signalled.recv().is_ok() {
            tracing::warn!("second signal: exiting now; processors keep running");
            std::process::exit(130);
        }
    });
    let busy = daemon.shutdown_within(Some(Instant::now() + THREADS_WAIT));
    if !busy.is_empty() {
        tracing::warn!(
            threads = ?busy,
            waited_s = THREADS_WAIT.as_secs(),
            "still busy; not waited for (the next start resumes what they were doing)"
        );
    }
    runtime.stop_all();
    tracing::info!("stopped");
    Ok(())
}

/// How long a stop waits for the daemon's threads before it stops the processors.
pub const THREADS_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn init_logging() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,librdkafka=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::io::stderr().is_terminal() {
        builder.init();
    } else {
        builder.json().flatten_event(true).init();
    }
}
