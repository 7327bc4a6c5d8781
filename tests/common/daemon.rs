//! The daemon's pieces started in the test's process as `plumber up` starts them, on a local
//! repository, with a Kafka admin that never answers: nothing is deployed by it, and what
//! runs is what a test saves in the store.

use std::sync::Arc;
use std::time::Duration;

use plumber::daemon::{Context, Daemon, DaemonConfig};
use plumber::runtime::local::{LocalConfig, LocalRuntime};

pub struct Harness {
    pub daemon: Daemon,
    /// The state directory's parent.
    pub state: tempfile::TempDir,
}

impl Harness {
    pub fn start(location: &str, configure: impl FnOnce(&mut DaemonConfig)) -> Harness {
        Harness::start_with(location, configure, |_| {})
    }

    /// With `before` run on the context before the daemon starts (what runs, saved).
    pub fn start_with(
        location: &str,
        configure: impl FnOnce(&mut DaemonConfig),
        before: impl FnOnce(&Context),
    ) -> Harness {
        let state = tempfile::tempdir().unwrap();
        let mut config = DaemonConfig::new(location, state.path().join("state"));
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.poll_interval = Duration::from_millis(500);
        configure(&mut config);
        let runtime = Arc::new(
            LocalRuntime::open(
                &config.state_dir,
                LocalConfig {
                    checkouts: plumber::store::checkouts_dir(&config.state_dir),
                    ..LocalConfig::default()
                },
            )
            .unwrap(),
        );
        let context = Context::with_admin(
            config,
            runtime,
            Box::new(|cluster| {
                Err(plumber::kafka::Error::NoAnswer {
                    bootstrap: cluster.bootstrap.clone(),
                })
            }),
        )
        .unwrap();
        before(&context);
        let daemon = Daemon::start(context).unwrap();
        Harness { daemon, state }
    }

    pub fn context(&self) -> &Arc<Context> {
        self.daemon.context()
    }

    /// `http://ADDR` of its API.
    pub fn api(&self) -> String {
        format!("http://{}", self.daemon.listening)
    }
}
