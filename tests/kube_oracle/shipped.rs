//! `plumber daemon` as users deploy it: the real binary, as a process, with the
//! `daemon.yaml` that `deploy/` ships (adapted only where a cluster differs from this test:
//! the repository, the broker, the listener, the cache and a kubeconfig for a daemon outside
//! the cluster), against the in-memory API server served over HTTPS, which answers 403 to
//! every request the Role in `deploy/role.yaml` does not allow the daemon's service account.
//! The test kubelet runs the real processors for its Pods on the test's broker.

use std::path::Path;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use plumber_testkit::kube_api::{Attributes, Fault, Rbac, RecordedRequest, Verb};

use super::fence::{holder_write, processor_write, sent_by};
use super::*;

/// The Role the daemon's service account is bound to (`deploy/rolebinding.yaml`).
const ROLE: &str = include_str!("../../deploy/role.yaml");
/// With the component `deploy/processors/`: the daemon's Role as its patch leaves it, and the
/// Role it has in the processors' namespace.
const APART_DAEMON_ROLE: &str = include_str!("../../deploy/processors/daemon-role.yaml");
const APART_PROCESSORS_ROLE: &str = include_str!("../../deploy/processors/role.yaml");
/// The processors' namespace `deploy/processors/namespace.yaml` makes.
const PROCESSORS_NS: &str = "plumber-processors";
/// The daemon's configuration as `deploy/` ships it.
const DAEMON_YAML: &str = include_str!("../../deploy/daemon.yaml");

/// `deploy/daemon.yaml`, with what differs for this test: a kubeconfig (a daemon outside the
/// cluster), the test's repository and broker, a loopback listener, a cache of its own, a
/// short poll, and on tansu retired topics kept.
fn daemon_config(
    world: &World,
    kubeconfig: &Path,
    cache: &Path,
    port: u16,
    processor_namespace: Option<&str>,
) -> String {
    let mut config: serde_json::Value =
        serde_saphyr::from_str(DAEMON_YAML).expect("deploy/daemon.yaml is YAML");
    config["kubernetes"]["kubeconfig"] = kubeconfig.display().to_string().into();
    config["repository"]["url"] = world.repo_location().into();
    config["repository"]["pollInterval"] = "1s".into();
    config["kafka"]["clusters"]["default"]["bootstrap"] = world.broker.bootstrap().into();
    config["listen"] = format!("127.0.0.1:{port}").into();
    config["cacheDir"] = cache.display().to_string().into();
    if let Some(namespace) = processor_namespace {
        config["kubernetes"]["processorNamespace"] = namespace.into();
    }
    if world.broker.is_tansu() {
        // Deleting a topic on tansu breaks every other (README, tansu).
        config["kafka"]["keepTopics"] = true.into();
    }
    // JSON is YAML: the daemon reads it as it reads the shipped file.
    serde_json::to_string_pretty(&config).unwrap()
}

/// The requests the API server refused, as `verb resource name`.
fn forbidden(fake: &FakeApi) -> Vec<String> {
    fake.requests()
        .iter()
        .filter(|r| r.status == Some(403))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

#[test]
fn the_shipped_daemon_moves_a_topology_over_https_within_deploy_s_role() {
    let rbac = Rbac::service_account(NS, "plumber").with_roles_yaml(ROLE, NS);
    // The RBAC mode does refuse: what the Role does not grant is forbidden.
    assert!(
        !rbac.allows(&Attributes::of(
            "GET",
            &format!("/api/v1/namespaces/{NS}/secrets"),
            &BTreeMap::new()
        )),
        "deploy/role.yaml grants no Secrets"
    );
    run_shipped("shipped", rbac, None, false);
}

/// The same while the API server fails StatefulSet writes of the cutover: each apply and each
/// delete of a StatefulSet is answered 500, then 503, then with a reset connection, then 409,
/// before one goes through. The cutover finishes all the same, exactly once.
#[test]
fn the_shipped_daemon_moves_a_topology_through_api_server_faults() {
    let rbac = Rbac::service_account(NS, "plumber").with_roles_yaml(ROLE, NS);
    run_shipped("shipped-faults", rbac, None, true);
}

/// The same with the component `deploy/processors/`: processors in a namespace of their own,
/// the daemon with its patched Role in its namespace and the processors' Role in theirs.
#[test]
fn the_shipped_daemon_runs_processors_apart_within_deploy_processors_roles() {
    let rbac = Rbac::service_account(NS, "plumber")
        .with_roles_yaml(APART_DAEMON_ROLE, NS)
        .with_roles_yaml(APART_PROCESSORS_ROLE, PROCESSORS_NS);
    run_shipped("shipped-apart", rbac, Some(PROCESSORS_NS), false);
}

/// `plumber daemon` with `deploy/daemon.yaml` under `rbac`, processors in
/// `processor_namespace` (absent: the daemon's): a first commit, then a cutover under load
/// (with `faults`, through failing StatefulSet writes), exactly once; the history reads, no
/// request was forbidden, SIGTERM stops it.
fn run_shipped(name: &str, rbac: Rbac, processor_namespace: Option<&str>, faults: bool) {
    let scratch = Scratch::new();
    let world = World::new(name);
    let fake = cluster().with_rbac(rbac);
    let served = fake.serve_https();
    let kubeconfig = scratch.path("kubeconfig");
    served.write_kubeconfig(&kubeconfig, NS).unwrap();
    let pods = processor_namespace.unwrap_or(NS);
    let kubelet = Kubelet::start(&fake, pods, &processor_binary(), &scratch.path("pods"));

    let model = Model::new()
        .processor(Proc::new("a", 1, &["src"]))
        .processor(Proc::new("b", 1, &["a"]))
        .sink("out1", &["b"]);
    let mut revisions = vec![model];
    let r1 = world.commit("first", &revisions[0]);
    let port = plumber_testkit::free_port();
    let config = scratch.path("daemon.yaml");
    std::fs::write(
        &config,
        daemon_config(
            &world,
            &kubeconfig,
            &scratch.path("cache"),
            port,
            processor_namespace,
        ),
    )
    .unwrap();
    let mut daemon = harness::Plumber::daemon(&world, &config, port);
    // It serves only once its watches have listed what they watch: live and ready at once.
    assert_eq!(daemon.probe("/healthz"), Some((200, "ok\n".into())));
    assert_eq!(daemon.probe("/readyz"), Some((200, "ready\n".into())));
    daemon.wait_applied("t", r1);
    let load = world.start_load(50);
    load.wait_for(100);

    let writes = |method: &'static str| {
        move |r: &RecordedRequest| r.method == method && r.path.contains("/statefulsets/")
    };
    if faults {
        for method in ["PATCH", "DELETE"] {
            for fault in [
                Fault::internal_error(),
                Fault::unavailable(),
                Fault::transport("connection reset (injected by the test)"),
                Fault::conflict(),
            ] {
                fake.fail_next(1, writes(method), fault);
            }
        }
    }
    let next = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &next);
    revisions.push(next);
    daemon.wait_applied("t", r2);
    let (sent, final_from) = load.finish(100);
    world.assert_oracle(&revisions, sent, final_from);
    if faults {
        // Every fault was met: the cutover went through each, not around them.
        for method in ["PATCH", "DELETE"] {
            let failed: Vec<Option<u16>> = fake
                .requests()
                .iter()
                .filter(|r| writes(method)(r) && r.status.is_none_or(|s| s >= 409))
                .map(|r| r.status)
                .collect();
            assert_eq!(
                failed,
                [Some(500), Some(503), None, Some(409)],
                "the {method}s of StatefulSets that failed"
            );
        }
    }
    if processor_namespace.is_none() {
        assert_runs(&fake, &kubelet, &world, &revisions[1]);
    } else {
        assert!(
            fake.list::<StatefulSet>(NS).is_empty(),
            "no processor in the daemon's namespace"
        );
        assert_eq!(kubelet.refused(), Vec::<String>::new(), "every Pod ran");
    }

    // The page's history panel and `plumber history --server` read the Topologies' records.
    let history = daemon.history();
    let moves = history.as_array().map(Vec::len).unwrap_or(0);
    assert!(moves >= 2, "both moves in the history: {history:#}");

    assert_eq!(
        forbidden(&fake),
        Vec::<String>::new(),
        "the daemon asked only for what its Roles grant"
    );
    let exit = daemon.terminate().expect("the daemon stops on SIGTERM");
    assert!(
        exit.success(),
        "the daemon exits cleanly on SIGTERM: {exit}"
    );
    drop(served);
}

/// The holder of the Lease `deploy/daemon.yaml` names.
fn lease_holder(fake: &FakeApi) -> Option<String> {
    fake.get::<k8s_openapi::api::coordination::v1::Lease>(NS, "plumber")?
        .spec?
        .holder_identity
}

/// A rolling restart as Kubernetes makes it: a second replica starts and stands by, the first
/// gets SIGTERM in the middle of a cutover, finishes the action in hand and gives the Lease
/// up, and the second takes the Lease over and finishes the cutover: exactly once, within
/// `deploy/`'s Role.
#[test]
fn a_rolling_restart_hands_a_cutover_from_one_shipped_replica_to_the_next() {
    let scratch = Scratch::new();
    let world = World::new("shipped-rolling");
    let fake = cluster().with_rbac(Rbac::service_account(NS, "plumber").with_roles_yaml(ROLE, NS));
    let served = fake.serve_https();
    let kubeconfig = scratch.path("kubeconfig");
    served.write_kubeconfig(&kubeconfig, NS).unwrap();
    let _kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let first = Model::new()
        .processor(Proc::new("a", 1, &["src"]))
        .processor(Proc::new("b", 1, &["a"]))
        .sink("out1", &["b"]);
    let r1 = world.commit("first", &first);
    let replica = |name: &str| {
        let port = plumber_testkit::free_port();
        let config = scratch.path(&format!("{name}.yaml"));
        let yaml = daemon_config(&world, &kubeconfig, &scratch.path(name), port, None);
        std::fs::write(&config, yaml).unwrap();
        harness::Plumber::daemon_named(&world, &config, port, name)
    };
    let mut old = replica("plumber-old");
    old.wait_applied("t", r1);
    let load = world.start_load(50);
    load.wait_for(100);
    let new = replica("plumber-new");
    assert_eq!(lease_holder(&fake).as_deref(), Some("plumber-old"));

    let next = first.clone().replace("a", 2).replace("b", 2);
    let r2 = world.commit("a and b v2", &next);
    old.wait_until("the old replica is in the cutover", |status| {
        status["topologies"][0]["phase"] == "cutover"
    });
    let exit = old.terminate().expect("the old replica stops on SIGTERM");
    assert!(exit.success(), "it exits cleanly: {exit}");
    assert!(
        record(&fake).is_some_and(|r| r.moving.is_some()),
        "the old replica left the cutover half-way"
    );
    wait_until("the new replica holds the Lease", PATIENCE, || {
        lease_holder(&fake).as_deref() == Some("plumber-new")
    });
    // Given up, the Lease is taken at the standby's next look at it (every second), not
    // when it would have lapsed (up to 30 s later). The replica logs the take after the
    // write the fake API server has already seen, so the line may come a moment later.
    wait_until("the new replica saw the Lease given up", PATIENCE, || {
        world.daemon_log().lines().any(|line| {
            line.contains("took the Lease, which named no holder") && line.contains("plumber-new")
        })
    });
    assert!(
        !world
            .daemon_log()
            .lines()
            .any(|line| line.contains("took the Lease over: unchanged")),
        "the new replica took the Lease as given up, not as lapsed"
    );
    wait_applied(&fake, r2);
    new.wait_applied("t", r2);
    let (sent, final_from) = load.finish(100);
    world.assert_oracle(&[first, next], sent, final_from);
    assert_eq!(
        forbidden(&fake),
        Vec::<String>::new(),
        "both replicas asked only for what the Role grants"
    );
    drop(new);
    drop(served);
}

/// `fence::a_holder_whose_calls_stall_past_its_lease_writes_nothing_after_the_takeover` with
/// the shipped binary: two `plumber daemon` processes, each with a kubeconfig of its own, so
/// that the API server tells their calls apart. From the holder's first write of a cutover on,
/// the API server holds every call it sends, renewals included; its lease lapses, the standby
/// takes the Lease over and finishes the cutover. The stalled calls are then answered, and
/// the deposed process writes nothing after the takeover. Nothing lost, nothing duplicated,
/// nothing asked beyond `deploy/`'s Role.
#[test]
fn a_shipped_holder_whose_calls_stall_past_its_lease_writes_nothing_after_the_takeover() {
    let scratch = Scratch::new();
    let world = World::new("shipped-stall");
    let fake = cluster().with_rbac(Rbac::service_account(NS, "plumber").with_roles_yaml(ROLE, NS));
    let served = fake.serve_https();
    let _kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let first = Model::new()
        .processor(Proc::new("a", 1, &["src"]))
        .processor(Proc::new("b", 1, &["a"]))
        .sink("out1", &["b"]);
    let r1 = world.commit("first", &first);
    let replica = |name: &str| {
        let kubeconfig = scratch.path(&format!("{name}.kubeconfig"));
        served.write_kubeconfig_as(&kubeconfig, NS, name).unwrap();
        let port = plumber_testkit::free_port();
        let config = scratch.path(&format!("{name}.yaml"));
        let yaml = daemon_config(&world, &kubeconfig, &scratch.path(name), port, None);
        std::fs::write(&config, yaml).unwrap();
        harness::Plumber::daemon_named(&world, &config, port, name)
    };
    let old = replica("plumber-old");
    old.wait_applied("t", r1);
    let load = world.start_load(50);
    load.wait_for(100);
    let new = replica("plumber-new");
    assert_eq!(lease_holder(&fake).as_deref(), Some("plumber-old"));
    assert!(
        fake.requests().iter().any(|r| sent_by(r, "plumber-new")),
        "the API server tells the two processes apart"
    );

    let stalled = Arc::new(AtomicBool::new(false));
    let hold = {
        let stalled = stalled.clone();
        fake.hold(move |r| {
            sent_by(r, "plumber-old")
                && (stalled.load(Ordering::SeqCst)
                    || (processor_write(r) && !stalled.swap(true, Ordering::SeqCst)))
        })
    };
    let next = first.clone().replace("a", 2);
    let r2 = world.commit("a v2", &next);
    wait_until(
        "plumber-old's calls stall at its first write of R2",
        PATIENCE,
        || stalled.load(Ordering::SeqCst),
    );
    wait_until("plumber-new takes the Lease over", PATIENCE, || {
        lease_holder(&fake).as_deref() == Some("plumber-new")
    });
    let takeover = fake.requests().len();
    assert!(
        hold.held() > 0,
        "plumber-old was inside a held call when plumber-new took over"
    );
    wait_applied(&fake, r2);
    new.wait_applied("t", r2);

    // The stalled calls are answered now (the held write was sent while plumber-old held the
    // Lease, and lands); plumber-old learns it lost the Lease and writes nothing more.
    drop(hold);
    wait_until("plumber-old knows it lost the Lease", PATIENCE, || {
        world.daemon_log().lines().any(|line| {
            line.contains("lease changed")
                && line.contains("plumber-old")
                && line.contains(r#""holder":false"#)
        })
    });
    wait_until("plumber-old's stalled calls are answered", PATIENCE, || {
        fake.requests()
            .iter()
            .all(|r| !sent_by(r, "plumber-old") || r.status.is_some() || r.verb() == Verb::Watch)
    });
    // Under load, long enough for plumber-old to act on what its calls answered.
    load.wait_for(load.sent() + 150);
    let after: Vec<String> = fake
        .requests()
        .iter()
        .skip(takeover)
        .filter(|r| sent_by(r, "plumber-old") && holder_write(r))
        .map(|r| format!("{} ({:?})", r.summary(), r.status))
        .collect();
    assert_eq!(after, Vec::<String>::new(), "the deposed holder wrote");
    assert!(
        fake.requests()
            .iter()
            .skip(takeover)
            .any(|r| sent_by(r, "plumber-old")),
        "plumber-old went on running after the takeover"
    );
    let (sent, final_from) = load.finish(100);
    world.assert_oracle(&[first, next], sent, final_from);
    assert_eq!(
        forbidden(&fake),
        Vec::<String>::new(),
        "both replicas asked only for what the Role grants"
    );
    drop(old);
    drop(new);
    drop(served);
}
