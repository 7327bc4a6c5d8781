//! The forge clients against a fake GitHub and a fake GitLab: a real HTTP server (axum) on a
//! free loopback port that keeps pull requests' comments and commit statuses like the forge
//! does, checks every request it gets (method, path, query, authentication headers,
//! content type, JSON body, the forge's limits) and records them. A request the real API would
//! not take is recorded as a violation, and every test ends by asserting there were none.
//!
//! Faults are injected as the answer to the next request(s): a 502, a 429 with `retry-after`,
//! GitHub's 403 rate limit, a 502 after the comment was created (the answer lost). The
//! clients' clock is a fake that records the waits instead of sleeping.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use plumber::forge::{
    self, Clock, CommentOutcome, CommitStatus, Config, Error, Forge, Kind, MARKER, Settings, State,
};
use serde_json::{Value, json};

const TOKEN: &str = "tok-5ecret-ABC123";
const SHA: &str = "0123456789abcdef0123456789abcdef01234567";
/// GitHub's repository, and its id in the `next` links GitHub gives.
const GITHUB_REPO: &str = "acme/topologies";
const GITHUB_REPO_ID: u64 = 4242;
/// GitLab's project path, as it must appear in request paths.
const GITLAB_PROJECT: &str = "acme%2Ftopologies";

// ---------------------------------------------------------------------------------------------
// The fake forge.

#[derive(Debug, Clone)]
struct Recorded {
    method: Method,
    path: String,
    query: BTreeMap<String, String>,
    body: Option<Value>,
}

impl Recorded {
    /// `METHOD path`, with the page when there is one: what the sequence assertions read.
    fn line(&self) -> String {
        match self.query.get("page") {
            Some(page) => format!("{} {} page={page}", self.method, self.path),
            None => format!("{} {}", self.method, self.path),
        }
    }
}

#[derive(Debug, Clone)]
struct Comment {
    id: u64,
    body: String,
    /// GitLab's own notes ("added 1 commit").
    system: bool,
    author: &'static str,
}

/// The token's account, and the authors of the other comments.
const BOT: &str = "plumber-bot";
/// The bot user of a GitHub App's installation token.
const APP_BOT: &str = "plumber-app[bot]";
const ALICE: &str = "alice";
const MALLORY: &str = "mallory";

fn user_id(login: &str) -> u64 {
    match login {
        ALICE => 5,
        MALLORY => 6,
        BOT => 77,
        APP_BOT => 99,
        _ => 0,
    }
}

/// An answer given instead of the normal one. With `after_effect`, the request takes effect
/// first (the comment is created) and only its answer is lost.
#[derive(Debug, Clone)]
struct Fault {
    status: u16,
    headers: Vec<(&'static str, String)>,
    after_effect: bool,
}

impl Fault {
    fn status(status: u16) -> Fault {
        Fault {
            status,
            headers: Vec::new(),
            after_effect: false,
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Fault {
        self.headers.push((name, value.into()));
        self
    }

    fn after_effect(mut self) -> Fault {
        self.after_effect = true;
        self
    }
}

struct Fake {
    kind: Kind,
    /// `http://127.0.0.1:PORT`.
    origin: String,
    /// The API's path on the server: `/api/v3` (GitHub Enterprise) or `/api/v4`.
    base: String,
    comments: BTreeMap<u64, Vec<Comment>>,
    next_id: u64,
    statuses: Vec<(String, Value)>,
    /// By the index of the request they answer.
    faults: BTreeMap<usize, Fault>,
    requests: Vec<Recorded>,
    violations: Vec<String>,
    /// GitHub: the `next` link of a comments page points to another host.
    foreign_next: bool,
    /// GitHub: the token is a GitHub App's installation token (it has no user).
    app_token: bool,
}

struct Server {
    state: Arc<Mutex<Fake>>,
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Server {
    fn start(kind: Kind) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let base = match kind {
            Kind::GitHub => "/api/v3",
            Kind::GitLab => "/api/v4",
        };
        let state = Arc::new(Mutex::new(Fake {
            kind,
            origin: origin.clone(),
            base: base.into(),
            comments: BTreeMap::new(),
            next_id: 1000,
            statuses: Vec::new(),
            faults: BTreeMap::new(),
            requests: Vec::new(),
            violations: Vec::new(),
            foreign_next: false,
            app_token: false,
        }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Server {
            state,
            url: format!("{origin}{base}"),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn fake(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.state.lock().unwrap()
    }

    /// Puts `count` comments on pull request `number`; the one at `marker_at` is the plan
    /// comment, saying `plan`.
    fn seed(&self, number: u64, count: usize, marker_at: Option<usize>, plan: &str) -> Vec<u64> {
        let mut fake = self.fake();
        let mut ids = Vec::new();
        for i in 0..count {
            fake.next_id += 1;
            let id = fake.next_id;
            let (body, author) = if Some(i) == marker_at {
                (format!("{MARKER}\n{plan}"), BOT)
            } else {
                (format!("looks good {i}"), ALICE)
            };
            fake.comments.entry(number).or_default().push(Comment {
                id,
                body,
                system: false,
                author,
            });
            ids.push(id);
        }
        fake.comments.entry(number).or_default();
        ids
    }

    /// `fault` answers the request `later` requests from now (0: the next one).
    fn fail(&self, later: usize, fault: Fault) {
        let mut fake = self.fake();
        let index = fake.requests.len() + later;
        fake.faults.insert(index, fault);
    }

    fn fail_next(&self, fault: Fault) {
        self.fail(0, fault);
    }

    fn lines(&self) -> Vec<String> {
        self.fake().requests.iter().map(Recorded::line).collect()
    }

    fn requests(&self) -> Vec<Recorded> {
        self.fake().requests.clone()
    }

    /// Forgets the requests so far (and any fault not yet used).
    fn clear_requests(&self) {
        let mut fake = self.fake();
        fake.requests.clear();
        fake.faults.clear();
    }

    fn comments(&self, number: u64) -> Vec<Comment> {
        self.fake()
            .comments
            .get(&number)
            .cloned()
            .unwrap_or_default()
    }

    fn statuses(&self) -> Vec<(String, Value)> {
        self.fake().statuses.clone()
    }

    /// Every request was one the forge's API takes.
    fn assert_clean(&self) {
        let fake = self.fake();
        assert!(
            fake.violations.is_empty(),
            "requests the forge would refuse: {:#?}",
            fake.violations
        );
    }
}

async fn handle(
    AxumState(state): AxumState<Arc<Mutex<Fake>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut fake = state.lock().unwrap();
    fake.answer(method, &uri, &headers, &body)
}

fn answer(status: u16, headers: Vec<(&'static str, String)>, body: Value) -> Response {
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json".to_owned())],
        body.to_string(),
    )
        .into_response();
    for (name, value) in headers {
        response.headers_mut().append(name, value.parse().unwrap());
    }
    response
}

fn message(status: u16, text: &str) -> Response {
    answer(status, Vec::new(), json!({ "message": text }))
}

/// An endpoint of the API, by its path.
enum Route {
    /// A pull request's comments (GitLab: a merge request's notes): listed or added to.
    Comments(u64),
    /// GitHub's `next` links name the repository by id: `/repositories/ID/issues/N/comments`.
    CommentsById(u64),
    /// One comment (GitHub's path has no pull request number: 0).
    Comment(u64, u64),
    Status(String),
    /// The token's own account.
    User,
}

impl Fake {
    fn answer(&mut self, method: Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Response {
        let query: BTreeMap<String, String> = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                (key.to_owned(), value.to_owned())
            })
            .collect();
        let json: Option<Value> = (!body.is_empty())
            .then(|| serde_json::from_slice(body).ok())
            .flatten();
        let path = uri.path().to_owned();
        self.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            body: json.clone(),
        });
        let what = format!("{method} {uri}");

        // Authentication, as each forge takes it.
        let user_agent = headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !user_agent.starts_with("plumber/") {
            self.violations
                .push(format!("{what}: user-agent {user_agent:?}"));
        }
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let presented = match self.kind {
            Kind::GitHub => {
                if header("accept") != Some("application/vnd.github+json") {
                    self.violations
                        .push(format!("{what}: accept {:?}", header("accept")));
                }
                if header("x-github-api-version") != Some("2022-11-28") {
                    self.violations.push(format!("{what}: no API version"));
                }
                if header("private-token").is_some() {
                    self.violations
                        .push(format!("{what}: a GitLab token header"));
                }
                header("authorization")
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::to_owned)
            }
            Kind::GitLab => {
                if header("authorization").is_some() {
                    self.violations
                        .push(format!("{what}: an authorization header"));
                }
                header("private-token").map(str::to_owned)
            }
        };
        match presented.as_deref() {
            Some(TOKEN) => {}
            // A careless server that echoes the credentials: the client must not repeat them.
            Some(other) => return message(401, &format!("Bad credentials: {other}")),
            None => {
                self.violations.push(format!("{what}: no token"));
                return message(401, "Requires authentication");
            }
        }

        // The body: JSON objects with their content type on writes, nothing on reads.
        let writes = method != Method::GET;
        if writes {
            if header("content-type") != Some("application/json") {
                self.violations
                    .push(format!("{what}: content-type {:?}", header("content-type")));
            }
            if !json.as_ref().is_some_and(Value::is_object) {
                self.violations
                    .push(format!("{what}: the body is no JSON object"));
                return message(400, "Problems parsing JSON");
            }
        } else if !body.is_empty() {
            self.violations.push(format!("{what}: a body on a read"));
        }

        let Some(route) = self.route(&path) else {
            self.violations.push(format!("{what}: no such endpoint"));
            return message(404, "Not Found");
        };

        let fault = self.faults.remove(&(self.requests.len() - 1));
        if let Some(fault) = &fault
            && !fault.after_effect
        {
            return answer(
                fault.status,
                fault.headers.clone(),
                json!({"message": "injected"}),
            );
        }
        let normal = self.serve(route, &method, &query, json, &what);
        match fault {
            Some(fault) => answer(fault.status, fault.headers, json!({"message": "injected"})),
            None => normal,
        }
    }

    fn route(&self, path: &str) -> Option<Route> {
        let rest = path.strip_prefix(&self.base)?;
        let parts: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
        let number = |s: &str| s.parse::<u64>().ok();
        let repository_id = GITHUB_REPO_ID.to_string();
        let (owner, name) = GITHUB_REPO.split_once('/')?;
        match (self.kind, parts.as_slice()) {
            (_, ["user"]) => Some(Route::User),
            (Kind::GitHub, ["repos", o, r, "issues", n, "comments"])
                if (*o, *r) == (owner, name) =>
            {
                Some(Route::Comments(number(n)?))
            }
            (Kind::GitHub, ["repositories", id, "issues", n, "comments"])
                if *id == repository_id =>
            {
                Some(Route::CommentsById(number(n)?))
            }
            (Kind::GitHub, ["repos", o, r, "issues", "comments", id])
                if (*o, *r) == (owner, name) =>
            {
                Some(Route::Comment(0, number(id)?))
            }
            (Kind::GitHub, ["repos", o, r, "statuses", sha]) if (*o, *r) == (owner, name) => {
                Some(Route::Status((*sha).to_owned()))
            }
            (Kind::GitLab, ["projects", GITLAB_PROJECT, "merge_requests", n, "notes"]) => {
                Some(Route::Comments(number(n)?))
            }
            (Kind::GitLab, ["projects", GITLAB_PROJECT, "merge_requests", n, "notes", id]) => {
                Some(Route::Comment(number(n)?, number(id)?))
            }
            (Kind::GitLab, ["projects", GITLAB_PROJECT, "statuses", sha]) => {
                Some(Route::Status((*sha).to_owned()))
            }
            _ => None,
        }
    }

    fn serve(
        &mut self,
        route: Route,
        method: &Method,
        query: &BTreeMap<String, String>,
        body: Option<Value>,
        what: &str,
    ) -> Response {
        match (route, method.as_str()) {
            (Route::User, "GET") if self.kind == Kind::GitHub && self.app_token => {
                message(403, "Resource not accessible by integration")
            }
            (Route::User, "GET") => {
                if !query.is_empty() {
                    self.violations.push(format!("{what}: a query"));
                }
                answer(
                    200,
                    Vec::new(),
                    json!({ "login": BOT, "username": BOT, "id": user_id(BOT), "type": "User" }),
                )
            }
            (Route::Comments(n), "GET") | (Route::CommentsById(n), "GET") => {
                self.list(n, query, what)
            }
            (Route::Comments(n), "POST") => {
                if !query.is_empty() {
                    self.violations.push(format!("{what}: a query on a write"));
                }
                let Some(text) = self.comment_body(body, what) else {
                    return message(422, "Validation Failed: body");
                };
                let Some(comments) = self.comments.get_mut(&n) else {
                    return message(404, "Not Found");
                };
                self.next_id += 1;
                let comment = Comment {
                    id: self.next_id,
                    body: text,
                    system: false,
                    author: if self.app_token { APP_BOT } else { BOT },
                };
                comments.push(comment.clone());
                answer(201, Vec::new(), self.render(&comment))
            }
            (Route::Comment(n, id), "PATCH") if self.kind == Kind::GitHub => {
                self.update(n, id, body, what)
            }
            (Route::Comment(n, id), "PUT") if self.kind == Kind::GitLab => {
                self.update(n, id, body, what)
            }
            (Route::Status(sha), "POST") => self.status(sha, body, what),
            (_, method) => {
                self.violations
                    .push(format!("{what}: {method} is not allowed here"));
                message(405, "Method Not Allowed")
            }
        }
    }

    fn list(&mut self, n: u64, query: &BTreeMap<String, String>, what: &str) -> Response {
        let mut expected: BTreeMap<String, String> = match self.kind {
            Kind::GitHub => vec![("per_page", "100")],
            Kind::GitLab => vec![
                ("per_page", "100"),
                ("sort", "asc"),
                ("order_by", "created_at"),
            ],
        }
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let page: usize = match query.get("page") {
            Some(page) => match page.parse::<usize>() {
                Ok(page) if page >= 1 => {
                    expected.insert("page".into(), page.to_string());
                    page
                }
                _ => {
                    self.violations.push(format!("{what}: page {page:?}"));
                    return message(400, "bad page");
                }
            },
            None => 1,
        };
        if *query != expected {
            self.violations
                .push(format!("{what}: query {query:?}, expected {expected:?}"));
        }
        let Some(comments) = self.comments.get(&n) else {
            return message(404, "Not Found");
        };
        let per_page: usize = 100;
        let pages = comments.len().div_ceil(per_page).max(1);
        let items: Vec<Value> = comments
            .iter()
            .skip((page - 1) * per_page)
            .take(per_page)
            .map(|c| self.render(c))
            .collect();
        let mut headers = Vec::new();
        if page < pages {
            match self.kind {
                Kind::GitHub => {
                    let origin = if self.foreign_next {
                        "http://elsewhere.invalid".to_owned()
                    } else {
                        self.origin.clone()
                    };
                    let link = |p: usize, rel: &str| {
                        format!(
                            "<{origin}{}/repositories/{GITHUB_REPO_ID}/issues/{n}/comments?per_page=100&page={p}>; rel=\"{rel}\"",
                            self.base
                        )
                    };
                    headers.push((
                        "link",
                        format!("{}, {}", link(page + 1, "next"), link(pages, "last")),
                    ));
                }
                Kind::GitLab => headers.push(("x-next-page", (page + 1).to_string())),
            }
        } else if self.kind == Kind::GitLab {
            headers.push(("x-next-page", String::new()));
        }
        if self.kind == Kind::GitLab {
            headers.push(("x-page", page.to_string()));
            headers.push(("x-per-page", per_page.to_string()));
        }
        answer(200, headers, Value::Array(items))
    }

    fn update(&mut self, n: u64, id: u64, body: Option<Value>, what: &str) -> Response {
        let Some(text) = self.comment_body(body, what) else {
            return message(422, "Validation Failed: body");
        };
        let found = self
            .comments
            .iter_mut()
            .filter(|(number, _)| n == 0 || **number == n)
            .flat_map(|(_, comments)| comments.iter_mut())
            .find(|c| c.id == id);
        match found {
            Some(comment) => {
                comment.body = text;
                let comment = comment.clone();
                answer(200, Vec::new(), self.render(&comment))
            }
            None => message(404, "Not Found"),
        }
    }

    fn status(&mut self, sha: String, body: Option<Value>, what: &str) -> Response {
        let body = body.unwrap_or_default();
        let object = body.as_object().cloned().unwrap_or_default();
        let (name_key, states, limit): (&str, &[&str], usize) = match self.kind {
            Kind::GitHub => ("context", &["error", "failure", "pending", "success"], 140),
            Kind::GitLab => (
                "name",
                &["pending", "running", "success", "failed", "canceled"],
                255,
            ),
        };
        let allowed = ["state", name_key, "description", "target_url"];
        if let Some(key) = object.keys().find(|k| !allowed.contains(&k.as_str())) {
            self.violations.push(format!("{what}: unknown field {key}"));
        }
        if object.get(name_key) != Some(&json!("plumber")) {
            self.violations
                .push(format!("{what}: {name_key} is not plumber"));
        }
        let state = object.get("state").and_then(Value::as_str).unwrap_or("");
        if !states.contains(&state) {
            self.violations.push(format!("{what}: state {state:?}"));
            return message(422, "Validation Failed: state");
        }
        let description = object
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        if description.chars().count() > limit {
            self.violations.push(format!(
                "{what}: a description of {} characters",
                description.chars().count()
            ));
            return message(422, "Validation Failed: description is too long");
        }
        if !(sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit())) {
            return message(422, "No commit found for SHA");
        }
        // GitLab's state machine: a pending or running status over another is refused.
        let last = self
            .statuses
            .iter()
            .rev()
            .find(|(of, _)| *of == sha)
            .and_then(|(_, b)| b["state"].as_str());
        if self.kind == Kind::GitLab
            && let Some(last @ ("pending" | "running")) = last
            && (state == "pending" || (state == "running" && last == "running"))
        {
            let event = if state == "pending" { "enqueue" } else { "run" };
            return message(
                400,
                &format!(
                    "Cannot transition status via :{event} from :{last} (Reason(s): Status \
                     cannot transition via \"{event}\")"
                ),
            );
        }
        self.statuses.push((sha, body.clone()));
        answer(
            201,
            Vec::new(),
            json!({ "id": self.statuses.len(), "state": state }),
        )
    }

    /// The `body` of a comment write: exactly `{"body": STRING}`, within the forge's limit.
    fn comment_body(&mut self, body: Option<Value>, what: &str) -> Option<String> {
        let object = body
            .and_then(|b| b.as_object().cloned())
            .unwrap_or_default();
        if object.len() != 1 {
            self.violations.push(format!(
                "{what}: fields {:?}",
                object.keys().collect::<Vec<_>>()
            ));
        }
        let Some(text) = object.get("body").and_then(Value::as_str) else {
            self.violations.push(format!("{what}: no body"));
            return None;
        };
        let length = text.chars().count();
        if length > self.kind.comment_limit() {
            self.violations
                .push(format!("{what}: a comment of {length} characters"));
            return None;
        }
        Some(text.to_owned())
    }

    fn render(&self, comment: &Comment) -> Value {
        match self.kind {
            Kind::GitHub => {
                let app = comment.author == APP_BOT;
                json!({
                    "id": comment.id,
                    "body": comment.body,
                    "user": {
                        "login": comment.author,
                        "id": user_id(comment.author),
                        "type": if app { "Bot" } else { "User" },
                    },
                    "performed_via_github_app": if app { json!({ "slug": "plumber-app" }) } else { Value::Null },
                    "html_url": format!("https://github.com/{GITHUB_REPO}/pull/1#issuecomment-{}", comment.id),
                })
            }
            Kind::GitLab => json!({
                "id": comment.id,
                "body": comment.body,
                "system": comment.system,
                "author": { "id": user_id(comment.author), "username": comment.author },
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The client's side.

/// A clock that records the waits and moves on by them, without sleeping.
struct TestClock {
    now: Mutex<SystemTime>,
    sleeps: Mutex<Vec<Duration>>,
}

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap()
    }

    fn sleep(&self, duration: Duration) {
        self.sleeps.lock().unwrap().push(duration);
        *self.now.lock().unwrap() += duration;
    }
}

struct Setup {
    server: Server,
    clock: Arc<TestClock>,
    forge: Box<dyn Forge>,
    config: Config,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn sleeps(&self) -> Vec<Duration> {
        self.clock.sleeps.lock().unwrap().clone()
    }

    fn upsert(&self, number: u64, markdown: &str) -> forge::Result<CommentOutcome> {
        let markdown = markdown.to_owned();
        self.forge
            .upsert_plan_comment(number, &move |_| markdown.clone())
    }

    /// The token's account is asked for once, before the first comment is looked for.
    fn user_line(&self) -> String {
        match self.config.kind {
            Kind::GitHub => "GET /api/v3/user".into(),
            Kind::GitLab => "GET /api/v4/user".into(),
        }
    }

    fn comments_path(&self, number: u64) -> String {
        match self.config.kind {
            Kind::GitHub => format!("/api/v3/repos/{GITHUB_REPO}/issues/{number}/comments"),
            Kind::GitLab => {
                format!("/api/v4/projects/{GITLAB_PROJECT}/merge_requests/{number}/notes")
            }
        }
    }

    /// What the client's second page request looks like.
    fn page_two(&self, number: u64) -> String {
        match self.config.kind {
            Kind::GitHub => {
                format!("GET /api/v3/repositories/{GITHUB_REPO_ID}/issues/{number}/comments page=2")
            }
            Kind::GitLab => format!("GET {} page=2", self.comments_path(number)),
        }
    }

    fn update_line(&self, number: u64, id: u64) -> String {
        match self.config.kind {
            Kind::GitHub => format!("PATCH /api/v3/repos/{GITHUB_REPO}/issues/comments/{id}"),
            Kind::GitLab => format!("PUT {}/{id}", self.comments_path(number)),
        }
    }

    fn status_line(&self) -> String {
        match self.config.kind {
            Kind::GitHub => format!("POST /api/v3/repos/{GITHUB_REPO}/statuses/{SHA}"),
            Kind::GitLab => format!("POST /api/v4/projects/{GITLAB_PROJECT}/statuses/{SHA}"),
        }
    }

    fn plan_comments(&self, number: u64) -> Vec<Comment> {
        self.server
            .comments(number)
            .into_iter()
            .filter(|c| c.body.starts_with(MARKER))
            .collect()
    }
}

fn setup(kind: Kind) -> Setup {
    setup_with(kind, &format!("{TOKEN}\n"), Settings::default())
}

fn setup_with(kind: Kind, token_file_text: &str, settings: Settings) -> Setup {
    let server = Server::start(kind);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token_file_text).unwrap();
    let config = Config::new(kind, GITHUB_REPO, &token_file).with_url(&server.url);
    let clock = Arc::new(TestClock {
        now: Mutex::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
        sleeps: Mutex::new(Vec::new()),
    });
    let forge = forge::connect_with(&config, settings, clock.clone()).unwrap();
    Setup {
        server,
        clock,
        forge,
        config,
        _dir: dir,
    }
}

fn success() -> CommitStatus {
    CommitStatus::new(State::Success, "valid; 2 steps change")
}

// ---------------------------------------------------------------------------------------------
// The tests.

fn comment_is_created_once_then_updated_in_place(kind: Kind) {
    let s = setup(kind);
    s.server.seed(7, 3, None, "");
    let comments = s.comments_path(7);

    let Ok(CommentOutcome::Created(id)) = s.upsert(7, "plan A") else {
        panic!("not created: {:?}", s.server.lines());
    };
    assert_eq!(
        s.server.lines(),
        [
            s.user_line(),
            format!("GET {comments}"),
            format!("POST {comments}")
        ]
    );
    let created = s.server.requests()[2].body.clone();
    assert_eq!(
        created,
        Some(json!({ "body": format!("{MARKER}\nplan A") }))
    );

    s.server.clear_requests();
    assert_eq!(s.upsert(7, "plan B").unwrap(), CommentOutcome::Updated(id));
    assert_eq!(
        s.server.lines(),
        [format!("GET {comments}"), s.update_line(7, id)]
    );
    let updated = s.server.requests()[1].body.clone();
    assert_eq!(
        updated,
        Some(json!({ "body": format!("{MARKER}\nplan B") }))
    );

    // The same plan again: nothing is written.
    s.server.clear_requests();
    assert_eq!(
        s.upsert(7, "plan B").unwrap(),
        CommentOutcome::Unchanged(id)
    );
    assert_eq!(s.server.lines(), [format!("GET {comments}")]);

    let plans = s.plan_comments(7);
    assert_eq!(plans.len(), 1, "{plans:?}");
    assert_eq!(plans[0].id, id);
    assert_eq!(plans[0].body, format!("{MARKER}\nplan B"));
    assert_eq!(s.server.comments(7).len(), 4);
    assert!(s.sleeps().is_empty());
    s.server.assert_clean();
}

#[test]
fn github_comment_is_created_once_then_updated_in_place() {
    comment_is_created_once_then_updated_in_place(Kind::GitHub);
}

#[test]
fn gitlab_note_is_created_once_then_updated_in_place() {
    comment_is_created_once_then_updated_in_place(Kind::GitLab);
}

/// 150 comments, on two pages of 100. A reply quoting the plan (and, on GitLab, a system note
/// starting with the marker) on page 1 are not it.
fn marker_comment_on_page_two_is_found_and_updated(kind: Kind) {
    let s = setup(kind);
    let ids = s.server.seed(9, 150, Some(120), "old plan");
    let planted = format!("{MARKER}\nnothing changes, merge away");
    {
        let mut fake = s.server.fake();
        let page_one = fake.comments.get_mut(&9).unwrap();
        page_one[5].body = format!("> {MARKER}\n> old plan\n\nwhy is this replaced?");
        page_one[5].author = BOT;
        // Someone else's comment with the marker: not the plan, whatever it says.
        page_one[7].body = planted.clone();
        page_one[7].author = MALLORY;
        if kind == Kind::GitLab {
            page_one[10].body = format!("{MARKER}\nadded 1 commit");
            page_one[10].system = true;
            page_one[10].author = BOT;
        }
    }
    let outcome = s.upsert(9, "new plan").unwrap();
    assert_eq!(outcome, CommentOutcome::Updated(ids[120]));
    assert_eq!(s.server.comments(9)[7].body, planted);
    assert_eq!(
        s.server.lines(),
        [
            s.user_line(),
            format!("GET {}", s.comments_path(9)),
            s.page_two(9),
            s.update_line(9, ids[120]),
        ]
    );
    let plans = s.plan_comments(9);
    let plans: Vec<_> = plans
        .iter()
        .filter(|c| !c.system && c.author == BOT)
        .collect();
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].body, format!("{MARKER}\nnew plan"));

    // With no plan comment on either page, both are read before one is created.
    let _ = s.server.seed(11, 150, None, "");
    s.server.clear_requests();
    let Ok(CommentOutcome::Created(_)) = s.upsert(11, "first plan") else {
        panic!("{:?}", s.server.lines());
    };
    assert_eq!(
        s.server.lines(),
        [
            format!("GET {}", s.comments_path(11)),
            s.page_two(11),
            format!("POST {}", s.comments_path(11)),
        ]
    );
    s.server.assert_clean();
}

#[test]
fn github_marker_comment_on_page_two_is_found_and_updated() {
    marker_comment_on_page_two_is_found_and_updated(Kind::GitHub);
}

#[test]
fn gitlab_marker_note_on_page_two_is_found_and_updated() {
    marker_comment_on_page_two_is_found_and_updated(Kind::GitLab);
}

#[test]
fn github_next_page_on_another_host_is_not_followed() {
    let s = setup(Kind::GitHub);
    s.server.seed(3, 150, None, "");
    s.server.fake().foreign_next = true;
    let error = s.upsert(3, "plan").unwrap_err();
    assert!(matches!(error, Error::Protocol { .. }), "{error}");
    assert!(
        error.to_string().contains("not under the API's URL"),
        "{error}"
    );
    assert!(!error.is_retryable());
    assert_eq!(
        s.server.lines(),
        [s.user_line(), format!("GET {}", s.comments_path(3))]
    );
    s.server.assert_clean();
}

fn statuses_success_and_failure_with_the_first_error(kind: Kind) {
    let s = setup(kind);
    let details = "https://plumber.example/api/plans/refs%2Fpull%2F7%2Fhead?format=markdown";
    s.forge
        .set_commit_status(SHA, &success().with_target_url(details))
        .unwrap();
    let first_error = format!(
        "topologies/orders/enrich.yaml:12:5: unknown input `paymnts`; did you mean `payments`? {}",
        "é".repeat(300)
    );
    s.forge
        .set_commit_status(SHA, &CommitStatus::new(State::Failure, first_error.clone()))
        .unwrap();
    s.forge
        .set_commit_status(SHA, &CommitStatus::new(State::Running, "planning"))
        .unwrap();
    assert_eq!(s.server.lines(), vec![s.status_line(); 3]);

    let statuses = s.server.statuses();
    let (name, failed, running, limit) = match kind {
        Kind::GitHub => ("context", "failure", "pending", 140),
        Kind::GitLab => ("name", "failed", "running", 255),
    };
    assert_eq!(statuses[0].0, SHA);
    assert_eq!(
        statuses[0].1,
        json!({
            "state": "success",
            name: "plumber",
            "description": "valid; 2 steps change",
            "target_url": details,
        })
    );
    let failure = &statuses[1].1;
    assert_eq!(failure["state"], failed);
    let description = failure["description"].as_str().unwrap();
    assert_eq!(description.chars().count(), limit);
    assert!(description.ends_with('…'));
    assert!(first_error.starts_with(description.trim_end_matches('…')));
    assert!(failure.get("target_url").is_none());
    assert_eq!(statuses[2].1["state"], running);

    // A commit named otherwise than by its full id is refused before any request.
    s.server.clear_requests();
    let error = s.forge.set_commit_status("main", &success()).unwrap_err();
    assert!(
        matches!(error, Error::Invalid { field: "sha", .. }),
        "{error}"
    );
    assert!(s.server.lines().is_empty());
    s.server.assert_clean();
}

#[test]
fn github_statuses_success_and_failure_with_the_first_error() {
    statuses_success_and_failure_with_the_first_error(Kind::GitHub);
}

#[test]
fn gitlab_statuses_success_and_failure_with_the_first_error() {
    statuses_success_and_failure_with_the_first_error(Kind::GitLab);
}

fn a_502_then_success_is_retried(kind: Kind) {
    let s = setup(kind);
    s.server.fail_next(Fault::status(502));
    s.forge.set_commit_status(SHA, &success()).unwrap();
    assert_eq!(s.server.lines(), vec![s.status_line(); 2]);
    assert_eq!(s.server.statuses().len(), 1);
    // One backoff: half of the first (1 s) and a random part of the other half.
    let sleeps = s.sleeps();
    assert_eq!(sleeps.len(), 1);
    assert!(
        (Duration::from_millis(500)..=Duration::from_secs(1)).contains(&sleeps[0]),
        "{sleeps:?}"
    );
    s.server.assert_clean();
}

#[test]
fn github_a_502_then_success_is_retried() {
    a_502_then_success_is_retried(Kind::GitHub);
}

#[test]
fn gitlab_a_502_then_success_is_retried() {
    a_502_then_success_is_retried(Kind::GitLab);
}

/// The forge creates the comment, then its answer is a 502: the retry finds the comment by
/// its marker and creates no second one.
fn a_lost_answer_creates_no_second_comment(kind: Kind) {
    let s = setup(kind);
    s.server.seed(5, 2, None, "");
    s.server.fail(2, Fault::status(502).after_effect());
    let outcome = s.upsert(5, "plan").unwrap();
    let comments = s.comments_path(5);
    assert_eq!(
        s.server.lines(),
        [
            s.user_line(),
            format!("GET {comments}"),
            format!("POST {comments}"),
            format!("GET {comments}"),
        ]
    );
    let plans = s.plan_comments(5);
    assert_eq!(plans.len(), 1);
    assert_eq!(outcome, CommentOutcome::Unchanged(plans[0].id));
    s.server.assert_clean();
}

#[test]
fn github_a_lost_answer_creates_no_second_comment() {
    a_lost_answer_creates_no_second_comment(Kind::GitHub);
}

#[test]
fn gitlab_a_lost_answer_creates_no_second_note() {
    a_lost_answer_creates_no_second_comment(Kind::GitLab);
}

fn a_429_waits_what_retry_after_says(kind: Kind) {
    let s = setup(kind);
    s.server.seed(8, 1, None, "");
    s.server
        .fail(1, Fault::status(429).header("retry-after", "7"));
    let Ok(CommentOutcome::Created(_)) = s.upsert(8, "plan") else {
        panic!("{:?}", s.server.lines());
    };
    assert_eq!(s.sleeps(), [Duration::from_secs(7)]);
    let comments = s.comments_path(8);
    assert_eq!(
        s.server.lines(),
        [
            s.user_line(),
            format!("GET {comments}"),
            format!("GET {comments}"),
            format!("POST {comments}"),
        ]
    );

    // A limit that lifts in an hour, longer than the longest wait (60 s): given up at once,
    // as an error that says retrying later helps.
    s.server.clear_requests();
    s.server
        .fail_next(Fault::status(429).header("retry-after", "3600"));
    let error = s.forge.set_commit_status(SHA, &success()).unwrap_err();
    assert!(
        matches!(error, Error::RateLimited { wait, .. } if wait == Duration::from_secs(3600)),
        "{error}"
    );
    assert!(error.is_retryable());
    assert_eq!(s.server.lines(), [s.status_line()]);
    assert_eq!(s.sleeps().len(), 1);
    s.server.assert_clean();
}

#[test]
fn github_a_429_waits_what_retry_after_says() {
    a_429_waits_what_retry_after_says(Kind::GitHub);
}

#[test]
fn gitlab_a_429_waits_what_retry_after_says() {
    a_429_waits_what_retry_after_says(Kind::GitLab);
}

/// GitHub's primary rate limit: 403 with no requests remaining, until the reset time.
#[test]
fn github_rate_limit_403_waits_until_the_reset() {
    let s = setup(Kind::GitHub);
    let now = s
        .clock
        .now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    s.server.fail_next(
        Fault::status(403)
            .header("x-ratelimit-remaining", "0")
            .header("x-ratelimit-reset", (now + 30).to_string()),
    );
    s.forge.set_commit_status(SHA, &success()).unwrap();
    // Until the reset second is past.
    assert_eq!(s.sleeps(), [Duration::from_secs(31)]);
    assert_eq!(s.server.lines(), vec![s.status_line(); 2]);

    // A 403 that is no rate limit (a token without the permission) is not retried.
    s.server.clear_requests();
    s.server.fail_next(Fault::status(403));
    let error = s.forge.set_commit_status(SHA, &success()).unwrap_err();
    assert!(
        matches!(error, Error::Status { status: 403, .. }),
        "{error}"
    );
    assert!(!error.is_retryable());
    assert!(
        error.to_string().contains("retrying will not help"),
        "{error}"
    );
    assert_eq!(s.server.lines(), [s.status_line()]);
    assert_eq!(s.sleeps().len(), 1);
    s.server.assert_clean();
}

fn attempts_are_bounded_and_back_off(kind: Kind) {
    let s = setup(kind);
    for later in 0..10 {
        s.server.fail(later, Fault::status(503));
    }
    let error = s.forge.set_commit_status(SHA, &success()).unwrap_err();
    assert!(
        matches!(&error, Error::GaveUp { attempts: 5, last } if matches!(**last, Error::Status { status: 503, .. })),
        "{error}"
    );
    assert!(error.is_retryable());
    assert_eq!(s.server.lines(), vec![s.status_line(); 5]);
    let sleeps = s.sleeps();
    assert_eq!(sleeps.len(), 4);
    for (i, sleep) in sleeps.iter().enumerate() {
        let full = Duration::from_secs(1 << i);
        assert!((full / 2..=full).contains(sleep), "wait {i}: {sleep:?}");
    }
    s.server.assert_clean();
}

#[test]
fn github_attempts_are_bounded_and_back_off() {
    attempts_are_bounded_and_back_off(Kind::GitHub);
}

#[test]
fn gitlab_attempts_are_bounded_and_back_off() {
    attempts_are_bounded_and_back_off(Kind::GitLab);
}

/// A plan longer than the forge takes: the renderer is asked for the budget the limit leaves
/// and its shortened text is sent; a renderer that ignores the budget sends nothing.
fn an_over_limit_comment_is_shortened_by_the_renderer(kind: Kind) {
    let s = setup(kind);
    s.server.seed(4, 0, None, "");
    let limit = kind.comment_limit();
    // Two-byte characters: the limit is in characters, not bytes.
    let row = "| é-step | replaced |\n";
    let rows = limit / row.chars().count() + 10;
    let full = format!("| step | action |\n|---|---|\n{}", row.repeat(rows));
    assert!(full.chars().count() > limit);
    let budgets = Mutex::new(Vec::new());
    let render = |budget: usize| {
        budgets.lock().unwrap().push(budget);
        if full.chars().count() <= budget {
            return full.clone();
        }
        // Whole rows only, then a note of what was left out (as `markdown_within` does).
        let note_room = 40;
        let keep = (budget - note_room - 30) / row.chars().count();
        format!(
            "| step | action |\n|---|---|\n{}\n… and {} more changed steps\n",
            row.repeat(keep),
            rows - keep
        )
    };
    let Ok(CommentOutcome::Created(_)) = s.forge.upsert_plan_comment(4, &render) else {
        panic!("{:?}", s.server.lines());
    };
    assert_eq!(
        *budgets.lock().unwrap(),
        [limit - MARKER.chars().count() - 1]
    );
    let sent = s.server.requests()[2].body.clone().unwrap();
    let sent = sent["body"].as_str().unwrap();
    assert!(sent.chars().count() <= limit);
    assert!(sent.starts_with(MARKER));
    assert!(sent.contains("more changed steps"));

    // A renderer that ignores its budget: refused, and nothing sent.
    s.server.clear_requests();
    let error = s
        .forge
        .upsert_plan_comment(4, &|_| full.clone())
        .unwrap_err();
    assert!(
        matches!(error, Error::TooLong { length, limit: l } if l == limit && length > limit),
        "{error}"
    );
    assert!(!error.is_retryable());
    assert!(s.server.lines().is_empty());
    s.server.assert_clean();
}

#[test]
fn github_an_over_limit_comment_is_shortened_by_the_renderer() {
    an_over_limit_comment_is_shortened_by_the_renderer(Kind::GitHub);
}

#[test]
fn gitlab_an_over_limit_note_is_shortened_by_the_renderer() {
    an_over_limit_comment_is_shortened_by_the_renderer(Kind::GitLab);
}

fn a_404_is_not_retried(kind: Kind) {
    let s = setup(kind);
    // No pull request 404.
    let error = s.upsert(404, "plan").unwrap_err();
    assert!(
        matches!(error, Error::Status { status: 404, .. }),
        "{error}"
    );
    assert!(!error.is_retryable());
    let text = error.to_string();
    assert!(text.contains("retrying will not help"), "{text}");
    assert!(text.contains("--forge-repo"), "{text}");
    assert_eq!(
        s.server.lines(),
        [s.user_line(), format!("GET {}", s.comments_path(404))]
    );
    assert!(s.sleeps().is_empty());
    s.server.assert_clean();
}

#[test]
fn github_a_404_is_not_retried() {
    a_404_is_not_retried(Kind::GitHub);
}

#[test]
fn gitlab_a_404_is_not_retried() {
    a_404_is_not_retried(Kind::GitLab);
}

/// The fake answers a wrong token with a 401 that repeats it: the error must not.
#[test]
fn the_token_is_in_no_error_and_no_debug_output() {
    let wrong = "glpat-WRONG-0123456789";
    for kind in [Kind::GitHub, Kind::GitLab] {
        let s = setup_with(kind, &format!("{wrong}\r\n"), Settings::default());
        let error = s.upsert(1, "plan").unwrap_err();
        assert!(
            matches!(error, Error::Status { status: 401, .. }),
            "{error}"
        );
        assert!(!error.is_retryable());
        let shown = format!("{error} {error:?}");
        assert!(shown.contains("Bad credentials"), "{shown}");
        assert!(!shown.contains(wrong), "{shown}");
        let status_error = s.forge.set_commit_status(SHA, &success()).unwrap_err();
        assert!(!format!("{status_error} {status_error:?}").contains(wrong));
        assert!(!format!("{:?} {:?}", s.config, s.forge).contains(wrong));

        let good = setup(kind);
        assert!(!format!("{:?} {:?}", good.config, good.forge).contains(TOKEN));
    }

    // Nothing listens: the transport errors, retried and given up, do not carry it either.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/api/v3", closed.local_addr().unwrap());
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let config = Config::new(Kind::GitHub, GITHUB_REPO, &token_file).with_url(url);
    let clock = Arc::new(TestClock {
        now: Mutex::new(SystemTime::UNIX_EPOCH),
        sleeps: Mutex::new(Vec::new()),
    });
    let forge = forge::connect_with(&config, Settings::default().attempts(2), clock).unwrap();
    let error = forge.set_commit_status(SHA, &success()).unwrap_err();
    assert!(
        matches!(&error, Error::GaveUp { attempts: 2, last } if matches!(**last, Error::Transport { .. })),
        "{error}"
    );
    assert!(error.is_retryable());
    assert!(!format!("{error} {error:?}").contains(TOKEN));
}

#[test]
fn token_files_that_are_empty_or_missing_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-token");
    let config = Config::new(Kind::GitHub, GITHUB_REPO, &missing);
    let error = forge::connect(&config).unwrap_err();
    assert!(matches!(error, Error::TokenFile { .. }), "{error}");
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );

    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let config = Config::new(Kind::GitLab, "acme/topologies", &empty);
    let error = forge::connect(&config).unwrap_err();
    assert!(matches!(error, Error::EmptyToken { .. }), "{error}");
    assert!(
        error.to_string().contains(&empty.display().to_string()),
        "{error}"
    );
}

/// The token file is read again before each operation: a rotated Secret takes effect without
/// reconnecting, and a file emptied since is an error naming it.
#[test]
fn a_rotated_token_takes_effect_at_the_next_operation() {
    let s = setup_with(Kind::GitHub, "old-token\n", Settings::default());
    let error = s.forge.set_commit_status(SHA, &success()).unwrap_err();
    assert!(
        matches!(error, Error::Status { status: 401, .. }),
        "{error}"
    );
    std::fs::write(&s.config.token_file, format!("{TOKEN}\n")).unwrap();
    s.forge.set_commit_status(SHA, &success()).unwrap();
    assert_eq!(s.server.statuses().len(), 1);

    std::fs::write(&s.config.token_file, "").unwrap();
    let error = s.forge.set_commit_status(SHA, &success()).unwrap_err();
    assert!(matches!(error, Error::EmptyToken { .. }), "{error}");
    assert_eq!(s.server.lines(), vec![s.status_line(); 2]);
    s.server.assert_clean();
}

/// A GitHub App's installation token has no user (`GET /user` is refused): its comments are
/// those made through an app, and a person's comment with the marker is still not the plan.
#[test]
fn github_app_token_finds_its_comment_by_the_app() {
    let s = setup(Kind::GitHub);
    s.server.fake().app_token = true;
    let ids = s.server.seed(6, 3, None, "");
    {
        let mut fake = s.server.fake();
        let comments = fake.comments.get_mut(&6).unwrap();
        comments[1].body = format!("{MARKER}\nplanted");
        comments[1].author = MALLORY;
    }
    let Ok(CommentOutcome::Created(id)) = s.upsert(6, "plan A") else {
        panic!("{:?}", s.server.lines());
    };
    assert_ne!(id, ids[1]);
    s.server.clear_requests();
    assert_eq!(s.upsert(6, "plan B").unwrap(), CommentOutcome::Updated(id));
    // The account is asked once (not again at the second operation).
    assert_eq!(
        s.server.lines(),
        [format!("GET {}", s.comments_path(6)), s.update_line(6, id)]
    );
    let comments = s.server.comments(6);
    assert_eq!(comments[1].body, format!("{MARKER}\nplanted"));
    assert_eq!(comments[3].author, APP_BOT);
    assert_eq!(comments[3].body, format!("{MARKER}\nplan B"));
    s.server.assert_clean();
}

/// GitLab answers 400 to a pending status over a pending one: that is success (it is set).
#[test]
fn gitlab_pending_twice_is_pending() {
    let s = setup(Kind::GitLab);
    let pending = CommitStatus::new(State::Pending, "planning");
    s.forge.set_commit_status(SHA, &pending).unwrap();
    s.forge.set_commit_status(SHA, &pending).unwrap();
    s.forge.set_commit_status(SHA, &success()).unwrap();
    assert_eq!(s.server.lines(), vec![s.status_line(); 3]);
    let states: Vec<_> = s
        .server
        .statuses()
        .iter()
        .map(|(_, body)| body["state"].clone())
        .collect();
    assert_eq!(states, [json!("pending"), json!("success")]);
    assert!(s.sleeps().is_empty());
    s.server.assert_clean();
}
