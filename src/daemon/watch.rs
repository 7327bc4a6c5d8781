//! Following the branch: where commits come from and what says "look again".
//!
//! A local repository is read where it is, and `notify` watches its refs (loose refs,
//! `packed-refs`, `HEAD`), so a commit is seen within a second. A remote URL (https, ssh,
//! file://) is mirrored into the state directory as a bare repository and fetched every poll
//! interval and on `POST /hooks/git`; a mirror made for another URL follows the new one.
//!
//! A fetch never holds the daemon: it runs on a thread of its own into a namespace of its own
//! (`refs/plumber/fetch/<n>/`), and is abandoned once nothing has arrived for
//! [`FetchTimeouts::idle`] or it has run for [`FetchTimeouts::total`]. libgit2 has no timeouts
//! of its own without unsafe global options, and a socket waiting on a silent server sees no
//! callback; an abandoned fetch can only ever write its own namespace, so `refs/heads/` moves
//! only when a fetch completes in time. Credentials are offered a bounded number of times
//! (libgit2 asks again for as long as the server refuses).
//!
//! Credentials come from the environment (or files named there) and are never logged:
//!
//! | variable | use |
//! |---|---|
//! | `PLUMBER_GIT_USERNAME` | https user (default `git`) |
//! | `PLUMBER_GIT_PASSWORD` / `PLUMBER_GIT_PASSWORD_FILE` | https password or token |
//! | `PLUMBER_GIT_SSH_KEY` | private key file for ssh (else the ssh agent) |
//! | `PLUMBER_GIT_KNOWN_HOSTS` | the known_hosts file ssh host keys are checked against (else `~/.ssh/known_hosts`) |

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher as _};

use crate::repo::{self, Repository};

/// Why the reconcile loop looks at the branch again. Every trigger goes through one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Startup,
    RefsChanged,
    Poll,
    Webhook,
    Shutdown,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Repo(#[from] repo::Error),
    #[error("cannot mirror {url} into {mirror}: {source}")]
    Mirror {
        url: String,
        mirror: PathBuf,
        #[source]
        source: git2::Error,
    },
    /// The message is libgit2's with every credential scrubbed out.
    #[error("cannot fetch {url}: {message} (retried at the next poll or webhook)")]
    Fetch { url: String, message: String },
    #[error(
        "cannot fetch {url}: {what} after {seconds} s; the server does not answer \
         (retried at the next poll or webhook)"
    )]
    FetchTimeout {
        url: String,
        what: &'static str,
        seconds: u64,
    },
    #[error("fetching {url} was given up: the daemon is stopping")]
    Stopping { url: String },
    #[error(
        "cannot fetch {url}: {count} earlier fetches still hang on the server; \
         not starting another (retried at the next poll or webhook)"
    )]
    FetchesHanging { url: String, count: usize },
    #[error("--watch-refs `{pattern}`: {problem}")]
    RefPattern {
        pattern: String,
        problem: &'static str,
    },
    #[error("cannot write the plan note of {commit} in {repository}: {source}")]
    Note {
        commit: String,
        repository: String,
        #[source]
        source: git2::Error,
    },
    /// The message is libgit2's with every credential scrubbed out.
    #[error("cannot push {NOTES_REF} to {url}: {message} (tried again with the next plan change)")]
    PushNotes { url: String, message: String },
    #[error("cannot watch {path} for new commits: {source}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// Where the topology repository comes from.
#[derive(Debug, Clone)]
pub enum Source {
    Local {
        location: String,
    },
    Remote {
        url: String,
        mirror: PathBuf,
        auth: GitAuth,
        timeouts: FetchTimeouts,
        /// Ref patterns mirrored besides `refs/heads/*` (`refs/pull/*/head`, …).
        watched: Vec<String>,
    },
}

/// The refs a daemon watches by default besides its branch: branches, GitHub pull requests
/// and GitLab merge requests.
pub const DEFAULT_WATCH_REFS: [&str; 3] = [
    "refs/heads/*",
    "refs/pull/*/head",
    "refs/merge-requests/*/head",
];

/// Where the plans of watched refs are kept as git notes.
pub const NOTES_REF: &str = "refs/notes/plumber";

/// Checks `--watch-refs` patterns: each names refs under `refs/` (not Plumber's own or the
/// notes), with at most one `*` (a fetch refspec has one), which matches any characters.
pub fn check_ref_pattern(pattern: &str) -> Result<(), Error> {
    let problem = if !pattern.starts_with("refs/") {
        Some("it must start with `refs/` (e.g. `refs/heads/*`)")
    } else if pattern.matches('*').count() > 1 {
        Some("it may hold one `*` only (as a git refspec), e.g. `refs/pull/*/head`")
    } else if pattern.starts_with("refs/notes/") || pattern.starts_with("refs/plumber/") {
        Some("`refs/notes/` and `refs/plumber/` are Plumber's own")
    } else if pattern.contains(['?', '[', '\\', ' ', ':']) {
        Some("only `*` is a wildcard; `?`, `[`, `\\`, `:` and spaces are not allowed")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(Error::RefPattern {
            pattern: pattern.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// Whether `name` matches a `--watch-refs` pattern (`*` matches any characters, `/` too, as
/// in git refspecs).
pub fn ref_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((before, after)) => {
            name.len() >= before.len() + after.len()
                && name.starts_with(before)
                && name.ends_with(after)
        }
    }
}

/// How long a fetch may take before it is abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchTimeouts {
    /// With nothing received (no pack data, no server message, no credentials request).
    pub idle: Duration,
    /// In all, however slowly data trickles in.
    pub total: Duration,
}

impl Default for FetchTimeouts {
    fn default() -> Self {
        FetchTimeouts {
            idle: Duration::from_secs(60),
            total: Duration::from_secs(600),
        }
    }
}

/// How many times credentials are offered in one fetch: libgit2 asks again after each
/// refusal, so for ever with a wrong SSH key.
const MAX_CREDENTIAL_ATTEMPTS: u32 = 3;

/// Abandoned fetches still blocked on a server, in this process; past this many no new one is
/// started, so a server that hangs every connection cannot pile up threads.
const MAX_HANGING_FETCHES: usize = 4;
static HANGING_FETCHES: AtomicUsize = AtomicUsize::new(0);

/// Credentials for a remote repository: [`GitAuth::from_env`] in the daemon. The password is
/// never printed, not even by `Debug`.
#[derive(Clone, Default)]
pub struct GitAuth {
    /// Default: the URL's user, else `git`.
    pub username: Option<String>,
    pub password: Option<String>,
    /// Read at each fetch (a rotated token is picked up), trailing whitespace removed.
    pub password_file: Option<PathBuf>,
    /// A private key file for ssh; without it, the ssh agent.
    pub ssh_key: Option<PathBuf>,
    /// The known_hosts file an ssh server's host key must be in; without it, libgit2's own
    /// check against `$HOME/.ssh/known_hosts`.
    pub known_hosts: Option<PathBuf>,
}

impl std::fmt::Debug for GitAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitAuth")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "…"))
            .field("password_file", &self.password_file)
            .field("ssh_key", &self.ssh_key)
            .field("known_hosts", &self.known_hosts)
            .finish()
    }
}

impl GitAuth {
    /// `PLUMBER_GIT_USERNAME`, `PLUMBER_GIT_PASSWORD`, `PLUMBER_GIT_PASSWORD_FILE`,
    /// `PLUMBER_GIT_SSH_KEY`, `PLUMBER_GIT_KNOWN_HOSTS`.
    pub fn from_env() -> GitAuth {
        GitAuth {
            username: std::env::var("PLUMBER_GIT_USERNAME").ok(),
            password: std::env::var("PLUMBER_GIT_PASSWORD").ok(),
            password_file: std::env::var_os("PLUMBER_GIT_PASSWORD_FILE").map(PathBuf::from),
            ssh_key: std::env::var_os("PLUMBER_GIT_SSH_KEY").map(PathBuf::from),
            known_hosts: std::env::var_os("PLUMBER_GIT_KNOWN_HOSTS").map(PathBuf::from),
        }
    }

    /// The callbacks of a push to `url`: credentials (offered a bounded number of times)
    /// and the ssh host key check (why a key was refused goes to `refused`).
    fn callbacks<'a>(
        &'a self,
        url: &'a str,
        refused: &'a RefCell<Option<String>>,
    ) -> git2::RemoteCallbacks<'a> {
        let mut callbacks = git2::RemoteCallbacks::new();
        let mut attempts = 0;
        callbacks.credentials(move |url, username, allowed| {
            attempts += 1;
            credentials(self, url, username, allowed, attempts)
        });
        callbacks
            .certificate_check(move |cert, host| self.check_certificate(cert, host, url, refused));
        callbacks
    }

    /// An ssh server's host key against [`GitAuth::known_hosts`]; anything else (https
    /// certificates, or no file given) is libgit2's to check. libgit2 replaces a refusal's
    /// message with its own ("invalid or unknown remote ssh hostkey"), so why the key was
    /// refused is kept in `refused` for the error the daemon reports.
    fn check_certificate(
        &self,
        cert: &git2::cert::Cert<'_>,
        host: &str,
        url: &str,
        refused: &RefCell<Option<String>>,
    ) -> Result<git2::CertificateCheckStatus, git2::Error> {
        let (Some(file), Some(key)) = (
            &self.known_hosts,
            cert.as_hostkey().and_then(|k| k.hostkey()),
        ) else {
            return Ok(git2::CertificateCheckStatus::CertificatePassthrough);
        };
        check_host_key(file, host, ssh_port(url), key)
            .map(|()| git2::CertificateCheckStatus::CertificateOk)
            .map_err(|message| {
                let error = git2::Error::from_str(&message);
                *refused.borrow_mut() = Some(message);
                error
            })
    }

    fn password(&self) -> Option<String> {
        self.password.clone().or_else(|| {
            self.password_file
                .as_ref()
                .and_then(|file| std::fs::read_to_string(file).ok())
                .map(|p| p.trim_end().to_owned())
        })
    }

    /// Everything that must never appear in a message: the passwords and the URL's own.
    fn secrets(&self, url: &str) -> Vec<String> {
        let mut secrets: Vec<String> = self.password().into_iter().collect();
        secrets.extend(self.password.clone());
        if let Some(password) = url_password(url) {
            secrets.push(password.to_owned());
        }
        secrets.retain(|s| !s.is_empty());
        secrets
    }
}

/// The password of `scheme://user:password@host/…`.
fn url_password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let userinfo = &rest[..rest.find('@')?];
    if userinfo.contains('/') {
        return None;
    }
    userinfo.split_once(':').map(|(_, password)| password)
}

fn scrub(message: &str, secrets: &[String]) -> String {
    secrets.iter().fold(message.to_owned(), |message, secret| {
        message.replace(secret.as_str(), "***")
    })
}

impl Source {
    /// A URL (`https://`, `ssh://`, `file://`, …) or `user@host:path` is remote and mirrored;
    /// anything else is a local path, read in place and watched.
    pub fn new(location: &str, state_dir: &Path) -> Source {
        let remote = location.contains("://")
            || (location.contains('@') && location.contains(':') && !Path::new(location).exists());
        if remote {
            Source::Remote {
                url: location.to_owned(),
                mirror: state_dir.join("mirror.git"),
                auth: GitAuth::from_env(),
                timeouts: FetchTimeouts::default(),
                watched: Vec::new(),
            }
        } else {
            Source::Local {
                location: location.to_owned(),
            }
        }
    }

    /// The same source with these credentials (a remote's; nothing for a local one).
    pub fn with_auth(mut self, credentials: GitAuth) -> Source {
        if let Source::Remote { auth, .. } = &mut self {
            *auth = credentials;
        }
        self
    }

    /// The same source mirroring the refs of `patterns` too (a remote's; a local repository
    /// has all its refs already).
    pub fn with_watched_refs(mut self, patterns: &[String]) -> Source {
        if let Source::Remote { watched, .. } = &mut self {
            *watched = patterns
                .iter()
                .filter(|p| !p.starts_with("refs/heads/"))
                .cloned()
                .collect();
        }
        self
    }

    /// The same source with these fetch timeouts (a remote's; nothing for a local one).
    pub fn with_fetch_timeouts(mut self, limits: FetchTimeouts) -> Source {
        if let Source::Remote { timeouts, .. } = &mut self {
            *timeouts = limits;
        }
        self
    }

    /// Opens the repository to read (the mirror for a remote, created on first use).
    pub fn open(&self) -> Result<Repository, Error> {
        match self {
            Source::Local { location } => Ok(Repository::open(location)?),
            Source::Remote { url, mirror, .. } => {
                if !mirror.exists() {
                    init_mirror(url, mirror)?;
                }
                Ok(Repository::open(&mirror.to_string_lossy())?)
            }
        }
    }

    /// Brings the mirror up to date (its branches become exactly the remote's); nothing to do
    /// for a local repository. Returns within the fetch timeouts, whatever the server does.
    pub fn fetch(&self) -> Result<(), Error> {
        self.fetch_unless(&|| false)
    }

    /// As [`Source::fetch`], given up as soon as `stopping` says so (a daemon that stops does
    /// not wait for a slow server).
    pub fn fetch_unless(&self, stopping: &dyn Fn() -> bool) -> Result<(), Error> {
        let Source::Remote {
            url,
            mirror,
            auth,
            timeouts,
            watched,
        } = self
        else {
            return Ok(());
        };
        follow_url(url, mirror)?;
        let hanging = HANGING_FETCHES.load(Ordering::SeqCst);
        if hanging >= MAX_HANGING_FETCHES {
            return Err(Error::FetchesHanging {
                url: redact(url),
                count: hanging,
            });
        }
        static FETCHES: AtomicU64 = AtomicU64::new(0);
        let namespace = format!(
            "{FETCH_NAMESPACE}{}-{}/",
            std::process::id(),
            FETCHES.fetch_add(1, Ordering::SeqCst)
        );
        let progress = Arc::new(Progress::new());
        let (done, result) = mpsc::channel();
        let spawned = {
            let (url, mirror, auth, namespace) =
                (url.clone(), mirror.clone(), auth.clone(), namespace.clone());
            let refspecs = refspecs(watched, &namespace);
            let progress = progress.clone();
            std::thread::Builder::new()
                .name("git-fetch".into())
                .spawn(move || {
                    let fetched = fetch_into(&url, &mirror, &auth, &refspecs, &progress);
                    // Abandoned meanwhile: nobody waits, and it no longer hangs.
                    if progress.state.swap(FINISHED, Ordering::SeqCst) == ABANDONED {
                        HANGING_FETCHES.fetch_sub(1, Ordering::SeqCst);
                        tracing::info!(url = %redact(&url), "an abandoned fetch ended");
                    }
                    let _ = done.send(fetched);
                })
        };
        spawned.map_err(|e| Error::Fetch {
            url: redact(url),
            message: format!("cannot start a fetch thread: {e}"),
        })?;
        let started = Instant::now();
        let fetched = loop {
            match result.recv_timeout(Duration::from_millis(100)) {
                Ok(fetched) => break fetched,
                Err(RecvTimeoutError::Disconnected) => {
                    break Err(Error::Fetch {
                        url: redact(url),
                        message: "the fetch thread failed".into(),
                    });
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            let stop = stopping();
            let (what, limit) = if stop {
                ("the daemon is stopping", Duration::ZERO)
            } else if started.elapsed() >= timeouts.total {
                ("still not done", timeouts.total)
            } else if progress.idle() >= timeouts.idle {
                ("nothing received", timeouts.idle)
            } else {
                continue;
            };
            if progress
                .state
                .compare_exchange(RUNNING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                // It finished just now: take its result.
                continue;
            }
            HANGING_FETCHES.fetch_add(1, Ordering::SeqCst);
            tracing::warn!(url = %redact(url), what, seconds = limit.as_secs(), "abandoning a fetch");
            if stop {
                break Err(Error::Stopping { url: redact(url) });
            }
            break Err(Error::FetchTimeout {
                url: redact(url),
                what,
                seconds: limit.as_secs(),
            });
        };
        fetched?;
        publish(url, mirror, &namespace, watched)
    }

    /// Where plan notes are written: the repository itself when it is local, the mirror when
    /// it is remote.
    pub fn notes_repository(&self) -> Result<Repository, Error> {
        self.open()
    }

    /// Pushes the mirror's [`NOTES_REF`] to the remote (nothing for a local repository, whose
    /// notes are in it already). Forced: the daemon is the notes ref's only writer, and a
    /// daemon with a new mirror starts it again.
    pub fn push_notes(&self) -> Result<(), Error> {
        let Source::Remote {
            url, mirror, auth, ..
        } = self
        else {
            return Ok(());
        };
        let secrets = auth.secrets(url);
        let push_error = |source: git2::Error| Error::PushNotes {
            url: redact(url),
            message: scrub(source.message(), &secrets),
        };
        let git = git2::Repository::open_bare(mirror).map_err(push_error)?;
        if git.find_reference(NOTES_REF).is_err() {
            return Ok(());
        }
        let mut remote = git.remote_anonymous(url).map_err(push_error)?;
        let refused_key = RefCell::new(None);
        let mut callbacks = auth.callbacks(url, &refused_key);
        let rejected = Arc::new(Mutex::new(None));
        {
            let rejected = rejected.clone();
            callbacks.push_update_reference(move |_, status| {
                if let Some(status) = status {
                    *rejected.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(status.to_owned());
                }
                Ok(())
            });
        }
        let mut options = git2::PushOptions::new();
        options.remote_callbacks(callbacks);
        let refspec = format!("+{NOTES_REF}:{NOTES_REF}");
        remote
            .push(&[refspec.as_str()], Some(&mut options))
            .map_err(|e| match refused_key.take() {
                Some(message) => Error::PushNotes {
                    url: redact(url),
                    message,
                },
                None => push_error(e),
            })?;
        if let Some(status) = rejected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            return Err(Error::PushNotes {
                url: redact(url),
                message: format!("the server refused it: {}", scrub(&status, &secrets)),
            });
        }
        Ok(())
    }

    /// For a local repository: a watcher that sends [`Trigger::RefsChanged`] when a ref moves.
    /// Keep it alive as long as triggers are wanted. `None` for a remote (it is polled).
    pub fn watch(
        &self,
        triggers: Sender<Trigger>,
    ) -> Result<Option<notify::RecommendedWatcher>, Error> {
        let Source::Local { .. } = self else {
            return Ok(None);
        };
        let repository = self.open()?;
        let git_dir = repository.git().path().to_path_buf();
        let watch_error = |source| Error::Watch {
            path: git_dir.clone(),
            source,
        };
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                // Reading the repository opens these files too: only changes count, or every
                // look at the branch would trigger the next one.
                if matches!(
                    event.kind,
                    notify::EventKind::Access(_) | notify::EventKind::Other
                ) {
                    return;
                }
                // Object writes are frequent and say nothing; a ref or HEAD moving does.
                let relevant = event.paths.iter().any(|p| {
                    let s = p.to_string_lossy();
                    s.contains("/refs/") || s.ends_with("HEAD") || s.ends_with("packed-refs")
                });
                if relevant {
                    let _ = triggers.send(Trigger::RefsChanged);
                }
            })
            .map_err(watch_error)?;
        watcher
            .watch(&git_dir, RecursiveMode::NonRecursive)
            .map_err(watch_error)?;
        watcher
            .watch(&git_dir.join("refs"), RecursiveMode::Recursive)
            .map_err(watch_error)?;
        Ok(Some(watcher))
    }

    /// A description without credentials, for logs and status.
    pub fn display(&self) -> String {
        match self {
            Source::Local { location } => location.clone(),
            Source::Remote { url, .. } => redact(url),
        }
    }
}

/// Where fetches write before [`publish`] moves `refs/heads/`.
const FETCH_NAMESPACE: &str = "refs/plumber/fetch/";

const RUNNING: u8 = 0;
const ABANDONED: u8 = 1;
const FINISHED: u8 = 2;

/// Shared by a fetch thread's callbacks and the thread waiting for it.
struct Progress {
    last: Mutex<Instant>,
    state: AtomicU8,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            last: Mutex::new(Instant::now()),
            state: AtomicU8::new(RUNNING),
        }
    }

    /// Something arrived; false once the fetch is abandoned, which makes libgit2 stop at its
    /// next callback.
    fn arrived(&self) -> bool {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        self.state.load(Ordering::SeqCst) == RUNNING
    }

    fn idle(&self) -> Duration {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }
}

/// Creates the mirror, or points it at `url` if it was made for another one.
fn follow_url(url: &str, mirror: &Path) -> Result<(), Error> {
    if !mirror.exists() {
        return init_mirror(url, mirror);
    }
    let mirror_error = |source| Error::Mirror {
        url: redact(url),
        mirror: mirror.to_path_buf(),
        source,
    };
    let git = git2::Repository::open_bare(mirror).map_err(mirror_error)?;
    let previous = match git.find_remote("origin") {
        Ok(remote) => remote.url().map(str::to_owned),
        Err(_) => {
            git.remote_with_fetch("origin", url, "+refs/heads/*:refs/heads/*")
                .map_err(mirror_error)?;
            return Ok(());
        }
    };
    if previous.as_deref() != Some(url) {
        tracing::info!(
            from = %previous.as_deref().map(redact).unwrap_or_default(),
            to = %redact(url),
            mirror = %mirror.display(),
            "the repository URL changed; the mirror follows the new one"
        );
        git.remote_set_url("origin", url).map_err(mirror_error)?;
    }
    Ok(())
}

/// Every branch, and the refs of each watched pattern, into `namespace` (`refs/x` →
/// `<namespace>x`).
fn refspecs(watched: &[String], namespace: &str) -> Vec<String> {
    std::iter::once("refs/heads/*")
        .chain(watched.iter().map(String::as_str))
        .filter_map(|pattern| {
            let rest = pattern.strip_prefix("refs/")?;
            Some(format!("+{pattern}:{namespace}{rest}"))
        })
        .collect()
}

/// Fetches `refspecs` of `url` into the mirror.
fn fetch_into(
    url: &str,
    mirror: &Path,
    auth: &GitAuth,
    refspecs: &[String],
    progress: &Progress,
) -> Result<(), Error> {
    let secrets = auth.secrets(url);
    let fetch_error = |source: git2::Error| Error::Fetch {
        url: redact(url),
        message: scrub(source.message(), &secrets),
    };
    let git = git2::Repository::open_bare(mirror).map_err(fetch_error)?;
    // Anonymous: libgit2 also updates a named remote's configured refspecs, outside the
    // namespace.
    let mut remote = git.remote_anonymous(url).map_err(fetch_error)?;
    let refused_key = RefCell::new(None);
    let mut callbacks = git2::RemoteCallbacks::new();
    let mut attempts = 0;
    callbacks.credentials(move |url, username, allowed| {
        attempts += 1;
        if !progress.arrived() {
            return Err(git2::Error::from_str("the fetch was abandoned"));
        }
        credentials(auth, url, username, allowed, attempts)
    });
    callbacks.certificate_check(|cert, host| auth.check_certificate(cert, host, url, &refused_key));
    callbacks.transfer_progress(|_| progress.arrived());
    callbacks.sideband_progress(|_| progress.arrived());
    callbacks.update_tips(|_, _, _| progress.arrived());
    let mut options = git2::FetchOptions::new();
    options
        .remote_callbacks(callbacks)
        .prune(git2::FetchPrune::Off)
        .download_tags(git2::AutotagOption::None);
    let refspecs: Vec<&str> = refspecs.iter().map(String::as_str).collect();
    remote
        .fetch(&refspecs, Some(&mut options), None)
        .map_err(|e| match refused_key.take() {
            Some(message) => Error::Fetch {
                url: redact(url),
                message,
            },
            None => fetch_error(e),
        })
}

/// Makes `refs/heads/` and the watched refs exactly what a completed fetch put in
/// `namespace`, then removes every fetch namespace (an abandoned fetch that ends later writes
/// only its own again). Notes and Plumber's own refs are never touched.
fn publish(url: &str, mirror: &Path, namespace: &str, watched: &[String]) -> Result<(), Error> {
    let mirror_error = |source| Error::Mirror {
        url: redact(url),
        mirror: mirror.to_path_buf(),
        source,
    };
    let git = git2::Repository::open_bare(mirror).map_err(mirror_error)?;
    let mut fetched: Vec<(String, git2::Oid)> = Vec::new();
    let mut stale: Vec<String> = Vec::new();
    for reference in git.references().map_err(mirror_error)? {
        let reference = reference.map_err(mirror_error)?;
        let (Some(name), Some(target)) = (reference.name(), reference.target()) else {
            continue;
        };
        if let Some(rest) = name.strip_prefix(namespace) {
            let mirrored = format!("refs/{rest}");
            if !is_own_ref(&mirrored) {
                fetched.push((mirrored, target));
            }
        }
        if name.starts_with(FETCH_NAMESPACE) {
            stale.push(name.to_owned());
        }
    }
    for (name, target) in &fetched {
        let current = git.refname_to_id(name).ok();
        if current != Some(*target) {
            git.reference(name, *target, true, "plumber: fetch")
                .map_err(mirror_error)?;
        }
    }
    let mirrored = |name: &str| {
        !is_own_ref(name)
            && (name.starts_with("refs/heads/") || watched.iter().any(|p| ref_matches(p, name)))
    };
    let gone: Vec<String> = git
        .references()
        .map_err(mirror_error)?
        .flatten()
        .filter_map(|r| r.name().map(str::to_owned))
        .filter(|name| mirrored(name) && !fetched.iter().any(|(n, _)| n == name))
        .collect();
    for name in gone.iter().chain(&stale) {
        if let Ok(mut reference) = git.find_reference(name) {
            // Removed meanwhile (an abandoned fetch's cleanup) is what was wanted.
            let _ = reference.delete();
        }
    }
    Ok(())
}

/// Refs a fetch never writes or removes: the notes, and the fetch namespaces.
fn is_own_ref(name: &str) -> bool {
    name.starts_with("refs/notes/") || name.starts_with("refs/plumber/")
}

fn init_mirror(url: &str, mirror: &Path) -> Result<(), Error> {
    let mirror_error = |source| Error::Mirror {
        url: redact(url),
        mirror: mirror.to_path_buf(),
        source,
    };
    let git = git2::Repository::init_bare(mirror).map_err(mirror_error)?;
    git.remote_with_fetch("origin", url, "+refs/heads/*:refs/heads/*")
        .map_err(mirror_error)?;
    Ok(())
}

/// `https://user:secret@host/x` → `https://host/x`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The credentials for one request of libgit2, or an error naming what was refused (never a
/// secret) once they have been offered [`MAX_CREDENTIAL_ATTEMPTS`] times.
fn credentials(
    auth: &GitAuth,
    _url: &str,
    username: Option<&str>,
    allowed: git2::CredentialType,
    attempt: u32,
) -> Result<git2::Cred, git2::Error> {
    let user = auth
        .username
        .clone()
        .or_else(|| username.map(str::to_owned))
        .unwrap_or_else(|| "git".into());
    // ssh asks for the user name first when the URL has none.
    if allowed.contains(git2::CredentialType::USERNAME) {
        return git2::Cred::username(&user);
    }
    if allowed.contains(git2::CredentialType::SSH_KEY) {
        if attempt > MAX_CREDENTIAL_ATTEMPTS {
            let what = match &auth.ssh_key {
                Some(key) => format!("the SSH key {} (PLUMBER_GIT_SSH_KEY)", key.display()),
                None => "the ssh agent's keys (set PLUMBER_GIT_SSH_KEY to use a key file)".into(),
            };
            return Err(refused(&user, &what));
        }
        return match &auth.ssh_key {
            Some(key) => {
                // libssh2 would only say that it cannot extract a public key.
                if let Err(error) = std::fs::File::open(key) {
                    return Err(git2::Error::from_str(&format!(
                        "cannot read the SSH key {} (PLUMBER_GIT_SSH_KEY): {error}",
                        key.display()
                    )));
                }
                git2::Cred::ssh_key(&user, None, key, None)
            }
            None => git2::Cred::ssh_key_from_agent(&user),
        };
    }
    if allowed.contains(git2::CredentialType::USER_PASS_PLAINTEXT)
        && let Some(password) = auth.password()
    {
        if attempt > MAX_CREDENTIAL_ATTEMPTS {
            let source = if auth.password.is_some() {
                "PLUMBER_GIT_PASSWORD"
            } else {
                "PLUMBER_GIT_PASSWORD_FILE"
            };
            return Err(refused(&user, &format!("the password of {source}")));
        }
        return git2::Cred::userpass_plaintext(&user, &password);
    }
    if attempt > MAX_CREDENTIAL_ATTEMPTS {
        return Err(git2::Error::from_str(
            "authentication failed: the server wants credentials; set PLUMBER_GIT_PASSWORD, \
             PLUMBER_GIT_PASSWORD_FILE or PLUMBER_GIT_SSH_KEY",
        ));
    }
    git2::Cred::default()
}

/// The port of an ssh URL (`ssh://user@host:2222/path`; 22 for `user@host:path`).
fn ssh_port(url: &str) -> u16 {
    url.strip_prefix("ssh://")
        .or_else(|| url.strip_prefix("git+ssh://"))
        .and_then(|rest| rest.split('/').next())
        .map(|authority| {
            authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host)
        })
        .and_then(|host| host.rsplit_once(':'))
        .filter(|(host, _)| !host.ends_with(']') || host.starts_with('['))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(22)
}

/// Whether `file` (OpenSSH's known_hosts format, hashed host names included) holds `key` for
/// `host` at `port`, as libssh2 (libgit2's ssh) decides it; the error says what to do.
fn check_host_key(file: &Path, host: &str, port: u16, key: &[u8]) -> Result<(), String> {
    let where_ = if port == 22 {
        host.to_owned()
    } else {
        format!("[{host}]:{port}")
    };
    let session =
        ssh2::Session::new().map_err(|e| format!("cannot check the host key of {where_}: {e}"))?;
    let mut known = session
        .known_hosts()
        .map_err(|e| format!("cannot check the host key of {where_}: {e}"))?;
    known
        .read_file(file, ssh2::KnownHostFileKind::OpenSSH)
        .map_err(|e| format!("cannot read the known hosts file {}: {e}", file.display()))?;
    match known.check_port(host, port, key) {
        ssh2::CheckResult::Match => Ok(()),
        ssh2::CheckResult::NotFound => Err(format!(
            "the host key of {where_} is not in the known hosts file {}: add the server's key \
             there (after checking its fingerprint with the server's owner)",
            file.display()
        )),
        ssh2::CheckResult::Mismatch => Err(format!(
            "the host key of {where_} is not the one the known hosts file {} holds for it: the \
             server's key changed, or someone is between the daemon and the server; nothing \
             was fetched",
            file.display()
        )),
        ssh2::CheckResult::Failure => Err(format!(
            "cannot check the host key of {where_} against {}",
            file.display()
        )),
    }
}

fn refused(user: &str, what: &str) -> git2::Error {
    git2::Error::from_str(&format!(
        "authentication failed: the server refused user `{user}` with {what} \
         {MAX_CREDENTIAL_ATTEMPTS} times; check the credentials"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials_in_logs() {
        assert_eq!(
            redact("https://bot:s3cret@git.example/t.git"),
            "https://git.example/t.git"
        );
        assert_eq!(
            redact("https://git.example/t.git"),
            "https://git.example/t.git"
        );
    }

    #[test]
    fn ssh_urls_name_their_port() {
        assert_eq!(ssh_port("ssh://git@example.com:2222/acme/t.git"), 2222);
        assert_eq!(ssh_port("ssh://git@example.com/acme/t.git"), 22);
        assert_eq!(ssh_port("ssh://example.com:7999/t.git"), 7999);
        assert_eq!(ssh_port("git@example.com:acme/t.git"), 22);
        assert_eq!(ssh_port("ssh://git@[::1]:2200/t.git"), 2200);
        assert_eq!(ssh_port("ssh://git@[::1]/t.git"), 22);
    }

    #[test]
    fn secrets_are_scrubbed_and_never_debug_printed() {
        assert_eq!(url_password("https://bot:s3cret@h/x"), Some("s3cret"));
        assert_eq!(url_password("https://bot@h/x"), None);
        assert_eq!(url_password("https://h/a:b@c"), None);
        let auth = GitAuth {
            password: Some("tok3n".into()),
            ..GitAuth::default()
        };
        let secrets = auth.secrets("https://bot:s3cret@h/x");
        assert_eq!(scrub("bad tok3n and s3cret", &secrets), "bad *** and ***");
        assert!(!format!("{auth:?}").contains("tok3n"));
    }

    #[test]
    fn ref_patterns_match_as_refspecs_do() {
        assert!(ref_matches("refs/heads/*", "refs/heads/a/b"));
        assert!(ref_matches("refs/pull/*/head", "refs/pull/12/head"));
        assert!(!ref_matches("refs/pull/*/head", "refs/pull/12/merge"));
        assert!(!ref_matches("refs/pull/*/head", "refs/pull/head"));
        assert!(ref_matches("refs/heads/main", "refs/heads/main"));
        for good in DEFAULT_WATCH_REFS {
            assert!(check_ref_pattern(good).is_ok(), "{good}");
        }
        for bad in ["heads/*", "refs/*/x/*", "refs/notes/*", "refs/heads/[ab]"] {
            let error = check_ref_pattern(bad).unwrap_err().to_string();
            assert!(error.contains(bad), "{error}");
        }
        let namespace = "refs/plumber/fetch/1-0/";
        assert_eq!(
            refspecs(&["refs/pull/*/head".into()], namespace),
            [
                "+refs/heads/*:refs/plumber/fetch/1-0/heads/*",
                "+refs/pull/*/head:refs/plumber/fetch/1-0/pull/*/head"
            ]
        );
    }

    #[test]
    fn locations_are_told_apart() {
        let state = Path::new("/state");
        assert!(matches!(
            Source::new("https://h/r.git", state),
            Source::Remote { .. }
        ));
        assert!(matches!(
            Source::new("git@github.com:acme/t.git", state),
            Source::Remote { .. }
        ));
        assert!(matches!(
            Source::new("example-repo", state),
            Source::Local { .. }
        ));
        assert!(matches!(
            Source::new("file:///tmp/r", state),
            Source::Remote { .. }
        ));
    }
}
