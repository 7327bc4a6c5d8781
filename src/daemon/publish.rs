//! The plans of pull requests on their forge (SPEC §9): per watched ref, the commit status of
//! its head (`context: plumber`), and for a pull-request ref (`refs/pull/N/head`,
//! `refs/merge-requests/N/head`) the plan as one comment, updated in place.
//!
//! One thread, off every other path: it reads plan changes ([`super::plans::Plans::subscribe`])
//! and publishes the newest plan of the ref that changed, so a burst of pushes costs the forge
//! what the newest needs. What was published is remembered: a status once per head and text
//! (a branch and its pull-request ref share a head: one status), a comment once per text. A
//! pull-request webhook ([`webhook_pull_request`]) asks for that pull request's plan again
//! even when it did not change: someone may have deleted the comment.
//!
//! The clients retry 5xx answers and rate limits themselves; what still fails is tried again
//! here later when retrying can help ([`forge::Error::is_retryable`]), from [`FIRST_RETRY`]
//! doubling to [`LAST_RETRY`], with the newest plan of the ref at that time. Anything else is
//! logged and tried again only when the plan changes. The token never appears in a log: the
//! clients' errors blank it out.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc::UnboundedReceiver;

use super::plans::{PlanChange, PlanEvent, Plans, RefPlan};
use super::status::{Failed, ForgeStatus, Published, Store};
use super::{Context, Error};
use crate::forge::{self, CommentOutcome, CommitStatus, Forge, State};
use crate::plan::Change;

/// The first wait before a publication that failed (after the client's own retries) is tried
/// again.
pub const FIRST_RETRY: Duration = Duration::from_secs(30);
/// The longest wait between tries.
pub const LAST_RETRY: Duration = Duration::from_secs(600);

/// What remembers the published (statuses per head) may hold before it starts over: a
/// forgotten head is published once more, no harm.
const REMEMBERED_HEADS: usize = 10_000;

/// What the publisher is asked besides plan changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    /// Publish this pull request's plan again, even unchanged.
    Republish(u64),
    /// The trusted keys judged a new head of the tracked branch (`status.signature`).
    Signature,
}

/// How the API and the follower ask the publisher (a no-op without a forge).
#[derive(Default)]
pub struct Requests {
    mailbox: super::mailbox::Mailbox<Request>,
}

impl Requests {
    /// Asks for pull request `number`'s plan to be published again (never waits).
    pub fn republish(&self, number: u64) {
        self.mailbox.send(Request::Republish(number));
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
    /// The comment's text, unshortened: what tells whether it changed.
    markdown: String,
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
            markdown: plan.markdown.clone(),
            // `markdown_within` counts bytes, the forge characters: a byte budget is always
            // within the same number of characters.
            render: Arc::new(move |budget| render.markdown_within(budget)),
        }
    }
}

/// The failing commit status of a tracked-branch head the trusted keys refused (`None`
/// for a trusted head: it has no plan of its own to report).
fn refused_head(branch: &str, signature: &super::status::SignatureStatus) -> Option<Subject> {
    let status = signature.commit_status()?;
    Some(Subject {
        name: format!("refs/heads/{branch}"),
        head: signature.commit.clone(),
        pull_request: None,
        status,
        markdown: String::new(),
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
}

struct PlansSource<'a> {
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
}

/// A ref whose publication waits to be tried again.
#[derive(Debug, Clone, Copy)]
struct Retry {
    due: Instant,
    wait: Duration,
}

/// The publisher's memory.
struct Publisher {
    forge: Arc<dyn Forge>,
    store: Store,
    /// Per head, the status last set on it (state and description: the link differs per ref).
    statuses: HashMap<String, (State, String)>,
    /// Per pull request, the text of the comment last put on it.
    comments: HashMap<u64, String>,
    retries: BTreeMap<String, Retry>,
    first_retry: Duration,
    last_retry: Duration,
}

impl Publisher {
    fn new(forge: Arc<dyn Forge>, store: Store) -> Publisher {
        Publisher {
            forge,
            store,
            statuses: HashMap::new(),
            comments: HashMap::new(),
            retries: BTreeMap::new(),
            first_retry: FIRST_RETRY,
            last_retry: LAST_RETRY,
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
                }
            }
        }
    }

    /// Every plan, as a receiver that fell behind must: what did not change is not sent.
    fn all(&mut self, source: &dyn Source, now: Instant) {
        for subject in source.list() {
            self.publish(subject, false, now);
        }
    }

    /// Pull request `number`'s plan again, whatever was published before.
    fn republish(&mut self, source: &dyn Source, number: u64, now: Instant) {
        let subjects: Vec<Subject> = source
            .list()
            .into_iter()
            .filter(|s| s.pull_request == Some(number))
            .collect();
        if subjects.is_empty() {
            tracing::debug!(
                pull_request = number,
                "a webhook asks for a pull request that has no plan yet; it is published once planned"
            );
        }
        for subject in subjects {
            self.publish(subject, true, now);
        }
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
            Some(subject) => self.publish(subject, force, now),
            None => {
                self.retries.remove(name);
            }
        }
    }

    /// Sets the status of the subject's head and puts its comment, unless published already
    /// (`force`: even then). A failure that retrying can help is tried again later.
    fn publish(&mut self, subject: Subject, force: bool, now: Instant) {
        let mut failure: Option<forge::Error> = None;
        let said = (subject.status.state, subject.status.description.clone());
        if force || self.statuses.get(&subject.head) != Some(&said) {
            match self.forge.set_commit_status(&subject.head, &subject.status) {
                Ok(()) => {
                    if self.statuses.len() >= REMEMBERED_HEADS {
                        self.statuses.clear();
                    }
                    self.statuses.insert(subject.head.clone(), said);
                    tracing::info!(r#ref = %subject.name, head = %subject.head, state = ?subject.status.state, description = %subject.status.description, "commit status set");
                    self.published(&subject, "status");
                }
                Err(error) => failure = Some(error),
            }
        }
        if let Some(number) = subject.pull_request
            && (force || self.comments.get(&number) != Some(&subject.markdown))
        {
            let render = subject.render.clone();
            match self
                .forge
                .upsert_plan_comment(number, &move |budget| render(budget))
            {
                Ok(outcome) => {
                    self.comments.insert(number, subject.markdown.clone());
                    let (what, id) = match outcome {
                        CommentOutcome::Created(id) => ("created", id),
                        CommentOutcome::Updated(id) => ("updated", id),
                        CommentOutcome::Unchanged(id) => ("unchanged", id),
                    };
                    tracing::info!(r#ref = %subject.name, pull_request = number, comment = id, what, "plan comment published");
                    self.published(&subject, what);
                }
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        match failure {
            None => {
                self.retries.remove(&subject.name);
            }
            Some(error) => self.failed(&subject, &error, now),
        }
    }

    fn published(&self, subject: &Subject, what: &str) {
        self.store.metrics.forge_publications.inc();
        let mut status = self.store.write();
        let forge = status.forge.get_or_insert_with(ForgeStatus::default);
        forge.published += 1;
        forge.last_published = Some(Published {
            name: subject.name.clone(),
            head: subject.head.clone(),
            pull_request: subject.pull_request,
            what: what.to_owned(),
            at: unix_now(),
        });
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
        let mut status = self.store.write();
        let forge = status.forge.get_or_insert_with(ForgeStatus::default);
        forge.failures += 1;
        forge.last_error = Some(Failed {
            name: subject.name.clone(),
            pull_request: subject.pull_request,
            message: error.to_string(),
            retrying,
            at: unix_now(),
        });
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The running publisher; dropping it ends it (waiting for a publication in hand).
pub(super) struct Running {
    thread: Option<JoinHandle<()>>,
    clock: Arc<forge::StoppableClock>,
    context: Arc<Context>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.clock.stop();
        self.context.publish.mailbox.detach();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Connects to the forge of the daemon's configuration (reading its token file: a missing or
/// empty one is an error naming it) and starts the publisher; `None` without a forge.
pub(super) fn start(context: &Arc<Context>) -> Result<Option<Running>, Error> {
    let Some(config) = &context.config.forge else {
        return Ok(None);
    };
    let clock = Arc::new(forge::StoppableClock::default());
    let forge: Arc<dyn Forge> =
        forge::connect_with(config, forge::Settings::default(), clock.clone())?.into();
    {
        let mut status = context.store.write();
        status.forge = Some(ForgeStatus {
            kind: config.kind.to_string(),
            repo: config.repo.clone(),
            ..ForgeStatus::default()
        });
    }
    let events = context.plans.subscribe();
    let requests = context.publish.mailbox.attach();
    tracing::info!(forge = %config.kind, url = %config.api_url(), repo = %config.repo, "publishing plans on the forge");
    let thread = super::spawn(
        &context.threads,
        "publish",
        super::health::Kind::Essential,
        {
            let context = context.clone();
            move || run(&context, forge, events, requests)
        },
    )?;
    Ok(Some(Running {
        thread: Some(thread),
        clock,
        context: context.clone(),
    }))
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
            Wake::Request(Request::Signature) => {
                let signature = context.store.read().signature.clone();
                if let Some(subject) =
                    signature.and_then(|s| refused_head(&context.config.branch, &s))
                {
                    publisher.publish(subject, false, now);
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

    /// A forge that records what it is asked and fails as told.
    #[derive(Debug, Default)]
    struct Recording {
        calls: Mutex<Vec<String>>,
        /// Errors to answer the next calls with, in order.
        failures: Mutex<Vec<forge::Error>>,
    }

    impl Recording {
        fn calls(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }

        fn fail_next(&self, error: forge::Error) {
            self.failures.lock().unwrap().push(error);
        }

        fn answer(&self, call: String) -> forge::Result<()> {
            self.calls.lock().unwrap().push(call);
            let mut failures = self.failures.lock().unwrap();
            if failures.is_empty() {
                Ok(())
            } else {
                Err(failures.remove(0))
            }
        }
    }

    impl Forge for Recording {
        fn kind(&self) -> forge::Kind {
            forge::Kind::GitHub
        }

        fn pull_request(&self, number: u64) -> forge::Result<forge::PullRequest> {
            self.answer(format!("pull request {number}"))
                .map(|()| forge::PullRequest {
                    state: forge::PullRequestState::Open,
                    labels: Vec::new(),
                })
        }

        fn upsert_plan_comment(
            &self,
            number: u64,
            render: &dyn Fn(usize) -> String,
        ) -> forge::Result<CommentOutcome> {
            let text = render(forge::Kind::GitHub.comment_limit());
            self.answer(format!("comment {number}: {text}"))
                .map(|()| CommentOutcome::Updated(1))
        }

        fn set_commit_status(&self, sha: &str, status: &CommitStatus) -> forge::Result<()> {
            self.answer(format!("status {sha}: {}", status.description))
        }
    }

    #[derive(Default)]
    struct Book(Mutex<BTreeMap<String, Subject>>);

    impl Book {
        fn put(&self, name: &str, head: &str, text: &str) {
            let markdown = text.to_owned();
            let rendered = markdown.clone();
            self.0.lock().unwrap().insert(
                name.to_owned(),
                Subject {
                    name: name.to_owned(),
                    head: head.to_owned(),
                    pull_request: forge::pull_request_of_ref(name),
                    status: CommitStatus::new(State::Success, format!("ok {text}")),
                    markdown,
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

    fn setup() -> (Arc<Recording>, Publisher, Book) {
        let forge = Arc::new(Recording::default());
        let publisher = Publisher::new(forge.clone(), Store::default());
        (forge, publisher, Book::default())
    }

    #[test]
    fn a_branch_and_its_pull_request_share_one_status_and_a_comment_is_sent_once_per_text() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/heads/feature", "aaa", "plan A");
        book.put("refs/pull/7/head", "aaa", "plan A");
        publisher.changed(&book, &updated("refs/heads/feature"), now);
        publisher.changed(&book, &updated("refs/pull/7/head"), now);
        assert_eq!(
            forge.calls(),
            ["status aaa: ok plan A", "comment 7: plan A"],
            "one status for the shared head"
        );
        publisher.changed(&book, &updated("refs/pull/7/head"), now);
        assert!(forge.calls().is_empty(), "nothing changed");
        book.put("refs/pull/7/head", "bbb", "plan B");
        publisher.changed(&book, &updated("refs/pull/7/head"), now);
        assert_eq!(
            forge.calls(),
            ["status bbb: ok plan B", "comment 7: plan B"]
        );
        // A webhook: again, unchanged or not.
        publisher.republish(&book, 7, now);
        assert_eq!(
            forge.calls(),
            ["status bbb: ok plan B", "comment 7: plan B"]
        );
        publisher.republish(&book, 8, now);
        assert!(forge.calls().is_empty(), "no plan of pull request 8");
        assert_eq!(publisher.store.metrics.forge_publications.get(), 6);
    }

    #[test]
    fn a_retryable_failure_is_tried_again_later_with_the_newest_plan_and_backs_off() {
        let (forge, mut publisher, book) = setup();
        let start = Instant::now();
        book.put("refs/pull/1/head", "aaa", "first");
        forge.fail_next(server_error());
        forge.fail_next(server_error());
        publisher.changed(&book, &updated("refs/pull/1/head"), start);
        assert_eq!(
            forge.calls().len(),
            2,
            "the status and the comment were tried"
        );
        assert_eq!(publisher.next_due(), Some(start + FIRST_RETRY));
        publisher.retry_due(&book, start + FIRST_RETRY / 2);
        assert!(forge.calls().is_empty(), "not due yet");
        // The plan moved meanwhile: the retry publishes the newest.
        book.put("refs/pull/1/head", "bbb", "second");
        forge.fail_next(server_error());
        let first_retry = start + FIRST_RETRY;
        publisher.retry_due(&book, first_retry);
        assert_eq!(
            forge.calls(),
            ["status bbb: ok second", "comment 1: second"]
        );
        assert_eq!(
            publisher.next_due(),
            Some(first_retry + FIRST_RETRY * 2),
            "the wait doubles"
        );
        publisher.retry_due(&book, first_retry + FIRST_RETRY * 2);
        assert_eq!(
            forge.calls(),
            ["status bbb: ok second"],
            "the comment that was put is not put again"
        );
        assert_eq!(publisher.next_due(), None);
        let status = publisher.store.read().forge.clone().unwrap();
        assert_eq!(status.failures, 2, "two publications failed");
        assert!(status.last_error.unwrap().retrying);
    }

    #[test]
    fn a_failure_retrying_cannot_help_waits_for_the_plan_to_change() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/pull/2/head", "aaa", "plan");
        forge.fail_next(forge::Error::Status {
            method: ureq::http::Method::POST,
            url: "http://forge/x".into(),
            status: 404,
            message: "Not Found".into(),
            wait: None,
            rate_limited: false,
        });
        publisher.changed(&book, &updated("refs/pull/2/head"), now);
        assert_eq!(forge.calls().len(), 2);
        assert_eq!(publisher.next_due(), None, "never retried by itself");
        assert_eq!(publisher.store.metrics.forge_publish_failures.get(), 1);
        book.put("refs/pull/2/head", "bbb", "moved");
        publisher.changed(&book, &updated("refs/pull/2/head"), now);
        assert_eq!(forge.calls(), ["status bbb: ok moved", "comment 2: moved"]);
    }

    #[test]
    fn a_removed_ref_is_forgotten() {
        let (forge, mut publisher, book) = setup();
        let now = Instant::now();
        book.put("refs/pull/3/head", "aaa", "plan");
        forge.fail_next(server_error());
        publisher.changed(&book, &updated("refs/pull/3/head"), now);
        forge.calls();
        book.0.lock().unwrap().clear();
        let mut removed = updated("refs/pull/3/head");
        removed.change = PlanChange::Removed;
        publisher.changed(&book, &removed, now);
        assert_eq!(publisher.next_due(), None);
        // Back with the same plan: the comment is put again (the status was never set).
        book.put("refs/pull/3/head", "aaa", "plan");
        publisher.all(&book, now);
        assert_eq!(forge.calls(), ["status aaa: ok plan", "comment 3: plan"]);
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
