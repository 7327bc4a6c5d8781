//! `plumber.yaml` (clusters, defaults) and `topology.yaml` (cutover mode, defaults).

use std::collections::BTreeMap;

use super::fields::{self, Fields, Report};
use super::properties::Origin;
use super::yaml::Node;
use super::{ClusterSpec, CutoverMode, Defaults, RepoSettings, Scale, SourceFile};
use crate::diagnostic::{Code, Diagnostic};

pub(super) fn repo_settings(file: &SourceFile, diagnostics: &mut Vec<Diagnostic>) -> RepoSettings {
    let mut settings = RepoSettings::default();
    let Some(node) = root_mapping(file, diagnostics) else {
        return settings;
    };
    let report = &mut Report {
        file: &file.path,
        diagnostics,
    };
    let Some(fields) = Fields::of(&node, "plumber.yaml", node.pos, report) else {
        return settings;
    };
    fields.reject_unknown(&["clusters", "defaults", "review"], "plumber.yaml", report);
    if let Some(entry) = fields.get("review")
        && let Some(review) = Fields::of(&entry.value, "`review`", entry.key_pos, report)
    {
        review.reject_unknown(&["maskFields"], "`review`", report);
        if let Some(entry) = review.get("maskFields") {
            settings.masked_fields = fields::string_list(entry, report).unwrap_or_default();
        }
    }
    if let Some(entry) = fields.get("defaults") {
        settings.defaults = defaults(
            &entry.value,
            entry,
            std::mem::take(&mut settings.defaults),
            report,
        );
    }
    if let Some(entry) = fields.get("clusters") {
        // Declared clusters replace the implicit `default` one.
        settings.clusters = BTreeMap::new();
        let Some(clusters) = Fields::of(&entry.value, "`clusters`", entry.key_pos, report) else {
            return settings;
        };
        for cluster in clusters.entries {
            let Some(spec) = Fields::of(&cluster.value, "a cluster", cluster.key_pos, report)
            else {
                continue;
            };
            spec.reject_unknown(
                &["bootstrap", "properties", "credentials"],
                "a cluster",
                report,
            );
            let Some(entry) = spec.get("bootstrap") else {
                report.error(
                    Code::MissingField,
                    cluster.key_pos,
                    format!("cluster `{}` needs `bootstrap: host:port`", cluster.key),
                );
                continue;
            };
            let Some(bootstrap) = fields::string(entry, report) else {
                continue;
            };
            let mut out = ClusterSpec::at(bootstrap.value);
            if let Some(entry) = spec.get("properties") {
                out.properties = properties(entry, report);
            }
            if let Some(entry) = spec.get("credentials") {
                out.credentials = credentials(entry, report);
            }
            settings.clusters.insert(cluster.key.clone(), out);
        }
    }
    settings
}

pub(super) fn topology_settings(
    file: &SourceFile,
    inherited: Defaults,
    diagnostics: &mut Vec<Diagnostic>,
) -> (CutoverMode, Defaults) {
    let mut result = (CutoverMode::default(), inherited);
    let Some(node) = root_mapping(file, diagnostics) else {
        return result;
    };
    let report = &mut Report {
        file: &file.path,
        diagnostics,
    };
    let Some(fields) = Fields::of(&node, "topology.yaml", node.pos, report) else {
        return result;
    };
    fields.reject_unknown(
        &["cutover", "defaults", "description", "owner"],
        "topology.yaml",
        report,
    );
    if let Some(entry) = fields.get("cutover")
        && let Some("ordered") = fields::choice(entry, &["parallel", "ordered"], report)
    {
        result.0 = CutoverMode::Ordered;
    }
    if let Some(entry) = fields.get("defaults") {
        result.1 = defaults(&entry.value, entry, std::mem::take(&mut result.1), report);
    }
    for key in ["description", "owner"] {
        if let Some(entry) = fields.get(key) {
            fields::string(entry, report);
        }
    }
    result
}

/// The document of a settings file; `None` when it is empty or unreadable (already reported).
fn root_mapping(file: &SourceFile, diagnostics: &mut Vec<Diagnostic>) -> Option<Node> {
    super::parse_yaml(file, diagnostics).ok().flatten()
}

fn defaults(
    node: &Node,
    entry: &super::yaml::Entry,
    base: Defaults,
    report: &mut Report,
) -> Defaults {
    let mut out = base;
    let Some(fields) = Fields::of(node, "`defaults`", entry.key_pos, report) else {
        return out;
    };
    fields.reject_unknown(
        &["partitions", "replication", "topicConfig", "scale"],
        "`defaults`",
        report,
    );
    if let Some(p) = fields.get("partitions")
        && let Some(n) = partitions(p, report)
    {
        out.partitions = n;
    }
    if let Some(r) = fields.get("replication")
        && let Some(n) = fields::integer(r, 1..=100, report).and_then(|n| u32::try_from(n).ok())
    {
        out.replication = Some(n);
    }
    if let Some(entry) = fields.get("topicConfig") {
        topic_config(entry, &mut out.topic_config, report);
    }
    if let Some(s) = fields.get("scale") {
        out.scale = scale(s, out.scale, report);
    }
    out
}

/// `topicConfig: { retention.ms: 86400000, … }` over `config`: Kafka topic settings of the
/// topics Plumber creates. A compacted internal topic would drop records no reader has seen
/// yet, so `cleanup.policy` may only be `delete`.
fn topic_config(
    entry: &super::yaml::Entry,
    config: &mut BTreeMap<String, String>,
    report: &mut Report,
) {
    let Some(fields) = Fields::of(&entry.value, "`topicConfig`", entry.key_pos, report) else {
        return;
    };
    for setting in fields.entries {
        let legal = !setting.key.is_empty()
            && setting
                .key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_');
        if !legal {
            report.error(
                Code::InvalidValue,
                setting.key_pos,
                format!(
                    "`{}` is not a Kafka topic setting name (lower-case words joined by dots, like `retention.ms`)",
                    setting.key
                ),
            );
            continue;
        }
        let Some(value) = fields::string(setting, report) else {
            continue;
        };
        if setting.key == "cleanup.policy" && value.value != "delete" {
            report.error(
                Code::InvalidValue,
                setting.key_pos,
                format!(
                    "`cleanup.policy: {}` would let Kafka drop records of internal topics before their readers saw them; only `delete` is allowed",
                    value.value
                ),
            );
            continue;
        }
        config.insert(setting.key.clone(), value.value);
    }
}

/// `properties:` of a cluster: librdkafka settings as strings, never secrets.
fn properties(entry: &super::yaml::Entry, report: &mut Report) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(props) = Fields::of(&entry.value, "`properties`", entry.key_pos, report) else {
        return out;
    };
    for prop in props.entries {
        let key = prop.key.as_str();
        match &prop.value.value {
            super::yaml::Value::Scalar(s) if !s.is_null() => {
                match super::properties::problem(key, &s.text, Origin::Repository) {
                    Some(problem) => report.error(Code::InvalidValue, prop.key_pos, problem),
                    None => {
                        out.insert(key.to_owned(), s.text.clone());
                    }
                }
            }
            _ => report.error(
                Code::InvalidValue,
                prop.key_pos,
                super::properties::problem(key, "", Origin::Repository).unwrap_or_else(|| {
                    format!(
                        "property `{key}` must be a string, found {}",
                        prop.value.type_name()
                    )
                }),
            ),
        }
    }
    out
}

/// `credentials: { secret: NAME }` of a cluster.
fn credentials(entry: &super::yaml::Entry, report: &mut Report) -> Option<String> {
    let fields = Fields::of(&entry.value, "`credentials`", entry.key_pos, report)?;
    fields.reject_unknown(&["secret"], "`credentials`", report);
    let Some(secret) = fields.get("secret") else {
        report.error(
            Code::MissingField,
            entry.key_pos,
            "`credentials` needs `secret: NAME` (the Secret holding the cluster's credentials)",
        );
        return None;
    };
    let name = fields::string(secret, report)?;
    if let Some(problem) = super::names::secret_name_problem(&name.value) {
        report.error(Code::InvalidValue, name.pos, problem);
        return None;
    }
    Some(name.value)
}

pub(super) fn partitions(entry: &super::yaml::Entry, report: &mut Report) -> Option<u32> {
    fields::integer(entry, 1..=10_000, report).and_then(|n| u32::try_from(n).ok())
}

/// A (possibly partial) `scale` mapping over `base`, with `min <= max` checked.
pub(super) fn scale(entry: &super::yaml::Entry, base: Scale, report: &mut Report) -> Scale {
    let mut out = base;
    let Some(fields) = Fields::of(&entry.value, "`scale`", entry.key_pos, report) else {
        return out;
    };
    fields.reject_unknown(&["min", "max", "lagThreshold"], "`scale`", report);
    let bounded = |key: &str, range, report: &mut Report| {
        fields
            .get(key)
            .and_then(|e| fields::integer(e, range, report))
    };
    if let Some(min) = bounded("min", 0..=1_000, report) {
        out.min = u32::try_from(min).unwrap_or(u32::MAX);
    }
    if let Some(max) = bounded("max", 1..=1_000, report) {
        out.max = u32::try_from(max).unwrap_or(u32::MAX);
    }
    if let Some(threshold) = bounded("lagThreshold", 1..=u64::from(u32::MAX), report) {
        out.lag_threshold = threshold;
    }
    if out.min > out.max {
        report.error(
            Code::InvalidValue,
            entry.key_pos,
            format!(
                "`scale.min` ({}) is greater than `scale.max` ({})",
                out.min, out.max
            ),
        );
        out.max = out.min;
    }
    out
}
