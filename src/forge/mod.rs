//! Clients of the forges the topology repository lives on (SPEC §9): GitHub (also Enterprise)
//! and GitLab (also self-hosted). The daemon posts each pull request's merge-preview plan as one
//! comment, updated in place on later pushes, and a commit status on its head.
//!
//! The clients are synchronous ([`ureq`]): the daemon calls them on a blocking thread. Every
//! operation is idempotent as a whole and retried as a whole (see [`Settings`]): a plan
//! comment is looked up again by its [`MARKER`] before each attempt, so an attempt whose answer
//! was lost (the comment was created, the connection broke) updates that comment instead of
//! creating a second one. A comment carries its plan's fingerprint on its second line
//! ([`fingerprint_line`]): one that has it already is not written again, whatever else
//! changed around the plan (the commit it was merged into).
//!
//! # Errors
//!
//! [`Error::is_retryable`] says whether trying again later can help: 5xx answers, rate limits
//! and broken connections can; any other 4xx cannot (the token, the repository or the request
//! is wrong), and those are never retried. The token is never logged and never in an error:
//! what a forge answers is quoted with the token blanked out.

pub mod github;
pub mod gitlab;

use std::collections::BTreeSet;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use ureq::http::{HeaderMap, Method};

/// What marks the plan comment among a pull request's comments: hidden when the markdown is
/// rendered, and at the very start of the body, so a reply quoting it (`> <!-- …`) is not
/// taken for it. Only a comment by the token's own account counts: anyone can write the
/// marker, and a plan in a comment its author can edit is not one a reviewer can trust.
pub const MARKER: &str = "<!-- plumber:plan -->";

/// The name of the commit status (GitHub's `context`, GitLab's `name`).
pub const STATUS_CONTEXT: &str = "plumber";

/// The context of the commit status that says whether a head runs a preview environment
/// (a status of its own, beside the plan's).
pub const PREVIEW_STATUS_CONTEXT: &str = "plumber/preview";

/// The largest answer read: a page of 100 comments of GitHub's largest size is under 30 MB.
const ANSWER_LIMIT: u64 = 64 * 1024 * 1024;

/// How much of an error answer is quoted in an error.
const QUOTED_ANSWER: usize = 300;

/// No pull request has this many pages of comments; a forge whose `next` never ends is wrong.
const MAX_PAGES: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the forge token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the forge token file {path} is empty; write the API token into it")]
    EmptyToken { path: PathBuf },
    #[error("forge `{field}` {value:?}: {message}")]
    Invalid {
        field: &'static str,
        value: String,
        message: String,
    },
    #[error("{method} {url}: {message} (retrying may help)")]
    Transport {
        method: Method,
        url: String,
        message: String,
    },
    #[error("{method} {url}: the forge answered {status}: {message}{}", hint(.status))]
    Status {
        method: Method,
        url: String,
        status: u16,
        message: String,
        /// How long the forge asks to wait (`retry-after`, or until its rate limit resets).
        wait: Option<Duration>,
        /// A rate limit (429, or GitHub's 403 with no requests remaining).
        rate_limited: bool,
    },
    #[error(
        "{method} {url}: rate limited for {} more, longer than the longest wait of {}; \
         retrying after that may help",
        humantime::format_duration(*.wait),
        humantime::format_duration(*.max_sleep)
    )]
    RateLimited {
        method: Method,
        url: String,
        wait: Duration,
        max_sleep: Duration,
    },
    #[error("{method} {url}: the forge's answer is not what its API documents: {message}")]
    Protocol {
        method: Method,
        url: String,
        message: String,
    },
    #[error(
        "the plan comment is {length} characters, over the forge's limit of {limit}, even \
         rendered for that limit; it was not sent"
    )]
    TooLong { length: usize, limit: usize },
    #[error("gave up after {attempts} attempts: {last}")]
    GaveUp { attempts: u32, last: Box<Error> },
}

fn hint(status: &u16) -> &'static str {
    match *status {
        500.. | 429 => " (retrying may help)",
        401 => " (retrying will not help: the token is refused; check --forge-token-file)",
        403 => " (retrying will not help: the token lacks a permission this needs)",
        404 => {
            " (retrying will not help: check --forge-repo, the pull request and that the \
             token can see the repository)"
        }
        300..=399 => " (retrying will not help: set --forge-url to the API's own URL)",
        _ => " (retrying will not help: the forge refused the request)",
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether trying the same operation again later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport { .. } | Error::RateLimited { .. } => true,
            Error::Status {
                status,
                rate_limited,
                ..
            } => *rate_limited || *status >= 500,
            Error::GaveUp { last, .. } => last.is_retryable(),
            Error::TokenFile { .. }
            | Error::EmptyToken { .. }
            | Error::Invalid { .. }
            | Error::Protocol { .. }
            | Error::TooLong { .. } => false,
        }
    }
}

/// Which forge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    #[value(name = "github")]
    GitHub,
    #[value(name = "gitlab")]
    GitLab,
}

impl Kind {
    /// The API of the public service.
    pub fn default_url(self) -> &'static str {
        match self {
            Kind::GitHub => "https://api.github.com",
            Kind::GitLab => "https://gitlab.com/api/v4",
        }
    }

    /// The longest comment body the forge accepts, in characters.
    pub fn comment_limit(self) -> usize {
        match self {
            Kind::GitHub => 65_536,
            Kind::GitLab => 1_000_000,
        }
    }

    /// The longest commit status description the forge accepts, in characters.
    pub fn description_limit(self) -> usize {
        match self {
            Kind::GitHub => 140,
            Kind::GitLab => 255,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::GitHub => "github",
            Kind::GitLab => "gitlab",
        })
    }
}

/// Where the forge is and which repository on it: what `--forge`, `--forge-url`,
/// `--forge-repo` and `--forge-token-file` say, or the `forge:` section of the daemon's
/// configuration file. It names the token's file, never the token.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    pub kind: Kind,
    /// The API's base URL; absent: the public service's ([`Kind::default_url`]). GitHub
    /// Enterprise: `https://HOST/api/v3`; self-hosted GitLab: `https://HOST/api/v4`.
    #[serde(default)]
    pub url: Option<String>,
    /// GitHub: `OWNER/NAME`; GitLab: the project's numeric id or its path `group/project`
    /// (also URL-encoded, `group%2Fproject`).
    pub repo: String,
    /// A file holding the API token; a trailing newline is not part of it. Read at
    /// [`connect`] and again before each operation, so a rotated Secret takes effect without
    /// a restart.
    pub token_file: PathBuf,
}

impl Config {
    pub fn new(kind: Kind, repo: impl Into<String>, token_file: impl Into<PathBuf>) -> Config {
        Config {
            kind,
            url: None,
            repo: repo.into(),
            token_file: token_file.into(),
        }
    }

    #[must_use]
    pub fn with_url(mut self, url: impl Into<String>) -> Config {
        self.url = Some(url.into());
        self
    }

    /// The API's base URL, without a trailing `/`.
    pub fn api_url(&self) -> &str {
        self.url
            .as_deref()
            .unwrap_or(self.kind.default_url())
            .trim_end_matches('/')
    }

    /// Where a person reads `file` at `commit` on the forge's web pages, at `line`: the
    /// API's URL without its API path (`api.github.com` → `github.com`, `HOST/api/v3` →
    /// `HOST`, `HOST/api/v4` → `HOST`). `None` for a GitLab project given by number, whose
    /// path the URL needs.
    pub fn file_url(&self, commit: &str, file: &str, line: Option<u32>) -> Option<String> {
        let api = self.api_url();
        let web = match self.kind {
            Kind::GitHub if api == "https://api.github.com" => "https://github.com",
            Kind::GitHub => api.strip_suffix("/api/v3").unwrap_or(api),
            Kind::GitLab => api.strip_suffix("/api/v4").unwrap_or(api),
        };
        let anchor = line.map(|l| format!("#L{l}")).unwrap_or_default();
        let repo = self.repo.replace("%2F", "/").replace("%2f", "/");
        match self.kind {
            Kind::GitHub => Some(format!("{web}/{repo}/blob/{commit}/{file}{anchor}")),
            Kind::GitLab if repo.contains('/') => {
                Some(format!("{web}/{repo}/-/blob/{commit}/{file}{anchor}"))
            }
            Kind::GitLab => None,
        }
    }

    /// Checks what can be checked without the network: the URL's form and the repository's.
    pub fn check(&self) -> Result<()> {
        let url = self.api_url();
        let uri: ureq::http::Uri = url.parse().map_err(|e| Error::Invalid {
            field: "url",
            value: url.to_owned(),
            message: format!("not a URL: {e}"),
        })?;
        if !matches!(uri.scheme_str(), Some("https" | "http")) || uri.host().is_none() {
            return Err(Error::Invalid {
                field: "url",
                value: url.to_owned(),
                message: "give the API's https:// URL".into(),
            });
        }
        if uri.query().is_some() || uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(Error::Invalid {
                field: "url",
                value: url.to_owned(),
                message: "the URL takes no query and no credentials (the token goes in the \
                          token file)"
                    .into(),
            });
        }
        match self.kind {
            Kind::GitHub => github::check_repo(&self.repo),
            Kind::GitLab => gitlab::check_project(&self.repo),
        }
        .map_err(|message| Error::Invalid {
            field: "repo",
            value: self.repo.clone(),
            message,
        })
    }
}

/// How requests are timed and retried. An operation is tried at most `attempts` times; between
/// attempts it waits what the forge asks (`retry-after`, or until its rate limit resets), else
/// an exponential backoff from `first_backoff` with jitter; never longer than `max_sleep`: a
/// rate limit that resets later fails at once with [`Error::RateLimited`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub attempts: u32,
    pub first_backoff: Duration,
    pub max_sleep: Duration,
    /// For one request, from connecting to the end of the answer.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            attempts: 5,
            first_backoff: Duration::from_secs(1),
            // GitHub's secondary rate limits ask for a minute.
            max_sleep: Duration::from_secs(60),
            timeout: Duration::from_secs(30),
        }
    }
}

impl Settings {
    #[must_use]
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    #[must_use]
    pub fn first_backoff(mut self, first_backoff: Duration) -> Self {
        self.first_backoff = first_backoff;
        self
    }

    #[must_use]
    pub fn max_sleep(mut self, max_sleep: Duration) -> Self {
        self.max_sleep = max_sleep;
        self
    }

    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// The time and the waiting between attempts; tests give one that does not sleep.
pub trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
    fn sleep(&self, duration: Duration);
}

/// The real one.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

/// A clock of real time whose waits between attempts end once it is stopped, so that a flaky
/// forge never holds a daemon's shutdown up.
#[derive(Default)]
pub struct StoppableClock {
    stopped: Mutex<bool>,
    woken: Condvar,
}

impl StoppableClock {
    pub fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.woken.notify_all();
    }
}

impl Clock for StoppableClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) {
        let stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .woken
            .wait_timeout_while(stopped, duration, |stopped| !*stopped);
    }
}

/// The state of a commit status. The forges name them differently (GitLab has no `error`,
/// GitHub no `running`); each client maps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Running,
    Success,
    /// The commit is invalid (the description says why).
    Failure,
    /// Plumber could not judge the commit (the description says why).
    Error,
}

/// A commit status: its `state`, a one-line `description` (shortened to the forge's limit),
/// and a link to details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitStatus {
    pub state: State,
    pub description: String,
    pub target_url: Option<String>,
    /// [`STATUS_CONTEXT`] (GitLab: the status's name), or [`PREVIEW_STATUS_CONTEXT`].
    pub context: &'static str,
}

impl CommitStatus {
    pub fn new(state: State, description: impl Into<String>) -> CommitStatus {
        CommitStatus {
            state,
            description: description.into(),
            target_url: None,
            context: STATUS_CONTEXT,
        }
    }

    /// The status of a preview environment ([`PREVIEW_STATUS_CONTEXT`]).
    #[must_use]
    pub fn of_preview(mut self) -> CommitStatus {
        self.context = PREVIEW_STATUS_CONTEXT;
        self
    }

    #[must_use]
    pub fn with_target_url(mut self, url: impl Into<String>) -> CommitStatus {
        self.target_url = Some(url.into());
        self
    }
}

/// The plan comment [`Forge::upsert_plan_comment`] puts on a pull request.
pub struct PlanComment<'a> {
    /// What the plan means ([`fingerprint_line`]): a comment that carries it already is not
    /// written again.
    pub fingerprint: &'a str,
    /// Which comment is written.
    pub at: CommentAt,
    /// The markdown within a budget of characters (what the forge's limit leaves after the
    /// marker and the fingerprint).
    pub render: &'a dyn Fn(usize) -> String,
}

/// Which comment [`Forge::upsert_plan_comment`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommentAt {
    /// Not known: looked for by its marker first.
    Unknown,
    /// This one (a previous [`CommentOutcome`], a [`FoundComment`]): updated at once, and
    /// looked for when the forge no longer has it.
    Id(u64),
    /// None: the caller has just looked ([`Forge::find_plan_comment`]). Created at once, and
    /// looked for before another attempt (the forge's answer to the creation may be lost).
    Nowhere,
}

/// The plan comment [`Forge::find_plan_comment`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundComment {
    pub id: u64,
    /// The fingerprint of the plan it says ([`fingerprint_line`]; `None`: a comment of a
    /// Plumber that wrote none).
    pub fingerprint: Option<String>,
}

impl FoundComment {
    fn of(id: u64, body: &str) -> FoundComment {
        FoundComment {
            id,
            fingerprint: comment_fingerprint(body).map(str::to_owned),
        }
    }
}

/// What [`Forge::upsert_plan_comment`] did; the id is the forge's id of the comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommentOutcome {
    Created(u64),
    Updated(u64),
    /// The comment already said exactly this; nothing was sent.
    Unchanged(u64),
}

/// Where a pull request (GitLab: a merge request) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PullRequestState {
    Open,
    Closed,
    Merged,
}

/// What the daemon reads of a pull request: whether it is open, its labels (which only
/// people with write access to the repository can set) and its head commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    pub state: PullRequestState,
    pub labels: Vec<String>,
    /// The head commit as the forge knows it now (`None`: the forge did not say).
    pub head: Option<String>,
}

impl PullRequest {
    pub fn is_open(&self) -> bool {
        self.state == PullRequestState::Open
    }

    pub fn has_label(&self, label: &str) -> bool {
        self.labels.iter().any(|l| l == label)
    }
}

/// The operations the daemon needs of a forge.
pub trait Forge: Send + Sync + fmt::Debug {
    fn kind(&self) -> Kind;

    /// Pull request (GitHub) or merge request (GitLab, its iid) `number`: its state and
    /// labels, as the forge says now.
    fn pull_request(&self, number: u64) -> Result<PullRequest>;

    /// The numbers (GitLab: iids) of every open pull (merge) request, in one listing of
    /// 100 a page: what tells the daemon which pull-request refs are worth publishing on
    /// without asking about each.
    fn open_pull_requests(&self) -> Result<BTreeSet<u64>>;

    /// The plan comment of pull request (GitHub) or merge request (GitLab, its iid)
    /// `number`, looked for by its [`MARKER`] among the comments of the token's account, and
    /// the fingerprint it carries.
    fn find_plan_comment(&self, number: u64) -> Result<Option<FoundComment>>;

    /// Puts the plan on pull request (GitHub) or merge request (GitLab, its iid) `number`:
    /// updates the comment carrying [`MARKER`] in place (the one `comment.at` names, when it
    /// is still there), or creates it when there is none. A comment found with
    /// `comment.fingerprint` already is left as it is ([`CommentOutcome::Unchanged`]).
    /// `comment.render(budget)` gives the markdown in at most `budget` characters; text still
    /// longer is refused with [`Error::TooLong`] and never sent.
    fn upsert_plan_comment(&self, number: u64, comment: &PlanComment<'_>)
    -> Result<CommentOutcome>;

    /// Sets the status of commit `sha` named by the status's context.
    fn set_commit_status(&self, sha: &str, status: &CommitStatus) -> Result<()>;

    /// Takes `label` off pull request (GitLab: merge request) `number`; a label it does not
    /// carry is no error.
    fn remove_label(&self, number: u64, label: &str) -> Result<()>;
}

/// How both forges put a plan comment, retried as one operation: an update of the comment
/// known by id (one deleted meanwhile is looked for), a creation where none is known to be
/// (on the first attempt only: a creation whose answer was lost is looked for before it is
/// tried again), else the comment found by its marker (`find`: its id and body), updated
/// unless it carries the plan's fingerprint already.
fn upsert(
    http: &Http,
    comment: &PlanComment<'_>,
    update: impl Fn(u64) -> Result<CommentOutcome>,
    create: impl Fn() -> Result<CommentOutcome>,
    find: impl Fn() -> Result<Option<(u64, String)>>,
) -> Result<CommentOutcome> {
    let mut attempt = 0;
    http.retrying("plan comment", || {
        attempt += 1;
        match comment.at {
            CommentAt::Id(id) => match update(id) {
                // Deleted meanwhile: looked for (and made again) below.
                Err(error) if is_not_found(&error) => {}
                done => return done,
            },
            CommentAt::Nowhere if attempt == 1 => return create(),
            CommentAt::Nowhere | CommentAt::Unknown => {}
        }
        match find()? {
            Some((id, body)) if says_already(&body, comment.fingerprint) => {
                Ok(CommentOutcome::Unchanged(id))
            }
            Some((id, _)) => update(id),
            None => create(),
        }
    })
}

/// `text` as one segment of a URL path: everything but letters, digits and `-._~` escaped.
pub fn encode_segment(text: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, SEGMENT).to_string()
}

/// The pull request (GitLab: merge request iid) a watched ref is the head of:
/// `refs/pull/N/head` (GitHub) or `refs/merge-requests/N/head` (GitLab).
pub fn pull_request_of_ref(refname: &str) -> Option<u64> {
    let number = refname
        .strip_prefix("refs/pull/")
        .or_else(|| refname.strip_prefix("refs/merge-requests/"))?
        .strip_suffix("/head")?;
    // `parse` alone would take `+7`.
    number
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| number.parse().ok())
        .flatten()
}

/// Reads the token and builds the client `config` names, with the default [`Settings`] and
/// the real clock.
pub fn connect(config: &Config) -> Result<Box<dyn Forge>> {
    connect_with(config, Settings::default(), Arc::new(SystemClock))
}

/// [`connect`] with its settings and clock given.
pub fn connect_with(
    config: &Config,
    settings: Settings,
    clock: Arc<dyn Clock>,
) -> Result<Box<dyn Forge>> {
    config.check()?;
    let token = Token::read(&config.token_file)?;
    let http = Http::new(config, token, settings, clock);
    Ok(match config.kind {
        Kind::GitHub => Box::new(github::GitHub::new(http, &config.repo)),
        Kind::GitLab => Box::new(gitlab::GitLab::new(http, &config.repo)),
    })
}

/// The API token: never printed, never in an error.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    fn read(path: &Path) -> Result<Token> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::TokenFile {
            path: path.to_owned(),
            source,
        })?;
        let token = text.trim_end_matches(['\n', '\r']);
        if token.trim().is_empty() {
            return Err(Error::EmptyToken {
                path: path.to_owned(),
            });
        }
        Ok(Token(token.to_owned()))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with the token blanked out, for quoting what a forge answered.
    fn redact(&self, text: &str) -> String {
        text.replace(&self.0, "[token]")
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token([redacted])")
    }
}

/// A successful (2xx) answer.
pub(crate) struct Answer {
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

impl Answer {
    /// The body as JSON of type `T`.
    pub(crate) fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: &Method,
        url: &str,
    ) -> Result<T> {
        serde_json::from_str(&self.body).map_err(|e| Error::Protocol {
            method: method.clone(),
            url: url.to_owned(),
            message: format!("the body is not the JSON expected: {e}"),
        })
    }

    /// The URL of the next page, from `Link: <…>; rel="next"`.
    pub(crate) fn next_link(&self) -> Option<String> {
        self.headers
            .get_all("link")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .find_map(|link| {
                let (target, params) = link.trim().split_once(';')?;
                let is_next = params.split(';').any(|param| {
                    param
                        .trim()
                        .strip_prefix("rel=")
                        .is_some_and(|rel| rel.trim_matches('"').split(' ').any(|r| r == "next"))
                });
                let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
                is_next.then(|| target.to_owned())
            })
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The HTTP machinery both clients share: the agent, authentication, retries.
pub(crate) struct Http {
    kind: Kind,
    agent: ureq::Agent,
    /// The API's base URL, without a trailing `/`.
    base: String,
    token_file: PathBuf,
    /// Read again before each operation.
    token: RwLock<Token>,
    settings: Settings,
    clock: Arc<dyn Clock>,
    jitter: RandomState,
    /// Makes each backoff's jitter another draw.
    backoffs: AtomicU64,
}

impl fmt::Debug for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("kind", &self.kind)
            .field("base", &self.base)
            .field("token_file", &self.token_file)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Http {
    fn new(config: &Config, token: Token, settings: Settings, clock: Arc<dyn Clock>) -> Http {
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::NativeTls)
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .timeout_global(Some(settings.timeout))
            .timeout_connect(Some(settings.timeout.min(Duration::from_secs(10))))
            .http_status_as_error(false)
            // An API call is not redirected; following one could carry the token (GitLab's
            // is a header ureq does not know to drop) to another host.
            .max_redirects(0)
            .user_agent(concat!("plumber/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Http {
            kind: config.kind,
            agent,
            base: config.api_url().to_owned(),
            token_file: config.token_file.clone(),
            token: RwLock::new(token),
            settings,
            clock,
            jitter: RandomState::new(),
            backoffs: AtomicU64::new(0),
        }
    }

    pub(crate) fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base)
    }

    /// Whether `url` (a `next` link the forge gave) is under the API's base URL: the token is
    /// sent to no other host.
    pub(crate) fn is_own(&self, url: &str) -> bool {
        url.strip_prefix(&self.base)
            .is_some_and(|rest| rest.starts_with('/'))
    }

    pub(crate) fn token(&self) -> Token {
        self.token
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A GET of `url`, its body decoded as JSON of type `T`; not retried.
    pub(crate) fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T> {
        self.send(Method::GET, url, None)?.json(&Method::GET, url)
    }

    /// One request, not retried. Anything but a 2xx answer is an error.
    pub(crate) fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer> {
        let token = self.token();
        let mut request = ureq::http::Request::builder()
            .method(method.clone())
            .uri(url);
        request = match self.kind {
            Kind::GitHub => request
                .header("authorization", format!("Bearer {}", token.expose()))
                .header("accept", "application/vnd.github+json")
                .header("x-github-api-version", "2022-11-28"),
            Kind::GitLab => request
                .header("private-token", token.expose())
                .header("accept", "application/json"),
        };
        let protocol = |message: String| Error::Protocol {
            method: method.clone(),
            url: url.to_owned(),
            message,
        };
        let sent = match body {
            None => request
                .body(())
                .map_err(|e| protocol(e.to_string()))
                .map(|request| self.agent.run(request)),
            Some(json) => request
                .header("content-type", "application/json")
                .body(json.to_string())
                .map_err(|e| protocol(e.to_string()))
                .map(|request| self.agent.run(request)),
        }?;
        let mut response = sent.map_err(|e| Error::Transport {
            method: method.clone(),
            url: url.to_owned(),
            message: token.redact(&e.to_string()),
        })?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(ANSWER_LIMIT)
            .read_to_string()
            .map_err(|e| Error::Transport {
                method: method.clone(),
                url: url.to_owned(),
                message: format!("reading the answer: {}", token.redact(&e.to_string())),
            })?;
        let headers = response.headers().clone();
        if (200..300).contains(&status) {
            return Ok(Answer {
                headers,
                body: text,
            });
        }
        let (wait, rate_limited) = self.server_wait(status, &headers);
        let mut message = quote(&token.redact(&text));
        if (300..400).contains(&status)
            && let Some(location) = headers.get("location").and_then(|v| v.to_str().ok())
        {
            message = format!("redirected to {}", token.redact(location));
        }
        Err(Error::Status {
            method,
            url: url.to_owned(),
            status,
            message,
            wait,
            rate_limited,
        })
    }

    /// What the forge asks to wait before the next request, and whether it is a rate limit.
    fn server_wait(&self, status: u16, headers: &HeaderMap) -> (Option<Duration>, bool) {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        };
        let retry_after = header("retry-after")
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs);
        let exhausted =
            header("x-ratelimit-remaining").or_else(|| header("ratelimit-remaining")) == Some("0");
        let until_reset = exhausted
            .then(|| header("x-ratelimit-reset").or_else(|| header("ratelimit-reset")))
            .flatten()
            .and_then(|v| v.parse::<u64>().ok())
            .map(|reset| {
                let reset = SystemTime::UNIX_EPOCH + Duration::from_secs(reset);
                // The reset is in whole seconds: one more is sure to be past it.
                reset.duration_since(self.clock.now()).unwrap_or_default() + Duration::from_secs(1)
            });
        // GitHub's rate limits (primary and secondary) answer 403 or 429.
        let rate_limited = status == 429 || (status == 403 && (exhausted || retry_after.is_some()));
        let wait = if rate_limited || status >= 500 {
            retry_after.or(until_reset)
        } else {
            None
        };
        (wait, rate_limited)
    }

    /// Runs `operation` until it succeeds, fails for good, or the attempts run out, waiting
    /// between attempts as [`Settings`] says.
    pub(crate) fn retrying<T>(
        &self,
        what: &str,
        mut operation: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let token = Token::read(&self.token_file)?;
        *self.token.write().unwrap_or_else(PoisonError::into_inner) = token;
        let mut attempt = 1;
        loop {
            let error = match operation() {
                Ok(done) => return Ok(done),
                Err(error) if !error.is_retryable() => return Err(error),
                Err(error) => error,
            };
            if attempt >= self.settings.attempts {
                return Err(Error::GaveUp {
                    attempts: attempt,
                    last: Box::new(error),
                });
            }
            let wait = match &error {
                Error::Status {
                    method,
                    url,
                    wait: Some(wait),
                    ..
                } => {
                    if *wait > self.settings.max_sleep {
                        return Err(Error::RateLimited {
                            method: method.clone(),
                            url: url.clone(),
                            wait: *wait,
                            max_sleep: self.settings.max_sleep,
                        });
                    }
                    *wait
                }
                _ => self.backoff(attempt),
            };
            tracing::warn!(
                forge = %self.kind,
                what,
                attempt,
                wait = %humantime::format_duration(wait),
                %error,
                "forge request failed; retrying"
            );
            self.clock.sleep(wait);
            attempt += 1;
        }
    }

    /// The wait after failed attempt `attempt` (from 1): `first_backoff` doubled per attempt,
    /// at most `max_sleep`, of which a random half (so that many daemons do not retry in step).
    fn backoff(&self, attempt: u32) -> Duration {
        let full = self
            .settings
            .first_backoff
            .saturating_mul(1 << (attempt - 1).min(16))
            .min(self.settings.max_sleep);
        let draw = self.backoffs.fetch_add(1, Ordering::Relaxed);
        let fraction = (self.jitter.hash_one(draw) % 1024) as u32;
        full / 2 + (full / 2) * fraction / 1024
    }

    /// The first item of a paginated list that `wanted` accepts, reading pages only until it
    /// is found: `first` is the first page's URL; `next` finds the next page's URL in an
    /// answer.
    pub(crate) fn find_in_pages<T: serde::de::DeserializeOwned>(
        &self,
        first: String,
        next: impl Fn(&Answer, &str) -> Option<String>,
        wanted: impl Fn(&T) -> bool,
    ) -> Result<Option<T>> {
        self.walk_pages(first, next, |page: Vec<T>| page.into_iter().find(&wanted))
    }

    /// Every item of a paginated list (see [`Http::find_in_pages`]).
    pub(crate) fn all_pages<T: serde::de::DeserializeOwned>(
        &self,
        first: String,
        next: impl Fn(&Answer, &str) -> Option<String>,
    ) -> Result<Vec<T>> {
        let mut all = Vec::new();
        self.walk_pages(first, next, |page: Vec<T>| {
            all.extend(page);
            None::<()>
        })?;
        Ok(all)
    }

    /// Reads the pages of a list from `first` on, handing each to `each` until it returns
    /// something or the pages end.
    fn walk_pages<T: serde::de::DeserializeOwned, R>(
        &self,
        first: String,
        next: impl Fn(&Answer, &str) -> Option<String>,
        mut each: impl FnMut(Vec<T>) -> Option<R>,
    ) -> Result<Option<R>> {
        let mut url = first;
        for _ in 0..MAX_PAGES {
            let answer = self.send(Method::GET, &url, None)?;
            let page: Vec<T> = answer.json(&Method::GET, &url)?;
            if let Some(found) = each(page) {
                return Ok(Some(found));
            }
            match next(&answer, &url) {
                Some(next_url) if !self.is_own(&next_url) => {
                    return Err(Error::Protocol {
                        method: Method::GET,
                        url,
                        message: format!(
                            "the next page {next_url} is not under the API's URL {}; the \
                             token is not sent there",
                            self.base
                        ),
                    });
                }
                Some(next_url) if next_url != url => url = next_url,
                _ => return Ok(None),
            }
        }
        Err(Error::Protocol {
            method: Method::GET,
            url,
            message: format!("more than {MAX_PAGES} pages"),
        })
    }
}

/// The start of an error answer, on one line: when it is JSON, what the forge says in it
/// (`message`, GitLab's `error`, GitHub's validation `errors`).
fn quote(text: &str) -> String {
    let said = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .map(|json| {
            let say = |value: &serde_json::Value| match value.as_str() {
                Some(text) => text.to_owned(),
                None => value.to_string(),
            };
            let mut parts: Vec<String> = ["message", "error"]
                .iter()
                .filter_map(|key| json.get(key).map(say))
                .collect();
            if let Some(errors) = json.get("errors").and_then(|e| e.as_array()) {
                parts.extend(errors.iter().map(|e| say(e.get("message").unwrap_or(e))));
            }
            parts.join("; ")
        })
        .filter(|said| !said.is_empty());
    let line = said
        .as_deref()
        .unwrap_or(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    shorten(&line, QUOTED_ANSWER)
}

/// `text` in at most `limit` characters, cut on a character boundary with `…` when it is
/// longer.
pub fn shorten(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(limit.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// The hidden line that carries a plan's fingerprint: the second line of a plan comment
/// (after [`MARKER`]) and the last of a plan's git note.
pub fn fingerprint_line(fingerprint: &str) -> String {
    format!("<!-- plumber:fingerprint {fingerprint} -->")
}

/// The fingerprint `line` carries, if it is a [`fingerprint_line`].
pub fn fingerprint_in(line: &str) -> Option<&str> {
    line.trim_end()
        .strip_prefix("<!-- plumber:fingerprint ")?
        .strip_suffix(" -->")
}

/// The body of the plan comment: the marker, the fingerprint, then the markdown rendered
/// within what the limit leaves.
fn plan_comment_body(kind: Kind, comment: &PlanComment<'_>) -> Result<String> {
    let limit = kind.comment_limit();
    let head = format!("{MARKER}\n{}\n", fingerprint_line(comment.fingerprint));
    let budget = limit.saturating_sub(head.chars().count());
    let markdown = (comment.render)(budget);
    let body = head + &markdown;
    let length = body.chars().count();
    if length > limit {
        return Err(Error::TooLong { length, limit });
    }
    Ok(body)
}

/// A commit id as the status APIs take it: full hexadecimal (SHA-1 or SHA-256), so that it
/// cannot change the path it is put in.
fn check_sha(sha: &str) -> Result<()> {
    if matches!(sha.len(), 40 | 64) && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(Error::Invalid {
            field: "sha",
            value: sha.to_owned(),
            message: "a commit status needs the commit's full hexadecimal id".into(),
        })
    }
}

/// Whether a comment's body is the plan comment.
fn is_plan_comment(body: &str) -> bool {
    body.trim_start().starts_with(MARKER)
}

/// The fingerprint a plan comment carries: the line after the marker (`None`: a comment of
/// a Plumber that wrote none).
fn comment_fingerprint(body: &str) -> Option<&str> {
    body.trim_start().lines().nth(1).and_then(fingerprint_in)
}

/// Whether the plan comment `existing` says the plan of `fingerprint` already.
fn says_already(existing: &str, fingerprint: &str) -> bool {
    comment_fingerprint(existing) == Some(fingerprint)
}

/// Whether `error` is the forge's 404: the thing asked for is not there (any more).
fn is_not_found(error: &Error) -> bool {
    matches!(error, Error::Status { status: 404, .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_link_to_the_forge_s_web_pages_at_the_commit_and_line() {
        let github = Config::new(Kind::GitHub, "acme/flows", "/t");
        assert_eq!(
            github
                .file_url("abc", "topologies/t/a.yaml", Some(3))
                .as_deref(),
            Some("https://github.com/acme/flows/blob/abc/topologies/t/a.yaml#L3")
        );
        let enterprise = github.clone().with_url("https://ghe.acme.io/api/v3/");
        assert_eq!(
            enterprise.file_url("abc", "a.yaml", None).as_deref(),
            Some("https://ghe.acme.io/acme/flows/blob/abc/a.yaml")
        );
        let gitlab = Config::new(Kind::GitLab, "data%2Fflows", "/t");
        assert_eq!(
            gitlab.file_url("abc", "a.yaml", Some(9)).as_deref(),
            Some("https://gitlab.com/data/flows/-/blob/abc/a.yaml#L9")
        );
        assert_eq!(
            Config::new(Kind::GitLab, "42", "/t").file_url("abc", "a.yaml", Some(9)),
            None
        );
    }

    #[test]
    fn pull_requests_are_read_from_their_refs() {
        assert_eq!(pull_request_of_ref("refs/pull/7/head"), Some(7));
        assert_eq!(pull_request_of_ref("refs/merge-requests/12/head"), Some(12));
        for other in [
            "refs/heads/main",
            "refs/pull/7/merge",
            "refs/pull/+7/head",
            "refs/pull//head",
            "refs/pull/7/head/x",
        ] {
            assert_eq!(pull_request_of_ref(other), None, "{other}");
        }
    }

    #[test]
    fn shorten_cuts_on_a_character_boundary() {
        assert_eq!(shorten("short", 140), "short");
        let long = "é".repeat(200);
        let short = shorten(&long, 140);
        assert_eq!(short.chars().count(), 140);
        assert!(short.ends_with('…'));
    }

    #[test]
    fn error_answers_are_quoted_by_what_they_say() {
        let github = concat!(
            r#"{"message":"Validation Failed","errors":[{"resource":"IssueComment","#,
            r#""code":"custom","field":"body","message":"body is too long (maximum is "#,
            r#"65536 characters)"}],"documentation_url":"https://docs.github.com/rest"}"#
        );
        assert_eq!(
            quote(github),
            "Validation Failed; body is too long (maximum is 65536 characters)"
        );
        assert_eq!(
            quote(r#"{"message":{"body":["is too long"]}}"#),
            r#"{"body":["is too long"]}"#
        );
        assert_eq!(
            quote(r#"{"error":"insufficient_scope"}"#),
            "insufficient_scope"
        );
        assert_eq!(
            quote("<html>\n<h1>502 Bad Gateway</h1>\n</html>"),
            "<html> <h1>502 Bad Gateway</h1> </html>"
        );
        assert_eq!(quote(&"x".repeat(1000)).chars().count(), QUOTED_ANSWER);
    }

    #[test]
    fn next_links_are_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "link",
            "<https://api.github.com/x?page=1>; rel=\"prev\", \
             <https://api.github.com/x?page=3>; rel=\"next\", \
             <https://api.github.com/x?page=9>; rel=\"last\""
                .parse()
                .unwrap(),
        );
        let answer = Answer {
            headers,
            body: String::new(),
        };
        assert_eq!(
            answer.next_link().as_deref(),
            Some("https://api.github.com/x?page=3")
        );
    }

    #[test]
    fn config_checks_the_url_and_the_repository() {
        let github = Config::new(Kind::GitHub, "acme/topologies", "/t");
        assert!(github.check().is_ok());
        assert_eq!(github.api_url(), "https://api.github.com");
        for bad in ["acme", "acme/", "/x", "a/b/c", "a b/c"] {
            let error = Config::new(Kind::GitHub, bad, "/t").check().unwrap_err();
            assert!(error.to_string().contains("repo"), "{error}");
        }
        for good in ["42", "group/project", "group%2Fsub%2Fproject", "g/s/p"] {
            assert!(
                Config::new(Kind::GitLab, good, "/t").check().is_ok(),
                "{good}"
            );
        }
        let ftp = github.clone().with_url("ftp://example.com");
        assert!(ftp.check().is_err());
        let with_password = github.with_url("https://u:p@ghe.example.com/api/v3");
        assert!(with_password.check().is_err());
    }
}
