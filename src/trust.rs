//! Signed commits (SPEC §9, opt-in as Flux's `verify`): the keys of a `--trusted-keys`
//! directory, and the verdict on a commit's signature.
//!
//! The directory holds OpenPGP public keys (`*.asc`, armored, as `gpg --export --armor`
//! writes them: one or more keys per block, one or more blocks per file) and SSH public keys
//! (`*.pub`, one `authorized_keys` line per key). Other files are ignored, so that a mounted
//! Kubernetes Secret (with its `..data` links) or a README can sit beside the keys.
//!
//! A commit is trusted when git's signature on it (the `gpgsig` header, what
//! `git commit -S` writes) verifies over the commit's signed data with one of those keys: an
//! OpenPGP signature with the primary key or a signing subkey bound to it, an SSH signature
//! (`sshsig`) in the namespace `git`. Verification is rPGP's and RustCrypto's `ssh-key`'s;
//! nothing here parses armor or does cryptography.

use std::fmt;
use std::path::{Path, PathBuf};

use pgp::composed::{Deserializable as _, DetachedSignature, SignedPublicKey};
use pgp::packet::PublicSubkey;
use pgp::types::{KeyDetails as _, VerifyingKey};

/// The namespace git signs commits in with SSH keys (`ssh-keygen -Y sign -n git`).
pub const SSH_NAMESPACE: &str = "git";

const PGP_SIGNATURE: &str = "-----BEGIN PGP SIGNATURE-----";
const SSH_SIGNATURE: &str = "-----BEGIN SSH SIGNATURE-----";
const PGP_KEY_BLOCK: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----";

/// A key directory that cannot be used. None of these is mended by retrying: the files must
/// be fixed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read the trusted keys directory {}: {source}", dir.display())]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the trusted key file {}: {source}", file.display())]
    ReadFile {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the trusted keys directory {} holds no keys (no *.asc or *.pub file): it would trust no commit; \
         add public keys (`gpg --export --armor KEYID > {}/alice.asc`, `cp ~/.ssh/id_ed25519.pub {}/`) \
         or leave out --trusted-keys",
        dir.display(), dir.display(), dir.display()
    )]
    Empty { dir: PathBuf },
    #[error(
        "{}:{line}: not an OpenPGP public key: {message}; export it with `gpg --export --armor KEYID`",
        file.display()
    )]
    OpenPgp {
        file: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{}:{line}: not an SSH public key: {message}; a *.pub file holds lines like `ssh-ed25519 AAAA… comment`",
        file.display()
    )]
    Ssh {
        file: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: holds no key; remove the file or put a public key in it", file.display())]
    NoKey { file: PathBuf },
}

/// The commit's signature could not be read from git (not a verdict on it: retrying can help).
#[derive(Debug, thiserror::Error)]
#[error("cannot read the signature of commit {commit}: {source}")]
pub struct ReadError {
    pub commit: String,
    #[source]
    pub source: git2::Error,
}

/// Which kind of key signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    OpenPgp,
    Ssh,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::OpenPgp => "openpgp",
            KeyKind::Ssh => "ssh",
        }
    }
}

/// A trusted key that signed a commit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Signer {
    pub kind: KeyKind,
    /// The OpenPGP primary key's fingerprint (hex), or the SSH key's (`SHA256:…`).
    pub fingerprint: String,
    /// The file of the trusted keys directory the key is in.
    pub file: PathBuf,
}

/// The verdict on one commit. Only [`Verdict::Trusted`] may be applied; the others say what
/// to do in [`Verdict::describe`]. It is also what a forge's commit status reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    Trusted(Signer),
    Unsigned,
    /// Signed, by a key the directory does not hold: `key` is its fingerprint (or, for an
    /// OpenPGP signature naming only an issuer key id, that id).
    UnknownKey {
        kind: KeyKind,
        key: String,
    },
    /// Signed by a trusted key (`key`), or in a form plumber cannot check, but the signature
    /// does not verify over this commit: the commit was changed after signing, or the
    /// signature is damaged.
    BadSignature {
        kind: Option<KeyKind>,
        key: Option<String>,
        reason: String,
    },
    /// Signed by a trusted key, but not a descendant of `runs`, the commit that runs: a
    /// force-push back to an older signed commit (a rollback the history does not show).
    NotDescendant {
        signer: Signer,
        runs: String,
    },
}

impl Verdict {
    pub fn is_trusted(&self) -> bool {
        matches!(self, Verdict::Trusted(_))
    }

    /// The key named: the signer's, the unknown one's, or the one whose signature is bad.
    pub fn key(&self) -> Option<&str> {
        match self {
            Verdict::Trusted(signer) => Some(&signer.fingerprint),
            Verdict::Unsigned => None,
            Verdict::UnknownKey { key, .. } => Some(key),
            Verdict::BadSignature { key, .. } => key.as_deref(),
            Verdict::NotDescendant { signer, .. } => Some(&signer.fingerprint),
        }
    }

    /// `trusted`, `unsigned`, `unknown-key`, `bad-signature` or `not-descendant`: a metric's
    /// or a log's label.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Trusted(_) => "trusted",
            Verdict::Unsigned => "unsigned",
            Verdict::UnknownKey { .. } => "unknown-key",
            Verdict::BadSignature { .. } => "bad-signature",
            Verdict::NotDescendant { .. } => "not-descendant",
        }
    }

    /// A trusted verdict on a commit that does not descend from `runs`, which runs.
    pub fn not_descending_from(self, runs: &str) -> Verdict {
        match self {
            Verdict::Trusted(signer) => Verdict::NotDescendant {
                signer,
                runs: runs.to_owned(),
            },
            other => other,
        }
    }

    /// What a person reads: for a refused commit, why and what to do. `dir` is the trusted
    /// keys directory.
    pub fn describe(&self, commit: &str, dir: &Path) -> String {
        let short = &commit[..commit.len().min(12)];
        let dir = dir.display();
        match self {
            Verdict::Trusted(signer) => format!(
                "commit {short} is signed by trusted {} key {} ({})",
                kind_name(signer.kind),
                signer.fingerprint,
                signer.file.display()
            ),
            Verdict::Unsigned => format!(
                "commit {short} is not signed, and --trusted-keys {dir} admits only signed commits; \
                 sign it (`git commit --amend -S`, or `git rebase --exec 'git commit --amend --no-edit -S'`) and push again"
            ),
            Verdict::UnknownKey { kind, key } => format!(
                "commit {short} is signed by {} key {key} which is not in --trusted-keys {dir}; \
                 add its public key there or re-sign the commit with a trusted key",
                kind_name(*kind)
            ),
            Verdict::BadSignature { kind, key, reason } => {
                let by = match (kind, key) {
                    (Some(kind), Some(key)) => format!(" by {} key {key}", kind_name(*kind)),
                    (Some(kind), None) => format!(" ({})", kind_name(*kind)),
                    _ => String::new(),
                };
                format!(
                    "commit {short} has a signature{by} that does not verify: {reason}; \
                     the commit was changed after it was signed, or the signature is damaged: re-sign the commit"
                )
            }
            Verdict::NotDescendant { runs, .. } => format!(
                "commit {short} is signed by a trusted key but does not descend from {}, which \
                 runs: with --trusted-keys the branch only moves forward, so a force-push cannot \
                 bring back an older signed commit; undo a change with `git revert` (or start \
                 the daemon with --allow-rollback)",
                &runs[..runs.len().min(12)]
            ),
        }
    }
}

fn kind_name(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::OpenPgp => "OpenPGP",
        KeyKind::Ssh => "SSH",
    }
}

/// An OpenPGP key of the directory: the primary key and its signing subkeys whose binding
/// to it verifies (what gpg signs with when a key has a signing subkey).
struct OpenPgpKey {
    key: SignedPublicKey,
    signing_subkeys: Vec<PublicSubkey>,
    file: PathBuf,
}

struct SshKey {
    key: ssh_key::PublicKey,
    file: PathBuf,
}

/// The keys of a trusted keys directory.
pub struct TrustedKeys {
    dir: PathBuf,
    openpgp: Vec<OpenPgpKey>,
    ssh: Vec<SshKey>,
}

impl fmt::Debug for TrustedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustedKeys")
            .field("dir", &self.dir)
            .field("openpgp", &self.openpgp.len())
            .field("ssh", &self.ssh.len())
            .finish()
    }
}

impl TrustedKeys {
    /// Reads every `*.asc` and `*.pub` file of `dir`. A file that cannot be read, or a key in
    /// it that cannot be parsed, is an error naming the file and line; so is a directory
    /// without keys (it would trust nothing).
    pub fn load(dir: &Path) -> Result<TrustedKeys, LoadError> {
        let entries = std::fs::read_dir(dir).map_err(|source| LoadError::ReadDir {
            dir: dir.to_owned(),
            source,
        })?;
        let mut files: Vec<PathBuf> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| LoadError::ReadDir {
                dir: dir.to_owned(),
                source,
            })?;
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            let wanted = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("asc" | "pub")
            );
            // `is_file` follows links: a Secret's keys are links into `..data`.
            if wanted && !hidden && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        let mut keys = TrustedKeys {
            dir: dir.to_owned(),
            openpgp: Vec::new(),
            ssh: Vec::new(),
        };
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| LoadError::ReadFile {
                file: file.clone(),
                source,
            })?;
            let before = keys.len();
            if file.extension().is_some_and(|e| e == "asc") {
                keys.openpgp.extend(openpgp_keys(&file, &text)?);
            } else {
                keys.ssh.extend(ssh_keys(&file, &text)?);
            }
            if keys.len() == before {
                return Err(LoadError::NoKey { file });
            }
        }
        if keys.is_empty() {
            return Err(LoadError::Empty {
                dir: dir.to_owned(),
            });
        }
        Ok(keys)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many keys are trusted (OpenPGP certificates and SSH keys).
    pub fn len(&self) -> usize {
        self.openpgp.len() + self.ssh.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The verdict on `commit` of `repository`.
    pub fn verify(
        &self,
        repository: &git2::Repository,
        commit: git2::Oid,
    ) -> Result<Verdict, ReadError> {
        match repository.extract_signature(&commit, None) {
            Ok((signature, signed)) => Ok(self.verify_signature(&signature, &signed)),
            Err(error) if error.code() == git2::ErrorCode::NotFound => {
                // Also what a missing commit gives: tell the two apart.
                match repository.find_commit(commit) {
                    Ok(_) => Ok(Verdict::Unsigned),
                    Err(source) => Err(ReadError {
                        commit: commit.to_string(),
                        source,
                    }),
                }
            }
            Err(source) => Err(ReadError {
                commit: commit.to_string(),
                source,
            }),
        }
    }

    /// The verdict on `signature` (git's `gpgsig` header) over `signed` (the commit without it).
    pub fn verify_signature(&self, signature: &[u8], signed: &[u8]) -> Verdict {
        let text = String::from_utf8_lossy(signature);
        let text = text.trim_start();
        if text.starts_with(PGP_SIGNATURE) {
            self.verify_openpgp(text, signed)
        } else if text.starts_with(SSH_SIGNATURE) {
            self.verify_ssh(text, signed)
        } else {
            Verdict::BadSignature {
                kind: None,
                key: None,
                reason: format!(
                    "the signature is neither OpenPGP nor SSH (it begins `{}`); plumber checks only those two",
                    text.lines().next().unwrap_or_default()
                ),
            }
        }
    }

    fn verify_openpgp(&self, text: &str, signed: &[u8]) -> Verdict {
        let signatures: Vec<DetachedSignature> = match DetachedSignature::from_string_many(text) {
            Ok((signatures, _headers)) => match signatures.collect::<Result<Vec<_>, _>>() {
                Ok(signatures) if !signatures.is_empty() => signatures,
                Ok(_) => return bad_openpgp(None, "the signature block holds no signature".into()),
                Err(error) => return bad_openpgp(None, format!("unreadable signature: {error}")),
            },
            Err(error) => return bad_openpgp(None, format!("unreadable signature: {error}")),
        };
        let mut verdict = None;
        for signature in &signatures {
            let issuers = issuers(&signature.signature);
            let mut matched = false;
            for key in &self.openpgp {
                for component in key.components() {
                    if !issuers.is_empty() && !issuers.iter().any(|i| i.names(&component)) {
                        continue;
                    }
                    match signature.verify(&component, signed) {
                        Ok(()) => {
                            return Verdict::Trusted(Signer {
                                kind: KeyKind::OpenPgp,
                                fingerprint: format!("{:X}", key.key.fingerprint()),
                                file: key.file.clone(),
                            });
                        }
                        // Without an issuer named, any key may be the one: keep trying.
                        Err(_) if issuers.is_empty() => {}
                        Err(error) => {
                            matched = true;
                            verdict = Some(bad_openpgp(
                                Some(format!("{:X}", key.key.fingerprint())),
                                error.to_string(),
                            ));
                        }
                    }
                }
            }
            if !matched && verdict.is_none() {
                verdict = Some(Verdict::UnknownKey {
                    kind: KeyKind::OpenPgp,
                    key: issuers
                        .first()
                        .map_or_else(|| "(no issuer named)".into(), ToString::to_string),
                });
            }
        }
        verdict.unwrap_or(Verdict::Unsigned)
    }

    fn verify_ssh(&self, text: &str, signed: &[u8]) -> Verdict {
        let signature = match ssh_key::SshSig::from_pem(text.trim_end()) {
            Ok(signature) => signature,
            Err(error) => {
                return Verdict::BadSignature {
                    kind: Some(KeyKind::Ssh),
                    key: None,
                    reason: format!("unreadable SSH signature: {error}"),
                };
            }
        };
        let fingerprint = signature
            .public_key()
            .fingerprint(ssh_key::HashAlg::Sha256)
            .to_string();
        let Some(trusted) = self
            .ssh
            .iter()
            .find(|k| k.key.key_data() == signature.public_key())
        else {
            return Verdict::UnknownKey {
                kind: KeyKind::Ssh,
                key: fingerprint,
            };
        };
        if signature.namespace() != SSH_NAMESPACE {
            return Verdict::BadSignature {
                kind: Some(KeyKind::Ssh),
                key: Some(fingerprint),
                reason: format!(
                    "it is made for the namespace `{}`, not `{SSH_NAMESPACE}` (git signs commits in `{SSH_NAMESPACE}`)",
                    signature.namespace()
                ),
            };
        }
        match trusted.key.verify(SSH_NAMESPACE, signed, &signature) {
            Ok(()) => Verdict::Trusted(Signer {
                kind: KeyKind::Ssh,
                fingerprint,
                file: trusted.file.clone(),
            }),
            Err(error) => Verdict::BadSignature {
                kind: Some(KeyKind::Ssh),
                key: Some(fingerprint),
                reason: error.to_string(),
            },
        }
    }
}

fn bad_openpgp(key: Option<String>, reason: String) -> Verdict {
    Verdict::BadSignature {
        kind: Some(KeyKind::OpenPgp),
        key,
        reason,
    }
}

/// A key an OpenPGP signature says made it.
enum Issuer {
    Fingerprint(pgp::types::Fingerprint),
    KeyId(pgp::types::KeyId),
}

impl Issuer {
    fn names(&self, key: &Component<'_>) -> bool {
        match self {
            Issuer::Fingerprint(fingerprint) => key.fingerprint() == *fingerprint,
            Issuer::KeyId(id) => key.legacy_key_id() == *id,
        }
    }
}

impl fmt::Display for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Issuer::Fingerprint(fingerprint) => write!(f, "{fingerprint:X}"),
            Issuer::KeyId(id) => write!(f, "{}", id.to_string().to_uppercase()),
        }
    }
}

/// The issuers a signature names, fingerprints first (they identify a key; a key id may not).
fn issuers(signature: &pgp::packet::Signature) -> Vec<Issuer> {
    let mut out: Vec<Issuer> = signature
        .issuer_fingerprint()
        .into_iter()
        .map(|f| Issuer::Fingerprint(f.clone()))
        .collect();
    out.extend(
        signature
            .issuer_key_id()
            .into_iter()
            .map(|id| Issuer::KeyId(*id)),
    );
    out
}

/// A key of a certificate that may have made a signature.
enum Component<'a> {
    Primary(&'a pgp::packet::PublicKey),
    Subkey(&'a PublicSubkey),
}

impl Component<'_> {
    fn fingerprint(&self) -> pgp::types::Fingerprint {
        match self {
            Component::Primary(key) => key.fingerprint(),
            Component::Subkey(key) => key.fingerprint(),
        }
    }

    fn legacy_key_id(&self) -> pgp::types::KeyId {
        match self {
            Component::Primary(key) => key.legacy_key_id(),
            Component::Subkey(key) => key.legacy_key_id(),
        }
    }
}

impl fmt::Debug for Component<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}", self.fingerprint())
    }
}

impl pgp::types::KeyDetails for Component<'_> {
    fn version(&self) -> pgp::types::KeyVersion {
        match self {
            Component::Primary(key) => key.version(),
            Component::Subkey(key) => key.version(),
        }
    }

    fn legacy_key_id(&self) -> pgp::types::KeyId {
        Component::legacy_key_id(self)
    }

    fn fingerprint(&self) -> pgp::types::Fingerprint {
        Component::fingerprint(self)
    }

    fn algorithm(&self) -> pgp::crypto::public_key::PublicKeyAlgorithm {
        match self {
            Component::Primary(key) => key.algorithm(),
            Component::Subkey(key) => key.algorithm(),
        }
    }

    fn created_at(&self) -> pgp::types::Timestamp {
        match self {
            Component::Primary(key) => key.created_at(),
            Component::Subkey(key) => key.created_at(),
        }
    }

    fn legacy_v3_expiration_days(&self) -> Option<u16> {
        match self {
            Component::Primary(key) => key.legacy_v3_expiration_days(),
            Component::Subkey(key) => key.legacy_v3_expiration_days(),
        }
    }

    fn public_params(&self) -> &pgp::types::PublicParams {
        match self {
            Component::Primary(key) => key.public_params(),
            Component::Subkey(key) => key.public_params(),
        }
    }
}

impl VerifyingKey for Component<'_> {
    fn verify(
        &self,
        hash: pgp::crypto::hash::HashAlgorithm,
        data: &[u8],
        signature: &pgp::types::SignatureBytes,
    ) -> pgp::errors::Result<()> {
        match self {
            Component::Primary(key) => key.verify(hash, data, signature),
            Component::Subkey(key) => key.verify(hash, data, signature),
        }
    }
}

impl OpenPgpKey {
    fn components(&self) -> impl Iterator<Item = Component<'_>> {
        std::iter::once(Component::Primary(&self.key.primary_key))
            .chain(self.signing_subkeys.iter().map(Component::Subkey))
    }
}

/// The OpenPGP certificates of an `*.asc` file: every `BEGIN PGP PUBLIC KEY BLOCK` block of
/// it, each holding one or more keys.
fn openpgp_keys(file: &Path, text: &str) -> Result<Vec<OpenPgpKey>, LoadError> {
    let mut keys = Vec::new();
    for (line, block) in armor_blocks(text) {
        let error = |message: String| LoadError::OpenPgp {
            file: file.to_owned(),
            line,
            message,
        };
        let (parsed, _headers) =
            SignedPublicKey::from_string_many(block).map_err(|e| error(e.to_string()))?;
        let mut found = 0;
        for key in parsed {
            let key = key.map_err(|e| error(e.to_string()))?;
            found += 1;
            let signing_subkeys = key
                .public_subkeys
                .iter()
                // A subkey signs for its certificate only if the certificate says so.
                .filter(|subkey| {
                    subkey.verify_bindings(&key.primary_key).is_ok()
                        && subkey.signatures.iter().any(|s| s.key_flags().sign())
                })
                .map(|subkey| subkey.key.clone())
                .collect();
            keys.push(OpenPgpKey {
                key,
                signing_subkeys,
                file: file.to_owned(),
            });
        }
        if found == 0 {
            return Err(error("the key block holds no public key".into()));
        }
    }
    if keys.is_empty() && !text.trim().is_empty() {
        return Err(LoadError::OpenPgp {
            file: file.to_owned(),
            line: 1,
            message: format!("no `{PGP_KEY_BLOCK}` in the file"),
        });
    }
    Ok(keys)
}

/// Each armored public key block of `text`, with the line it begins on (1-based).
fn armor_blocks(text: &str) -> Vec<(usize, &str)> {
    let starts: Vec<(usize, usize)> = line_offsets(text)
        .filter(|(_, offset)| text[*offset..].starts_with(PGP_KEY_BLOCK))
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(i, (line, offset))| {
            let end = starts.get(i + 1).map_or(text.len(), |(_, next)| *next);
            (*line, &text[*offset..end])
        })
        .collect()
}

/// Each line's number (1-based) and byte offset.
fn line_offsets(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .filter(move |offset| *offset < text.len())
        .enumerate()
        .map(|(i, offset)| (i + 1, offset))
}

/// The SSH keys of a `*.pub` file: one `authorized_keys` line each (options allowed);
/// blank lines and `#` comments are skipped.
fn ssh_keys(file: &Path, text: &str) -> Result<Vec<SshKey>, LoadError> {
    let mut keys = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let entry: ssh_key::authorized_keys::Entry =
            line.parse().map_err(|e: ssh_key::Error| LoadError::Ssh {
                file: file.to_owned(),
                line: index + 1,
                message: e.to_string(),
            })?;
        keys.push(SshKey {
            key: entry.public_key().clone(),
            file: file.to_owned(),
        });
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).unwrap();
        }
        dir
    }

    fn ssh_line() -> String {
        let key = ssh_key::PrivateKey::random(
            &mut ssh_key::rand_core::OsRng,
            ssh_key::Algorithm::Ed25519,
        )
        .unwrap();
        key.public_key().to_openssh().unwrap()
    }

    #[test]
    fn an_empty_directory_is_an_error_since_it_would_trust_nothing() {
        let dir = dir_with(&[("README.md", "keys go here\n")]);
        let error = TrustedKeys::load(dir.path()).unwrap_err();
        assert!(matches!(error, LoadError::Empty { .. }), "{error}");
        assert!(
            error.to_string().contains("would trust no commit"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_directory_names_it() {
        let error = TrustedKeys::load(Path::new("/nonexistent/keys")).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/keys"), "{error}");
    }

    #[test]
    fn a_bad_ssh_line_names_its_file_and_line() {
        let good = ssh_line();
        let dir = dir_with(&[(
            "team.pub",
            &format!("# the team\n{good}\n\nssh-ed25519 not-base64 bob@example\n"),
        )]);
        let error = TrustedKeys::load(dir.path()).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, LoadError::Ssh { line: 4, .. }), "{text}");
        assert!(text.contains("team.pub:4:"), "{text}");
    }

    #[test]
    fn several_ssh_keys_per_file_with_options_and_comments_are_read() {
        let (a, b) = (ssh_line(), ssh_line());
        let dir = dir_with(&[
            (
                "team.pub",
                &format!("{a}\n# b below\nno-pty {b} bob@example\n"),
            ),
            ("notes.txt", "ignored"),
        ]);
        let keys = TrustedKeys::load(dir.path()).unwrap();
        assert_eq!((keys.ssh.len(), keys.openpgp.len()), (2, 0));
    }

    #[test]
    fn a_mounted_config_map_is_read_through_its_links_and_its_hidden_entries_skipped() {
        // What the kubelet makes of a ConfigMap: the files in a hidden timestamped directory,
        // `..data` linking to it, and a link per key.
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("..2026_12_01_18_00_00.1");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("bob.pub"), ssh_line()).unwrap();
        std::os::unix::fs::symlink(&data, dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/bob.pub", dir.path().join("bob.pub")).unwrap();
        let keys = TrustedKeys::load(dir.path()).unwrap();
        assert_eq!(keys.len(), 1);
    }

    #[test]
    fn a_damaged_openpgp_block_names_its_file_and_the_line_it_begins_on() {
        let dir = dir_with(&[(
            "alice.asc",
            "Alice's key:\n\n-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nbm90IGEga2V5\n-----END PGP PUBLIC KEY BLOCK-----\n",
        )]);
        let error = TrustedKeys::load(dir.path()).unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, LoadError::OpenPgp { line: 3, .. }),
            "{text}"
        );
        assert!(text.contains("alice.asc:3:"), "{text}");
    }

    #[test]
    fn an_asc_file_without_a_key_block_is_an_error() {
        let dir = dir_with(&[("alice.asc", &ssh_line())]);
        let error = TrustedKeys::load(dir.path()).unwrap_err();
        assert!(error.to_string().contains("alice.asc:1:"), "{error}");
    }

    #[test]
    fn a_key_file_with_no_key_is_an_error() {
        let dir = dir_with(&[("bob.pub", "# nothing yet\n")]);
        let error = TrustedKeys::load(dir.path()).unwrap_err();
        assert!(matches!(error, LoadError::NoKey { .. }), "{error}");
        assert!(error.to_string().contains("bob.pub"), "{error}");
    }

    #[test]
    fn armor_blocks_are_found_with_their_first_line() {
        let text = "x\n-----BEGIN PGP PUBLIC KEY BLOCK-----\na\n-----END PGP PUBLIC KEY BLOCK-----\n-----BEGIN PGP PUBLIC KEY BLOCK-----\nb\n";
        let blocks = armor_blocks(text);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].0, 2);
        assert!(
            blocks[0]
                .1
                .ends_with("-----END PGP PUBLIC KEY BLOCK-----\n")
        );
        assert_eq!(blocks[1].0, 5);
    }

    #[test]
    fn a_signature_of_another_kind_is_bad_and_says_so() {
        let dir = dir_with(&[("a.pub", &ssh_line())]);
        let keys = TrustedKeys::load(dir.path()).unwrap();
        let verdict = keys.verify_signature(b"-----BEGIN SIGNED MESSAGE-----\nx\n", b"data");
        assert!(matches!(verdict, Verdict::BadSignature { kind: None, .. }));
        assert!(
            verdict
                .describe("abc", dir.path())
                .contains("neither OpenPGP nor SSH")
        );
    }
}
