//! Plans of watched refs (SPEC §6, §9): per ref matching `--watch-refs` (the tracked branch
//! aside), the merge preview of the ref into the tracked branch, validated and planned
//! against what runs now, as the engine would plan that tree if it were merged.
//!
//! Off the cutover's path: the follower only says "look again" after each look at the branch
//! (the watcher of a local repository and the mirror's fetches already notice every ref
//! moving), and a settled cutover says that what runs changed; one worker thread does the
//! rest. Per ref the newest inputs win: a ref's head is read again right before its plan is
//! computed, and a plan is recomputed only when its ref, the tracked branch or what runs moved.
//!
//! Cheap by caching: topologies are validated once per git tree ([`crate::daemon::revisions::TreeCache`],
//! shared with the branch's revisions), and each topology's plan once per (tree, what runs of
//! it), so a push to one branch plans one topology again, and a push to the tracked branch
//! plans again only what it changed, for every ref.
//!
//! Each plan is also written as a git note on the ref's head ([`NOTES_REF`]), unless the note
//! there already carries its [`RefPlan::fingerprint`] (what the plan means, whatever commit of
//! the tracked branch it was merged into: the branch moving rewrites no note whose plan it did
//! not change), and announced to [`Plans::subscribe`]rs (the SSE stream of `GET /api/events`;
//! the forge integration).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use git2::Oid;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::daemon::revisions::{TopologyKey, TreeValidation};
use crate::daemon::watch::{NOTES_REF, ref_matches};
use crate::daemon::{Context, Error};
use crate::datadiff::Side;
use crate::diagnostic::Diagnostic;
use crate::graph::Topology;
use crate::owners::CodeOwners;
use crate::plan::{Change, Plan, TopologyPlan};
use crate::repo::{MergeTree, Repository};
use crate::spec::ClusterSpec;
use crate::steptest::Commands;

/// Why a pull request's exec and http steps do not run in its step tests and data diff.
const PULL_REQUEST_COMMANDS: &str = "the daemon runs a pull request's commands only with `plumber up --run-commands`, on a head a maintainer's preview label approved";

/// Whether commands run from `checkout` in a ref plan's data diff, or why not.
fn commands(checkout: Option<&tempfile::TempDir>) -> Commands<'_> {
    match checkout {
        Some(dir) => Commands::From(dir.path()),
        None => Commands::Refused(PULL_REQUEST_COMMANDS),
    }
}

/// The plan of one watched ref: `GET /api/plans/{ref}`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefPlan {
    #[serde(rename = "ref")]
    pub name: String,
    /// The ref's head commit.
    pub head: String,
    /// The tracked branch's head it is merged into.
    pub base: String,
    /// The commit the plan starts from: what most topologies run (`None`: nothing runs).
    pub from: Option<String>,
    /// Whether the merge is conflict-free and valid: then `topologies` is its plan.
    pub valid: bool,
    /// Whether the ref's own head is valid. `true` with `valid` false: the ref is broken by
    /// the merge only (the errors say where).
    pub valid_alone: bool,
    /// Files the merge conflicts in.
    pub conflicts: Vec<String>,
    /// The merge preview's errors, in their own files.
    pub errors: Vec<Diagnostic>,
    /// As `plan --format json`: every topology, in name order.
    pub topologies: Vec<TopologyPlan>,
    /// Whether a preview environment runs the ref (`--preview-label`, [`super::previews`]).
    pub preview: bool,
    /// The topologies of its preview environment, when `preview`.
    pub previews: Vec<PreviewTopology>,
    /// The pull (GitHub) or merge (GitLab) request of `refs/pull/N/head` and
    /// `refs/merge-requests/N/head`.
    pub pull_request: Option<u64>,
    /// Planned for a daemon that keeps retired topics (`--keep-topics`), as
    /// `plan --keep-topics`: `delete-topic` actions are listed as kept topics instead.
    pub keep_topics: bool,
    /// The review text (`?format=markdown`), also the git note on the head: what
    /// `plumber plan --base BRANCH --head REF --format markdown` prints when what runs is the
    /// branch's head, then a line saying it is a merge preview.
    #[serde(skip)]
    pub markdown: String,
    /// The end of `markdown` that says what its preview environment runs (empty: none).
    #[serde(skip)]
    preview_markdown: String,
    /// A digest of what the plan means (its head, validity, conflicts, errors, topologies'
    /// plans, `--keep-topics`, preview; not the base it was merged into): the note and the
    /// forge's comment are written again only when it changes.
    #[serde(skip)]
    pub fingerprint: String,
    /// What [`RefPlan::markdown_within`] shortens (`None`: the ref cannot be planned).
    #[serde(skip)]
    review: Option<Review>,
    /// What the change does to the records that feed its replaced and added steps (the
    /// daemon's `dataDiff`; empty without it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_diff: Vec<crate::datadiff::StepDiff>,
}

/// A topology of a ref's preview environment, as `GET /api/plans/{ref}` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewTopology {
    /// The topology it previews.
    pub topology: String,
    /// Its own name, `<topology>.<slug>`: the name its processors, groups and status have.
    pub preview: String,
    /// The processors it runs.
    pub processors: Vec<String>,
    /// Shadow topic → the sink topic it stands in for.
    pub shadow_topics: BTreeMap<String, String>,
}

/// What a plan shows of its running preview environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownPreview {
    pub topologies: Vec<PreviewTopology>,
    /// The comment's section ([`crate::output::preview::markdown`]).
    pub markdown: String,
}

/// The graphs the review text draws, of the topologies that change.
#[derive(Debug, Clone)]
struct Review {
    new_graphs: Vec<Topology>,
    old_graphs: Vec<Topology>,
    /// The closing line: which merge this previews.
    footer: String,
    /// The clusters of the merge.
    clusters: BTreeMap<String, ClusterSpec>,
    /// The clusters of the tracked branch's head.
    base_clusters: BTreeMap<String, ClusterSpec>,
}

impl RefPlan {
    /// The plan as `plumber plan` builds it (`from` what runs, `to` the ref's head).
    pub fn as_plan(&self) -> Plan {
        Plan {
            from: self.from.clone(),
            to: self.head.clone(),
            topologies: self.topologies.clone(),
            keep_topics: self.keep_topics,
        }
    }

    /// [`RefPlan::markdown`] within `limit` bytes (a forge's comment limit, e.g.
    /// [`crate::output::plan::GITHUB_COMMENT_LIMIT`]), shortened as
    /// [`crate::output::plan::markdown_within`] does: whole sections, never mid-table. The
    /// errors of a ref that cannot be planned are cut between list items.
    pub fn markdown_within(&self, limit: usize) -> String {
        if self.markdown.len() <= limit {
            return self.markdown.clone();
        }
        let preview = &self.preview_markdown;
        let body = self.plan_markdown_within(limit.saturating_sub(preview.len()));
        if body.len() + preview.len() <= limit {
            body + preview
        } else {
            self.plan_markdown_within(limit)
        }
    }

    /// An invalid plan of `name`, for tests.
    #[cfg(test)]
    pub(crate) fn for_test(name: &str) -> RefPlan {
        RefPlan {
            name: name.to_owned(),
            head: String::new(),
            base: String::new(),
            from: None,
            valid: false,
            valid_alone: false,
            conflicts: Vec::new(),
            errors: Vec::new(),
            topologies: Vec::new(),
            preview: false,
            previews: Vec::new(),
            pull_request: crate::forge::pull_request_of_ref(name),
            keep_topics: false,
            markdown: String::new(),
            preview_markdown: String::new(),
            fingerprint: String::new(),
            review: None,
            data_diff: Vec::new(),
        }
    }

    /// This plan, as if its merge had `clusters` and its base `base`.
    #[cfg(test)]
    pub(crate) fn with_clusters_for_test(
        mut self,
        clusters: BTreeMap<String, ClusterSpec>,
        base_clusters: BTreeMap<String, ClusterSpec>,
    ) -> RefPlan {
        self.review = Some(Review {
            new_graphs: Vec::new(),
            old_graphs: Vec::new(),
            footer: String::new(),
            clusters,
            base_clusters,
        });
        self
    }

    /// The graphs of the merge of the topologies that change (those a preview can run).
    pub fn merged_graphs(&self) -> &[Topology] {
        self.review.as_ref().map_or(&[], |r| &r.new_graphs)
    }

    /// The clusters of the tracked branch it is merged into (`None`: the ref cannot be
    /// planned): what a preview of it runs with.
    pub fn base_clusters(&self) -> Option<&BTreeMap<String, ClusterSpec>> {
        self.review.as_ref().map(|r| &r.base_clusters)
    }

    /// Whether the merge's clusters (bootstrap, properties, credentials) differ from the
    /// tracked branch's: such a change runs no preview (SPEC §11).
    pub fn changes_clusters(&self) -> bool {
        self.review
            .as_ref()
            .is_some_and(|r| r.clusters != r.base_clusters)
    }

    /// `markdown` without its preview section.
    fn plan_markdown(&self) -> &str {
        let end = self.markdown.len() - self.preview_markdown.len();
        self.markdown.get(..end).unwrap_or(&self.markdown)
    }

    /// This plan showing `shown` (`None`: no preview runs).
    fn showing(&self, shown: Option<&ShownPreview>) -> RefPlan {
        let mut plan = self.clone();
        plan.markdown = self.plan_markdown().to_owned();
        // A note alone (why no preview runs) shows no preview.
        plan.preview = shown.is_some_and(|s| !s.topologies.is_empty());
        plan.previews = shown.map(|s| s.topologies.clone()).unwrap_or_default();
        plan.preview_markdown = shown
            .map(|s| format!("\n{}", s.markdown))
            .unwrap_or_default();
        plan.markdown.push_str(&plan.preview_markdown);
        // The meaning is a digest of the whole plan's JSON (every topology's): made again
        // only when what the preview shows changed it.
        let same = plan.previews == self.previews
            && plan.preview_markdown == self.preview_markdown
            && !self.fingerprint.is_empty();
        if !same {
            plan.fingerprint = plan.meaning();
        }
        plan
    }

    /// The fingerprint of what the plan means: the ref's head, whether its merge is valid (and
    /// the ref alone), its conflicts and errors, each topology's plan (steps, why and whose,
    /// actions, kept topics), `--keep-topics`, what its preview environment runs, and the
    /// version of Plumber that renders it. Not the commit of the tracked branch it was merged
    /// into, nor the commit it was planned from: a push to the branch that leaves all of the
    /// above as it was (most pushes, for most pull requests) changes no fingerprint.
    ///
    /// A digest of their JSON, because it outlives the daemon: it is written into the note
    /// and the forge's comment, and read back from them after a restart.
    fn meaning(&self) -> String {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Meaning<'a> {
            version: &'static str,
            head: &'a str,
            valid: bool,
            valid_alone: bool,
            conflicts: &'a [String],
            errors: &'a [Diagnostic],
            topologies: &'a [TopologyPlan],
            keep_topics: bool,
            previews: &'a [PreviewTopology],
            preview_markdown: &'a str,
        }
        let meaning = Meaning {
            version: env!("CARGO_PKG_VERSION"),
            head: &self.head,
            valid: self.valid,
            valid_alone: self.valid_alone,
            conflicts: &self.conflicts,
            errors: &self.errors,
            topologies: &self.topologies,
            keep_topics: self.keep_topics,
            previews: &self.previews,
            preview_markdown: &self.preview_markdown,
        };
        let mut digest = Sha256::new();
        if let Err(error) = serde_json::to_writer(&mut digest, &meaning) {
            // Never seen (these types serialise for `GET /api/plans`); the text then stands
            // in, so that a plan that changed is never taken for the same.
            tracing::warn!(r#ref = %self.name, %error, "cannot fingerprint a plan; its text is used instead");
            digest = Sha256::new();
            digest.update(self.markdown.as_bytes());
        }
        hex::encode(&digest.finalize()[..16])
    }

    fn plan_markdown_within(&self, limit: usize) -> String {
        let markdown = self.plan_markdown();
        if markdown.len() <= limit {
            return markdown.to_owned();
        }
        let Some(review) = &self.review else {
            return cut_between_lines(markdown, limit);
        };
        let body = crate::output::plan::markdown_within(
            &self.as_plan(),
            &review.new_graphs,
            &review.old_graphs,
            limit.saturating_sub(review.footer.len()),
        );
        if body.len() + review.footer.len() <= limit {
            body + &review.footer
        } else {
            // Too small for the footer too: the body alone, which fits by itself.
            body
        }
    }
}

/// `text` cut after its last whole line that leaves room for a line saying it was cut.
fn cut_between_lines(text: &str, limit: usize) -> String {
    const CUT: &str = "- …\n\nShortened to fit; `GET /api/plans/{ref}` has all of it.\n";
    let room = limit.saturating_sub(CUT.len());
    let mut end = room.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].rfind('\n') {
        Some(line_end) if limit >= CUT.len() => format!("{}{CUT}", &text[..=line_end]),
        _ => text[..end].to_owned(),
    }
}

/// What a plan was computed from: a plan is fresh while all three are unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Inputs {
    head: Oid,
    base: Oid,
    running: u64,
    /// Whether the commands of its exec and http steps run in its step tests and data diff:
    /// the daemon runs commands (`--run-commands`) and a maintainer's preview label approved
    /// this head, as for a preview environment.
    commands: bool,
}

/// A plan that changed, for [`Plans::subscribe`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanEvent {
    #[serde(rename = "ref")]
    pub name: String,
    /// `updated` (read it with [`Plans::get`]) or `removed` (the ref is gone).
    pub change: PlanChange,
    /// The head the plan is of (`None` when removed).
    pub head: Option<String>,
    pub valid: bool,
    pub pull_request: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanChange {
    Updated,
    Removed,
}

/// The plans of the watched refs, shared by the plans worker (their only writer) and the
/// readers (API, forge).
pub struct Plans {
    book: Mutex<BTreeMap<String, (Inputs, Arc<RefPlan>)>>,
    /// Per ref, what its running preview environment is (its plan shows it).
    previews: Mutex<BTreeMap<String, ShownPreview>>,
    events: tokio::sync::broadcast::Sender<PlanEvent>,
    /// Wakes the worker; `None` until it runs.
    wake: Mutex<Option<Sender<()>>>,
    /// Counts settled cutovers: what runs changed.
    settled: AtomicU64,
    /// The branch head the follower last looked at (and validated): plans wait for it, so a
    /// new head's topologies are validated once, by the follower, never twice at once.
    followed: Mutex<Option<String>>,
    computed: AtomicU64,
    /// Per pull request, the head its preview label approved ([`super::previews`] writes it).
    approved: Mutex<BTreeMap<u64, String>>,
}

impl Default for Plans {
    fn default() -> Self {
        Plans {
            book: Mutex::new(BTreeMap::new()),
            previews: Mutex::new(BTreeMap::new()),
            events: tokio::sync::broadcast::channel(1024).0,
            wake: Mutex::new(None),
            settled: AtomicU64::new(0),
            followed: Mutex::new(None),
            computed: AtomicU64::new(0),
            approved: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Plans {
    /// Every watched ref's plan, by ref name.
    pub fn list(&self) -> Vec<Arc<RefPlan>> {
        self.lock().values().map(|(_, p)| p.clone()).collect()
    }

    /// The plan of `name` (a full ref name, `refs/heads/x`), if it is watched.
    pub fn get(&self, name: &str) -> Option<Arc<RefPlan>> {
        self.lock().get(name).map(|(_, p)| p.clone())
    }

    /// Every plan change from now on: what the SSE stream and the forge integration read
    /// (a receiver that falls more than 1,024 events behind skips to the newest; read the
    /// plan itself with [`Plans::get`]).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<PlanEvent> {
        self.events.subscribe()
    }

    /// How many ref plans were computed (not found fresh) so far.
    pub fn computed(&self) -> u64 {
        self.computed.load(Ordering::Relaxed)
    }

    /// Asks the worker to look at the refs again (never waits).
    pub fn look(&self) {
        if let Some(wake) = self
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            let _ = wake.send(());
        }
    }

    /// The follower looked at the branch's head `head`: refs are looked at again, against it.
    pub fn followed(&self, head: Option<&str>) {
        *self.followed.lock().unwrap_or_else(PoisonError::into_inner) = head.map(str::to_owned);
        self.look();
    }

    /// A cutover settled: what runs changed, so every plan is made again from it.
    pub fn running_changed(&self) {
        self.settled.fetch_add(1, Ordering::SeqCst);
        self.look();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Inputs, Arc<RefPlan>)>> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The worker's end of [`Plans::look`].
    pub(crate) fn receiver(&self) -> Receiver<()> {
        let (sender, receiver) = mpsc::channel();
        *self.wake.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
        receiver
    }

    /// Pull request `number`'s preview label now approves `head` (`None`: nothing). Its plan
    /// is computed again when that changes: the daemon that runs commands runs those of an
    /// approved head in its step tests and data diff.
    pub(crate) fn approve(&self, number: u64, head: Option<&str>) {
        let changed = {
            let mut approved = self.approved.lock().unwrap_or_else(PoisonError::into_inner);
            let before = approved.get(&number).cloned();
            match head {
                Some(head) => approved.insert(number, head.to_owned()),
                None => approved.remove(&number),
            };
            before.as_deref() != head
        };
        if changed {
            self.look();
        }
    }

    fn approves(&self, name: &str, head: Oid) -> bool {
        crate::forge::pull_request_of_ref(name).is_some_and(|number| {
            self.approved
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&number)
                .is_some_and(|approved| *approved == head.to_string())
        })
    }

    /// Ref `name`'s preview environment now runs `shown` (`None`: none): its plan says so, and
    /// is announced again when that changes.
    pub(crate) fn show_preview(&self, name: &str, shown: Option<ShownPreview>) {
        {
            let mut previews = self.previews.lock().unwrap_or_else(PoisonError::into_inner);
            if previews.get(name) == shown.as_ref() {
                return;
            }
            match &shown {
                Some(shown) => previews.insert(name.to_owned(), shown.clone()),
                None => previews.remove(name),
            };
        }
        let plan = self.lock().get(name).cloned();
        if let Some((inputs, plan)) = plan {
            self.publish(inputs, plan.showing(None));
        }
    }

    fn publish(&self, inputs: Inputs, plan: RefPlan) {
        let plan = {
            let previews = self.previews.lock().unwrap_or_else(PoisonError::into_inner);
            plan.showing(previews.get(&plan.name))
        };
        let event = PlanEvent {
            name: plan.name.clone(),
            change: PlanChange::Updated,
            head: Some(plan.head.clone()),
            valid: plan.valid,
            pull_request: plan.pull_request,
        };
        self.lock()
            .insert(plan.name.clone(), (inputs, Arc::new(plan)));
        // Nobody listening is fine.
        let _ = self.events.send(event);
    }

    fn remove(&self, name: &str) {
        let Some((_, plan)) = self.lock().remove(name) else {
            return;
        };
        tracing::info!(r#ref = name, "watched ref gone; its plan is dropped");
        let _ = self.events.send(PlanEvent {
            name: name.to_owned(),
            change: PlanChange::Removed,
            head: None,
            valid: false,
            pull_request: plan.pull_request,
        });
    }

    fn inputs(&self, name: &str) -> Option<Inputs> {
        self.lock().get(name).map(|(inputs, _)| *inputs)
    }
}

/// What runs, as the store holds it: per topology its record and the graph it runs.
#[derive(Default)]
struct Running {
    /// [`Plans::settled`] when read.
    generation: u64,
    /// Changes when what runs of any topology does: what plans are fresh with.
    revision: u64,
    /// Per topology that runs something: a version (changes when its record does), what runs,
    /// and the graph of the commit it last matched.
    topologies: BTreeMap<String, RunningTopology>,
    /// The commit most topologies run.
    from: Option<String>,
}

struct RunningTopology {
    version: u64,
    record: crate::store::TopologyRecord,
    graph: Option<Topology>,
}

/// The plans worker's memory between passes (pub for the benchmark, which drives passes
/// itself).
#[derive(Default)]
pub struct Planner {
    running: Option<Running>,
    /// Counts versions of what runs of a topology, and revisions of the whole.
    versions: u64,
    /// Each topology's plan by (name, its tree in the merge, the version of what runs of it).
    topology_plans: HashMap<(String, Option<TopologyKey>, u64), Arc<TopologyPlan>>,
    /// The `CODEOWNERS` of the last base planned against.
    owners: Option<(Oid, Option<Arc<CodeOwners>>)>,
}

/// The plans worker: runs until the daemon stops.
pub(crate) fn run(context: &Arc<Context>, wake: &Receiver<()>) {
    let mut worker = Planner::default();
    while wake.recv().is_ok() {
        // A burst of looks is one pass.
        while wake.try_recv().is_ok() {}
        if context.is_stopping() {
            break;
        }
        let _busy = context.threads.busy("a pass over the watched refs");
        if let Err(error) = worker.pass(context) {
            tracing::warn!(%error, "cannot plan the watched refs; trying again at the next change");
        }
    }
}

impl Planner {
    /// One look at every watched ref: plans what moved, drops what went. What the worker does
    /// on each wake-up; `context`'s follower must have looked at the branch's head
    /// ([`Plans::followed`]).
    pub fn pass(&mut self, context: &Arc<Context>) -> Result<(), Error> {
        let repository = context.revisions.open()?;
        let branch = &context.config.branch;
        let tracked = format!("refs/heads/{branch}");
        let Ok(base) = repository
            .resolve(&tracked)
            .or_else(|_| repository.resolve(branch))
        else {
            // The follower reports a missing branch.
            return Ok(());
        };
        let followed = context
            .plans
            .followed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if followed.as_deref() != Some(base.to_string().as_str()) {
            // The follower has not read this head yet; it wakes the worker once it has.
            return Ok(());
        }
        let watched = watched_refs(repository.git(), &context.config.watch_refs, &tracked);
        // Collected first: the lock must not live through the loop, which takes it again.
        let planned: Vec<String> = context.plans.lock().keys().cloned().collect();
        for name in planned {
            if !watched.contains_key(&name) {
                context.plans.remove(&name);
            }
        }
        self.refresh_running(context, &repository);
        let revision = self.running.as_ref().map_or(0, |r| r.revision);
        let mut used = BTreeSet::new();
        let mut noted = false;
        for name in watched.keys() {
            if context.is_stopping() {
                break;
            }
            // Read again now: the newest head wins.
            let Ok(head) = repository.git().refname_to_id(name) else {
                context.plans.remove(name);
                continue;
            };
            let Ok(head) = repository.git().find_commit(head).map(|c| c.id()) else {
                continue;
            };
            let inputs = Inputs {
                head,
                base,
                running: revision,
                commands: context.config.run_commands && context.plans.approves(name, head),
            };
            if context.plans.inputs(name) == Some(inputs) {
                continue;
            }
            let plan = match self.plan(context, name, inputs, &mut used) {
                Ok(mut plan) => {
                    plan.fingerprint = plan.meaning();
                    plan
                }
                Err(error) => {
                    tracing::warn!(r#ref = %name, %error, "cannot plan a watched ref");
                    continue;
                }
            };
            context.plans.computed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(r#ref = %name, head = %head, valid = plan.valid, "plan of a watched ref");
            match write_note(repository.git(), head, &plan.markdown, &plan.fingerprint) {
                Ok(written) => noted |= written,
                Err(error) => tracing::warn!(%error, "cannot write the plan note"),
            }
            context.plans.publish(inputs, plan);
        }
        if noted
            && context.config.push_notes
            && let Err(error) = context.revisions.source().push_notes()
        {
            tracing::warn!(%error, "cannot push the plan notes");
        }
        let limit = 4 * self.running.as_ref().map_or(0, |r| r.topologies.len()) + 4096;
        if self.topology_plans.len() > limit && !used.is_empty() {
            self.topology_plans.retain(|key, _| used.contains(key));
        }
        Ok(())
    }

    /// Reads what runs from the store again once a cutover settled (or on the first pass).
    fn refresh_running(&mut self, context: &Context, repository: &Repository) {
        let generation = context.plans.settled.load(Ordering::SeqCst);
        if self
            .running
            .as_ref()
            .is_some_and(|r| r.generation == generation)
        {
            return;
        }
        let records = match context.records.topologies() {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(%error, "cannot read what runs; plans keep the last known");
                return;
            }
        };
        let mut previous = self.running.take().unwrap_or_default();
        let mut running = Running {
            generation,
            ..Running::default()
        };
        let mut trees: BTreeMap<String, Option<TreeValidation>> = BTreeMap::new();
        let mut commits: BTreeMap<String, usize> = BTreeMap::new();
        // Preview environments run beside the topologies, never as what a merge changes.
        for (name, record) in records
            .into_iter()
            .filter(|(name, _)| !crate::plan::preview::is_preview(name))
        {
            let record = match record {
                Ok(record) if !record.is_retired() => record,
                Ok(_) => continue,
                Err(error) => {
                    tracing::warn!(topology = %name, %error, "cannot read what runs of a topology; planned as if nothing ran");
                    continue;
                }
            };
            let graph = record.commit.as_ref().and_then(|commit| {
                *commits.entry(commit.clone()).or_default() += 1;
                let tree = trees
                    .entry(commit.clone())
                    .or_insert_with(|| validate_commit(context, repository, commit));
                tree.as_ref().and_then(|t| t.graph(&name)).cloned()
            });
            let version = match previous.topologies.remove(&name) {
                Some(known) if known.record == record => known.version,
                _ => {
                    self.versions += 1;
                    self.versions
                }
            };
            running.topologies.insert(
                name,
                RunningTopology {
                    version,
                    record,
                    graph,
                },
            );
        }
        let same = previous.topologies.is_empty()
            && previous.revision != 0
            && running
                .topologies
                .values()
                .all(|t| t.version <= previous.revision);
        running.revision = if same {
            previous.revision
        } else {
            self.versions += 1;
            self.versions
        };
        running.from = commits
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(commit, _)| commit);
        self.running = Some(running);
    }

    fn plan(
        &mut self,
        context: &Context,
        name: &str,
        inputs: Inputs,
        used: &mut BTreeSet<(String, Option<TopologyKey>, u64)>,
    ) -> Result<RefPlan, Error> {
        // A handle of its own: the merge's objects live in it.
        let repository = context.revisions.open()?;
        let trees = context.revisions.trees();
        let branch = &context.config.branch;
        let mut plan = RefPlan {
            name: name.to_owned(),
            head: inputs.head.to_string(),
            base: inputs.base.to_string(),
            from: self.running.as_ref().and_then(|r| r.from.clone()),
            valid: false,
            valid_alone: false,
            conflicts: Vec::new(),
            errors: Vec::new(),
            topologies: Vec::new(),
            preview: false,
            previews: Vec::new(),
            pull_request: crate::forge::pull_request_of_ref(name),
            keep_topics: false,
            markdown: String::new(),
            preview_markdown: String::new(),
            fingerprint: String::new(),
            review: None,
            data_diff: Vec::new(),
        };
        let merged = match repository.merge_tree(inputs.base, inputs.head)? {
            MergeTree::Conflicts(paths) => {
                plan.conflicts = paths;
                None
            }
            MergeTree::Merged(tree) => {
                let merged = trees.validate(&repository, tree, inputs.head)?;
                plan.errors = merged.errors().cloned().collect();
                crate::diagnostic::normalize(&mut plan.errors);
                Some(merged)
            }
        };
        let merged = merged.filter(TreeValidation::is_valid);
        // An approved head's exec and http steps: their step tests run from its checkout.
        let (old_checkout, new_checkout) = match (&merged, inputs.commands) {
            (Some(merged), true) => self.test_commands(context, &repository, &mut plan, merged),
            _ => (None, None),
        };
        let Some(merged) = merged.filter(|_| plan.errors.is_empty()) else {
            let alone =
                trees.validate(&repository, repository.tree_of(inputs.head)?, inputs.head)?;
            plan.valid_alone = alone.is_valid();
            plan.markdown = unplannable_markdown(&plan, branch);
            return Ok(plan);
        };
        plan.valid = true;
        plan.valid_alone = true;
        let empty = RunningTopology {
            version: 0,
            record: crate::store::TopologyRecord::default(),
            graph: None,
        };
        let running = self.running.as_ref();
        let mut names: BTreeSet<&str> = merged
            .topologies
            .iter()
            .map(|(n, _, _)| n.as_str())
            .collect();
        if let Some(running) = running {
            names.extend(running.topologies.keys().map(String::as_str));
        }
        let mut new_graphs = Vec::new();
        let mut old_graphs = Vec::new();
        for topology in names {
            let key = merged
                .topologies
                .iter()
                .find(|(n, _, _)| n == topology)
                .map(|(_, key, _)| *key);
            let now = running
                .and_then(|r| r.topologies.get(topology))
                .unwrap_or(&empty);
            let new = merged.graph(topology);
            let cache_key = (topology.to_owned(), key, now.version);
            let planned = match self.topology_plans.get(&cache_key) {
                Some(planned) => planned.clone(),
                None => {
                    let planned = Arc::new(crate::plan::plan_topology_from(
                        now.graph.as_ref(),
                        &now.record.deployment,
                        new,
                    ));
                    self.topology_plans
                        .insert(cache_key.clone(), planned.clone());
                    planned
                }
            };
            used.insert(cache_key);
            if planned.change != Change::Unchanged || !planned.actions.is_empty() {
                new_graphs.extend(new.cloned());
                old_graphs.extend(now.graph.clone());
            }
            plan.topologies.push((*planned).clone());
        }
        // As `plumber plan` finishes it: owners as of the base (a branch cannot name its own
        // reviewers), then the daemon's --keep-topics.
        let mut whole = Plan {
            from: plan.from.clone(),
            to: plan.head.clone(),
            topologies: std::mem::take(&mut plan.topologies),
            keep_topics: false,
        };
        if let Some(owners) = self.owners_at(&repository, inputs.base)? {
            whole = whole.with_owners(|file| owners.owners_of(file));
        }
        if context.config.cutover.keep_topics {
            whole = whole.keeping_topics();
        }
        let footer = format!(
            "\n<sub>Merge preview of `{name}` into `{branch}` ({}), planned against what runs now.</sub>\n",
            crate::output::short_commit(&plan.base),
        );
        let base = trees.validate(&repository, repository.tree_of(inputs.base)?, inputs.base)?;
        if let Some(sample) = &context.config.data_diff {
            plan.data_diff = self.data_diff(
                context,
                &whole,
                Side {
                    graphs: &old_graphs,
                    commands: commands(old_checkout.as_ref()),
                },
                Side {
                    graphs: &new_graphs,
                    commands: commands(new_checkout.as_ref()),
                },
                sample,
                {
                    // The branch's masks hold whatever the change does to `plumber.yaml`.
                    let mut masked = base.masked_fields().to_vec();
                    masked.extend(merged.masked_fields().iter().cloned());
                    masked
                },
            );
        }
        plan.markdown = crate::output::plan::markdown(&whole, &new_graphs, &old_graphs)
            + &crate::datadiff::markdown(&plan.data_diff)
            + &footer;
        plan.topologies = whole.topologies;
        plan.keep_topics = whole.keep_topics;
        plan.review = Some(Review {
            new_graphs,
            old_graphs,
            footer,
            clusters: merged.clusters().clone(),
            base_clusters: base.clusters().clone(),
        });
        Ok(plan)
    }

    /// Runs the step tests of the exec and http steps of `merged` (the merge of an approved
    /// head) from a checkout of the merge, and makes the plan invalid if one fails. Returns
    /// checkouts for the data diff: of the commit most topologies run (if any), and of the
    /// merge; `None` for one that cannot be written (its commands are then not run).
    fn test_commands(
        &self,
        context: &Context,
        repository: &Repository,
        plan: &mut RefPlan,
        merged: &TreeValidation,
    ) -> (Option<tempfile::TempDir>, Option<tempfile::TempDir>) {
        let name = plan.name.clone();
        let checkout = |commit: &str, tree: Option<Oid>, graphs: &[Topology]| {
            repository
                .resolve(commit)
                .and_then(|oid| {
                    crate::steptest::checkout(
                        repository,
                        oid,
                        tree,
                        graphs,
                        &context.config.state_dir,
                    )
                })
                .map_err(|error| tracing::warn!(r#ref = %name, %commit, %error, "cannot check out what the commands of exec and http steps run from; they are not run"))
                .ok()
        };
        let mut validation = merged.to_validation();
        let graphs = validation.topologies.clone().unwrap_or_default();
        let Some(new) = checkout(&plan.head, Some(merged.tree), &graphs) else {
            return (None, None);
        };
        let results =
            crate::steptest::run_commands(&validation, &context.config.step_tests, new.path());
        crate::steptest::fold_commands(&mut validation, &results);
        if !results.is_empty() {
            let failed = results.iter().filter(|r| r.verdict.fails()).count();
            tracing::info!(r#ref = %plan.name, cases = results.len(), failed, "step tests of exec and http steps of an approved head run");
        }
        plan.errors = validation.errors().cloned().collect();
        let old = match (&plan.from, &self.running) {
            (Some(from), Some(running)) => {
                let graphs: Vec<Topology> = running
                    .topologies
                    .values()
                    .filter_map(|t| t.graph.clone())
                    .collect();
                checkout(from, None, &graphs)
            }
            _ => None,
        };
        (old, Some(new))
    }

    /// The data diff of `whole`: records read where each topology runs now.
    fn data_diff(
        &self,
        context: &Context,
        whole: &Plan,
        old: Side<'_>,
        new: Side<'_>,
        sample: &crate::datadiff::SampleLimits,
        masked: Vec<String>,
    ) -> Vec<crate::datadiff::StepDiff> {
        let running = self.running.as_ref();
        let kafka = |topology: &Topology| {
            let bootstrap = running
                .and_then(|r| r.topologies.get(&topology.name))
                .and_then(|t| t.record.bootstrap.clone())
                .ok_or_else(|| "not sampled: the topology runs nowhere yet".to_owned())?;
            context
                .admin(crate::daemon::AdminUse::Observe, &bootstrap)
                .map_err(|e| format!("not sampled: {e}"))
        };
        crate::datadiff::diff(
            whole,
            old,
            new,
            &kafka,
            sample,
            &context.config.step_tests,
            &masked,
        )
    }

    /// The `CODEOWNERS` of `base`, read once per base.
    fn owners_at(
        &mut self,
        repository: &Repository,
        base: Oid,
    ) -> Result<Option<Arc<CodeOwners>>, Error> {
        if let Some((at, owners)) = &self.owners
            && *at == base
        {
            return Ok(owners.clone());
        }
        let owners = repository.codeowners(base)?.map(Arc::new);
        self.owners = Some((base, owners.clone()));
        Ok(owners)
    }
}

/// The head of every watched pull-request ref of the repository now, by pull request (empty
/// when the repository cannot be read: every pull request is then asked about alone).
pub(crate) fn pull_request_heads(context: &Context) -> BTreeMap<u64, String> {
    let repository = match context.revisions.source().open() {
        Ok(repository) => repository,
        Err(error) => {
            tracing::warn!(%error, "cannot read the pull-request refs");
            return BTreeMap::new();
        }
    };
    let tracked = format!("refs/heads/{}", context.config.branch);
    watched_refs(repository.git(), &context.config.watch_refs, &tracked)
        .into_iter()
        .filter_map(|(name, head)| {
            Some((crate::forge::pull_request_of_ref(&name)?, head.to_string()))
        })
        .collect()
}

/// The watched refs of the repository and their targets, the tracked branch aside.
fn watched_refs(
    git: &git2::Repository,
    patterns: &[String],
    tracked: &str,
) -> BTreeMap<String, Oid> {
    let mut out = BTreeMap::new();
    let Ok(references) = git.references() else {
        return out;
    };
    for reference in references.flatten() {
        let Some(name) = reference.name() else {
            continue;
        };
        if name == tracked || name.starts_with("refs/notes/") || name.starts_with("refs/plumber/") {
            continue;
        }
        if !patterns.iter().any(|p| ref_matches(p, name)) {
            continue;
        }
        if let Ok(commit) = reference.peel_to_commit() {
            out.insert(name.to_owned(), commit.id());
        }
    }
    out
}

fn validate_commit(
    context: &Context,
    repository: &Repository,
    commit: &str,
) -> Option<TreeValidation> {
    let oid = Oid::from_str(commit).ok()?;
    let tree = repository.tree_of(oid).ok()?;
    match context.revisions.trees().validate(repository, tree, oid) {
        Ok(validation) => Some(validation),
        Err(error) => {
            tracing::debug!(%commit, %error, "cannot read the commit a topology runs");
            None
        }
    }
}

/// The review text of a ref that cannot be planned: its conflicts or errors.
fn unplannable_markdown(plan: &RefPlan, branch: &str) -> String {
    let mut out = format!(
        "### Plumber plan: `{}` cannot be merged into `{branch}`\n\n",
        crate::output::short_commit(&plan.head)
    );
    if !plan.conflicts.is_empty() {
        out.push_str("Merging it conflicts in:\n\n");
        for path in &plan.conflicts {
            out.push_str(&format!("- `{path}`\n"));
        }
        out.push_str("\nResolve the conflicts on the branch; the plan follows.\n");
        return out;
    }
    if plan.valid_alone {
        out.push_str(&format!(
            "The branch is valid on its own, but the merge into `{branch}` is not:\n\n"
        ));
    } else {
        out.push_str("The merge is not valid:\n\n");
    }
    for error in &plan.errors {
        out.push_str(&format!("- `{error}`\n"));
    }
    out
}

/// Writes `text` as the note of `commit` in [`NOTES_REF`], ending with the line that carries
/// `fingerprint` ([`crate::forge::fingerprint_line`]), unless the note there carries it
/// already. Returns whether it wrote.
fn write_note(
    git: &git2::Repository,
    commit: Oid,
    text: &str,
    fingerprint: &str,
) -> Result<bool, Error> {
    if let Ok(note) = git.find_note(Some(NOTES_REF), commit)
        && note_fingerprint(note.message().unwrap_or("")) == Some(fingerprint)
    {
        return Ok(false);
    }
    let note_error = |source| {
        Error::Watch(crate::daemon::watch::Error::Note {
            commit: commit.to_string(),
            repository: git.path().display().to_string(),
            source,
        })
    };
    let text = format!("{text}{}\n", crate::forge::fingerprint_line(fingerprint));
    let signature = git2::Signature::now("Plumber", "plumber@localhost").map_err(note_error)?;
    git.note(&signature, &signature, Some(NOTES_REF), commit, &text, true)
        .map_err(note_error)?;
    Ok(true)
}

/// The fingerprint a plan's note carries on its last line.
pub fn note_fingerprint(note: &str) -> Option<&str> {
    note.lines().last().and_then(crate::forge::fingerprint_in)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_preview_is_shown_at_the_end_of_the_plan_and_kept_when_it_is_shortened() {
        let mut plan = RefPlan::for_test("refs/pull/7/head");
        plan.markdown = "- an error\n".repeat(100);
        let shown = ShownPreview {
            topologies: vec![PreviewTopology {
                topology: "t".into(),
                preview: "t.pr-7".into(),
                processors: vec!["b".into()],
                shadow_topics: BTreeMap::from([("out.preview.pr-7".into(), "out".into())]),
            }],
            markdown: "### Preview environment `pr-7` runs\n".into(),
        };
        let showing = plan.showing(Some(&shown));
        assert!(showing.preview);
        assert_eq!(showing.previews, shown.topologies);
        assert!(showing.markdown.starts_with(&plan.markdown));
        assert!(showing.markdown.ends_with(&shown.markdown));
        let short = showing.markdown_within(300);
        assert!(short.len() <= 300, "{short}");
        assert!(short.ends_with(&shown.markdown), "{short}");
        assert!(short.contains("Shortened to fit"), "{short}");
        // Shown again, or no longer: the preview section is replaced, never repeated.
        assert_eq!(showing.showing(Some(&shown)).markdown, showing.markdown);
        let gone = showing.showing(None);
        assert!(!gone.preview && gone.previews.is_empty());
        assert_eq!(gone.markdown, plan.markdown);
    }
}
