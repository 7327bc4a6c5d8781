//! Remote topology repositories through real git servers on loopback (issue 13): smart HTTP
//! with basic auth and SSH with a key, fetched by `plumber::daemon::Source` and followed by the
//! real `plumber up` (polling and webhooks); force pushes, a changed URL, wrong credentials
//! and a server that never answers.
//!
//! The daemon runs on repositories without topologies: following the branch (status `commit`)
//! is what is tested, so no broker is needed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "../common/mod.rs"]
mod common;
mod servers;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestRepo, write};
use git2::Oid;
use plumber::daemon::Source;
use plumber::daemon::watch::{Error, FetchTimeouts, GitAuth};
use plumber_testkit::{Process, wait_until};
use serde_json::Value;
use servers::{GitHttpServer, PATIENCE, SilentServer, SshServer, free_port};

const USER: &str = "bot";
const PASSWORD: &str = "s3cret-token-1234";

/// A repository served by [`GitHttpServer`] as `/repo`.
struct Served {
    root: tempfile::TempDir,
    repo: TestRepo,
}

impl Served {
    fn new() -> Served {
        let root = tempfile::tempdir().unwrap();
        let repo = TestRepo::new();
        Served { root, repo }
    }

    /// The repository's directory as the server names it.
    fn link(&self) -> PathBuf {
        let link = self.root.path().join("repo");
        if !link.exists() {
            std::os::unix::fs::symlink(self.repo.path(), &link).unwrap();
        }
        link
    }

    fn commit(&self, message: &str) -> Oid {
        self.repo.commit(
            "main",
            message,
            &[write("README.md", format!("{message}\n"))],
        )
    }

    /// What a force push does to the server: `main` reset to `to`, then a new commit on it.
    fn force_push(&self, to: Oid, message: &str) -> Oid {
        self.repo
            .git
            .reference("refs/heads/main", to, true, "force push")
            .unwrap();
        self.commit(message)
    }
}

fn head_of(source: &Source, branch: &str) -> Option<Oid> {
    let repository = source.open().ok()?;
    repository.resolve(&format!("refs/heads/{branch}")).ok()
}

fn password_auth(password: &str) -> GitAuth {
    GitAuth {
        username: Some(USER.into()),
        password: Some(password.into()),
        ..GitAuth::default()
    }
}

fn assert_names_no_secret(message: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!message.contains(secret), "names a secret: {message}");
    }
}

#[test]
fn smart_http_with_basic_auth_follows_commits_branches_and_force_pushes() {
    let served = Served::new();
    let first = served.commit("first");
    served.repo.commit("feature", "side", &[write("x", "1")]);
    let server = GitHttpServer::start(served.root.path(), USER, PASSWORD);
    served.link();
    let state = tempfile::tempdir().unwrap();
    let source = Source::new(&server.url("repo"), state.path()).with_auth(password_auth(PASSWORD));

    source.fetch().unwrap();
    assert_eq!(head_of(&source, "main"), Some(first));
    assert!(head_of(&source, "feature").is_some());

    let second = served.commit("second");
    served
        .repo
        .git
        .find_reference("refs/heads/feature")
        .unwrap()
        .delete()
        .unwrap();
    source.fetch().unwrap();
    assert_eq!(head_of(&source, "main"), Some(second));
    assert_eq!(
        head_of(&source, "feature"),
        None,
        "a deleted branch is gone"
    );

    let rewritten = served.force_push(first, "rewritten");
    source.fetch().unwrap();
    assert_eq!(head_of(&source, "main"), Some(rewritten));
    // Fetches leave nothing behind but the branches.
    let mirror = git2::Repository::open_bare(state.path().join("mirror.git")).unwrap();
    let refs: Vec<String> = mirror
        .references()
        .unwrap()
        .flatten()
        .filter_map(|r| r.name().map(str::to_owned))
        .collect();
    assert_eq!(refs, vec!["refs/heads/main".to_string()]);
}

#[test]
fn wrong_http_credentials_fail_quickly_with_an_error_that_names_no_secret() {
    let served = Served::new();
    served.commit("first");
    let server = GitHttpServer::start(served.root.path(), USER, PASSWORD);
    served.link();
    let state = tempfile::tempdir().unwrap();
    // A wrong password in the environment and another in the URL.
    let url = server
        .url("repo")
        .replace("http://", "http://bot:url-password-5678@");
    let source = Source::new(&url, state.path()).with_auth(password_auth("wrong-password-9876"));
    let started = Instant::now();
    let error = source.fetch().unwrap_err();
    let message = error.to_string();
    assert!(started.elapsed() < PATIENCE, "took {:?}", started.elapsed());
    assert!(
        message.contains("authentication failed")
            && message.contains("PLUMBER_GIT_PASSWORD")
            && message.contains("`bot`"),
        "{message}"
    );
    assert_names_no_secret(
        &message,
        &["wrong-password-9876", "url-password-5678", PASSWORD],
    );
    assert!(
        server.refused.load(std::sync::atomic::Ordering::SeqCst) <= 10,
        "credentials are offered a bounded number of times"
    );

    // No credentials at all: a clear error too.
    let source = Source::new(&server.url("repo"), state.path()).with_auth(GitAuth::default());
    let message = source.fetch().unwrap_err().to_string();
    assert!(message.contains("cannot fetch"), "{message}");
    assert_eq!(head_of(&source, "main"), None, "nothing was fetched");
}

#[test]
fn a_server_that_never_answers_is_abandoned_and_the_mirror_stays_usable() {
    let silent = SilentServer::start();
    let state = tempfile::tempdir().unwrap();
    let timeouts = FetchTimeouts {
        idle: Duration::from_secs(1),
        total: Duration::from_secs(5),
    };
    for url in [
        format!("http://127.0.0.1:{}/repo", silent.port()),
        format!("ssh://git@127.0.0.1:{}/repo", silent.port()),
    ] {
        let source = Source::new(&url, state.path())
            .with_auth(password_auth(PASSWORD))
            .with_fetch_timeouts(timeouts);
        let started = Instant::now();
        let error = source.fetch().unwrap_err();
        assert!(
            matches!(error, Error::FetchTimeout { .. }),
            "{url}: {error}"
        );
        assert!(error.to_string().contains("does not answer"), "{error}");
        assert!(
            started.elapsed() < PATIENCE,
            "{url}: took {:?}",
            started.elapsed()
        );
    }
    // The same mirror, a server that answers: the hung fetches do not get in the way.
    let served = Served::new();
    let first = served.commit("first");
    let server = GitHttpServer::start(served.root.path(), USER, PASSWORD);
    served.link();
    let source = Source::new(&server.url("repo"), state.path())
        .with_auth(password_auth(PASSWORD))
        .with_fetch_timeouts(timeouts);
    source.fetch().unwrap();
    assert_eq!(head_of(&source, "main"), Some(first));
}

#[test]
fn a_stopping_daemon_gives_up_a_hung_fetch_at_once() {
    let silent = SilentServer::start();
    let state = tempfile::tempdir().unwrap();
    // Timeouts far beyond the test's patience: only the stop can end this fetch.
    let source = Source::new(
        &format!("http://127.0.0.1:{}/repo", silent.port()),
        state.path(),
    )
    .with_fetch_timeouts(FetchTimeouts {
        idle: Duration::from_secs(3600),
        total: Duration::from_secs(3600),
    });
    let asked_at = Instant::now() + Duration::from_millis(300);
    let started = Instant::now();
    let error = source
        .fetch_unless(&|| Instant::now() >= asked_at)
        .unwrap_err();
    assert!(matches!(error, Error::Stopping { .. }), "{error}");
    assert!(started.elapsed() < PATIENCE, "took {:?}", started.elapsed());
}

#[test]
fn a_mirror_follows_a_new_url() {
    let old = TestRepo::new();
    old.commit("main", "old", &[write("README.md", "old")]);
    let new = TestRepo::new();
    let moved = new.commit("main", "new", &[write("README.md", "new")]);
    let state = tempfile::tempdir().unwrap();
    let old_source = Source::new(&format!("file://{}", old.location()), state.path());
    old_source.fetch().unwrap();

    let new_url = format!("file://{}", new.location());
    let new_source = Source::new(&new_url, state.path());
    new_source.fetch().unwrap();
    assert_eq!(head_of(&new_source, "main"), Some(moved));
    let mirror = git2::Repository::open_bare(state.path().join("mirror.git")).unwrap();
    assert_eq!(
        mirror.find_remote("origin").unwrap().url(),
        Some(new_url.as_str())
    );
}

/// `plumber up URL` on a state directory of its own.
struct Daemon {
    process: Option<Process>,
    server: String,
    state: tempfile::TempDir,
}

impl Daemon {
    fn start(url: &str, extra: &[&str], env: &[(&str, &Path)]) -> Daemon {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("state");
        Daemon::start_in(state, &dir, url, extra, env)
    }

    /// With the state directory `dir` (`scratch` keeps its log).
    fn start_in(
        scratch: tempfile::TempDir,
        dir: &Path,
        url: &str,
        extra: &[&str],
        env: &[(&str, &Path)],
    ) -> Daemon {
        let state = scratch;
        let port = free_port();
        let log = std::fs::File::create(state.path().join("daemon.log")).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .args(["up", url, "--branch", "main", "--bootstrap", "127.0.0.1:1"])
            .arg("--state-dir")
            .arg(dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("PLUMBER_GIT_USERNAME")
            .env_remove("PLUMBER_GIT_PASSWORD")
            .env_remove("PLUMBER_GIT_PASSWORD_FILE")
            .env_remove("PLUMBER_GIT_SSH_KEY")
            .env_remove("PLUMBER_GIT_KNOWN_HOSTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (name, value) in env {
            command.env(name, value);
        }
        let daemon = Daemon {
            process: Some(Process::spawn("plumber up", &mut command)),
            server: format!("http://127.0.0.1:{port}"),
            state,
        };
        wait_until("the daemon answers", PATIENCE, || daemon.status().is_some());
        daemon
    }

    fn status(&self) -> Option<Value> {
        let mut response = ureq::get(&format!("{}/api/status", self.server))
            .call()
            .ok()?;
        response.body_mut().read_json().ok()
    }

    fn wait_status(&self, what: &str, condition: impl Fn(&Value) -> bool) {
        let met = std::cell::Cell::new(false);
        let last = std::cell::RefCell::new(None);
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::time::Instant::now() < deadline && !met.get() {
            let status = self.status();
            met.set(status.as_ref().is_some_and(&condition));
            *last.borrow_mut() = status;
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(
            met.get(),
            "timed out waiting until {what}; last status: {:#?}\nlog:\n{}",
            last.borrow(),
            self.log()
        );
    }

    fn wait_commit(&self, commit: Oid) {
        let commit = commit.to_string();
        self.wait_status(&format!("the daemon follows {commit}"), |status| {
            status["commit"] == commit.as_str()
        });
    }

    fn hook(&self, signature: Option<&str>) -> u16 {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut request = agent.post(&format!("{}/hooks/git", self.server));
        if let Some(signature) = signature {
            request = request.header("X-Plumber-Signature", signature);
        }
        request.send(BODY).unwrap().status().as_u16()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("daemon.log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(nix::sys::signal::Signal::SIGTERM);
            if process.wait_exit(PATIENCE).is_none() {
                eprintln!("the daemon did not stop within {PATIENCE:?}");
            }
        }
    }
}

const BODY: &[u8] = br#"{"ref":"refs/heads/main"}"#;

fn signature(secret: &str, body: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[test]
fn polling_over_ssh_follows_commits_and_force_pushes() {
    let ssh = SshServer::start();
    let served = Served::new();
    let first = served.commit("first");
    let home = ssh.home();
    let key = ssh.key();
    let daemon = Daemon::start(
        &ssh.url(served.repo.path()),
        &["--poll-interval", "1"],
        &[("HOME", &home), ("PLUMBER_GIT_SSH_KEY", &key)],
    );
    daemon.wait_commit(first);
    let second = served.commit("second");
    daemon.wait_commit(second);
    let rewritten = served.force_push(first, "rewritten");
    daemon.wait_commit(rewritten);
}

/// `repository.credentials.knownHostsFile` (`PLUMBER_GIT_KNOWN_HOSTS` for `plumber up`) is the
/// file host keys are checked against, whatever `~/.ssh/known_hosts` says.
#[test]
fn ssh_host_keys_are_checked_against_the_known_hosts_file_given() {
    let ssh = SshServer::start();
    let served = Served::new();
    let first = served.commit("first");
    let key = ssh.key();
    // A HOME that trusts no server: only the file given can make the fetch succeed.
    let empty_home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(empty_home.path().join(".ssh")).unwrap();
    std::fs::write(empty_home.path().join(".ssh").join("known_hosts"), "").unwrap();
    let trusting = ssh.known_hosts();
    let daemon = Daemon::start(
        &ssh.url(served.repo.path()),
        &["--poll-interval", "1"],
        &[
            ("HOME", empty_home.path()),
            ("PLUMBER_GIT_SSH_KEY", &key),
            ("PLUMBER_GIT_KNOWN_HOSTS", &trusting),
        ],
    );
    daemon.wait_commit(first);
    drop(daemon);

    // A HOME that trusts the server, and a file given that holds another key for it: the
    // file wins, and nothing is fetched.
    let home = ssh.home();
    let wrong = ssh.wrong_known_hosts();
    let daemon = Daemon::start(
        &ssh.url(served.repo.path()),
        &["--poll-interval", "3600"],
        &[
            ("HOME", &home),
            ("PLUMBER_GIT_SSH_KEY", &key),
            ("PLUMBER_GIT_KNOWN_HOSTS", &wrong),
        ],
    );
    daemon.wait_status("the fetch fails on the host key", |status| {
        status["lastError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("host key"))
    });
    let message = daemon.status().unwrap()["lastError"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("is not the one the known hosts file")
            && message.contains(&wrong.display().to_string()),
        "{message}"
    );
    assert_eq!(daemon.status().unwrap()["commit"], Value::Null);
}

#[test]
fn a_webhook_triggers_a_fetch_over_smart_http() {
    let served = Served::new();
    let first = served.commit("first");
    let server = GitHttpServer::start(served.root.path(), USER, PASSWORD);
    served.link();
    let scratch = tempfile::tempdir().unwrap();
    let password_file = scratch.path().join("password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let secret_file = scratch.path().join("webhook-secret");
    std::fs::write(&secret_file, "hook-secret\n").unwrap();
    let user = PathBuf::from(USER);
    // Polling once an hour: only the webhook can make the daemon fetch.
    let daemon = Daemon::start(
        &server.url("repo"),
        &[
            "--poll-interval",
            "3600",
            "--webhook-secret-file",
            &secret_file.to_string_lossy(),
        ],
        &[
            ("PLUMBER_GIT_USERNAME", &user),
            ("PLUMBER_GIT_PASSWORD_FILE", &password_file),
        ],
    );
    daemon.wait_commit(first);

    let second = served.commit("second");
    assert_eq!(daemon.hook(None), 401, "unsigned");
    assert_eq!(daemon.hook(Some(&signature("other", BODY))), 401);
    assert_eq!(daemon.hook(Some(&signature("hook-secret", BODY))), 202);
    daemon.wait_commit(second);

    let rewritten = served.force_push(first, "rewritten");
    assert_eq!(daemon.hook(Some(&signature("hook-secret", BODY))), 202);
    daemon.wait_commit(rewritten);
    assert_names_no_secret(&daemon.log(), &[PASSWORD, "hook-secret"]);
}

#[test]
fn a_wrong_ssh_key_fails_quickly_with_an_error_that_names_no_secret() {
    let ssh = SshServer::start();
    let served = Served::new();
    served.commit("first");
    let home = ssh.home();
    let scratch = tempfile::tempdir().unwrap();
    let garbage = scratch.path().join("garbage_key");
    std::fs::write(&garbage, "not a key\n").unwrap();
    let missing = scratch.path().join("missing_key");
    // A key the server does not know (it allows 1,000 attempts, so only the client can stop
    // asking), a file that is no key, and no file.
    for (key, expected) in [
        (ssh.wrong_key(), "refused user"),
        (garbage, "private key"),
        (missing, "cannot read the SSH key"),
    ] {
        let daemon = Daemon::start(
            &ssh.url(served.repo.path()),
            &["--poll-interval", "3600"],
            &[("HOME", &home), ("PLUMBER_GIT_SSH_KEY", &key)],
        );
        daemon.wait_status("the fetch fails", |status| {
            status["lastError"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("cannot fetch"))
        });
        let message = daemon.status().unwrap()["lastError"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.contains(expected), "{message}");
        let private = std::fs::read_to_string(&key).unwrap_or_default();
        let secret_lines: Vec<&str> = private
            .lines()
            .filter(|l| !l.starts_with("-----") && !l.is_empty())
            .collect();
        assert_names_no_secret(&message, &secret_lines);
        assert_names_no_secret(&daemon.log(), &secret_lines);
        assert_eq!(daemon.status().unwrap()["commit"], Value::Null);
    }
    let refusals = ssh.log().matches("Failed publickey").count();
    assert!(
        (1..=10).contains(&refusals),
        "the wrong key is offered a bounded number of times: {refusals}"
    );
}

#[test]
fn a_state_directory_of_another_repository_is_refused() {
    let shared = tempfile::tempdir().unwrap();
    let first = TestRepo::new();
    let one = first.commit("main", "one", &[write("README.md", "one")]);
    {
        let daemon = Daemon::start_in(
            tempfile::tempdir().unwrap(),
            shared.path(),
            &first.location(),
            &[],
            &[],
        );
        daemon.wait_commit(one);
    }
    // Another repository (its own first commit) on the same state directory.
    let other = TestRepo::new();
    other.commit("main", "unrelated", &[write("README.md", "other")]);
    let daemon = Daemon::start_in(
        tempfile::tempdir().unwrap(),
        shared.path(),
        &other.location(),
        &[],
        &[],
    );
    daemon.wait_status("the daemon refuses the state directory", |status| {
        status["lastError"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("belongs to another repository"))
    });
    assert_eq!(
        daemon.status().unwrap()["commit"],
        Value::Null,
        "nothing followed"
    );
}

#[test]
fn an_empty_webhook_secret_file_is_a_startup_error() {
    let repo = TestRepo::new();
    repo.commit("main", "first", &[write("README.md", "x")]);
    let scratch = tempfile::tempdir().unwrap();
    for content in ["", "  \n\n"] {
        let secret_file = scratch.path().join("secret");
        std::fs::write(&secret_file, content).unwrap();
        let stderr_file = scratch.path().join("stderr");
        let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
        command
            .args(["up", &repo.location(), "--bootstrap", "127.0.0.1:1"])
            .arg("--state-dir")
            .arg(scratch.path().join("state"))
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .arg("--webhook-secret-file")
            .arg(&secret_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_file).unwrap());
        let mut daemon = Process::spawn("plumber up", &mut command);
        let status = daemon.wait_exit(PATIENCE);
        let stderr = std::fs::read_to_string(&stderr_file).unwrap();
        assert!(
            status.is_some_and(|s| !s.success()),
            "exits with an error at once: {status:?} {stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "the webhook secret file {} is empty",
                secret_file.display()
            )),
            "{stderr}"
        );
    }
}
