//! The plans of pull requests on their forge (SPEC §9): per watched ref, the commit status of
//! its head (`context: plumber`), and for a pull-request ref (`refs/pull/N/head`,
//! `refs/merge-requests/N/head`) the plan as one comment, updated in place.
//!
//! One thread, off every other path: it reads plan changes ([`super::plans::Plans::subscribe`])
//! and publishes the newest plan of the ref that changed, so a burst of pushes costs the forge
//! what the newest needs. What was published is remembered: a status once per head and text
//! (a branch and its pull-request ref share a head: one status), a comment once per
//! [`RefPlan::fingerprint`] (what the plan means: the tracked branch moving under a pull
//! request whose plan it leaves as it was writes nothing), updated by its id. A pull-request
//! webhook ([`webhook_pull_request`]) asks for that pull request's comment again even when its
//! plan did not change: someone may have deleted it.
//!
//! A status goes first, and a comment waits for its status: so a comment that carries a
//! fingerprint means that plan's status was set. After a start nothing is remembered; the
//! first publication on an open pull request looks for its comment, and one that says the
//! plan already costs no write (a restart costs a look per open pull request).
//!
//! Writes go to open pull requests only: a forge keeps `refs/pull/N/head` after a close, and
//! the plans of years of closed pull requests change on every push to the branch. Which are
//! open is listed once ([`Forge::open_pull_requests`], 100 a page), at the first write and
//! again before a write once the listing is [`OPEN_PULL_REQUESTS_MAX_AGE`] old, and kept up to
//! date by webhooks (opened, reopened, closed, merged). A pull request not listed is judged
//! closed at the head its ref had when the listing was read; one whose ref appeared or moved
//! since is asked about alone (it changed, so that is one request per change).
//!
//! The clients retry 5xx answers and rate limits themselves; what still fails is tried again
//! here later when retrying can help ([`forge::Error::is_retryable`]), from [`FIRST_RETRY`]
//! doubling to [`LAST_RETRY`], with the newest plan of the ref at that time. Anything else is
//! logged and tried again only when the plan changes. The token never appears in a log: the
//! clients' errors blank it out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::plans::{PlanChange, PlanEvent, Plans, RefPlan};
use crate::daemon::facts::{Fact, Store};
use crate::daemon::status::{Failed, Published};
use crate::daemon::{Context, Error};
use crate::forge::{self, CommentOutcome, CommitStatus, Forge, State};
use crate::plan::Change;

/// The first wait before a publication that failed (after the client's own retries) is tried
/// again.
pub const FIRST_RETRY: Duration = Duration::from_secs(30);
/// The longest wait between tries.
pub const LAST_RETRY: Duration = Duration::from_secs(600);

/// How long a listing of the open pull requests is trusted before a write: older, they are
/// listed again first, so that a pull request closed while no webhook said so gets no writes.
pub const OPEN_PULL_REQUESTS_MAX_AGE: Duration = Duration::from_secs(600);

/// What remembers the published (statuses per head) may hold before it starts over: a
/// forgotten head is published once more, no harm.
const REMEMBERED_HEADS: usize = 10_000;

/// What the publisher is asked besides plan changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    /// Publish this pull request's comment again, even unchanged; a webhook said it is open.
    Republish(u64),
    /// A webhook said this pull request was closed or merged.
    Closed(u64),
    /// The trusted keys judged a new head of the tracked branch (`status.signature`).
    Signature,
}

/// How the API and the follower ask the publisher (a no-op without a forge).
#[derive(Default)]
pub struct Requests {
    mailbox: crate::daemon::mailbox::Mailbox<Request>,
}

impl Requests {
    /// Asks for pull request `number`'s plan to be published again (never waits).
    pub fn republish(&self, number: u64) {
        self.mailbox.send(Request::Republish(number));
    }

    /// Pull request `number` was closed or merged: nothing is written on it any more
    /// (never waits).
    pub fn closed(&self, number: u64) {
        self.mailbox.send(Request::Closed(number));
    }

    /// The verdict on the tracked branch's head is in `status.signature`: a refused head
    /// gets a failing commit status (never waits).
    pub fn signature_changed(&self) {
        self.mailbox.send(Request::Signature);
    }
}

/// The pull request a verified webhook is about, when it asks for its plan: GitHub's
/// `pull_request` event (opened, synchronize, reopened), GitLab's `Merge Request Hook`
/// (open, update, reopen). `None` for any other event. A body that is not the JSON the event
/// documents is logged at debug (the fetch happens anyway).
pub fn webhook_pull_request<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
) -> Option<u64> {
    let (github, action, number) = pull_request_event(header, body)?;
    let wanted: &[&str] = if github {
        &["opened", "synchronize", "reopened"]
    } else {
        &["open", "update", "reopen"]
    };
    wanted.contains(&action.as_str()).then_some(number)
}

/// The pull request a verified webhook says was closed or merged: GitHub's `pull_request`
/// event (closed: a merge is a close), GitLab's `Merge Request Hook` (close, merge).
pub fn webhook_pull_request_closed<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
) -> Option<u64> {
    let (github, action, number) = pull_request_event(header, body)?;
    let wanted: &[&str] = if github {
        &["closed"]
    } else {
        &["close", "merge"]
    };
    wanted.contains(&action.as_str()).then_some(number)
}

/// The pull request a verified webhook is about, when whether it runs a preview environment
/// may have changed: GitHub's `pull_request` event (opened, synchronize, reopened, labeled,
/// unlabeled, closed: a merge is a close), GitLab's `Merge Request Hook` (open, update: labels
/// changed are an update, reopen, close, merge).
pub fn webhook_pull_request_changed<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
) -> Option<u64> {
    let (github, action, number) = pull_request_event(header, body)?;
    let wanted: &[&str] = if github {
        &[
            "opened",
            "synchronize",
            "reopened",
            "labeled",
            "unlabeled",
            "closed",
        ]
    } else {
        &["open", "update", "reopen", "close", "merge"]
    };
    wanted.contains(&action.as_str()).then_some(number)
}

/// A pull-request webhook's forge (`true`: GitHub), action and number.
fn pull_request_event<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    body: &[u8],
) -> Option<(bool, String, u64)> {
    let github = header("x-github-event") == Some("pull_request");
    let gitlab = header("x-gitlab-event") == Some("Merge Request Hook");
    if !github && !gitlab {
        return None;
    }
    let json: serde_json::Value = match serde_json::from_slice(body) {
        Ok(json) => json,
        Err(error) => {
            tracing::debug!(%error, "a pull-request webhook whose body is not JSON; fetching anyway");
            return None;
        }
    };
    let (action, number) = if github {
        (
            json.get("action"),
            json.get("number")
                .or_else(|| json.pointer("/pull_request/number")),
        )
    } else {
        (
            json.pointer("/object_attributes/action"),
            json.pointer("/object_attributes/iid"),
        )
    };
    let action = action.and_then(serde_json::Value::as_str);
    let number = number.and_then(serde_json::Value::as_u64);
    match (action, number) {
        (Some(action), Some(number)) => Some((github, action.to_owned(), number)),
        _ => {
            tracing::debug!(
                github,
                "a pull-request webhook without its action or number; fetching anyway"
            );
            None
        }
    }
}

/// A plan as the publisher needs it.
#[derive(Clone)]
struct Subject {
    name: String,
    head: String,
    pull_request: Option<u64>,
    status: CommitStatus,
    /// What the plan means ([`RefPlan::fingerprint`]): what tells whether it changed.
    fingerprint: String,
    /// The text within a budget of characters.
    render: Arc<dyn Fn(usize) -> String + Send + Sync>,
}

impl Subject {
    fn of(plan: &Arc<RefPlan>, kind: forge::Kind, public_url: Option<&str>) -> Subject {
        let mut status = CommitStatus::new(
            if plan.valid {
                State::Success
            } else {
                State::Failure
            },
            forge::shorten(&describe(plan), kind.description_limit()),
        );
        if let Some(url) = public_url {
            status = status.with_target_url(format!(
                "{}/api/plans/{}",
                url.trim_end_matches('/'),
                encode_path_segment(&plan.name)
            ));
        }
        let render = plan.clone();
        Subject {
            name: plan.name.clone(),
            head: plan.head.clone(),
            pull_request: plan.pull_request,
            status,
            fingerprint: plan.fingerprint.clone(),
            // `markdown_within` counts bytes, the forge characters: a byte budget is always
            // within the same number of characters.
            render: Arc::new(move |budget| render.markdown_within(budget)),
        }
    }
}

/// The plans of pull request `number`'s refs.
fn of_pull_request(source: &dyn Source, number: u64) -> Vec<Subject> {
    source
        .list()
        .into_iter()
        .filter(|s| s.pull_request == Some(number))
        .collect()
}

/// The failing commit status of a tracked-branch head the trusted keys refused (`None`
/// for a trusted head: it has no plan of its own to report).
fn refused_head(
    branch: &str,
    signature: &crate::daemon::status::SignatureStatus,
) -> Option<Subject> {
    let status = signature.commit_status()?;
    Some(Subject {
        name: format!("refs/heads/{branch}"),
        head: signature.commit.clone(),
        pull_request: None,
        status,
        fingerprint: String::new(),
        render: Arc::new(|_| String::new()),
    })
}

/// The one line of a plan's commit status.
fn describe(plan: &RefPlan) -> String {
    if plan.valid {
        let changing = plan
            .topologies
            .iter()
            .filter(|t| t.change != Change::Unchanged || !t.actions.is_empty())
            .count();
        let actions: usize = plan.topologies.iter().map(|t| t.actions.len()).sum();
        return match (changing, actions) {
            (0, 0) => "valid; changes nothing that runs".into(),
            (1, _) => format!("valid; 1 topology changes: {}", plural(actions, "action")),
            (n, _) => format!(
                "valid; {n} topologies change: {}",
                plural(actions, "action")
            ),
        };
    }
    if !plan.conflicts.is_empty() {
        return format!("merge conflicts in {}", plan.conflicts.join(", "));
    }
    let first = plan
        .errors
        .iter()
        .find(|d| d.severity == crate::diagnostic::Severity::Error)
        .or(plan.errors.first());
    let Some(first) = first else {
        return "invalid".into();
    };
    let mut line = first.file.clone();
    if let Some(number) = first.line {
        line.push_str(&format!(":{number}"));
    }
    line.push_str(&format!(": {}", first.message));
    if plan.errors.len() > 1 {
        line.push_str(&format!(" (+{} more)", plan.errors.len() - 1));
    }
    line
}

fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// `text` as one path segment of a URL: anything but unreserved characters percent-encoded.
fn encode_path_segment(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Where the publisher reads plans: the daemon's [`Plans`], or a test's.
trait Source {
    fn get(&self, name: &str) -> Option<Subject>;
    fn list(&self) -> Vec<Subject>;
    /// The head of every watched pull-request ref in the repository now, by pull request.
    fn pull_request_heads(&self) -> BTreeMap<u64, String>;
}

struct PlansSource<'a> {
    context: &'a Context,
    plans: &'a Plans,
    kind: forge::Kind,
    public_url: Option<&'a str>,
}

impl Source for PlansSource<'_> {
    fn get(&self, name: &str) -> Option<Subject> {
        self.plans
            .get(name)
            .map(|plan| Subject::of(&plan, self.kind, self.public_url))
    }

    fn list(&self) -> Vec<Subject> {
        self.plans
            .list()
            .iter()
            .map(|plan| Subject::of(plan, self.kind, self.public_url))
            .collect()
    }

    fn pull_request_heads(&self) -> BTreeMap<u64, String> {
        super::plans::pull_request_heads(self.context)
    }
}

/// A ref whose publication waits to be tried again.
#[derive(Debug, Clone, Copy)]
struct Retry {
    due: Instant,
    wait: Duration,
}

/// The plan comment last put on a pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Commented {
    id: u64,
    fingerprint: String,
}

/// What the publisher knows of which pull requests are open (see the module's docs).
#[derive(Debug, Default)]
struct PullRequests {
    /// When the open ones were last listed (`None`: never yet).
    listed: Option<Instant>,
    open: BTreeSet<u64>,
    /// Judged not open, with the head their ref had then (`None`: unknown, a webhook said).
    closed: HashMap<u64, Option<String>>,
    /// The forge refused the last listing (the token may not list pull requests): every one
    /// is taken for open until the next listing.
    blind: bool,
    /// Judged closed before the last listing, open in it: to be published.
    reopened: Vec<u64>,
}

/// The publisher's memory.
struct Publisher {
    forge: Arc<dyn Forge>,
    store: Store,
    /// Per head, the status last set on it (state and description: the link differs per ref).
    statuses: HashMap<String, (State, String)>,
    /// Per pull request, the comment last put on it.
    comments: HashMap<u64, Commented>,
    pull_requests: PullRequests,
    retries: BTreeMap<String, Retry>,
    first_retry: Duration,
    last_retry: Duration,
    max_age: Duration,
}

impl Publisher {
    fn new(forge: Arc<dyn Forge>, store: Store) -> Publisher {
        Publisher {
            forge,
            store,
            statuses: HashMap::new(),
            comments: HashMap::new(),
            pull_requests: PullRequests::default(),
            retries: BTreeMap::new(),
            first_retry: FIRST_RETRY,
            last_retry: LAST_RETRY,
            max_age: OPEN_PULL_REQUESTS_MAX_AGE,
        }
    }

    /// When the next retry is due.
    fn next_due(&self) -> Option<Instant> {
        self.retries.values().map(|r| r.due).min()
    }

    fn changed(&mut self, source: &dyn Source, event: &PlanEvent, now: Instant) {
        match event.change {
            PlanChange::Updated => self.publish_ref(source, &event.name, false, now),
            PlanChange::Removed => {
                self.retries.remove(&event.name);
                if let Some(number) = event.pull_request {
                    self.comments.remove(&number);
                    self.pull_requests.closed.remove(&number);
                }
            }
        }
    }

    /// Every plan, as a receiver that fell behind must: what did not change is not sent.
    fn all(&mut self, source: &dyn Source, now: Instant) {
        for subject in source.list() {
            self.publish(source, subject, false, now);
        }
    }

    /// Pull request `number`'s comment again, whatever was published before: a webhook said
    /// it was opened, pushed to or reopened, so it is open.
    fn republish(&mut self, source: &dyn Source, number: u64, now: Instant) {
        self.pull_requests.open.insert(number);
        self.pull_requests.closed.remove(&number);
        let subjects = of_pull_request(source, number);
        if subjects.is_empty() {
            tracing::debug!(
                pull_request = number,
                "a webhook asks for a pull request that has no plan yet; it is published once planned"
            );
        }
        for subject in subjects {
            self.publish(source, subject, true, now);
        }
    }

    /// A webhook said pull request `number` was closed or merged.
    fn closed(&mut self, source: &dyn Source, number: u64) {
        self.pull_requests.open.remove(&number);
        let head = of_pull_request(source, number)
            .into_iter()
            .next()
            .map(|s| s.head);
        self.pull_requests.closed.insert(number, head);
        tracing::debug!(
            pull_request = number,
            "pull request closed; nothing is written on it any more"
        );
    }

    fn retry_due(&mut self, source: &dyn Source, now: Instant) {
        let due: Vec<String> = self
            .retries
            .iter()
            .filter(|(_, r)| r.due <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in due {
            self.publish_ref(source, &name, false, now);
        }
    }

    fn publish_ref(&mut self, source: &dyn Source, name: &str, force: bool, now: Instant) {
        match source.get(name) {
            Some(subject) => self.publish(source, subject, force, now),
            None => {
                self.retries.remove(name);
            }
        }
    }

    /// Sets the status of the subject's head and puts its comment, unless published already
    /// (`force`: the comment even then), and only on an open pull request. A failure that
    /// retrying can help is tried again later. Then the plans of pull requests a new listing
    /// found open again.
    fn publish(&mut self, source: &dyn Source, subject: Subject, force: bool, now: Instant) {
        self.publish_one(source, subject, force, now);
        while let Some(number) = self.pull_requests.reopened.pop() {
            for subject in of_pull_request(source, number) {
                self.publish_one(source, subject, false, now);
            }
        }
    }

    fn publish_one(&mut self, source: &dyn Source, subject: Subject, force: bool, now: Instant) {
        let said = (subject.status.state, subject.status.description.clone());
        let status_due = self.statuses.get(&subject.head) != Some(&said);
        let known = subject
            .pull_request
            .and_then(|number| self.comments.get(&number));
        let comment_due = subject.pull_request.is_some()
            && (force || known.map(|c| &c.fingerprint) != Some(&subject.fingerprint));
        // A webhook's republish looks for the comment: it may have been deleted.
        let mut comment_at = match known {
            Some(known) if !force => forge::CommentAt::Id(known.id),
            _ => forge::CommentAt::Unknown,
        };
        if !status_due && !comment_due {
            self.retries.remove(&subject.name);
            return;
        }
        if let Some(number) = subject.pull_request {
            match self.is_open(source, number, &subject.head, now) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(r#ref = %subject.name, pull_request = number, "not an open pull request; its plan is not published");
                    self.retries.remove(&subject.name);
                    return;
                }
                Err(error) => {
                    self.failed(&subject, &error, now);
                    return;
                }
            }
            // Its id not known (the first publication on it since the daemon started, or a
            // webhook's: it may have been deleted), the comment is looked for once. One that
            // says this plan already was put after this plan's status (a comment waits for
            // its status): neither is written again.
            if comment_due && comment_at == forge::CommentAt::Unknown {
                match self.forge.find_plan_comment(number) {
                    Ok(Some(found)) if found.fingerprint.as_ref() == Some(&subject.fingerprint) => {
                        tracing::info!(r#ref = %subject.name, pull_request = number, comment = found.id, "the plan comment says this plan already");
                        if status_due {
                            self.remember_status(&subject.head, said);
                        }
                        self.comments.insert(
                            number,
                            Commented {
                                id: found.id,
                                fingerprint: subject.fingerprint.clone(),
                            },
                        );
                        self.published(&subject, "unchanged");
                        self.retries.remove(&subject.name);
                        return;
                    }
                    Ok(Some(found)) => comment_at = forge::CommentAt::Id(found.id),
                    Ok(None) => comment_at = forge::CommentAt::Nowhere,
                    Err(error) => {
                        self.failed(&subject, &error, now);
                        return;
                    }
                }
            }
        }
        if status_due {
            match self.forge.set_commit_status(&subject.head, &subject.status) {
                Ok(()) => {
                    self.remember_status(&subject.head, said);
                    tracing::info!(r#ref = %subject.name, head = %subject.head, state = ?subject.status.state, description = %subject.status.description, "commit status set");
                    self.published(&subject, "status");
                }
                // The comment waits: one that says a plan implies that its status was set.
                Err(error) => {
                    self.failed(&subject, &error, now);
                    return;
                }
            }
        }
        if let Some(number) = subject.pull_request
            && comment_due
        {
            let render = subject.render.clone();
            let render = move |budget| render(budget);
            let comment = forge::PlanComment {
                fingerprint: &subject.fingerprint,
                at: comment_at,
                render: &render,
            };
            match self.forge.upsert_plan_comment(number, &comment) {
                Ok(outcome) => {
                    let (what, id) = match outcome {
                        CommentOutcome::Created(id) => ("created", id),
                        CommentOutcome::Updated(id) => ("updated", id),
                        CommentOutcome::Unchanged(id) => ("unchanged", id),
                    };
                    self.comments.insert(
                        number,
                        Commented {
                            id,
                            fingerprint: subject.fingerprint.clone(),
                        },
                    );
                    tracing::info!(r#ref = %subject.name, pull_request = number, comment = id, what, "plan comment published");
                    self.published(&subject, what);
                }
                Err(error) => {
                    self.failed(&subject, &error, now);
                    return;
                }
            }
        }
        self.retries.remove(&subject.name);
    }

    fn remember_status(&mut self, head: &str, said: (State, String)) {
        if self.statuses.len() >= REMEMBERED_HEADS {
            self.statuses.clear();
        }
        self.statuses.insert(head.to_owned(), said);
    }

    /// Whether pull request `number` (its ref at `head`) is open, as far as the forge said;
    /// asks it only when it does not know (see the module's docs). An error is one that
    /// retrying may help.
    fn is_open(
        &mut self,
        source: &dyn Source,
        number: u64,
        head: &str,
        now: Instant,
    ) -> forge::Result<bool> {
        let stale = self
            .pull_requests
            .listed
            .is_none_or(|at| now.saturating_duration_since(at) >= self.max_age);
        if stale {
            self.list_open(source, now)?;
        }
        let known = &self.pull_requests;
        if known.blind {
            return Ok(true);
        }
        if known.open.contains(&number) {
            return Ok(true);
        }
        if known
            .closed
            .get(&number)
            .is_some_and(|at| at.as_deref() == Some(head))
        {
            return Ok(false);
        }
        // Opened since the listing, or its ref moved (a reopened pull request's does).
        let open = match self.forge.pull_request(number) {
            Ok(pull) => pull.is_open(),
            Err(error) if error.is_retryable() => return Err(error),
            Err(forge::Error::Status { status: 404, .. }) => false,
            Err(error) => {
                tracing::warn!(pull_request = number, %error, "cannot tell whether the pull request is open; taken for open");
                true
            }
        };
        if open {
            self.pull_requests.open.insert(number);
            self.pull_requests.closed.remove(&number);
        } else {
            self.pull_requests
                .closed
                .insert(number, Some(head.to_owned()));
        }
        Ok(open)
    }

    /// Lists the open pull requests again, judging every other pull-request ref of the
    /// repository closed at its head; those open now that were not are published.
    fn list_open(&mut self, source: &dyn Source, now: Instant) -> forge::Result<()> {
        // The refs first: a ref there before the listing is of a pull request the listing
        // knows.
        let heads = source.pull_request_heads();
        let open = match self.forge.open_pull_requests() {
            Ok(open) => open,
            Err(error) if error.is_retryable() => return Err(error),
            Err(error) => {
                tracing::error!(%error, retry_in = %humantime::format_duration(self.max_age), "cannot list the open pull requests; until they can be, every watched pull request is taken for open (closed ones too)");
                self.pull_requests = PullRequests {
                    listed: Some(now),
                    blind: true,
                    ..PullRequests::default()
                };
                return Ok(());
            }
        };
        let reopened: Vec<u64> = open
            .iter()
            .filter(|n| self.pull_requests.closed.contains_key(n))
            .copied()
            .collect();
        let closed: HashMap<u64, Option<String>> = heads
            .into_iter()
            .filter(|(n, _)| !open.contains(n))
            .map(|(n, head)| (n, Some(head)))
            .collect();
        tracing::info!(
            open = open.len(),
            closed = closed.len(),
            "open pull requests listed"
        );
        self.pull_requests = PullRequests {
            listed: Some(now),
            open,
            closed,
            blind: false,
            reopened,
        };
        Ok(())
    }

    fn published(&self, subject: &Subject, what: &str) {
        self.store.metrics.forge_publications.inc();
        self.store.apply(Fact::ForgePublished(Published {
            name: subject.name.clone(),
            head: subject.head.clone(),
            pull_request: subject.pull_request,
            what: what.to_owned(),
            at: crate::cutover::now(),
        }));
    }

    fn failed(&mut self, subject: &Subject, error: &forge::Error, now: Instant) {
        let retrying = error.is_retryable();
        self.store.metrics.forge_publish_failures.inc();
        if retrying {
            let wait = self
                .retries
                .get(&subject.name)
                .map_or(self.first_retry, |r| (r.wait * 2).min(self.last_retry));
            self.retries.insert(
                subject.name.clone(),
                Retry {
                    due: now + wait,
                    wait,
                },
            );
            tracing::warn!(r#ref = %subject.name, pull_request = subject.pull_request, %error, retry_in = %humantime::format_duration(wait), "cannot publish the plan on the forge; trying again later");
        } else {
            self.retries.remove(&subject.name);
            tracing::error!(r#ref = %subject.name, pull_request = subject.pull_request, %error, "cannot publish the plan on the forge; trying again when the plan changes");
        }
        self.store.apply(Fact::ForgeFailed(Failed {
            name: subject.name.clone(),
            pull_request: subject.pull_request,
            message: error.to_string(),
            retrying,
            at: crate::cutover::now(),
        }));
    }
}

/// Connects to the forge of the daemon's configuration (reading its token file: a missing or
/// empty one is an error naming it) and starts the publisher; `None` without a forge.
pub(crate) fn start(context: &Arc<Context>) -> Result<Option<super::Running>, Error> {
    let Some(config) = &context.config.forge else {
        return Ok(None);
    };
    let clock = Arc::new(forge::StoppableClock::default());
    let forge: Arc<dyn Forge> =
        forge::connect_with(config, forge::Settings::default(), clock.clone())?.into();
    context.store.apply(Fact::ForgeConnected {
        kind: config.kind.to_string(),
        repo: config.repo.clone(),
    });
    let events = context.plans.subscribe();
    let requests = context.publish.mailbox.attach();
    tracing::info!(forge = %config.kind, url = %config.api_url(), repo = %config.repo, "publishing plans on the forge");
    let thread = crate::daemon::spawn(
        &context.threads,
        "publish",
        crate::daemon::health::Kind::Essential,
        {
            let context = context.clone();
            move || run(&context, forge, events, requests)
        },
    )?;
    let detach = {
        let context = context.clone();
        move || context.publish.mailbox.detach()
    };
    Ok(Some(super::Running::new(thread, clock, detach)))
}

/// What woke the publisher.
enum Wake {
    Plan(PlanEvent),
    Lagged(u64),
    Request(Request),
    Due,
    Stop,
}

fn run(
    context: &Arc<Context>,
    forge: Arc<dyn Forge>,
    mut events: tokio::sync::broadcast::Receiver<PlanEvent>,
    mut requests: UnboundedReceiver<Request>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the forge publisher; plans are not published");
            return;
        }
    };
    let kind = forge.kind();
    let mut publisher = Publisher::new(forge, context.store.clone());
    let public_url = context.config.public_url.as_deref();
    let source = PlansSource {
        context,
        plans: &context.plans,
        kind,
        public_url,
    };
    loop {
        let due = publisher.next_due();
        let wake = runtime.block_on(async {
            let retry = async {
                match due {
                    Some(due) => tokio::time::sleep_until(due.into()).await,
                    None => std::future::pending().await,
                }
            };
            // Requests first: a webhook's republish is sent before its answer.
            tokio::select! {
                biased;
                request = requests.recv() => request.map_or(Wake::Stop, Wake::Request),
                event = events.recv() => match event {
                    Ok(event) => Wake::Plan(event),
                    Err(RecvError::Lagged(skipped)) => Wake::Lagged(skipped),
                    Err(RecvError::Closed) => Wake::Stop,
                },
                () = retry => Wake::Due,
            }
        });
        if context.is_stopping() {
            break;
        }
        let _busy = context.threads.busy("a publication on the forge");
        let now = Instant::now();
        match wake {
            Wake::Plan(event) => publisher.changed(&source, &event, now),
            Wake::Lagged(skipped) => {
                tracing::warn!(
                    skipped,
                    "the forge publisher fell behind the plans; publishing every plan"
                );
                publisher.all(&source, now);
            }
            Wake::Request(Request::Republish(number)) => {
                publisher.republish(&source, number, now);
            }
            Wake::Request(Request::Closed(number)) => publisher.closed(&source, number),
            Wake::Request(Request::Signature) => {
                let signature = context.store.read().signature.clone();
                if let Some(subject) =
                    signature.and_then(|s| refused_head(&context.config.branch, &s))
                {
                    publisher.publish(&source, subject, false, now);
                }
            }
            Wake::Due => publisher.retry_due(&source, now),
            Wake::Stop => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A forge that records what it is asked and answers as told. Its open pull requests are
    /// [`Recording::open`].
    #[derive(Debug, Default)]
    struct Recording {
        calls: Mutex<Vec<String>>,
        /// What to answer the next calls with, in order (`Ok`: as usual).
        answers: Mutex<Vec<forge::Result<()>>>,
        open: Mutex<BTreeSet<u64>>,
        /// The comments put: their id and fingerprint, by pull request.
        comments: Mutex<BTreeMap<u64, (u64, String)>>,
    }

    impl Recording {
        fn calls(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }

        fn answer_next(&self, answer: forge::Result<()>) {
            self.answers.lock().unwrap().push(answer);
        }

        fn set_open(&self, numbers: &[u64]) {
            *self.open.lock().unwrap() = numbers.iter().copied().collect();
        }

        fn answer(&self, call: String) -> forge::Result<()> {
            self.calls.lock().unwrap().push(call);
            let mut answers = self.answers.lock().unwrap();
            if answers.is_empty() {
                Ok(())
            } else {
                answers.remove(0)
            }
        }
    }

    impl Forge for Recording {
        fn kind(&self) -> forge::Kind {
            forge::Kind::GitHub
        }

        fn pull_request(&self, number: u64) -> forge::Result<forge::PullRequest> {
            self.answer(format!("pull request {number}"))?;
            let state = if self.open.lock().unwrap().contains(&number) {
                forge::PullRequestState::Open
            } else {
                forge::PullRequestState::Closed
            };
            Ok(forge::PullRequest {
                state,
                labels: Vec::new(),
                head: None,
            })
        }

        fn open_pull_requests(&self) -> forge::Result<BTreeSet<u64>> {
            self.answer("list open".into())?;
            Ok(self.open.lock().unwrap().clone())
        }

        fn find_plan_comment(&self, number: u64) -> forge::Result<Option<forge::FoundComment>> {
            self.answer(format!("find comment {number}"))?;
            let comments = self.comments.lock().unwrap();
            Ok(comments
                .get(&number)
                .map(|(id, fingerprint)| forge::FoundComment {
                    id: *id,
                    fingerprint: Some(fingerprint.clone()),
                }))
        }

        fn upsert_plan_comment(
            &self,
            number: u64,
            comment: &forge::PlanComment<'_>,
        ) -> forge::Result<CommentOutcome> {
            let text = (comment.render)(forge::Kind::GitHub.comment_limit());
            let (by, id) = match comment.at {
                forge::CommentAt::Id(id) => (format!(" (id {id})"), id),
                forge::CommentAt::Nowhere => (" (new)".to_owned(), number * 100),
                forge::CommentAt::Unknown => (String::new(), number * 100),
            };
            self.answer(format!("comment {number}{by}: {text}"))?;
            self.comments
                .lock()
                .unwrap()
                .insert(number, (id, comment.fingerprint.to_owned()));
            Ok(CommentOutcome::Updated(id))
        }

        fn set_commit_status(&self, sha: &str, status: &CommitStatus) -> forge::Result<()> {
            self.answer(format!("status {sha}: {}", status.description))
        }

        fn remove_label(&self, number: u64, label: &str) -> forge::Result<()> {
            self.answer(format!("remove label {label} from {number}"))
        }
    }

    /// Plans by ref; a plan's text is its fingerprint too.
    #[derive(Default)]
    struct Book(Mutex<BTreeMap<String, Subject>>);

    impl Book {
        fn put(&self, name: &str, head: &str, text: &str) {
            let rendered = text.to_owned();
            self.0.lock().unwrap().insert(
                name.to_owned(),
                Subject {
                    name: name.to_owned(),
                    head: head.to_owned(),
                    pull_request: forge::pull_request_of_ref(name),
                    status: CommitStatus::new(State::Success, format!("ok {text}")),
                    fingerprint: text.to_owned(),
                    render: Arc::new(move |_| rendered.clone()),
                },
            );
        }
    }

    impl Source for Book {
        fn get(&self, name: &str) -> Option<Subject> {
            self.0.lock().unwrap().get(name).cloned()
        }

        fn list(&self) -> Vec<Subject> {
            self.0.lock().unwrap().values().cloned().collect()
        }

        fn pull_request_heads(&self) -> BTreeMap<u64, String> {
            self.list()
                .into_iter()
                .filter_map(|s| Some((s.pull_request?, s.head)))
                .collect()
        }
    }

    fn updated(name: &str) -> PlanEvent {
        PlanEvent {
            name: name.to_owned(),
            change: PlanChange::Updated,
            head: None,
            valid: true,
            pull_request: forge::pull_request_of_ref(name),
        }
    }

    fn server_error() -> forge::Error {
        forge::Error::Status {
            method: ureq::http::Method::POST,
            url: "http://forge/x".into(),
            status: 502,
            message: "bad gateway".into(),
            wait: None,
            rate_limited: false,
        }
    }

    /// A publisher whose forge has pull requests 1 to 9 open.
    fn setup() -> (Arc<Recording>, Publisher, Book) {
        let forge = Arc::new(Recording::default());
        forge.set_open(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let publisher = Publisher::new(forge.clone(), Store::default());
        (forge, publisher, Book::default())
    }

    /// Has the open pull requests listed (as the first publication on a pull request does).
    fn listed(forge: &Recording, publisher: &mut Publisher, now: Instant) {
        publisher.list_open(&Book::default(), now).unwrap();
        assert_eq!(forge.calls(), ["list open"]);
    }

    #[test]
    fn a_branch_and_its_pull_request_share_one_status_and_a_comment_is_sent_once_per_plan() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/heads/feature", "aaa", "plan A");
        book.put("refs/pull/7/head", "aaa", "plan A");
        publisher.changed(&book, &updated("refs/heads/feature"), now);
        publisher.changed(&book, &updated("refs/pull/7/head"), now);
        assert_eq!(
            forge.calls(),
            [
                "status aaa: ok plan A",
                "list open",
                "find comment 7",
                "comment 7 (new): plan A"
            ],
            "one status for the shared head"
        );
        publisher.changed(&book, &updated("refs/pull/7/head"), now);
        assert!(forge.calls().is_empty(), "nothing changed");
        book.put("refs/pull/7/head", "bbb", "plan B");
        publisher.changed(&book, &updated("refs/pull/7/head"), now);
        assert_eq!(
            forge.calls(),
            ["status bbb: ok plan B", "comment 7 (id 700): plan B"],
            "the comment is updated by its id"
        );
        // A webhook: the comment looked for again (it may be gone); it says the plan, so
        // nothing is written (nor is the status: nobody can delete it).
        publisher.republish(&book, 7, now);
        assert_eq!(forge.calls(), ["find comment 7"]);
        forge.comments.lock().unwrap().clear();
        publisher.republish(&book, 7, now);
        assert_eq!(
            forge.calls(),
            ["find comment 7", "comment 7 (new): plan B"],
            "a deleted comment comes back"
        );
        publisher.republish(&book, 8, now);
        assert!(forge.calls().is_empty(), "no plan of pull request 8");
        assert_eq!(publisher.store.metrics.forge_publications.get(), 6);
    }

    #[test]
    fn closed_pull_requests_get_no_writes_and_open_ones_only_when_their_plan_changed() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/pull/7/head", "a7", "plan 7");
        book.put("refs/pull/8/head", "a8", "plan 8");
        for closed in 10..60 {
            book.put(
                &format!("refs/pull/{closed}/head"),
                &format!("c{closed}"),
                "old",
            );
        }
        publisher.all(&book, now);
        assert_eq!(
            forge.calls(),
            [
                "list open",
                "find comment 7",
                "status a7: ok plan 7",
                "comment 7 (new): plan 7",
                "find comment 8",
                "status a8: ok plan 8",
                "comment 8 (new): plan 8",
            ],
            "listed once, then only the open pull requests"
        );
        // The branch moves: the closed pull requests' plans change, 7's does not, 8's does.
        for closed in 10..60 {
            book.put(
                &format!("refs/pull/{closed}/head"),
                &format!("c{closed}"),
                "new",
            );
            publisher.changed(&book, &updated(&format!("refs/pull/{closed}/head")), now);
        }
        publisher.changed(&book, &updated("refs/pull/7/head"), now);
        book.put("refs/pull/8/head", "a8", "plan 8 conflicts");
        publisher.changed(&book, &updated("refs/pull/8/head"), now);
        assert_eq!(
            forge.calls(),
            [
                "status a8: ok plan 8 conflicts",
                "comment 8 (id 800): plan 8 conflicts"
            ]
        );
    }

    #[test]
    fn a_pull_request_opened_after_the_listing_or_whose_ref_moved_is_asked_about_alone() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/pull/7/head", "a7", "plan 7");
        book.put("refs/pull/10/head", "c10", "closed");
        publisher.all(&book, now);
        assert_eq!(
            forge.calls(),
            [
                "list open",
                "find comment 7",
                "status a7: ok plan 7",
                "comment 7 (new): plan 7"
            ]
        );
        // Opened since: asked about once, then known.
        forge.set_open(&[7, 20]);
        book.put("refs/pull/20/head", "a20", "plan 20");
        publisher.changed(&book, &updated("refs/pull/20/head"), now);
        assert_eq!(
            forge.calls(),
            [
                "pull request 20",
                "find comment 20",
                "status a20: ok plan 20",
                "comment 20 (new): plan 20"
            ]
        );
        // Closed 10's ref moves: asked about again, still closed; at the same head, never.
        book.put("refs/pull/10/head", "c10b", "closed, moved");
        publisher.changed(&book, &updated("refs/pull/10/head"), now);
        book.put("refs/pull/10/head", "c10b", "closed, moved, plan changed");
        publisher.changed(&book, &updated("refs/pull/10/head"), now);
        assert_eq!(forge.calls(), ["pull request 10"]);
    }

    #[test]
    fn webhooks_close_and_reopen_a_pull_request_and_an_old_listing_is_read_again() {
        let (forge, mut publisher, book) = setup();
        let start = Instant::now();
        book.put("refs/pull/7/head", "a7", "plan 7");
        book.put("refs/pull/8/head", "a8", "plan 8");
        book.put("refs/pull/10/head", "c10", "closed");
        publisher.all(&book, start);
        forge.calls();
        // Closed by a webhook: its plan changing writes nothing, asks nothing.
        publisher.closed(&book, 7);
        book.put("refs/pull/7/head", "a7", "plan 7, rebased");
        publisher.changed(&book, &updated("refs/pull/7/head"), start);
        assert!(forge.calls().is_empty());
        // Reopened (a webhook's republish): published.
        publisher.republish(&book, 7, start);
        assert_eq!(
            forge.calls(),
            [
                "find comment 7",
                "status a7: ok plan 7, rebased",
                "comment 7 (id 700): plan 7, rebased"
            ]
        );
        // Later, 8 closed and 10 reopened without a webhook saying so: a write after the
        // listing got old lists again first, skips 8 and publishes 10.
        forge.set_open(&[7, 10]);
        let later = start + OPEN_PULL_REQUESTS_MAX_AGE;
        book.put("refs/pull/8/head", "a8", "plan 8, rebased");
        publisher.changed(&book, &updated("refs/pull/8/head"), later);
        assert_eq!(
            forge.calls(),
            [
                "list open",
                "find comment 10",
                "status c10: ok closed",
                "comment 10 (new): closed"
            ]
        );
    }

    #[test]
    fn a_forge_that_will_not_list_pull_requests_gets_every_plan_until_it_will() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        forge.answer_next(Err(forge::Error::Status {
            method: ureq::http::Method::GET,
            url: "http://forge/pulls".into(),
            status: 403,
            message: "Resource not accessible by integration".into(),
            wait: None,
            rate_limited: false,
        }));
        book.put("refs/pull/10/head", "c10", "closed");
        book.put("refs/pull/11/head", "c11", "closed");
        publisher.all(&book, now);
        assert_eq!(
            forge.calls(),
            [
                "list open",
                "find comment 10",
                "status c10: ok closed",
                "comment 10 (new): closed",
                "find comment 11",
                "status c11: ok closed",
                "comment 11 (new): closed"
            ],
            "listed once, then taken for open"
        );
        // Once the listing is old, it is tried again: then the closed ones get nothing.
        forge.set_open(&[]);
        book.put("refs/pull/10/head", "c10", "closed, changed");
        publisher.changed(
            &book,
            &updated("refs/pull/10/head"),
            now + OPEN_PULL_REQUESTS_MAX_AGE,
        );
        assert_eq!(forge.calls(), ["list open"]);
        // A listing that may work later: the publication is tried again then.
        let (forge, mut publisher, book) = setup();
        book.put("refs/pull/7/head", "a7", "plan 7");
        forge.answer_next(Err(server_error()));
        publisher.all(&book, now);
        assert_eq!(forge.calls(), ["list open"]);
        assert_eq!(publisher.next_due(), Some(now + FIRST_RETRY));
        publisher.retry_due(&book, now + FIRST_RETRY);
        assert_eq!(
            forge.calls(),
            [
                "list open",
                "find comment 7",
                "status a7: ok plan 7",
                "comment 7 (new): plan 7"
            ]
        );
    }

    #[test]
    fn a_retryable_failure_is_tried_again_later_with_the_newest_plan_and_backs_off() {
        let (forge, mut publisher, book) = setup();
        let start = Instant::now();
        book.put("refs/pull/1/head", "aaa", "first");
        listed(&forge, &mut publisher, start);
        forge.answer_next(Err(server_error()));
        publisher.changed(&book, &updated("refs/pull/1/head"), start);
        assert_eq!(forge.calls(), ["find comment 1"]);
        assert_eq!(publisher.next_due(), Some(start + FIRST_RETRY));
        publisher.retry_due(&book, start + FIRST_RETRY / 2);
        assert!(forge.calls().is_empty(), "not due yet");
        // The plan moved meanwhile: the retry publishes the newest. Its status fails: the
        // comment waits for it (a comment that says a plan implies its status was set).
        book.put("refs/pull/1/head", "bbb", "second");
        forge.answer_next(Ok(()));
        forge.answer_next(Err(server_error()));
        let first_retry = start + FIRST_RETRY;
        publisher.retry_due(&book, first_retry);
        assert_eq!(forge.calls(), ["find comment 1", "status bbb: ok second"]);
        assert_eq!(
            publisher.next_due(),
            Some(first_retry + FIRST_RETRY * 2),
            "the wait doubles"
        );
        // The comment failing after the status: the status is not set again.
        forge.answer_next(Ok(()));
        forge.answer_next(Ok(()));
        forge.answer_next(Err(server_error()));
        let second_retry = first_retry + FIRST_RETRY * 2;
        publisher.retry_due(&book, second_retry);
        assert_eq!(
            forge.calls(),
            [
                "find comment 1",
                "status bbb: ok second",
                "comment 1 (new): second"
            ]
        );
        let third_retry = second_retry + FIRST_RETRY * 4;
        assert_eq!(publisher.next_due(), Some(third_retry));
        publisher.retry_due(&book, third_retry);
        assert_eq!(
            forge.calls(),
            ["find comment 1", "comment 1 (new): second"],
            "the status that was set is not set again; the comment is looked for (the failed \
             attempt may have made it)"
        );
        assert_eq!(publisher.next_due(), None);
        let status = publisher.store.read().forge.clone().unwrap();
        assert_eq!(status.failures, 3, "three publications failed");
        assert!(status.last_error.unwrap().retrying);
    }

    #[test]
    fn a_failure_retrying_cannot_help_waits_for_the_plan_to_change() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/pull/2/head", "aaa", "plan");
        listed(&forge, &mut publisher, now);
        forge.answer_next(Ok(()));
        forge.answer_next(Err(forge::Error::Status {
            method: ureq::http::Method::POST,
            url: "http://forge/x".into(),
            status: 404,
            message: "Not Found".into(),
            wait: None,
            rate_limited: false,
        }));
        publisher.changed(&book, &updated("refs/pull/2/head"), now);
        assert_eq!(forge.calls(), ["find comment 2", "status aaa: ok plan"]);
        assert_eq!(publisher.next_due(), None, "never retried by itself");
        assert_eq!(publisher.store.metrics.forge_publish_failures.get(), 1);
        book.put("refs/pull/2/head", "bbb", "moved");
        publisher.changed(&book, &updated("refs/pull/2/head"), now);
        assert_eq!(
            forge.calls(),
            [
                "find comment 2",
                "status bbb: ok moved",
                "comment 2 (new): moved"
            ]
        );
    }

    #[test]
    fn a_removed_ref_is_forgotten() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/pull/3/head", "aaa", "plan");
        listed(&forge, &mut publisher, now);
        forge.answer_next(Err(server_error()));
        publisher.changed(&book, &updated("refs/pull/3/head"), now);
        forge.calls();
        book.0.lock().unwrap().clear();
        let mut removed = updated("refs/pull/3/head");
        removed.change = PlanChange::Removed;
        publisher.changed(&book, &removed, now);
        assert_eq!(publisher.next_due(), None);
        // Back with the same plan: published (nothing of it was).
        book.put("refs/pull/3/head", "aaa", "plan");
        publisher.all(&book, now);
        assert_eq!(
            forge.calls(),
            [
                "find comment 3",
                "status aaa: ok plan",
                "comment 3 (new): plan"
            ]
        );
    }

    #[test]
    fn a_restarted_publisher_writes_nothing_where_the_comment_says_the_plan_already() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/pull/7/head", "a7", "plan 7");
        book.put("refs/pull/8/head", "a8", "plan 8");
        publisher.all(&book, now);
        forge.calls();
        // Another publisher (the daemon restarted), and 8's plan changed meanwhile.
        let mut restarted = Publisher::new(forge.clone(), Store::default());
        book.put("refs/pull/8/head", "a8", "plan 8, conflicts");
        restarted.all(&book, now);
        assert_eq!(
            forge.calls(),
            [
                "list open",
                "find comment 7",
                "find comment 8",
                "status a8: ok plan 8, conflicts",
                "comment 8 (id 800): plan 8, conflicts"
            ]
        );
        restarted.all(&book, now);
        assert!(forge.calls().is_empty(), "all remembered");
    }

    fn webhook(headers: &[(&str, &str)], body: &str) -> Option<u64> {
        let headers: BTreeMap<String, String> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        webhook_pull_request(
            |name| headers.get(name).map(String::as_str),
            body.as_bytes(),
        )
    }

    #[test]
    fn pull_request_webhooks_of_both_forges_name_their_pull_request() {
        let github = [("x-github-event", "pull_request")];
        for action in ["opened", "synchronize", "reopened"] {
            let body = format!(r#"{{"action":"{action}","number":12,"pull_request":{{}}}}"#);
            assert_eq!(webhook(&github, &body), Some(12), "{action}");
        }
        assert_eq!(webhook(&github, r#"{"action":"closed","number":12}"#), None);
        assert_eq!(webhook(&github, "not json"), None);
        let push = [("x-github-event", "push")];
        assert_eq!(webhook(&push, r#"{"action":"opened","number":1}"#), None);
        let gitlab = [("x-gitlab-event", "Merge Request Hook")];
        for action in ["open", "update", "reopen"] {
            let body = format!(
                r#"{{"object_kind":"merge_request","object_attributes":{{"iid":4,"action":"{action}"}}}}"#
            );
            assert_eq!(webhook(&gitlab, &body), Some(4), "{action}");
        }
        let merged = r#"{"object_attributes":{"iid":4,"action":"merge"}}"#;
        assert_eq!(webhook(&gitlab, merged), None);
        assert_eq!(webhook(&[], r#"{"action":"opened","number":1}"#), None);
    }

    #[test]
    fn labels_closes_and_merges_ask_for_the_preview_again() {
        let changed = |headers: &[(&str, &str)], body: &str| {
            let headers: BTreeMap<String, String> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            webhook_pull_request_changed(
                |name| headers.get(name).map(String::as_str),
                body.as_bytes(),
            )
        };
        let github = [("x-github-event", "pull_request")];
        for action in ["labeled", "unlabeled", "closed", "opened", "synchronize"] {
            let body = format!(r#"{{"action":"{action}","number":12}}"#);
            assert_eq!(changed(&github, &body), Some(12), "{action}");
        }
        // A label is not the plan: the comment is not published again for it.
        assert_eq!(
            webhook(&github, r#"{"action":"labeled","number":12}"#),
            None
        );
        assert_eq!(
            changed(&github, r#"{"action":"assigned","number":12}"#),
            None
        );
        let gitlab = [("x-gitlab-event", "Merge Request Hook")];
        for action in ["update", "close", "merge", "reopen"] {
            let body = format!(r#"{{"object_attributes":{{"iid":4,"action":"{action}"}}}}"#);
            assert_eq!(changed(&gitlab, &body), Some(4), "{action}");
        }
        assert_eq!(
            changed(
                &gitlab,
                r#"{"object_attributes":{"iid":4,"action":"approved"}}"#
            ),
            None
        );
    }

    #[test]
    fn closes_and_merges_of_both_forges_name_their_pull_request() {
        let closed = |headers: &[(&str, &str)], body: &str| {
            let headers: BTreeMap<String, String> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            webhook_pull_request_closed(
                |name| headers.get(name).map(String::as_str),
                body.as_bytes(),
            )
        };
        let github = [("x-github-event", "pull_request")];
        assert_eq!(
            closed(&github, r#"{"action":"closed","number":12}"#),
            Some(12)
        );
        for action in ["opened", "reopened", "synchronize", "labeled"] {
            let body = format!(r#"{{"action":"{action}","number":12}}"#);
            assert_eq!(closed(&github, &body), None, "{action}");
        }
        let gitlab = [("x-gitlab-event", "Merge Request Hook")];
        for action in ["close", "merge"] {
            let body = format!(r#"{{"object_attributes":{{"iid":4,"action":"{action}"}}}}"#);
            assert_eq!(closed(&gitlab, &body), Some(4), "{action}");
        }
        let reopened = r#"{"object_attributes":{"iid":4,"action":"reopen"}}"#;
        assert_eq!(closed(&gitlab, reopened), None);
    }

    #[test]
    fn refs_are_one_segment_of_the_status_link() {
        assert_eq!(
            encode_path_segment("refs/pull/7/head"),
            "refs%2Fpull%2F7%2Fhead"
        );
        assert_eq!(
            encode_path_segment("refs/heads/a#b"),
            "refs%2Fheads%2Fa%23b"
        );
    }
}
