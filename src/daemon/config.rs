//! The configuration file of `plumber daemon --config FILE` (SPEC §7), YAML, usually mounted
//! from a ConfigMap (`deploy/daemon.yaml` is the one `deploy/` ships).
//!
//! Secrets are never in it: it names the files where the pod mounts them (git credentials,
//! the daemon's own Kafka credentials, the webhook secret, the forge's API token) and the
//! Secret names that processors and KEDA reference. So the daemon itself needs no permission to read Secrets,
//! and a rotated Secret reaches it through the kubelet's mount. Unknown keys are errors, like
//! in step files: a misspelt setting must not be silently ignored.
//!
//! ```yaml
//! kubernetes:
//!   namespace: plumber            # default: the namespace of the daemon's service account
//!   # processorNamespace: plumber-processors   # processors apart from the daemon's Secrets
//! repository:
//!   url: https://github.com/acme/topologies.git
//!   branch: main
//!   credentials: { passwordFile: /var/run/secrets/plumber/git/password }
//! kafka:
//!   clusters:
//!     default:                    # a cluster name of plumber.yaml
//!       bootstrap: kafka-bootstrap.kafka:9092
//!       credentials: { secret: kafka-user, dir: /var/run/secrets/plumber/kafka/default }
//! images:
//!   processor: ghcr.io/plumber-dev/plumber-processor:0.1.0
//! listen: 0.0.0.0:7878
//! listener:                      # what the HTTP listener holds at most (defaults shown)
//!   maxConnections: 512
//!   headerTimeout: 10s
//!   idleTimeout: 60s
//!   maxEventStreams: 64
//!   maxWebhookBody: 2097152      # bytes
//!   allowedHosts: []             # names besides IP addresses and localhost; checked when given
//! cacheDir: /var/lib/plumber     # the git mirror and checkouts (an emptyDir)
//! forge:                         # plans on pull requests (SPEC §9); absent: none
//!   kind: github                 # or gitlab
//!   repo: acme/topologies        # GitLab: the project id or its path
//!   tokenFile: /var/run/secrets/plumber/forge/token
//!   # url: https://ghe.example/api/v3   (default: the public service's API)
//! trustedKeys: /etc/plumber-trusted-keys  # apply only commits signed by these keys; absent: any
//! # publicUrl: https://plumber.example  # commit statuses link to {publicUrl}/api/plans/{ref}
//! # previewLabel: preview  # open pull requests with this label get a preview environment
//! stepSecrets: [scoring-api]     # the Secrets steps may name in secretKeyRef; absent: none
//! # commitBudget: { files: 100000, bytes: 33554432, steps: 50000, topologies: 2000, checkoutBytes: 268435456 }
//! # wedgedAfter: 5m          # /healthz fails once one unit of a thread's work runs this long
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the daemon configuration {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("{path}: `{field}`: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything `plumber daemon` is configured with.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// How the daemon reaches the Kubernetes API, and where it acts.
    #[serde(default)]
    pub kubernetes: Kubernetes,
    /// The topology repository it follows.
    pub repository: Repository,
    /// Per Kafka cluster of `plumber.yaml`, what differs in this environment.
    #[serde(default)]
    pub kafka: Kafka,
    /// The images processors run.
    pub images: Images,
    /// The address of the HTTP API (status, metrics, webhook, health): all interfaces by
    /// default, since probes and the Service reach the pod on its own address.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// What the HTTP listener holds at most (as `plumber up`'s flags); absent: the defaults.
    #[serde(default)]
    pub listener: Listener,
    /// Verification of `POST /hooks/git`; absent: unsigned webhooks are accepted, and only
    /// fetch.
    #[serde(default)]
    pub webhook: Option<Webhook>,
    /// Where the daemon keeps its git mirror and checkouts: a cache, rebuilt after a restart
    /// (what must survive one is in the Topology statuses).
    #[serde(default = "default_cache_dir")]
    pub cache_dir: PathBuf,
    /// The forge the daemon posts pull requests' plans and commit statuses to; absent: none.
    #[serde(default)]
    pub forge: Option<crate::forge::Config>,
    /// A directory of OpenPGP (`*.asc`) and SSH (`*.pub`) public keys, usually a mounted
    /// ConfigMap or Secret: only branch heads signed by one of them are applied (as
    /// `plumber up --trusted-keys`); absent: every valid head is.
    #[serde(default)]
    pub trusted_keys: Option<PathBuf>,
    /// With `trustedKeys`, also apply a signed head that does not descend from what runs (a
    /// force-push back to an older signed commit); default: refused (go back with `git
    /// revert`).
    #[serde(default)]
    pub allow_rollback: bool,
    /// The daemon's API as the forge's readers reach it (its Ingress): commit statuses link
    /// to `{publicUrl}/api/plans/{ref}`; absent: no link.
    #[serde(default)]
    pub public_url: Option<String>,
    /// Open pull requests carrying this label get a preview environment (SPEC §9); needs
    /// `forge`. Absent: none.
    #[serde(default)]
    pub preview_label: Option<String>,
    /// What one commit may make the daemon read and write; absent keys keep their defaults
    /// (SPEC §11, `plumber up --max-commit-*`).
    #[serde(default)]
    pub commit_budget: CommitBudget,
    /// The Secrets (of the processors' namespace) steps may name in `secretKeyRef`; a step
    /// naming any other is invalid (SPEC §11). Default: none. Never the daemon's own.
    #[serde(default)]
    pub step_secrets: Vec<String>,
    /// `/healthz` (the liveness probe) fails once one unit of a daemon thread's work (a
    /// cutover step, a look at the branch, a plan pass) has run this long (`5m`).
    #[serde(default = "default_wedged_after", deserialize_with = "duration")]
    pub wedged_after: Duration,
    /// What running a commit's step tests may take (as `plumber plan`'s `--test-time`,
    /// `--case-time` and `--test-memory`); absent keys keep their defaults.
    #[serde(default)]
    pub step_tests: StepTests,
    /// The data diff of every watched ref's plan (as `plumber plan --sample`): absent, none.
    #[serde(default)]
    pub data_diff: Option<DataDiff>,
}

/// `dataDiff`: [`crate::datadiff::SampleLimits`], each key optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataDiff {
    /// The most recent records read of what feeds each replaced or added step (100).
    pub records: Option<usize>,
    /// Bytes of keys and values read per step (8 MiB).
    pub bytes: Option<u64>,
    /// Time to read one step's records (`10s`).
    #[serde(default, deserialize_with = "some_duration")]
    pub time: Option<Duration>,
}

impl DataDiff {
    /// The limits, defaults where a key is absent.
    pub fn limits(&self) -> crate::datadiff::SampleLimits {
        let default = crate::datadiff::SampleLimits::default();
        crate::datadiff::SampleLimits {
            records: self.records.unwrap_or(default.records),
            bytes: self.bytes.unwrap_or(default.bytes),
            time: self.time.unwrap_or(default.time),
        }
    }
}

/// `stepTests`: [`crate::steptest::Limits`], each key optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepTests {
    /// All the cases of a commit's changed topologies together (`60s`).
    #[serde(default, deserialize_with = "some_duration")]
    pub time: Option<Duration>,
    /// One case (`10s`).
    #[serde(default, deserialize_with = "some_duration")]
    pub case_time: Option<Duration>,
    /// Bytes of heap the process running the cases may take (256 MiB).
    pub memory: Option<u64>,
}

impl StepTests {
    /// The limits, defaults where a key is absent.
    pub fn limits(&self) -> crate::steptest::Limits {
        let default = crate::steptest::Limits::default();
        crate::steptest::Limits {
            time: self.time.unwrap_or(default.time),
            case_time: self.case_time.unwrap_or(default.case_time),
            memory: self.memory.unwrap_or(default.memory),
            program: None,
        }
    }
}

fn some_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

fn default_wedged_after() -> Duration {
    crate::daemon::health::DEFAULT_WEDGED_AFTER
}

/// `commitBudget`: [`crate::spec::budget::Budget`], each key optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommitBudget {
    pub files: Option<u64>,
    pub bytes: Option<u64>,
    pub steps: Option<u64>,
    pub topologies: Option<u64>,
    pub checkout_bytes: Option<u64>,
}

impl CommitBudget {
    /// The budget, defaults where a key is absent.
    pub fn budget(&self) -> crate::spec::budget::Budget {
        let default = crate::spec::budget::Budget::default();
        crate::spec::budget::Budget {
            files: self.files.unwrap_or(default.files),
            bytes: self.bytes.unwrap_or(default.bytes),
            steps: self.steps.unwrap_or(default.steps),
            topologies: self.topologies.unwrap_or(default.topologies),
            checkout_bytes: self.checkout_bytes.unwrap_or(default.checkout_bytes),
        }
    }
}

/// The Secrets `deploy/` mounts into the daemon: its git and forge credentials and webhook
/// secret, which a step must never name (a `secretKeyRef` would hand them to the step's code).
pub const DAEMON_SECRETS: [&str; 3] = ["plumber-git", "plumber-forge", "plumber-webhook"];

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Kubernetes {
    /// A kubeconfig file, for a daemon running outside the cluster; absent: the in-cluster
    /// client (the pod's service account token and the API server of its environment).
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the Topologies, processors and lease; absent: the client's default
    /// (in the cluster, the namespace of the daemon's service account).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The `coordination.k8s.io` Lease that elects the one replica that acts (the Role in
    /// `deploy/` grants this name only).
    #[serde(default = "default_lease")]
    pub lease: String,
    /// Where processors run (StatefulSets, ScaledObjects, TriggerAuthentications, pods), when
    /// not in `namespace`: a namespace without the daemon's own Secrets, since whoever may
    /// create a StatefulSet that mounts a Secret can read it (SPEC §11). Absent: `namespace`.
    #[serde(default)]
    pub processor_namespace: Option<String>,
}

impl Default for Kubernetes {
    fn default() -> Self {
        Kubernetes {
            kubeconfig: None,
            namespace: None,
            lease: default_lease(),
            processor_namespace: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Repository {
    /// The repository's URL (https, ssh or file://), without credentials.
    pub url: String,
    /// The branch to follow.
    #[serde(default = "default_branch")]
    pub branch: String,
    /// How often it is fetched (`30s`, `2m`); `POST /hooks/git` fetches at once.
    #[serde(default = "default_poll", deserialize_with = "duration")]
    pub poll_interval: Duration,
    /// Where the pod mounts the git credentials.
    #[serde(default)]
    pub credentials: GitCredentials,
    /// Refs whose merge into the branch is planned (`GET /api/plans`, git notes); `*`
    /// matches any characters.
    #[serde(default = "default_watch_refs")]
    pub watch_refs: Vec<String>,
    /// Push the plan notes from the mirror to the repository.
    #[serde(default)]
    pub push_notes: bool,
}

/// Git credentials, as files of a mounted Secret (read at each fetch, so a rotated Secret
/// takes effect without a restart).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GitCredentials {
    /// The https user (default `git`); not a secret.
    #[serde(default)]
    pub username: Option<String>,
    /// A file holding the https password or token.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// A private key file for ssh.
    #[serde(default)]
    pub ssh_key_file: Option<PathBuf>,
    /// The known_hosts file ssh host keys are checked against.
    #[serde(default)]
    pub known_hosts_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Kafka {
    /// By cluster name of `plumber.yaml` (`default` when it names none).
    #[serde(default)]
    pub clusters: BTreeMap<String, Cluster>,
    /// Keep retired internal topics instead of deleting them (as `plumber up
    /// --keep-topics`): for clusters that refuse deletion (`delete.topic.enable=false`), or
    /// where it breaks other topics (tansu 0.6). Plans say which topics are kept.
    #[serde(default)]
    pub keep_topics: bool,
}

/// What a Kafka cluster of `plumber.yaml` is in this environment.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cluster {
    /// Bootstrap servers instead of `plumber.yaml`'s (which usually name a developer's
    /// broker).
    #[serde(default)]
    pub bootstrap: Option<String>,
    /// librdkafka settings added to `plumber.yaml`'s, key by key; never secrets (those go in
    /// `credentials`).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// The cluster's credentials, instead of `plumber.yaml`'s `credentials`.
    #[serde(default)]
    pub credentials: Option<KafkaCredentials>,
}

/// A Secret whose keys are librdkafka property names (`sasl.username`, `sasl.password`, …;
/// `ca.crt`, `tls.crt`, `tls.key` for the `ssl.*.location` settings), SPEC §2.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaCredentials {
    /// The Secret's name, in the daemon's namespace: processors and the KEDA
    /// TriggerAuthentication of every ScaledObject reference it.
    pub secret: String,
    /// Where the daemon's own pod mounts that Secret: its admin client reads the same keys as
    /// files there (as `plumber up --kafka-credentials DIR` does).
    pub dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Images {
    /// The `plumber-processor` image: jq and sql steps run it, http steps run it beside the
    /// user's image, exec steps copy its binary into the user's image with an init container.
    pub processor: String,
    /// The pull policy of the processors' containers; absent: Kubernetes' default.
    #[serde(default)]
    pub pull_policy: Option<PullPolicy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// As a container's `imagePullPolicy` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// The limits of the HTTP listener ([`super::ListenerConfig`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Listener {
    /// Connections open at once; past it, a connection is answered 503 (`/healthz` still
    /// answers) and closed.
    pub max_connections: usize,
    /// The time a client has to send a request's head (and a webhook's body).
    #[serde(deserialize_with = "duration")]
    pub header_timeout: Duration,
    /// A connection on which nothing moved for this long is closed.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// `GET /api/events` clients at once.
    pub max_event_streams: usize,
    /// The largest webhook body, in bytes.
    pub max_webhook_body: usize,
    /// Names the daemon is reached by (its Ingress's, the Service's) besides IP addresses and
    /// `localhost`; when given, requests by any other name are refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

impl Default for Listener {
    fn default() -> Self {
        Listener::from(super::ListenerConfig::default())
    }
}

impl From<super::ListenerConfig> for Listener {
    fn from(config: super::ListenerConfig) -> Self {
        Listener {
            max_connections: config.max_connections,
            header_timeout: config.header_timeout,
            idle_timeout: config.idle_timeout,
            max_event_streams: config.max_event_streams,
            max_webhook_body: config.max_webhook_body,
            allowed_hosts: config.allowed_hosts,
        }
    }
}

impl From<&Listener> for super::ListenerConfig {
    fn from(listener: &Listener) -> Self {
        super::ListenerConfig {
            max_connections: listener.max_connections,
            header_timeout: listener.header_timeout,
            idle_timeout: listener.idle_timeout,
            max_event_streams: listener.max_event_streams,
            max_webhook_body: listener.max_webhook_body,
            allowed_hosts: listener.allowed_hosts.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Webhook {
    /// A file holding the webhook secret (GitHub's, GitLab's token, or Plumber's HMAC key).
    pub secret_file: PathBuf,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 7878))
}

fn default_cache_dir() -> PathBuf {
    PathBuf::from("/var/lib/plumber")
}

fn default_lease() -> String {
    "plumber".into()
}

fn default_branch() -> String {
    "main".into()
}

fn default_watch_refs() -> Vec<String> {
    super::watch::DEFAULT_WATCH_REFS.map(str::to_owned).to_vec()
}

fn default_poll() -> Duration {
    Duration::from_secs(30)
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text)
        .map_err(|e| serde::de::Error::custom(format!("`{text}` is not a duration ({e})")))
}

impl Config {
    /// Reads, parses and checks the file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses and checks the text of the file at `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        let config: Config = serde_saphyr::from_str(text).map_err(|source| Error::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        config.check(path)?;
        Ok(config)
    }

    /// What serde cannot say: names Kubernetes would refuse, secrets where none belong.
    fn check(&self, path: &Path) -> Result<()> {
        let invalid = |field: &str, message: String| Error::Invalid {
            path: path.to_owned(),
            field: field.to_owned(),
            message,
        };
        if let Some(namespace) = &self.kubernetes.namespace
            && let Some(problem) = name_problem(namespace, 63, false)
        {
            return Err(invalid("kubernetes.namespace", problem));
        }
        if let Some(namespace) = &self.kubernetes.processor_namespace
            && let Some(problem) = name_problem(namespace, 63, false)
        {
            return Err(invalid("kubernetes.processorNamespace", problem));
        }
        if let Some(problem) = name_problem(&self.kubernetes.lease, 253, true) {
            return Err(invalid("kubernetes.lease", problem));
        }
        if self.repository.url.trim().is_empty() {
            return Err(invalid("repository.url", "the URL is empty".into()));
        }
        if has_password(&self.repository.url) {
            return Err(invalid(
                "repository.url",
                "the URL carries a password; mount it from a Secret and name the file in \
                 repository.credentials.passwordFile"
                    .into(),
            ));
        }
        if self.repository.branch.trim().is_empty() {
            return Err(invalid("repository.branch", "the branch is empty".into()));
        }
        if self.repository.poll_interval.is_zero() {
            return Err(invalid(
                "repository.pollInterval",
                "the interval must be longer than 0 s".into(),
            ));
        }
        for pattern in &self.repository.watch_refs {
            if let Err(error) = super::watch::check_ref_pattern(pattern) {
                return Err(invalid("repository.watchRefs", error.to_string()));
            }
        }
        for (name, cluster) in &self.kafka.clusters {
            for (key, value) in &cluster.properties {
                if let Some(problem) = crate::spec::properties::problem(
                    key,
                    value,
                    crate::spec::properties::Origin::Operator,
                ) {
                    return Err(invalid(
                        &format!("kafka.clusters.{name}.properties.{key}"),
                        problem,
                    ));
                }
            }
            if let Some(credentials) = &cluster.credentials
                && let Some(problem) = name_problem(&credentials.secret, 253, true)
            {
                return Err(invalid(
                    &format!("kafka.clusters.{name}.credentials.secret"),
                    problem,
                ));
            }
        }
        let listener = &self.listener;
        for (field, zero) in [
            ("listener.maxConnections", listener.max_connections == 0),
            ("listener.maxEventStreams", listener.max_event_streams == 0),
            ("listener.maxWebhookBody", listener.max_webhook_body == 0),
            ("listener.headerTimeout", listener.header_timeout.is_zero()),
            ("listener.idleTimeout", listener.idle_timeout.is_zero()),
            ("wedgedAfter", self.wedged_after.is_zero()),
            (
                "stepTests.time",
                self.step_tests.time.is_some_and(|t| t.is_zero()),
            ),
            (
                "stepTests.caseTime",
                self.step_tests.case_time.is_some_and(|t| t.is_zero()),
            ),
            ("stepTests.memory", self.step_tests.memory == Some(0)),
            (
                "dataDiff.time",
                self.data_diff
                    .as_ref()
                    .and_then(|d| d.time)
                    .is_some_and(|t| t.is_zero()),
            ),
        ] {
            if zero {
                return Err(invalid(field, "must be more than 0".into()));
            }
        }
        if let Some(name) = listener
            .allowed_hosts
            .iter()
            .find(|name| name.is_empty() || name.contains([':', '/', ' ']))
        {
            return Err(invalid(
                "listener.allowedHosts",
                format!("`{name}` is not a host name (no port, no scheme)"),
            ));
        }
        let kafka_secrets: Vec<&str> = self
            .kafka
            .clusters
            .values()
            .filter_map(|c| c.credentials.as_ref().map(|c| c.secret.as_str()))
            .collect();
        for name in &self.step_secrets {
            if let Some(problem) = name_problem(name, 253, true) {
                return Err(invalid("stepSecrets", problem));
            }
            if DAEMON_SECRETS.contains(&name.as_str()) {
                return Err(invalid(
                    "stepSecrets",
                    format!("`{name}` holds the daemon's own credentials; steps can never use it"),
                ));
            }
            if kafka_secrets.contains(&name.as_str()) {
                return Err(invalid(
                    "stepSecrets",
                    format!(
                        "`{name}` holds a Kafka cluster's credentials, which processors get \
                         through the cluster's `credentials`; steps cannot name it"
                    ),
                ));
            }
        }
        if self.images.processor.trim().is_empty() {
            return Err(invalid("images.processor", "the image is empty".into()));
        }
        if let Some(forge) = &self.forge {
            match forge.check() {
                Err(crate::forge::Error::Invalid { field, message, .. }) => {
                    return Err(invalid(&format!("forge.{field}"), message));
                }
                Err(other) => return Err(invalid("forge", other.to_string())),
                Ok(()) => {}
            }
        }
        if self.allow_rollback && self.trusted_keys.is_none() {
            return Err(invalid(
                "allowRollback",
                "it only means something with `trustedKeys`".into(),
            ));
        }
        match &self.preview_label {
            Some(label) if label.trim().is_empty() => {
                return Err(invalid("previewLabel", "the label is empty".into()));
            }
            Some(_) if self.forge.is_none() => {
                return Err(invalid(
                    "previewLabel",
                    "previews are decided by pull requests' labels: configure `forge` too".into(),
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

/// Why `name` is not a DNS-1123 label (`dots: false`) or subdomain (`dots: true`) of at most
/// `max` characters, as Kubernetes requires of object names.
fn name_problem(name: &str, max: usize, dots: bool) -> Option<String> {
    let well_formed = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    let parts_ok = if dots {
        name.split('.').all(well_formed)
    } else {
        well_formed(name)
    };
    if name.is_empty() || name.len() > max || !parts_ok {
        Some(format!(
            "`{name}` is not a Kubernetes name: lowercase letters, digits and `-`{}, starting \
             and ending with a letter or digit, at most {max} characters",
            if dots { " (and `.`)" } else { "" }
        ))
    } else {
        None
    }
}

/// Whether an http(s) URL has `user:password@` in it.
fn has_password(url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    if !scheme.starts_with("http") {
        return false;
    }
    let authority = rest.split('/').next().unwrap_or_default();
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// librdkafka settings that hold secrets (`sasl.password`, `ssl.key.password`,
/// `sasl.oauthbearer.client.secret`, `ssl.key.pem`, …).
#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, Path::new("daemon.yaml"))
    }

    const MINIMAL: &str = "\
repository: { url: 'https://git.example/acme/topologies.git' }
images: { processor: 'plumber-processor:dev' }
";

    #[test]
    fn the_shipped_configuration_parses() -> anyhow::Result<()> {
        let config = parse(include_str!("../../deploy/daemon.yaml"))?;
        assert_eq!(config.listen, default_listen());
        assert!(config.kubernetes.kubeconfig.is_none(), "in-cluster client");
        assert!(config.kafka.clusters.contains_key("default"));
        Ok(())
    }

    #[test]
    fn a_minimal_configuration_takes_the_defaults() -> anyhow::Result<()> {
        let config = parse(MINIMAL)?;
        assert_eq!(config.repository.branch, "main");
        assert_eq!(config.repository.poll_interval, Duration::from_secs(30));
        assert_eq!(config.repository.credentials, GitCredentials::default());
        assert_eq!(config.kubernetes, Kubernetes::default());
        assert_eq!(config.kubernetes.lease, "plumber");
        assert_eq!(config.listen, SocketAddr::from(([0, 0, 0, 0], 7878)));
        assert!(config.kafka.clusters.is_empty() && config.webhook.is_none());
        assert_eq!(config.cache_dir, Path::new("/var/lib/plumber"));
        assert_eq!(
            config.repository.watch_refs,
            crate::daemon::watch::DEFAULT_WATCH_REFS
        );
        assert!(!config.repository.push_notes);
        assert!(config.forge.is_none());
        assert!(config.trusted_keys.is_none());
        assert_eq!(
            crate::daemon::ListenerConfig::from(&config.listener),
            crate::daemon::ListenerConfig::default()
        );
        Ok(())
    }

    #[test]
    fn a_full_configuration_reads_every_field() -> anyhow::Result<()> {
        let config = parse(
            "\
kubernetes: { kubeconfig: /home/me/.kube/config, namespace: streams, lease: plumber-a }
repository:
  url: ssh://git@git.example/acme/topologies.git
  branch: production
  pollInterval: 2m
  watchRefs: ['refs/heads/*', 'refs/pull/*/head']
  pushNotes: true
  credentials:
    sshKeyFile: /var/run/secrets/plumber/git/ssh-privatekey
    knownHostsFile: /var/run/secrets/plumber/git/known_hosts
kafka:
  clusters:
    default:
      bootstrap: kafka:9093
      properties: { security.protocol: SASL_SSL }
      credentials: { secret: kafka-user, dir: /var/run/secrets/plumber/kafka/default }
images: { processor: 'registry.example/plumber-processor:1', pullPolicy: IfNotPresent }
listen: 127.0.0.1:8080
listener:
  maxConnections: 100
  headerTimeout: 5s
  idleTimeout: 2m
  maxEventStreams: 8
  maxWebhookBody: 65536
  allowedHosts: [plumber.example]
webhook: { secretFile: /var/run/secrets/plumber/webhook/secret }
cacheDir: /cache
forge:
  kind: gitlab
  url: https://gitlab.example/api/v4
  repo: acme/streams/topologies
  tokenFile: /var/run/secrets/plumber/forge/token
trustedKeys: /etc/plumber-trusted-keys
publicUrl: https://plumber.example
previewLabel: preview
",
        )?;
        assert_eq!(
            config.trusted_keys.as_deref(),
            Some(Path::new("/etc/plumber-trusted-keys"))
        );
        assert_eq!(config.kubernetes.namespace.as_deref(), Some("streams"));
        assert_eq!(config.repository.poll_interval, Duration::from_secs(120));
        assert_eq!(
            config.repository.watch_refs,
            ["refs/heads/*", "refs/pull/*/head"]
        );
        assert!(config.repository.push_notes);
        let cluster = &config.kafka.clusters["default"];
        assert_eq!(cluster.bootstrap.as_deref(), Some("kafka:9093"));
        assert_eq!(
            cluster.credentials.as_ref().map(|c| c.secret.as_str()),
            Some("kafka-user")
        );
        assert_eq!(config.images.pull_policy, Some(PullPolicy::IfNotPresent));
        assert_eq!(config.listen.port(), 8080);
        assert_eq!(
            crate::daemon::ListenerConfig::from(&config.listener),
            crate::daemon::ListenerConfig {
                max_connections: 100,
                header_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(120),
                max_event_streams: 8,
                max_webhook_body: 65536,
                allowed_hosts: vec!["plumber.example".into()],
            }
        );
        assert_eq!(config.cache_dir, Path::new("/cache"));
        let forge = config
            .forge
            .as_ref()
            .map(|f| (f.kind, f.api_url(), f.repo.as_str()));
        assert_eq!(
            forge,
            Some((
                crate::forge::Kind::GitLab,
                "https://gitlab.example/api/v4",
                "acme/streams/topologies"
            ))
        );
        assert_eq!(
            config.public_url.as_deref(),
            Some("https://plumber.example")
        );
        assert_eq!(config.preview_label.as_deref(), Some("preview"));
        Ok(())
    }

    #[test]
    fn a_forge_with_a_bad_repository_or_url_is_refused() {
        let forge = |section: &str| match parse(&format!("{MINIMAL}forge: {section}\n")) {
            Err(Error::Invalid { field, .. }) => field,
            other => format!("not refused: {other:?}"),
        };
        assert_eq!(
            forge("{ kind: github, repo: topologies, tokenFile: /t }"),
            "forge.repo"
        );
        assert_eq!(
            forge("{ kind: github, repo: a/b, tokenFile: /t, url: 'ftp://x' }"),
            "forge.url"
        );
        let token = parse(&format!(
            "{MINIMAL}forge: {{ kind: github, repo: a/b, token: x }}\n"
        ));
        assert!(matches!(token, Err(Error::Parse { .. })), "{token:?}");
    }

    #[test]
    fn step_tests_limits_default_and_are_read() -> anyhow::Result<()> {
        let default = parse(MINIMAL)?.step_tests.limits();
        assert_eq!(default, crate::steptest::Limits::default());
        let config = parse(&format!(
            "{MINIMAL}stepTests:\n  time: 2m\n  caseTime: 500ms\n  memory: 1048576\n"
        ))?;
        let limits = config.step_tests.limits();
        assert_eq!(limits.time, Duration::from_secs(120));
        assert_eq!(limits.case_time, Duration::from_millis(500));
        assert_eq!(limits.memory, 1 << 20);
        match parse(&format!("{MINIMAL}stepTests:\n  caseTime: 0s\n")) {
            Err(Error::Invalid { field, .. }) => assert_eq!(field, "stepTests.caseTime"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    #[test]
    fn a_preview_label_needs_a_forge() {
        match parse(&format!("{MINIMAL}previewLabel: preview\n")) {
            Err(Error::Invalid { field, .. }) => assert_eq!(field, "previewLabel"),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn unknown_and_missing_keys_are_errors() {
        let unknown = parse(&format!("{MINIMAL}listen_address: 0.0.0.0:80\n"));
        assert!(
            matches!(&unknown, Err(Error::Parse { .. }))
                && unknown
                    .as_ref()
                    .err()
                    .is_some_and(|e| e.to_string().contains("listen_address")),
            "{unknown:?}"
        );
        let nested = parse(&MINIMAL.replace("url:", "uri:"));
        assert!(matches!(nested, Err(Error::Parse { .. })), "{nested:?}");
        let missing = parse("repository: { url: x }\n");
        assert!(matches!(missing, Err(Error::Parse { .. })), "{missing:?}");
    }

    #[test]
    fn secrets_and_bad_names_are_refused() {
        let invalid_field = |text: &str| match parse(text) {
            Err(Error::Invalid { field, .. }) => field,
            other => format!("not refused: {other:?}"),
        };
        assert_eq!(
            invalid_field(&MINIMAL.replace("https://", "https://me:token@")),
            "repository.url"
        );
        assert_eq!(
            invalid_field(&format!(
                "{MINIMAL}kafka: {{ clusters: {{ default: {{ properties: {{ sasl.password: x }} }} }} }}\n"
            )),
            "kafka.clusters.default.properties.sasl.password"
        );
        assert_eq!(
            invalid_field(&format!("{MINIMAL}kubernetes: {{ namespace: Streams }}\n")),
            "kubernetes.namespace"
        );
        assert_eq!(
            invalid_field(&MINIMAL.replace(
                "repository: { url: 'https://git.example/acme/topologies.git' }",
                "repository: { url: 'https://git.example/t.git', pollInterval: 0s }"
            )),
            "repository.pollInterval"
        );
        assert_eq!(
            invalid_field(&MINIMAL.replace(
                "repository: { url: 'https://git.example/acme/topologies.git' }",
                "repository: { url: 'https://git.example/t.git', watchRefs: ['heads/*'] }"
            )),
            "repository.watchRefs"
        );
        assert_eq!(
            invalid_field(&format!("{MINIMAL}listener: {{ maxConnections: 0 }}\n")),
            "listener.maxConnections"
        );
        assert_eq!(
            invalid_field(&format!("{MINIMAL}listener: {{ idleTimeout: 0s }}\n")),
            "listener.idleTimeout"
        );
        assert_eq!(
            invalid_field(&format!(
                "{MINIMAL}listener: {{ allowedHosts: ['plumber.example:443'] }}\n"
            )),
            "listener.allowedHosts"
        );
        assert_eq!(
            invalid_field(&format!("{MINIMAL}stepSecrets: [scoring, plumber-forge]\n")),
            "stepSecrets"
        );
        assert_eq!(
            invalid_field(&format!(
                "{MINIMAL}stepSecrets: [kafka-user]\nkafka: {{ clusters: {{ default: {{ credentials: {{ secret: kafka-user, dir: /k }} }} }} }}\n"
            )),
            "stepSecrets"
        );
        assert_eq!(
            invalid_field(&format!(
                "{MINIMAL}kafka: {{ clusters: {{ default: {{ properties: {{ acks: '1' }} }} }} }}\n"
            )),
            "kafka.clusters.default.properties.acks"
        );
        assert!(parse(&format!("{MINIMAL}stepSecrets: [scoring]\n")).is_ok());
        // A user name alone is not a secret (ssh://git@…, https://ci@…).
        assert!(has_password("https://me:t@host/x") && !has_password("https://me@host/x"));
        assert!(!has_password("ssh://git@host:22/x"));
    }
}
