//! Preview environments of pull requests (SPEC §9), with `--preview-label LABEL`: an open pull
//! request carrying the label, whose merge is valid, runs its changed steps (and those
//! downstream of them) on live source data, in consumer groups of their own from the latest
//! offsets, writing shadow topics `<sink topic>.preview.<slug>` instead of the users' sinks
//! ([`crate::plan::preview`]). Only the label decides, never the branch's content: a preview
//! runs the branch's `exec` and `http` code, and only people with write access can label.
//!
//! Each preview topology (`<topology>.<slug>`) runs through the same machinery as a topology:
//! a `Worker` whose desired revision holds the preview's graph at the pull request's head,
//! moved by the cutover engine, its record in the store beside the topologies' (which the
//! follower and the plans leave alone: real names hold no dot). Its shadow topics are
//! created first, with the partitions of the sink they stand in for. Once it is no longer
//! wanted (closed, merged, the label removed, the merge invalid, the ref gone), its worker's
//! target is "gone": the engine stops its processors and deletes its internal topics (unless
//! `--keep-topics`), then its shadow topics are deleted (unless `--keep-topics`) and it is
//! forgotten. Its record is forgotten too ([`crate::store::CutoverStore::forget`]; on
//! Kubernetes its Topology object is deleted) once its groups are deleted, unless
//! `--keep-topics`: then its internal topics keep their records, and its retired record stays
//! so that one started again gets new names and never reads them.
//!
//! One thread decides, looking at a pull request again on a change of its plan, on a
//! pull-request webhook ([`Requests::look`]), and every poll interval while its preview runs
//! or is wanted: GitHub keeps `refs/pull/N/head` after a close, so closing is learnt from the
//! forge. A forge that cannot answer now (retrying may help) changes nothing.
//!
//! Every daemon replica decides (so its status says what runs), but only the one that may
//! act (the lease holder on Kubernetes) creates and deletes shadow topics and groups; its
//! workers' engines act only then too. A replica that starts acting runs every preview it
//! knows again, creating what the previous holder had not.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::plans::{PlanEvent, PreviewTopology, RefPlan, ShownPreview};
use super::status::PreviewOf;
use super::worker::Worker;
use super::{AdminUse, Context, Error, Revision};
use crate::forge::{self, Forge, PullRequest, PullRequestState};
use crate::graph::Kind;
use crate::plan::Deployment;
use crate::plan::preview::{self, Preview, is_preview};

/// The pull request a preview topology belongs to: `t.pr-7` and `t.mr-7` are 7's.
fn pull_request_of_preview(name: &str) -> Option<u64> {
    let (_, slug) = name.rsplit_once('.')?;
    let number = slug
        .strip_prefix("pr-")
        .or_else(|| slug.strip_prefix("mr-"))?;
    number
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| number.parse().ok())
        .flatten()
}

/// How the API asks the previews thread to look at a pull request again (a no-op without
/// previews).
#[derive(Default)]
pub struct Requests {
    mailbox: super::mailbox::Mailbox<u64>,
}

impl Requests {
    /// Asks for pull request `number`'s preview to be decided again (never waits).
    pub fn look(&self, number: u64) {
        self.mailbox.send(number);
    }
}

/// Whether a pull request's preview runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    Run,
    /// It must not run, and why.
    Stop(&'static str),
    /// The forge cannot say now: what runs keeps running, what does not stays off.
    Unknown,
}

/// The verdict on a pull request from its plan (`None`: its ref is gone) and what the forge
/// says of it (`pull`, asked only when the plan could be previewed).
pub(super) fn verdict(
    plan: Option<&RefPlan>,
    pull: impl FnOnce() -> forge::Result<PullRequest>,
    label: &str,
) -> Verdict {
    let Some(plan) = plan else {
        return Verdict::Stop("its ref is gone");
    };
    if !plan.valid {
        return Verdict::Stop("its merge is not valid");
    }
    match pull() {
        Err(error) if error.is_retryable() => {
            tracing::warn!(r#ref = %plan.name, %error, "cannot read the pull request from the forge; its preview stays as it is");
            Verdict::Unknown
        }
        Err(error) => {
            tracing::warn!(r#ref = %plan.name, %error, "the forge does not give the pull request; no preview");
            Verdict::Stop("the forge does not give it")
        }
        Ok(pull) => match pull.state {
            PullRequestState::Merged => Verdict::Stop("it is merged"),
            PullRequestState::Closed => Verdict::Stop("it is closed"),
            PullRequestState::Open if !pull.has_label(label) => {
                Verdict::Stop("it does not carry the label")
            }
            PullRequestState::Open => Verdict::Run,
        },
    }
}

/// What a preview topology runs: when it changes, its worker is handed the new revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fingerprint {
    head: String,
    /// Every step's name and identity.
    steps: Vec<(String, String)>,
    shadow_topics: BTreeMap<String, String>,
}

impl Fingerprint {
    fn of(preview: &Preview, head: &str) -> Fingerprint {
        Fingerprint {
            head: head.to_owned(),
            steps: preview
                .graph
                .steps()
                .map(|(_, s)| (s.name.clone(), s.identity.to_string()))
                .collect(),
            shadow_topics: preview.shadow_topics.clone(),
        }
    }
}

/// What to do with one pull request's preview topologies.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    /// Not running: start them.
    pub start: Vec<String>,
    /// Running something else (or being torn down): hand them the new revision.
    pub update: Vec<String>,
    /// Running, no longer wanted: tear them down.
    pub stop: Vec<String>,
}

/// Where a preview topology the thread looks after stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stands {
    Runs(Fingerprint),
    /// Adopted from a previous run's store: what it runs is not known.
    Adopted,
    TearingDown,
}

/// From what runs of a pull request to what is wanted of it.
pub(super) fn changes(
    running: &BTreeMap<String, Stands>,
    wanted: &BTreeMap<String, Fingerprint>,
) -> Changes {
    let mut out = Changes::default();
    for (name, fingerprint) in wanted {
        match running.get(name) {
            None => out.start.push(name.clone()),
            Some(Stands::Runs(runs)) if runs == fingerprint => {}
            Some(_) => out.update.push(name.clone()),
        }
    }
    for (name, stands) in running {
        if *stands != Stands::TearingDown && !wanted.contains_key(name) {
            out.stop.push(name.clone());
        }
    }
    out
}

/// One preview topology the thread looks after.
struct Environment {
    pull_request: u64,
    /// The ref it previews (`None`: adopted from the store, not decided yet).
    refname: Option<String>,
    /// The topology it previews.
    of: String,
    worker: Worker,
    /// What it was handed (`None`: being torn down, or adopted and not decided yet).
    fingerprint: Option<Fingerprint>,
    tearing_down: bool,
    /// The head it last ran.
    head: Option<String>,
    shadow_topics: BTreeMap<String, String>,
    processors: Vec<String>,
}

/// The previews thread's memory.
struct Previews {
    context: Arc<Context>,
    forge: Arc<dyn Forge>,
    label: String,
    environments: BTreeMap<String, Environment>,
    /// Pull requests whose last verdict was to run, or unknown (looked at again every poll,
    /// also when starting failed).
    wanted: BTreeSet<u64>,
    /// Shadow topics of torn-down previews still to delete, with their bootstrap servers.
    to_delete: BTreeMap<String, String>,
    /// Consumer groups of torn-down previews still to delete, with their bootstrap servers.
    groups_to_delete: BTreeMap<String, String>,
    /// Torn-down previews whose records are forgotten once their groups are deleted.
    to_forget: ForgetQueue,
}

/// Torn-down previews whose records are to be forgotten, each with its groups still to
/// delete: a group left behind (its offsets) must not be taken up by one started again
/// with the same names.
#[derive(Debug, Default)]
struct ForgetQueue(BTreeMap<String, BTreeSet<String>>);

impl ForgetQueue {
    /// `preview` was reaped; these groups of its are being deleted.
    fn reaped(&mut self, preview: &str, groups: impl IntoIterator<Item = String>) {
        self.0
            .insert(preview.to_owned(), groups.into_iter().collect());
    }

    fn group_deleted(&mut self, group: &str) {
        for groups in self.0.values_mut() {
            groups.remove(group);
        }
    }

    /// A group the broker will not delete: its preview's record stays.
    fn group_refused(&mut self, group: &str) {
        self.0.retain(|_, groups| !groups.contains(group));
    }

    /// The previews whose groups are all deleted.
    fn ready(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, groups)| groups.is_empty())
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn done(&mut self, preview: &str) {
        self.0.remove(preview);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// The running thread; dropping it ends it (and its workers, after the action in hand).
pub(super) struct Running {
    thread: Option<std::thread::JoinHandle<()>>,
    clock: Arc<forge::StoppableClock>,
    context: Arc<Context>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.clock.stop();
        self.context.previews.mailbox.detach();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts the previews thread when `--preview-label` is set (it needs the forge).
pub(super) fn start(context: &Arc<Context>) -> Result<Option<Running>, Error> {
    let Some(label) = context.config.preview_label.clone() else {
        return Ok(None);
    };
    let Some(config) = &context.config.forge else {
        return Err(Error::Forge(forge::Error::Invalid {
            field: "previewLabel",
            value: label,
            message: "previews are decided by pull requests' labels: configure the forge too"
                .into(),
        }));
    };
    let clock = Arc::new(forge::StoppableClock::default());
    let forge: Arc<dyn Forge> =
        forge::connect_with(config, forge::Settings::default(), clock.clone())?.into();
    let events = context.plans.subscribe();
    let requests = context.previews.mailbox.attach();
    tracing::info!(label = %label, "preview environments for pull requests labelled so");
    let thread = super::spawn(
        &context.threads,
        "previews",
        super::health::Kind::Essential,
        {
            let context = context.clone();
            move || {
                let mut previews = Previews {
                    context,
                    forge,
                    label,
                    environments: BTreeMap::new(),
                    wanted: BTreeSet::new(),
                    to_delete: BTreeMap::new(),
                    groups_to_delete: BTreeMap::new(),
                    to_forget: ForgetQueue::default(),
                };
                previews.run(events, requests);
            }
        },
    )?;
    Ok(Some(Running {
        thread: Some(thread),
        clock,
        context: context.clone(),
    }))
}

/// What woke the thread.
enum Wake {
    Plan(PlanEvent),
    Lagged,
    Look(u64),
    Tick,
    Stop,
}

/// How often teardowns in progress are looked at.
const TEARDOWN_LOOK: Duration = Duration::from_millis(500);

impl Previews {
    fn run(
        &mut self,
        mut events: tokio::sync::broadcast::Receiver<PlanEvent>,
        mut requests: UnboundedReceiver<u64>,
    ) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(%error, "cannot start the previews thread; no previews run");
                return;
            }
        };
        self.adopt();
        let poll = self.context.config.poll_interval;
        let mut next_poll = tokio::time::Instant::now();
        let mut acting = false;
        loop {
            // A standby looks often, to act soon after it took the lease over.
            let busy = !acting
                || self.environments.values().any(|e| e.tearing_down)
                || !self.to_delete.is_empty()
                || !self.groups_to_delete.is_empty()
                || !self.to_forget.is_empty();
            let wake = runtime.block_on(async {
                let until = if busy {
                    next_poll.min(tokio::time::Instant::now() + TEARDOWN_LOOK)
                } else {
                    next_poll
                };
                tokio::select! {
                    biased;
                    request = requests.recv() => request.map_or(Wake::Stop, Wake::Look),
                    event = events.recv() => match event {
                        Ok(event) => Wake::Plan(event),
                        Err(RecvError::Lagged(_)) => Wake::Lagged,
                        Err(RecvError::Closed) => Wake::Stop,
                    },
                    () = tokio::time::sleep_until(until) => Wake::Tick,
                }
            });
            if self.context.is_stopping() {
                break;
            }
            let may_act = self.context.records.may_act();
            if may_act && !acting {
                // What a standby decided, it did not act on (no shadow topics), and the
                // previous holder may have stopped halfway: every preview is run again
                // (creating what is missing; the engine resumes from the record).
                for environment in self.environments.values_mut() {
                    environment.fingerprint = None;
                }
                next_poll = tokio::time::Instant::now();
            }
            acting = may_act;
            match wake {
                Wake::Plan(event) => {
                    if let Some(number) = event
                        .pull_request
                        .filter(|_| forge::pull_request_of_ref(&event.name).is_some())
                    {
                        self.decide(number);
                    }
                }
                Wake::Look(number) => self.decide(number),
                Wake::Lagged => self.decide_all(),
                Wake::Tick => {
                    if tokio::time::Instant::now() >= next_poll {
                        next_poll = tokio::time::Instant::now() + poll;
                        self.decide_all();
                    }
                }
                Wake::Stop => break,
            }
            self.reap();
        }
        for environment in self.environments.values() {
            environment.worker.wake();
        }
        for (_, environment) in std::mem::take(&mut self.environments) {
            environment.worker.join();
        }
    }

    /// Preview topologies a previous run left in the store: each gets its worker back, and
    /// is decided on like any other.
    fn adopt(&mut self) {
        let records = match self.context.records.topologies() {
            Ok(records) => records,
            Err(error) => {
                tracing::error!(%error, "cannot list the topologies of the store; previews of a previous run are looked after once it can");
                return;
            }
        };
        for (name, record) in records {
            if !is_preview(&name) || record.as_ref().is_ok_and(|r| r.is_retired()) {
                continue;
            }
            let Some(number) = pull_request_of_preview(&name) else {
                tracing::warn!(topology = %name, "a preview topology of no pull request; left as it is");
                continue;
            };
            let Ok(worker) = Worker::spawn(&name, &self.context) else {
                continue;
            };
            let head = record.as_ref().ok().and_then(|r| r.commit.clone());
            tracing::info!(topology = %name, pull_request = number, "preview of a previous run adopted");
            self.environments.insert(
                name.clone(),
                Environment {
                    pull_request: number,
                    refname: None,
                    of: name.split('.').next().unwrap_or_default().to_owned(),
                    worker,
                    fingerprint: None,
                    tearing_down: false,
                    head,
                    shadow_topics: BTreeMap::new(),
                    processors: Vec::new(),
                },
            );
            self.wanted.insert(number);
        }
    }

    fn decide_all(&mut self) {
        let mut numbers = self.wanted.clone();
        numbers.extend(
            self.environments
                .values()
                .filter(|e| !e.tearing_down)
                .map(|e| e.pull_request),
        );
        for number in numbers {
            if self.context.is_stopping() {
                return;
            }
            self.decide(number);
        }
    }

    /// Looks at pull request `number` and starts, moves or tears down its preview.
    fn decide(&mut self, number: u64) {
        let plan = self.context.plans.list().into_iter().find(|p| {
            p.pull_request == Some(number) && forge::pull_request_of_ref(&p.name).is_some()
        });
        let forge = self.forge.clone();
        let verdict = verdict(plan.as_deref(), || forge.pull_request(number), &self.label);
        tracing::debug!(pull_request = number, ?verdict, "preview decided");
        match (verdict, plan) {
            // Asked again at the next poll.
            (Verdict::Unknown, _) => {
                self.wanted.insert(number);
            }
            (Verdict::Run, Some(plan)) => {
                self.wanted.insert(number);
                match self.wanted_previews(&plan) {
                    Ok(previews) => self.apply(number, &plan, previews),
                    Err(error) => {
                        tracing::warn!(r#ref = %plan.name, %error, "the pull request cannot be previewed");
                        self.stop_all(number, "it cannot be previewed");
                    }
                }
            }
            (Verdict::Stop(why), _) => {
                self.wanted.remove(&number);
                self.stop_all(number, why);
            }
            // `verdict` says so without a plan.
            (Verdict::Run, None) => {}
        }
    }

    /// The previews of `plan` against what runs now.
    fn wanted_previews(&self, plan: &RefPlan) -> Result<Vec<Preview>, Error> {
        let records = self.context.records.topologies()?;
        let deployments: BTreeMap<String, Deployment> = records
            .into_iter()
            .filter(|(name, _)| !is_preview(name))
            .filter_map(|(name, record)| Some((name, record.ok()?.deployment)))
            .collect();
        let clusters = plan.merged_clusters().cloned().unwrap_or_default();
        let slug = preview::slug_of_ref(&plan.name);
        preview::previews(
            plan.merged_graphs(),
            |t| deployments.get(t),
            &clusters,
            &slug,
        )
        .map_err(|error| Error::Invalid {
            commit: plan.head.clone(),
            errors: error.to_string(),
            first: None,
        })
    }

    fn apply(&mut self, number: u64, plan: &RefPlan, previews: Vec<Preview>) {
        let wanted: BTreeMap<String, Fingerprint> = previews
            .iter()
            .map(|p| (p.graph.name.clone(), Fingerprint::of(p, &plan.head)))
            .collect();
        let running: BTreeMap<String, Stands> = self
            .environments
            .iter()
            .filter(|(_, e)| e.pull_request == number)
            .map(|(name, e)| {
                let stands = match (&e.fingerprint, e.tearing_down) {
                    (_, true) => Stands::TearingDown,
                    (Some(fingerprint), false) => Stands::Runs(fingerprint.clone()),
                    (None, false) => Stands::Adopted,
                };
                (name.clone(), stands)
            })
            .collect();
        let changes = changes(&running, &wanted);
        for name in &changes.stop {
            self.tear_down(name, "the change no longer starts a processor in it");
        }
        let clusters = plan.merged_clusters().cloned().unwrap_or_default();
        for preview in previews {
            let name = preview.graph.name.clone();
            if !changes.start.contains(&name) && !changes.update.contains(&name) {
                continue;
            }
            if let Err(error) = self.run_preview(number, plan, &clusters, preview) {
                tracing::warn!(topology = %name, %error, "cannot start the preview; trying again at the next look");
                self.context.store.topology(&name, |t| {
                    t.last_error = Some(error.to_string());
                });
            }
        }
        self.show(number);
    }

    /// Creates the preview's shadow topics and hands its worker the revision of its graph.
    fn run_preview(
        &mut self,
        number: u64,
        plan: &RefPlan,
        clusters: &BTreeMap<String, crate::spec::ClusterSpec>,
        preview: Preview,
    ) -> Result<(), Error> {
        let name = preview.graph.name.clone();
        let fingerprint = Fingerprint::of(&preview, &plan.head);
        let checkout = self.context.revisions.checkout(&plan.head)?;
        let mut revision = Revision {
            commit: plan.head.clone(),
            topologies: Vec::new(),
            clusters: clusters.clone(),
            checkout,
        };
        let cluster = self.context.cluster(&revision, &preview.graph)?;
        // Only the lease holder acts on Kafka; a standby runs it again once it holds the
        // lease.
        let shadows = if self.context.records.may_act() {
            &preview.shadow_topics
        } else {
            &BTreeMap::new()
        };
        let admin = self.context.admin(AdminUse::Cutover, &cluster.bootstrap)?;
        for (shadow, sink) in shadows {
            let partitions = admin.partitions(sink)?;
            admin.create_topic(
                shadow,
                u32::try_from(partitions.max(1)).unwrap_or(1),
                preview.graph.replication,
                &preview.graph.topic_config,
            )?;
        }
        let processors: Vec<String> = preview
            .graph
            .steps()
            .filter(|(_, s)| s.kind() == Kind::Processor)
            .map(|(_, s)| s.name.clone())
            .collect();
        let shadow_topics = preview.shadow_topics.clone();
        let of = preview.of.clone();
        revision.topologies.push(preview.graph);
        self.pin_heads(Some(&plan.head));
        let revision = Arc::new(revision);
        let worker = match self.environments.remove(&name) {
            // Finished: torn down all the way, or stopped; a new worker starts it again.
            Some(environment) if !environment.worker.is_finished() => environment.worker,
            _ => Worker::spawn(&name, &self.context)?,
        };
        worker.desire(revision);
        tracing::info!(topology = %name, pull_request = number, head = %plan.head, "preview runs");
        self.context.store.topology(&name, |t| {
            t.preview_of = Some(PreviewOf {
                name: plan.name.clone(),
                pull_request: number,
                topology: of.clone(),
                shadow_topics: shadow_topics.clone(),
            });
            t.last_error = None;
        });
        // A shadow topic wanted again is no longer deleted.
        for shadow in shadow_topics.keys() {
            self.to_delete.remove(shadow);
        }
        self.environments.insert(
            name,
            Environment {
                pull_request: number,
                refname: Some(plan.name.clone()),
                of,
                worker,
                fingerprint: Some(fingerprint),
                tearing_down: false,
                head: Some(plan.head.clone()),
                shadow_topics,
                processors,
            },
        );
        Ok(())
    }

    fn stop_all(&mut self, number: u64, why: &str) {
        let names: Vec<String> = self
            .environments
            .iter()
            .filter(|(_, e)| e.pull_request == number && !e.tearing_down)
            .map(|(name, _)| name.clone())
            .collect();
        for name in names {
            self.tear_down(&name, why);
        }
        self.show(number);
    }

    /// Hands the worker the preview's "gone" target: the engine stops its processors and
    /// removes what it created; [`Previews::reap`] deletes its shadow topics once it is done.
    fn tear_down(&mut self, name: &str, why: &str) {
        let Some(environment) = self.environments.get_mut(name) else {
            return;
        };
        // Its shadow topics: what it was started with, and what its lives write (an adopted
        // preview knows only those).
        let suffix = name
            .rsplit_once('.')
            .map(|(_, slug)| format!(".preview.{slug}"))
            .unwrap_or_default();
        if let Ok(record) = self.context.records.load(name) {
            for life in &record.deployment.lives {
                for output in &life.start.outputs {
                    if output.ends_with(&suffix) {
                        environment.shadow_topics.entry(output.clone()).or_default();
                    }
                }
            }
        }
        tracing::info!(
            topology = name,
            pull_request = environment.pull_request,
            reason = why,
            "preview torn down"
        );
        environment.tearing_down = true;
        environment.fingerprint = None;
        environment.worker.desire(Arc::new(Revision {
            commit: environment.head.clone().unwrap_or_default(),
            topologies: Vec::new(),
            clusters: BTreeMap::new(),
            checkout: std::path::PathBuf::new(),
        }));
    }

    /// Forgets the previews whose workers are done, deleting their consumer groups, and
    /// their shadow topics unless `--keep-topics`.
    fn reap(&mut self) {
        let done: Vec<String> = self
            .environments
            .iter()
            .filter(|(_, e)| e.tearing_down && e.worker.is_finished())
            .map(|(name, _)| name.clone())
            .collect();
        let mut touched = BTreeSet::new();
        for name in done {
            let Some(environment) = self.environments.remove(&name) else {
                continue;
            };
            let record = self.context.records.load(&name).ok();
            let bootstrap = record.as_ref().and_then(|r| r.bootstrap.clone());
            if let (Some(record), Some(bootstrap)) = (&record, &bootstrap) {
                let groups = groups_of(&name, &record.deployment);
                for group in &groups {
                    self.groups_to_delete
                        .insert(group.clone(), bootstrap.clone());
                }
                if !self.context.config.cutover.keep_topics {
                    self.to_forget.reaped(&name, groups);
                }
            }
            if !self.context.config.cutover.keep_topics
                && let Some(bootstrap) = bootstrap
            {
                let suffix = name
                    .rsplit_once('.')
                    .map(|(_, slug)| format!(".preview.{slug}"))
                    .unwrap_or_default();
                for shadow in environment.shadow_topics.keys() {
                    // Only what is a shadow topic by its name: never a user's topic.
                    if !suffix.is_empty() && shadow.ends_with(&suffix) {
                        self.to_delete.insert(shadow.clone(), bootstrap.clone());
                    }
                }
            }
            self.context.store.remove_topology(&name);
            touched.insert(environment.pull_request);
            tracing::info!(topology = %name, "preview gone");
        }
        if !self.context.records.may_act() {
            // The lease holder deletes them: a standby's deletion could race the holder
            // starting the preview again.
            self.to_delete.clear();
            self.groups_to_delete.clear();
            self.to_forget.clear();
        }
        let deleting = std::mem::take(&mut self.to_delete);
        for (shadow, bootstrap) in deleting {
            let deleted = self
                .context
                .admin(AdminUse::Cutover, &bootstrap)
                .and_then(|admin| admin.delete_topic(&shadow).map_err(Error::from));
            match deleted {
                Ok(()) => tracing::info!(topic = %shadow, "shadow topic deleted"),
                Err(error) => {
                    tracing::warn!(topic = %shadow, %error, "cannot delete a shadow topic; trying again");
                    self.to_delete.insert(shadow, bootstrap);
                }
            }
        }
        let deleting = std::mem::take(&mut self.groups_to_delete);
        for (group, bootstrap) in deleting {
            let admin = match self.context.admin(AdminUse::Cutover, &bootstrap) {
                Ok(admin) => admin,
                Err(error) => {
                    tracing::warn!(%group, %error, "cannot delete a preview's group; trying again");
                    self.groups_to_delete.insert(group, bootstrap);
                    continue;
                }
            };
            match admin.delete_group(&group) {
                Ok(()) => {
                    tracing::info!(%group, "preview group deleted");
                    self.to_forget.group_deleted(&group);
                }
                Err(crate::kafka::Error::DeleteGroup {
                    retryable: false,
                    message,
                    ..
                }) => {
                    // The broker refuses (authorization, an old broker): the group's offsets
                    // expire by its offsets.retention.minutes instead, and the record stays,
                    // so that one started again does not take them up.
                    tracing::warn!(%group, error = %message, "cannot delete a preview's group; leaving it to expire");
                    self.to_forget.group_refused(&group);
                }
                Err(error) => {
                    tracing::warn!(%group, %error, "cannot delete a preview's group; trying again");
                    self.groups_to_delete.insert(group, bootstrap);
                }
            }
        }
        self.forget_reaped();
        if !touched.is_empty() {
            self.pin_heads(None);
            for number in touched {
                self.show(number);
            }
        }
    }

    /// Forgets the records of reaped previews whose groups are all deleted, unless started
    /// again meanwhile.
    fn forget_reaped(&mut self) {
        for name in self.to_forget.ready() {
            // Read again just before: only a retired record is forgotten (another replica
            // may have started it again; a write after this read makes the forget conflict).
            let retired = self
                .context
                .records
                .load(&name)
                .is_ok_and(|r| r.is_retired());
            if self.environments.contains_key(&name) || !retired {
                self.to_forget.done(&name);
                continue;
            }
            match self.context.records.forget(&name) {
                Ok(()) => {
                    tracing::info!(topology = %name, "preview's record forgotten");
                    self.to_forget.done(&name);
                }
                Err(error) if error.is_retryable() => {
                    tracing::warn!(topology = %name, %error, "cannot forget a preview's record; trying again");
                }
                Err(error) => {
                    tracing::warn!(topology = %name, %error, "cannot forget a preview's record; it stays");
                    self.to_forget.done(&name);
                }
            }
        }
    }

    /// Keeps the checkouts of the heads previews run (and `also`, about to).
    fn pin_heads(&self, also: Option<&str>) {
        let mut heads: BTreeSet<String> = self
            .environments
            .values()
            .filter_map(|e| e.head.clone())
            .collect();
        heads.extend(also.map(str::to_owned));
        self.context.revisions.pin(heads);
    }

    /// What pull request `number`'s plan says of its preview.
    fn show(&self, number: u64) {
        let running: Vec<(&String, &Environment)> = self
            .environments
            .iter()
            .filter(|(_, e)| e.pull_request == number && !e.tearing_down && e.fingerprint.is_some())
            .collect();
        let mut refnames: BTreeSet<String> = self
            .environments
            .values()
            .filter(|e| e.pull_request == number)
            .filter_map(|e| e.refname.clone())
            .collect();
        refnames.extend(
            self.context
                .plans
                .list()
                .iter()
                .filter(|p| p.pull_request == Some(number))
                .map(|p| p.name.clone()),
        );
        for refname in &refnames {
            let shown = (!running.is_empty()).then(|| {
                let topologies: Vec<PreviewTopology> = running
                    .iter()
                    .map(|(name, e)| PreviewTopology {
                        topology: e.of.clone(),
                        preview: (*name).clone(),
                        processors: e.processors.clone(),
                        shadow_topics: e.shadow_topics.clone(),
                    })
                    .collect();
                ShownPreview {
                    markdown: markdown(&topologies, &preview::slug_of_ref(refname)),
                    topologies,
                }
            });
            self.context.plans.show_preview(refname, shown);
        }
    }
}

/// The comment's section on a running preview.
fn markdown(topologies: &[PreviewTopology], slug: &str) -> String {
    let rows: Vec<crate::output::preview::Row<'_>> = topologies
        .iter()
        .map(|t| crate::output::preview::Row {
            topology: &t.topology,
            preview: &t.preview,
            processors: t.processors.iter().map(String::as_str).collect(),
            reads: None,
            shadow_topics: &t.shadow_topics,
        })
        .collect();
    crate::output::preview::running_markdown(&rows, slug)
}

/// Every consumer group the preview `name` ever had: each life of each of its processors
/// (`plumber.<name>.<step>.<id12>[.<n>]`), and never a group outside its own names.
fn groups_of(name: &str, deployment: &crate::plan::Deployment) -> Vec<String> {
    let prefix = format!("plumber.{name}.");
    deployment
        .lives_used
        .iter()
        .filter(|(base, _)| base.starts_with(&prefix))
        .flat_map(|(base, last)| {
            (1..=*last).map(move |life| crate::plan::deployment::life_name(base, life))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(state: PullRequestState, labels: &[&str]) -> forge::Result<PullRequest> {
        Ok(PullRequest {
            state,
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        })
    }

    #[test]
    fn a_preview_s_record_is_forgotten_once_its_groups_are_deleted_and_never_when_one_is_refused() {
        let mut queue = ForgetQueue::default();
        queue.reaped(
            "t.pr-1",
            ["plumber.t.pr-1.a.1".into(), "plumber.t.pr-1.b.1".into()],
        );
        queue.reaped("t.pr-2", ["plumber.t.pr-2.a.1".into()]);
        queue.reaped("t.pr-3", []);
        assert_eq!(queue.ready(), ["t.pr-3"], "nothing left to delete");
        queue.group_deleted("plumber.t.pr-1.a.1");
        queue.group_refused("plumber.t.pr-2.a.1");
        assert_eq!(queue.ready(), ["t.pr-3"], "one group of t.pr-1 is left");
        queue.group_deleted("plumber.t.pr-1.b.1");
        assert_eq!(
            queue.ready(),
            ["t.pr-1", "t.pr-3"],
            "t.pr-2 keeps its record"
        );
        queue.done("t.pr-1");
        queue.done("t.pr-3");
        assert!(queue.is_empty());
    }

    #[test]
    fn names_of_previews_are_told_apart_and_name_their_pull_request() {
        assert!(is_preview("shop.pr-7"));
        assert!(!is_preview("shop"));
        assert_eq!(pull_request_of_preview("shop.pr-7"), Some(7));
        assert_eq!(pull_request_of_preview("shop.mr-12"), Some(12));
        assert_eq!(pull_request_of_preview("shop.feature-x"), None);
        assert_eq!(pull_request_of_preview("shop.pr-+7"), None);
        assert_eq!(pull_request_of_preview("shop"), None);
    }

    #[test]
    fn only_a_valid_open_labelled_pull_request_runs_a_preview() {
        let plan = |valid: bool| {
            let mut plan = test_plan("refs/pull/7/head");
            plan.valid = valid;
            plan
        };
        let (valid, invalid) = (plan(true), plan(false));
        let open = PullRequestState::Open;
        assert_eq!(
            verdict(Some(&valid), || pull(open, &["preview"]), "preview"),
            Verdict::Run
        );
        assert_eq!(
            verdict(Some(&valid), || pull(open, &["previews"]), "preview"),
            Verdict::Stop("it does not carry the label")
        );
        assert_eq!(
            verdict(
                Some(&valid),
                || pull(PullRequestState::Closed, &["preview"]),
                "preview"
            ),
            Verdict::Stop("it is closed")
        );
        assert_eq!(
            verdict(
                Some(&valid),
                || pull(PullRequestState::Merged, &["preview"]),
                "preview"
            ),
            Verdict::Stop("it is merged")
        );
        // The forge is not asked when the plan alone says no.
        let never = || -> forge::Result<PullRequest> { panic!("the forge was asked") };
        assert_eq!(
            verdict(Some(&invalid), never, "preview"),
            Verdict::Stop("its merge is not valid")
        );
        assert_eq!(
            verdict(None, never, "preview"),
            Verdict::Stop("its ref is gone")
        );
        // A forge that cannot answer now changes nothing; one that says no such pull request
        // stops it.
        let status = |status: u16| forge::Error::Status {
            method: ureq::http::Method::GET,
            url: "http://forge/x".into(),
            status,
            message: "x".into(),
            wait: None,
            rate_limited: false,
        };
        assert_eq!(
            verdict(Some(&valid), || Err(status(502)), "preview"),
            Verdict::Unknown
        );
        assert_eq!(
            verdict(Some(&valid), || Err(status(404)), "preview"),
            Verdict::Stop("the forge does not give it")
        );
    }

    fn fingerprint(head: &str) -> Fingerprint {
        Fingerprint {
            head: head.into(),
            steps: vec![("b".into(), "abc".into())],
            shadow_topics: BTreeMap::new(),
        }
    }

    #[test]
    fn what_runs_is_moved_to_what_is_wanted() {
        let running = BTreeMap::from([
            ("a.pr-1".to_owned(), Stands::Runs(fingerprint("h1"))),
            ("b.pr-1".to_owned(), Stands::Runs(fingerprint("h1"))),
            ("c.pr-1".to_owned(), Stands::Runs(fingerprint("h1"))),
            // Being torn down, wanted again.
            ("d.pr-1".to_owned(), Stands::TearingDown),
            // Being torn down, still not wanted.
            ("e.pr-1".to_owned(), Stands::TearingDown),
            // Left by a previous run: wanted, it is handed its revision; else torn down.
            ("g.pr-1".to_owned(), Stands::Adopted),
            ("h.pr-1".to_owned(), Stands::Adopted),
        ]);
        let wanted = BTreeMap::from([
            ("a.pr-1".to_owned(), fingerprint("h1")),
            ("b.pr-1".to_owned(), fingerprint("h2")),
            ("d.pr-1".to_owned(), fingerprint("h2")),
            ("f.pr-1".to_owned(), fingerprint("h2")),
            ("g.pr-1".to_owned(), fingerprint("h2")),
        ]);
        assert_eq!(
            changes(&running, &wanted),
            Changes {
                start: vec!["f.pr-1".into()],
                update: vec!["b.pr-1".into(), "d.pr-1".into(), "g.pr-1".into()],
                stop: vec!["c.pr-1".into(), "h.pr-1".into()],
            }
        );
        assert_eq!(
            changes(&running, &BTreeMap::new()).stop,
            ["a.pr-1", "b.pr-1", "c.pr-1", "g.pr-1", "h.pr-1"]
        );
        assert_eq!(
            changes(&BTreeMap::new(), &BTreeMap::new()),
            Changes::default()
        );
    }

    fn test_plan(name: &str) -> RefPlan {
        RefPlan::for_test(name)
    }

    #[test]
    fn a_preview_s_groups_are_every_life_of_its_own_processors_only() {
        let mut deployment = crate::plan::Deployment::default();
        deployment
            .lives_used
            .insert("plumber.shop.pr-7.clean.0123456789ab".into(), 2);
        deployment
            .lives_used
            .insert("plumber.shop.pr-7.enrich.ba9876543210".into(), 1);
        // Another preview's, and the real topology's: never this preview's to delete.
        deployment
            .lives_used
            .insert("plumber.shop.pr-70.clean.0123456789ab".into(), 1);
        deployment
            .lives_used
            .insert("plumber.shop.clean.0123456789ab".into(), 1);
        assert_eq!(
            groups_of("shop.pr-7", &deployment),
            [
                "plumber.shop.pr-7.clean.0123456789ab",
                "plumber.shop.pr-7.clean.0123456789ab.2",
                "plumber.shop.pr-7.enrich.ba9876543210",
            ]
        );
    }
}
