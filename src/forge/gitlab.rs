//! GitLab's REST API v4 (gitlab.com or self-hosted, at `https://HOST/api/v4`): the plan is a
//! note on the merge request; the status is an external commit status named `plumber`.

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

/// A client of one project.
#[derive(Debug)]
pub struct GitLab {
    http: Http,
    /// The project's id, or its path URL-encoded (`group%2Fproject`), as the API's paths
    /// take it.
    project: String,
    /// The id of the token's user (project and group tokens have a bot user), for the token
    /// it was asked with: only its notes can be the plan note.
    author: Mutex<Option<(Token, u64)>>,
}

#[derive(Debug, Deserialize)]
struct Note {
    id: u64,
    #[serde(default)]
    body: String,
    /// Notes GitLab writes itself ("added 1 commit").
    #[serde(default)]
    system: bool,
    #[serde(default)]
    author: Option<UserId>,
}

/// `GET /projects/{id}/merge_requests/{iid}`, what is read of it.
#[derive(Debug, Deserialize)]
struct MergeRequest {
    /// `opened`, `closed`, `merged` or `locked`.
    state: String,
    /// Label names (the default; `with_labels_details` would make them objects).
    #[serde(default)]
    labels: Vec<String>,
    /// The head commit.
    #[serde(default)]
    sha: Option<String>,
}

/// An item of `GET /projects/{id}/merge_requests`, what is read of it.
#[derive(Debug, Deserialize)]
struct Listed {
    iid: u64,
}

#[derive(Debug, Deserialize)]
struct UserId {
    id: u64,
}

/// The project as a path segment: a numeric id as it is; a path `group/sub/project` (also
/// given URL-encoded) with its `/` encoded.
fn project_segment(project: &str) -> std::result::Result<String, String> {
    if !project.is_empty() && project.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(project.to_owned());
    }
    let path = project.replace("%2F", "/").replace("%2f", "/");
    let segment = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    let segments: Vec<&str> = path.split('/').collect();
    if segments.len() >= 2 && segments.iter().all(|s| segment(s)) {
        Ok(segments.join("%2F"))
    } else {
        Err(
            "a GitLab project is its numeric id or its path GROUP/PROJECT (as in \
             gitlab.com/GROUP/PROJECT)"
                .into(),
        )
    }
}

pub(crate) fn check_project(project: &str) -> std::result::Result<(), String> {
    project_segment(project).map(drop)
}

/// The next page of a list whose first page is `first`: offset pagination answers
/// `X-Next-Page` (and, on newer versions, a `Link`).
fn next_page(first: &str) -> impl Fn(&super::Answer, &str) -> Option<String> + '_ {
    move |answer, _| {
        answer.next_link().or_else(|| {
            let page = answer.header("x-next-page")?.trim();
            (!page.is_empty()).then(|| format!("{first}&page={page}"))
        })
    }
}

impl GitLab {
    /// `project` was checked by [`check_project`].
    pub(crate) fn new(http: Http, project: &str) -> GitLab {
        GitLab {
            http,
            project: project_segment(project).unwrap_or_else(|_| project.to_owned()),
            author: Mutex::new(None),
        }
    }

    /// The token's user (`GET /user`), asked once per token.
    fn author(&self) -> Result<u64> {
        let token = self.http.token();
        if let Some((known, author)) = &*self.author.lock().unwrap_or_else(PoisonError::into_inner)
            && *known == token
        {
            return Ok(*author);
        }
        let url = self.http.url("/user");
        let user: UserId = self.http.get_json(&url)?;
        *self.author.lock().unwrap_or_else(PoisonError::into_inner) = Some((token, user.id));
        Ok(user.id)
    }

    fn notes_path(&self, iid: u64) -> String {
        format!("/projects/{}/merge_requests/{iid}/notes", self.project)
    }

    fn find_plan_note(&self, iid: u64) -> Result<Option<Note>> {
        let author = self.author()?;
        let first = self.http.url(&format!(
            "{}?per_page=100&sort=asc&order_by=created_at",
            self.notes_path(iid)
        ));
        self.http
            .find_in_pages(first.clone(), next_page(&first), |note: &Note| {
                !note.system
                    && note.author.as_ref().is_some_and(|a| a.id == author)
                    && is_plan_comment(&note.body)
            })
    }
}

impl Forge for GitLab {
    fn kind(&self) -> Kind {
        Kind::GitLab
    }

    fn pull_request(&self, iid: u64) -> Result<PullRequest> {
        let url = self
            .http
            .url(&format!("/projects/{}/merge_requests/{iid}", self.project));
        let request: MergeRequest = self
            .http
            .retrying("merge request", || self.http.get_json(&url))?;
        let state = match request.state.as_str() {
            // `locked`: being merged right now; still open until the merge is done.
            "opened" | "locked" => PullRequestState::Open,
            "closed" => PullRequestState::Closed,
            "merged" => PullRequestState::Merged,
            other => {
                return Err(Error::Protocol {
                    method: Method::GET,
                    url,
                    message: format!("merge request state {other:?}"),
                });
            }
        };
        Ok(PullRequest {
            state,
            labels: request.labels,
            head: request.sha,
        })
    }

    fn open_pull_requests(&self) -> Result<BTreeSet<u64>> {
        let first = self.http.url(&format!(
            "/projects/{}/merge_requests?state=opened&per_page=100",
            self.project
        ));
        let listed: Vec<Listed> = self.http.retrying("open merge requests", || {
            self.http.all_pages(first.clone(), next_page(&first))
        })?;
        Ok(listed.into_iter().map(|request| request.iid).collect())
    }

    fn find_plan_comment(&self, iid: u64) -> Result<Option<FoundComment>> {
        let found = self
            .http
            .retrying("plan comment", || self.find_plan_note(iid))?;
        Ok(found.map(|note| FoundComment::of(note.id, &note.body)))
    }

    fn upsert_plan_comment(&self, iid: u64, comment: &PlanComment<'_>) -> Result<CommentOutcome> {
        let body = plan_comment_body(Kind::GitLab, comment)?;
        let update = |id: u64| {
            let url = self.http.url(&format!("{}/{id}", self.notes_path(iid)));
            self.http
                .send(Method::PUT, &url, Some(&json!({ "body": body })))
                .map(|_| CommentOutcome::Updated(id))
        };
        let create = || {
            let url = self.http.url(&self.notes_path(iid));
            let created: Note = self
                .http
                .send(Method::POST, &url, Some(&json!({ "body": body })))?
                .json(&Method::POST, &url)?;
            Ok(CommentOutcome::Created(created.id))
        };
        upsert(&self.http, comment, update, create, || {
            Ok(self.find_plan_note(iid)?.map(|note| (note.id, note.body)))
        })
    }

    fn set_commit_status(&self, sha: &str, status: &CommitStatus) -> Result<()> {
        check_sha(sha)?;
        let state = match status.state {
            State::Pending => "pending",
            State::Running => "running",
            State::Success => "success",
            // GitLab has no `error`.
            State::Failure | State::Error => "failed",
        };
        let mut body = json!({
            "state": state,
            "name": status.context,
            "description": shorten(&status.description, Kind::GitLab.description_limit()),
        });
        if let Some(target) = &status.target_url {
            body["target_url"] = json!(target);
        }
        let url = self
            .http
            .url(&format!("/projects/{}/statuses/{sha}", self.project));
        self.http.retrying("commit status", || {
            match self.http.send(Method::POST, &url, Some(&body)) {
                Ok(_) => Ok(()),
                // GitLab refuses a pending or running status over a pending or running one
                // ("Cannot transition status via :enqueue from :pending"): the commit is
                // marked as being worked on already, and the final status replaces it.
                Err(Error::Status {
                    status: 400,
                    message,
                    ..
                }) if message.contains("Cannot transition status") => {
                    tracing::debug!(sha, state, "the GitLab commit status is set already");
                    Ok(())
                }
                Err(error) => Err(error),
            }
        })
    }

    fn remove_label(&self, iid: u64, label: &str) -> Result<()> {
        let url = self
            .http
            .url(&format!("/projects/{}/merge_requests/{iid}", self.project));
        let body = json!({ "remove_labels": label });
        self.http.retrying("label", || {
            self.http.send(Method::PUT, &url, Some(&body)).map(drop)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projects_become_one_path_segment() {
        assert_eq!(project_segment("42").unwrap(), "42");
        assert_eq!(project_segment("group/project").unwrap(), "group%2Fproject");
        assert_eq!(project_segment("g/sub/p").unwrap(), "g%2Fsub%2Fp");
        assert_eq!(project_segment("g%2Fsub%2Fp").unwrap(), "g%2Fsub%2Fp");
        for bad in ["", "project", "g/../p", "g/p?x=1", "g//p"] {
            assert!(project_segment(bad).is_err(), "{bad}");
        }
    }
}
