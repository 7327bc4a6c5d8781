//! The `plumber` command line (SPEC §5). Exit codes: 0 success, 1 invalid input (validation
//! errors, merge conflicts), 2 usage or I/O error.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use plumber::daemon::{DaemonConfig, ListenerConfig};
use plumber::graph::Topology;
use plumber::repo::{MergePreview, Repository};
use plumber::spec::budget::Budget;
use plumber::steptest::{Commands, Limits as StepTestLimits};
use plumber::{Validation, output, plan, validate};

mod ask;
mod cluster;
mod dev;
mod up;

#[derive(Parser)]
#[command(
    name = "plumber",
    version,
    about = "GitOps for stream-processing topologies on Kafka"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of `up`'s many flags costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Check a commit of a topology repository: every error with file, line and column.
    Validate {
        /// Path or file:// URL of the repository.
        #[arg(default_value = ".")]
        repo: String,
        /// Any revision `git rev-parse` accepts.
        #[arg(long, default_value = "HEAD")]
        rev: String,
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
        /// Also check that the commit is signed by a key of DIR (OpenPGP `*.asc`, SSH `*.pub`),
        /// as `up --trusted-keys DIR` requires of every commit it applies.
        #[arg(long, env = "PLUMBER_TRUSTED_KEYS", value_name = "DIR")]
        trusted_keys: Option<std::path::PathBuf>,
    },
    /// Run a commit's step tests (`<step>.test.yaml` beside `<step>.yaml`): each case's
    /// input through the step's transform, compared with what the case expects.
    Test {
        #[arg(default_value = ".")]
        repo: String,
        #[arg(long, default_value = "HEAD")]
        rev: String,
        /// Only this topology's tests.
        #[arg(long)]
        topology: Option<String>,
        /// Only this step's tests.
        #[arg(long)]
        step: Option<String>,
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
        #[command(flatten)]
        limits: TestLimitArgs,
        /// Do not run the cases of exec and http steps (their commands, from a checkout of
        /// the commit): they are reported as not run.
        #[arg(long)]
        no_commands: bool,
    },
    /// Runs step-test cases for `plumber test`, `plan` and the daemon, isolated from them:
    /// jobs on stdin, answers on stdout.
    #[command(hide = true)]
    StepTestWorker {
        /// Bytes of heap the cases may take.
        #[arg(long)]
        memory: u64,
        /// Seconds one case may take.
        #[arg(long)]
        case_time: f64,
    },
    /// Print the step graph of a commit.
    Graph {
        #[arg(default_value = ".")]
        repo: String,
        #[arg(long, default_value = "HEAD")]
        rev: String,
        /// Only this topology.
        #[arg(long)]
        topology: Option<String>,
        #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
        format: GraphFormat,
    },
    /// Show what changes between two commits and the cutover actions that apply it.
    Plan {
        #[arg(default_value = ".")]
        repo: String,
        /// The running revision; omit for an empty cluster.
        #[arg(long, conflicts_with_all = ["base", "head"])]
        from: Option<String>,
        /// The revision to move to.
        #[arg(long, required_unless_present = "head", conflicts_with_all = ["base", "head"])]
        to: Option<String>,
        /// Merge preview: plan merging --head into this branch, against the branch.
        #[arg(long, requires = "head")]
        base: Option<String>,
        /// The pull request's branch or ref (with --base).
        #[arg(long, requires = "base")]
        head: Option<String>,
        #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
        format: PlanFormat,
        /// Plan for a daemon run with `--keep-topics`: retired internal topics are kept, so
        /// their deletions are listed as kept instead of as actions.
        #[arg(long)]
        keep_topics: bool,
        /// Also show what a preview environment of the change would run: the steps it
        /// starts, on live data, writing `<sink topic>.preview.<slug>` (the slug of --head or
        /// --to: `pr-N` for `refs/pull/N/head`, `mr-N` for GitLab's, else the branch name).
        #[arg(long)]
        preview: bool,
        #[command(flatten)]
        limits: TestLimitArgs,
        #[command(flatten)]
        sample: SampleArgs,
        /// Also run the commands of exec and http steps (from checkouts of the commits) in
        /// step tests and the data diff: code of the commit runs on this machine.
        #[arg(long)]
        run_commands: bool,
    },
    /// Run the daemon with the local runtime: follow a branch and apply every valid commit,
    /// running processors as local processes.
    Up {
        /// Path of a local repository, or a remote URL (https, ssh) to mirror.
        #[arg(default_value = ".")]
        repo: String,
        /// The branch to follow (default: the local repository's current branch, else main).
        #[arg(long)]
        branch: Option<String>,
        /// Kafka bootstrap servers for every cluster (overrides plumber.yaml).
        #[arg(long, env = "PLUMBER_BOOTSTRAP", value_name = "HOST:PORT")]
        bootstrap: Option<String>,
        /// Where the daemon keeps its state, processor logs and checkouts.
        #[arg(long, default_value = ".plumber", value_name = "DIR")]
        state_dir: std::path::PathBuf,
        /// Address of the HTTP API (status, history, metrics, webhook).
        #[arg(long, default_value = "127.0.0.1:7878", value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// Add a data diff to each watched ref's plan: every replaced or added processor's
        /// old and new version run on the N most recent records of what feeds it where the
        /// topology runs (as `plumber plan --sample`).
        #[arg(long, value_name = "N")]
        sample: Option<usize>,
        #[command(flatten)]
        step_tests: TestLimitArgs,
        /// Run the commands of exec and http steps in step tests (of the branch's commits,
        /// from their checkouts) and in the data diff (of pull requests whose preview
        /// environment runs, which a maintainer's label approved): their code runs on this
        /// machine. Without it those cases are reported as not run.
        #[arg(long)]
        run_commands: bool,
        #[command(flatten)]
        listener: ListenerArgs,
        /// How often a remote repository is fetched, in seconds.
        #[arg(long, default_value_t = 30, value_name = "SECS")]
        poll_interval: u64,
        /// Restart a processor whose group has lag but committed nothing for this many seconds
        /// (never less than the record timeout plus 27 s: a record still in hand is not a stall).
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        stall_timeout: u64,
        /// `/healthz` answers 503 once one unit of a daemon thread's work (a cutover step, a
        /// look at the branch, a plan of the watched refs) has run this many seconds.
        #[arg(long, default_value_t = 300, value_name = "SECS")]
        wedged_after: u64,
        /// Seconds one record may take in a processor, every attempt included; then it is
        /// dead-lettered (`timeout`) and processing goes on.
        #[arg(long, default_value_t = 60, value_name = "SECS",
              value_parser = clap::value_parser!(u64).range(1..=86400))]
        record_timeout: u64,
        /// Keep retired internal topics instead of deleting them (needed on tansu 0.6, whose
        /// topic deletion breaks the other existing topics).
        #[arg(long)]
        keep_topics: bool,
        /// File holding the webhook secret; POST /hooks/git must then be signed.
        #[arg(long, env = "PLUMBER_WEBHOOK_SECRET_FILE", value_name = "FILE")]
        webhook_secret_file: Option<std::path::PathBuf>,
        /// Where `secretKeyRef: { name: N, key: K }` in a step's `env` is read: the file
        /// DIR/N/K. Steps may reference only the Secrets that are subdirectories of DIR at
        /// start (none without it).
        #[arg(long, env = "PLUMBER_SECRETS", value_name = "DIR")]
        secrets: Option<std::path::PathBuf>,
        /// The rebalance protocol of the processors started from now on: `cooperative`
        /// (KIP-429) or `eager`. tansu 0.6 recovers crashed members only under `eager`.
        #[arg(long, env = "PLUMBER_ASSIGNOR", value_enum, default_value_t = AssignorChoice::Cooperative)]
        assignor: AssignorChoice,
        /// The credentials of clusters with `credentials:` in plumber.yaml, one librdkafka
        /// property per file (sasl.username, sasl.password, …; ca.crt, tls.crt, tls.key).
        #[arg(long, env = "PLUMBER_KAFKA_CREDENTIALS", value_name = "DIR")]
        kafka_credentials: Option<std::path::PathBuf>,
        /// Apply only commits signed by a key of DIR: OpenPGP public keys (`*.asc`, armored)
        /// and SSH public keys (`*.pub`). An unsigned or otherwise signed head is refused and
        /// what runs keeps running. Read at start.
        #[arg(long, env = "PLUMBER_TRUSTED_KEYS", value_name = "DIR")]
        trusted_keys: Option<std::path::PathBuf>,
        /// The most files under topologies/ one commit may have; a commit with more is
        /// invalid, unread (see also --max-commit-bytes, -steps, -topologies).
        #[arg(long, value_name = "N", default_value_t = Budget::default().files)]
        max_commit_files: u64,
        /// The most bytes of YAML one commit may make the daemon read.
        #[arg(long, value_name = "BYTES", default_value_t = Budget::default().bytes)]
        max_commit_bytes: u64,
        /// The most step files one commit may have.
        #[arg(long, value_name = "N", default_value_t = Budget::default().steps)]
        max_commit_steps: u64,
        /// The most topologies one commit may have.
        #[arg(long, value_name = "N", default_value_t = Budget::default().topologies)]
        max_commit_topologies: u64,
        /// The most bytes a checkout of a commit (the directories of its exec and http steps)
        /// may write.
        #[arg(long, value_name = "BYTES", default_value_t = Budget::default().checkout_bytes)]
        max_checkout_bytes: u64,
        /// With --trusted-keys, also apply a signed head that does not descend from what
        /// runs (a force-push back to an older signed commit). Off: go back with `git revert`.
        #[arg(long, requires = "trusted_keys")]
        allow_rollback: bool,
        /// Refs whose merge into the branch is planned (`GET /api/plans`, a git note on each
        /// head in refs/notes/plumber); repeat for several. `*` matches any characters.
        #[arg(long = "watch-refs", value_name = "GLOB",
              default_values_t = plumber::daemon::watch::DEFAULT_WATCH_REFS.map(str::to_owned))]
        watch_refs: Vec<String>,
        /// Push the plan notes to a remote repository (they stay in the mirror otherwise).
        #[arg(long)]
        push_notes: bool,
        /// Publish each pull request's plan as one comment (updated in place) and a commit
        /// status on each watched ref's head, on this forge.
        #[arg(long, env = "PLUMBER_FORGE", value_enum,
              requires_all = ["forge_repo", "forge_token_file"])]
        forge: Option<plumber::forge::Kind>,
        /// The forge's API (GitHub Enterprise: https://HOST/api/v3; self-hosted GitLab:
        /// https://HOST/api/v4); default: the public service's.
        #[arg(
            long,
            env = "PLUMBER_FORGE_URL",
            value_name = "URL",
            requires = "forge"
        )]
        forge_url: Option<String>,
        /// The repository on the forge: GitHub OWNER/NAME; GitLab the project's path or id.
        #[arg(
            long,
            env = "PLUMBER_FORGE_REPO",
            value_name = "OWNER/NAME",
            requires = "forge"
        )]
        forge_repo: Option<String>,
        /// File holding the forge's API token (read again before each request, never logged).
        #[arg(
            long,
            env = "PLUMBER_FORGE_TOKEN_FILE",
            value_name = "FILE",
            requires = "forge"
        )]
        forge_token_file: Option<std::path::PathBuf>,
        /// This daemon's API as the forge's readers reach it: commit statuses link to
        /// URL/api/plans/REF.
        #[arg(long, env = "PLUMBER_PUBLIC_URL", value_name = "URL")]
        public_url: Option<String>,
        /// Run a preview environment for each open pull request carrying this label (which
        /// only people with write access can set): its changed steps on live data, writing
        /// shadow topics `<sink>.preview.pr-N`; torn down when it closes or loses the label.
        #[arg(
            long,
            env = "PLUMBER_PREVIEW_LABEL",
            value_name = "LABEL",
            requires = "forge"
        )]
        preview_label: Option<String>,
    },
    /// Show what a running daemon is doing: per topology, commit, phase, steps and lag.
    Status {
        #[arg(long, default_value = "http://127.0.0.1:7878", value_name = "URL")]
        server: String,
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
        /// Follow the daemon: redraw in place whenever its status changes (with
        /// `--format json`, one document per line); waits for a daemon that went away.
        #[arg(long)]
        watch: bool,
    },
    /// Helpers for trying Plumber locally: create source and sink topics, write sample records.
    #[command(subcommand)]
    Dev(dev::Dev),
    /// Show the cutovers a running daemon applied, with their cutover offsets.
    History {
        #[arg(long, default_value = "http://127.0.0.1:7878", value_name = "URL")]
        server: String,
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
    /// The daemon in a Kubernetes cluster: follows the repository, runs processors as
    /// StatefulSets scaled by KEDA, keeps cutover state in each Topology's status, and acts
    /// only while it holds the Lease. FILE as deploy/daemon.yaml.
    Daemon {
        #[arg(long, value_name = "FILE", default_value = "/etc/plumber/daemon.yaml")]
        config: std::path::PathBuf,
    },
    /// Print the CustomResourceDefinition of the Topology resource as YAML
    /// (`plumber crd | kubectl apply -f -`).
    Crd,
    /// Print the Kubernetes objects of a revision as YAML: per topology its Topology, then
    /// each processor's StatefulSet, KEDA ScaledObject and TriggerAuthentication, as the
    /// daemon applies them when it deploys the revision from nothing.
    Render {
        #[arg(default_value = ".")]
        repo: String,
        #[arg(long, default_value = "HEAD")]
        rev: String,
        /// The namespace the daemon runs in.
        #[arg(long, default_value = "plumber")]
        namespace: String,
        /// The plumber-processor image.
        #[arg(long, default_value = DEFAULT_PROCESSOR_IMAGE, value_name = "IMAGE")]
        processor_image: String,
        /// The repository URL the Topology resources name (default: REPO as given).
        #[arg(long, value_name = "URL")]
        repository: Option<String>,
        /// The branch the Topology resources name.
        #[arg(long, default_value = "main")]
        branch: String,
    },
}

/// Where `deploy/docker/processor.Dockerfile`'s image is published, at this version.
const DEFAULT_PROCESSOR_IMAGE: &str = concat!(
    "ghcr.io/plumber-dev/plumber-processor:",
    env!("CARGO_PKG_VERSION")
);

#[derive(Clone, Copy, ValueEnum)]
enum AssignorChoice {
    Cooperative,
    Eager,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TextOrJson {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum GraphFormat {
    Dot,
    Mermaid,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlanFormat {
    Text,
    Markdown,
    Json,
}

const INVALID: u8 = 1;
const FAILURE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", report(&err));
            ExitCode::from(FAILURE)
        }
    }
}

/// An error with its causes, outermost first, as `{:#}` prints them but without a cause whose
/// message the one before already ends with: our errors name their source in their message
/// too (so that a log line of the error alone is whole), and `{:#}` would repeat it.
fn report(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain().map(ToString::to_string) {
        if text.ends_with(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Validate {
            repo,
            rev,
            format,
            trusted_keys,
        } => {
            let repo = Repository::open(&repo)?;
            let (commit, validation) = validate_rev(&repo, &rev)?;
            let signature = trusted_keys
                .map(|dir| check_signature(&repo, &commit, &dir))
                .transpose()?;
            let text = match format {
                TextOrJson::Json => {
                    let mut json = output::validation_json(&commit, &validation);
                    if let (Some(object), Some((_, json_signature))) =
                        (json.as_object_mut(), &signature)
                    {
                        object.insert("signature".into(), json_signature.clone());
                    }
                    json_line(&json)?
                }
                TextOrJson::Text => {
                    let mut text = output::validation_text(&commit, &validation);
                    if let Some((verdict, json_signature)) = &signature {
                        let message = json_signature["message"].as_str().unwrap_or_default();
                        let lead = if verdict.is_trusted() {
                            "signed"
                        } else {
                            "untrusted"
                        };
                        text.push_str(&format!("{lead}: {message}\n"));
                    }
                    text
                }
            };
            print(&text)?;
            let trusted = signature.as_ref().is_none_or(|(v, _)| v.is_trusted());
            Ok(exit_for(validation.is_valid() && trusted))
        }
        Command::Test {
            repo,
            rev,
            topology,
            step,
            format,
            limits,
            no_commands,
        } => {
            let limits = StepTestLimits::try_from(limits)?;
            let repo = Repository::open(&repo)?;
            let (commit, validation) = validate_rev(&repo, &rev)?;
            let Some(topologies) = validation
                .topologies
                .as_deref()
                .filter(|_| validation.is_valid())
            else {
                eprint!("{}", output::validation_text(&commit, &validation));
                return Ok(ExitCode::from(INVALID));
            };
            let checkout = (!no_commands)
                .then(|| checkout_for_commands(&repo, &commit, topologies))
                .transpose()?;
            let commands = match &checkout {
                Some(dir) => Commands::From(dir.path()),
                None => Commands::Refused("not with `--no-commands`"),
            };
            let results = plumber::steptest::run(
                topologies,
                topology.as_deref(),
                step.as_deref(),
                &limits,
                commands,
            );
            let passed = plumber::steptest::all_passed(&results);
            let text = match format {
                TextOrJson::Json => json_line(&serde_json::json!({
                    "commit": commit,
                    "passed": passed,
                    "cases": results,
                }))?,
                TextOrJson::Text => plumber::steptest::text(&results),
            };
            print(&text)?;
            Ok(exit_for(passed))
        }
        Command::StepTestWorker { memory, case_time } => {
            let case_time = Duration::try_from_secs_f64(case_time)
                .map_err(|e| anyhow::anyhow!("--case-time: {e}"))?;
            plumber::steptest::serve_worker(memory, case_time)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Graph {
            repo,
            rev,
            topology,
            format,
        } => {
            let repo = Repository::open(&repo)?;
            let (commit, validation) = validate_rev(&repo, &rev)?;
            let Some(topologies) = &validation.topologies else {
                eprint!("{}", output::validation_text(&commit, &validation));
                return Ok(ExitCode::from(INVALID));
            };
            let selected: Vec<&Topology> = topologies
                .iter()
                .filter(|t| topology.as_ref().is_none_or(|name| &t.name == name))
                .collect();
            if let (Some(name), true) = (&topology, selected.is_empty()) {
                let known: Vec<&str> = topologies.iter().map(|t| t.name.as_str()).collect();
                anyhow::bail!(
                    "no topology `{name}` at {rev}; topologies: {}",
                    if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    }
                );
            }
            let text = match format {
                GraphFormat::Dot => output::graph::dot(&selected),
                GraphFormat::Mermaid => output::graph::mermaid(&selected),
                GraphFormat::Json => json_line(&output::graph::json(&commit, &selected))?,
            };
            print(&text)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plan {
            repo,
            from,
            to,
            base,
            head,
            format,
            keep_topics,
            preview,
            limits,
            sample,
            run_commands,
        } => {
            let limits = StepTestLimits::try_from(limits)?;
            let repo = Repository::open(&repo)?;
            let preview = preview.then(|| {
                plumber::plan::preview::slug_of_ref(head.as_deref().or(to.as_deref()).unwrap_or(""))
            });
            // One-off: validating each side whole is faster than the daemon's per-topology
            // tree cache, which pays off only across many plans (bench/results/refs.md).
            let (from, to) = match (base, head, to) {
                (Some(base), Some(head), _) => {
                    let base_commit = repo.resolve(&base)?;
                    let head_commit = repo.resolve(&head)?;
                    let merged = match refused(repo.merge_preview(base_commit, head_commit))? {
                        Ok(merged) => merged,
                        Err(validation) => {
                            eprint!(
                                "{}",
                                output::validation_text(&head_commit.to_string(), &validation)
                            );
                            return Ok(ExitCode::from(INVALID));
                        }
                    };
                    let files = match merged {
                        MergePreview::Merged(files) => files,
                        MergePreview::Conflicts(paths) => {
                            eprintln!(
                                "error: merging `{head}` into `{base}` conflicts in:\n{}\nresolve the conflicts on the branch, then plan again",
                                paths
                                    .iter()
                                    .map(|p| format!("  {p}"))
                                    .collect::<Vec<_>>()
                                    .join("\n")
                            );
                            return Ok(ExitCode::from(INVALID));
                        }
                    };
                    let to = (head_commit.to_string(), validate(&files));
                    (Some(validate_commit(&repo, base_commit)?), to)
                }
                (_, _, Some(to)) => {
                    let from = from.map(|rev| validate_rev(&repo, &rev)).transpose()?;
                    (from, validate_rev(&repo, &to)?)
                }
                _ => anyhow::bail!("give --to REV, or --base BRANCH with --head REF"),
            };
            // The commands of exec and http steps run from checkouts of each side's commit
            // (for a merge preview, the head's: the code the pull request proposes).
            let checkout_of = |side: Option<&(String, Validation)>| {
                side.filter(|_| run_commands)
                    .and_then(|(commit, v)| Some((commit, v.topologies.as_deref()?)))
                    .map(|(commit, topologies)| checkout_for_commands(&repo, commit, topologies))
                    .transpose()
            };
            let checkouts = (checkout_of(from.as_ref())?, checkout_of(Some(&to))?);
            // What is planned must pass its step tests, as the daemon requires.
            let mut to = to;
            plumber::steptest::check(&mut to.1, &limits, commands_of(checkouts.1.as_ref()));
            // Owners as of the side the change is reviewed against (for a pull request, its
            // base, as GitHub does: a branch cannot name its own reviewers).
            let reviewed_against = from.as_ref().map_or(&to.0, |(commit, _)| commit);
            let owners = repo.codeowners(git2::Oid::from_str(reviewed_against)?)?;
            plan_command(
                from,
                to,
                format,
                &PlanSettings {
                    keep_topics,
                    owners,
                    preview,
                    sample: sample.sampling()?,
                    limits,
                    checkouts,
                },
            )
        }
        Command::Up {
            repo,
            branch,
            bootstrap,
            state_dir,
            listen,
            listener,
            sample,
            step_tests,
            run_commands,
            poll_interval,
            keep_topics,
            stall_timeout,
            wedged_after,
            record_timeout,
            webhook_secret_file,
            secrets,
            kafka_credentials,
            assignor,
            trusted_keys,
            max_commit_files,
            max_commit_bytes,
            max_commit_steps,
            max_commit_topologies,
            max_checkout_bytes,
            allow_rollback,
            watch_refs,
            push_notes,
            forge,
            forge_url,
            forge_repo,
            forge_token_file,
            public_url,
            preview_label,
        } => {
            let branch = match branch {
                Some(branch) => branch,
                None => current_branch(&repo).unwrap_or_else(|| "main".into()),
            };
            let mut config = DaemonConfig::new(&repo, state_dir);
            config.branch = branch;
            config.bootstrap = bootstrap;
            config.listen = listen;
            config.listener = listener.into();
            config.step_tests = StepTestLimits::try_from(step_tests)?;
            config.run_commands = run_commands;
            config.data_diff = sample.map(|records| plumber::datadiff::SampleLimits {
                records,
                ..Default::default()
            });
            config.cutover.keep_topics = keep_topics;
            config.stalled_after = std::time::Duration::from_secs(stall_timeout.max(1));
            config.wedged_after = std::time::Duration::from_secs(wedged_after.max(1));
            config.record_timeout = std::time::Duration::from_secs(record_timeout);
            config.poll_interval = std::time::Duration::from_secs(poll_interval.max(1));
            config.webhook_secret = webhook_secret_file
                .map(|file| read_webhook_secret(&file))
                .transpose()?;
            config.kafka_credentials = kafka_credentials.clone();
            config.trusted_keys = trusted_keys;
            config.allow_rollback = allow_rollback;
            config.budget = Budget {
                files: max_commit_files,
                bytes: max_commit_bytes,
                steps: max_commit_steps,
                topologies: max_commit_topologies,
                checkout_bytes: max_checkout_bytes,
            };
            config.watch_refs = watch_refs;
            config.push_notes = push_notes;
            // clap makes --forge-repo and --forge-token-file required with --forge.
            if let (Some(kind), Some(repo), Some(token_file)) =
                (forge, forge_repo, forge_token_file)
            {
                let mut forge = plumber::forge::Config::new(kind, repo, token_file);
                forge.url = forge_url;
                config.forge = Some(forge);
            }
            config.public_url = public_url;
            config.preview_label = preview_label;
            config.step_secrets = step_secrets_of(secrets.as_deref())?;
            config.assignor = match assignor {
                AssignorChoice::Cooperative => plumber::runtime::Assignor::Cooperative,
                AssignorChoice::Eager => plumber::runtime::Assignor::Eager,
            };
            let local = plumber::runtime::local::LocalConfig {
                checkouts: plumber::store::checkouts_dir(&config.state_dir),
                secrets,
                kafka_credentials,
                ..plumber::runtime::local::LocalConfig::default()
            };
            up::run(config, local)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dev(command) => {
            dev::run(command)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            server,
            format,
            watch: false,
        } => ask::ask(&server, "/api/status", format, output::status::text),
        Command::Status {
            server,
            format,
            watch: true,
        } => ask::watch_status(&server, format),
        Command::History { server, format } => ask::ask(
            &server,
            "/api/history",
            format,
            output::status::history_text,
        ),
        Command::Daemon { config } => {
            cluster::run(&config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Crd => {
            print(&plumber::runtime::kube::crd::yaml()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Render {
            repo,
            rev,
            namespace,
            processor_image,
            repository,
            branch,
        } => {
            use plumber::runtime::kube::render;
            let opened = Repository::open(&repo)?;
            let (commit, validation) = validate_rev(&opened, &rev)?;
            let Some(topologies) = &validation.topologies else {
                eprint!("{}", output::validation_text(&commit, &validation));
                return Ok(ExitCode::from(INVALID));
            };
            let objects = render::revision(
                &commit,
                topologies,
                &validation.clusters,
                &render::Source {
                    repository: repository.unwrap_or(repo),
                    git_ref: branch,
                },
                &render::RenderConfig {
                    namespace,
                    processor_image,
                    pull_policy: None,
                    owner: None,
                },
            )?;
            let mut text = String::new();
            for object in &objects {
                text.push_str("---\n");
                text.push_str(&serde_saphyr::to_string(object).context("encoding YAML")?);
            }
            print(&text)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Asks a running daemon and prints its answer as JSON or rendered for a terminal.
/// The secret of `--webhook-secret-file`. An empty one is an error: it would sign nothing,
/// and a file left empty by mistake must not turn verification off.
/// The Secrets steps may reference under `plumber up`: the subdirectories of `--secrets DIR`
/// when it starts (none without it).
fn step_secrets_of(dir: Option<&std::path::Path>) -> Result<plumber::spec::StepSecrets> {
    let Some(dir) = dir else {
        return Ok(plumber::spec::StepSecrets::Only {
            names: Default::default(),
            origin: "give `plumber up --secrets DIR` with a directory per Secret".into(),
        });
    };
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the secrets directory {}", dir.display()))?;
    let mut names = std::collections::BTreeSet::new();
    for entry in entries {
        let entry = entry
            .with_context(|| format!("cannot read the secrets directory {}", dir.display()))?;
        if entry.file_type().is_ok_and(|t| t.is_dir())
            && let Some(name) = entry.file_name().to_str()
            && !name.starts_with('.')
        {
            names.insert(name.to_owned());
        }
    }
    Ok(plumber::spec::StepSecrets::Only {
        names,
        origin: format!(
            "the directories of `plumber up --secrets {}` at start; add one and restart",
            dir.display()
        ),
    })
}

pub(crate) fn read_webhook_secret(file: &std::path::Path) -> Result<String> {
    let secret = std::fs::read_to_string(file)
        .with_context(|| format!("reading the webhook secret from {}", file.display()))?;
    let secret = secret.trim_end();
    if secret.trim_start().is_empty() {
        anyhow::bail!(
            "the webhook secret file {} is empty; write the secret into it, or leave out \
             --webhook-secret-file to accept unsigned webhooks",
            file.display()
        );
    }
    Ok(secret.to_owned())
}

/// The verdict of `--trusted-keys DIR` on `commit`, and its JSON (the verdict's fields,
/// `trusted` and the `message` a person reads).
fn check_signature(
    repo: &Repository,
    commit: &str,
    dir: &std::path::Path,
) -> Result<(plumber::trust::Verdict, serde_json::Value)> {
    let keys = plumber::trust::TrustedKeys::load(dir)?;
    let verdict = keys.verify(repo.git(), git2::Oid::from_str(commit)?)?;
    let mut json = serde_json::to_value(&verdict).context("encoding JSON")?;
    if let Some(object) = json.as_object_mut() {
        object.insert("trusted".into(), verdict.is_trusted().into());
        object.insert("message".into(), verdict.describe(commit, dir).into());
    }
    Ok((verdict, json))
}

/// The branch a local repository has checked out.
fn current_branch(repo: &str) -> Option<String> {
    let repository = Repository::open(repo).ok()?;
    let head = repository.git().head().ok()?;
    head.shorthand()
        .filter(|_| head.is_branch())
        .map(str::to_owned)
}

/// What `plan` plans for, besides the two revisions.
/// The data diff of `plumber plan` ([`plumber::datadiff`]).
#[derive(clap::Args)]
struct SampleArgs {
    /// Run each replaced or added processor's old and new version on the N most recent
    /// records of what feeds it, and show how their outputs differ (needs --bootstrap).
    #[arg(long, value_name = "N")]
    sample: Option<usize>,
    /// The Kafka cluster the records are read from (never joined as a group member, nothing
    /// committed).
    #[arg(long, env = "PLUMBER_BOOTSTRAP")]
    bootstrap: Option<String>,
    /// Bytes of keys and values read at most per step.
    #[arg(long, value_name = "BYTES", default_value_t = plumber::datadiff::SampleLimits::default().bytes)]
    sample_bytes: u64,
    /// Seconds reading one step's sample may take.
    #[arg(long, value_name = "SECONDS", default_value_t = plumber::datadiff::SampleLimits::default().time.as_secs_f64())]
    sample_time: f64,
}

/// What running step tests may take (`plumber test`, `plumber plan`; the daemon's
/// configuration file has the same in `stepTests:`).
#[derive(clap::Args)]
struct TestLimitArgs {
    /// Seconds all the cases of the run may take together; the cases left then fail.
    #[arg(long, value_name = "SECONDS", default_value_t = StepTestLimits::default().time.as_secs_f64())]
    test_time: f64,
    /// Seconds one case may take; past it the case ends as a record the step gave up on
    /// (dead-lettered `timeout`).
    #[arg(long, value_name = "SECONDS", default_value_t = StepTestLimits::default().case_time.as_secs_f64())]
    case_time: f64,
    /// Bytes of heap the process running the cases may take; a case past it fails.
    #[arg(long, value_name = "BYTES", default_value_t = StepTestLimits::default().memory)]
    test_memory: u64,
}

impl TryFrom<TestLimitArgs> for StepTestLimits {
    type Error = anyhow::Error;

    fn try_from(args: TestLimitArgs) -> Result<StepTestLimits> {
        let seconds = |flag: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    anyhow::anyhow!("--{flag} takes a positive number of seconds, not {value}")
                })
        };
        Ok(StepTestLimits {
            time: seconds("test-time", args.test_time)?,
            case_time: seconds("case-time", args.case_time)?,
            memory: args.test_memory,
            program: None,
        })
    }
}

/// What the HTTP API's listener holds at most (`plumber up`; the daemon's configuration file
/// has the same in `listener:`).
#[derive(clap::Args)]
struct ListenerArgs {
    /// Connections the API holds at once; past it a connection is answered 503 (`/healthz`
    /// still answers) and closed.
    #[arg(long, value_name = "N",
          default_value_t = ListenerConfig::default().max_connections,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_connections: usize,
    /// Seconds a client has to send a request's head, from connecting or its previous
    /// answer (so also how long an idle kept-alive connection stays open), and a webhook's
    /// body.
    #[arg(long, value_name = "SECS",
          default_value_t = ListenerConfig::default().header_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout: u64,
    /// Seconds after which a connection on which nothing moved either way is closed (a
    /// client that stopped reading).
    #[arg(long, value_name = "SECS",
          default_value_t = ListenerConfig::default().idle_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86400))]
    idle_timeout: u64,
    /// Clients of GET /api/events (the web page, `plumber status --watch`) at once.
    #[arg(long, value_name = "N",
          default_value_t = ListenerConfig::default().max_event_streams,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    max_event_streams: usize,
    /// The largest body of POST /hooks/git, in bytes.
    #[arg(long, value_name = "BYTES",
          default_value_t = ListenerConfig::default().max_webhook_body,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_073_741_824))]
    max_webhook_body: usize,
    /// A name the API is reached by besides `localhost` and IP addresses (an SSH tunnel's,
    /// a proxy's); repeat for several. A loopback listener refuses other names (DNS
    /// rebinding); given, any listener does.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
}

impl From<ListenerArgs> for ListenerConfig {
    fn from(args: ListenerArgs) -> Self {
        ListenerConfig {
            max_connections: args.max_connections,
            header_timeout: std::time::Duration::from_secs(args.header_timeout),
            idle_timeout: std::time::Duration::from_secs(args.idle_timeout),
            max_event_streams: args.max_event_streams,
            max_webhook_body: args.max_webhook_body,
            allowed_hosts: args.allow_hosts,
        }
    }
}

struct PlanSettings {
    keep_topics: bool,
    owners: Option<plumber::owners::CodeOwners>,
    /// The slug of the preview environment to show (`--preview`).
    preview: Option<String>,
    /// Where the data diff reads its sample, and how much (`--sample`).
    sample: Option<(
        std::sync::Arc<dyn plumber::kafka::Admin>,
        plumber::datadiff::SampleLimits,
    )>,
    /// What the step tests, and the data diff's runs, may take.
    limits: StepTestLimits,
    /// Checkouts of the running and the planned commit for the commands of exec and http
    /// steps (`--run-commands`).
    checkouts: (Option<tempfile::TempDir>, Option<tempfile::TempDir>),
}

/// A checkout of what the exec and http steps of `topologies` run, at `commit`, removed when
/// dropped.
fn checkout_for_commands(
    repo: &Repository,
    commit: &str,
    topologies: &[Topology],
) -> Result<tempfile::TempDir> {
    Ok(plumber::steptest::checkout(
        repo,
        git2::Oid::from_str(commit)?,
        None,
        topologies,
        &std::env::temp_dir(),
    )?)
}

/// Whether commands run, from `checkout`, or why not.
fn commands_of(checkout: Option<&tempfile::TempDir>) -> Commands<'_> {
    match checkout {
        Some(dir) => Commands::From(dir.path()),
        None => Commands::Refused("`plumber plan` runs them with `--run-commands`"),
    }
}

impl SampleArgs {
    fn sampling(
        self,
    ) -> Result<
        Option<(
            std::sync::Arc<dyn plumber::kafka::Admin>,
            plumber::datadiff::SampleLimits,
        )>,
    > {
        let Some(records) = self.sample else {
            return Ok(None);
        };
        let Some(bootstrap) = self.bootstrap else {
            anyhow::bail!(
                "--sample reads records: give the cluster with --bootstrap HOST:PORT (or PLUMBER_BOOTSTRAP)"
            );
        };
        let time = Duration::try_from_secs_f64(self.sample_time)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| anyhow::anyhow!("--sample-time takes a positive number of seconds"))?;
        let kafka = plumber::kafka::KafkaAdmin::connect(&bootstrap)?;
        Ok(Some((
            std::sync::Arc::new(kafka),
            plumber::datadiff::SampleLimits {
                records,
                bytes: self.sample_bytes,
                time,
            },
        )))
    }
}

fn plan_command(
    from: Option<(String, Validation)>,
    to: (String, Validation),
    format: PlanFormat,
    settings: &PlanSettings,
) -> Result<ExitCode> {
    let mut errors: Vec<plumber::diagnostic::Diagnostic> = Vec::new();
    if let Some((commit, v)) = &from {
        errors.extend(v.errors().map(|d| {
            let mut d = d.clone();
            d.message = format!(
                "{} (in the --from revision {})",
                d.message,
                output::short_commit(commit)
            );
            d
        }));
    }
    errors.extend(to.1.errors().cloned());
    let from_graphs = from.as_ref().and_then(|(_, v)| v.topologies.as_deref());
    let to_graphs = to.1.topologies.as_deref();
    let planned = match (from.as_ref(), from_graphs, to_graphs) {
        (None, _, Some(new)) => Some(plan::plan(None, (&to.0, new))),
        (Some((commit, _)), Some(old), Some(new)) => {
            Some(plan::plan(Some((commit, old)), (&to.0, new)))
        }
        _ => None,
    };
    let planned = planned.map(|p| {
        let p = match &settings.owners {
            Some(owners) => p.with_owners(|file| owners.owners_of(file)),
            None => p,
        };
        if settings.keep_topics {
            p.keeping_topics()
        } else {
            p
        }
    });
    let from_commit = from.as_ref().map(|(c, _)| c.as_str());
    let diffs = match (&settings.sample, &planned) {
        (Some((kafka, sample)), Some(planned)) => Some(plumber::datadiff::diff(
            planned,
            plumber::datadiff::Side {
                graphs: from_graphs.unwrap_or_default(),
                commands: commands_of(settings.checkouts.0.as_ref()),
            },
            plumber::datadiff::Side {
                graphs: to_graphs.unwrap_or_default(),
                commands: commands_of(settings.checkouts.1.as_ref()),
            },
            &|_| Ok(kafka.clone()),
            sample,
            &settings.limits,
            &to.1.masked_fields,
        )),
        _ => None,
    };
    // What runs is taken to be --from (--base) as deployed, as the plan itself does.
    let previews = match (&settings.preview, to_graphs) {
        (Some(slug), Some(new)) => {
            let running: std::collections::BTreeMap<&str, plumber::plan::Deployment> = from_graphs
                .unwrap_or_default()
                .iter()
                .map(|t| (t.name.as_str(), plumber::plan::Deployment::of(t)))
                .collect();
            let previews = plumber::plan::preview::previews(
                new,
                |name| running.get(name),
                &to.1.clusters,
                slug,
            )?;
            Some((slug.as_str(), previews))
        }
        _ => None,
    };
    let text = match (format, &planned) {
        (PlanFormat::Json, _) => {
            let mut json = output::plan::json(from_commit, &to.0, planned.as_ref(), &errors);
            if let (Some(object), Some((slug, previews))) = (json.as_object_mut(), &previews) {
                object.insert("preview".into(), output::preview::json(previews, slug));
            }
            if let (Some(object), Some(diffs)) = (json.as_object_mut(), &diffs) {
                object.insert("dataDiff".into(), serde_json::to_value(diffs)?);
            }
            json_line(&json)?
        }
        (PlanFormat::Text, Some(p)) => {
            let mut text = output::plan::text(p);
            if let Some((slug, previews)) = &previews {
                text.push('\n');
                text.push_str(&output::preview::text(previews, slug));
            }
            if let Some(diffs) = &diffs {
                text.push_str(&plumber::datadiff::text(diffs));
            }
            text
        }
        (PlanFormat::Markdown, Some(p)) => {
            let mut text = output::plan::markdown(
                p,
                to_graphs.unwrap_or_default(),
                from_graphs.unwrap_or_default(),
            );
            if let Some((slug, previews)) = &previews {
                text.push('\n');
                text.push_str(&output::preview::markdown(previews, slug));
            }
            if let Some(diffs) = &diffs {
                text.push_str(&plumber::datadiff::markdown(diffs));
            }
            text
        }
        (_, None) => {
            let mut out = String::new();
            for error in &errors {
                out.push_str(&error.to_string());
                out.push('\n');
            }
            out.push_str(&format!(
                "invalid: {} error{}; nothing can be planned until they are fixed\n",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" }
            ));
            out
        }
    };
    // Warnings (a step test not run) go beside the plan, which stays what it is.
    if !matches!(format, PlanFormat::Json) {
        for warning in to.1.warnings() {
            eprintln!("{warning}");
        }
    }
    print(&text)?;
    Ok(exit_for(planned.is_some()))
}

fn validate_rev(repo: &Repository, rev: &str) -> Result<(String, Validation)> {
    let commit = repo.resolve(rev)?;
    validate_commit(repo, commit)
}

fn validate_commit(repo: &Repository, commit: git2::Oid) -> Result<(String, Validation)> {
    let validation = match refused(repo.snapshot(commit))? {
        Ok(snapshot) => validate(&snapshot.files),
        Err(validation) => validation,
    };
    Ok((commit.to_string(), validation))
}

/// A commit refused before its files were read (over budget, a name no file can have) is an
/// invalid commit, not an error of reading: `Ok(Err(validation))`.
fn refused<T>(read: plumber::repo::Result<T>) -> Result<Result<T, Validation>> {
    match read {
        Ok(value) => Ok(Ok(value)),
        Err(error) => match error.diagnostic() {
            Some(diagnostic) => Ok(Err(Validation::refused(diagnostic))),
            None => Err(error.into()),
        },
    }
}

fn exit_for(valid: bool) -> ExitCode {
    if valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(INVALID)
    }
}

fn json_line(value: &serde_json::Value) -> Result<String> {
    let mut text = serde_json::to_string_pretty(value).context("encoding JSON")?;
    text.push('\n');
    Ok(text)
}

/// Writes to stdout; a closed pipe (`plumber plan | head`) is not an error worth a message.
fn print(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the token file /x: {source}")]
    struct ReadToken {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_already_ends_with_is_not_repeated() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let error = anyhow::Error::new(ReadToken { source: missing }).context("starting the forge");
        assert_eq!(
            report(&error),
            "starting the forge: cannot read the token file /x: entity not found"
        );
        // A cause the message does not name is still shown.
        let bare = anyhow::Error::new(std::io::Error::other("disk full")).context("saving");
        assert_eq!(report(&bare), "saving: disk full");
    }
}
