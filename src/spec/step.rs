//! One step file → [`StepSpec`], every problem of the file reported.

use std::collections::BTreeMap;

use super::fields::{self, Fields, Located, Report};
use super::settings;
use super::yaml::{Node, Pos, Value};
use super::{
    ClusterSpec, DEFAULT_CLUSTER, Defaults, Emit, Endpoint, EnvValue, ProcessorSpec, Resources,
    SecretRef, SourceFile, SqlState, SqlTable, StartFrom, StateStart, StepDef, StepSpec, Transform,
    names,
};
use crate::diagnostic::{Code, Diagnostic};

pub(super) struct Context<'a> {
    pub clusters: &'a BTreeMap<String, ClusterSpec>,
    pub defaults: &'a Defaults,
}

/// A jq program to compile once all files are read (see [`super::jq::JqChecker::check_all`]).
pub(super) struct JqProgram {
    pub file: String,
    pub key_pos: Pos,
    pub program: String,
}

const COMMON: [&str; 3] = ["kind", "description", "owner"];
const SOURCE_FIELDS: [&str; 2] = ["topic", "cluster"];
const SINK_FIELDS: [&str; 3] = ["topic", "cluster", "input"];
const PROCESSOR_FIELDS: [&str; 15] = [
    "input",
    "jq",
    "sql",
    "exec",
    "http",
    "env",
    "resources",
    "scale",
    "partitions",
    "startFrom",
    "grace",
    "emit",
    "stateMaxGroups",
    "stateStart",
    "tableMaxBytes",
];
/// The keys of a stateful `sql` step only.
const STATE_FIELDS: [&str; 4] = ["grace", "emit", "stateMaxGroups", "stateStart"];
/// The longest `grace`: a window's state lives this long after its end.
const MAX_GRACE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// The largest `tableMaxBytes`: 64 GiB, more than a processor should hold of one table.
const MAX_TABLE_BYTES: u64 = 64 << 30;
const TRANSFORMS: [&str; 4] = ["jq", "sql", "exec", "http"];

pub(super) fn load(
    file: &SourceFile,
    context: &Context,
    jq_programs: &mut Vec<JqProgram>,
    diagnostics: &mut Vec<Diagnostic>,
) -> StepSpec {
    let name = super::step_name_of(&file.path).to_owned();
    let start = Pos { line: 1, column: 1 };
    if let Some(problem) = names::dns_label_problem(&name) {
        diagnostics.push(Diagnostic::error(
            Code::InvalidName,
            &file.path,
            Some(start),
            format!(
                "invalid step name: {problem}; the step name is the file name, rename the file"
            ),
        ));
    }
    let mut step = StepSpec {
        name,
        file: file.path.clone(),
        def: StepDef::Unknown,
        description: None,
        owner: None,
    };
    let node = match super::parse_yaml(file, diagnostics) {
        Ok(Some(node)) => node,
        Ok(None) => {
            diagnostics.push(Diagnostic::error(
                Code::MissingField,
                &file.path,
                Some(start),
                "the step file is empty; it needs `kind: source`, `kind: processor` or `kind: sink`",
            ));
            return step;
        }
        Err(()) => return step,
    };
    // Positions inside values (a SQL query's problems) are found in the text as written.
    let source = match &file.content {
        super::FileContent::Bytes(bytes) => std::str::from_utf8(bytes).unwrap_or_default(),
        _ => "",
    };
    let report = &mut Report {
        file: &file.path,
        diagnostics,
    };
    let Some(fields) = Fields::of(&node, "a step file", node.pos, report) else {
        return step;
    };
    step.description = optional_string(&fields, "description", report);
    step.owner = optional_string(&fields, "owner", report);

    let Some(kind) = kind(&fields, node.pos, report) else {
        return step;
    };
    step.def = match kind {
        Kind::Source => {
            fields.reject_unknown(&allowed(&SOURCE_FIELDS, &["input"]), "a source", report);
            if let Some(input) = fields.get("input") {
                report.error(
                    Code::InvalidEdge,
                    input.key_pos,
                    "a source reads an external topic and takes no `input`; \
                     make this step a processor to read other steps",
                );
            }
            StepDef::Source(endpoint(&fields, node.pos, context, report))
        }
        Kind::Sink => {
            fields.reject_unknown(&allowed(&SINK_FIELDS, &[]), "a sink", report);
            StepDef::Sink {
                endpoint: endpoint(&fields, node.pos, context, report),
                inputs: inputs(&fields, node.pos, report),
            }
        }
        Kind::Processor => {
            fields.reject_unknown(&allowed(&PROCESSOR_FIELDS, &[]), "a processor", report);
            StepDef::Processor(processor(
                &fields,
                node.pos,
                context,
                jq_programs,
                source,
                report,
            ))
        }
    };
    step
}

fn allowed<'a>(specific: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    COMMON
        .iter()
        .chain(specific)
        .chain(extra)
        .copied()
        .collect()
}

enum Kind {
    Source,
    Processor,
    Sink,
}

fn kind(fields: &Fields, at: Pos, report: &mut Report) -> Option<Kind> {
    let Some(entry) = fields.get("kind") else {
        report.error(
            Code::MissingField,
            at,
            "missing `kind`: source, processor or sink",
        );
        return None;
    };
    let text = match &entry.value.value {
        Value::Scalar(s) => s.text.as_str(),
        _ => "",
    };
    match text {
        "source" => Some(Kind::Source),
        "processor" => Some(Kind::Processor),
        "sink" => Some(Kind::Sink),
        _ => {
            report.error(
                Code::InvalidKind,
                entry.key_pos,
                format!(
                    "`kind` is {}; it must be source, processor or sink",
                    if text.is_empty() {
                        entry.value.type_name().to_owned()
                    } else {
                        format!("`{text}`")
                    }
                ),
            );
            None
        }
    }
}

fn optional_string(fields: &Fields, key: &str, report: &mut Report) -> Option<String> {
    fields
        .get(key)
        .and_then(|e| fields::string(e, report))
        .map(|l| l.value)
}

fn required<'n>(
    fields: &Fields<'n>,
    key: &str,
    what: &str,
    at: Pos,
    report: &mut Report,
) -> Option<&'n super::yaml::Entry> {
    let entry = fields.get(key);
    if entry.is_none() {
        report.error(Code::MissingField, at, format!("missing `{key}`: {what}"));
    }
    entry
}

fn endpoint(fields: &Fields, at: Pos, context: &Context, report: &mut Report) -> Endpoint {
    let topic = required(fields, "topic", "the Kafka topic of this step", at, report)
        .and_then(|e| {
            let topic = fields::string(e, report)?;
            if let Some(problem) = names::topic_problem(&topic.value) {
                report.error(Code::InvalidValue, e.key_pos, problem);
            }
            Some(topic)
        })
        .unwrap_or(Located {
            value: String::new(),
            pos: at,
        });
    let cluster = match fields.get("cluster") {
        Some(e) => fields::string(e, report)
            .inspect(|cluster| {
                if !context.clusters.contains_key(&cluster.value) {
                    let known: Vec<&str> = context.clusters.keys().map(String::as_str).collect();
                    report.error(
                        Code::InvalidValue,
                        e.key_pos,
                        format!(
                            "unknown cluster `{}`; plumber.yaml defines: {}",
                            cluster.value,
                            if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            }
                        ),
                    );
                }
            })
            .unwrap_or(Located {
                value: DEFAULT_CLUSTER.into(),
                pos: e.key_pos,
            }),
        None => {
            if !context.clusters.contains_key(DEFAULT_CLUSTER) {
                report.error(
                    Code::MissingField,
                    at,
                    "missing `cluster`: plumber.yaml defines no `default` cluster",
                );
            }
            Located {
                value: DEFAULT_CLUSTER.into(),
                pos: at,
            }
        }
    };
    Endpoint { cluster, topic }
}

fn inputs(fields: &Fields, at: Pos, report: &mut Report) -> Vec<Located<String>> {
    required(
        fields,
        "input",
        "the step (or list of steps) this one reads",
        at,
        report,
    )
    .map(|e| fields::one_or_many(e, report))
    .unwrap_or_default()
}

fn processor(
    fields: &Fields,
    at: Pos,
    context: &Context,
    jq_programs: &mut Vec<JqProgram>,
    source: &str,
    report: &mut Report,
) -> ProcessorSpec {
    let defaults = context.defaults;
    let inputs = inputs(fields, at, report);
    let transform = transform(fields, at, &inputs, jq_programs, source, report);
    let (env, secret_refs) = fields
        .get("env")
        .map(|e| env(e, report))
        .unwrap_or_default();
    ProcessorSpec {
        inputs,
        transform,
        env,
        secret_refs,
        scale: fields.get("scale").map_or(defaults.scale, |e| {
            settings::scale(e, defaults.scale, report)
        }),
        resources: fields.get("resources").and_then(|e| resources(e, report)),
        partitions: fields
            .get("partitions")
            .and_then(|e| settings::partitions(e, report))
            .unwrap_or(defaults.partitions),
        start_from: match fields
            .get("startFrom")
            .and_then(|e| fields::choice(e, &["latest", "earliest"], report))
        {
            Some("earliest") => StartFrom::Earliest,
            _ => StartFrom::Latest,
        },
    }
}

fn transform(
    fields: &Fields,
    at: Pos,
    inputs: &[Located<String>],
    jq_programs: &mut Vec<JqProgram>,
    source: &str,
    report: &mut Report,
) -> Option<Transform> {
    let present: Vec<&super::yaml::Entry> = fields
        .entries
        .iter()
        .filter(|e| TRANSFORMS.contains(&e.key.as_str()))
        .collect();
    let entry = match present.as_slice() {
        [] => {
            report.error(
                Code::TransformCount,
                at,
                "a processor needs one transform: `jq`, `sql`, `exec` or `http`",
            );
            return None;
        }
        [one] => *one,
        [first, second, ..] => {
            report.error(
                Code::TransformCount,
                second.key_pos,
                format!(
                    "a processor has exactly one transform, found `{}` and `{}`; split it into two steps",
                    first.key, second.key
                ),
            );
            return None;
        }
    };
    if entry.key != "sql" {
        refuse_state_fields(fields, &format!("a `{}` step", entry.key), report);
        refuse_table_fields(fields, &format!("a `{}` step", entry.key), report);
    }
    match entry.key.as_str() {
        "jq" => {
            let program = fields::string(entry, report)?;
            jq_programs.push(JqProgram {
                file: report.file.to_owned(),
                key_pos: entry.key_pos,
                program: program.value.clone(),
            });
            Some(Transform::Jq {
                program: program.value,
            })
        }
        "sql" => {
            let query = fields::string(entry, report)?;
            let kind = super::sql::check(&query.value, &entry.value, inputs, source, report);
            let state = match kind {
                Some(super::sql::Kind::Stateful) => Some(sql_state(fields, report)),
                _ => {
                    if kind.is_some() {
                        refuse_state_fields(fields, "a `sql` step without GROUP BY", report);
                    }
                    None
                }
            };
            let table = match kind {
                Some(super::sql::Kind::Join { table }) => Some(SqlTable {
                    step: table,
                    max_bytes: fields
                        .get("tableMaxBytes")
                        .and_then(|e| fields::integer(e, 1 << 20..=MAX_TABLE_BYTES, report)),
                }),
                _ => {
                    if kind.is_some() {
                        refuse_table_fields(fields, "a `sql` step without JOIN", report);
                    }
                    None
                }
            };
            Some(Transform::Sql {
                query: query.value,
                state,
                table,
            })
        }
        "exec" => {
            let spec = Fields::of(&entry.value, "`exec`", entry.key_pos, report)?;
            spec.reject_unknown(&["command", "image"], "`exec`", report);
            let command = command(&spec, entry.key_pos, true, report);
            let image = optional_string(&spec, "image", report);
            Some(Transform::Exec {
                command: command?,
                image,
            })
        }
        _ => {
            let spec = Fields::of(&entry.value, "`http`", entry.key_pos, report)?;
            spec.reject_unknown(&["image", "port", "path", "command"], "`http`", report);
            let image = required(
                &spec,
                "image",
                "the container image serving the transform",
                entry.key_pos,
                report,
            )
            .and_then(|e| fields::string(e, report));
            let port = required(
                &spec,
                "port",
                "the port the container listens on",
                entry.key_pos,
                report,
            )
            .and_then(|e| fields::integer(e, 1..=65_535, report))
            .and_then(|p| u16::try_from(p).ok());
            let path = match spec.get("path") {
                Some(e) => fields::string(e, report).map(|p| {
                    if !p.value.starts_with('/') {
                        report.error(
                            Code::InvalidValue,
                            e.key_pos,
                            format!("`path` must start with `/`, found `{}`", p.value),
                        );
                    }
                    p.value
                }),
                None => Some("/".to_owned()),
            };
            let command = match spec.get("command") {
                Some(_) => Some(command(&spec, entry.key_pos, false, report)?),
                None => None,
            };
            Some(Transform::Http {
                image: image?.value,
                port: port?,
                path: path?,
                command,
            })
        }
    }
}

/// `grace`, `emit`, `stateMaxGroups` and `stateStart` of a stateful `sql` step.
fn sql_state(fields: &Fields, report: &mut Report) -> SqlState {
    let grace_ms = fields
        .get("grace")
        .and_then(|e| {
            let text = fields::string(e, report)?;
            match humantime::parse_duration(&text.value) {
                Ok(grace) if grace <= MAX_GRACE => {
                    Some(u64::try_from(grace.as_millis()).unwrap_or(u64::MAX))
                }
                Ok(_) => {
                    report.error(
                        Code::InvalidValue,
                        e.key_pos,
                        format!(
                            "`grace` is at most 7d (a window's state is kept that long after its end), found `{}`",
                            text.value
                        ),
                    );
                    None
                }
                Err(error) => {
                    report.error(
                        Code::InvalidValue,
                        e.key_pos,
                        format!(
                            "`grace` is a duration like `30s`, `5m` or `500ms`, found `{}` ({error})",
                            text.value
                        ),
                    );
                    None
                }
            }
        })
        .unwrap_or(0);
    let emit = match fields
        .get("emit")
        .and_then(|e| fields::choice(e, &["close", "update"], report))
    {
        Some("update") => Emit::Update,
        _ => Emit::Close,
    };
    let max_groups = fields
        .get("stateMaxGroups")
        .and_then(|e| fields::integer(e, 1..=100_000_000, report));
    let start = match fields
        .get("stateStart")
        .and_then(|e| fields::choice(e, &["empty", "earliest"], report))
    {
        Some("empty") => Some(StateStart::Empty),
        Some("earliest") => Some(StateStart::Earliest),
        _ => None,
    };
    SqlState {
        grace_ms,
        emit,
        max_groups,
        start,
    }
}

/// Reports `tableMaxBytes` on a step that joins no table.
fn refuse_table_fields(fields: &Fields, what: &str, report: &mut Report) {
    if let Some(entry) = fields.get("tableMaxBytes") {
        report.error(
            Code::InvalidValue,
            entry.key_pos,
            format!("`tableMaxBytes` is for a `sql` step with JOIN (it keeps a table); {what} keeps none"),
        );
    }
}

/// Reports each state key of a step that keeps no state.
fn refuse_state_fields(fields: &Fields, what: &str, report: &mut Report) {
    for key in STATE_FIELDS {
        if let Some(entry) = fields.get(key) {
            report.error(
                Code::InvalidValue,
                entry.key_pos,
                format!(
                    "`{key}` is for a `sql` step with GROUP BY (it keeps state); {what} keeps none"
                ),
            );
        }
    }
}

fn command(
    fields: &Fields,
    at: Pos,
    required_here: bool,
    report: &mut Report,
) -> Option<Vec<String>> {
    let entry = if required_here {
        required(
            fields,
            "command",
            "the program and its arguments, e.g. [python3, enrich.py]",
            at,
            report,
        )?
    } else {
        fields.get("command")?
    };
    let command = fields::string_list(entry, report)?;
    if command.is_empty() {
        report.error(
            Code::InvalidValue,
            entry.key_pos,
            "`command` must name a program to run",
        );
        return None;
    }
    Some(command)
}

/// `env:`, and the names of the Secrets it references, each where it is written.
fn env(
    entry: &super::yaml::Entry,
    report: &mut Report,
) -> (BTreeMap<String, EnvValue>, Vec<Located<String>>) {
    let mut out = BTreeMap::new();
    let mut secrets = Vec::new();
    let Some(vars) = Fields::of(&entry.value, "`env`", entry.key_pos, report) else {
        return (out, secrets);
    };
    for var in vars.entries {
        if let Some(problem) = names::env_name_problem(&var.key) {
            report.error(Code::InvalidValue, var.key_pos, problem);
            continue;
        }
        if let Some(value) = env_value(&var.value) {
            out.insert(var.key.clone(), EnvValue::Value(value));
        } else if let Value::Mapping(_) = &var.value.value {
            if let Some((secret, at)) = secret_ref(var, report) {
                secrets.push(Located {
                    value: secret.name.clone(),
                    pos: at,
                });
                out.insert(
                    var.key.clone(),
                    EnvValue::Secret {
                        secret_key_ref: secret,
                    },
                );
            }
        } else {
            report.error(
                Code::InvalidValue,
                var.key_pos,
                format!(
                    "environment variable `{}` must be a string or \
                     `{{ secretKeyRef: {{ name: SECRET, key: KEY }} }}`, found {}",
                    var.key,
                    var.value.type_name()
                ),
            );
        }
    }
    (out, secrets)
}

/// `NAME: { secretKeyRef: { name: SECRET, key: KEY } }` in `env`, and where its `name` is.
fn secret_ref(var: &super::yaml::Entry, report: &mut Report) -> Option<(SecretRef, Pos)> {
    let what = format!("environment variable `{}`", var.key);
    let outer = Fields::of(&var.value, &what, var.key_pos, report)?;
    outer.reject_unknown(&["secretKeyRef"], &what, report);
    let Some(inner) = outer.get("secretKeyRef") else {
        report.error(
            Code::MissingField,
            var.key_pos,
            format!(
                "{what} must be a string or `{{ secretKeyRef: {{ name: SECRET, key: KEY }} }}`"
            ),
        );
        return None;
    };
    let fields = Fields::of(&inner.value, "`secretKeyRef`", inner.key_pos, report)?;
    fields.reject_unknown(&["name", "key"], "`secretKeyRef`", report);
    let mut part = |field: &str, problem: fn(&str) -> Option<String>| {
        let Some(entry) = fields.get(field) else {
            report.error(
                Code::MissingField,
                inner.key_pos,
                format!("`secretKeyRef` of {what} needs `{field}`"),
            );
            return None;
        };
        let value = fields::string(entry, report)?;
        if let Some(problem) = problem(&value.value) {
            report.error(Code::InvalidValue, value.pos, problem);
            return None;
        }
        Some(value)
    };
    let name = part("name", names::secret_name_problem);
    let key = part("key", names::secret_key_problem);
    let (name, key) = (name?, key?);
    Some((
        SecretRef {
            name: name.value,
            key: key.value,
        },
        name.pos,
    ))
}

/// `resources: { cpu: 500m, memory: 256Mi }`.
fn resources(entry: &super::yaml::Entry, report: &mut Report) -> Option<Resources> {
    let fields = Fields::of(&entry.value, "`resources`", entry.key_pos, report)?;
    fields.reject_unknown(&["cpu", "memory"], "`resources`", report);
    let mut quantity = |field: &str| {
        let value = fields::string(fields.get(field)?, report)?;
        if let Some(problem) = names::quantity_problem(&value.value) {
            report.error(Code::InvalidValue, value.pos, problem);
            return None;
        }
        Some(value.value)
    };
    let cpu = quantity("cpu");
    let memory = quantity("memory");
    (cpu.is_some() || memory.is_some()).then_some(Resources { cpu, memory })
}

/// Scalars as written (`N: 5` is "5"); null, lists and mappings are not values.
fn env_value(node: &Node) -> Option<String> {
    match &node.value {
        Value::Scalar(s) if !s.is_null() => Some(s.text.clone()),
        _ => None,
    }
}
