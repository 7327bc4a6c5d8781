//! Plumber: a GitOps reconciler for stream-processing topologies on Kafka and Kubernetes.
//!
//! Data flows through the modules in this order:
//!
//! 1. [`repo`] reads the files of one commit from git (never the working tree);
//! 2. [`spec`] parses them into settings and step definitions, with every problem located;
//! 3. [`graph`] resolves inputs into a DAG per topology and computes step identities;
//! 4. [`plan`] diffs two commits' graphs into the ordered cutover actions the engine runs;
//! 5. [`output`] renders diagnostics, graphs and plans for people and tools.
//!
//! The daemon (`plumber up`) runs them continuously:
//!
//! 6. [`daemon`] follows a branch, validates each new commit and plans per topology;
//! 7. [`cutover`] moves a topology's deployment towards the desired graph, one planned action
//!    at a time, against a [`runtime`] (where processors run) and Kafka ([`kafka`]), saving
//!    each action's effect in a [`store`] (the state directory of `plumber up`).
//!
//! [`forge`] puts the plan of a pull request on GitHub or GitLab (a comment and a status);
//! [`trust`] tells whether a commit is signed by a trusted key (`--trusted-keys`).

pub mod cutover;
pub mod daemon;
pub mod datadiff;
pub mod diagnostic;
pub mod durable;
pub mod forge;
pub mod graph;
pub mod kafka;
pub mod output;
pub mod owners;
pub mod plan;
pub mod repo;
pub mod runtime;
pub mod spec;
pub mod steptest;
pub mod store;
pub mod trust;
pub mod web;

use diagnostic::Diagnostic;
use graph::Topology;
use spec::SourceFile;

/// The outcome of validating one commit's files.
#[derive(Debug, Clone)]
pub struct Validation {
    /// Each topology found, with its number of step files (also when invalid).
    pub found: Vec<(String, usize)>,
    /// The graphs, present only when there are no errors.
    pub topologies: Option<Vec<Topology>>,
    /// Errors and warnings, in reading order.
    pub diagnostics: Vec<Diagnostic>,
    /// The clusters of `plumber.yaml`, by name.
    pub clusters: std::collections::BTreeMap<String, spec::ClusterSpec>,
    /// The record fields a review never shows (`plumber.yaml`'s `review.maskFields`).
    pub masked_fields: Vec<String>,
}

impl Validation {
    /// A commit refused before its files were read (over budget, a name no file can have).
    pub fn refused(diagnostic: Diagnostic) -> Validation {
        Validation {
            found: Vec::new(),
            topologies: None,
            diagnostics: vec![diagnostic],
            clusters: Default::default(),
            masked_fields: Vec::new(),
        }
    }

    pub fn is_valid(&self) -> bool {
        self.topologies.is_some()
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| !d.is_error())
    }
}

/// The stack [`validate`] runs on. jaq recurses per level of a jq program's nesting, which is
/// bounded by [`spec::jq::MAX_NESTING`] (the YAML tree by its own depth limit): a program at
/// the limit needs under 4 MiB in a debug build, so this leaves a wide margin whatever the
/// stack of the caller's thread. It is reserved, not used: only touched pages are allocated.
pub const VALIDATION_STACK_BYTES: usize = 16 * 1024 * 1024;

/// Validates one commit's files and, if they are valid, builds their graphs. Safe to call from
/// any thread: the work runs on a thread of its own with a stack of
/// [`VALIDATION_STACK_BYTES`].
pub fn validate(files: &[SourceFile]) -> Validation {
    validate_with(files, &spec::StepSecrets::Unchecked)
}

/// As [`validate`], with the Secrets steps may reference checked ([`spec::StepSecrets`]).
pub fn validate_with(files: &[SourceFile], secrets: &spec::StepSecrets) -> Validation {
    on_validation_stack(|| validate_here(files, secrets))
}

/// Validates topologies one by one, each given its own files (`topologies/<name>/…`) and the
/// repository's settings: what [`validate`] finds of each, since a topology's validity depends
/// only on its files and `plumber.yaml`. The settings' own problems are not repeated here
/// ([`spec::load_settings`] reports them). All of them on one thread of
/// [`VALIDATION_STACK_BYTES`].
pub fn validate_topologies(
    settings: &spec::RepoSettings,
    secrets: &spec::StepSecrets,
    topologies: &[Vec<SourceFile>],
) -> Vec<Validation> {
    on_validation_stack(|| {
        topologies
            .iter()
            .map(|files| {
                let (spec, mut diagnostics) = spec::load_with(settings.clone(), files);
                secrets.check(&spec, &mut diagnostics);
                let graphs = graph::build(&spec, &mut diagnostics);
                diagnostic::normalize(&mut diagnostics);
                Validation {
                    found: found(&spec),
                    topologies: graphs,
                    diagnostics,
                    clusters: spec.settings.clusters,
                    masked_fields: spec.settings.masked_fields,
                }
            })
            .collect()
    })
}

fn on_validation_stack<T: Send>(work: impl Fn() -> T + Sync) -> T {
    std::thread::scope(|scope| {
        let validating = std::thread::Builder::new()
            .name("validate".into())
            .stack_size(VALIDATION_STACK_BYTES)
            .spawn_scoped(scope, &work);
        match validating {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // Out of threads or memory: this thread's stack is the best there is.
            Err(error) => {
                tracing::warn!(%error, "cannot start a validation thread; validating on this one");
                work()
            }
        }
    })
}

fn found(spec: &spec::RepoSpec) -> Vec<(String, usize)> {
    spec.topologies
        .iter()
        .map(|t| (t.name.clone(), t.steps.len()))
        .collect()
}

fn validate_here(files: &[SourceFile], secrets: &spec::StepSecrets) -> Validation {
    let (spec, mut diagnostics) = spec::load(files);
    secrets.check(&spec, &mut diagnostics);
    let topologies = graph::build(&spec, &mut diagnostics);
    diagnostic::normalize(&mut diagnostics);
    Validation {
        found: found(&spec),
        topologies,
        diagnostics,
        clusters: spec.settings.clusters,
        masked_fields: spec.settings.masked_fields,
    }
}
