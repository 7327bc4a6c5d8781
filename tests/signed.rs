//! Signed commits (issue 17, SPEC §9): `--trusted-keys DIR` on real git repositories whose
//! commits are signed as git signs them (`gpgsig` over the commit buffer, made with
//! `Repository::commit_signed`), with OpenPGP and SSH keys generated here.
//!
//! The verdicts of `plumber::trust`, `plumber validate --trusted-keys`, and `plumber up
//! --trusted-keys` following a branch whose head turns unsigned, signed by an unknown key and
//! tampered with before a trusted head comes: it keeps what runs and reports each refusal. The
//! daemon runs on a repository without topologies (what it follows is the status `commit`),
//! so no broker is needed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;
#[path = "support/up.rs"]
mod up;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Change, TestRepo, tagged, write};
use git2::Oid;
use git2::build::TreeUpdateBuilder;
use pgp::composed::{
    ArmorOptions, DetachedSignature, EncryptionCaps, KeyType, SecretKeyParamsBuilder,
    SignedSecretKey, SubkeyParamsBuilder,
};
use pgp::crypto::hash::HashAlgorithm;
use pgp::types::{KeyDetails as _, Password};
use plumber::trust::{KeyKind, TrustedKeys, Verdict};
use plumber_testkit::{Broker, Process, unique, wait_until};
use serde_json::Value;
use ssh_key::rand_core::OsRng;

const PATIENCE: Duration = Duration::from_secs(60);

/// An OpenPGP certificate as gpg makes one: a certifying primary key and a signing subkey,
/// which is what signs commits.
fn openpgp_key(user: &str) -> SignedSecretKey {
    let mut signing = SubkeyParamsBuilder::default();
    signing
        .key_type(KeyType::Ed25519Legacy)
        .can_sign(true)
        .can_encrypt(EncryptionCaps::None)
        .can_authenticate(false);
    let mut params = SecretKeyParamsBuilder::default();
    params
        .key_type(KeyType::Ed25519Legacy)
        .can_certify(true)
        .can_sign(false)
        .can_encrypt(EncryptionCaps::None)
        .primary_user_id(user.into())
        .subkeys(vec![signing.build().unwrap()]);
    params.build().unwrap().generate(OsRng).unwrap()
}

fn armored_public(key: &SignedSecretKey) -> String {
    key.to_public_key()
        .to_armored_string(ArmorOptions::default())
        .unwrap()
}

fn fingerprint(key: &SignedSecretKey) -> String {
    format!("{:X}", key.fingerprint())
}

/// What `git commit -S` with gpg writes: a detached binary signature made by the signing
/// subkey, armored.
fn openpgp_sign(key: &SignedSecretKey, data: &[u8]) -> String {
    DetachedSignature::sign_binary_data(
        OsRng,
        &key.secret_subkeys[0].key,
        &Password::empty(),
        HashAlgorithm::Sha256,
        data,
    )
    .unwrap()
    .to_armored_string(ArmorOptions::default())
    .unwrap()
}

fn ssh_key() -> ssh_key::PrivateKey {
    ssh_key::PrivateKey::random(&mut OsRng, ssh_key::Algorithm::Ed25519).unwrap()
}

/// What `git commit -S` with `gpg.format=ssh` writes: `ssh-keygen -Y sign -n git`.
fn ssh_sign(key: &ssh_key::PrivateKey, namespace: &str, data: &[u8]) -> String {
    key.sign(namespace, ssh_key::HashAlg::Sha512, data)
        .unwrap()
        .to_pem(ssh_key::LineEnding::LF)
        .unwrap()
}

/// Commits `changes` on `main` as git does with signing on: the commit buffer, its signature
/// by `sign` (none: an unsigned commit), then the commit with that signature in `gpgsig`.
fn commit(
    repo: &TestRepo,
    message: &str,
    changes: &[Change],
    sign: impl FnOnce(&[u8]) -> Option<String>,
) -> Oid {
    let (buffer, _) = commit_buffer(repo, message, changes);
    let content = std::str::from_utf8(&buffer).unwrap();
    let oid = match sign(&buffer) {
        Some(signature) => repo.git.commit_signed(content, &signature, None).unwrap(),
        None => repo
            .git
            .odb()
            .unwrap()
            .write(git2::ObjectType::Commit, &buffer)
            .unwrap(),
    };
    repo.git
        .reference("refs/heads/main", oid, true, "commit")
        .unwrap();
    oid
}

/// The buffer a commit of `changes` on top of `main` would have, and its tree.
fn commit_buffer(repo: &TestRepo, message: &str, changes: &[Change]) -> (Vec<u8>, Oid) {
    let parent = repo
        .git
        .find_reference("refs/heads/main")
        .ok()
        .and_then(|r| r.peel_to_commit().ok());
    let base = match &parent {
        Some(commit) => commit.tree().unwrap(),
        None => {
            let empty = repo.git.treebuilder(None).unwrap().write().unwrap();
            repo.git.find_tree(empty).unwrap()
        }
    };
    let mut update = TreeUpdateBuilder::new();
    for change in changes {
        if let Change::Write(path, bytes) = change {
            let blob = repo.git.blob(bytes).unwrap();
            update.upsert(path.as_str(), blob, git2::FileMode::Blob);
        }
    }
    let tree = repo
        .git
        .find_tree(update.create_updated(&repo.git, &base).unwrap())
        .unwrap();
    let signature = git2::Signature::now("Test", "test@example.com").unwrap();
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    let buffer = repo
        .git
        .commit_create_buffer(&signature, &signature, message, &tree, &parents)
        .unwrap();
    (buffer.to_vec(), tree.id())
}

/// A trusted keys directory: alice's OpenPGP key (with carol's, in a second block of the
/// same file, as `cat` of two exports gives) and bob's SSH key.
struct Keyring {
    dir: tempfile::TempDir,
    alice: SignedSecretKey,
    carol: SignedSecretKey,
    bob: ssh_key::PrivateKey,
}

impl Keyring {
    fn new() -> Keyring {
        let (alice, carol, bob) = (
            openpgp_key("Alice <alice@example.com>"),
            openpgp_key("Carol <carol@example.com>"),
            ssh_key(),
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("team.asc"),
            format!("{}\n{}", armored_public(&alice), armored_public(&carol)),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("bob.pub"),
            format!("{}\n", bob.public_key().to_openssh().unwrap()),
        )
        .unwrap();
        Keyring {
            dir,
            alice,
            carol,
            bob,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn keys(&self) -> TrustedKeys {
        TrustedKeys::load(self.path()).unwrap()
    }
}

fn verdict(keys: &TrustedKeys, repo: &TestRepo, commit: Oid) -> Verdict {
    keys.verify(&repo.git, commit).unwrap()
}

#[test]
fn a_commit_signed_with_a_trusted_openpgp_subkey_is_trusted_and_names_its_key_and_file() {
    let keyring = Keyring::new();
    let keys = keyring.keys();
    let repo = TestRepo::new();
    for (name, key) in [("alice", &keyring.alice), ("carol", &keyring.carol)] {
        let signed = commit(&repo, name, &[write("a", name)], |data| {
            Some(openpgp_sign(key, data))
        });
        match verdict(&keys, &repo, signed) {
            Verdict::Trusted(signer) => {
                assert_eq!(signer.kind, KeyKind::OpenPgp);
                assert_eq!(signer.fingerprint, fingerprint(key), "the certificate's");
                assert_eq!(signer.file, keyring.path().join("team.asc"));
            }
            other => panic!("{name}'s commit: {other:?}"),
        }
    }
}

#[test]
fn a_commit_signed_with_a_trusted_ssh_key_in_the_git_namespace_is_trusted() {
    let keyring = Keyring::new();
    let repo = TestRepo::new();
    let signed = commit(&repo, "bob", &[write("a", "1")], |data| {
        Some(ssh_sign(&keyring.bob, "git", data))
    });
    let expected = keyring
        .bob
        .public_key()
        .fingerprint(ssh_key::HashAlg::Sha256)
        .to_string();
    match verdict(&keyring.keys(), &repo, signed) {
        Verdict::Trusted(signer) => {
            assert_eq!(signer.kind, KeyKind::Ssh);
            assert_eq!(signer.fingerprint, expected);
            assert!(signer.fingerprint.starts_with("SHA256:"));
            assert_eq!(signer.file, keyring.path().join("bob.pub"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsigned_and_unknown_keys_are_refused_with_what_to_do() {
    let keyring = Keyring::new();
    let keys = keyring.keys();
    let repo = TestRepo::new();
    let unsigned = commit(&repo, "unsigned", &[write("a", "1")], |_| None);
    let verdict_unsigned = verdict(&keys, &repo, unsigned);
    assert_eq!(verdict_unsigned, Verdict::Unsigned);
    let message = verdict_unsigned.describe(&unsigned.to_string(), keyring.path());
    assert!(message.contains("is not signed"), "{message}");
    assert!(message.contains("-S"), "says how to sign: {message}");

    let mallory = openpgp_key("Mallory <mallory@example.com>");
    let by_mallory = commit(&repo, "mallory", &[write("a", "2")], |data| {
        Some(openpgp_sign(&mallory, data))
    });
    let refused = verdict(&keys, &repo, by_mallory);
    let subkey = format!("{:X}", mallory.secret_subkeys[0].key.fingerprint());
    assert_eq!(
        refused,
        Verdict::UnknownKey {
            kind: KeyKind::OpenPgp,
            key: subkey.clone()
        }
    );
    let message = refused.describe(&by_mallory.to_string(), keyring.path());
    assert!(
        message.contains(&subkey)
            && message.contains(&format!(
                "which is not in --trusted-keys {}",
                keyring.path().display()
            ))
            && message.contains("add its public key there or re-sign the commit"),
        "{message}"
    );

    let eve = ssh_key();
    let by_eve = commit(&repo, "eve", &[write("a", "3")], |data| {
        Some(ssh_sign(&eve, "git", data))
    });
    let eve_fingerprint = eve
        .public_key()
        .fingerprint(ssh_key::HashAlg::Sha256)
        .to_string();
    assert_eq!(
        verdict(&keys, &repo, by_eve),
        Verdict::UnknownKey {
            kind: KeyKind::Ssh,
            key: eve_fingerprint
        }
    );
}

#[test]
fn a_signature_over_other_data_is_bad_not_trusted() {
    let keyring = Keyring::new();
    let keys = keyring.keys();
    let repo = TestRepo::new();
    // A trusted key's signature over another commit's buffer: what a commit changed after
    // signing (here its message) carries.
    let (original, _) = commit_buffer(&repo, "approved", &[write("a", "1")]);
    let openpgp_signature = openpgp_sign(&keyring.alice, &original);
    let tampered = commit(&repo, "changed after signing", &[write("a", "1")], |_| {
        Some(openpgp_signature)
    });
    let bad = verdict(&keys, &repo, tampered);
    assert!(
        matches!(&bad, Verdict::BadSignature { kind: Some(KeyKind::OpenPgp), key: Some(key), .. }
            if *key == fingerprint(&keyring.alice)),
        "{bad:?}"
    );
    assert!(
        bad.describe(&tampered.to_string(), keyring.path())
            .contains("does not verify"),
    );

    let ssh_signature = ssh_sign(&keyring.bob, "git", &original);
    let tampered = commit(&repo, "changed too", &[write("a", "1")], |_| {
        Some(ssh_signature)
    });
    assert!(matches!(
        verdict(&keys, &repo, tampered),
        Verdict::BadSignature {
            kind: Some(KeyKind::Ssh),
            key: Some(_),
            ..
        }
    ));

    // Right data, wrong namespace: a file signature must not pass for a commit signature.
    let other_namespace = commit(&repo, "file namespace", &[write("a", "2")], |data| {
        Some(ssh_sign(&keyring.bob, "file", data))
    });
    let bad = verdict(&keys, &repo, other_namespace);
    assert!(
        matches!(&bad, Verdict::BadSignature { reason, .. } if reason.contains("`file`")),
        "{bad:?}"
    );
}

#[test]
fn validate_with_trusted_keys_exits_1_for_an_untrusted_commit_and_reports_the_verdict() {
    let keyring = Keyring::new();
    let repo = TestRepo::new();
    let keys = keyring.path().to_str().unwrap();
    let trusted = commit(&repo, "bob", &[write("README.md", "1")], |data| {
        Some(ssh_sign(&keyring.bob, "git", data))
    });
    let (code, out, err) = common::run(&[
        "validate",
        &repo.location(),
        "--rev",
        &trusted.to_string(),
        "--trusted-keys",
        keys,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("signed: commit ") && out.contains("bob.pub"),
        "{out}"
    );

    let unsigned = commit(&repo, "unsigned", &[write("README.md", "2")], |_| None);
    let (code, out, err) = common::run(&[
        "validate",
        &repo.location(),
        "--trusted-keys",
        keys,
        "--format",
        "json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["commit"], unsigned.to_string().as_str());
    assert_eq!(
        json["valid"], true,
        "the files are valid: only the signature is not"
    );
    assert_eq!(json["signature"]["verdict"], "unsigned");
    assert_eq!(json["signature"]["trusted"], false);
    assert!(
        json["signature"]["message"]
            .as_str()
            .unwrap()
            .contains("is not signed")
    );

    // Without --trusted-keys nothing is asked of signatures.
    let (code, out, _) = common::run(&["validate", &repo.location()]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("signed"), "{out}");

    // A key directory that cannot be used is a usage error naming the file and line.
    std::fs::write(keyring.path().join("broken.pub"), "ssh-rsa AAAA!!\n").unwrap();
    let (code, _, err) = common::run(&["validate", &repo.location(), "--trusted-keys", keys]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("broken.pub:1:"), "{err}");
}

/// `plumber up` on a local repository.
struct Daemon {
    process: Option<Process>,
    server: String,
    log: std::path::PathBuf,
    _state: tempfile::TempDir,
}

impl Daemon {
    fn start(repo: &TestRepo, keys: &Path) -> Daemon {
        let state = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = state.path().join("daemon.log");
        let mut command = up_command(repo, keys, state.path(), port);
        command.stderr(std::fs::File::create(&log).unwrap());
        let daemon = Daemon {
            process: Some(Process::spawn("plumber up", &mut command)),
            server: format!("http://127.0.0.1:{port}"),
            log,
            _state: state,
        };
        wait_until("the daemon answers", PATIENCE, || {
            daemon.get("/api/status").is_some()
        });
        daemon
    }

    fn get(&self, path: &str) -> Option<String> {
        let mut response = ureq::get(&format!("{}{path}", self.server)).call().ok()?;
        response.body_mut().read_to_string().ok()
    }

    fn status(&self) -> Value {
        serde_json::from_str(&self.get("/api/status").unwrap()).unwrap()
    }

    fn wait_status(&self, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
        wait_until(what, PATIENCE, || {
            self.get("/api/status")
                .and_then(|s| serde_json::from_str::<Value>(&s).ok())
                .is_some_and(|s| condition(&s))
        });
        self.status()
    }

    /// Waits until the head `refused` is reported, and checks that `running` still runs.
    fn wait_refused(&self, refused: Oid, running: Oid) -> String {
        let refused = refused.to_string();
        let status = self.wait_status(&format!("{refused} is refused"), |s| {
            s["lastError"]["commit"] == refused.as_str()
        });
        assert_eq!(status["commit"], running.to_string().as_str(), "{status}");
        status["lastError"]["message"].as_str().unwrap().to_owned()
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let text = self.get("/metrics")?;
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .and_then(|value| value.trim().parse().ok())
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

fn up_command(repo: &TestRepo, keys: &Path, state: &Path, port: u16) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_plumber"));
    command
        .args(["up", &repo.location(), "--branch", "main"])
        .args(["--bootstrap", "127.0.0.1:1"])
        .arg("--state-dir")
        .arg(state.join("state"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--trusted-keys")
        .arg(keys)
        .env("RUST_LOG", "info")
        .env_remove("PLUMBER_TRUSTED_KEYS")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

#[test]
fn the_daemon_applies_only_trusted_heads_and_keeps_the_last_good_commit_running() {
    let keyring = Keyring::new();
    let repo = TestRepo::new();
    let good = commit(&repo, "by bob", &[write("README.md", "1")], |data| {
        Some(ssh_sign(&keyring.bob, "git", data))
    });
    let daemon = Daemon::start(&repo, keyring.path());
    daemon.wait_status("the trusted head is applied", |s| {
        s["commit"] == good.to_string().as_str()
    });
    let status = daemon.status();
    assert_eq!(status["lastError"], Value::Null);
    assert_eq!(status["signature"]["commit"], good.to_string().as_str());
    assert_eq!(status["signature"]["trusted"], true, "{status}");
    assert_eq!(status["signature"]["verdict"], "trusted");
    assert_eq!(status["signature"]["kind"], "ssh");
    assert_eq!(daemon.metric("plumber_head_untrusted"), Some(0.0));

    // Pushed one after another, each waited for: every head is looked at.
    let unsigned = commit(&repo, "unsigned", &[write("README.md", "2")], |_| None);
    let message = daemon.wait_refused(unsigned, good);
    assert!(message.contains("is not signed"), "{message}");
    let status = daemon.status();
    assert_eq!(status["phase"], "error", "{status}");
    assert_eq!(status["signature"]["commit"], unsigned.to_string().as_str());
    assert_eq!(status["signature"]["trusted"], false);
    assert_eq!(status["signature"]["verdict"], "unsigned");
    assert_eq!(status["signature"]["message"], message.as_str());
    assert_eq!(
        daemon.metric("plumber_untrusted_commits_total{verdict=\"unsigned\"}"),
        Some(1.0)
    );
    assert_eq!(daemon.metric("plumber_head_untrusted"), Some(1.0));
    // `plumber status` names the verdict beside the last error.
    let (code, out, err) = common::run(&["status", "--server", &daemon.server]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("last error: commit ") && out.contains("signature: refused (unsigned)"),
        "{out}"
    );

    let mallory = openpgp_key("Mallory <mallory@example.com>");
    let by_mallory = commit(&repo, "mallory", &[write("README.md", "3")], |data| {
        Some(openpgp_sign(&mallory, data))
    });
    let message = daemon.wait_refused(by_mallory, good);
    let subkey = format!("{:X}", mallory.secret_subkeys[0].key.fingerprint());
    assert!(
        message.contains(&subkey) && message.contains("which is not in --trusted-keys"),
        "{message}"
    );

    let (other, _) = commit_buffer(&repo, "other", &[write("README.md", "4")]);
    let tampered = commit(&repo, "tampered", &[write("README.md", "4")], |_| {
        Some(openpgp_sign(&keyring.alice, &other))
    });
    let message = daemon.wait_refused(tampered, good);
    assert!(message.contains("does not verify"), "{message}");
    for verdict in ["unsigned", "unknown-key", "bad-signature"] {
        let metric = format!("plumber_untrusted_commits_total{{verdict=\"{verdict}\"}}");
        assert_eq!(daemon.metric(&metric), Some(1.0), "{metric}");
    }

    // The bad push undone (the branch reset to what runs): the refusal is over.
    repo.git
        .reference("refs/heads/main", good, true, "reset")
        .unwrap();
    let status = daemon.wait_status("the reset head is trusted again", |s| {
        s["signature"]["commit"] == good.to_string().as_str()
    });
    assert_eq!(status["lastError"], Value::Null, "{status}");
    assert_eq!(status["phase"], "idle", "{status}");
    assert_eq!(daemon.metric("plumber_head_untrusted"), Some(0.0));

    // A trusted head on top of a refused one (its parent, never applied) is applied.
    let unsigned_again = commit(&repo, "unsigned", &[write("README.md", "5")], |_| None);
    daemon.wait_refused(unsigned_again, good);
    let trusted = commit(&repo, "by alice", &[write("README.md", "6")], |data| {
        Some(openpgp_sign(&keyring.alice, data))
    });
    let status = daemon.wait_status("the trusted head is applied", |s| {
        s["commit"] == trusted.to_string().as_str()
    });
    assert_eq!(status["lastError"], Value::Null, "{status}");
    assert_eq!(status["signature"]["verdict"], "trusted", "{status}");
    assert_eq!(
        status["signature"]["fingerprint"],
        fingerprint(&keyring.alice).as_str()
    );
    let (_, out, _) = common::run(&["status", "--server", &daemon.server]);
    assert!(
        out.contains("signature: commit ") && out.contains("is signed by trusted OpenPGP key"),
        "{out}"
    );

    // Each refusal is a log line with its fields (JSON: stderr is not a terminal).
    let log = std::fs::read_to_string(&daemon.log).unwrap();
    for (commit, verdict) in [
        (unsigned, "unsigned"),
        (by_mallory, "unknown-key"),
        (tampered, "bad-signature"),
    ] {
        assert!(
            log.lines().any(|line| line.contains(&commit.to_string())
                && line.contains(&format!("\"verdict\":\"{verdict}\""))),
            "no log line for {commit} ({verdict}):\n{log}"
        );
    }
}

#[test]
fn an_invalid_trusted_head_does_not_walk_back_past_an_untrusted_commit() {
    let keyring = Keyring::new();
    let repo = TestRepo::new();
    let sign = |data: &[u8]| Some(ssh_sign(&keyring.bob, "git", data));
    let good = commit(&repo, "good", &[write("README.md", "1")], sign);
    let daemon = Daemon::start(&repo, keyring.path());
    daemon.wait_status("the trusted head is applied", |s| {
        s["commit"] == good.to_string().as_str()
    });
    // Two commits at once: an unsigned one, then a signed one that does not validate. The
    // walk back from the invalid head must not apply its unsigned parent.
    let unsigned = commit(&repo, "unsigned", &[write("README.md", "2")], |_| None);
    let invalid = commit(
        &repo,
        "invalid",
        &[write("plumber.yaml", "clusters: [not, a, map]\n")],
        sign,
    );
    let message = daemon.wait_refused(invalid, good);
    assert!(message.contains("is not valid"), "{message}");
    // Give the follower no chance to have applied the parent unseen: its log says why not.
    wait_until("the walk back stops", PATIENCE, || {
        std::fs::read_to_string(&daemon.log)
            .unwrap()
            .contains("its newest ancestor is not signed by a trusted key")
    });
    assert_eq!(daemon.status()["commit"], good.to_string().as_str());
    let _ = unsigned;
}

/// SPEC §11: with trusted keys the branch only moves forward from what runs. A force-push
/// back to an older commit, signed by a trusted key when it was made, is refused (it would
/// roll the cluster back without a trace in the history), also by a daemon restarted since,
/// which knows what runs from its records; `git revert` is the way back.
#[test]
fn a_force_push_back_to_an_older_signed_commit_is_refused_even_after_a_restart() {
    let keyring = Keyring::new();
    let broker = Broker::start();
    let (source, sink) = (unique("signed-in"), unique("signed-out"));
    broker.create_topic(&source, 1);
    broker.create_topic(&sink, 1);
    let repo = TestRepo::new();
    let sign = |data: &[u8]| Some(ssh_sign(&keyring.bob, "git", data));
    let first = commit(&repo, "first", &tagged(&source, &sink, "first"), sign);
    let scratch = tempfile::tempdir().unwrap();
    let keys = keyring.path().display().to_string();
    let args = ["--trusted-keys", keys.as_str()];
    let runs = |daemon: &up::Up, commit: Oid, what: &str| {
        daemon.wait_topology("t", what, |t| {
            t["commit"] == commit.to_string().as_str()
                && t["phase"] == "idle"
                && up::running_group(t, "clean").is_some()
        })
    };
    let daemon = up::Up::start(&repo.location(), Some(&broker), scratch.path(), &args, &[]);
    runs(&daemon, first, "t runs the first commit");
    let second = commit(&repo, "second", &tagged(&source, &sink, "second"), sign);
    runs(&daemon, second, "t runs the second commit");

    repo.git
        .reference("refs/heads/main", first, true, "force-push")
        .unwrap();
    let refused = |daemon: &up::Up| {
        // What runs keeps running (runs again, after a restart).
        let status = daemon.wait_status("the force-pushed head is refused", |s| {
            s["signature"]["commit"] == first.to_string().as_str()
                && s["lastError"]["commit"] == first.to_string().as_str()
                && up::running_group(&up::topology(s, "t"), "clean").is_some()
                && up::topology(s, "t")["commit"] == second.to_string().as_str()
        });
        assert_eq!(
            status["signature"]["verdict"], "not-descendant",
            "{status:#}"
        );
        assert_eq!(status["signature"]["trusted"], false, "{status:#}");
        assert_eq!(status["signature"]["runs"], second.to_string().as_str());
        let message = status["lastError"]["message"].as_str().unwrap();
        assert!(
            message.contains("does not descend from") && message.contains("git revert"),
            "{message}"
        );
    };
    refused(&daemon);
    // Restarted (`plumber up` stops its processors when it stops): what ran runs again, and
    // the head is still refused.
    drop(daemon);
    let daemon = up::Up::start(&repo.location(), Some(&broker), scratch.path(), &args, &[]);
    refused(&daemon);

    // The way back: a commit on top of what runs that undoes the change.
    repo.git
        .reference("refs/heads/main", second, true, "undo the force-push")
        .unwrap();
    let reverted = commit(&repo, "revert", &tagged(&source, &sink, "first"), sign);
    runs(&daemon, reverted, "t runs the revert");
}

#[test]
fn an_unusable_key_directory_stops_the_daemon_at_start_naming_the_file() {
    let keyring = Keyring::new();
    std::fs::write(
        keyring.path().join("broken.asc"),
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nbm9wZQ==\n-----END PGP PUBLIC KEY BLOCK-----\n",
    )
    .unwrap();
    let repo = TestRepo::new();
    commit(&repo, "first", &[write("README.md", "1")], |_| None);
    let state = tempfile::tempdir().unwrap();
    let mut command = up_command(&repo, keyring.path(), state.path(), 1);
    command.stderr(Stdio::piped());
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("broken.asc:1:"), "{stderr}");
}

/// Runs `program` with `args` in `dir`, isolated in `home` (git's and gpg's configuration),
/// and returns its stdout; a failure fails the test with its stderr.
fn tool(home: &Path, dir: &Path, program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("HOME", home)
        .env("GNUPGHOME", home.join("gnupg"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_CONFIG_GLOBAL")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program} (scripts/install-deps installs it): {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Stops the gpg-agent the test's gpg started (in the test's own GNUPGHOME), however the
/// test ends.
struct GpgAgent<'a>(&'a Path);

impl Drop for GpgAgent<'_> {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .args(["--kill", "gpg-agent"])
            .env("GNUPGHOME", self.0.join("gnupg"))
            .status();
    }
}

#[test]
fn commits_signed_by_git_itself_with_gpg_and_ssh_keygen_are_verified() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    std::fs::create_dir(home.join("gnupg")).unwrap();
    std::fs::set_permissions(
        home.join("gnupg"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let _agent = GpgAgent(home);
    let gpg = |args: &[&str]| tool(home, home, "gpg", args);
    let new_key = ["--batch", "--passphrase", "", "--quick-gen-key"];
    // An ed25519 key that signs itself, and an RSA certifying key with a signing subkey.
    gpg(&[
        &new_key[..],
        &["Alice <alice@example.com>", "ed25519", "sign", "never"],
    ]
    .concat());
    gpg(&[
        &new_key[..],
        &["Rsa <rsa@example.com>", "rsa2048", "cert", "never"],
    ]
    .concat());
    let listing = gpg(&["--with-colons", "--list-keys", "rsa@example.com"]);
    let rsa = listing
        .lines()
        .find_map(|l| l.strip_prefix("fpr:::::::::"))
        .and_then(|l| l.strip_suffix(':'))
        .unwrap()
        .to_owned();
    gpg(&[
        "--batch",
        "--passphrase",
        "",
        "--quick-add-key",
        &rsa,
        "rsa2048",
        "sign",
        "never",
    ]);
    // Not exported: the unknown signer.
    gpg(&[
        &new_key[..],
        &["Mallory <mallory@example.com>", "ed25519", "sign", "never"],
    ]
    .concat());
    let keys = home.join("keys");
    std::fs::create_dir(&keys).unwrap();
    // As the README says: one export of two keys (one armor block), an ssh public key file.
    let export = gpg(&[
        "--export",
        "--armor",
        "alice@example.com",
        "rsa@example.com",
    ]);
    std::fs::write(keys.join("team.asc"), export).unwrap();
    let ssh_private = home.join("id_ed25519");
    tool(
        home,
        home,
        "ssh-keygen",
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-f",
            ssh_private.to_str().unwrap(),
        ],
    );
    std::fs::copy(home.join("id_ed25519.pub"), keys.join("id_ed25519.pub")).unwrap();

    let repo = home.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| tool(home, &repo, "git", args);
    git(&["init", "-q", "-b", "main"]);
    git(&["config", "user.name", "Test"]);
    git(&["config", "user.email", "test@example.com"]);
    let commit = |n: usize, signing: &[&str]| {
        std::fs::write(repo.join("README.md"), n.to_string()).unwrap();
        git(&["add", "README.md"]);
        let message = format!("commit {n}");
        git(&[signing, &["commit", "-q", "-m", &message]].concat());
        Oid::from_str(git(&["rev-parse", "HEAD"]).trim()).unwrap()
    };
    let by_alice = commit(
        1,
        &[
            "-c",
            "user.signingkey=alice@example.com",
            "-c",
            "commit.gpgsign=true",
        ],
    );
    let by_rsa = commit(
        2,
        &[
            "-c",
            "user.signingkey=rsa@example.com",
            "-c",
            "commit.gpgsign=true",
        ],
    );
    let ssh_key_setting = format!("user.signingkey={}", ssh_private.display());
    let by_ssh = commit(
        3,
        &[
            "-c",
            "gpg.format=ssh",
            "-c",
            &ssh_key_setting,
            "-c",
            "commit.gpgsign=true",
        ],
    );
    let by_mallory = commit(
        4,
        &[
            "-c",
            "user.signingkey=mallory@example.com",
            "-c",
            "commit.gpgsign=true",
        ],
    );
    let unsigned = commit(5, &[]);

    let trusted = TrustedKeys::load(&keys).unwrap();
    let opened = git2::Repository::open(&repo).unwrap();
    let check = |commit| trusted.verify(&opened, commit).unwrap();
    let signer = |verdict: Verdict| match verdict {
        Verdict::Trusted(signer) => (signer.kind, signer.fingerprint, signer.file),
        other => panic!("{other:?}"),
    };
    let (kind, _, file) = signer(check(by_alice));
    assert_eq!((kind, file), (KeyKind::OpenPgp, keys.join("team.asc")));
    let (kind, fingerprint, _) = signer(check(by_rsa));
    assert_eq!(
        (kind, fingerprint),
        (KeyKind::OpenPgp, rsa),
        "the certificate, not its subkey"
    );
    let (kind, fingerprint, file) = signer(check(by_ssh));
    assert_eq!((kind, file), (KeyKind::Ssh, keys.join("id_ed25519.pub")));
    assert!(fingerprint.starts_with("SHA256:"));
    assert!(matches!(
        check(by_mallory),
        Verdict::UnknownKey {
            kind: KeyKind::OpenPgp,
            ..
        }
    ));
    assert_eq!(check(unsigned), Verdict::Unsigned);
}
