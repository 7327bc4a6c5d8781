//! Following the branch: every trigger (a ref moved, a poll, a webhook) leads to one look at
//! the branch; a new valid head becomes every topology's desired revision.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};

use super::facts::Fact;
use super::status::{LastError, Place, SignatureStatus, VerdictLabel};
use super::worker::Worker;
use super::{Context, Error, Revision, Trigger};
use crate::cutover;

pub(super) fn follow(context: &Arc<Context>, receiver: &Receiver<Trigger>) {
    let mut workers: BTreeMap<String, Worker> = BTreeMap::new();
    let mut followed = Followed::default();
    let mut recent: VecDeque<String> = VecDeque::new();
    let mut resumed = false;
    loop {
        let trigger = match receiver.recv_timeout(context.config.poll_interval) {
            Ok(trigger) => trigger,
            Err(RecvTimeoutError::Timeout) => Trigger::Poll,
            Err(RecvTimeoutError::Disconnected) => Trigger::Shutdown,
        };
        // Coalesce a burst (one commit moves several files) into one look.
        let burst: Vec<Trigger> = std::iter::once(trigger)
            .chain(receiver.try_iter())
            .collect();
        if burst.contains(&Trigger::Shutdown) || context.is_stopping() {
            break;
        }
        // Webhooks from now on ask for the next fetch.
        context
            .fetch_asked
            .store(false, std::sync::atomic::Ordering::SeqCst);
        workers.retain(|_, w| !w.is_finished());
        tracing::debug!(triggers = ?burst, "looking at the branch");
        let _busy = context.threads.busy("a look at the branch");
        let looked = newest_valid(context, &mut followed);
        // Refs other than the branch may have moved too (the same watcher, the same fetch).
        context.plans.followed(followed.head.as_deref());
        match looked {
            Ok(Some(revision)) => {
                desire(context, &mut workers, &revision);
                recent.push_front(revision.commit.clone());
                recent.truncate(RECENT_DESIRED);
                collect_checkouts(context, &recent);
            }
            Ok(None) => {
                if !resumed && followed.desired.is_none() {
                    resumed = true;
                    if let Some(revision) = resume(context, &mut followed) {
                        desire(context, &mut workers, &revision);
                        recent.push_front(revision.commit.clone());
                    }
                }
            }
            Err(error) => {
                tracing::error!(%error, "cannot follow the branch");
                context.store.apply(Fact::RepositoryFailed(LastError {
                    commit: followed.head.clone(),
                    topology: None,
                    message: error.to_string(),
                    at: cutover::now(),
                    place: None,
                }));
            }
        }
    }
    for worker in workers.values() {
        worker.wake();
    }
    for (_, worker) in workers {
        worker.join();
    }
}

/// After a start whose first look applies nothing (the head refused by the trusted keys, or
/// invalid with no valid commit in reach), what ran before runs again: the newest commit the
/// topologies' records ran or moved to (every other one they name is its ancestor). `plumber
/// up` stops its processors when it stops; without this they would stay stopped until the
/// branch had a head the daemon accepts.
fn resume(context: &Context, followed: &mut Followed) -> Option<Arc<Revision>> {
    let commits = recorded_commits(context).ok()?;
    let repository = context.revisions.open().ok()?;
    let git = repository.git();
    let oids: Vec<git2::Oid> = commits
        .iter()
        .filter_map(|c| git2::Oid::from_str(c).ok())
        .collect();
    let newest = oids.iter().find(|&&candidate| {
        oids.iter().all(|&other| {
            other == candidate || git.graph_descendant_of(candidate, other).unwrap_or(false)
        })
    })?;
    let commit = newest.to_string();
    match context.revisions.load(&commit) {
        Ok(revision) => {
            tracing::info!(%commit, "the branch's head is not applied; what ran before the restart runs again");
            context.store.apply(Fact::Desired(commit.clone()));
            followed.desired = Some(commit);
            Some(revision)
        }
        Err(error) => {
            tracing::warn!(%commit, %error, "cannot run again what ran before the restart");
            None
        }
    }
}

/// Hands `revision` to the worker of every topology it has or that has state.
fn desire(
    context: &Arc<Context>,
    workers: &mut BTreeMap<String, Worker>,
    revision: &Arc<Revision>,
) {
    let mut names: BTreeSet<String> = revision.topologies.iter().map(|t| t.name.clone()).collect();
    match context.records.topologies() {
        // A retired topology needs no worker until it comes back.
        Ok(known) => names.extend(
            known
                .into_iter()
                // Preview environments have workers of their own (`previews`).
                .filter(|(name, _)| !crate::plan::preview::is_preview(name))
                .filter(|(_, record)| {
                    record.as_ref().is_ok_and(|r| !r.is_retired()) || record.is_err()
                })
                .map(|(name, _)| name),
        ),
        Err(error) => tracing::error!(%error, "cannot list the topologies of the state directory"),
    }
    names.extend(workers.keys().cloned());
    for name in names {
        if !workers.contains_key(&name) {
            match Worker::spawn(&name, context) {
                Ok(worker) => {
                    workers.insert(name.clone(), worker);
                }
                // The next new commit tries again.
                Err(error) => tracing::error!(%error, "cannot start a topology worker"),
            }
        }
        if let Some(worker) = workers.get(&name) {
            worker.desire(revision.clone());
        }
    }
}

/// Desired revisions whose checkouts are kept: a worker may still be starting a processor
/// from one it was handed before the newest.
const RECENT_DESIRED: usize = 8;

/// Keeps the checkouts of the recent desired revisions, of what every topology last matched
/// or moves to, and of every running processor.
fn collect_checkouts(context: &Context, recent: &VecDeque<String>) {
    let mut keep: BTreeSet<String> = recent.iter().cloned().collect();
    let Ok(records) = context.records.topologies() else {
        return;
    };
    for record in records.into_values() {
        let Ok(record) = record else {
            // Unreadable: what it needs is unknown, so keep everything.
            return;
        };
        keep.extend(record.commit);
        keep.extend(record.moving.map(|m| m.to));
    }
    match context.runtime.processors() {
        Ok(processors) => keep.extend(processors.into_iter().filter_map(|p| p.commit)),
        Err(_) => return,
    }
    context.revisions.collect_checkouts(&keep);
}

/// What the follower has seen of the branch.
#[derive(Default)]
struct Followed {
    /// The last head looked at.
    head: Option<String>,
    /// The last revision handed to the workers.
    desired: Option<String>,
    /// Whether the state directory's claim on this repository was checked.
    claimed: bool,
}

/// How far back an invalid head's history is searched for a valid commit.
const MAX_INVALID_RUN: usize = 100;

/// The newest valid commit of the branch, if the head moved and that commit is not the one
/// the workers already have. An invalid head is recorded as the last error; its first-parent
/// ancestors are searched for the newest valid commit (a valid commit followed by a broken one
/// still gets applied), back to the revision already running. With trusted keys, a head they
/// did not sign is recorded as the last error and nothing is applied ([`refuse_untrusted`]).
fn newest_valid(
    context: &Context,
    followed: &mut Followed,
) -> Result<Option<Arc<Revision>>, Error> {
    let source = context.revisions.source();
    source.fetch_unless(&|| context.is_stopping())?;
    let repository = context.revisions.open()?;
    let branch = &context.config.branch;
    let head = repository
        .resolve(&format!("refs/heads/{branch}"))
        .or_else(|_| repository.resolve(branch))
        .map_err(|e| Error::NoBranch {
            branch: branch.clone(),
            repo: source.display(),
            message: e.to_string(),
        })?;
    if !followed.claimed {
        // A state directory of another repository would adopt and retire its processors.
        let root = root_commit(repository.git(), head);
        context.state.claim(&root, &source.display())?;
        followed.claimed = true;
    }
    if followed.head.as_deref() == Some(head.to_string().as_str()) {
        return Ok(None);
    }
    followed.head = Some(head.to_string());
    context.store.metrics.commits_seen.inc();
    let mut candidate = head;
    for _ in 0..MAX_INVALID_RUN {
        let commit = candidate.to_string();
        if let Some(keys) = &context.trusted_keys {
            let mut verdict = match keys.verify(repository.git(), candidate) {
                Ok(verdict) => verdict,
                Err(error) => {
                    // Not a verdict on the commit: look at it again next time.
                    followed.head = None;
                    return Err(error.into());
                }
            };
            if verdict.is_trusted() && !context.config.allow_rollback {
                match not_descending_from(context, followed, repository.git(), candidate) {
                    Ok(None) => {}
                    Ok(Some(runs)) => verdict = verdict.not_descending_from(&runs),
                    Err(error) => {
                        // What runs is unknown for now: look at the head again next time.
                        followed.head = None;
                        return Err(error);
                    }
                }
            }
            let trusted = verdict.is_trusted();
            if candidate == head {
                context
                    .store
                    .metrics
                    .head_untrusted
                    .set(i64::from(!trusted));
                context.store.apply(Fact::Signature(SignatureStatus::new(
                    &commit,
                    verdict.clone(),
                    keys.dir(),
                )));
                // A refused head gets a failing commit status on the forge, if there is one.
                context.publish.signature_changed();
            }
            if !trusted {
                refuse_untrusted(context, keys, &commit, &verdict, candidate == head);
                return Ok(None);
            }
        }
        if followed.desired.as_deref() == Some(commit.as_str()) {
            if candidate == head {
                // The branch went back to what runs (a bad push undone): its error is over.
                clear_repository_error(context);
            }
            return Ok(None);
        }
        match context.revisions.load(&commit) {
            Ok(revision) => {
                if candidate == head {
                    tracing::info!(%commit, "new valid commit");
                    clear_repository_error(context);
                } else {
                    tracing::warn!(%commit, head = %head, "the head is not valid; applying its newest valid ancestor");
                }
                context.store.apply(Fact::Desired(commit.clone()));
                followed.desired = Some(commit);
                return Ok(Some(revision));
            }
            Err(Error::Invalid {
                commit,
                errors,
                first,
            }) => {
                if candidate == head {
                    context.store.metrics.invalid_commits.inc();
                    tracing::error!(%commit, %errors, "commit is not valid; the last valid commit keeps running");
                    context.store.apply(Fact::RepositoryFailed(LastError {
                        commit: Some(commit.clone()),
                        topology: None,
                        message: format!("commit {commit} is not valid: {errors}"),
                        at: cutover::now(),
                        place: first
                            .map(|d| Place::new(*d, &commit, context.config.forge.as_ref())),
                    }));
                }
                let parent = repository
                    .git()
                    .find_commit(candidate)
                    .ok()
                    .and_then(|c| c.parent_id(0).ok());
                match parent {
                    Some(parent) => candidate = parent,
                    None => return Ok(None),
                }
            }
            Err(other) => {
                // Not a verdict on the commit: look at it again next time.
                followed.head = None;
                return Err(other);
            }
        }
    }
    Ok(None)
}

/// A commit that runs and that `candidate` does not descend from (or equal), if there is
/// one: with trusted keys, the branch only moves forward from what runs, so that a force-push
/// back to an older signed commit (which was trusted once) cannot roll the cluster back. What
/// runs is what the workers were handed, and after a restart what each topology's record
/// matched or moves to. A commit the repository no longer has cannot be shown an ancestor.
fn not_descending_from(
    context: &Context,
    followed: &Followed,
    git: &git2::Repository,
    candidate: git2::Oid,
) -> Result<Option<String>, Error> {
    let runs = match &followed.desired {
        Some(desired) => BTreeSet::from([desired.clone()]),
        None => recorded_commits(context)?,
    };
    Ok(runs.into_iter().find(|commit| {
        let Ok(oid) = git2::Oid::from_str(commit) else {
            return true;
        };
        oid != candidate && !git.graph_descendant_of(candidate, oid).unwrap_or(false)
    }))
}

/// The commits the topologies' records ran or move to (previews aside): what runs, as the
/// store knows it after a restart. A damaged record stops only its topology, which runs
/// nothing new: it names none.
fn recorded_commits(context: &Context) -> Result<BTreeSet<String>, Error> {
    Ok(context
        .records
        .topologies()?
        .into_iter()
        .filter(|(name, _)| !crate::plan::preview::is_preview(name))
        .filter_map(|(_, record)| record.ok())
        .flat_map(|record| record.commit.into_iter().chain(record.moving.map(|m| m.to)))
        .collect())
}

/// A valid head ends a repository-level error; a topology's own error stays.
fn clear_repository_error(context: &Context) {
    context.store.apply(Fact::RepositoryRecovered);
}

/// An untrusted commit is never applied, and nothing older is applied in its place (Flux's
/// `verify` does the same): what runs keeps running until a trusted head arrives. So the
/// walk back from an invalid head stops at the first commit no trusted key signed.
fn refuse_untrusted(
    context: &Context,
    keys: &crate::trust::TrustedKeys,
    commit: &str,
    verdict: &crate::trust::Verdict,
    is_head: bool,
) {
    let message = verdict.describe(commit, keys.dir());
    if !is_head {
        // The invalid head's error is the one shown.
        tracing::warn!(%commit, verdict = verdict.label(), key = verdict.key(), "the head is not valid and its newest ancestor is not signed by a trusted key; what runs keeps running");
        return;
    }
    context
        .store
        .metrics
        .untrusted_commits
        .get_or_create(&VerdictLabel {
            verdict: verdict.label().to_owned(),
        })
        .inc();
    tracing::error!(%commit, verdict = verdict.label(), key = verdict.key(), trusted_keys = %keys.dir().display(), "{message}; what runs keeps running");
    context.store.apply(Fact::RepositoryFailed(LastError {
        commit: Some(commit.to_owned()),
        topology: None,
        message,
        at: cutover::now(),
        place: None,
    }));
}

/// The first commit of `head`'s first-parent history: what identifies a repository across
/// moves and URLs.
fn root_commit(git: &git2::Repository, head: git2::Oid) -> String {
    let mut walk = match git.revwalk() {
        Ok(walk) => walk,
        Err(_) => return head.to_string(),
    };
    if walk.push(head).is_err() || walk.simplify_first_parent().is_err() {
        return head.to_string();
    }
    walk.flatten().last().unwrap_or(head).to_string()
}
