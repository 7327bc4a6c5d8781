//! `plumber daemon --config FILE`: the daemon in a Kubernetes cluster (SPEC §7), until SIGINT
//! or SIGTERM. The same follower, workers, engine and observer as `plumber up`, with the
//! Kubernetes runtime, the cutover records in each Topology's status, and a Lease so that
//! only one replica acts.
//!
//! Stopping finishes the action in hand, then gives the lease up so another replica takes
//! over at once. Processors keep running: they are the cluster's, not this pod's.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use plumber::daemon::config::Config;
use plumber::daemon::{ClusterOverride, Context, Daemon, DaemonConfig, GitAuth};
use plumber::runtime::kube::apply::{KubeConfig, KubeRuntime};
use plumber::runtime::kube::lease::{Lease, LeaseConfig};
use plumber::runtime::kube::render::{RenderConfig, Source};
use plumber::store::topology::TopologyStore;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

pub fn run(path: &Path) -> Result<()> {
    crate::up::init_logging();
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    let config = Config::load(path)?;
    // One runtime for the Kubernetes client: its connections live there, and every blocking
    // call of the runtime, store and lease runs on it.
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("kube")
        .enable_all()
        .build()
        .context("starting the Kubernetes client's runtime")?;
    let kube_config = tokio.block_on(async {
        match &config.kubernetes.kubeconfig {
            Some(file) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(file)
                    .with_context(|| format!("reading the kubeconfig {}", file.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .with_context(|| format!("using the kubeconfig {}", file.display()))
            }
            None => kube::Config::incluster().context(
                "not in a Kubernetes pod (no service account); give `kubernetes.kubeconfig` in the config",
            ),
        }
    })?;
    let namespace = config
        .kubernetes
        .namespace
        .clone()
        .unwrap_or_else(|| kube_config.default_namespace.clone());
    let client = {
        let _inside = tokio.enter();
        kube::Client::try_from(kube_config).context("creating the Kubernetes client")?
    };
    let handle = tokio.handle().clone();
    // The pod's name: unique among the replicas, and what `kubectl get lease` shows.
    let identity = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("plumber-{}", std::process::id()));
    let lease = Lease::seek(
        client.clone(),
        &handle,
        LeaseConfig::new(&config.kubernetes.lease, &namespace, &identity),
    );
    // Processors may run apart from the daemon (and its Secrets); Topologies and the Lease
    // stay with the daemon.
    let processor_namespace = config
        .kubernetes
        .processor_namespace
        .clone()
        .unwrap_or_else(|| namespace.clone());
    let runtime = KubeRuntime::connect(
        client.clone(),
        handle.clone(),
        KubeConfig {
            topologies_namespace: Some(namespace.clone()),
            ..KubeConfig::new(RenderConfig {
                namespace: processor_namespace.clone(),
                processor_image: config.images.processor.clone(),
                pull_policy: config.images.pull_policy.map(|p| p.as_str().to_owned()),
                owner: None,
            })
        },
    )
    .context("reading the processors that run")?
    .fenced_by(lease.term());
    let records = TopologyStore::new(
        client,
        handle,
        &namespace,
        Source {
            repository: config.repository.url.clone(),
            git_ref: config.repository.branch.clone(),
        },
        lease.guard(),
    )?
    .with_cache(runtime.topology_cache())
    .with_term(lease.term());
    let daemon_config = daemon_config(&config)?;
    tracing::info!(
        namespace,
        processor_namespace,
        identity,
        repository = %config.repository.url,
        branch = %config.repository.branch,
        "plumber daemon starting; acting once it holds the lease"
    );
    let records = Arc::new(records);
    let context = Context::with_records(
        daemon_config,
        Arc::new(runtime),
        Some(records.clone()),
        Some(records),
    )
    .context("preparing the daemon (cache directory, trusted keys)")?;
    let mut daemon = Daemon::start(context).context("starting the daemon")?;
    if let Some(signal) = signals.forever().next() {
        tracing::info!(
            signal,
            "stopping: finishing the current action, then giving the lease up"
        );
    }
    // Bounded, as `plumber up`'s: the pod's grace period (60 s in deploy/) must not end in
    // SIGKILL while the lease is held, or the next replica waits for it to expire.
    let busy = daemon.shutdown_within(Some(Instant::now() + crate::up::THREADS_WAIT));
    if !busy.is_empty() {
        tracing::warn!(threads = ?busy, "still busy; not waited for (the next holder resumes)");
    }
    lease.release(Duration::from_secs(10));
    tracing::info!("stopped; the processors keep running");
    Ok(())
}

/// What `plumber up`'s flags say, from the config file.
fn daemon_config(config: &Config) -> Result<DaemonConfig> {
    let mut out = DaemonConfig::new(&config.repository.url, config.cache_dir.clone());
    out.branch = config.repository.branch.clone();
    out.listen = config.listen;
    out.listener = (&config.listener).into();
    out.poll_interval = config.repository.poll_interval;
    out.trusted_keys = config.trusted_keys.clone();
    out.allow_rollback = config.allow_rollback;
    out.wedged_after = config.wedged_after;
    out.cutover.keep_topics = config.kafka.keep_topics;
    out.budget = config.commit_budget.budget();
    out.step_tests = config.step_tests.limits();
    out.data_diff = config
        .data_diff
        .as_ref()
        .map(plumber::daemon::config::DataDiff::limits);
    out.watch_refs = config.repository.watch_refs.clone();
    out.push_notes = config.repository.push_notes;
    out.forge = config.forge.clone();
    out.public_url = config.public_url.clone();
    out.preview_label = config.preview_label.clone();
    out.webhook_secret = config
        .webhook
        .as_ref()
        .map(|w| crate::read_webhook_secret(&w.secret_file))
        .transpose()?;
    out.step_secrets = plumber::spec::StepSecrets::Only {
        names: config.step_secrets.iter().cloned().collect(),
        origin: "`stepSecrets` of the daemon's configuration".into(),
    };
    let credentials = &config.repository.credentials;
    out.git_auth = Some(GitAuth {
        username: credentials.username.clone(),
        password: None,
        password_file: credentials.password_file.clone(),
        ssh_key: credentials.ssh_key_file.clone(),
        known_hosts: credentials.known_hosts_file.clone(),
    });
    let mut clusters = BTreeMap::new();
    for (name, cluster) in &config.kafka.clusters {
        if let Some(credentials) = &cluster.credentials {
            out.credential_dirs
                .insert(credentials.secret.clone(), credentials.dir.clone());
        }
        clusters.insert(
            name.clone(),
            ClusterOverride {
                bootstrap: cluster.bootstrap.clone(),
                properties: cluster.properties.clone(),
                credentials: cluster.credentials.as_ref().map(|c| c.secret.clone()),
            },
        );
    }
    out.clusters = clusters;
    Ok(out)
}
