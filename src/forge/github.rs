//! GitHub's REST API (and GitHub Enterprise's, at `https://HOST/api/v3`): a pull request's
//! comments are its issue's comments; the status is a commit status with `context: plumber`.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use serde::Deserialize;
use serde_json::json;
use ureq::http::Method;

use super::{
    CommentOutcome, CommitStatus, Error, Forge, FoundComment, Http, Kind, PlanComment, PullRequest,
    PullRequestState, Result, State, Token, check_sha, is_plan_comment, plan_comment_body, shorten,
    upsert,
};

/// A client of one repository.
#[derive(Debug)]
pub struct GitHub {
    http: Http,
    /// `OWNER/NAME`, checked by [`check_repo`].
    repo: String,
    /// Whose comments can be the plan comment, for the token it was asked with.
    author: Mutex<Option<(Token, Author)>>,
}

/// The account of the token.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Author {
    /// A user's token (personal, OAuth, a machine user's): comments by that login.
    User(String),
    /// A GitHub App's installation token, which has no user: comments an app made, which no
    /// person can make.
    App,
}

#[derive(Debug, Deserialize)]
struct Comment {
    id: u64,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    user: Option<User>,
    #[serde(default)]
    performed_via_github_app: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct User {
    login: String,
    #[serde(default, rename = "type")]
    kind: String,
}

/// `GET /repos/{repo}/pulls/{n}`, what is read of it.
#[derive(Debug, Deserialize)]
struct Pull {
    /// `open` or `closed` (a merged pull request is closed, with `merged`).
    state: String,
    #[serde(default)]
    merged: bool,
    #[serde(default)]
    merged_at: Option<String>,
    #[serde(default)]
    labels: Vec<Label>,
    #[serde(default)]
    head: Option<Head>,
}

#[derive(Debug, Deserialize)]
struct Head {
    sha: Option<String>,
}

/// An item of `GET /repos/{repo}/pulls`, what is read of it.
#[derive(Debug, Deserialize)]
struct Listed {
    number: u64,
}

#[derive(Debug, Deserialize)]
struct Label {
    name: String,
}

impl Comment {
    fn is_by(&self, author: &Author) -> bool {
        match author {
            Author::User(login) => self.user.as_ref().is_some_and(|u| u.login == *login),
            Author::App => {
                self.performed_via_github_app.is_some()
                    && self.user.as_ref().is_some_and(|u| u.kind == "Bot")
            }
        }
    }
}

/// `OWNER/NAME`, each of letters, digits, `-`, `_` and `.`.
pub(crate) fn check_repo(repo: &str) -> std::result::Result<(), String> {
    let segment = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match repo.split_once('/') {
        Some((owner, name)) if segment(owner) && segment(name) => Ok(()),
        _ => Err("a GitHub repository is OWNER/NAME, as in github.com/OWNER/NAME".into()),
    }
}

impl GitHub {
    pub(crate) fn new(http: Http, repo: &str) -> GitHub {
        GitHub {
            http,
            repo: repo.to_owned(),
            author: Mutex::new(None),
        }
    }

    /// The token's account (`GET /user`), asked once per token.
    fn author(&self) -> Result<Author> {
        let token = self.http.token();
        if let Some((known, author)) = &*self.author.lock().unwrap_or_else(PoisonError::into_inner)
            && *known == token
        {
            return Ok(author.clone());
        }
        let url = self.http.url("/user");
        let author = match self.http.send(Method::GET, &url, None) {
            Ok(answer) => Author::User(answer.json::<User>(&Method::GET, &url)?.login),
            // An installation token: "Resource not accessible by integration".
            Err(Error::Status {
                status: 403,
                rate_limited: false,
                ..
            }) => Author::App,
            Err(error) => return Err(error),
        };
        *self.author.lock().unwrap_or_else(PoisonError::into_inner) = Some((token, author.clone()));
        Ok(author)
    }

    fn find_comment(&self, number: u64) -> Result<Option<Comment>> {
        let author = self.author()?;
        let first = self.http.url(&format!(
            "/repos/{}/issues/{number}/comments?per_page=100",
            self.repo
        ));
        self.http.find_in_pages(
            first,
            |answer, _| answer.next_link(),
            |c: &Comment| c.is_by(&author) && c.body.as_deref().is_some_and(is_plan_comment),
        )
    }
}

impl Forge for GitHub {
    fn kind(&self) -> Kind {
        Kind::GitHub
    }

    fn pull_request(&self, number: u64) -> Result<PullRequest> {
        let url = self
            .http
            .url(&format!("/repos/{}/pulls/{number}", self.repo));
        let pull: Pull = self
            .http
            .retrying("pull request", || self.http.get_json(&url))?;
        let state = match pull.state.as_str() {
            _ if pull.merged || pull.merged_at.is_some() => PullRequestState::Merged,
            "open" => PullRequestState::Open,
            "closed" => PullRequestState::Closed,
            other => {
                return Err(Error::Protocol {
                    method: Method::GET,
                    url,
                    message: format!("pull request state {other:?}"),
                });
            }
        };
        Ok(PullRequest {
            state,
            labels: pull.labels.into_iter().map(|l| l.name).collect(),
            head: pull.head.and_then(|h| h.sha),
        })
    }

    fn open_pull_requests(&self) -> Result<BTreeSet<u64>> {
        let first = self.http.url(&format!(
            "/repos/{}/pulls?state=open&per_page=100",
            self.repo
        ));
        let listed: Vec<Listed> = self.http.retrying("open pull requests", || {
            self.http
                .all_pages(first.clone(), |answer, _| answer.next_link())
        })?;
        Ok(listed.into_iter().map(|pull| pull.number).collect())
    }

    fn find_plan_comment(&self, number: u64) -> Result<Option<FoundComment>> {
        let found = self
            .http
            .retrying("plan comment", || self.find_comment(number))?;
        Ok(found.map(|c| FoundComment::of(c.id, c.body.as_deref().unwrap_or(""))))
    }

    fn upsert_plan_comment(
        &self,
        number: u64,
        comment: &PlanComment<'_>,
    ) -> Result<CommentOutcome> {
        let body = plan_comment_body(Kind::GitHub, comment)?;
        let update = |id: u64| {
            let url = self
                .http
                .url(&format!("/repos/{}/issues/comments/{id}", self.repo));
            self.http
                .send(Method::PATCH, &url, Some(&json!({ "body": body })))
                .map(|_| CommentOutcome::Updated(id))
        };
        let create = || {
            let url = self
                .http
                .url(&format!("/repos/{}/issues/{number}/comments", self.repo));
            let created: Comment = self
                .http
                .send(Method::POST, &url, Some(&json!({ "body": body })))?
                .json(&Method::POST, &url)?;
            Ok(CommentOutcome::Created(created.id))
        };
        upsert(&self.http, comment, update, create, || {
            Ok(self
                .find_comment(number)?
                .map(|found| (found.id, found.body.unwrap_or_default())))
        })
    }

    fn set_commit_status(&self, sha: &str, status: &CommitStatus) -> Result<()> {
        check_sha(sha)?;
        let state = match status.state {
            // GitHub has no `running`.
            State::Pending | State::Running => "pending",
            State::Success => "success",
            State::Failure => "failure",
            State::Error => "error",
        };
        let mut body = json!({
            "state": state,
            "context": status.context,
            "description": shorten(&status.description, Kind::GitHub.description_limit()),
        });
        if let Some(target) = &status.target_url {
            body["target_url"] = json!(target);
        }
        let url = self
            .http
            .url(&format!("/repos/{}/statuses/{sha}", self.repo));
        self.http.retrying("commit status", || {
            self.http.send(Method::POST, &url, Some(&body)).map(drop)
        })
    }

    fn remove_label(&self, number: u64, label: &str) -> Result<()> {
        let url = self.http.url(&format!(
            "/repos/{}/issues/{number}/labels/{}",
            self.repo,
            super::encode_segment(label)
        ));
        self.http.retrying("label", || {
            match self.http.send(Method::DELETE, &url, None) {
                Ok(_) => Ok(()),
                // Not there (any more): what was asked is done.
                Err(Error::Status { status: 404, .. }) => Ok(()),
                Err(error) => Err(error),
            }
        })
    }
}
