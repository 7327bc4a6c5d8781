//! `plumber.yaml` (clusters, defaults) and `topology.yaml` (cutover mode, defaults).

use std::collections::BTreeMap;

use super::fields::{self, Fields, Report};
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
    fields.reject_unknown(&["clusters", "defaults"], "plumber.yaml", report);
    if let Some(entry) = fields.get("defaults") {
        settings.defaults = defaults(&entry.value, entry, settings.defaults, report);
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
            spec.reject_unknown(&["bootstrap"], "a cluster", report);
            let Some(entry) = spec.get("bootstrap") else {
                report.error(
                    Code::MissingField,
                    cluster.key_pos,
                    format!("cluster `{}` needs `bootstrap: host:port`", cluster.key),
                );
                continue;
            };
            if let Some(bootstrap) = fields::string(entry, report) {
                let spec = ClusterSpec {
                    bootstrap: bootstrap.value,
                };
                settings.clusters.insert(cluster.key.clone(), spec);
            }
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
        result.1 = defaults(&entry.value, entry, inherited, report);
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
        &["partitions", "replication", "scale"],
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
    if let Some(s) = fields.get("scale") {
        out.scale = scale(s, base.scale, report);
    }
    out
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
