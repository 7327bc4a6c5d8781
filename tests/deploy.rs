//! `deploy/`: the CRD it holds is the one `plumber crd` prints, `kubectl kustomize deploy/`
//! builds offline, and what it renders keeps SPEC §7's promises (least-privilege RBAC, a
//! locked-down daemon pod, probes on the API's health endpoint, a config the daemon reads).
//!
//! Needs kubectl (`scripts/install-deps` checks for it; `KUBECTL=/path` picks another one).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use plumber::daemon::config::Config;
use plumber::runtime::kube::crd;

/// What the daemon's HTTP API answers health checks on (src/daemon/api.rs).
const HEALTH_PATH: &str = "/healthz";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

#[test]
fn the_crd_in_deploy_is_what_plumber_crd_prints() {
    let output = Command::new(env!("CARGO_BIN_EXE_plumber"))
        .arg("crd")
        .output()
        .expect("running plumber crd");
    assert!(
        output.status.success(),
        "plumber crd failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).expect("plumber crd prints UTF-8");
    let path = deploy_dir().join("crd.yaml");
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        printed == kept,
        "{} is not what `plumber crd` prints (the Topology types changed?); regenerate it \
         with `cargo run -- crd > deploy/crd.yaml` and commit it",
        path.display()
    );
}

/// `kubectl kustomize deploy/`, one JSON value per object.
fn rendered() -> Vec<Value> {
    rendered_from(&deploy_dir())
}

/// `kubectl kustomize DIR`, one JSON value per object.
fn rendered_from(dir: &Path) -> Vec<Value> {
    let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    let output = match Command::new(&kubectl).arg("kustomize").arg(dir).output() {
        Ok(output) => output,
        Err(error) => panic!(
            "cannot run {} ({error}): these tests need kubectl to build deploy/ with \
             kustomize; `scripts/install-deps` says how to install it (or set KUBECTL to its \
             path)",
            kubectl.to_string_lossy()
        ),
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    serde_saphyr::from_multiple::<Value>(&text).expect("kustomize prints YAML documents")
}

/// The one object of `kind`, as its k8s-openapi type.
fn the<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str) -> T {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    let [object] = found.as_slice() else {
        panic!(
            "deploy/ should render exactly one {kind}, renders {}",
            found.len()
        );
    };
    serde_json::from_value((*object).clone())
        .unwrap_or_else(|e| panic!("the {kind} of deploy/ does not read as one: {e}"))
}

#[test]
fn deploy_builds_with_kustomize_into_the_expected_objects() {
    let objects = rendered();
    let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    let expected = [
        "ConfigMap",
        "CustomResourceDefinition",
        "Deployment",
        "Namespace",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ];
    assert_eq!(kinds, BTreeSet::from(expected));
    assert_eq!(objects.len(), expected.len(), "one object of each kind");
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        let namespace = object["metadata"]["namespace"].as_str();
        match kind {
            "Namespace" | "CustomResourceDefinition" => assert_eq!(namespace, None),
            _ => assert_eq!(namespace, Some("plumber"), "the {kind}'s namespace"),
        }
    }
    let namespace: Namespace = the(&objects, "Namespace");
    let labels = namespace.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted"),
        "the namespace enforces the restricted Pod Security Standard"
    );
}

#[test]
fn the_crd_rendered_is_the_definition() {
    let objects = rendered();
    let rendered: CustomResourceDefinition = the(&objects, "CustomResourceDefinition");
    assert_eq!(rendered, crd::definition());
}

fn pod_spec(objects: &[Value]) -> (Deployment, PodSpec) {
    let deployment: Deployment = the(objects, "Deployment");
    let pod = deployment
        .spec
        .template
        .spec
        .clone()
        .expect("the Deployment has a pod spec");
    (deployment, pod)
}

fn the_container(pod: &PodSpec) -> &Container {
    let [container] = pod.containers.as_slice() else {
        panic!("the daemon's pod should have one container");
    };
    container
}

#[test]
fn the_daemon_pod_is_locked_down() {
    let objects = rendered();
    let (deployment, pod) = pod_spec(&objects);
    assert_eq!(
        deployment.spec.replicas,
        Some(2),
        "two replicas, one holding the lease"
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("plumber"));
    let pod_security = pod
        .security_context
        .as_ref()
        .expect("a pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert!(pod_security.run_as_user.is_some_and(|uid| uid != 0));
    assert_eq!(
        pod_security
            .seccomp_profile
            .as_ref()
            .map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert!(pod.init_containers.is_none());
    let container = the_container(&pod);
    let security = container
        .security_context
        .as_ref()
        .expect("a container securityContext");
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.privileged, None);
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(
        security.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()])
    );
    assert!(
        security
            .capabilities
            .as_ref()
            .is_some_and(|c| c.add.is_none())
    );
    let resources = container.resources.as_ref().expect("resources");
    assert!(
        resources
            .requests
            .as_ref()
            .is_some_and(|r| r.contains_key("cpu"))
    );
    assert!(
        resources
            .limits
            .as_ref()
            .is_some_and(|l| l.contains_key("memory"))
    );
    // Everything the daemon writes goes to volumes: the root filesystem is read-only.
    let mounts: BTreeSet<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains("/tmp") && mounts.contains("/var/lib/plumber"));
}

#[test]
fn the_daemon_is_probed_and_served_on_its_api_port() {
    let objects = rendered();
    let (_, pod) = pod_spec(&objects);
    let container = the_container(&pod);
    let config = daemon_config(&objects);
    let port = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("http"))
        .expect("a port named http");
    assert_eq!(
        port.container_port,
        i32::from(config.listen.port()),
        "the container port is where daemon.yaml's `listen` serves"
    );
    // Live while no thread died or is wedged; ready once the watch caches have listed.
    for (which, probe, path) in [
        ("liveness", &container.liveness_probe, HEALTH_PATH),
        ("readiness", &container.readiness_probe, "/readyz"),
        ("startup", &container.startup_probe, HEALTH_PATH),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("an HTTP {which} probe"));
        assert_eq!(get.path.as_deref(), Some(path), "{which} probe");
        assert_eq!(
            get.port,
            IntOrString::String("http".into()),
            "{which} probe"
        );
    }
    let service: Service = the(&objects, "Service");
    let service_spec = service.spec.expect("a Service spec");
    let labels = pod_labels(&objects);
    for (key, value) in service_spec.selector.iter().flatten() {
        // The holder labels its own pod; the template's pods start as standbys.
        if key == plumber::runtime::kube::lease::HOLDER_LABEL {
            assert_eq!(value, "true", "the Service reaches the lease holder");
            continue;
        }
        assert_eq!(
            labels.get(key),
            Some(value),
            "the Service selects the daemon"
        );
    }
    assert!(
        service_spec
            .selector
            .iter()
            .flatten()
            .any(|(key, _)| key == plumber::runtime::kube::lease::HOLDER_LABEL),
        "the Service reaches the lease holder only"
    );
    let [service_port] = service_spec.ports.as_deref().unwrap_or_default() else {
        panic!("the Service has one port");
    };
    assert_eq!(
        service_port.target_port,
        Some(IntOrString::String("http".into()))
    );
    let budget: PodDisruptionBudget = the(&objects, "PodDisruptionBudget");
    let selector = budget
        .spec
        .and_then(|s| s.selector)
        .expect("a PDB selector");
    for (key, value) in selector.match_labels.iter().flatten() {
        assert_eq!(labels.get(key), Some(value), "the PDB selects the daemon");
    }
}

fn pod_labels(objects: &[Value]) -> BTreeMap<String, String> {
    let deployment: Deployment = the(objects, "Deployment");
    deployment
        .spec
        .template
        .metadata
        .and_then(|m| m.labels)
        .unwrap_or_default()
}

/// daemon.yaml as the ConfigMap carries it, read the way `plumber daemon` reads it.
fn daemon_config(objects: &[Value]) -> Config {
    let config_map: ConfigMap = the(objects, "ConfigMap");
    let text = config_map
        .data
        .as_ref()
        .and_then(|d| d.get("daemon.yaml"))
        .expect("the ConfigMap holds daemon.yaml");
    Config::parse(text, Path::new("daemon.yaml")).expect("the daemon reads its config")
}

#[test]
fn the_daemon_reads_the_config_it_is_given() {
    let objects = rendered();
    let (_, pod) = pod_spec(&objects);
    let container = the_container(&pod);
    let config_map: ConfigMap = the(&objects, "ConfigMap");
    let config_map_name = config_map.metadata.name.expect("a ConfigMap name");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.config_map
                .as_ref()
                .is_some_and(|c| c.name == config_map_name)
        })
        .expect("the pod mounts the generated ConfigMap");
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .expect("the container mounts the config volume");
    let args = container.args.clone().unwrap_or_default();
    assert_eq!(
        args,
        [
            "daemon".to_owned(),
            "--config".into(),
            format!("{}/daemon.yaml", mount.mount_path)
        ]
    );
    let config = daemon_config(&objects);
    assert!(
        config.kubernetes.kubeconfig.is_none(),
        "the in-cluster client"
    );
    // Whatever daemon.yaml names as files must be where the pod mounts something.
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    let mounted = |path: &Path| mounts.iter().any(|m| path.starts_with(m));
    assert!(mounted(&config.cache_dir), "{}", config.cache_dir.display());
    let credentials = &config.repository.credentials;
    for file in [
        &credentials.password_file,
        &credentials.ssh_key_file,
        &credentials.known_hosts_file,
    ]
    .into_iter()
    .flatten()
    {
        assert!(mounted(file), "{} is not mounted", file.display());
    }
    for cluster in config.kafka.clusters.values() {
        if let Some(credentials) = &cluster.credentials {
            assert!(mounted(&credentials.dir), "{}", credentials.dir.display());
        }
    }
    // Signed commits are opt-in: daemon.yaml shows them commented out; uncommented, the
    // directory it names is where the pod mounts the trusted keys.
    assert!(config.trusted_keys.is_none(), "opt-in");
    let text = std::fs::read_to_string(deploy_dir().join("daemon.yaml")).expect("daemon.yaml");
    assert!(
        text.contains("\n# trustedKeys: "),
        "daemon.yaml shows trustedKeys"
    );
    let opted_in = Config::parse(
        &text.replace("\n# trustedKeys: ", "\ntrustedKeys: "),
        Path::new("daemon.yaml"),
    )
    .expect("daemon.yaml with trustedKeys reads");
    let keys = opted_in.trusted_keys.expect("trustedKeys is read");
    assert!(mounted(&keys), "{} is not mounted", keys.display());
}

/// One RBAC rule, flattened for comparison: (API group, resource, resource names, verbs).
type Rule = (String, String, Vec<String>, BTreeSet<String>);

fn rules_of(role: &Role) -> BTreeSet<Rule> {
    let mut granted = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        assert!(rule.non_resource_urls.is_none());
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                granted.insert((
                    group.clone(),
                    resource.clone(),
                    rule.resource_names.clone().unwrap_or_default(),
                    rule.verbs.iter().cloned().collect(),
                ));
            }
        }
    }
    granted
}

fn rule(group: &str, resource: &str, names: &[&str], verbs: &[&str]) -> Rule {
    (
        group.into(),
        resource.into(),
        names.iter().map(|&n| n.into()).collect(),
        verbs.iter().map(|&v| v.into()).collect(),
    )
}

/// SPEC §11: with deploy/processors/ (an overlay as deploy/README.md shows), processors run in
/// `plumber-processors`; the daemon may create no StatefulSet where its own Secrets are, and
/// may manage processors only there.
#[test]
fn processors_apart_run_where_the_daemons_secrets_are_not() {
    let overlay =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/deploy-overlays/processors-apart");
    let objects = rendered_from(&overlay);
    let roles: Vec<Role> = objects
        .iter()
        .filter(|o| o["kind"] == "Role")
        .map(|o| serde_json::from_value(o.clone()).unwrap())
        .collect();
    let role_in = |namespace: &str| {
        roles
            .iter()
            .find(|r| r.metadata.namespace.as_deref() == Some(namespace))
            .unwrap_or_else(|| panic!("a Role in {namespace}"))
    };
    let manage = ["get", "list", "watch", "create", "patch", "delete"];
    let config = daemon_config(&objects);
    let processors = config
        .kubernetes
        .processor_namespace
        .clone()
        .expect("the overlay's daemon.yaml names the processors' namespace");
    assert_eq!(
        rules_of(role_in(&processors)),
        BTreeSet::from([
            rule("apps", "statefulsets", &[], &manage),
            rule("keda.sh", "scaledobjects", &[], &manage),
            rule("keda.sh", "triggerauthentications", &[], &manage),
            rule("", "pods", &[], &["get", "list", "watch"]),
        ])
    );
    let daemon = rules_of(role_in("plumber"));
    assert!(
        !daemon
            .iter()
            .any(|(_, resource, _, _)| resource == "statefulsets" || resource == "secrets"),
        "{daemon:?}"
    );
    assert!(daemon.contains(&rule("", "pods", &[], &["get", "patch"])));
    let bindings: Vec<RoleBinding> = objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding")
        .map(|o| serde_json::from_value(o.clone()).unwrap())
        .collect();
    let binding = bindings
        .iter()
        .find(|b| b.metadata.namespace.as_deref() == Some(processors.as_str()))
        .expect("a RoleBinding in the processors' namespace");
    let [subject] = binding.subjects.as_deref().unwrap_or_default() else {
        panic!("one subject");
    };
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("plumber", Some("plumber")),
        "the daemon's ServiceAccount"
    );
    let namespaces: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert!(namespaces.contains(processors.as_str()), "{namespaces:?}");
}

#[test]
fn the_role_grants_exactly_what_the_daemon_needs() {
    let objects = rendered();
    let role: Role = the(&objects, "Role");
    let granted = rules_of(&role);
    let config = daemon_config(&objects);
    let manage = ["get", "list", "watch", "create", "patch", "delete"];
    let expected = BTreeSet::from([
        rule("plumber.dev", "topologies", &[], &manage),
        rule(
            "plumber.dev",
            "topologies/status",
            &[],
            &["get", "patch", "update"],
        ),
        rule("events.k8s.io", "events", &[], &["create", "patch"]),
        rule("apps", "statefulsets", &[], &manage),
        rule("keda.sh", "scaledobjects", &[], &manage),
        rule("keda.sh", "triggerauthentications", &[], &manage),
        rule("", "pods", &[], &["get", "list", "watch", "patch"]),
        rule("coordination.k8s.io", "leases", &[], &["create"]),
        rule(
            "coordination.k8s.io",
            "leases",
            &[config.kubernetes.lease.as_str()],
            &["get", "update"],
        ),
    ]);
    assert_eq!(granted, expected);
    // No Secrets: the daemon's are mounted, processors and KEDA only name theirs.
    assert!(
        !granted
            .iter()
            .any(|(_, resource, _, _)| resource == "secrets")
    );

    let binding: RoleBinding = the(&objects, "RoleBinding");
    assert_eq!(binding.role_ref.kind, "Role");
    assert_eq!(Some(binding.role_ref.name), role.metadata.name);
    let account: ServiceAccount = the(&objects, "ServiceAccount");
    let [subject] = binding.subjects.as_deref().unwrap_or_default() else {
        panic!("the RoleBinding has one subject");
    };
    assert_eq!(subject.kind, "ServiceAccount");
    assert_eq!(Some(&subject.name), account.metadata.name.as_ref());
    assert_eq!(subject.namespace.as_deref(), Some("plumber"));
}
