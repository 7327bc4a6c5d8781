//! `plumber daemon` replicas inside the test process, wired as `src/cluster.rs` wires one
//! (the Kubernetes runtime, the Topology-status records and status, the Lease), each with
//! its own tokio runtime for its Kubernetes client, its own Lease identity and its own cache
//! directory, all on one in-memory API server and one repository.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use plumber::daemon::status::Status;
use plumber::daemon::{Context, Daemon, DaemonConfig};
use plumber::runtime::kube::apply::{KubeConfig, KubeRuntime};
use plumber::runtime::kube::lease::{Lease, LeaseConfig};
use plumber::runtime::kube::render::{RenderConfig, Source};
use plumber::store::topology::TopologyStore;
use plumber_testkit::kube_api::FakeApi;

use crate::harness::World;

/// The namespace of the daemon, its Lease, the Topologies and the processors.
pub const NS: &str = "plumber";

/// The Lease's name, as `deploy/daemon.yaml` has it.
const LEASE: &str = "plumber";

/// Short leases, so that a crashed holder's lease lapses within seconds: renewed every 3 s,
/// lapsing after 6 s; a replica acts for at most 4.3 s after it last saw its own renewal.
fn lease(identity: &str) -> LeaseConfig {
    LeaseConfig {
        duration: Duration::from_secs(6),
        grace: Duration::from_secs(3),
        check: Duration::from_millis(200),
        ..LeaseConfig::new(LEASE, NS, identity)
    }
}

pub struct Replica {
    pub name: String,
    tokio: Option<tokio::runtime::Runtime>,
    lease: Option<Lease>,
    daemon: Option<Daemon>,
}

impl Replica {
    pub fn start(fake: &FakeApi, world: &World, name: &str, cache: &Path) -> Replica {
        Replica::start_with(fake, world, name, cache, |_| ())
    }

    /// A replica whose daemon config `configure` changes last (e.g. a forge and previews).
    pub fn start_with(
        fake: &FakeApi,
        world: &World,
        name: &str,
        cache: &Path,
        configure: impl FnOnce(&mut DaemonConfig),
    ) -> Replica {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("kube-{name}"))
            .enable_all()
            .build()
            .expect("the replica's tokio runtime");
        let client = {
            let _inside = tokio.enter();
            // Its requests are recorded under its name: a test holds or checks one replica's.
            fake.client_as(NS, name)
        };
        let handle = tokio.handle().clone();
        let lease = Lease::seek(client.clone(), &handle, lease(name));
        let runtime = KubeRuntime::connect(
            client.clone(),
            handle.clone(),
            KubeConfig {
                poll: Duration::from_millis(100),
                ..KubeConfig::new(RenderConfig {
                    namespace: NS.into(),
                    processor_image: "plumber-processor:test".into(),
                    pull_policy: None,
                    owner: None,
                })
            },
        )
        .expect("the Kubernetes runtime")
        // As `plumber daemon` wires it (src/cluster.rs): no write without the lease.
        .fenced_by(lease.term());
        let records = Arc::new(
            TopologyStore::new(
                client,
                handle,
                NS,
                Source {
                    repository: world.repo_location(),
                    git_ref: "main".into(),
                },
                lease.guard(),
            )
            .expect("the Topology store")
            // As `plumber daemon` wires it (src/cluster.rs).
            .with_cache(runtime.topology_cache())
            .with_term(lease.term()),
        );
        let mut config = DaemonConfig::new(&world.repo_location(), cache.to_owned());
        config.branch = "main".into();
        config.listen = "127.0.0.1:0".parse().expect("an address");
        // As the reconciler tests run `plumber up`: quick stall restarts, short records.
        config.stalled_after = Duration::from_secs(15);
        config.record_timeout = Duration::from_secs(5);
        // tansu 0.6 breaks the topics beside one it deletes (README, tansu).
        config.cutover.keep_topics = world.broker.is_tansu();
        configure(&mut config);
        let context = Context::with_records(
            config,
            Arc::new(runtime),
            Some(records.clone()),
            Some(records),
        )
        .expect("the daemon's context");
        let daemon = Daemon::start(context).expect("the daemon");
        eprintln!("replica {name} started; API on {}", daemon.listening);
        Replica {
            name: name.to_owned(),
            tokio: Some(tokio),
            lease: Some(lease),
            daemon: Some(daemon),
        }
    }

    /// The base URL of this replica's API (`/api`, `/hooks`).
    pub fn api(&self) -> String {
        self.daemon
            .as_ref()
            .map(|d| format!("http://{}", d.listening))
            .unwrap_or_default()
    }

    /// What a pull-request webhook asks: pull request `number`'s preview decided again.
    pub fn look_at_pull_request(&self, number: u64) {
        if let Some(daemon) = &self.daemon {
            daemon.context().previews.look(number);
        }
    }

    pub fn holds_lease(&self) -> bool {
        self.lease.as_ref().is_some_and(Lease::held)
    }

    /// What `GET /api/status` of this replica shows.
    pub fn status(&self) -> Status {
        self.daemon
            .as_ref()
            .map(|d| d.context().store.read().clone())
            .unwrap_or_default()
    }

    /// The replica dies where it stands: its tokio runtime goes, so the lease manager stops
    /// renewing without giving the lease up and every Kubernetes call it makes from now on
    /// fails (its engine starts each step by reading the record, so it does not act on Kafka
    /// either). A thread inside a request the API server holds stays there: the request
    /// reached the server, and is answered once the test lets it go. What is left is reaped
    /// with [`Crashed::reap`] once those requests were let go.
    pub fn crash(mut self) -> Crashed {
        if let Some(tokio) = self.tokio.take() {
            tokio.shutdown_background();
        }
        eprintln!("replica {} crashed", self.name);
        Crashed {
            name: self.name.clone(),
            lease: self.lease.take(),
            daemon: self.daemon.take(),
        }
    }

    /// A graceful stop, as on SIGTERM: the action in hand finishes, then the lease is given
    /// up.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.shutdown();
        }
        if let Some(lease) = self.lease.take() {
            lease.release(Duration::from_secs(5));
        }
        if let Some(tokio) = self.tokio.take() {
            tokio.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What a crashed replica left: threads that may still be inside held requests.
pub struct Crashed {
    name: String,
    lease: Option<Lease>,
    daemon: Option<Daemon>,
}

impl Crashed {
    /// Joins the dead replica's threads (every call of theirs fails now).
    pub fn reap(mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.shutdown();
        }
        // Its runtime is gone: dropping it releases nothing.
        drop(self.lease.take());
        eprintln!("crashed replica {} reaped", self.name);
    }
}

/// The Lease held by someone who is no daemon of this test (another replica, as far as the
/// daemons can tell), until [`LeaseHolder::release`].
pub struct LeaseHolder {
    tokio: tokio::runtime::Runtime,
    lease: Option<Lease>,
}

impl LeaseHolder {
    pub fn start(fake: &FakeApi, identity: &str) -> LeaseHolder {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the lease holder's tokio runtime");
        let client = {
            let _inside = tokio.enter();
            fake.client(NS)
        };
        let lease = Lease::seek(client, tokio.handle(), lease(identity));
        LeaseHolder {
            tokio,
            lease: Some(lease),
        }
    }

    pub fn held(&self) -> bool {
        self.lease.as_ref().is_some_and(Lease::held)
    }

    pub fn release(mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release(Duration::from_secs(5));
        }
        drop(self.tokio);
    }
}
