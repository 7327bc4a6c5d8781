//! The Kubernetes objects of processors (SPEC §7): each rendered object checked for content and
//! against the schema the API server would enforce (k8s-openapi's types, KEDA's own CRDs from
//! `../shared/schemas/keda`, copied into `testkit/fixtures/keda` with their licence, and the
//! Topology CRD).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Container;
use plumber::runtime::kube::render::{self, Objects, RenderConfig};
use plumber::runtime::{Cluster, ProcessorSpec, Settings};
use plumber::spec::{EnvValue, Resources, Scale, SecretRef, Transform};
use plumber_testkit::kube_api::{KEDA_SCALED_OBJECT_CRD, KEDA_TRIGGER_AUTHENTICATION_CRD};
use serde_json::Value;

/// `spec.versions[0].schema.openAPIV3Schema` of a CRD file, as a validator.
fn crd_validator(crd: &Value) -> jsonschema::Validator {
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert!(schema.is_object(), "no openAPIV3Schema in {crd}");
    jsonschema::validator_for(schema).unwrap()
}

fn keda(crd: &str) -> jsonschema::Validator {
    crd_validator(&serde_saphyr::from_str::<Value>(crd).unwrap())
}

fn assert_valid(validator: &jsonschema::Validator, object: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(object)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}\n{object:#}");
}

fn config() -> RenderConfig {
    RenderConfig {
        namespace: "data".into(),
        processor_image: "ghcr.io/plumber-dev/plumber-processor:0.1.0".into(),
        pull_policy: Some("IfNotPresent".into()),
        owner: None,
    }
}

fn spec(transform: Transform) -> ProcessorSpec {
    // Names at their longest (40 characters) and a later life: labels must stay valid.
    let topology = "t".repeat(40);
    let step = "s".repeat(40);
    ProcessorSpec {
        group: format!("plumber.{topology}.{step}.abababababab.12"),
        topology,
        step,
        identity: "ab".repeat(32).parse().unwrap(),
        cluster: Cluster {
            bootstrap: "kafka-0:9093,kafka-1:9093".into(),
            properties: BTreeMap::from([
                ("security.protocol".into(), "SASL_SSL".into()),
                ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
            ]),
            credentials: Some("kafka-user".into()),
        },
        inputs: vec!["cars.raw".into(), "trucks.raw".into()],
        input_steps: BTreeMap::new(),
        outputs: vec!["out".into()],
        dlq: "plumber.t.s.dlq".into(),
        transform,
        env: BTreeMap::from([
            ("MODEL".into(), EnvValue::Value("v3".into())),
            (
                "API_KEY".into(),
                EnvValue::Secret {
                    secret_key_ref: SecretRef {
                        name: "scoring".into(),
                        key: "api-key".into(),
                    },
                },
            ),
        ]),
        scale: Scale {
            min: 0,
            max: 10,
            lag_threshold: 500,
        },
        resources: Some(Resources {
            cpu: Some("500m".into()),
            memory: Some("256Mi".into()),
        }),
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        dir: "topologies/t/steps".into(),
        settings: Settings::default(),
        state: None,
        table: None,
        handoff_group: None,
    }
}

fn jq() -> Transform {
    Transform::Jq {
        program: "select(.ok)".into(),
    }
}

fn rendered(spec: &ProcessorSpec) -> Objects {
    render::processor(spec, &config()).unwrap()
}

fn containers(workload: &StatefulSet) -> Vec<Container> {
    let pod = workload.spec.template.spec.as_ref().unwrap();
    pod.containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .cloned()
        .collect()
}

#[test]
fn scaled_objects_and_trigger_authentications_pass_kedas_own_schemas() {
    let scaled_objects = keda(KEDA_SCALED_OBJECT_CRD);
    let authentications = keda(KEDA_TRIGGER_AUTHENTICATION_CRD);
    for transform in [
        jq(),
        Transform::Http {
            image: "ghcr.io/acme/score:2".into(),
            port: 8080,
            path: "/score".into(),
            command: None,
        },
    ] {
        let objects = rendered(&spec(transform));
        assert_valid(
            &scaled_objects,
            &serde_json::to_value(&objects.scaled_object).unwrap(),
        );
        assert_valid(
            &authentications,
            &serde_json::to_value(objects.trigger_authentication.as_ref().unwrap()).unwrap(),
        );
    }
    // The schema is a real check: a ScaledObject without its target is refused.
    let mut broken = serde_json::to_value(&rendered(&spec(jq())).scaled_object).unwrap();
    broken["spec"]
        .as_object_mut()
        .unwrap()
        .remove("scaleTargetRef");
    assert!(!scaled_objects.is_valid(&broken));
}

#[test]
fn the_scaled_object_scales_the_statefulset_on_its_groups_lag_per_input_topic() {
    let spec = spec(jq());
    let objects = rendered(&spec);
    let so = serde_json::to_value(&objects.scaled_object).unwrap();
    assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
    assert_eq!(so["kind"], "ScaledObject");
    let workload = render::workload_name(&spec.group);
    assert_eq!(
        so["spec"]["scaleTargetRef"],
        serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": workload})
    );
    assert_eq!(so["metadata"]["name"], spec.group.as_str());
    assert_eq!(
        objects.workload.metadata.name.as_deref(),
        Some(workload.as_str())
    );
    // Pods come and go together; their names, not their order, carry the transactional id.
    assert_eq!(
        objects.workload.spec.pod_management_policy.as_deref(),
        Some("Parallel")
    );
    assert_eq!(so["spec"]["minReplicaCount"], 0, "min: 0 scales to zero");
    assert_eq!(so["spec"]["maxReplicaCount"], 10);
    let triggers = so["spec"]["triggers"].as_array().unwrap();
    let topics: Vec<&str> = triggers
        .iter()
        .map(|t| t["metadata"]["topic"].as_str().unwrap())
        .collect();
    assert_eq!(topics, ["cars.raw", "trucks.raw"]);
    for trigger in triggers {
        assert_eq!(trigger["type"], "kafka");
        let metadata = &trigger["metadata"];
        assert_eq!(metadata["consumerGroup"], spec.group.as_str());
        assert_eq!(metadata["bootstrapServers"], "kafka-0:9093,kafka-1:9093");
        assert_eq!(metadata["lagThreshold"], "500");
        assert_eq!(metadata["sasl"], "scram_sha512");
        assert_eq!(metadata["tls"], "enable");
    }
    // Credentials by reference to the cluster's Secret, keyed by librdkafka property names,
    // in one TriggerAuthentication per cluster credentials that every processor shares.
    let auth = serde_json::to_value(objects.trigger_authentication.unwrap()).unwrap();
    let shared = auth["metadata"]["name"].as_str().unwrap();
    assert!(shared.starts_with("plumber-kafka-kafka-user-"), "{shared}");
    assert!(auth["metadata"].get("ownerReferences").is_none());
    for trigger in triggers {
        assert_eq!(trigger["authenticationRef"]["name"], shared);
    }
    let mut other = spec.clone();
    other.group = "plumber.t.other.0123456789ab".into();
    let theirs = rendered(&other).trigger_authentication.unwrap();
    assert_eq!(theirs.metadata.name.as_deref(), Some(shared), "shared");
    let mut plaintext = other.clone();
    plaintext.cluster.properties.clear();
    let apart = rendered(&plaintext).trigger_authentication.unwrap();
    assert_ne!(
        apart.metadata.name.as_deref(),
        Some(shared),
        "the same Secret taken otherwise is another one"
    );
    let refs: Vec<(String, String, String)> = auth["spec"]["secretTargetRef"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["parameter"].as_str().unwrap().to_owned(),
                r["name"].as_str().unwrap().to_owned(),
                r["key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        refs,
        [
            (
                "username".into(),
                "kafka-user".into(),
                "sasl.username".into()
            ),
            (
                "password".into(),
                "kafka-user".into(),
                "sasl.password".into()
            ),
            ("ca".into(), "kafka-user".into(), "ca.crt".into()),
        ]
    );
    // No credentials: no TriggerAuthentication, and no reference to one.
    let mut plain = spec.clone();
    plain.cluster = Cluster::at("kafka:9092");
    let objects = rendered(&plain);
    assert!(objects.trigger_authentication.is_none());
    let so = serde_json::to_value(&objects.scaled_object).unwrap();
    assert!(so["spec"]["triggers"][0].get("authenticationRef").is_none());
    assert!(so["spec"]["triggers"][0]["metadata"].get("sasl").is_none());
}

/// A warm start (`start-warm`) runs the same processor holding its partitions: it is told its
/// hand-off group, and KEDA, finding no committed offsets before the hand-off, counts 1 per
/// partition (so a step scaled to zero still gets an instance to be warm) rather than every
/// record of the topic.
#[test]
fn a_warm_start_names_its_hand_off_group_and_is_not_scaled_on_a_guess() {
    let cold = spec(jq());
    let warm = cold.clone().warm();
    let policy = |spec: &ProcessorSpec| -> Vec<String> {
        let so = serde_json::to_value(&rendered(spec).scaled_object).unwrap();
        so["spec"]["triggers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                t["metadata"]["offsetResetPolicy"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    assert_eq!(policy(&cold), ["earliest", "earliest"]);
    assert_eq!(policy(&warm), ["latest", "latest"]);
    let args = |spec: &ProcessorSpec| -> Vec<String> {
        let workload = rendered(spec).workload;
        let processor = containers(&workload)
            .into_iter()
            .find(|c| c.name == "processor")
            .unwrap();
        processor.args.unwrap_or_default()
    };
    let handoff = format!("{}.handoff", cold.group);
    assert!(
        args(&warm)
            .windows(2)
            .any(|w| w[0] == "--handoff-group" && w[1] == handoff),
        "{:?}",
        args(&warm)
    );
    assert!(!args(&cold).iter().any(|a| a == "--handoff-group"));
    assert_valid(
        &keda(KEDA_SCALED_OBJECT_CRD),
        &serde_json::to_value(&rendered(&warm).scaled_object).unwrap(),
    );
}

#[test]
fn labels_say_what_runs_and_stay_valid_at_the_longest_names() {
    let spec = spec(jq());
    let objects = rendered(&spec);
    let labels = objects.workload.metadata.labels.clone().unwrap();
    assert_eq!(labels["app.kubernetes.io/managed-by"], "plumber");
    assert_eq!(labels["plumber.dev/topology"], spec.topology);
    assert_eq!(labels["plumber.dev/step"], spec.step);
    assert_eq!(labels["plumber.dev/identity"], "abababababab");
    assert_eq!(labels["plumber.dev/commit"], "0123456789ab");
    assert_eq!(labels["plumber.dev/life"], "12");
    for (key, value) in &labels {
        assert!(value.len() <= 63, "{key}={value}");
        assert!(
            value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{key}={value}"
        );
    }
    // The selector picks this life's pods only, and the template carries it.
    let selector = objects.workload.spec.selector.match_labels.clone().unwrap();
    let template = objects
        .workload
        .spec
        .template
        .metadata
        .clone()
        .unwrap()
        .labels
        .unwrap();
    for (key, value) in &selector {
        assert_eq!(template.get(key), Some(value), "{key}");
    }
    assert!(!selector.contains_key("plumber.dev/commit"));
    // The same selector from the group's name alone (a stop after the StatefulSet went).
    assert_eq!(
        render::selector_of_group(&spec.group),
        Some(selector.clone())
    );
    let first_life = ProcessorSpec {
        group: format!("plumber.{}.{}.abababababab", spec.topology, spec.step),
        ..spec.clone()
    };
    assert_eq!(
        render::selector_of_group(&first_life.group),
        Some(render::selector(&first_life))
    );
    // A StatefulSet is named after the step its group's name holds, and the group's hash.
    for group in [
        spec.group.as_str(),
        first_life.group.as_str(),
        "plumber.shop.pr-12.score.cdcdcdcdcdcd.3",
    ] {
        let step = &render::selector_of_group(group).unwrap()["plumber.dev/step"];
        let name = render::workload_name(group);
        assert!(name.starts_with(&format!("{step}-")), "{group}: {name}");
        assert_eq!(name.len(), step.len() + 11, "{name}");
    }
    assert_ne!(
        render::workload_name(&spec.group),
        render::workload_name(&first_life.group),
        "lives of one step have StatefulSets of their own"
    );
    for other in [
        "orders",
        "plumber.t.s",
        "plumber.t.s.nothex000000",
        "plumber.t.s.abababababab.x",
    ] {
        assert_eq!(render::selector_of_group(other), None, "{other}");
    }
    // Replicas are KEDA's: plumber's apply never sets them.
    assert_eq!(objects.workload.spec.replicas, None);
    // What runs is readable back from the StatefulSet, secrets by reference only.
    let annotation = &objects.workload.metadata.annotations.unwrap()["plumber.dev/processor"];
    let back: ProcessorSpec = serde_json::from_str(annotation).unwrap();
    assert_eq!(back, spec);
}

#[test]
fn every_container_is_locked_down_and_the_processor_is_probed() {
    let transforms = [
        jq(),
        Transform::Sql {
            query: "SELECT id FROM cars".into(),
            state: None,
            table: None,
        },
        Transform::Http {
            image: "ghcr.io/acme/score:2".into(),
            port: 8080,
            path: "/score".into(),
            command: Some(vec!["python3".into(), "serve.py".into()]),
        },
        Transform::Exec {
            command: vec!["python3".into(), "enrich.py".into()],
            image: Some("ghcr.io/acme/enrich:1.4".into()),
        },
    ];
    for transform in transforms {
        let objects = rendered(&spec(transform.clone()));
        // The API server's own types read it back unchanged.
        let json = serde_json::to_value(&objects.workload).unwrap();
        let back: StatefulSet = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(serde_json::to_value(&back).unwrap(), json);
        let pod = objects.workload.spec.template.spec.as_ref().unwrap();
        let pod_security = pod.security_context.as_ref().unwrap();
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert_eq!(
            pod_security.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        for container in containers(&objects.workload) {
            let security = container.security_context.as_ref().unwrap();
            assert_eq!(security.run_as_non_root, Some(true), "{}", container.name);
            assert_eq!(security.read_only_root_filesystem, Some(true));
            assert_eq!(security.allow_privilege_escalation, Some(false));
            assert_eq!(
                security.capabilities.as_ref().unwrap().drop.as_deref(),
                Some(&["ALL".to_owned()][..])
            );
        }
        let runs_processor: Vec<Container> = containers(&objects.workload)
            .into_iter()
            .filter(|c| {
                c.args
                    .as_ref()
                    .is_some_and(|a| a.contains(&"--group".into()))
            })
            .collect();
        assert_eq!(runs_processor.len(), 1, "{transform:?}");
        let processor = &runs_processor[0];
        for probe in [&processor.liveness_probe, &processor.readiness_probe] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some("/healthz"));
        }
        let args = processor.args.as_ref().unwrap();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--metrics" && w[1] == "0.0.0.0:9400"),
            "{args:?}"
        );
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--kafka-credentials" && w[1] == "/etc/plumber/kafka"),
            "{args:?}"
        );
        // The credentials are the mounted Secret; secret env values are references.
        let mounts = processor.volume_mounts.as_ref().unwrap();
        assert!(mounts.iter().any(|m| m.mount_path == "/etc/plumber/kafka"));
        let env = processor.env.as_ref().unwrap();
        let api_key = env.iter().find(|e| e.name == "API_KEY").unwrap();
        assert_eq!(api_key.value, None);
        let selector = api_key
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(
            (selector.name.as_str(), selector.key.as_str()),
            ("scoring", "api-key")
        );
        let resources = processor.resources.as_ref().unwrap();
        assert_eq!(resources.requests.as_ref().unwrap()["cpu"].0, "500m");
        assert_eq!(resources.limits.as_ref().unwrap()["memory"].0, "256Mi");
        assert!(!resources.limits.as_ref().unwrap().contains_key("cpu"));
    }
}

#[test]
fn each_transform_runs_where_spec_7_says() {
    let images = |objects: &Objects| -> Vec<(String, String)> {
        containers(&objects.workload)
            .into_iter()
            .map(|c| (c.name, c.image.unwrap()))
            .collect()
    };
    let processor_image = config().processor_image;
    assert_eq!(
        images(&rendered(&spec(jq()))),
        [("processor".to_owned(), processor_image.clone())]
    );
    let http = rendered(&spec(Transform::Http {
        image: "ghcr.io/acme/score:2".into(),
        port: 8080,
        path: "/score".into(),
        command: None,
    }));
    assert_eq!(
        images(&http),
        [
            ("processor".to_owned(), processor_image.clone()),
            ("step".to_owned(), "ghcr.io/acme/score:2".to_owned())
        ]
    );
    let exec = rendered(&spec(Transform::Exec {
        command: vec!["python3".into(), "enrich.py".into()],
        image: Some("ghcr.io/acme/enrich:1.4".into()),
    }));
    assert_eq!(
        images(&exec),
        [
            ("step".to_owned(), "ghcr.io/acme/enrich:1.4".to_owned()),
            ("install-processor".to_owned(), processor_image)
        ]
    );
    let pod = exec.workload.spec.template.spec.unwrap();
    let step = &pod.containers[0];
    assert_eq!(
        step.command.as_deref(),
        Some(&["/plumber/plumber-processor".to_owned()][..])
    );
    let args = step.args.as_ref().unwrap();
    assert_eq!(
        &args[args.len() - 4..],
        ["--exec", "--", "python3", "enrich.py"]
    );
    let init = &pod.init_containers.unwrap()[0];
    assert_eq!(
        init.command.as_deref(),
        Some(
            &[
                "cp".to_owned(),
                "/plumber-processor".to_owned(),
                "/plumber/plumber-processor".to_owned()
            ][..]
        )
    );
    // Without an image there is nothing to run the command in.
    let error = render::processor(
        &spec(Transform::Exec {
            command: vec!["python3".into(), "enrich.py".into()],
            image: None,
        }),
        &config(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("`image`"), "{error}");
}

#[test]
fn plumber_render_prints_the_objects_of_the_example_repository() {
    let repo = common::TestRepo::new();
    let commit = repo.commit_snapshot("main", "example", &common::example_files());
    let (code, out, err) = common::run(&[
        "render",
        &repo.location(),
        "--rev",
        &commit.to_string(),
        "--repository",
        "https://git.example.com/data/topologies.git",
    ]);
    assert_eq!(code, 0, "{err}");
    let documents: Vec<Value> = out
        .split("\n---\n")
        .map(|d| d.trim_start_matches("---\n"))
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_saphyr::from_str(d).unwrap())
        .collect();
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    let count = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!(count("Topology"), 2, "{kinds:?}");
    assert_eq!(count("StatefulSet"), count("ScaledObject"));
    assert!(count("StatefulSet") >= 5, "{kinds:?}");
    let topology_crd = serde_json::to_value(plumber::runtime::kube::crd::definition()).unwrap();
    let topologies = crd_validator(&topology_crd);
    let scaled_objects = keda(KEDA_SCALED_OBJECT_CRD);
    for document in &documents {
        match document["kind"].as_str().unwrap() {
            "Topology" => assert_valid(&topologies, document),
            "ScaledObject" => assert_valid(&scaled_objects, document),
            "StatefulSet" => {
                let _: StatefulSet = serde_json::from_value(document.clone()).unwrap();
            }
            other => panic!("unexpected {other}"),
        }
        assert_eq!(document["metadata"]["namespace"], "plumber");
    }
    // Invalid commits render nothing, as `plan` and `graph` do.
    let bad = repo.commit(
        "main",
        "broken",
        &[common::write(
            "topologies/clicks/steps/normalize.yaml",
            "kind: processor\n",
        )],
    );
    let (code, out, _) = common::run(&["render", &repo.location(), "--rev", &bad.to_string()]);
    assert_eq!(code, 1);
    assert!(out.is_empty(), "{out}");
}

/// A pull request's preview environment (SPEC §9) runs as topology `<topology>.<slug>`: its
/// objects are valid at the longest topology name and slug, their names with the dot are
/// DNS subdomains, label values stay within 63 characters (the StatefulSet's name within 52:
/// its pods' `controller-revision-hash` is `<name>-<10 characters>`), and the pods of a life
/// whose StatefulSet went are still found from the group's name alone.
#[test]
fn a_preview_topology_renders_valid_objects_at_the_longest_names() {
    let name = "t".repeat(plumber::spec::names::MAX_NAME_LEN);
    let files = |jq: &str| {
        let files: Vec<plumber::spec::SourceFile> = [
            ("sources/in.yaml", "kind: source\ntopic: in\n".to_owned()),
            (
                "steps/score.yaml",
                format!("kind: processor\ninput: in\njq: '{jq}'\n"),
            ),
            (
                "sinks/out.yaml",
                "kind: sink\ntopic: out\ninput: score\n".to_owned(),
            ),
        ]
        .into_iter()
        .map(|(path, text)| plumber::spec::SourceFile {
            path: format!("topologies/{name}/{path}"),
            content: plumber::spec::FileContent::Bytes(text.into_bytes()),
        })
        .collect();
        plumber::validate(&files)
    };
    let running = files(".").topologies.unwrap().remove(0);
    let merged = files(".score").topologies.unwrap().remove(0);
    let clusters = files(".").clusters;
    let deployment = plumber::plan::Deployment::of(&running);
    let slug = plumber::plan::preview::slug_of_ref("refs/pull/12345678901234567/head");
    assert_eq!(slug.len(), plumber::plan::preview::MAX_SLUG_LEN);
    let previews = plumber::plan::preview::previews(
        std::slice::from_ref(&merged),
        |_| Some(&deployment),
        &clusters,
        &slug,
    )
    .unwrap();
    let [preview] = previews.as_slice() else {
        panic!("one preview: {previews:?}");
    };
    assert_eq!(preview.graph.name, format!("{name}.{slug}"));
    let documents = render::revision(
        "0123456789abcdef0123456789abcdef01234567",
        std::slice::from_ref(&preview.graph),
        &clusters,
        &render::Source {
            repository: "https://git.example.com/data/topologies.git".into(),
            git_ref: "refs/pull/12345678901234567/head".into(),
        },
        &config(),
    )
    .unwrap();
    let topology_crd = serde_json::to_value(plumber::runtime::kube::crd::definition()).unwrap();
    let topologies = crd_validator(&topology_crd);
    let scaled_objects = keda(KEDA_SCALED_OBJECT_CRD);
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["Topology", "StatefulSet", "ScaledObject"],
        "one processor"
    );
    for document in &documents {
        let object_name = document["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            plumber::spec::names::secret_name_problem(object_name),
            None,
            "a DNS subdomain, as object names must be"
        );
        for (key, value) in document["metadata"]["labels"].as_object().unwrap() {
            let value = value.as_str().unwrap();
            assert!(value.len() <= 63, "{key}={value}");
            assert!(
                value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "{key}={value}"
            );
        }
        match document["kind"].as_str().unwrap() {
            "Topology" => {
                assert_valid(&topologies, document);
                assert_eq!(object_name, preview.graph.name);
                // One dot, for a preview; never more.
                let mut two_dots = document.clone();
                two_dots["spec"]["topology"] = "a.b.c".into();
                assert!(!topologies.is_valid(&two_dots));
            }
            "ScaledObject" => assert_valid(&scaled_objects, document),
            _ => {
                let workload: StatefulSet = serde_json::from_value(document.clone()).unwrap();
                let annotation =
                    &workload.metadata.annotations.as_ref().unwrap()["plumber.dev/processor"];
                let group = serde_json::from_str::<ProcessorSpec>(annotation)
                    .unwrap()
                    .group;
                assert!(group.starts_with(&format!("plumber.{name}.{slug}.score.")));
                assert!(group.len() > 52, "the longest group: {group}");
                assert_eq!(object_name, render::workload_name(&group));
                assert!(object_name.len() <= 52, "{object_name}");
                assert!(object_name.starts_with("score-"), "{object_name}");
                assert_eq!(
                    render::selector_of_group(&group),
                    workload.spec.selector.match_labels.clone(),
                    "the selector from the group's name alone"
                );
                assert_eq!(
                    render::selector_of_group(&format!("{group}.3"))
                        .unwrap()
                        .get("plumber.dev/life")
                        .map(String::as_str),
                    Some("3")
                );
            }
        }
    }
}
