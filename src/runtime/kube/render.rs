//! What a processor identity is in a cluster (SPEC §7): a StatefulSet, a KEDA ScaledObject that
//! scales it on its group's lag, and, when the cluster has credentials, the
//! TriggerAuthentication its scaler uses: one per cluster credentials (Secret and what the
//! cluster's properties take from it), shared by every processor that has them, not one
//! each. Pure: `plumber render` prints exactly what the runtime applies.
//!
//! - `jq` and `sql` steps run the processor image.
//! - `http` steps run the user's image as a second container beside the processor, which
//!   calls it on `127.0.0.1:<port><path>` (the sidecar model).
//! - `exec` steps run the user's image; an init container copies `plumber-processor` from the
//!   processor image into a shared volume, and the processor runs the step's command.
//!
//! A StatefulSet, not the Deployment SPEC §7 names: its pods keep their names across
//! replacement (`<workload>-0`, `-1`, …) and a replacement starts only once its predecessor
//! is gone, so the processor's transactional id (from the pod's name) passes to the
//! replacement, whose first transaction fences the predecessor and aborts what it left open:
//! read_committed readers downstream do not wait out the transaction timeout.
//!
//! Every container runs as non-root with a read-only root filesystem (a `/tmp` volume is
//! writable), no privilege escalation and no capabilities. The processor serves `/healthz`
//! and `/metrics` on [`METRICS_PORT`].

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use super::crd;
use super::keda::{
    AuthenticationRef, ScaleTargetRef, ScaleTrigger, ScaledObject, ScaledObjectSpec,
    SecretTargetRef, TriggerAuthentication, TriggerAuthenticationSpec,
};
use crate::graph::Topology;
use crate::graph::identity::SHORT_LEN;
use crate::plan::{self, Action, moves};
use crate::runtime::args::{Placement, processor_args};
use crate::runtime::{Cluster, ProcessorSpec, Settings, Target};
use crate::spec::{ClusterSpec, EnvValue, Transform};

/// Where the processor serves `/healthz` and `/metrics`.
pub const METRICS_PORT: u16 = 9400;
/// Where the cluster's credentials Secret is mounted.
pub const CREDENTIALS_DIR: &str = "/etc/plumber/kafka";
/// Where an `exec` step's init container puts `plumber-processor`.
const PROCESSOR_DIR: &str = "/plumber";
/// The processor binary's path in the processor image.
const PROCESSOR_IN_IMAGE: &str = "/plumber-processor";
/// The user a pod runs as: distroless' `nonroot`.
const RUN_AS: i64 = 65532;

pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const TOPOLOGY: &str = "plumber.dev/topology";
pub const STEP: &str = "plumber.dev/step";
pub const IDENTITY: &str = "plumber.dev/identity";
pub const LIFE: &str = "plumber.dev/life";
pub const COMMIT: &str = "plumber.dev/commit";
/// The annotation holding the [`ProcessorSpec`] a StatefulSet and its ScaledObject were
/// rendered from (secret values are never in it, only their references): what a restarted
/// daemon reads back.
pub const SPEC_ANNOTATION: &str = "plumber.dev/processor";

/// Settings of the cluster, not of any step.
#[derive(Debug, Clone)]
pub struct RenderConfig {
    pub namespace: String,
    /// The `plumber-processor` image.
    pub processor_image: String,
    pub pull_policy: Option<String>,
    /// The Topology owning a topology's objects, so deleting it deletes them.
    pub owner: Option<OwnerReference>,
}

/// The objects of one processor identity: the ScaledObject named after its consumer group,
/// the StatefulSet by [`workload_name`].
#[derive(Debug, Clone)]
pub struct Objects {
    pub workload: StatefulSet,
    pub scaled_object: ScaledObject,
    pub trigger_authentication: Option<TriggerAuthentication>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "step `{step}` runs an exec command without an `image`: on Kubernetes the command runs in \
         the step's image (`exec: {{ command: [...], image: registry/name:tag }}`)"
    )]
    ExecWithoutImage { step: String },
    #[error("cannot record the processor's spec for {group}: {message}")]
    Annotation { group: String, message: String },
    #[error(
        "topology `{topology}` runs on cluster `{cluster}`, which plumber.yaml does not define"
    )]
    NoCluster { topology: String, cluster: String },
}

/// Where the daemon follows the repository, as each Topology's spec says.
#[derive(Debug, Clone)]
pub struct Source {
    pub repository: String,
    pub git_ref: String,
}

/// Every object a revision runs when deployed from nothing, as `plumber render` prints it:
/// per topology its Topology resource, then the objects of each processor's first life.
/// Later lives differ only in their names (`.<life>`) and the commit label.
pub fn revision(
    commit: &str,
    topologies: &[Topology],
    clusters: &BTreeMap<String, ClusterSpec>,
    source: &Source,
    config: &RenderConfig,
) -> Result<Vec<serde_json::Value>, Error> {
    let mut out = Vec::new();
    // The TriggerAuthentications processors share, each printed once.
    let mut shared = BTreeSet::new();
    for topology in topologies {
        let cluster = clusters
            .get(&topology.cluster)
            .map(Cluster::of)
            .ok_or_else(|| Error::NoCluster {
                topology: topology.name.clone(),
                cluster: topology.cluster.clone(),
            })?;
        let mut resource = crd::Topology::new(
            &topology.name,
            crd::TopologySpec {
                topology: topology.name.clone(),
                repository: source.repository.clone(),
                git_ref: source.git_ref.clone(),
            },
        );
        resource.metadata.namespace = Some(config.namespace.clone());
        resource.metadata.labels = Some(BTreeMap::from([
            (MANAGED_BY.to_owned(), "plumber".to_owned()),
            (TOPOLOGY.to_owned(), topology.name.clone()),
        ]));
        out.push(json(&resource));
        let target = Target {
            commit,
            topology: Some(topology),
            cluster: Some(&cluster),
            settings: Settings::default(),
        };
        for action in moves::plan(&topology.name, &plan::Deployment::default(), Some(topology)) {
            let Action::StartProcessor(start) = action else {
                continue;
            };
            let spec = ProcessorSpec::starting(&topology.name, &start, &cluster, &target);
            let objects = processor(&spec, config)?;
            out.push(json(&objects.workload));
            out.push(json(&objects.scaled_object));
            if let Some(authentication) = &objects.trigger_authentication
                && shared.insert(authentication.metadata.name.clone())
            {
                out.push(json(authentication));
            }
        }
    }
    Ok(out)
}

/// Typed objects always serialise.
fn json(object: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(object).unwrap_or_default()
}

/// The labels of every object of a processor identity (SPEC §7; values are at most 63
/// characters: names are at most 40, identities and commits cut to 12 hex digits).
pub fn labels(spec: &ProcessorSpec) -> BTreeMap<String, String> {
    let mut labels = selector(spec);
    labels.insert(MANAGED_BY.into(), "plumber".into());
    labels.insert(COMMIT.into(), short(&spec.commit));
    labels
}

/// What selects the pods of one life of an identity.
pub fn selector(spec: &ProcessorSpec) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TOPOLOGY.into(), spec.topology.clone()),
        (STEP.into(), spec.step.clone()),
        (IDENTITY.into(), spec.identity.short()),
        (LIFE.into(), life(&spec.group)),
    ])
}

/// [`selector`] of the life whose consumer group is `group`, from the name alone
/// (`plumber.<topology>.<step>.<id12>[.<life>]`; step names have no dots, topology names
/// neither, but a preview environment's `<topology>.<slug>` has one): the pods of a life
/// whose StatefulSet, and with it its spec, is gone. `None` for a name Plumber does not give.
pub fn selector_of_group(group: &str) -> Option<BTreeMap<String, String>> {
    let parts = GroupParts::of(group)?;
    Some(BTreeMap::from([
        (TOPOLOGY.into(), parts.topology.into()),
        (STEP.into(), parts.step.into()),
        (IDENTITY.into(), parts.identity.into()),
        (LIFE.into(), parts.life.into()),
    ]))
}

/// The parts of a group name Plumber gives, borrowed from it.
struct GroupParts<'a> {
    topology: &'a str,
    step: &'a str,
    identity: &'a str,
    life: &'a str,
}

impl<'a> GroupParts<'a> {
    fn of(group: &'a str) -> Option<GroupParts<'a>> {
        let rest = group.strip_prefix("plumber.")?;
        let (head, last) = rest.rsplit_once('.')?;
        // Read from the end: a life's number is shorter than an identity.
        let (head, life) = if last.len() < SHORT_LEN && last.chars().all(|c| c.is_ascii_digit()) {
            (head, last)
        } else {
            (rest, "1")
        };
        let (head, identity) = head.rsplit_once('.')?;
        let (topology, step) = head.rsplit_once('.')?;
        let hex = identity.len() == SHORT_LEN && identity.chars().all(|c| c.is_ascii_hexdigit());
        let segments = topology.split('.').count();
        let valid = (1..=2).contains(&segments)
            && !topology.split('.').any(str::is_empty)
            && !step.is_empty()
            && hex
            && !life.is_empty();
        valid.then_some(GroupParts {
            topology,
            step,
            identity,
            life,
        })
    }
}

/// A life's number, from its group name (`….<id12>` is the first life, `….<id12>.<n>` the
/// n-th).
fn life(group: &str) -> String {
    match group.rsplit_once('.') {
        Some((_, n)) if n.len() < SHORT_LEN && n.chars().all(|c| c.is_ascii_digit()) => n.into(),
        _ => "1".into(),
    }
}

/// The name of the StatefulSet of the life whose consumer group is `group`:
/// `<step>-<10 hex digits of the group's SHA-256>`, at most 51 characters. A StatefulSet's
/// name must stay within 52 (its pods carry `controller-revision-hash: <name>-<hash>`, a
/// label value of at most 63), and a group name is up to 105.
///
/// Every look of the observer asks it for each processor, so it allocates only its result.
pub fn workload_name(group: &str) -> String {
    use std::fmt::Write as _;
    let step = GroupParts::of(group).map_or("processor", |parts| parts.step);
    let digest = Sha256::digest(group.as_bytes());
    let mut name = String::with_capacity(step.len() + 11);
    name.push_str(step);
    name.push('-');
    for byte in &digest[..5] {
        let _ = write!(name, "{byte:02x}");
    }
    name
}

fn short(hex: &str) -> String {
    hex.chars().take(SHORT_LEN).collect()
}

pub fn processor(spec: &ProcessorSpec, config: &RenderConfig) -> Result<Objects, Error> {
    let name = spec.group.clone();
    let meta = |annotate: bool| -> Result<ObjectMeta, Error> {
        let annotations = if annotate {
            let json = serde_json::to_string(spec).map_err(|e| Error::Annotation {
                group: spec.group.clone(),
                message: e.to_string(),
            })?;
            Some(BTreeMap::from([(SPEC_ANNOTATION.to_owned(), json)]))
        } else {
            None
        };
        Ok(ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(config.namespace.clone()),
            labels: Some(labels(spec)),
            annotations,
            owner_references: config.owner.clone().map(|o| vec![o]),
            ..ObjectMeta::default()
        })
    };
    let workload_meta = ObjectMeta {
        name: Some(workload_name(&spec.group)),
        ..meta(true)?
    };
    let workload = StatefulSet {
        metadata: workload_meta,
        spec: StatefulSetSpec {
            // No `replicas`: KEDA's autoscaler owns the count.
            // Pods start and stop together, as a Deployment's do: a pod's identity matters
            // to fencing, not its order.
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(selector(spec)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(spec)),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod(spec, config)?),
            },
            ..StatefulSetSpec::default()
        },
        status: None,
    };
    let authentication = trigger_authentication(spec, config);
    let scaled_object = ScaledObject {
        // Annotated too: a restarted daemon still knows a processor whose StatefulSet was
        // deleted by hand while no daemon ran, and puts the StatefulSet back.
        metadata: meta(true)?,
        spec: ScaledObjectSpec {
            scale_target_ref: ScaleTargetRef {
                api_version: Some("apps/v1".into()),
                kind: Some("StatefulSet".into()),
                name: workload_name(&spec.group),
            },
            min_replica_count: clamp(spec.scale.min),
            max_replica_count: clamp(spec.scale.max.max(1)),
            polling_interval: Some(15),
            cooldown_period: Some(300),
            triggers: spec
                .inputs
                .iter()
                .map(|topic| ScaleTrigger {
                    kind: "kafka".into(),
                    name: None,
                    metadata: trigger_metadata(spec, topic),
                    authentication_ref: authentication.as_ref().map(|a| AuthenticationRef {
                        name: a.metadata.name.clone().unwrap_or_default(),
                    }),
                })
                .collect(),
        },
    };
    Ok(Objects {
        workload,
        scaled_object,
        trigger_authentication: authentication,
    })
}

fn clamp(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The Kafka scaler's settings for one input topic.
fn trigger_metadata(spec: &ProcessorSpec, topic: &str) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::from([
        (
            "bootstrapServers".to_owned(),
            spec.cluster.bootstrap.clone(),
        ),
        ("consumerGroup".to_owned(), spec.group.clone()),
        ("topic".to_owned(), topic.to_owned()),
        (
            "lagThreshold".to_owned(),
            spec.scale.lag_threshold.to_string(),
        ),
        // The engine sets every group's offsets before it starts: a group without any has
        // not started yet and should not be scaled on a guess. A warm one has none until its
        // hand-off: with `latest` KEDA counts 1 per partition (activating a step scaled to
        // zero, so that it can be warm) instead of every record of the topic.
        (
            "offsetResetPolicy".to_owned(),
            if spec.handoff_group.is_some() {
                "latest"
            } else {
                "earliest"
            }
            .to_owned(),
        ),
        // More replicas than partitions only idle.
        ("allowIdleConsumers".to_owned(), "false".to_owned()),
    ]);
    if let Some(sasl) = keda_sasl(spec) {
        metadata.insert("sasl".into(), sasl.into());
    }
    if uses_tls(spec) {
        metadata.insert("tls".into(), "enable".into());
    }
    metadata
}

/// KEDA's name for the cluster's SASL mechanism.
fn keda_sasl(spec: &ProcessorSpec) -> Option<&'static str> {
    let protocol = spec.cluster.properties.get("security.protocol")?;
    if !protocol.to_ascii_uppercase().starts_with("SASL") {
        return None;
    }
    let mechanism = spec
        .cluster
        .properties
        .get("sasl.mechanism")
        .or_else(|| spec.cluster.properties.get("sasl.mechanisms"))
        .map(|m| m.to_ascii_uppercase());
    Some(match mechanism.as_deref() {
        Some("SCRAM-SHA-256") => "scram_sha256",
        Some("SCRAM-SHA-512") => "scram_sha512",
        Some("OAUTHBEARER") => "oauthbearer",
        Some("GSSAPI") => "gssapi",
        _ => "plaintext",
    })
}

fn uses_tls(spec: &ProcessorSpec) -> bool {
    spec.cluster
        .properties
        .get("security.protocol")
        .is_some_and(|p| p.eq_ignore_ascii_case("SSL") || p.eq_ignore_ascii_case("SASL_SSL"))
}

/// The TriggerAuthentication the scalers of `spec`'s cluster use, shared by every processor
/// with the same credentials ([`trigger_authentication_name`]). No owner: no one topology's;
/// the runtime deletes it once no processor uses it.
pub fn trigger_authentication(
    spec: &ProcessorSpec,
    config: &RenderConfig,
) -> Option<TriggerAuthentication> {
    let secret = spec.cluster.credentials.as_ref()?;
    Some(TriggerAuthentication {
        metadata: ObjectMeta {
            name: trigger_authentication_name(spec),
            namespace: Some(config.namespace.clone()),
            labels: Some(BTreeMap::from([(MANAGED_BY.into(), "plumber".into())])),
            ..ObjectMeta::default()
        },
        spec: TriggerAuthenticationSpec {
            secret_target_ref: trigger_secrets(spec, secret),
        },
    })
}

/// The name of the TriggerAuthentication of `spec`'s cluster credentials: its Secret, and
/// what the scaler takes from it (`-sasl`: a username and password, `-tls`: the CA), so two
/// clusters with one Secret used otherwise get one each. Cheap: every look asks it of every
/// running processor.
pub fn trigger_authentication_name(spec: &ProcessorSpec) -> Option<String> {
    let secret = spec.cluster.credentials.as_ref()?;
    let mut name = format!("plumber-kafka-{secret}");
    if takes_password(spec) {
        name.push_str("-sasl");
    }
    if uses_tls(spec) {
        name.push_str("-tls");
    }
    Some(name)
}

/// Whether the scaler takes a username and password from the credentials.
fn takes_password(spec: &ProcessorSpec) -> bool {
    keda_sasl(spec).is_some_and(|m| m != "gssapi" && m != "oauthbearer")
}

/// The trigger's secret parameters, from the keys of the cluster's credentials Secret
/// (librdkafka property names, SPEC §2).
fn trigger_secrets(spec: &ProcessorSpec, secret: &str) -> Vec<SecretTargetRef> {
    let mut refs = Vec::new();
    let mut take = |parameter: &str, key: &str| {
        refs.push(SecretTargetRef {
            parameter: parameter.into(),
            name: secret.into(),
            key: key.into(),
        });
    };
    if takes_password(spec) {
        take("username", "sasl.username");
        take("password", "sasl.password");
    }
    if uses_tls(spec) {
        take("ca", "ca.crt");
    }
    refs
}

fn pod(spec: &ProcessorSpec, config: &RenderConfig) -> Result<PodSpec, Error> {
    let credentials = spec.cluster.credentials.is_some();
    let metrics = format!("0.0.0.0:{METRICS_PORT}");
    let placement = Placement {
        // The processor takes its instance name, and with it its transactional id, from
        // HOSTNAME: the pod's name, which a StatefulSet's replacement pod keeps.
        instance: None,
        http_port: None,
        credentials: credentials.then_some(std::path::Path::new(CREDENTIALS_DIR)),
        metrics: Some(&metrics),
    };
    let args = processor_args(spec, &placement);
    let env = env(spec);
    let resources = resources(spec);
    let mut mounts = vec![mount("tmp", "/tmp")];
    if credentials {
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount("kafka-credentials", CREDENTIALS_DIR)
        });
    }
    let processor = |name: &str, image: &str, command: &str| Container {
        name: name.into(),
        image: Some(image.into()),
        image_pull_policy: config.pull_policy.clone(),
        command: Some(vec![command.into()]),
        args: Some(args.clone()),
        env: Some(env.clone()),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: i32::from(METRICS_PORT),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(probe(3)),
        readiness_probe: Some(probe(1)),
        resources: resources.clone(),
        security_context: Some(locked_down()),
        volume_mounts: Some(mounts.clone()),
        ..Container::default()
    };
    let mut volumes = vec![empty_dir("tmp")];
    if let Some(secret) = &spec.cluster.credentials {
        volumes.push(Volume {
            name: "kafka-credentials".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let mut init_containers = None;
    let containers = match &spec.transform {
        Transform::Jq { .. } | Transform::Sql { .. } => vec![processor(
            "processor",
            &config.processor_image,
            PROCESSOR_IN_IMAGE,
        )],
        Transform::Http { image, port, .. } => vec![
            processor("processor", &config.processor_image, PROCESSOR_IN_IMAGE),
            Container {
                name: "step".into(),
                image: Some(image.clone()),
                image_pull_policy: config.pull_policy.clone(),
                env: Some(
                    [EnvVar {
                        name: "PORT".into(),
                        value: Some(port.to_string()),
                        ..EnvVar::default()
                    }]
                    .into_iter()
                    .chain(env.iter().cloned())
                    .collect(),
                ),
                resources: resources.clone(),
                security_context: Some(locked_down()),
                volume_mounts: Some(vec![mount("tmp", "/tmp")]),
                ..Container::default()
            },
        ],
        Transform::Exec { image, .. } => {
            let Some(image) = image else {
                return Err(Error::ExecWithoutImage {
                    step: spec.step.clone(),
                });
            };
            volumes.push(empty_dir("plumber-processor"));
            init_containers = Some(vec![Container {
                name: "install-processor".into(),
                image: Some(config.processor_image.clone()),
                image_pull_policy: config.pull_policy.clone(),
                command: Some(vec![
                    "cp".into(),
                    PROCESSOR_IN_IMAGE.into(),
                    format!("{PROCESSOR_DIR}/plumber-processor"),
                ]),
                security_context: Some(locked_down()),
                volume_mounts: Some(vec![mount("plumber-processor", PROCESSOR_DIR)]),
                ..Container::default()
            }]);
            let mut step = processor("step", image, &format!("{PROCESSOR_DIR}/plumber-processor"));
            if let Some(mounts) = &mut step.volume_mounts {
                mounts.push(VolumeMount {
                    read_only: Some(true),
                    ..mount("plumber-processor", PROCESSOR_DIR)
                });
            }
            vec![step]
        }
    };
    Ok(PodSpec {
        containers,
        init_containers,
        volumes: Some(volumes),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        // The processor stops within 10 s of SIGTERM; the rest is slack.
        termination_grace_period_seconds: Some(30),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        ..PodSpec::default()
    })
}

fn env(spec: &ProcessorSpec) -> Vec<EnvVar> {
    spec.env
        .iter()
        .map(|(name, value)| match value {
            EnvValue::Value(value) => EnvVar {
                name: name.clone(),
                value: Some(value.clone()),
                ..EnvVar::default()
            },
            EnvValue::Secret { secret_key_ref } => EnvVar {
                name: name.clone(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: secret_key_ref.name.clone(),
                        key: secret_key_ref.key.clone(),
                        optional: Some(false),
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            },
        })
        .collect()
}

/// Requests of CPU and memory, and a memory limit; no CPU limit (throttling a consumer only
/// grows its lag).
fn resources(spec: &ProcessorSpec) -> Option<ResourceRequirements> {
    let r = spec.resources.as_ref()?;
    let mut requests = BTreeMap::new();
    if let Some(cpu) = &r.cpu {
        requests.insert("cpu".to_owned(), Quantity(cpu.clone()));
    }
    if let Some(memory) = &r.memory {
        requests.insert("memory".to_owned(), Quantity(memory.clone()));
    }
    let limits = r
        .memory
        .as_ref()
        .map(|memory| BTreeMap::from([("memory".to_owned(), Quantity(memory.clone()))]));
    Some(ResourceRequirements {
        requests: Some(requests),
        limits,
        ..ResourceRequirements::default()
    })
}

fn probe(failure_threshold: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::String("metrics".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(10),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
    }
}

fn locked_down() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}
