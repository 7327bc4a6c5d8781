//! Following the branch: where commits come from and what says "look again".
//!
//! A local repository is read where it is, and `notify` watches its refs (loose refs,
//! `packed-refs`, `HEAD`), so a commit is seen within a second. A remote URL (https, ssh,
//! file://) is mirrored into the state directory as a bare repository and fetched every poll
//! interval and on `POST /hooks/git`. Credentials come from the environment (or files named
//! there) and are never logged:
//!
//! | variable | use |
//! |---|---|
//! | `PLUMBER_GIT_USERNAME` | https user (default `git`) |
//! | `PLUMBER_GIT_PASSWORD` / `PLUMBER_GIT_PASSWORD_FILE` | https password or token |
//! | `PLUMBER_GIT_SSH_KEY` | private key file for ssh (else the ssh agent) |

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;

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
    #[error("cannot fetch {url}: {source}")]
    Fetch {
        url: String,
        #[source]
        source: git2::Error,
    },
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
    Local { location: String },
    Remote { url: String, mirror: PathBuf },
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
            }
        } else {
            Source::Local {
                location: location.to_owned(),
            }
        }
    }

    /// Opens the repository to read (the mirror for a remote, created on first use).
    pub fn open(&self) -> Result<Repository, Error> {
        match self {
            Source::Local { location } => Ok(Repository::open(location)?),
            Source::Remote { url, mirror } => {
                if !mirror.exists() {
                    init_mirror(url, mirror)?;
                }
                Ok(Repository::open(&mirror.to_string_lossy())?)
            }
        }
    }

    /// Brings the mirror up to date; nothing to do for a local repository.
    pub fn fetch(&self) -> Result<(), Error> {
        let Source::Remote { url, mirror } = self else {
            return Ok(());
        };
        if !mirror.exists() {
            init_mirror(url, mirror)?;
        }
        let fetch_error = |source| Error::Fetch {
            url: redact(url),
            source,
        };
        let git = git2::Repository::open_bare(mirror).map_err(fetch_error)?;
        let mut remote = git.find_remote("origin").map_err(fetch_error)?;
        let mut callbacks = git2::RemoteCallbacks::new();
        callbacks.credentials(credentials);
        let mut options = git2::FetchOptions::new();
        options
            .remote_callbacks(callbacks)
            .prune(git2::FetchPrune::On);
        remote
            .fetch(&[] as &[&str], Some(&mut options), None)
            .map_err(fetch_error)
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

fn credentials(
    _url: &str,
    username: Option<&str>,
    allowed: git2::CredentialType,
) -> Result<git2::Cred, git2::Error> {
    let user = std::env::var("PLUMBER_GIT_USERNAME")
        .ok()
        .or_else(|| username.map(str::to_owned))
        .unwrap_or_else(|| "git".into());
    if allowed.contains(git2::CredentialType::SSH_KEY) {
        return match std::env::var_os("PLUMBER_GIT_SSH_KEY") {
            Some(key) => git2::Cred::ssh_key(&user, None, Path::new(&key), None),
            None => git2::Cred::ssh_key_from_agent(&user),
        };
    }
    if allowed.contains(git2::CredentialType::USER_PASS_PLAINTEXT) {
        let password = match std::env::var("PLUMBER_GIT_PASSWORD") {
            Ok(password) => Some(password),
            Err(_) => std::env::var_os("PLUMBER_GIT_PASSWORD_FILE")
                .and_then(|file| std::fs::read_to_string(file).ok())
                .map(|p| p.trim_end().to_owned()),
        };
        if let Some(password) = password {
            return git2::Cred::userpass_plaintext(&user, &password);
        }
    }
    git2::Cred::default()
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
