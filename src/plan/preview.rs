//! What a pull request's preview environment runs (SPEC §9): the steps the merge would start,
//! on live data, apart from everything users rely on. Pure: from the merged graph and what
//! runs to the preview's own graph.
//!
//! The preview of topology `t` for ref slug `s` is a topology of its own, `t.s`: real topology
//! names never hold a dot, so its consumer groups, internal and dead-letter topics
//! (`plumber.t.s.<step>…`) can be no one else's. It holds
//!
//! - every processor of the merged graph whose identity no running life has (added and
//!   replaced steps, SPEC §4 identities) and every processor downstream of one;
//! - as sources, what those read that runs already: the source topics, and the internal
//!   topics of running steps, under the steps' own names (so SQL's `FROM <input>` still names
//!   its input);
//! - their sinks, writing the shadow topic `<sink topic>.preview.<s>` instead.
//!
//! Every processor starts at the latest offsets of what it reads live (a preview shows what
//! the change does from now on; it never reprocesses the users' history), and at the
//! beginning of the preview's own internal topics, as any new reader of a new topic does.

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::{self, Kind, StepId, StepKind, Topology};
use crate::spec::names::{dns_label_problem, topic_problem};
use crate::spec::yaml::Pos;
use crate::spec::{
    ClusterSpec, Defaults, Endpoint, Located, ProcessorSpec, RepoSettings, RepoSpec, StartFrom,
    StepDef, StepSpec, TopologySpec,
};

use super::Deployment;

/// Slugs are at most this long, so `<topology>.<slug>` stays a Kubernetes label value (63).
pub const MAX_SLUG_LEN: usize = 20;

/// A preview environment of one topology.
#[derive(Debug, Clone)]
pub struct Preview {
    /// `<topology>.<slug>`, run as a topology of its own.
    pub graph: Topology,
    /// The topology it previews.
    pub of: String,
    /// Shadow topic → the users' sink topic it stands in for.
    pub shadow_topics: BTreeMap<String, String>,
    /// What runs that it reads live: source topics and running steps' internal topics.
    pub live_topics: BTreeSet<String>,
}

/// Why a preview cannot be made. Not mended by retrying: the names must change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("preview slug `{slug}`: {problem}")]
    Slug { slug: String, problem: String },
    #[error("the preview of topology `{topology}` would write topic `{topic}`: {problem}")]
    ShadowTopic {
        topology: String,
        topic: String,
        problem: String,
    },
    #[error("the preview of topology `{topology}` is not a valid topology: {message}")]
    Invalid { topology: String, message: String },
}

/// Whether a topology name is a preview environment's (`<topology>.<slug>`): real topology
/// names never hold a dot.
pub fn is_preview(name: &str) -> bool {
    name.contains('.')
}

/// The slug of a watched ref: `pr-N` (GitHub's `refs/pull/N/head`), `mr-N` (GitLab's
/// `refs/merge-requests/N/head`), else the branch's name as a DNS label, cut to
/// [`MAX_SLUG_LEN`].
pub fn slug_of_ref(refname: &str) -> String {
    let number = |prefix: &str| {
        refname
            .strip_prefix(prefix)?
            .strip_suffix("/head")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    if let Some(n) = number("refs/pull/") {
        return format!("pr-{n}");
    }
    if let Some(n) = number("refs/merge-requests/") {
        return format!("mr-{n}");
    }
    let name = refname.strip_prefix("refs/heads/").unwrap_or(refname);
    let mut slug = String::with_capacity(name.len());
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.truncate(MAX_SLUG_LEN);
    let slug = slug.trim_matches('-');
    if slug.is_empty() {
        "ref".into()
    } else {
        slug.into()
    }
}

/// The shadow topic a preview writes instead of `topic`.
pub fn shadow_topic(topic: &str, slug: &str) -> String {
    format!("{topic}.preview.{slug}")
}

/// The users' topic that `topic` stands in for, when `topology` is a preview and `topic` is
/// one of its shadow topics by name (`<topic>.preview.<slug>`): what the engine creates,
/// copies the partition count of, and deletes with the preview. Never a users' topic.
pub fn shadow_of<'t>(topology: &str, topic: &'t str) -> Option<&'t str> {
    let (_, slug) = topology.rsplit_once('.')?;
    topic
        .strip_suffix(slug)?
        .strip_suffix(".preview.")
        .filter(|users| !users.is_empty())
}

/// The previews of every topology of `merged` (a merge preview's graphs) that would start a
/// processor, `running` giving each topology's deployment (`None`: it does not run).
pub fn previews<'a>(
    merged: &[Topology],
    running: impl Fn(&str) -> Option<&'a Deployment>,
    clusters: &BTreeMap<String, ClusterSpec>,
    slug: &str,
) -> Result<Vec<Preview>, Error> {
    let nothing = Deployment::default();
    let mut previews = Vec::new();
    for topology in merged {
        let deployment = running(&topology.name).unwrap_or(&nothing);
        previews.extend(preview(topology, deployment, clusters, slug)?);
    }
    Ok(previews)
}

/// The preview of `merged` (the merge preview's graph of one topology) against `running` (its
/// deployment; empty when the topology does not run), or `None` when the merge would start no
/// processor. `clusters` are the merge preview's.
pub fn preview(
    merged: &Topology,
    running: &Deployment,
    clusters: &BTreeMap<String, ClusterSpec>,
    slug: &str,
) -> Result<Option<Preview>, Error> {
    let problem = if slug.len() > MAX_SLUG_LEN {
        Some(format!("slugs are at most {MAX_SLUG_LEN} characters"))
    } else {
        dns_label_problem(slug)
    };
    if let Some(problem) = problem {
        return Err(Error::Slug {
            slug: slug.into(),
            problem,
        });
    }
    // The internal topic each running identity writes, if it writes one.
    let mut live_outputs = BTreeMap::new();
    let mut runs = BTreeSet::new();
    for life in running.lives.iter().filter(|l| l.running) {
        runs.insert(life.identity());
        if life.writes(life.group()) {
            live_outputs.insert(life.identity(), life.group().to_owned());
        }
    }
    let processors = || {
        merged
            .steps()
            .filter(|(_, s)| s.kind() == Kind::Processor)
            .map(|(id, _)| id)
    };
    let mut selected: BTreeSet<StepId> = processors()
        .filter(|&id| !runs.contains(&merged.step(id).identity))
        .collect();
    if selected.is_empty() {
        return Ok(None);
    }
    for id in selected.clone() {
        selected.extend(
            merged
                .descendants(id)
                .into_iter()
                .filter(|&d| merged.step(d).kind() == Kind::Processor),
        );
    }
    let name = format!("{}.{slug}", merged.name);
    let at = |value: String| Located {
        value,
        pos: Pos::default(),
    };
    let mut steps = Vec::new();
    let mut shadow_topics = BTreeMap::new();
    let mut live_topics = BTreeSet::new();
    // Steps read by a preview processor but not run by it: read live, under their own names.
    let mut live_inputs = BTreeSet::new();
    for &id in &selected {
        live_inputs.extend(
            merged
                .inputs(id)
                .into_iter()
                .filter(|input| !selected.contains(input)),
        );
    }
    for (id, step) in merged.steps() {
        let def = if live_inputs.contains(&id) {
            let topic = match &step.kind {
                StepKind::Source { topic } => topic.clone(),
                // It runs (it is not selected), and its identity says it feeds a processor,
                // so its running life writes an internal topic.
                _ => match live_outputs.get(&step.identity) {
                    Some(topic) => topic.clone(),
                    None => continue,
                },
            };
            live_topics.insert(topic.clone());
            StepDef::Source(Endpoint {
                cluster: at(merged.cluster.clone()),
                topic: at(topic),
            })
        } else if selected.contains(&id) {
            let StepKind::Processor {
                transform,
                env,
                partitions,
                scale,
                resources,
                start_from: _,
            } = &step.kind
            else {
                continue;
            };
            StepDef::Processor(ProcessorSpec {
                inputs: names(merged, merged.inputs(id), at),
                transform: Some(transform.clone()),
                env: env.clone(),
                // The preview's graph was validated (and its secrets checked) as the merge's.
                secret_refs: Vec::new(),
                scale: *scale,
                resources: resources.clone(),
                partitions: *partitions,
                start_from: StartFrom::Latest,
            })
        } else if let StepKind::Sink { topic } = &step.kind {
            let inputs: Vec<StepId> = merged
                .inputs(id)
                .into_iter()
                .filter(|input| selected.contains(input))
                .collect();
            if inputs.is_empty() {
                continue;
            }
            let shadow = shadow_topic(topic, slug);
            if let Some(problem) = topic_problem(&shadow) {
                return Err(Error::ShadowTopic {
                    topology: merged.name.clone(),
                    topic: shadow,
                    problem,
                });
            }
            shadow_topics.insert(shadow.clone(), topic.clone());
            StepDef::Sink {
                endpoint: Endpoint {
                    cluster: at(merged.cluster.clone()),
                    topic: at(shadow),
                },
                inputs: names(merged, inputs, at),
            }
        } else {
            continue;
        };
        steps.push(StepSpec {
            name: step.name.clone(),
            file: step.file.clone(),
            def,
            description: step.description.clone(),
            owner: step.owner.clone(),
        });
    }

    let spec = RepoSpec {
        // Defaults are already in the steps; the clusters are what the graph checks.
        settings: RepoSettings {
            clusters: clusters.clone(),
            defaults: Defaults::default(),
            masked_fields: Vec::new(),
        },
        topologies: vec![TopologySpec {
            dir: format!("topologies/{}", merged.name),
            name,
            cutover: merged.cutover,
            replication: merged.replication,
            topic_config: merged.topic_config.clone(),
            steps,
            tests: Vec::new(),
        }],
    };
    let mut diagnostics = Vec::new();
    let invalid = |diagnostics: &[crate::diagnostic::Diagnostic]| Error::Invalid {
        topology: merged.name.clone(),
        message: diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    };
    let graph = graph::build(&spec, &mut diagnostics)
        .and_then(|mut graphs| graphs.pop())
        .ok_or_else(|| invalid(&diagnostics))?;
    Ok(Some(Preview {
        graph,
        of: merged.name.clone(),
        shadow_topics,
        live_topics,
    }))
}

fn names(
    topology: &Topology,
    ids: Vec<StepId>,
    at: impl Fn(String) -> Located<String>,
) -> Vec<Located<String>> {
    ids.into_iter()
        .map(|id| at(topology.step(id).name.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

    use super::*;
    use crate::spec::{FileContent, SourceFile};

    /// `in → a → b → out`, and `a → audit` beside it, with `overrides` replacing or adding
    /// files (an empty text removes one).
    fn topology(overrides: &[(&str, &str)]) -> Topology {
        let mut files: BTreeMap<&str, &str> = [
            ("in", "kind: source\ntopic: in\n"),
            ("a", "kind: processor\ninput: in\njq: '.'\n"),
            ("b", "kind: processor\ninput: a\njq: '.'\n"),
            ("out", "kind: sink\ntopic: out\ninput: b\n"),
            ("audit", "kind: sink\ntopic: audit\ninput: a\n"),
        ]
        .into_iter()
        .collect();
        files.extend(overrides.iter().copied());
        let files: Vec<SourceFile> = files
            .into_iter()
            .filter(|(_, yaml)| !yaml.is_empty())
            .map(|(name, yaml)| SourceFile {
                path: format!("topologies/t/{name}.yaml"),
                content: FileContent::Bytes(yaml.as_bytes().to_vec()),
            })
            .collect();
        let validation = crate::validate(&files);
        let mut topologies = validation
            .topologies
            .unwrap_or_else(|| panic!("invalid: {:?}", validation.diagnostics));
        topologies.remove(0)
    }

    fn preview_of(merged: &Topology, running: &Topology) -> Option<Preview> {
        preview(
            merged,
            &Deployment::of(running),
            &RepoSettings::default().clusters,
            "pr-7",
        )
        .unwrap()
    }

    /// Each step of the preview: (name, kind, what it reads or the topic it is).
    fn shape(preview: &Preview) -> Vec<(String, String)> {
        let graph = &preview.graph;
        graph
            .steps()
            .map(|(id, step)| {
                let what = match &step.kind {
                    StepKind::Source { topic } | StepKind::Sink { topic } => topic.clone(),
                    StepKind::Processor { .. } => graph.input_topics(id).join(","),
                };
                (step.name.clone(), what)
            })
            .collect()
    }

    #[test]
    fn a_changed_step_reads_what_runs_live_and_writes_shadow_sinks() {
        let running = topology(&[]);
        let merged = topology(&[("b", "kind: processor\ninput: a\njq: 'select(.x)'\n")]);
        let preview = preview_of(&merged, &running).expect("b changed");

        assert_eq!(preview.graph.name, "t.pr-7");
        assert_eq!(preview.of, "t");
        let a_topic = running.internal_name(running.find("a").unwrap());
        let b = preview.graph.find("b").unwrap();
        assert_eq!(
            shape(&preview),
            [
                ("a".to_owned(), a_topic.clone()),
                ("b".to_owned(), a_topic.clone()),
                ("out".to_owned(), "out.preview.pr-7".to_owned()),
            ]
        );
        // Its groups are its own: never a running step's, never another preview's.
        assert!(
            preview
                .graph
                .internal_name(b)
                .starts_with("plumber.t.pr-7.b.")
        );
        assert!(matches!(
            preview.graph.step(b).kind,
            StepKind::Processor {
                start_from: StartFrom::Latest,
                ..
            }
        ));
        assert_eq!(
            preview.shadow_topics,
            BTreeMap::from([("out.preview.pr-7".to_owned(), "out".to_owned())])
        );
        assert_eq!(preview.live_topics, BTreeSet::from([a_topic]));
    }

    #[test]
    fn a_change_upstream_takes_its_downstream_along_and_only_the_sinks_it_reaches() {
        let running = topology(&[]);
        let merged = topology(&[(
            "a",
            "kind: processor\ninput: in\njq: '.a'\nstartFrom: earliest\n",
        )]);
        let preview = preview_of(&merged, &running).expect("a changed");
        assert_eq!(
            shape(&preview),
            [
                ("in".to_owned(), "in".to_owned()),
                ("a".to_owned(), "in".to_owned()),
                ("audit".to_owned(), "audit.preview.pr-7".to_owned()),
                (
                    "b".to_owned(),
                    preview
                        .graph
                        .internal_name(preview.graph.find("a").unwrap())
                ),
                ("out".to_owned(), "out.preview.pr-7".to_owned()),
            ]
        );
        // A preview never reprocesses history, whatever the step asks of its own life.
        let a = preview.graph.find("a").unwrap();
        assert!(matches!(
            preview.graph.step(a).kind,
            StepKind::Processor {
                start_from: StartFrom::Latest,
                ..
            }
        ));
        assert_eq!(preview.live_topics, BTreeSet::from(["in".to_owned()]));
    }

    #[test]
    fn a_sink_read_by_a_changed_and_an_unchanged_step_gets_only_the_changed_one() {
        let both = "kind: sink\ntopic: out\ninput: [a, b]\n";
        let running = topology(&[("out", both)]);
        let merged = topology(&[
            ("out", both),
            ("b", "kind: processor\ninput: a\njq: '.y'\n"),
        ]);
        let preview = preview_of(&merged, &running).expect("b changed");
        let out = preview.graph.find("out").unwrap();
        let inputs: Vec<&str> = preview
            .graph
            .inputs(out)
            .into_iter()
            .map(|id| preview.graph.step(id).name.as_str())
            .collect();
        assert_eq!(inputs, ["b"]);
    }

    #[test]
    fn nothing_to_start_is_no_preview() {
        let running = topology(&[]);
        // A scale change is done in place: nothing new runs, so there is nothing to preview.
        let merged = topology(&[(
            "b",
            "kind: processor\ninput: a\njq: '.'\nscale: { min: 2, max: 4 }\n",
        )]);
        assert!(preview_of(&merged, &running).is_none());
        assert!(preview_of(&running, &running).is_none());
    }

    #[test]
    fn a_topology_that_does_not_run_yet_is_previewed_whole() {
        let merged = topology(&[]);
        let previews = previews(
            std::slice::from_ref(&merged),
            |_| None,
            &RepoSettings::default().clusters,
            "feature-x",
        )
        .unwrap();
        let [preview] = previews.as_slice() else {
            panic!("everything is new: {previews:?}");
        };
        assert_eq!(preview.graph.name, "t.feature-x");
        assert_eq!(
            preview.shadow_topics.keys().collect::<Vec<_>>(),
            ["audit.preview.feature-x", "out.preview.feature-x"]
        );
        assert_eq!(preview.live_topics, BTreeSet::from(["in".to_owned()]));
    }

    #[test]
    fn an_sql_step_still_names_its_input() {
        let running = topology(&[]);
        let merged = topology(&[(
            "b",
            "kind: processor\ninput: a\nsql: SELECT * FROM a WHERE x > 1\n",
        )]);
        let preview = preview_of(&merged, &running).expect("b changed");
        assert!(preview.graph.find("b").is_some());
    }

    #[test]
    fn slugs_name_pull_requests_and_branches_as_dns_labels() {
        assert_eq!(slug_of_ref("refs/pull/12/head"), "pr-12");
        assert_eq!(slug_of_ref("refs/merge-requests/3/head"), "mr-3");
        assert_eq!(
            slug_of_ref("refs/heads/Feature/New_Scoring"),
            "feature-new-scoring"
        );
        assert_eq!(
            slug_of_ref("refs/heads/a-very-long-branch-name-indeed"),
            "a-very-long-branch-n"
        );
        assert_eq!(slug_of_ref("refs/heads/--"), "ref");
        assert_eq!(slug_of_ref("refs/pull/x/head"), "refs-pull-x-head");
        let running = topology(&[]);
        let merged = topology(&[("b", "kind: processor\ninput: a\njq: '.y'\n")]);
        for bad in ["", "Pr-1", "a.b", "x".repeat(MAX_SLUG_LEN + 1).as_str()] {
            let error = preview(
                &merged,
                &Deployment::of(&running),
                &RepoSettings::default().clusters,
                bad,
            )
            .expect_err(bad);
            assert!(matches!(error, Error::Slug { .. }), "{bad}: {error}");
        }
    }

    #[test]
    fn shadow_topics_are_told_by_their_preview_s_name_only() {
        assert_eq!(shadow_of("t.pr-7", "out.preview.pr-7"), Some("out"));
        assert_eq!(shadow_of("t.pr-7", "out.preview.pr-70"), None);
        assert_eq!(shadow_of("t.pr-7", "out"), None);
        assert_eq!(shadow_of("t.pr-7", ".preview.pr-7"), None);
        // A real topology has no shadow topics, whatever its sinks are called.
        assert_eq!(shadow_of("t", "out.preview.t"), None);
    }

    /// The engine is the only actor on Kafka: a preview's shadow topics and consumer groups
    /// are actions of its plan, created before anything writes them and deleted once its
    /// lives stopped.
    #[test]
    fn a_preview_s_engine_creates_its_shadow_topics_and_deletes_them_and_its_groups() {
        use crate::plan::deployment::{Effect, TopicKind};
        use crate::plan::{Action, moves};

        let running = topology(&[]);
        let merged = topology(&[("b", "kind: processor\ninput: a\njq: 'select(.x)'\n")]);
        let preview = preview_of(&merged, &running).expect("b changed");
        let name = preview.graph.name.clone();
        let actions = moves::plan(&name, &Deployment::default(), Some(&preview.graph));
        let created = actions.iter().position(|a| {
            matches!(a, Action::CreateTopic { topic, kind: TopicKind::Shadow, .. }
                if topic == "out.preview.pr-7")
        });
        let started = actions
            .iter()
            .position(|a| matches!(a, Action::StartProcessor(s) if s.step == "b"));
        assert!(
            matches!((created, started), (Some(c), Some(s)) if c < s),
            "the shadow topic exists before b writes it: {actions:#?}"
        );

        let mut deployment = Deployment::default();
        for action in &actions {
            deployment.apply(action, Effect::Done);
        }
        assert!(deployment.shadow_topics.contains("out.preview.pr-7"));
        // Torn down: b stops, then its shadow topic and its group go.
        let teardown = moves::plan(&name, &deployment, None);
        let describe: Vec<String> = teardown.iter().map(crate::cutover::describe).collect();
        let stop = describe
            .iter()
            .position(|a| a.starts_with("stop-processor plumber.t.pr-7.b."));
        let delete_shadow = describe
            .iter()
            .position(|a| a == "delete-topic out.preview.pr-7");
        let delete_groups = describe
            .iter()
            .position(|a| a.starts_with("delete-groups plumber.t.pr-7.b."));
        assert!(
            matches!((stop, delete_shadow, delete_groups), (Some(s), Some(t), Some(g)) if s < t && s < g),
            "{describe:#?}"
        );
        let mut retired = deployment.clone();
        for action in &teardown {
            retired.apply(action, Effect::Stopped(Vec::new()));
        }
        assert!(retired.is_empty());
        assert!(
            moves::remaining(&name, &retired, None).is_empty(),
            "settled"
        );

        // A real topology's removal deletes no group (its record keeps their names), and a
        // record naming another's groups gets none of them deleted.
        let mut other = retired.clone();
        other.groups_deleted.clear();
        other
            .lives_used
            .insert("plumber.t.pr-70.b.0123456789ab".into(), 1);
        let left: Vec<String> = moves::remaining(&name, &other, None)
            .iter()
            .map(|p| crate::cutover::describe(&p.action))
            .collect();
        assert!(
            left.iter()
                .all(|a| a.starts_with("delete-groups plumber.t.pr-7.")),
            "{left:?}"
        );
        assert!(moves::remaining("t", &other, None).is_empty());
    }
}
