//! A fake GitHub and a fake GitLab for the forge tests: a real HTTP server (axum) on a free
//! loopback port that keeps pull requests' comments and commit statuses like the forge does,
//! checks every request it gets (method, path, query, authentication headers, content type,
//! JSON body, the forge's limits) and records them. A request the real API would not take is
//! recorded as a violation ([`Server::assert_clean`]).
//!
//! Faults are injected as the answer to the next request(s) ([`Server::fail`]). Included by
//! `tests/forge.rs` (the clients) and `tests/forge_publish.rs` (the daemon) with `#[path]`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test uses a part; tests fail loudly

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use plumber::forge::{Kind, MARKER, PullRequestState};
use serde_json::{Value, json};

/// The only token the fake takes.
pub const TOKEN: &str = "tok-5ecret-ABC123";
/// GitHub's repository, and its id in the `next` links GitHub gives.
pub const GITHUB_REPO: &str = "acme/topologies";
pub const GITHUB_REPO_ID: u64 = 4242;
/// GitLab's project path, as it must appear in request paths.
pub const GITLAB_PROJECT: &str = "acme%2Ftopologies";

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub body: Option<Value>,
}

impl Recorded {
    /// `METHOD path`, with the page when there is one: what the sequence assertions read.
    pub fn line(&self) -> String {
        match self.query.get("page") {
            Some(page) => format!("{} {} page={page}", self.method, self.path),
            None => format!("{} {}", self.method, self.path),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Comment {
    pub id: u64,
    pub body: String,
    /// GitLab's own notes ("added 1 commit").
    pub system: bool,
    pub author: &'static str,
}

/// The token's account, and the authors of the other comments.
pub const BOT: &str = "plumber-bot";
/// The bot user of a GitHub App's installation token.
pub const APP_BOT: &str = "plumber-app[bot]";
pub const ALICE: &str = "alice";
pub const MALLORY: &str = "mallory";

pub fn user_id(login: &str) -> u64 {
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
pub struct Fault {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub after_effect: bool,
}

impl Fault {
    pub fn status(status: u16) -> Fault {
        Fault {
            status,
            headers: Vec::new(),
            after_effect: false,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Fault {
        self.headers.push((name, value.into()));
        self
    }

    pub fn after_effect(mut self) -> Fault {
        self.after_effect = true;
        self
    }
}

/// A pull request (GitLab: merge request) as the forge keeps it; tests set it.
#[derive(Debug, Clone)]
pub struct PullRequest {
    pub state: PullRequestState,
    pub labels: Vec<String>,
    /// Its head commit, as the forge knows it (`None`: not given out).
    pub head: Option<String>,
}

pub struct Fake {
    pub kind: Kind,
    /// `http://127.0.0.1:PORT`.
    pub origin: String,
    /// The API's path on the server: `/api/v3` (GitHub Enterprise) or `/api/v4`.
    pub base: String,
    pub comments: BTreeMap<u64, Vec<Comment>>,
    pub next_id: u64,
    pub statuses: Vec<(String, Value)>,
    /// By the index of the request they answer.
    pub faults: BTreeMap<usize, Fault>,
    pub requests: Vec<Recorded>,
    pub violations: Vec<String>,
    /// GitHub: the `next` link of a comments page points to another host.
    pub foreign_next: bool,
    /// GitHub: the token is a GitHub App's installation token (it has no user).
    pub app_token: bool,
    /// By number (GitLab: iid); one not here answers 404.
    pub pull_requests: BTreeMap<u64, PullRequest>,
}

pub struct Server {
    pub state: Arc<Mutex<Fake>>,
    pub url: String,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub thread: Option<std::thread::JoinHandle<()>>,
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
    pub fn start(kind: Kind) -> Server {
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
            pull_requests: BTreeMap::new(),
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

    pub fn fake(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.state.lock().unwrap()
    }

    /// Puts `count` comments on pull request `number`; the one at `marker_at` is the plan
    /// comment, saying `plan`.
    pub fn seed(
        &self,
        number: u64,
        count: usize,
        marker_at: Option<usize>,
        plan: &str,
    ) -> Vec<u64> {
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

    /// Pull request `number` is now in `state`, with `labels` (its head as it was).
    pub fn set_pull_request(&self, number: u64, state: PullRequestState, labels: &[&str]) {
        let mut fake = self.fake();
        let head = fake.pull_requests.get(&number).and_then(|p| p.head.clone());
        fake.pull_requests.insert(
            number,
            PullRequest {
                state,
                labels: labels.iter().map(|l| (*l).to_owned()).collect(),
                head,
            },
        );
    }

    /// Pull request `number`'s head is now `head` (as a push to its branch makes it).
    pub fn set_head(&self, number: u64, head: &str) {
        if let Some(pull) = self.fake().pull_requests.get_mut(&number) {
            pull.head = Some(head.to_owned());
        }
    }

    /// The labels of pull request `number` now.
    pub fn labels(&self, number: u64) -> Vec<String> {
        self.fake()
            .pull_requests
            .get(&number)
            .map(|p| p.labels.clone())
            .unwrap_or_default()
    }

    /// `fault` answers the request `later` requests from now (0: the next one).
    pub fn fail(&self, later: usize, fault: Fault) {
        let mut fake = self.fake();
        let index = fake.requests.len() + later;
        fake.faults.insert(index, fault);
    }

    pub fn fail_next(&self, fault: Fault) {
        self.fail(0, fault);
    }

    pub fn lines(&self) -> Vec<String> {
        self.fake().requests.iter().map(Recorded::line).collect()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.fake().requests.clone()
    }

    /// Forgets the requests so far (and any fault not yet used).
    pub fn clear_requests(&self) {
        let mut fake = self.fake();
        fake.requests.clear();
        fake.faults.clear();
    }

    pub fn comments(&self, number: u64) -> Vec<Comment> {
        self.fake()
            .comments
            .get(&number)
            .cloned()
            .unwrap_or_default()
    }

    pub fn statuses(&self) -> Vec<(String, Value)> {
        self.fake().statuses.clone()
    }

    /// Every request was one the forge's API takes.
    pub fn assert_clean(&self) {
        let fake = self.fake();
        assert!(
            fake.violations.is_empty(),
            "requests the forge would refuse: {:#?}",
            fake.violations
        );
    }
}

pub async fn handle(
    AxumState(state): AxumState<Arc<Mutex<Fake>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut fake = state.lock().unwrap();
    fake.answer(method, &uri, &headers, &body)
}

pub fn answer(status: u16, headers: Vec<(&'static str, String)>, body: Value) -> Response {
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

pub fn message(status: u16, text: &str) -> Response {
    answer(status, Vec::new(), json!({ "message": text }))
}

/// An endpoint of the API, by its path.
pub enum Route {
    /// A pull request's comments (GitLab: a merge request's notes): listed or added to.
    Comments(u64),
    /// GitHub's `next` links name the repository by id: `/repositories/ID/issues/N/comments`.
    CommentsById(u64),
    /// One comment (GitHub's path has no pull request number: 0).
    Comment(u64, u64),
    Status(String),
    /// A pull request (GitLab: a merge request) itself.
    PullRequest(u64),
    /// GitHub: one label of an issue or pull request.
    Label(u64, String),
    /// The list of pull requests (GitLab: merge requests); GitHub's `next` links name the
    /// repository by id.
    PullRequests,
    /// The token's own account.
    User,
}

impl Fake {
    pub fn answer(
        &mut self,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Response {
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

        // The body: JSON objects with their content type on writes, nothing on reads and
        // deletes.
        let writes = method != Method::GET && method != Method::DELETE;
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

    pub fn route(&self, path: &str) -> Option<Route> {
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
            (Kind::GitHub, ["repos", o, r, "pulls", n]) if (*o, *r) == (owner, name) => {
                Some(Route::PullRequest(number(n)?))
            }
            (Kind::GitHub, ["repos", o, r, "issues", n, "labels", label])
                if (*o, *r) == (owner, name) =>
            {
                Some(Route::Label(number(n)?, (*label).to_owned()))
            }
            (Kind::GitHub, ["repos", o, r, "pulls"]) if (*o, *r) == (owner, name) => {
                Some(Route::PullRequests)
            }
            (Kind::GitHub, ["repositories", id, "pulls"]) if *id == repository_id => {
                Some(Route::PullRequests)
            }
            (Kind::GitLab, ["projects", GITLAB_PROJECT, "merge_requests"]) => {
                Some(Route::PullRequests)
            }
            (Kind::GitHub, ["repos", o, r, "statuses", sha]) if (*o, *r) == (owner, name) => {
                Some(Route::Status((*sha).to_owned()))
            }
            (Kind::GitLab, ["projects", GITLAB_PROJECT, "merge_requests", n]) => {
                Some(Route::PullRequest(number(n)?))
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

    pub fn serve(
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
            (Route::Label(n, label), "DELETE") => {
                let Some(pull) = self.pull_requests.get_mut(&n) else {
                    return message(404, "Not Found");
                };
                if !pull.labels.contains(&label) {
                    return message(404, "Label does not exist");
                }
                pull.labels.retain(|l| *l != label);
                let labels: Vec<Value> = pull
                    .labels
                    .iter()
                    .map(|name| json!({ "name": name }))
                    .collect();
                answer(200, Vec::new(), Value::Array(labels))
            }
            (Route::PullRequest(n), "PUT") if self.kind == Kind::GitLab => {
                let Some(remove) = body
                    .as_ref()
                    .and_then(|b| b.get("remove_labels"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                else {
                    self.violations.push(format!(
                        "{what}: a merge request update other than remove_labels"
                    ));
                    return message(400, "Bad Request");
                };
                let Some(pull) = self.pull_requests.get_mut(&n) else {
                    return message(404, "Not Found");
                };
                pull.labels.retain(|l| !remove.split(',').any(|r| r == l));
                let pull = pull.clone();
                answer(200, Vec::new(), self.render_pull_request(n, &pull))
            }
            (Route::PullRequests, "GET") => self.list_pull_requests(query, what),
            (Route::PullRequest(n), "GET") => {
                if !query.is_empty() {
                    self.violations.push(format!("{what}: a query"));
                }
                match self.pull_requests.get(&n) {
                    Some(pull) => answer(200, Vec::new(), self.render_pull_request(n, pull)),
                    None => message(404, "Not Found"),
                }
            }
            (_, method) => {
                self.violations
                    .push(format!("{what}: {method} is not allowed here"));
                message(405, "Method Not Allowed")
            }
        }
    }

    pub fn list(&mut self, n: u64, query: &BTreeMap<String, String>, what: &str) -> Response {
        let expected = match self.kind {
            Kind::GitHub => vec![("per_page", "100")],
            Kind::GitLab => vec![
                ("per_page", "100"),
                ("sort", "asc"),
                ("order_by", "created_at"),
            ],
        };
        let Some(comments) = self.comments.get(&n) else {
            return message(404, "Not Found");
        };
        let items: Vec<Value> = comments.iter().map(|c| self.render(c)).collect();
        let next = format!("/issues/{n}/comments?per_page=100");
        self.page(items, query, &expected, &next, what)
    }

    /// The open pull requests (GitLab: merge requests), newest first as both forges list them.
    pub fn list_pull_requests(&mut self, query: &BTreeMap<String, String>, what: &str) -> Response {
        let expected = match self.kind {
            Kind::GitHub => vec![("state", "open"), ("per_page", "100")],
            Kind::GitLab => vec![("state", "opened"), ("per_page", "100")],
        };
        let items: Vec<Value> = self
            .pull_requests
            .iter()
            .rev()
            .filter(|(_, pull)| pull.state == PullRequestState::Open)
            .map(|(n, pull)| self.render_pull_request(*n, pull))
            .collect();
        self.page(
            items,
            query,
            &expected,
            "/pulls?state=open&per_page=100",
            what,
        )
    }

    /// One page of 100 of `items`, as `query` asks (it must be `expected` plus a `page`), with
    /// the forge's way of naming the next page (GitHub: a `Link` to `/repositories/ID` and
    /// `next`; GitLab: `X-Next-Page`).
    pub fn page(
        &mut self,
        items: Vec<Value>,
        query: &BTreeMap<String, String>,
        expected: &[(&str, &str)],
        next: &str,
        what: &str,
    ) -> Response {
        let mut expected: BTreeMap<String, String> = expected
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
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
        let per_page: usize = 100;
        let pages = items.len().div_ceil(per_page).max(1);
        let items: Vec<Value> = items
            .into_iter()
            .skip((page - 1) * per_page)
            .take(per_page)
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
                            "<{origin}{}/repositories/{GITHUB_REPO_ID}{next}&page={p}>; rel=\"{rel}\"",
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

    pub fn update(&mut self, n: u64, id: u64, body: Option<Value>, what: &str) -> Response {
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

    pub fn status(&mut self, sha: String, body: Option<Value>, what: &str) -> Response {
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
        // Plumber's two contexts: the plan's, and whether a preview environment runs.
        if !["plumber", "plumber/preview"]
            .iter()
            .any(|context| object.get(name_key) == Some(&json!(context)))
        {
            self.violations.push(format!(
                "{what}: {name_key} is not plumber or plumber/preview"
            ));
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
    pub fn comment_body(&mut self, body: Option<Value>, what: &str) -> Option<String> {
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

    /// A pull request as each forge's API gives it (the fields read, and a few others).
    pub fn render_pull_request(&self, n: u64, pull: &PullRequest) -> Value {
        match self.kind {
            Kind::GitHub => {
                let merged = pull.state == PullRequestState::Merged;
                json!({
                    "number": n,
                    "state": if pull.state == PullRequestState::Open { "open" } else { "closed" },
                    "merged": merged,
                    "merged_at": if merged { json!("2026-01-01T00:00:00Z") } else { Value::Null },
                    "labels": pull.labels.iter().enumerate().map(|(i, name)| json!({
                        "id": i + 1, "name": name, "color": "ededed",
                    })).collect::<Vec<_>>(),
                    "head": { "ref": format!("feature-{n}"), "sha": pull.head },
                })
            }
            Kind::GitLab => json!({
                "iid": n,
                "state": match pull.state {
                    PullRequestState::Open => "opened",
                    PullRequestState::Closed => "closed",
                    PullRequestState::Merged => "merged",
                },
                "labels": pull.labels,
                "sha": pull.head,
                "source_branch": format!("feature-{n}"),
            }),
        }
    }

    pub fn render(&self, comment: &Comment) -> Value {
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
