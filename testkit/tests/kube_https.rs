//! The fake Kubernetes API server over HTTPS, through a `kube::Client` built from the
//! kubeconfig it writes (as `plumber daemon` builds its own), and its RBAC mode, with the
//! Roles of `deploy/` as a cluster would get them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::path::{Path, PathBuf};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use plumber_testkit::PATIENCE;
use plumber_testkit::kube_api::{Attributes, FakeApi, Rbac, Served};
use serde_json::{Value, json};

const NS: &str = "plumber";

/// A client as the daemon makes one from `kubernetes.kubeconfig` (src/cluster.rs): the file
/// read, then `Config::from_custom_kubeconfig`, then `Client::try_from`.
async fn client_from_kubeconfig(served: &Served, namespace: &str) -> (kube::Client, kube::Config) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    served.write_kubeconfig(&path, namespace).unwrap();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    (kube::Client::try_from(config.clone()).unwrap(), config)
}

fn config_map(name: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"key": value},
    })
}

fn data(map: &ConfigMap) -> &str {
    map.data.as_ref().unwrap()["key"].as_str()
}

async fn next_event<S>(events: &mut S) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    tokio::time::timeout(PATIENCE, events.next())
        .await
        .expect("no watch event in time")
        .expect("the watch ended")
        .unwrap()
}

// A synchronous test: the server runs on its own thread and runtime, the client on this one.
#[test]
fn a_client_from_the_kubeconfig_gets_lists_applies_and_watches_over_https() {
    let fake = FakeApi::new();
    let served = fake.serve_https();
    assert!(served.url().starts_with("https://127.0.0.1:"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (client, config) = client_from_kubeconfig(&served, NS).await;
        assert_eq!(config.default_namespace, NS);
        let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());

        let applied = maps
            .patch(
                "settings",
                &PatchParams::apply("test"),
                &Patch::Apply(config_map("settings", "one")),
            )
            .await
            .unwrap();
        assert_eq!(data(&applied), "one");
        assert_eq!(data(&maps.get("settings").await.unwrap()), "one");
        let list = maps.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 1);
        assert_eq!(
            data(&fake.get::<ConfigMap>(NS, "settings").unwrap()),
            "one",
            "the server's store is the handle's"
        );

        // A watch from the list's version streams each change as it is made, while it stays
        // open: the handle's, then the client's own.
        let version = list.metadata.resource_version.unwrap();
        let mut events = maps
            .watch(&WatchParams::default().timeout(290), &version)
            .await
            .unwrap()
            .boxed();
        fake.patch::<ConfigMap>(NS, "settings", json!({"data": {"key": "two"}}));
        match next_event(&mut events).await {
            WatchEvent::Modified(map) => assert_eq!(data(&map), "two"),
            other => panic!("expected the change, got {other:?}"),
        }
        maps.create(
            &PostParams::default(),
            &serde_json::from_value(config_map("other", "three")).unwrap(),
        )
        .await
        .unwrap();
        match next_event(&mut events).await {
            WatchEvent::Added(map) => assert_eq!(data(&map), "three"),
            other => panic!("expected the new ConfigMap, got {other:?}"),
        }
        assert_eq!(fake.active_watches(), 1);

        // kube's watcher (list, then watch) works over it too.
        let mut watcher = kube::runtime::watcher(maps.clone(), Default::default()).boxed();
        let mut listed = Vec::new();
        loop {
            let event = tokio::time::timeout(PATIENCE, watcher.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            match event {
                kube::runtime::watcher::Event::InitApply(map) => listed.push(data(&map).to_owned()),
                kube::runtime::watcher::Event::InitDone => break,
                _ => {}
            }
        }
        listed.sort();
        assert_eq!(listed, ["three", "two"]);

        let summary: Vec<(String, Option<u16>)> = fake
            .requests()
            .iter()
            .map(|r| (r.summary(), r.status))
            .take(5)
            .collect();
        assert_eq!(
            summary,
            [
                ("apply configmaps/settings".to_string(), Some(201)),
                ("get configmaps/settings".to_string(), Some(200)),
                ("list configmaps".to_string(), Some(200)),
                ("watch configmaps".to_string(), Some(200)),
                ("create configmaps".to_string(), Some(201)),
            ]
        );
    });
    let addr = served.addr();
    drop(served);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the port is closed once the server is dropped"
    );
}

#[tokio::test]
async fn it_answers_only_the_token_and_is_trusted_only_through_its_ca() {
    let fake = FakeApi::new();
    let served = fake.serve_https();
    let (client, config) = client_from_kubeconfig(&served, NS).await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");

    let mut anonymous = config.clone();
    anonymous.auth_info = Default::default();
    let anonymous = kube::Client::try_from(anonymous).unwrap();
    match anonymous.apiserver_version().await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (401, "Unauthorized"))
        }
        other => panic!("expected 401 without the token, got {other:?}"),
    }

    // Without the CA the system's roots are used, and none of them signed the certificate.
    let mut untrusting = config.clone();
    untrusting.root_cert = None;
    let untrusting = kube::Client::try_from(untrusting).unwrap();
    match untrusting.apiserver_version().await {
        Err(kube::Error::Api(status)) => panic!("expected a TLS failure, got {status:?}"),
        Err(_) => {}
        Ok(_) => panic!("a client that does not trust the CA got an answer"),
    }
    assert_eq!(
        fake.requests().len(),
        1,
        "only the authenticated request reached the API"
    );
}

// ---- RBAC, with deploy/'s roles ----

fn deploy_file(file: &str) -> String {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What `kubectl apply -k deploy/` grants the daemon: the Roles and ClusterRoles among the
/// kustomization's resources, in its namespace, for the ServiceAccount of
/// `serviceaccount.yaml` (which `rolebinding.yaml` binds them to).
fn daemon_rbac() -> Rbac {
    let kustomization: Value = serde_saphyr::from_str(&deploy_file("kustomization.yaml")).unwrap();
    let namespace = kustomization["namespace"].as_str().unwrap();
    assert_eq!(namespace, NS);
    let account: Value = serde_saphyr::from_str(&deploy_file("serviceaccount.yaml")).unwrap();
    let binding: Value = serde_saphyr::from_str(&deploy_file("rolebinding.yaml")).unwrap();
    let account = account["metadata"]["name"].as_str().unwrap();
    assert_eq!(binding["subjects"][0]["name"], account);
    let resources: Vec<String> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| deploy_file(file.as_str().unwrap()))
        .collect();
    Rbac::service_account(namespace, account).with_roles_yaml(&resources.join("\n---\n"), namespace)
}

fn status_of<T: std::fmt::Debug>(result: kube::Result<T>) -> u16 {
    match result {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("expected an answer, got {other:?}"),
    }
}

fn forbidden_message<T: std::fmt::Debug>(result: kube::Result<T>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {
            assert_eq!(status.reason, "Forbidden");
            status.message.clone()
        }
        other => panic!("expected 403, got {other:?}"),
    }
}

fn workload(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "processor", "image": "plumber-processor"}]},
            },
        },
    })
}

fn topology_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "plumber.dev",
        "v1alpha1",
        "Topology",
    ))
}

#[tokio::test]
async fn rbac_allows_what_deploy_role_allows_and_forbids_the_rest() {
    let fake = FakeApi::new().with_rbac(daemon_rbac());
    let client = fake.client(NS);
    let apply = PatchParams::apply("plumber").force();
    let user = "system:serviceaccount:plumber:plumber";

    // StatefulSets: apply (which creates, so needs `create` too), get, list, watch, delete.
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let web = Patch::Apply(workload("web"));
    assert_eq!(
        status_of(statefulsets.patch("web", &apply, &web).await),
        200
    );
    assert_eq!(status_of(statefulsets.get("web").await), 200);
    assert_eq!(
        status_of(statefulsets.list(&ListParams::default()).await),
        200
    );
    let watch = statefulsets.watch(&WatchParams::default(), "0").await;
    assert_eq!(status_of(watch.map(|_| ())), 200);
    // No `update`: the daemon writes with server-side apply.
    let stored = statefulsets.get("web").await.unwrap();
    assert_eq!(
        forbidden_message(
            statefulsets
                .replace("web", &PostParams::default(), &stored)
                .await
        ),
        format!(
            "statefulsets.apps \"web\" is forbidden: User \"{user}\" cannot update resource \
             \"statefulsets\" in API group \"apps\" in the namespace \"plumber\""
        )
    );
    let scale = Patch::Merge(json!({"spec": {"replicas": 3}}));
    assert_eq!(
        forbidden_message(
            statefulsets
                .patch_scale("web", &PatchParams::default(), &scale)
                .await
        ),
        format!(
            "statefulsets.apps \"web\" is forbidden: User \"{user}\" cannot patch resource \
             \"statefulsets/scale\" in API group \"apps\" in the namespace \"plumber\""
        )
    );
    assert_eq!(
        status_of(statefulsets.delete("web", &DeleteParams::default()).await),
        200
    );
    // Only in its namespace.
    let elsewhere: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    assert_eq!(
        forbidden_message(elsewhere.list(&ListParams::default()).await),
        format!(
            "statefulsets.apps is forbidden: User \"{user}\" cannot list resource \"statefulsets\" \
             in API group \"apps\" in the namespace \"default\""
        )
    );
    let everywhere: Api<StatefulSet> = Api::all(client.clone());
    assert_eq!(
        forbidden_message(everywhere.list(&ListParams::default()).await),
        format!(
            "statefulsets.apps is forbidden: User \"{user}\" cannot list resource \"statefulsets\" \
             in API group \"apps\" at the cluster scope"
        )
    );

    // Topologies, and their status with `update` (the cutover record's precondition).
    let topologies: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &topology_resource());
    let topology = json!({
        "apiVersion": "plumber.dev/v1alpha1", "kind": "Topology",
        "metadata": {"name": "orders"}, "spec": {},
    });
    let created = topologies
        .create(
            &PostParams::default(),
            &serde_json::from_value(topology).unwrap(),
        )
        .await
        .unwrap();
    let mut with_status = created.clone();
    with_status.data["status"] = json!({"phase": "Running"});
    let replaced = topologies
        .replace_status("orders", &PostParams::default(), &with_status)
        .await;
    assert_eq!(status_of(replaced), 200);
    assert_eq!(status_of(topologies.get_status("orders").await), 200);

    // The Lease: `create` of any, the rest of `plumber` only.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    for name in ["plumber", "other"] {
        let lease = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        assert_eq!(
            status_of(leases.create(&PostParams::default(), &lease).await),
            200
        );
    }
    let mut lease = leases.get("plumber").await.unwrap();
    // A renewal replaces the Lease at the version read (the Role grants update, not patch).
    lease.spec = serde_json::from_value(json!({"holderIdentity": "me"})).unwrap();
    assert_eq!(
        status_of(
            leases
                .replace("plumber", &PostParams::default(), &lease)
                .await
        ),
        200
    );
    let renew = Patch::Merge(json!({"spec": {"holderIdentity": "me"}}));
    assert_eq!(
        status_of(
            leases
                .patch("plumber", &PatchParams::default(), &renew)
                .await
        ),
        403,
        "a patch of the Lease is not granted"
    );
    assert_eq!(
        forbidden_message(leases.get("other").await),
        format!(
            "leases.coordination.k8s.io \"other\" is forbidden: User \"{user}\" cannot get \
             resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"plumber\""
        )
    );
    assert_eq!(
        status_of(leases.list(&ListParams::default()).await),
        403,
        "a list names no Lease"
    );

    // Pods: read and labelled, never deleted; Events written.
    fake.put(
        &serde_json::from_value::<Pod>(json!({"metadata": {"name": "daemon-0", "namespace": NS}}))
            .unwrap(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    assert_eq!(status_of(pods.list(&ListParams::default()).await), 200);
    let label = Patch::Merge(json!({"metadata": {"labels": {"plumber.dev/lease-holder": "true"}}}));
    assert_eq!(
        status_of(
            pods.patch("daemon-0", &PatchParams::default(), &label)
                .await
        ),
        200
    );
    assert_eq!(
        status_of(pods.delete("daemon-0", &DeleteParams::default()).await),
        403
    );
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let event = serde_json::from_value(
        json!({"metadata": {"name": "orders.1"}, "eventTime": "2026-01-01T00:00:00.000000Z"}),
    )
    .unwrap();
    assert_eq!(
        status_of(events.create(&PostParams::default(), &event).await),
        200
    );

    // What it was never given: Secrets, ConfigMaps, anything cluster-scoped.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    assert_eq!(
        forbidden_message(secrets.list(&ListParams::default()).await),
        format!(
            "secrets is forbidden: User \"{user}\" cannot list resource \"secrets\" in API group \
             \"\" in the namespace \"plumber\""
        )
    );
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    assert_eq!(status_of(maps.get("plumber-config").await), 403);
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    assert_eq!(
        forbidden_message(cluster_roles.get("cluster-admin").await),
        format!(
            "clusterroles.rbac.authorization.k8s.io \"cluster-admin\" is forbidden: User \
             \"{user}\" cannot get resource \"clusterroles\" in API group \
             \"rbac.authorization.k8s.io\" at the cluster scope"
        )
    );
    // Discovery and /version are everyone's.
    assert_eq!(status_of(client.apiserver_version().await), 200);

    // The log records each denial as such, and a denied write changed nothing.
    let denied: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.status == Some(403))
        .map(|r| r.summary())
        .collect();
    assert_eq!(
        denied,
        [
            "replace statefulsets/web",
            "patch statefulsets/web/scale",
            "list statefulsets",
            "list statefulsets",
            "patch leases/plumber",
            "get leases/other",
            "list leases",
            "delete pods/daemon-0",
            "list secrets",
            "get configmaps/plumber-config",
            "get clusterroles/cluster-admin",
        ]
    );
    assert!(fake.get::<Pod>(NS, "daemon-0").is_some());
}

#[tokio::test]
async fn rbac_over_https_answers_what_kube_apiserver_answers() {
    let fake = FakeApi::new().with_rbac(daemon_rbac());
    let served = fake.serve_https();
    let (client, _) = client_from_kubeconfig(&served, NS).await;
    let statefulsets: Api<StatefulSet> = Api::default_namespaced(client.clone());
    assert_eq!(
        status_of(statefulsets.list(&ListParams::default()).await),
        200
    );
    // The answer as sent, not as kube reads it.
    let request = http::Request::get("/api/v1/namespaces/plumber/secrets/plumber-git")
        .body(kube::client::Body::empty())
        .unwrap();
    let response = client.send(request).await.unwrap();
    assert_eq!(response.status(), 403);
    let body = response.into_body().collect_bytes().await.unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "secrets \"plumber-git\" is forbidden: User \
                        \"system:serviceaccount:plumber:plumber\" cannot get resource \
                        \"secrets\" in API group \"\" in the namespace \"plumber\"",
            "reason": "Forbidden",
            "details": {"name": "plumber-git", "kind": "secrets"},
            "code": 403,
        })
    );
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    assert_eq!(status_of(secrets.list(&ListParams::default()).await), 403);
    let statuses: Vec<Option<u16>> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Some(200), Some(403), Some(403)]);
}

/// With deploy/processors/ (an overlay's component), the daemon's Role keeps its Topologies,
/// Events, Lease and own pod, and a Role in `plumber-processors` grants the processors'
/// objects.
#[tokio::test]
async fn rbac_of_processors_apart() {
    let rbac = Rbac::service_account(NS, "plumber")
        // The component's patch replaces the daemon Role's rules (a Role's rules have no merge
        // key): what daemon-role.yaml lists is all the daemon keeps in `plumber`.
        .with_roles_yaml(&deploy_file("processors/daemon-role.yaml"), NS)
        .with_roles_yaml(&deploy_file("processors/role.yaml"), NS);
    let allowed =
        |method: &str, path: &str| rbac.allows(&Attributes::of(method, path, &Default::default()));
    assert!(allowed(
        "GET",
        "/apis/apps/v1/namespaces/plumber-processors/statefulsets"
    ));
    assert!(!allowed(
        "GET",
        "/apis/apps/v1/namespaces/plumber/statefulsets"
    ));
    assert!(allowed("PATCH", "/api/v1/namespaces/plumber/pods/daemon-0"));
    assert!(!allowed("GET", "/api/v1/namespaces/plumber/pods"));
    assert!(allowed("GET", "/api/v1/namespaces/plumber-processors/pods"));
    assert!(!allowed(
        "PATCH",
        "/api/v1/namespaces/plumber-processors/pods/p"
    ));
    assert!(allowed(
        "GET",
        "/apis/plumber.dev/v1alpha1/namespaces/plumber/topologies"
    ));

    // A server-side apply that would create needs `create` as well as `patch`: the daemon may
    // label its pod, not make one.
    let fake = FakeApi::new().with_rbac(rbac);
    let pods: Api<Pod> = Api::namespaced(fake.client(NS), NS);
    let pod =
        Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "daemon-0"}}));
    assert_eq!(
        forbidden_message(
            pods.patch("daemon-0", &PatchParams::apply("plumber"), &pod)
                .await
        ),
        "pods \"daemon-0\" is forbidden: "
    );
    assert!(fake.get::<Pod>(NS, "daemon-0").is_none());
    fake.put(
        &serde_json::from_value::<Pod>(json!({"metadata": {"name": "daemon-0", "namespace": NS}}))
            .unwrap(),
    );
    assert_eq!(
        status_of(
            pods.patch("daemon-0", &PatchParams::apply("plumber"), &pod)
                .await
        ),
        200
    );
}

/// Two named clients' kubeconfigs: each one's requests are recorded as its own, and a token
/// that only begins like the server's is refused.
#[tokio::test]
async fn named_clients_are_told_apart_and_a_made_up_token_is_refused() {
    let fake = FakeApi::new();
    let served = fake.serve_https();
    let dir = tempfile::tempdir().unwrap();
    for name in ["replica-a", "replica-b"] {
        let path = dir.path().join(name);
        served.write_kubeconfig_as(&path, NS, name).unwrap();
        let config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&path).unwrap(),
            &KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        Api::<ConfigMap>::namespaced(client, NS)
            .list(&Default::default())
            .await
            .unwrap();
    }
    let clients: Vec<Option<String>> = fake.requests().into_iter().map(|r| r.client).collect();
    assert_eq!(
        clients,
        [Some("replica-a".to_owned()), Some("replica-b".to_owned())]
    );

    let (_, config) = client_from_kubeconfig(&served, NS).await;
    for token in [
        format!("{}.", served.token()),
        format!("{}x", served.token()),
    ] {
        let mut forged = config.clone();
        forged.auth_info.token = Some(token.into());
        let forged = kube::Client::try_from(forged).unwrap();
        match forged.apiserver_version().await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 401),
            other => panic!("expected 401 for a made-up token, got {other:?}"),
        }
    }
}
