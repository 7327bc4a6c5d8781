//! The forge clients against a fake GitHub and a fake GitLab (`support/fake_forge.rs`): a real
//! HTTP server that checks every request it gets and records them. A request the real API would
//! not take is recorded as a violation, and every test ends by asserting there were none.
//!
//! Faults are injected as the answer to the next request(s): a 502, a 429 with `retry-after`,
//! GitHub's 403 rate limit, a 502 after the comment was created (the answer lost). The
//! clients' clock is a fake that records the waits instead of sleeping.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/fake_forge.rs"]
mod fake_forge;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fake_forge::*;
use plumber::forge::{
    self, Clock, CommentAt, CommentOutcome, CommitStatus, Config, Error, Forge, FoundComment, Kind,
    MARKER, PlanComment, PullRequest, PullRequestState, Settings, State, fingerprint_line,
};
use serde_json::json;

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

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

    /// Puts a plan whose fingerprint is its text.
    fn upsert(&self, number: u64, markdown: &str) -> forge::Result<CommentOutcome> {
        self.upsert_at(number, markdown, CommentAt::Unknown)
    }

    /// [`Setup::upsert`] of the comment `at`.
    fn upsert_at(
        &self,
        number: u64,
        markdown: &str,
        at: CommentAt,
    ) -> forge::Result<CommentOutcome> {
        let render = |_| markdown.to_owned();
        self.forge.upsert_plan_comment(
            number,
            &PlanComment {
                fingerprint: markdown,
                at,
                render: &render,
            },
        )
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

/// The body of the plan comment of `markdown` (whose fingerprint it is too).
fn body(markdown: &str) -> String {
    format!("{MARKER}\n{}\n{markdown}", fingerprint_line(markdown))
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
    assert_eq!(created, Some(json!({ "body": body("plan A") })));

    s.server.clear_requests();
    assert_eq!(s.upsert(7, "plan B").unwrap(), CommentOutcome::Updated(id));
    assert_eq!(
        s.server.lines(),
        [format!("GET {comments}"), s.update_line(7, id)]
    );
    let updated = s.server.requests()[1].body.clone();
    assert_eq!(updated, Some(json!({ "body": body("plan B") })));

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
    assert_eq!(plans[0].body, body("plan B"));
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
    assert_eq!(plans[0].body, body("new plan"));

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
    let comment = |render: &dyn Fn(usize) -> String| {
        s.forge.upsert_plan_comment(
            4,
            &PlanComment {
                fingerprint: "f1",
                at: CommentAt::Unknown,
                render,
            },
        )
    };
    let Ok(CommentOutcome::Created(_)) = comment(&render) else {
        panic!("{:?}", s.server.lines());
    };
    assert_eq!(
        *budgets.lock().unwrap(),
        [limit - MARKER.chars().count() - fingerprint_line("f1").chars().count() - 2]
    );
    let sent = s.server.requests()[2].body.clone().unwrap();
    let sent = sent["body"].as_str().unwrap();
    assert!(sent.chars().count() <= limit);
    assert!(sent.starts_with(MARKER));
    assert!(sent.contains("more changed steps"));

    // A renderer that ignores its budget: refused, and nothing sent.
    s.server.clear_requests();
    let error = comment(&|_| full.clone()).unwrap_err();
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
    assert_eq!(comments[3].body, body("plan B"));
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

// ---------------------------------------------------------------------------------------------
// Pull requests: state and labels (what decides a preview environment).

fn pull_request_path(kind: Kind, number: u64) -> String {
    match kind {
        Kind::GitHub => format!("/api/v3/repos/{GITHUB_REPO}/pulls/{number}"),
        Kind::GitLab => format!("/api/v4/projects/{GITLAB_PROJECT}/merge_requests/{number}"),
    }
}

fn pull_requests_are_read_with_their_state_and_labels(kind: Kind) {
    let s = setup(kind);
    s.server
        .set_pull_request(7, PullRequestState::Open, &["preview", "needs-review"]);
    s.server
        .set_pull_request(8, PullRequestState::Closed, &["preview"]);
    s.server.set_pull_request(9, PullRequestState::Merged, &[]);
    let open = s.forge.pull_request(7).unwrap();
    assert_eq!(open.state, PullRequestState::Open);
    assert_eq!(open.labels, ["preview", "needs-review"]);
    assert!(open.is_open() && open.has_label("preview") && !open.has_label("previe"));
    let closed = s.forge.pull_request(8).unwrap();
    assert_eq!(closed.state, PullRequestState::Closed);
    assert!(!closed.is_open());
    assert_eq!(
        s.forge.pull_request(9).unwrap(),
        PullRequest {
            state: PullRequestState::Merged,
            labels: Vec::new(),
            head: None,
        }
    );
    // Its head, as the forge names it.
    let sha = "0123456789abcdef0123456789abcdef01234567";
    s.server.set_head(7, sha);
    assert_eq!(s.forge.pull_request(7).unwrap().head.as_deref(), Some(sha));
    // The label taken off by Plumber (a preview's new commits), then read again: it is gone
    // (nothing is cached). Taking off a label that is not there is no error.
    s.forge.remove_label(7, "preview").unwrap();
    assert_eq!(s.server.labels(7), ["needs-review"]);
    assert!(!s.forge.pull_request(7).unwrap().has_label("preview"));
    s.forge.remove_label(7, "preview").unwrap();
    let mut lines: Vec<String> = [7, 8, 9, 7]
        .iter()
        .map(|n| format!("GET {}", pull_request_path(kind, *n)))
        .collect();
    let removal = match kind {
        Kind::GitHub => format!("DELETE /api/v3/repos/{GITHUB_REPO}/issues/7/labels/preview"),
        Kind::GitLab => format!("PUT {}", pull_request_path(kind, 7)),
    };
    lines.extend([
        removal.clone(),
        format!("GET {}", pull_request_path(kind, 7)),
        removal,
    ]);
    assert_eq!(s.server.lines(), lines);
    s.server.assert_clean();
}

#[test]
fn github_pull_requests_are_read_with_their_state_and_labels() {
    pull_requests_are_read_with_their_state_and_labels(Kind::GitHub);
}

#[test]
fn gitlab_merge_requests_are_read_with_their_state_and_labels() {
    pull_requests_are_read_with_their_state_and_labels(Kind::GitLab);
}

fn a_missing_pull_request_is_a_404_and_a_502_is_retried(kind: Kind) {
    let s = setup(kind);
    let error = s.forge.pull_request(404).unwrap_err();
    assert!(
        matches!(error, Error::Status { status: 404, .. }),
        "{error}"
    );
    assert!(!error.is_retryable());
    s.server
        .set_pull_request(3, PullRequestState::Open, &["preview"]);
    s.server.fail_next(Fault::status(502));
    assert!(s.forge.pull_request(3).unwrap().has_label("preview"));
    let path = format!("GET {}", pull_request_path(kind, 3));
    assert_eq!(
        s.server.lines(),
        [
            format!("GET {}", pull_request_path(kind, 404)),
            path.clone(),
            path
        ]
    );
    assert_eq!(s.sleeps().len(), 1, "one backoff before the second attempt");
    s.server.assert_clean();
}

#[test]
fn github_a_missing_pull_request_is_a_404_and_a_502_is_retried() {
    a_missing_pull_request_is_a_404_and_a_502_is_retried(Kind::GitHub);
}

#[test]
fn gitlab_a_missing_merge_request_is_a_404_and_a_502_is_retried() {
    a_missing_pull_request_is_a_404_and_a_502_is_retried(Kind::GitLab);
}

// ---------------------------------------------------------------------------------------------
// Writes proportional to change: the open pull requests in one listing, a comment by its id.

fn pull_requests_list_path(kind: Kind) -> String {
    match kind {
        Kind::GitHub => format!("/api/v3/repos/{GITHUB_REPO}/pulls"),
        Kind::GitLab => format!("/api/v4/projects/{GITLAB_PROJECT}/merge_requests"),
    }
}

/// 150 open pull requests among 400: two pages of 100, nothing else asked.
fn open_pull_requests_are_listed_100_a_page(kind: Kind) {
    let s = setup(kind);
    for number in 1..=400 {
        let state = match number % 8 {
            0 | 3 | 5 => PullRequestState::Open,
            1 => PullRequestState::Merged,
            _ => PullRequestState::Closed,
        };
        s.server.set_pull_request(number, state, &[]);
    }
    let open = s.forge.open_pull_requests().unwrap();
    let expected: Vec<u64> = (1..=400).filter(|n| [0, 3, 5].contains(&(n % 8))).collect();
    assert_eq!(expected.len(), 150);
    assert_eq!(open.into_iter().collect::<Vec<_>>(), expected);
    let second = match kind {
        Kind::GitHub => format!("GET /api/v3/repositories/{GITHUB_REPO_ID}/pulls page=2"),
        Kind::GitLab => format!("GET {} page=2", pull_requests_list_path(kind)),
    };
    assert_eq!(
        s.server.lines(),
        [format!("GET {}", pull_requests_list_path(kind)), second]
    );
    // None open: one request, an empty set.
    s.server.fake().pull_requests.clear();
    s.server.clear_requests();
    assert!(s.forge.open_pull_requests().unwrap().is_empty());
    assert_eq!(s.server.lines().len(), 1);
    s.server.assert_clean();
}

#[test]
fn github_open_pull_requests_are_listed_100_a_page() {
    open_pull_requests_are_listed_100_a_page(Kind::GitHub);
}

#[test]
fn gitlab_open_merge_requests_are_listed_100_a_page() {
    open_pull_requests_are_listed_100_a_page(Kind::GitLab);
}

/// A comment whose id is known is updated in one request; one deleted meanwhile is looked
/// for and made again; one that carries the plan's fingerprint is left alone, whatever else
/// its text says (the commit the plan was merged into); the comment is found with its
/// fingerprint.
fn a_known_comment_is_updated_by_its_id_and_a_deleted_one_made_again(kind: Kind) {
    let s = setup(kind);
    s.server.seed(7, 120, None, "");
    let Ok(CommentOutcome::Created(id)) = s.upsert(7, "plan A") else {
        panic!("{:?}", s.server.lines());
    };
    s.server.clear_requests();
    assert_eq!(
        s.upsert_at(7, "plan B", CommentAt::Id(id)).unwrap(),
        CommentOutcome::Updated(id)
    );
    assert_eq!(s.server.lines(), [s.update_line(7, id)], "not looked for");
    assert_eq!(s.plan_comments(7)[0].body, body("plan B"));

    // The same fingerprint, another text: found, left alone.
    s.server.clear_requests();
    let render = |_| "plan B, merged into a newer base".to_owned();
    let same = PlanComment {
        fingerprint: "plan B",
        at: CommentAt::Unknown,
        render: &render,
    };
    assert_eq!(
        s.forge.upsert_plan_comment(7, &same).unwrap(),
        CommentOutcome::Unchanged(id)
    );
    assert_eq!(
        s.server.lines(),
        [format!("GET {}", s.comments_path(7)), s.page_two(7)]
    );

    // Found with the fingerprint it carries (a restarted daemon's first look).
    s.server.clear_requests();
    assert_eq!(
        s.forge.find_plan_comment(7).unwrap(),
        Some(FoundComment {
            id,
            fingerprint: Some("plan B".into())
        })
    );
    assert_eq!(
        s.server.lines(),
        [format!("GET {}", s.comments_path(7)), s.page_two(7)]
    );
    s.server.seed(
        8,
        1,
        Some(0),
        "a plan of a Plumber that wrote no fingerprint",
    );
    let older = s.forge.find_plan_comment(8).unwrap().unwrap();
    assert_eq!(older.fingerprint, None);
    s.server.seed(10, 2, None, "");
    assert_eq!(s.forge.find_plan_comment(10).unwrap(), None);

    // Deleted by someone: the update by id finds nothing, the comment is made again once.
    s.server
        .fake()
        .comments
        .get_mut(&7)
        .unwrap()
        .retain(|c| c.id != id);
    s.server.clear_requests();
    let Ok(CommentOutcome::Created(again)) = s.upsert_at(7, "plan C", CommentAt::Id(id)) else {
        panic!("{:?}", s.server.lines());
    };
    assert_ne!(again, id);
    assert_eq!(
        s.server.lines(),
        [
            s.update_line(7, id),
            format!("GET {}", s.comments_path(7)),
            s.page_two(7),
            format!("POST {}", s.comments_path(7)),
        ]
    );
    assert_eq!(s.plan_comments(7).len(), 1);
    assert!(s.sleeps().is_empty(), "a 404 is not retried");
    s.server.assert_clean();
}

#[test]
fn github_a_known_comment_is_updated_by_its_id_and_a_deleted_one_made_again() {
    a_known_comment_is_updated_by_its_id_and_a_deleted_one_made_again(Kind::GitHub);
}

#[test]
fn gitlab_a_known_note_is_updated_by_its_id_and_a_deleted_one_made_again() {
    a_known_comment_is_updated_by_its_id_and_a_deleted_one_made_again(Kind::GitLab);
}

/// A comment the caller has just looked for and not found is created in one request; when
/// the answer to that is lost, the next attempt looks first and finds it.
fn a_missing_comment_is_created_at_once_and_looked_for_before_a_retry(kind: Kind) {
    let s = setup(kind);
    s.server.seed(5, 2, None, "");
    let Ok(CommentOutcome::Created(_)) = s.upsert_at(5, "plan", CommentAt::Nowhere) else {
        panic!("{:?}", s.server.lines());
    };
    assert_eq!(s.server.lines(), [format!("POST {}", s.comments_path(5))]);

    s.server.seed(6, 0, None, "");
    s.server.clear_requests();
    s.server.fail_next(Fault::status(502).after_effect());
    let outcome = s.upsert_at(6, "plan", CommentAt::Nowhere).unwrap();
    let comments = s.comments_path(6);
    assert_eq!(
        s.server.lines(),
        [
            format!("POST {comments}"),
            s.user_line(),
            format!("GET {comments}"),
        ]
    );
    let plans = s.plan_comments(6);
    assert_eq!(plans.len(), 1);
    assert_eq!(outcome, CommentOutcome::Unchanged(plans[0].id));
    s.server.assert_clean();
}

#[test]
fn github_a_missing_comment_is_created_at_once_and_looked_for_before_a_retry() {
    a_missing_comment_is_created_at_once_and_looked_for_before_a_retry(Kind::GitHub);
}

#[test]
fn gitlab_a_missing_note_is_created_at_once_and_looked_for_before_a_retry() {
    a_missing_comment_is_created_at_once_and_looked_for_before_a_retry(Kind::GitLab);
}
