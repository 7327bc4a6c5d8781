//! The `Topology` custom resource (group `plumber.dev`, version `v1alpha1`, SPEC §7): one per
//! topology of the followed branch, in the daemon's namespace.
//!
//! Git stays the source of truth: the daemon creates and updates these objects, nobody else
//! needs to. The spec only says which topology of which repository the object stands for; the
//! status is what `kubectl get topologies` and `kubectl describe topology` show (the same facts
//! as `GET /api/status`, with the daemon's phase and step-state words written the Kubernetes
//! way: `Idle`, not `idle`), plus [`TopologyStatus::record`], the cutover engine's durable
//! record, so that a daemon replica that takes over the lease resumes a cutover where the
//! previous one stopped.
//!
//! Every field of the status is optional or defaulted: a status written by another version of
//! the daemon, or only partly written, still reads.

use ::kube::CustomResource;
use ::kube::CustomResourceExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the resource.
pub const GROUP: &str = "plumber.dev";
/// The version of the resource served and stored.
pub const VERSION: &str = "v1alpha1";

/// The condition type that is `True` when the topology runs its commit with every processor
/// up (phase `Idle`, no error).
pub const CONDITION_READY: &str = "Ready";
/// The condition type that is `True` while a cutover moves the topology to another commit.
pub const CONDITION_PROGRESSING: &str = "Progressing";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot encode the Topology CRD as YAML: {0}")]
    Encode(#[source] serde_saphyr::SerializeError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which topology of which repository this object stands for. Written by the daemon, from
/// what it follows; editing it changes nothing the daemon does.
// Each printcolumn repeats `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "plumber.dev",
    version = "v1alpha1",
    kind = "Topology",
    namespaced,
    status = "TopologyStatus",
    shortname = "topo",
    category = "plumber",
    derive = "PartialEq",
    doc = "A topology of the Git repository the Plumber daemon follows: a graph of Kafka \
           stream-processing steps. The daemon creates one per topology of its branch and \
           reports in the status what runs, the cutover in progress and the last error.",
    printcolumn(
        name = "Commit",
        type_ = "string",
        description = "The commit the topology runs (first 12 hex digits)",
        json_path = ".status.shortCommit"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        description = "Pending, Idle, Cutover or Error",
        json_path = ".status.phase"
    ),
    printcolumn(
        name = "Steps",
        type_ = "string",
        description = "Processors running every asked replica, of all processors",
        json_path = ".status.stepsReady"
    ),
    printcolumn(
        name = "Lag",
        type_ = "integer",
        description = "Records the topology's processors have not consumed yet",
        json_path = ".status.lag"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpec {
    /// The topology's name in the repository: its directory under `topologies/` (a DNS-1123
    /// label of at most 40 characters); a pull request's preview environment is
    /// `<topology>.<slug>` (a slug of at most 20 characters).
    #[schemars(
        length(min = 1, max = 61),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")
    )]
    pub topology: String,
    /// The URL of the Git repository the daemon follows (without credentials).
    pub repository: String,
    /// The branch (or other ref) of the repository the daemon follows.
    #[serde(rename = "ref")]
    pub git_ref: String,
}

/// What the daemon observes and decides about the topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct TopologyStatus {
    /// The `metadata.generation` of the object this status was written for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The commit whose graph the topology runs: the last one that changed it (40 hex
    /// digits; commits that leave it as it is do not move it); absent before its first
    /// cutover ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The first 12 hex digits of `commit`, as the processors' `plumber.dev/commit` labels
    /// carry it (for the Commit column).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_commit: Option<String>,
    /// Where the topology is: `Pending` before the daemon first acted on it, `Idle` when it
    /// runs its commit, `Cutover` while it moves to another one, `Error` when its last action
    /// or commit failed (`lastError` says how).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Processors running every replica asked of them, over all processors, as `ready/total`
    /// (sources and sinks are not counted: they do not run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps_ready: Option<String>,
    /// Records the topology's processors have not consumed yet, summed over its steps;
    /// absent when no step's lag is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
    /// How the topology's processors deliver, decided once per Kafka cluster: `exactly-once`
    /// when its brokers support transactions, else `at-least-once`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
    /// Every step of the topology, by name.
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"]
    ))]
    pub steps: Vec<StepStatus>,
    /// The cutover in progress; absent when none is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cutover: Option<CutoverStatus>,
    /// The last error: an invalid commit (with the file, line and column to blame) or an
    /// action that failed. The last valid commit keeps running meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<LastError>,
    /// Standard conditions: `Ready` and `Progressing`.
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["type"]
    ))]
    pub conditions: Vec<Condition>,
    /// The cutover engine's durable record of the topology: the processor lives that run,
    /// their internal topics, the cutover offsets stopped lives recorded and the move in
    /// progress. Opaque here (its format is the engine's, versioned inside it); it lives in
    /// the status so that a daemon replica that takes over resumes a cutover where the
    /// previous one stopped; beside it the topology's last moves, for `plumber history`. Not
    /// for editing by hand.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "opaque_object")]
    pub record: Option<serde_json::Value>,
}

/// The daemon's phase of a topology (`GET /api/status`'s `idle`, `cutover`, `error`, and
/// `Pending` for a topology not acted on yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = field_describes)]
pub enum Phase {
    /// The daemon has not acted on the topology yet.
    #[default]
    Pending,
    /// The topology runs its commit.
    Idle,
    /// A cutover moves the topology to another commit.
    Cutover,
    /// The last action or commit failed; see `lastError`.
    Error,
}

/// A step's kind, as its file's `kind:` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(transform = field_describes)]
pub enum StepKind {
    /// An external topic the topology reads.
    Source,
    /// A step that transforms records.
    Processor,
    /// An external topic the topology writes.
    Sink,
}

/// What a step does now (`GET /api/status`'s step states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = field_describes)]
pub enum StepState {
    /// A source or sink: a topic that belongs to its users, not run by Plumber.
    External,
    /// Every replica asked of the processor is up.
    Running,
    /// Fewer replicas are up than asked.
    Starting,
    /// The processor does not run.
    Stopped,
}

/// A processor's delivery guarantee.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
#[schemars(transform = field_describes)]
pub enum Delivery {
    /// Outputs and offsets in one transaction: a crash duplicates nothing.
    ExactlyOnce,
    /// Offsets after outputs: a crash may duplicate records, never lose them.
    AtLeastOnce,
}

/// One step of the topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepStatus {
    /// The step's name (its file's stem).
    pub name: String,
    /// `source`, `processor` or `sink`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<StepKind>,
    /// What the step does now: `External` for sources and sinks; `Running`, `Starting` or
    /// `Stopped` for processors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StepState>,
    /// The processor's identity (64 hex digits): a hash of what it runs and reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The consumer group (and internal topic) of the processor's life that runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Replicas asked of the processor now (KEDA moves it within the step's `scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Replicas of the processor that are up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,
    /// Records the processor's group has not consumed yet; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
}

/// How far a cutover is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct CutoverStatus {
    /// The commit the topology ran when the cutover started; absent for a topology's first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The commit the cutover moves to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// When the cutover started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    /// Actions that took effect so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done: Option<i32>,
    /// Actions left, the current one included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<i32>,
    /// The action running or last tried, as `plumber plan` writes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Actions that cannot run yet, and why: a drain, a topic that does not exist yet, a call
    /// that keeps failing.
    pub waiting: Vec<WaitStatus>,
}

/// An action of a cutover that waits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct WaitStatus {
    /// The action, as `plumber plan` writes it.
    pub action: String,
    /// What it waits for.
    pub reason: String,
    /// Failed attempts so far (0: it waits for something else to happen first).
    pub failures: i32,
}

/// The last error of a topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct LastError {
    /// The commit concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The validation code (`unknown-field`, `cycle`, …) of an invalid commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The repository-relative file to blame.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The 1-based line in `file`; absent when no single place is to blame (a cycle).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<i32>,
    /// The 1-based column in `file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<i32>,
    /// What went wrong.
    pub message: String,
}

/// Drops an enum's own description from its schema: kube inlines an optional enum into the
/// field, and the enum's description would replace the field's.
fn field_describes(schema: &mut schemars::Schema) {
    schema.remove("description");
}

/// A JSON object the API server keeps as written: `x-kubernetes-preserve-unknown-fields`.
fn opaque_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true,
        "description": "The cutover engine's durable record of the topology (opaque)."
    })
}

/// The `CustomResourceDefinition` of [`Topology`].
pub fn definition() -> CustomResourceDefinition {
    Topology::crd()
}

/// The CRD as YAML, as `plumber crd` prints it and `deploy/crd.yaml` holds it.
pub fn yaml() -> Result<String> {
    serde_saphyr::to_string(&definition()).map_err(Error::Encode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn schema_of_status() -> Value {
        let crd = serde_json::to_value(definition()).unwrap_or_default();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"].clone()
    }

    #[test]
    fn the_crd_names_the_resource_and_its_status_subresource() {
        let crd = definition();
        assert_eq!(crd.metadata.name.as_deref(), Some("topologies.plumber.dev"));
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "Topology");
        assert_eq!(crd.spec.names.plural, "topologies");
        let [version] = crd.spec.versions.as_slice() else {
            panic!("one version expected: {:?}", crd.spec.versions);
        };
        assert_eq!(version.name, VERSION);
        assert!(version.served && version.storage);
        assert!(
            version
                .subresources
                .as_ref()
                .is_some_and(|s| s.status.is_some())
        );
        let columns: Vec<&str> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Commit", "Phase", "Steps", "Lag", "Age"]);
    }

    #[test]
    fn the_record_is_kept_as_written_and_lists_merge_by_key() {
        let status = schema_of_status();
        let record = &status["properties"]["record"];
        assert_eq!(record["x-kubernetes-preserve-unknown-fields"], json!(true));
        assert_eq!(record["type"], json!("object"));
        let conditions = &status["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], json!("map"));
        assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
        let steps = &status["properties"]["steps"];
        assert_eq!(steps["x-kubernetes-list-map-keys"], json!(["name"]));
        // A list-map key must be required, or the API server refuses the CRD.
        assert_eq!(steps["items"]["required"], json!(["name"]));
    }

    #[test]
    fn every_field_of_the_schema_is_described() {
        fn undescribed(schema: &Value, path: &str, out: &mut Vec<String>) {
            let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (name, property) in properties {
                let path = format!("{path}.{name}");
                // Condition and Time come from k8s-openapi, described there.
                if property.get("description").is_none() && !path.contains(".conditions") {
                    out.push(path.clone());
                }
                undescribed(property, &path, out);
                if let Some(items) = property.get("items") {
                    undescribed(items, &format!("{path}[]"), out);
                }
            }
        }
        let crd = serde_json::to_value(definition()).unwrap_or_default();
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut missing = Vec::new();
        for part in ["spec", "status"] {
            undescribed(&root["properties"][part], part, &mut missing);
        }
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:?}"
        );
    }

    #[test]
    fn partial_statuses_read() -> anyhow::Result<()> {
        let empty: TopologyStatus = serde_json::from_value(json!({}))?;
        assert_eq!(empty, TopologyStatus::default());
        let partial: TopologyStatus = serde_json::from_value(json!({
            "phase": "Cutover",
            "steps": [{"name": "moving"}],
            "cutover": {"to": "abc", "waiting": [{"action": "drain-processor moving"}]},
            "lastError": {"message": "boom"},
            "record": {"format": 2, "anything": ["kept"]}
        }))?;
        assert_eq!(partial.phase, Some(Phase::Cutover));
        assert_eq!(
            partial.steps.first().map(|s| s.name.as_str()),
            Some("moving")
        );
        assert_eq!(
            partial.cutover.map(|c| c.waiting.len()),
            Some(1),
            "a wait without reason still reads"
        );
        assert_eq!(
            partial.record,
            Some(json!({"format": 2, "anything": ["kept"]}))
        );
        Ok(())
    }

    #[test]
    fn a_status_round_trips_in_camel_case() -> anyhow::Result<()> {
        let status = TopologyStatus {
            observed_generation: Some(3),
            commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
            short_commit: Some("0123456789ab".into()),
            phase: Some(Phase::Idle),
            steps_ready: Some("1/1".into()),
            lag: Some(0),
            delivery: Some(Delivery::ExactlyOnce),
            steps: vec![StepStatus {
                name: "moving".into(),
                kind: Some(StepKind::Processor),
                state: Some(StepState::Running),
                identity: None,
                group: Some("plumber.t.moving.0123456789ab".into()),
                replicas: Some(1),
                running: Some(1),
                lag: Some(0),
            }],
            last_error: Some(LastError {
                file: Some("topologies/t/moving.yaml".into()),
                line: Some(3),
                column: Some(1),
                message: "boom".into(),
                ..LastError::default()
            }),
            ..TopologyStatus::default()
        };
        let value = serde_json::to_value(&status)?;
        assert_eq!(value["shortCommit"], json!("0123456789ab"));
        assert_eq!(value["stepsReady"], json!("1/1"));
        assert_eq!(value["delivery"], json!("exactly-once"));
        assert_eq!(value["steps"][0]["state"], json!("Running"));
        assert_eq!(value["steps"][0]["kind"], json!("processor"));
        assert_eq!(value["lastError"]["line"], json!(3));
        assert_eq!(serde_json::from_value::<TopologyStatus>(value)?, status);
        Ok(())
    }

    #[test]
    fn the_yaml_reads_back_as_the_definition() -> anyhow::Result<()> {
        let text = yaml()?;
        let read: CustomResourceDefinition = serde_saphyr::from_str(&text)?;
        assert_eq!(read, definition());
        Ok(())
    }
}
