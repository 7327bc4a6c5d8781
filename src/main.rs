//! The `plumber` command line (SPEC §5). Exit codes: 0 success, 1 invalid input (validation
//! errors, merge conflicts), 2 usage or I/O error.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use plumber::graph::Topology;
use plumber::repo::{MergePreview, Repository};
use plumber::{Validation, output, plan, validate};

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
    },
}

#[derive(Clone, Copy, ValueEnum)]
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
            eprintln!("error: {err:#}");
            ExitCode::from(FAILURE)
        }
    }
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Validate { repo, rev, format } => {
            let repo = Repository::open(&repo)?;
            let (commit, validation) = validate_rev(&repo, &rev)?;
            let text = match format {
                TextOrJson::Json => json_line(&output::validation_json(&commit, &validation))?,
                TextOrJson::Text => output::validation_text(&commit, &validation),
            };
            print(&text)?;
            Ok(exit_for(validation.is_valid()))
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
        } => {
            let repo = Repository::open(&repo)?;
            let (from, to) = match (base, head, to) {
                (Some(base), Some(head), _) => {
                    let base_commit = repo.resolve(&base)?;
                    let head_commit = repo.resolve(&head)?;
                    let files = match repo.merge_preview(base_commit, head_commit)? {
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
            plan_command(from, to, format)
        }
    }
}

fn plan_command(
    from: Option<(String, Validation)>,
    to: (String, Validation),
    format: PlanFormat,
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
    let from_commit = from.as_ref().map(|(c, _)| c.as_str());
    let text = match (format, &planned) {
        (PlanFormat::Json, _) => json_line(&output::plan::json(
            from_commit,
            &to.0,
            planned.as_ref(),
            &errors,
        ))?,
        (PlanFormat::Text, Some(p)) => output::plan::text(p),
        (PlanFormat::Markdown, Some(p)) => output::plan::markdown(
            p,
            to_graphs.unwrap_or_default(),
            from_graphs.unwrap_or_default(),
        ),
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
    print(&text)?;
    Ok(exit_for(planned.is_some()))
}

fn validate_rev(repo: &Repository, rev: &str) -> Result<(String, Validation)> {
    let commit = repo.resolve(rev)?;
    validate_commit(repo, commit)
}

fn validate_commit(repo: &Repository, commit: git2::Oid) -> Result<(String, Validation)> {
    let snapshot = repo.snapshot(commit)?;
    Ok((commit.to_string(), validate(&snapshot.files)))
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
