//! The topology repository as written: files of one commit become settings and step
//! definitions, with every problem reported at its file, line and column (SPEC §2–§3).
//!
//! This is where data enters Plumber. The stage is pure: it reads the [`SourceFile`]s that
//! `repo` took out of a git tree and never touches git, the network or the clock. Input names
//! stay unresolved strings with positions here; `graph` resolves them into edges.

pub mod budget;
pub mod fields;
pub mod jq;
pub mod names;
pub mod properties;
mod settings;
mod sql;
mod step;
pub mod step_test;
pub mod yaml;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::diagnostic::{Code, Diagnostic};
pub use fields::Located;
use yaml::Pos;

/// Step files and settings larger than this are refused: no step needs it, and a stray data
/// file must not exhaust memory.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

pub const SETTINGS_FILE: &str = "plumber.yaml";
pub const TOPOLOGIES_DIR: &str = "topologies";
pub const TOPOLOGY_FILE: &str = "topology.yaml";

/// A file of the commit as `repo` found it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Repo-relative, `/`-separated.
    pub path: String,
    pub content: FileContent,
}

#[derive(Debug, Clone)]
pub enum FileContent {
    Bytes(Vec<u8>),
    /// Not read: larger than [`MAX_FILE_BYTES`].
    TooLarge {
        size: u64,
    },
    /// A symlink (never followed) or a submodule: nothing to read in this tree.
    Unsupported {
        what: &'static str,
    },
}

/// Whether `path` can matter to a topology repository, so `repo` reads only those blobs.
pub fn is_wanted(path: &str) -> bool {
    if path == SETTINGS_FILE {
        return true;
    }
    let Some(rest) = path.strip_prefix("topologies/") else {
        return false;
    };
    !rest.split('/').any(|part| part.starts_with('.')) && is_yaml(rest)
}

fn is_yaml(path: &str) -> bool {
    path.ends_with(".yaml") || path.ends_with(".yml")
}

#[derive(Debug, Clone)]
pub struct RepoSpec {
    pub settings: RepoSettings,
    pub topologies: Vec<TopologySpec>,
}

#[derive(Debug, Clone)]
pub struct RepoSettings {
    pub clusters: BTreeMap<String, ClusterSpec>,
    pub defaults: Defaults,
    /// Fields of records a review never shows (`review: { maskFields: [...] }`): a forge
    /// comment is less private than the topic its examples come from.
    pub masked_fields: Vec<String>,
}

/// Without `plumber.yaml` (or without its `clusters`): one `default` cluster on localhost.
impl Default for RepoSettings {
    fn default() -> Self {
        RepoSettings {
            clusters: BTreeMap::from([(
                DEFAULT_CLUSTER.to_owned(),
                ClusterSpec::at("localhost:9092"),
            )]),
            defaults: Defaults::default(),
            masked_fields: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterSpec {
    pub bootstrap: String,
    /// librdkafka settings of every client on this cluster (never secrets: those come from
    /// `credentials`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
    /// Where the secret settings come from: a Kubernetes Secret of that name, or locally the
    /// directory of `plumber up --kafka-credentials`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

impl ClusterSpec {
    /// A cluster reached at `bootstrap` with no other settings.
    pub fn at(bootstrap: impl Into<String>) -> ClusterSpec {
        ClusterSpec {
            bootstrap: bootstrap.into(),
            properties: BTreeMap::new(),
            credentials: None,
        }
    }
}

/// The cluster every endpoint uses unless it names another.
pub const DEFAULT_CLUSTER: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    pub partitions: u32,
    /// Replication factor of internal and dead-letter topics; `None`: the broker's default.
    pub replication: Option<u32>,
    /// Topic settings of internal and dead-letter topics (`retention.ms`, …), over the
    /// broker's defaults.
    pub topic_config: BTreeMap<String, String>,
    pub scale: Scale,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            partitions: 6,
            replication: None,
            topic_config: BTreeMap::new(),
            scale: Scale {
                min: 1,
                max: 5,
                lag_threshold: 100,
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scale {
    pub min: u32,
    pub max: u32,
    pub lag_threshold: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CutoverMode {
    #[default]
    Parallel,
    Ordered,
}

#[derive(Debug, Clone)]
pub struct TopologySpec {
    pub name: String,
    /// `topologies/<name>`
    pub dir: String,
    pub cutover: CutoverMode,
    /// Replication factor of the topology's internal and dead-letter topics.
    pub replication: Option<u32>,
    /// Their topic settings.
    pub topic_config: BTreeMap<String, String>,
    pub steps: Vec<StepSpec>,
    /// Its step tests (`<step>.test.yaml`), checked against its steps.
    pub tests: Vec<step_test::StepTests>,
}

#[derive(Debug, Clone)]
pub struct StepSpec {
    /// The file stem.
    pub name: String,
    pub file: String,
    pub def: StepDef,
    pub description: Option<String>,
    pub owner: Option<String>,
}

#[derive(Debug, Clone)]
pub enum StepDef {
    Source(Endpoint),
    Processor(ProcessorSpec),
    Sink {
        endpoint: Endpoint,
        inputs: Vec<Located<String>>,
    },
    /// The file is too broken to know its kind; it still names a step, so references to it
    /// are not reported as unknown.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub cluster: Located<String>,
    pub topic: Located<String>,
}

#[derive(Debug, Clone)]
pub struct ProcessorSpec {
    pub inputs: Vec<Located<String>>,
    /// `None` only when the file has a `transform-count` error.
    pub transform: Option<Transform>,
    pub env: BTreeMap<String, EnvValue>,
    /// The Secret each `secretKeyRef` of `env` names, where it is written (checked against
    /// what the operator allows: [`StepSecrets`]).
    pub secret_refs: Vec<Located<String>>,
    /// After defaults of `topology.yaml` and `plumber.yaml` are applied.
    pub scale: Scale,
    pub resources: Option<Resources>,
    pub partitions: u32,
    pub start_from: StartFrom,
}

/// The value of a step's environment variable (SPEC §2).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// Written in the step file.
    Value(String),
    /// Read where the processor runs: a key of a Kubernetes Secret, or locally the file
    /// `DIR/<name>/<key>` of `plumber up --secrets DIR`. The value never enters Git, plans or
    /// identities; the reference does.
    Secret {
        #[serde(rename = "secretKeyRef")]
        secret_key_ref: SecretRef,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SecretRef {
    pub name: String,
    pub key: String,
}

/// CPU and memory of a step's containers: requests, and the memory limit (SPEC §2). Values
/// are Kubernetes quantities (`500m`, `256Mi`), checked when the file is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transform {
    Jq {
        program: String,
    },
    /// A stateless `SELECT … FROM <input step> [WHERE …]`, a stateful one with `GROUP BY`
    /// (`state`), or a stream–table join (`table`); see `plumber_sql` and
    /// `docs/stateful-sql.md`.
    Sql {
        query: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<SqlState>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        table: Option<SqlTable>,
    },
    Exec {
        command: Vec<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        image: Option<String>,
    },
    Http {
        image: String,
        port: u16,
        path: String,
        /// How `plumber up` starts the server locally; in Kubernetes the image runs as a
        /// sidecar instead.
        #[serde(skip_serializing_if = "Option::is_none")]
        command: Option<Vec<String>>,
    },
}

/// A stateful `sql` step's settings (`grace`, `emit`, `stateMaxGroups`, `stateStart`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SqlState {
    /// How long after its end a window takes late records.
    pub grace_ms: u64,
    pub emit: Emit,
    /// The most open groups an instance keeps (`None`: the processor's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_groups: Option<u64>,
    /// What a new life starts from when the old state cannot be carried over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StateStart>,
}

/// A stream–table join's table: the input step its query joins, read whole (a source).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SqlTable {
    pub step: String,
    /// The most memory the table may take in each instance (`tableMaxBytes`; `None`: the
    /// processor's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// When a windowed query emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Emit {
    /// Once per window, when it closes.
    #[default]
    Close,
    /// After every record that reaches a group.
    Update,
}

impl Emit {
    pub fn as_str(self) -> &'static str {
        match self {
            Emit::Close => "close",
            Emit::Update => "update",
        }
    }
}

/// `stateStart:` the reviewer's choice for a new life whose state cannot be carried over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateStart {
    /// No state: windows open at the cutover count only what comes after it.
    Empty,
    /// Rebuilt from the earliest offset the input still holds, without emitting.
    Earliest,
}

impl Transform {
    /// `jq`, `sql`, `exec` or `http`: as the step file names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Transform::Jq { .. } => "jq",
            Transform::Sql { .. } => "sql",
            Transform::Exec { .. } => "exec",
            Transform::Http { .. } => "http",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    #[default]
    Latest,
    Earliest,
}

/// Which Secrets steps may name in `secretKeyRef` (SPEC §11): the operator's choice, made
/// outside Git (`stepSecrets` in the daemon's configuration, the subdirectories of `plumber up
/// --secrets DIR`), so that a step file cannot reach a Secret it was not meant to (the
/// daemon's forge token, git credentials, another team's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StepSecrets {
    /// Not checked: `plumber validate` and `plan` without `--step-secrets`, which run nothing.
    #[default]
    Unchecked,
    /// These names and no others (none at all when empty).
    Only {
        names: BTreeSet<String>,
        /// Where the list comes from, for the error: `stepSecrets` of the daemon's
        /// configuration, `plumber up --secrets DIR`, …
        origin: String,
    },
}

impl StepSecrets {
    /// Errors at each reference to a Secret not allowed.
    pub fn check(&self, spec: &RepoSpec, diagnostics: &mut Vec<Diagnostic>) {
        let StepSecrets::Only { names, origin } = self else {
            return;
        };
        let allowed = if names.is_empty() {
            "none are".to_owned()
        } else {
            format!(
                "only {} are",
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        for step in spec.topologies.iter().flat_map(|t| &t.steps) {
            let StepDef::Processor(processor) = &step.def else {
                continue;
            };
            for secret in &processor.secret_refs {
                if !names.contains(&secret.value) {
                    diagnostics.push(Diagnostic::error(
                        Code::InvalidValue,
                        &step.file,
                        Some(secret.pos),
                        format!(
                            "steps may not use Secret `{}`: {allowed} allowed ({origin}); the \
                             operator allows a Secret for steps outside Git",
                            secret.value
                        ),
                    ));
                }
            }
        }
    }
}

/// Reads every topology of one commit's files. Files whose problems prevent reading them
/// still contribute their step name; all problems are returned, sorted.
pub fn load(files: &[SourceFile]) -> (RepoSpec, Vec<Diagnostic>) {
    let (settings, mut diagnostics) = load_settings(files.iter().find(|f| f.path == SETTINGS_FILE));
    let (spec, more) = load_with(settings, files);
    diagnostics.extend(more);
    (spec, diagnostics)
}

/// `plumber.yaml` (its defaults without one), with its problems.
pub fn load_settings(file: Option<&SourceFile>) -> (RepoSettings, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    let settings = match file {
        Some(file) => settings::repo_settings(file, &mut diagnostics),
        None => RepoSettings::default(),
    };
    (settings, diagnostics)
}

/// As [`load`], with the settings already read (`plumber.yaml` among `files` is ignored):
/// what a topology is depends only on its own files and the settings, so a topology can be
/// read alone and the result kept for as long as both are unchanged.
pub fn load_with(settings: RepoSettings, files: &[SourceFile]) -> (RepoSpec, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();

    // Group files by topology directory; BTreeMap keeps topologies in name order.
    let mut by_topology: BTreeMap<&str, Vec<&SourceFile>> = BTreeMap::new();
    for file in files {
        let Some(rest) = file.path.strip_prefix("topologies/") else {
            continue;
        };
        match rest.split_once('/') {
            Some((topology, _)) => by_topology.entry(topology).or_default().push(file),
            // A symlink or submodule where a topology directory would be.
            None if !matches!(file.content, FileContent::Bytes(_)) => {
                text_of(file, &mut diagnostics);
            }
            None => diagnostics.push(Diagnostic::warning(
                Code::StrayFile,
                &file.path,
                None,
                format!(
                    "ignored: step files live in a topology directory, e.g. topologies/<topology>/{rest}"
                ),
            )),
        }
    }

    let mut jq_programs = Vec::new();
    let mut topologies = Vec::with_capacity(by_topology.len());
    for (name, files) in by_topology {
        topologies.push(load_topology(
            name,
            &files,
            &settings,
            &mut jq_programs,
            &mut diagnostics,
        ));
    }
    check_jq(&jq_programs, &mut diagnostics);
    (
        RepoSpec {
            settings,
            topologies,
        },
        diagnostics,
    )
}

fn load_topology(
    name: &str,
    files: &[&SourceFile],
    settings: &RepoSettings,
    jq_programs: &mut Vec<step::JqProgram>,
    diagnostics: &mut Vec<Diagnostic>,
) -> TopologySpec {
    let dir = format!("{TOPOLOGIES_DIR}/{name}");
    if let Some(problem) = names::dns_label_problem(name) {
        diagnostics.push(Diagnostic::error(
            Code::InvalidName,
            &dir,
            None,
            format!("invalid topology name: {problem}; rename the directory"),
        ));
    }
    let topology_file = format!("{dir}/{TOPOLOGY_FILE}");
    let (cutover, defaults) = match files.iter().find(|f| f.path == topology_file) {
        Some(file) => settings::topology_settings(file, settings.defaults.clone(), diagnostics),
        None => (CutoverMode::default(), settings.defaults.clone()),
    };

    let mut steps: Vec<StepSpec> = Vec::with_capacity(files.len());
    let mut tests = Vec::new();
    let mut first_file_of: BTreeMap<String, usize> = BTreeMap::new();
    for file in files.iter().filter(|f| f.path != topology_file) {
        if step_test::is_test_file(&file.path) {
            if let Ok(root) = parse_yaml(file, diagnostics) {
                let mut report = fields::Report {
                    file: &file.path,
                    diagnostics,
                };
                tests.extend(step_test::read(&file.path, root.as_ref(), &mut report));
            }
            continue;
        }
        let context = step::Context {
            clusters: &settings.clusters,
            defaults: &defaults,
        };
        let step = step::load(file, &context, jq_programs, diagnostics);
        if let Some(&first) = first_file_of.get(&step.name) {
            diagnostics.push(Diagnostic::error(
                Code::DuplicateStep,
                &step.file,
                Some(Pos { line: 1, column: 1 }),
                format!(
                    "step `{}` is already defined by {}; step names are unique within a topology, across subdirectories",
                    step.name, steps[first].file
                ),
            ));
            continue;
        }
        first_file_of.insert(step.name.clone(), steps.len());
        steps.push(step);
    }
    for tested in &tests {
        let problem = match steps.iter().find(|s| s.name == tested.step) {
            None => Some(format!(
                "tests step `{}`, which topology `{name}` does not have; a test file is named \
                 after its step: <step>.test.yaml",
                tested.step
            )),
            Some(step) if !matches!(step.def, StepDef::Processor(_)) => Some(format!(
                "tests step `{}`, which is no processor: only processors transform records",
                tested.step
            )),
            Some(_) => None,
        };
        if let Some(message) = problem {
            diagnostics.push(Diagnostic::error(
                Code::InvalidValue,
                &tested.file,
                Some(Pos { line: 1, column: 1 }),
                message,
            ));
        }
    }
    if steps.is_empty() {
        diagnostics.push(Diagnostic::warning(
            Code::EmptyTopology,
            &dir,
            None,
            "the topology has no step files",
        ));
    }
    TopologySpec {
        name: name.to_owned(),
        dir,
        cutover,
        replication: defaults.replication,
        topic_config: defaults.topic_config.clone(),
        steps,
        tests,
    }
}

/// Compiles every jq program of the commit at once and reports those that do not compile.
fn check_jq(programs: &[step::JqProgram], diagnostics: &mut Vec<Diagnostic>) {
    let texts: Vec<&str> = programs.iter().map(|p| p.program.as_str()).collect();
    let results = jq::JqChecker::default().check_all(&texts);
    for (program, result) in programs.iter().zip(results) {
        if let Err(problem) = result {
            diagnostics.push(Diagnostic::error(
                Code::InvalidJq,
                &program.file,
                Some(program.key_pos),
                format!("the jq program does not compile: {problem}"),
            ));
        }
    }
}

/// The text of a file, or an error diagnostic saying why it cannot be read.
fn text_of<'f>(file: &'f SourceFile, diagnostics: &mut Vec<Diagnostic>) -> Option<&'f str> {
    let problem = match &file.content {
        FileContent::Bytes(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => return Some(text),
            Err(err) => {
                let valid = bytes.get(..err.valid_up_to()).unwrap_or_default();
                let before = String::from_utf8_lossy(valid);
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                (
                    Code::InvalidEncoding,
                    Some(Pos {
                        line: u32::try_from(line).unwrap_or(u32::MAX),
                        column: u32::try_from(column).unwrap_or(u32::MAX),
                    }),
                    format!(
                        "the file is not valid UTF-8 (byte {}); save it as UTF-8",
                        err.valid_up_to()
                    ),
                )
            }
        },
        FileContent::TooLarge { size } => (
            Code::FileTooLarge,
            None,
            format!(
                "the file has {size} bytes; step and settings files are limited to {MAX_FILE_BYTES} bytes"
            ),
        ),
        FileContent::Unsupported { what } => (
            Code::UnsupportedEntry,
            None,
            format!("{what} is not read; commit the file itself"),
        ),
    };
    let (code, pos, message) = problem;
    diagnostics.push(Diagnostic::error(code, &file.path, pos, message));
    None
}

/// Parses a file's YAML, reporting syntax problems. `Ok(None)` is an empty document.
fn parse_yaml(
    file: &SourceFile,
    diagnostics: &mut Vec<Diagnostic>,
) -> Result<Option<yaml::Node>, ()> {
    let text = text_of(file, diagnostics).ok_or(())?;
    yaml::parse(text).map_err(|err| {
        diagnostics.push(Diagnostic::error(
            Code::YamlSyntax,
            &file.path,
            Some(err.pos),
            err.message,
        ));
    })
}

/// Everything below `topologies/<t>/` is a step file except `topology.yaml` itself.
pub fn step_name_of(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".yaml")
        .or_else(|| file.strip_suffix(".yml"))
        .unwrap_or(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wanted_paths() {
        assert!(is_wanted("plumber.yaml"));
        assert!(is_wanted("topologies/t/a.yaml"));
        assert!(is_wanted("topologies/t/steps/deep/a.yml"));
        assert!(!is_wanted("topologies/t/README.md"));
        assert!(!is_wanted("topologies/t/.hidden/a.yaml"));
        assert!(!is_wanted("other/a.yaml"));
    }

    #[test]
    fn step_names_are_file_stems() {
        assert_eq!(step_name_of("topologies/t/steps/enrich.yaml"), "enrich");
        assert_eq!(step_name_of("topologies/t/a.yml"), "a");
    }
}
