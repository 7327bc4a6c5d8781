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
//! follower and the plans leave alone: real names hold no dot). Its engine creates its shadow
//! topics first, with the partitions of the sink they stand in for (actions of its plan:
//! this thread never acts on Kafka). Once it is no longer wanted (closed, merged, the label
//! removed, the merge invalid, the ref gone), its worker's target is "gone": the engine stops
//! its processors, deletes its internal and shadow topics (unless `--keep-topics`) and its
//! consumer groups. Then this thread forgets its record
//! ([`crate::store::CutoverStore::forget`]; on Kubernetes its Topology object is deleted),
//! unless `--keep-topics`: then its internal topics are kept, and its retired record stays so
//! that one started again gets new names and never reads them.
//!
//! One thread decides, looking at a pull request again on a change of its plan, on a
//! pull-request webhook ([`Requests::look`]), and every poll interval while its preview runs
//! or is wanted: GitHub keeps `refs/pull/N/head` after a close, so closing is learnt from the
//! forge. A forge that cannot answer now (retrying may help) changes nothing.
//!
//! Every daemon replica decides (so its status says what runs), but only the one that may
//! act (the lease holder on Kubernetes) forgets records, and its workers' engines act only
//! then too. A replica that starts acting runs every preview it knows again, its engines
//! resuming from the records.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::plans::{PlanEvent, PreviewTopology, RefPlan, ShownPreview};
use crate::daemon::facts::Fact;
use crate::daemon::status::PreviewOf;
use crate::daemon::worker::Worker;
use crate::daemon::{Context, Error, Revision};
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

/// What the API asks of the previews thread.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Request {
    /// Decide pull request `number`'s preview again.
    Look(u64),
    /// A verified webhook says the preview label was just set on pull request `number`,
    /// whose head was then `head`: the label approves that commit.
    Labelled { number: u64, head: String },
}

/// How the API asks the previews thread to look at a pull request again (a no-op without
/// previews).
#[derive(Default)]
pub struct Requests {
    mailbox: crate::daemon::mailbox::Mailbox<Request>,
}

impl Requests {
    /// Asks for pull request `number`'s preview to be decided again (never waits).
    pub fn look(&self, number: u64) {
        self.mailbox.send(Request::Look(number));
    }

    /// A verified webhook: the preview label was set on pull request `number` at `head`.
    pub fn labelled(&self, number: u64, head: String) {
        self.mailbox.send(Request::Labelled { number, head });
    }
}

/// The pull request and its head at the moment a verified webhook reports the preview
/// `label` set: GitHub's `pull_request` `labeled` (`label.name`, `pull_request.head.sha`),
/// GitLab's `Merge Request Hook` whose label changes add it (`changes.labels`,
/// `object_attributes.last_commit.id`). `None` for anything else.
pub fn webhook_labelled<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
    label: &str,
) -> Option<(u64, String)> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = |pointer: &str| json.pointer(pointer).and_then(serde_json::Value::as_str);
    let titles = |pointer: &str| -> Vec<&str> {
        json.pointer(pointer)
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|l| l.get("title").and_then(serde_json::Value::as_str))
            .collect()
    };
    let (number, head) = if header("x-github-event") == Some("pull_request") {
        if text("/action") != Some("labeled") || text("/label/name") != Some(label) {
            return None;
        }
        (
            json.get("number")?.as_u64()?,
            text("/pull_request/head/sha")?,
        )
    } else if header("x-gitlab-event") == Some("Merge Request Hook") {
        let added = titles("/changes/labels/current").contains(&label)
            && !titles("/changes/labels/previous").contains(&label);
        if !added {
            return None;
        }
        (
            json.pointer("/object_attributes/iid")?.as_u64()?,
            text("/object_attributes/last_commit/id")?,
        )
    } else {
        return None;
    };
    let full_sha = head.len() == 40 && head.bytes().all(|b| b.is_ascii_hexdigit());
    full_sha.then(|| (number, head.to_owned()))
}

/// Why a pull request without the label gets no preview.
const NO_LABEL: &str = "it does not carry the label";

/// Why a pull request that changes its clusters gets no preview.
const CLUSTERS_CHANGED: &str = "it changes the clusters of plumber.yaml (bootstrap, \
     properties or credentials), and a preview runs only with the tracked branch's";

/// Whether a pull request's preview runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Run the plan's head, which the label approved.
    Run,
    /// It must not run, and why.
    Stop(&'static str),
    /// Not until labelled again: the head moved past `approved`, the commit the label was
    /// set on. The new commits were approved by no one.
    NewCommits { approved: String },
    /// The forge cannot say now, or the plan has not caught up with the approved head yet:
    /// what runs keeps running, what does not stays off.
    Unknown,
}

/// What is known of a pull request's approval when it is decided on.
pub(crate) struct Approval<'a> {
    /// The head the label approved, if the daemon knows it (a verified `labeled` webhook, the
    /// head seen when the label was first seen, the head a preview ran).
    pub approved: Option<&'a str>,
    /// Whether commit `newer` descends from commit `older`.
    pub descends: &'a dyn Fn(&str, &str) -> bool,
}

/// The verdict on a pull request from its plan (`None`: its ref is gone) and what the forge
/// says of it (`pull`, asked only when the plan could be previewed), and the head its label
/// approves (when it carries it): the one known, else the head the forge names now.
pub(crate) fn verdict(
    plan: Option<&RefPlan>,
    pull: impl FnOnce() -> forge::Result<PullRequest>,
    label: &str,
    approval: &Approval<'_>,
) -> (Verdict, Option<String>) {
    let Some(plan) = plan else {
        return (Verdict::Stop("its ref is gone"), None);
    };
    if !plan.valid {
        // The label's approval stands: the head it approved is still what it approved (the
        // plan of an approved head that runs commands can be made invalid by their tests).
        return (
            Verdict::Stop("its merge is not valid"),
            approval.approved.map(str::to_owned),
        );
    }
    let pull = match pull() {
        Err(error) if error.is_retryable() => {
            tracing::warn!(r#ref = %plan.name, %error, "cannot read the pull request from the forge; its preview stays as it is");
            return (Verdict::Unknown, approval.approved.map(str::to_owned));
        }
        Err(error) => {
            tracing::warn!(r#ref = %plan.name, %error, "the forge does not give the pull request; no preview");
            return (Verdict::Stop("the forge does not give it"), None);
        }
        Ok(pull) => pull,
    };
    match pull.state {
        PullRequestState::Merged => return (Verdict::Stop("it is merged"), None),
        PullRequestState::Closed => return (Verdict::Stop("it is closed"), None),
        PullRequestState::Open if !pull.has_label(label) => {
            return (Verdict::Stop(NO_LABEL), None);
        }
        PullRequestState::Open => {}
    }
    // First sight of the label: it approves the head the forge names now (the plan may not
    // have fetched it yet).
    let approved = approval
        .approved
        .map(str::to_owned)
        .or(pull.head)
        .unwrap_or_else(|| plan.head.clone());
    let verdict = if plan.changes_clusters() {
        Verdict::Stop(CLUSTERS_CHANGED)
    } else if approved == plan.head {
        Verdict::Run
    } else if (approval.descends)(&approved, &plan.head) {
        // The plan is behind the approved head: it catches up at the next fetch.
        Verdict::Unknown
    } else {
        Verdict::NewCommits {
            approved: approved.clone(),
        }
    };
    (verdict, Some(approved))
}

/// What a preview topology runs: when it changes, its worker is handed the new revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fingerprint {
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
pub(crate) struct Changes {
    /// Not running: start them.
    pub start: Vec<String>,
    /// Running something else (or being torn down): hand them the new revision.
    pub update: Vec<String>,
    /// Running, no longer wanted: tear them down.
    pub stop: Vec<String>,
}

/// Where a preview topology the thread looks after stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stands {
    Runs(Fingerprint),
    /// Adopted from a previous run's store: what it runs is not known.
    Adopted,
    TearingDown,
}

/// From what runs of a pull request to what is wanted of it.
pub(crate) fn changes(
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
    /// also when starting failed), or that wait for the label again.
    wanted: BTreeSet<u64>,
    /// Per pull request carrying the label, the head it approved.
    approvals: BTreeMap<u64, String>,
    /// The head of each pull request's last plan event, and whether its merge was valid.
    heads: BTreeMap<u64, (String, bool)>,
    /// Why a labelled pull request runs no preview, for its plan comment, and the commit
    /// status it was given (per pull request: its head and what it was told).
    notes: BTreeMap<u64, Note>,
    /// Torn-down previews whose records are still to forget (their engine deleted their
    /// shadow topics and consumer groups as it retired them).
    to_forget: BTreeSet<String>,
}

/// What a labelled pull request's reviewers are told about its preview, on its head.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Note {
    head: String,
    /// `None`: it runs.
    why_not: Option<String>,
}

/// Starts the previews thread when `--preview-label` is set (it needs the forge).
pub(crate) fn start(context: &Arc<Context>) -> Result<Option<super::Running>, Error> {
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
    let thread = crate::daemon::spawn(
        &context.threads,
        "previews",
        crate::daemon::health::Kind::Essential,
        {
            let context = context.clone();
            move || {
                let mut previews = Previews {
                    context,
                    forge,
                    label,
                    environments: BTreeMap::new(),
                    wanted: BTreeSet::new(),
                    approvals: BTreeMap::new(),
                    heads: BTreeMap::new(),
                    notes: BTreeMap::new(),
                    to_forget: BTreeSet::new(),
                };
                previews.run(events, requests);
            }
        },
    )?;
    let detach = {
        let context = context.clone();
        move || context.previews.mailbox.detach()
    };
    Ok(Some(super::Running::new(thread, clock, detach)))
}

/// What woke the thread.
enum Wake {
    Plan(PlanEvent),
    Lagged,
    Request(Request),
    Tick,
    Stop,
}

/// How often teardowns in progress are looked at.
const TEARDOWN_LOOK: Duration = Duration::from_millis(500);

impl Previews {
    fn run(
        &mut self,
        mut events: tokio::sync::broadcast::Receiver<PlanEvent>,
        mut requests: UnboundedReceiver<Request>,
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
                || !self.to_forget.is_empty();
            let wake = runtime.block_on(async {
                let until = if busy {
                    next_poll.min(tokio::time::Instant::now() + TEARDOWN_LOOK)
                } else {
                    next_poll
                };
                tokio::select! {
                    biased;
                    request = requests.recv() => request.map_or(Wake::Stop, Wake::Request),
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
            let _busy = self.context.threads.busy("a look at the previews");
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
                        && self.worth_asking(number, &event)
                    {
                        self.decide(number);
                    }
                }
                Wake::Request(Request::Look(number)) => self.decide(number),
                Wake::Request(Request::Labelled { number, head }) => {
                    tracing::info!(pull_request = number, %head, "the preview label was set: it approves that head");
                    self.approvals.insert(number, head);
                    self.decide(number);
                }
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
            // What a preview ran, its label approved: a newer head waits for the label again.
            if let Some(head) = &head {
                self.approvals.entry(number).or_insert_with(|| head.clone());
            }
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

    /// Whether a plan event of pull request `number` is worth asking the forge about: one
    /// that runs or waits for a preview, or whose head or validity moved (a push may come
    /// with the label; a merge that became valid may be previewed).
    /// A push to the tracked branch changes every pull request's plan; for the others (closed
    /// ones included, whose refs GitHub keeps) it asks the forge nothing.
    fn worth_asking(&mut self, number: u64, event: &PlanEvent) -> bool {
        let involved = self.wanted.contains(&number)
            || self.environments.values().any(|e| e.pull_request == number);
        let moved = match &event.head {
            Some(head) => {
                let now = (head.clone(), event.valid);
                self.heads.insert(number, now.clone()).as_ref() != Some(&now)
            }
            None => self.heads.remove(&number).is_some(),
        };
        involved || moved
    }

    /// Looks at pull request `number` and starts, moves or tears down its preview.
    fn decide(&mut self, number: u64) {
        let plan = self.context.plans.list().into_iter().find(|p| {
            p.pull_request == Some(number) && forge::pull_request_of_ref(&p.name).is_some()
        });
        let forge = self.forge.clone();
        // Opened only when the approved head and the plan's differ.
        let repository = std::cell::OnceCell::new();
        let descends = |newer: &str, older: &str| {
            let repository = repository.get_or_init(|| self.context.revisions.open().ok());
            let (Some(repository), Ok(newer), Ok(older)) = (
                repository,
                git2::Oid::from_str(newer),
                git2::Oid::from_str(older),
            ) else {
                return false;
            };
            repository
                .git()
                .graph_descendant_of(newer, older)
                .unwrap_or(false)
        };
        let approval = Approval {
            approved: self.approvals.get(&number).map(String::as_str),
            descends: &descends,
        };
        let (verdict, approved) = verdict(
            plan.as_deref(),
            || forge.pull_request(number),
            &self.label,
            &approval,
        );
        tracing::debug!(pull_request = number, ?verdict, "preview decided");
        // Plans run an approved head's commands (`--run-commands`).
        self.context.plans.approve(number, approved.as_deref());
        match approved {
            Some(approved) => self.approvals.insert(number, approved),
            // Without the label (or closed, merged, gone) nothing is approved any more: a
            // label set again approves the head it is set on.
            None => self.approvals.remove(&number),
        };
        match (verdict, plan) {
            // Asked again at the next poll.
            (Verdict::Unknown, _) => {
                self.wanted.insert(number);
            }
            (Verdict::Run, Some(plan)) => {
                self.wanted.insert(number);
                match self.wanted_previews(&plan) {
                    Ok(previews) => {
                        self.tell(number, &plan, None);
                        self.apply(number, &plan, previews);
                    }
                    Err(error) => {
                        tracing::warn!(r#ref = %plan.name, %error, "the pull request cannot be previewed");
                        self.stop_all(number, "it cannot be previewed");
                    }
                }
            }
            (Verdict::NewCommits { approved }, Some(plan)) => {
                // Looked at again: the label set again approves the new head.
                self.wanted.insert(number);
                tracing::warn!(pull_request = number, %approved, head = %plan.head, "new commits since the preview label approved its head: no preview until it is set again");
                self.stop_all(number, "new commits since its label");
                let why = format!(
                    "new commits since the `{}` label was set on {}: label the pull request \
                     again to preview {}",
                    self.label,
                    crate::output::short_commit(&approved),
                    crate::output::short_commit(&plan.head)
                );
                if self.tell(number, &plan, Some(why)) {
                    // The label no longer approves anything; taking it off lets a maintainer
                    // set it again (a forge or token that does not allow it changes nothing).
                    if let Err(error) = self.forge.remove_label(number, &self.label) {
                        tracing::warn!(pull_request = number, %error, "cannot take the preview label off; remove it and set it again to approve the new head");
                    }
                }
            }
            (Verdict::Stop(why), plan) => {
                self.wanted.remove(&number);
                self.stop_all(number, why);
                match plan {
                    Some(plan) if why == CLUSTERS_CHANGED => {
                        self.tell(number, &plan, Some(format!("no preview: {why}")));
                    }
                    Some(plan)
                        if why == NO_LABEL
                            && self.notes.get(&number).is_some_and(|n| n.head == plan.head) =>
                    {
                        // Taken off after new commits: what the note says holds until the head
                        // moves or the label is set again, which the next polls look for. Taken
                        // off while it ran: say so.
                        self.wanted.insert(number);
                        if self.notes.get(&number).is_some_and(|n| n.why_not.is_none()) {
                            let why = format!(
                                "the `{}` label was taken off; set it again to preview {}",
                                self.label,
                                crate::output::short_commit(&plan.head)
                            );
                            self.tell(number, &plan, Some(why));
                        }
                    }
                    _ => {
                        if self.notes.remove(&number).is_some() {
                            self.show(number);
                        }
                    }
                }
            }
            // `verdict` says so without a plan.
            (Verdict::Run | Verdict::NewCommits { .. }, None) => {}
        }
    }

    /// Tells the reviewers of labelled pull request `number` at the head of `plan` whether
    /// its preview runs (`why_not`: it does not, and why), in its plan comment and in a commit
    /// status of its own (`plumber/preview`), once per head and state. Whether that was new.
    fn tell(&mut self, number: u64, plan: &RefPlan, why_not: Option<String>) -> bool {
        let note = Note {
            head: plan.head.clone(),
            why_not,
        };
        if self.notes.get(&number) == Some(&note) {
            return false;
        }
        let status = match &note.why_not {
            Some(why) => forge::CommitStatus::new(forge::State::Pending, why),
            None => forge::CommitStatus::new(forge::State::Success, "its preview environment runs"),
        }
        .of_preview();
        if let Err(error) = self.forge.set_commit_status(&note.head, &status) {
            tracing::warn!(pull_request = number, %error, "cannot set the preview's commit status");
        }
        self.notes.insert(number, note);
        self.show(number);
        true
    }

    /// The previews of `plan` against what runs now.
    fn wanted_previews(&self, plan: &RefPlan) -> Result<Vec<Preview>, Error> {
        let records = self.context.records.topologies()?;
        let deployments: BTreeMap<String, Deployment> = records
            .into_iter()
            .filter(|(name, _)| !is_preview(name))
            .filter_map(|(name, record)| Some((name, record.ok()?.deployment)))
            .collect();
        // The tracked branch's clusters, never the pull request's.
        let clusters = plan.base_clusters().cloned().unwrap_or_default();
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
        let clusters = plan.base_clusters().cloned().unwrap_or_default();
        for preview in previews {
            let name = preview.graph.name.clone();
            if !changes.start.contains(&name) && !changes.update.contains(&name) {
                continue;
            }
            if let Err(error) = self.run_preview(number, plan, &clusters, preview) {
                tracing::warn!(topology = %name, %error, "cannot start the preview; trying again at the next look");
                self.context.store.apply(Fact::PreviewFailed {
                    topology: name.clone(),
                    message: error.to_string(),
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
        let checkout = self
            .context
            .revisions
            .checkout(&plan.head, std::slice::from_ref(&preview.graph))?;
        let mut revision = Revision {
            commit: plan.head.clone(),
            topologies: Vec::new(),
            clusters: clusters.clone(),
            checkout,
            masked_fields: Vec::new(),
        };
        // Its cluster must resolve before the worker has it; its shadow topics are the
        // engine's to create, as the worker moves the preview.
        self.context.cluster(&revision, &preview.graph)?;
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
        self.context.store.apply(Fact::PreviewRuns {
            topology: name.clone(),
            of: PreviewOf {
                name: plan.name.clone(),
                pull_request: number,
                topology: of.clone(),
                shadow_topics: shadow_topics.clone(),
            },
        });
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
            masked_fields: Vec::new(),
        }));
    }

    /// Forgets the previews whose workers are done: their engines deleted their shadow
    /// topics and consumer groups as they retired them. Their records are forgotten too,
    /// unless `--keep-topics` kept their internal topics (the record's names keep a preview
    /// started again off those).
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
            if !self.context.config.cutover.keep_topics {
                self.to_forget.insert(name.clone());
            }
            self.context.store.apply(Fact::Removed(name.clone()));
            touched.insert(environment.pull_request);
            tracing::info!(topology = %name, "preview gone");
        }
        if !self.context.records.may_act() {
            // The lease holder forgets them: a standby's forget could race the holder
            // starting the preview again.
            self.to_forget.clear();
        }
        self.forget_reaped();
        if !touched.is_empty() {
            self.pin_heads(None);
            for number in touched {
                self.show(number);
            }
        }
    }

    /// Forgets the records of reaped previews, unless started again meanwhile.
    fn forget_reaped(&mut self) {
        for name in std::mem::take(&mut self.to_forget) {
            // Read again just before: only a retired record is forgotten (another replica
            // may have started it again; a write after this read makes the forget conflict).
            let retired = self
                .context
                .records
                .load(&name)
                .is_ok_and(|r| r.is_retired());
            if self.environments.contains_key(&name) || !retired {
                continue;
            }
            match self.context.records.forget(&name) {
                Ok(()) => tracing::info!(topology = %name, "preview's record forgotten"),
                Err(error) if error.is_retryable() => {
                    tracing::warn!(topology = %name, %error, "cannot forget a preview's record; trying again");
                    self.to_forget.insert(name);
                }
                Err(error) => {
                    tracing::warn!(topology = %name, %error, "cannot forget a preview's record; it stays");
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
        let note = self
            .notes
            .get(&number)
            .and_then(|note| note.why_not.as_deref());
        for refname in &refnames {
            if running.is_empty()
                && let Some(why) = note
            {
                let markdown = format!(
                    "### Preview environment `{}`\n\nNot running: {why}.\n",
                    preview::slug_of_ref(refname)
                );
                self.context.plans.show_preview(
                    refname,
                    Some(ShownPreview {
                        topologies: Vec::new(),
                        markdown,
                    }),
                );
                continue;
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(state: PullRequestState, labels: &[&str]) -> forge::Result<PullRequest> {
        Ok(PullRequest {
            state,
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            head: None,
        })
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
            plan.head = "h1".into();
            plan
        };
        let (valid, invalid) = (plan(true), plan(false));
        let open = PullRequestState::Open;
        let no_descent = |_: &str, _: &str| false;
        let unknown = Approval {
            approved: None,
            descends: &no_descent,
        };
        let decide = |plan: Option<&RefPlan>, pull: forge::Result<PullRequest>| {
            verdict(plan, || pull, "preview", &unknown)
        };
        assert_eq!(
            decide(Some(&valid), pull(open, &["preview"])),
            (Verdict::Run, Some("h1".into())),
            "the label seen first approves the head"
        );
        assert_eq!(
            decide(Some(&valid), pull(open, &["previews"])),
            (Verdict::Stop("it does not carry the label"), None)
        );
        assert_eq!(
            decide(Some(&valid), pull(PullRequestState::Closed, &["preview"])),
            (Verdict::Stop("it is closed"), None)
        );
        assert_eq!(
            decide(Some(&valid), pull(PullRequestState::Merged, &["preview"])),
            (Verdict::Stop("it is merged"), None)
        );
        // The forge is not asked when the plan alone says no.
        let never = || -> forge::Result<PullRequest> { panic!("the forge was asked") };
        assert_eq!(
            verdict(Some(&invalid), never, "preview", &unknown).0,
            Verdict::Stop("its merge is not valid")
        );
        assert_eq!(
            verdict(None, never, "preview", &unknown).0,
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
        assert_eq!(decide(Some(&valid), Err(status(502))).0, Verdict::Unknown);
        assert_eq!(
            decide(Some(&valid), Err(status(404))).0,
            Verdict::Stop("the forge does not give it")
        );
    }

    /// SPEC §11: a label approves the head it was set on, never a later one.
    #[test]
    fn a_label_approves_the_head_it_was_set_on_and_new_commits_wait_for_it_again() {
        let mut plan = test_plan("refs/pull/7/head");
        plan.valid = true;
        plan.head = "h2".into();
        let open = PullRequestState::Open;
        // h2 descends from h1; h1 from nothing.
        let descends = |newer: &str, older: &str| newer == "h2" && older == "h1";
        let approved = |head: Option<&'static str>| Approval {
            approved: head,
            descends: &descends,
        };
        let labelled = |head: Option<&str>| {
            let mut pull = pull(open, &["preview"]).unwrap();
            pull.head = head.map(str::to_owned);
            Ok(pull)
        };
        // Approved at h1, the pull request moved on to h2: not until labelled again.
        assert_eq!(
            verdict(
                Some(&plan),
                || labelled(Some("h2")),
                "preview",
                &approved(Some("h1"))
            ),
            (
                Verdict::NewCommits {
                    approved: "h1".into()
                },
                Some("h1".into())
            )
        );
        // Labelled again at h2 (a webhook's head, or the label seen anew).
        assert_eq!(
            verdict(
                Some(&plan),
                || labelled(Some("h2")),
                "preview",
                &approved(Some("h2"))
            ),
            (Verdict::Run, Some("h2".into()))
        );
        // The label seen first while the forge already names a newer head than the plan has:
        // it approves the forge's, and the plan catches up.
        plan.head = "h1".into();
        assert_eq!(
            verdict(
                Some(&plan),
                || labelled(Some("h2")),
                "preview",
                &approved(None)
            ),
            (Verdict::Unknown, Some("h2".into()))
        );
        // The approval goes with the label.
        assert_eq!(
            verdict(
                Some(&plan),
                || pull(open, &[]),
                "preview",
                &approved(Some("h1"))
            )
            .1,
            None
        );
    }

    /// SPEC §11: a preview runs with the tracked branch's clusters only.
    #[test]
    fn a_pull_request_that_changes_its_clusters_runs_no_preview() {
        let mut changed = crate::spec::ClusterSpec::at("kafka:9092");
        let base = BTreeMap::from([("default".to_owned(), changed.clone())]);
        changed.bootstrap = "attacker.example:9092".into();
        let mut plan = test_plan("refs/pull/7/head")
            .with_clusters_for_test(BTreeMap::from([("default".to_owned(), changed)]), base);
        plan.valid = true;
        plan.head = "h1".into();
        let no_descent = |_: &str, _: &str| false;
        let (verdict, _) = verdict(
            Some(&plan),
            || pull(PullRequestState::Open, &["preview"]),
            "preview",
            &Approval {
                approved: Some("h1"),
                descends: &no_descent,
            },
        );
        assert_eq!(verdict, Verdict::Stop(CLUSTERS_CHANGED));
    }

    #[test]
    fn a_verified_labelled_webhook_names_its_pull_request_and_head() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let github = |action: &str, label: &str| {
            format!(
                r#"{{"action":"{action}","number":7,"label":{{"name":"{label}"}},"pull_request":{{"head":{{"sha":"{sha}"}}}}}}"#
            )
        };
        let header =
            |event: &'static str| move |name: &str| (name == "x-github-event").then_some(event);
        assert_eq!(
            webhook_labelled(
                header("pull_request"),
                github("labeled", "preview").as_bytes(),
                "preview"
            ),
            Some((7, sha.to_owned()))
        );
        for (action, label) in [
            ("labeled", "other"),
            ("unlabeled", "preview"),
            ("synchronize", "preview"),
        ] {
            assert_eq!(
                webhook_labelled(
                    header("pull_request"),
                    github(action, label).as_bytes(),
                    "preview"
                ),
                None,
                "{action} {label}"
            );
        }
        let gitlab = |previous: &str, current: &str| {
            format!(
                r#"{{"object_attributes":{{"iid":9,"action":"update","last_commit":{{"id":"{sha}"}}}},"changes":{{"labels":{{"previous":[{previous}],"current":[{current}]}}}}}}"#
            )
        };
        let gitlab_header = |name: &str| (name == "x-gitlab-event").then_some("Merge Request Hook");
        assert_eq!(
            webhook_labelled(
                gitlab_header,
                gitlab("", r#"{"title":"preview"}"#).as_bytes(),
                "preview"
            ),
            Some((9, sha.to_owned()))
        );
        assert_eq!(
            webhook_labelled(
                gitlab_header,
                gitlab(
                    r#"{"title":"preview"}"#,
                    r#"{"title":"preview"},{"title":"x"}"#
                )
                .as_bytes(),
                "preview"
            ),
            None,
            "the label was there already"
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
}
