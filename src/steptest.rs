//! Step tests (`spec::step_test`): a commit's cases run with the processor's own transforms,
//! and their outputs or dead letter compared with what each case expects. `plumber test`
//! prints the results; `plumber plan` and the daemon ([`check`]) fold a failed case into the
//! commit's validation, so a commit whose tests fail is planned and applied as an invalid one.
//!
//! A case's program comes from whoever pushed the commit, so the cases run in a process of
//! their own (`plumber step-test-worker`), never in the daemon: one whose jq never ends is
//! killed with its process after [`Limits::case_time`], one that takes all memory fails
//! against the worker's address-space limit, and the whole run stops at [`Limits::time`].
//!
//! jq steps and `sql` steps run: a stateful one (GROUP BY) on a case's records in order from
//! empty state, a join with the case's records `from:` its table as the table's rows. exec and
//! http steps run through the processor's own exec and http transforms, from their directory
//! in a checkout of the commit ([`Commands`]) and with the environment a local processor gets;
//! without a checkout they are reported as not run, with why. Their worker has no memory
//! limit (a command's runtime, node or a JVM, reserves far more address space than it uses),
//! only the case's time; it and everything it started are killed as one process group.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use plumber_processor::record::{Input, Output};
use plumber_processor::stop::Stop;
use plumber_processor::transform::{self, Outcome};
use serde::{Deserialize, Serialize};

use crate::Validation;
use crate::diagnostic::{Code, Diagnostic};
use crate::graph::{StepKind, Topology};
use crate::spec::step_test::{Case, Expect, RecordValue, TestRecord};
use crate::spec::yaml::Pos;
use crate::spec::{EnvValue, Transform};

/// What running step tests may take. Each limit is the daemon's `stepTests` setting of the
/// same name, and a flag of `plumber test` and `plumber plan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// All the cases of one run together (a commit's, or those of the topologies it changed):
    /// the cases not finished by then fail the run.
    pub time: Duration,
    /// One case: past it the case fails as a record the processor gave up on (`timeout`).
    pub case_time: Duration,
    /// The heap the worker process may take (its address space is this, plus the processing
    /// thread's stack reservation and the program itself); a case past it fails.
    pub memory: u64,
    /// The `plumber` executable that runs the cases; `None`: the running one.
    pub program: Option<PathBuf>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            time: Duration::from_secs(60),
            case_time: Duration::from_secs(10),
            memory: 256 << 20,
            program: None,
        }
    }
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseResult {
    pub topology: String,
    pub step: String,
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub name: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "result")]
pub enum Verdict {
    Passed,
    /// What was expected and what came, each as lines a reviewer reads side by side.
    Failed {
        expected: Vec<String>,
        actual: Vec<String>,
    },
    /// A case of a step `plumber test` cannot run yet (exec, http).
    NotRun {
        why: String,
    },
    /// The run's time ran out before the case ran: it fails the run.
    Unfinished {
        why: String,
    },
}

/// What a record became.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Actual {
    Outputs(Vec<Produced>),
    DeadLetter { kind: String, message: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Produced {
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Vec<u8>,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
}

/// One case as the worker runs it: the step's transform and its input records, in order.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Job {
    transform: Transform,
    /// The step's own `env` values (a secret reference is not resolved in a test).
    env: Vec<(String, String)>,
    /// Its input steps, in name order; each read from a topic of its own name.
    inputs: Vec<String>,
    records: Vec<JobRecord>,
    /// Whether the job goes on from the state (or table) the job before it left, when that
    /// one ran the same step, rather than from empty: a data diff runs a stateful step's
    /// sample record by record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    carry_state: bool,
    /// Where a step that runs a command runs it: its worker is started there (the worker
    /// itself never reads it).
    #[serde(skip)]
    sandbox: Option<Sandbox>,
}

/// Where and with what environment a worker runs the command of an exec or http step: its
/// directory in a checkout of the commit, and what a local processor gets (the allowed
/// variables of ours, then the step's own `env:` values).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sandbox {
    dir: PathBuf,
    env: Vec<(String, String)>,
}

/// Whether steps that run a command (exec, http) run in tests and data diffs, and from where:
/// the root of a checkout of the commit holding those steps' directories ([`checkout`]). Jq
/// and sql steps always run.
#[derive(Debug, Clone, Copy)]
pub enum Commands<'a> {
    /// Not run, for the reason given (which says how to turn them on): the case is reported
    /// as not run, and why.
    Refused(&'a str),
    /// Run from this checkout.
    From(&'a Path),
}

/// A checkout, in a new directory under `parent` removed when dropped, of what the exec and
/// http steps of `topologies` run: their directories at `commit`, or in `tree` (a merge of
/// `commit` that no commit has) when given.
pub fn checkout(
    repository: &crate::repo::Repository,
    commit: git2::Oid,
    tree: Option<git2::Oid>,
    topologies: &[Topology],
    parent: &Path,
) -> crate::repo::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("plumber-checkout-")
        .tempdir_in(parent)
        .map_err(|source| crate::repo::Error::Checkout {
            path: parent.to_path_buf(),
            source,
        })?;
    let dirs = crate::graph::checkout_dirs(topologies);
    match tree {
        Some(tree) => repository.checkout_tree(tree, commit, &dirs, dir.path())?,
        None => repository.checkout(commit, &dirs, dir.path())?,
    }
    Ok(dir)
}

/// An input record of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JobRecord {
    /// The input step it comes from.
    pub(crate) from: String,
    pub(crate) key: Option<String>,
    pub(crate) value: Vec<u8>,
    pub(crate) headers: Vec<(String, String)>,
    /// Its Kafka timestamp, ms.
    pub(crate) timestamp: Option<i64>,
}

/// What the worker answers for a job: what the record became, or why it could not run.
pub(crate) type Answer = Result<Actual, String>;

/// Runs the tests of `topologies`, those of `topology` and `step` only when given.
pub fn run(
    topologies: &[Topology],
    topology: Option<&str>,
    step: Option<&str>,
    limits: &Limits,
    commands: Commands<'_>,
) -> Vec<CaseResult> {
    let mut results = Vec::new();
    let mut jobs = Vec::new();
    let mut expects: Vec<(usize, &Expect)> = Vec::new();
    for graph in topologies
        .iter()
        .filter(|t| topology.is_none_or(|name| t.name == name))
    {
        for tests in graph
            .tests
            .iter()
            .filter(|t| step.is_none_or(|name| t.step == name))
        {
            for case in &tests.cases {
                let verdict = match job(graph, &tests.step, case, commands) {
                    Ok(job) => {
                        expects.push((results.len(), &case.expect));
                        jobs.push(job);
                        // Replaced by the job's result.
                        Verdict::Passed
                    }
                    Err(verdict) => verdict,
                };
                results.push(CaseResult {
                    topology: graph.name.clone(),
                    step: tests.step.clone(),
                    file: tests.file.clone(),
                    line: case.pos.line,
                    column: case.pos.column,
                    name: case.name.clone(),
                    verdict,
                });
            }
        }
    }
    for ((index, expect), ran) in expects.into_iter().zip(execute(&jobs, limits)) {
        results[index].verdict = match ran {
            Ran::Answered(Ok(actual)) => compare(expect, &actual),
            Ran::Answered(Err(why)) => Verdict::Failed {
                expected: expected_lines(expect),
                actual: vec![format!("the step could not take the record: {why}")],
            },
            Ran::TimedOut => compare(
                expect,
                &Actual::DeadLetter {
                    kind: transform::TIMEOUT.into(),
                    message: format!(
                        "the case did not finish within {} s",
                        limits.case_time.as_secs_f64()
                    ),
                },
            ),
            Ran::Died(why) => Verdict::Failed {
                expected: expected_lines(expect),
                actual: vec![format!("the process running the case died: {why}")],
            },
            Ran::Unfinished(why) => Verdict::Unfinished { why },
        };
    }
    results
}

/// Runs the step tests of a valid commit's graphs and folds what failed into `validation`:
/// each failed or unfinished case an error at its test file's line (the graphs go, as for
/// any invalid commit), each case not run a warning. Returns the results.
pub fn check(
    validation: &mut Validation,
    limits: &Limits,
    commands: Commands<'_>,
) -> Vec<CaseResult> {
    check_each(std::slice::from_mut(validation), limits, commands).0
}

/// [`check`] for the validations of several topologies, all their cases in one run (one
/// worker, one time limit). Returns the results and, for each validation, whether every
/// case of it finished (one the run's time cut short says nothing of its step).
pub fn check_each(
    validations: &mut [Validation],
    limits: &Limits,
    commands: Commands<'_>,
) -> (Vec<CaseResult>, Vec<bool>) {
    let graphs: Vec<Topology> = validations
        .iter()
        .filter_map(|v| v.topologies.as_ref())
        .flatten()
        .filter(|g| !g.tests.is_empty())
        .cloned()
        .collect();
    if graphs.is_empty() {
        return (Vec::new(), vec![true; validations.len()]);
    }
    let results = run(&graphs, None, None, limits, commands);
    let finished = validations
        .iter_mut()
        .map(|validation| {
            let names: Vec<String> = validation
                .topologies
                .iter()
                .flatten()
                .map(|g| g.name.clone())
                .collect();
            fold(
                validation,
                results.iter().filter(|r| names.contains(&r.topology)),
            )
        })
        .collect();
    (results, finished)
}

/// The cases of the steps of `validation` that run a command (exec, http), run from
/// `checkout`: those a validation that refused [`Commands`] reports as not run. Folded in
/// with [`fold_commands`].
pub fn run_commands(validation: &Validation, limits: &Limits, checkout: &Path) -> Vec<CaseResult> {
    let graphs: Vec<Topology> = validation
        .topologies
        .iter()
        .flatten()
        .filter_map(|graph| {
            let mut graph = graph.clone();
            let runs_command = |step: &str| {
                graph
                    .find(step)
                    .is_some_and(|id| graph.step(id).checkout_dir().is_some())
            };
            let tests: Vec<_> = graph
                .tests
                .iter()
                .filter(|t| runs_command(&t.step))
                .cloned()
                .collect();
            graph.tests = tests;
            (!graph.tests.is_empty()).then_some(graph)
        })
        .collect();
    if graphs.is_empty() {
        return Vec::new();
    }
    run(&graphs, None, None, limits, Commands::From(checkout))
}

/// Folds the results of [`run_commands`] into `validation`: each replaces the warning that
/// said its case was not run. Whether all of them finished.
pub fn fold_commands(validation: &mut Validation, results: &[CaseResult]) -> bool {
    validation.diagnostics.retain(|d| {
        d.code != Code::TestNotRun
            || !results
                .iter()
                .any(|r| r.file == d.file && d.line == Some(r.line))
    });
    fold(validation, results.iter())
}

/// Folds `results` into `validation`; whether all of them finished.
fn fold<'r>(validation: &mut Validation, results: impl Iterator<Item = &'r CaseResult>) -> bool {
    let mut failed = false;
    let mut finished = true;
    for result in results {
        let pos = Some(Pos {
            line: result.line,
            column: result.column,
        });
        let case = format!("step test `{}` of `{}`", result.name, result.step);
        let diagnostic = match &result.verdict {
            Verdict::Passed => continue,
            Verdict::Failed { expected, actual } => Diagnostic::error(
                Code::TestFailed,
                &result.file,
                pos,
                format!(
                    "{case} failed: expected {}; got {} (run `plumber test --step {}` to see it)",
                    expected.join(", "),
                    actual.join(", "),
                    result.step
                ),
            ),
            Verdict::Unfinished { why } => {
                finished = false;
                Diagnostic::error(
                    Code::TestFailed,
                    &result.file,
                    pos,
                    format!("{case} did not run: {why}"),
                )
            }
            Verdict::NotRun { why } => Diagnostic::warning(
                Code::TestNotRun,
                &result.file,
                pos,
                format!("{case} is not run: {why}"),
            ),
        };
        failed |= diagnostic.is_error();
        validation.diagnostics.push(diagnostic);
    }
    crate::diagnostic::normalize(&mut validation.diagnostics);
    if failed {
        validation.topologies = None;
    }
    finished
}

/// The case as a job for the worker, or its verdict when it cannot be one.
fn job(graph: &Topology, step: &str, case: &Case, commands: Commands<'_>) -> Result<Job, Verdict> {
    let id = graph.find(step).ok_or_else(|| Verdict::NotRun {
        why: format!("the topology has no step `{step}`"),
    })?;
    let template = Job::of_step(graph, id, commands).map_err(|why| Verdict::NotRun { why })?;
    let mut records = Vec::with_capacity(case.inputs.len());
    for record in &case.inputs {
        let from = record
            .from
            .clone()
            .or_else(|| template.inputs.first().cloned())
            .unwrap_or_default();
        if !template.inputs.contains(&from) {
            return Err(Verdict::Failed {
                expected: vec![format!(
                    "an input from one of the step's inputs: {}",
                    template.inputs.join(", ")
                )],
                actual: vec![format!("`from: {from}`")],
            });
        }
        records.push(JobRecord {
            from,
            key: record.key.clone(),
            value: record.value.bytes(),
            headers: record.headers.clone().unwrap_or_default(),
            timestamp: record.timestamp,
        });
    }
    Ok(template.with_records(records))
}

impl Job {
    /// A job of processor `id` without its records yet; why not when the step is not one a
    /// worker runs (a command, where `commands` does not allow it).
    pub(crate) fn of_step(
        graph: &Topology,
        id: crate::graph::StepId,
        commands: Commands<'_>,
    ) -> Result<Job, String> {
        let step = graph.step(id);
        let StepKind::Processor { transform, env, .. } = &step.kind else {
            return Err(format!("`{}` is no processor", step.name));
        };
        let env: Vec<(String, String)> = env
            .iter()
            .filter_map(|(name, value)| match value {
                EnvValue::Value(value) => Some((name.clone(), value.clone())),
                EnvValue::Secret { .. } => None,
            })
            .collect();
        let sandbox = match (transform, step.checkout_dir()) {
            (Transform::Jq { .. } | Transform::Sql { .. }, _) => None,
            (Transform::Http { command: None, .. }, _) => {
                return Err(
                    "an http step without `command:` runs only as its image's sidecar in Kubernetes: give it a `command:` to start its server locally"
                        .into(),
                );
            }
            (_, Some(dir)) => match commands {
                Commands::From(checkout) => Some(Sandbox {
                    dir: checkout.join(dir),
                    env: crate::runtime::local::inherited_env()
                        .filter_map(|(name, value)| {
                            Some((name.to_owned(), value.into_string().ok()?))
                        })
                        .chain(env.iter().cloned())
                        .collect(),
                }),
                Commands::Refused(why) => {
                    return Err(format!(
                        "an {} step runs a command of the commit: {why}",
                        transform.kind(),
                    ));
                }
            },
            (_, None) => return Err("the step runs from no directory".into()),
        };
        Ok(Job {
            transform: transform.clone(),
            env,
            sandbox,
            carry_state: false,
            inputs: {
                let mut inputs: Vec<String> = graph
                    .inputs(id)
                    .into_iter()
                    .map(|i| graph.step(i).name.clone())
                    .collect();
                // A join's records come from its stream unless they say `from:` its table.
                if let Transform::Sql {
                    table: Some(table), ..
                } = transform
                {
                    inputs.sort_by_key(|name| name == &table.step);
                }
                inputs
            },
            records: Vec::new(),
        })
    }

    /// Whether the step keeps state between records (`GROUP BY`, or a join's table): its
    /// records are one case.
    pub(crate) fn stateful(&self) -> bool {
        matches!(
            self.transform,
            Transform::Sql { state: Some(_), .. } | Transform::Sql { table: Some(_), .. }
        )
    }

    /// The input step a join reads as its table.
    pub(crate) fn table_step(&self) -> Option<&str> {
        match &self.transform {
            Transform::Sql {
                table: Some(table), ..
            } => Some(&table.step),
            _ => None,
        }
    }

    /// This job, going on from the state the job before it left ([`Job::stateful`] steps).
    pub(crate) fn carrying_state(mut self) -> Job {
        self.carry_state = true;
        self
    }

    /// Whether `other` runs the same step (transform, env and inputs).
    fn same_step(&self, other: &Job) -> bool {
        self.transform == other.transform && self.env == other.env && self.inputs == other.inputs
    }

    /// This job's step on `records`.
    pub(crate) fn with_records(&self, records: Vec<JobRecord>) -> Job {
        Job {
            transform: self.transform.clone(),
            env: self.env.clone(),
            inputs: self.inputs.clone(),
            records,
            sandbox: self.sandbox.clone(),
            carry_state: false,
        }
    }
}

/// How a job went.
#[derive(Debug)]
pub(crate) enum Ran {
    Answered(Answer),
    /// Past [`Limits::case_time`]: its worker was killed.
    TimedOut,
    /// Its worker died while it ran (out of memory, its stack overflowed).
    Died(String),
    /// The run's time ran out first.
    Unfinished(String),
}

/// How long past a case's time its worker is given to answer that it gave up itself.
const KILL_GRACE: Duration = Duration::from_secs(1);

/// The most one answer may take on the worker's output: a case whose outputs are larger
/// fails instead.
const MAX_ANSWER_BYTES: u64 = 4 << 20;

/// Runs `jobs` in worker processes, in order, one answer each: a worker is started, given
/// the jobs not done yet, and replaced when a job kills it or outlasts its time.
pub(crate) fn execute(jobs: &[Job], limits: &Limits) -> Vec<Ran> {
    let started = Instant::now();
    // Each job's line, made once: a worker that dies or is killed hands the rest to the next.
    let lines: Vec<Vec<u8>> = jobs
        .iter()
        .map(|job| {
            // A job is plain data: it always serializes.
            let mut line = serde_json::to_vec(job).unwrap_or_default();
            line.push(b'\n');
            line
        })
        .collect();
    let mut ran: Vec<Ran> = Vec::with_capacity(jobs.len());
    while ran.len() < jobs.len() {
        let left = limits.time.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        // A worker runs the jobs that need the same place to run in (a command's directory
        // and environment), so it is given only those.
        let first = ran.len();
        let sandbox = jobs[first].sandbox.as_ref();
        let end = first
            + jobs[first..]
                .iter()
                .take_while(|job| job.sandbox.as_ref() == sandbox)
                .count();
        if let Some(missing) = sandbox.filter(|s| !s.dir.is_dir()) {
            let why = format!(
                "its directory {} is not in the checkout",
                missing.dir.display()
            );
            while ran.len() < end {
                ran.push(Ran::Answered(Err(why.clone())));
            }
            continue;
        }
        let mut worker = match Worker::start(&lines[first..end], limits, sandbox) {
            Ok(worker) => worker,
            Err(why) => {
                while ran.len() < jobs.len() {
                    ran.push(Ran::Unfinished(why.clone()));
                }
                return ran;
            }
        };
        while ran.len() < end {
            let left = limits.time.saturating_sub(started.elapsed());
            match worker
                .answers
                .recv_timeout((limits.case_time + KILL_GRACE).min(left))
            {
                Ok(Ok(line)) => ran.push(match serde_json::from_str::<Answer>(&line) {
                    Ok(answer) => Ran::Answered(answer),
                    Err(error) => Ran::Died(format!("it answered what is no answer: {error}")),
                }),
                Ok(Err(why)) => {
                    ran.push(Ran::Died(why));
                    break;
                }
                Err(RecvTimeoutError::Timeout) if left <= limits.case_time + KILL_GRACE => break,
                Err(RecvTimeoutError::Timeout) => {
                    ran.push(Ran::TimedOut);
                    break;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    ran.push(Ran::Died(worker.exit()));
                    break;
                }
            }
        }
        worker.kill();
    }
    let why = format!(
        "the step tests' time ({} s; `stepTests.time` of the daemon, `--test-time` of the command) ran out before it",
        limits.time.as_secs_f64()
    );
    while ran.len() < jobs.len() {
        ran.push(Ran::Unfinished(why.clone()));
    }
    ran
}

/// A `plumber step-test-worker` process and its answers, line by line.
struct Worker {
    child: Child,
    /// Each answer's line; `Err` when one was too large or unreadable (the worker is killed).
    answers: mpsc::Receiver<Result<String, String>>,
}

impl Worker {
    fn start(
        lines: &[Vec<u8>],
        limits: &Limits,
        sandbox: Option<&Sandbox>,
    ) -> Result<Worker, String> {
        let program = match &limits.program {
            Some(program) => program.clone(),
            None => std::env::current_exe()
                .map_err(|e| format!("cannot find the plumber executable to run it: {e}"))?,
        };
        let mut command = Command::new(&program);
        command
            .arg("step-test-worker")
            .arg("--memory")
            // A command's runtime is not held to an address-space limit (see the module).
            .arg(if sandbox.is_some() { 0 } else { limits.memory }.to_string())
            .arg("--case-time")
            .arg(limits.case_time.as_secs_f64().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env_clear()
            // Its own process group: killing it kills the commands it started too.
            .process_group(0);
        if let Some(sandbox) = sandbox {
            command.current_dir(&sandbox.dir).envs(sandbox.env.clone());
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start `{} step-test-worker`: {e}", program.display()))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the worker process has no pipes".into());
        };
        let input = lines.concat();
        // Written beside the reading: a worker that stops reading must not block us.
        std::thread::Builder::new()
            .name("step-test-input".into())
            .spawn(move || {
                let _ = stdin.write_all(&input);
            })
            .map_err(|e| format!("no thread to feed the worker: {e}"))?;
        let (sender, answers) = mpsc::channel();
        std::thread::Builder::new()
            .name("step-test-answers".into())
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                loop {
                    let mut line = String::new();
                    match (&mut reader).take(MAX_ANSWER_BYTES).read_line(&mut line) {
                        Ok(0) => return,
                        Ok(_) if !line.ends_with('\n') => {
                            let _ = sender.send(Err(format!(
                                "its outputs took more than {} MiB",
                                MAX_ANSWER_BYTES >> 20
                            )));
                            return;
                        }
                        Ok(_) => {
                            if sender.send(Ok(line)).is_err() {
                                return;
                            }
                        }
                        Err(error) => {
                            let _ = sender.send(Err(format!("its answer is unreadable: {error}")));
                            return;
                        }
                    }
                }
            })
            .map_err(|e| format!("no thread to read the worker: {e}"))?;
        Ok(Worker { child, answers })
    }

    /// How the worker ended, once its output closed.
    fn exit(&mut self) -> String {
        match self.child.wait() {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt as _;
                match status.signal() {
                    Some(signal) => format!(
                        "killed by signal {signal} (its stack or its memory limit, `stepTests.memory`, ran out)"
                    ),
                    None => format!(
                        "it exited ({status}): its memory limit (`stepTests.memory`) may have run out"
                    ),
                }
            }
            Err(error) => format!("it cannot be waited for: {error}"),
        }
    }

    /// Kills the worker and whatever it started (an exec child, an http server).
    fn kill(mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `plumber step-test-worker`: reads jobs from stdin, one JSON line each, and answers each
/// on stdout, in order. Its address space is limited first: `memory` for the cases, plus the
/// processing thread's stack reservation and room for the program.
pub fn serve_worker(memory: u64, case_time: Duration) -> std::io::Result<()> {
    const PROGRAM_ROOM: u64 = 256 << 20;
    let limit = memory
        .saturating_add(plumber_processor::pipeline::LOOP_STACK as u64)
        .saturating_add(PROGRAM_ROOM);
    // Its own process group keeps a Ctrl-C meant for its parent from it, so it goes when
    // its parent does (a jq program that never ends would spin on).
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(std::io::Error::from)?;
    if nix::unistd::getppid() == nix::unistd::Pid::from_raw(1) {
        return Err(std::io::Error::other("its parent is gone"));
    }
    // 0: a command's worker, held to its time only.
    if memory > 0 {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_AS, limit, limit)
            .map_err(std::io::Error::from)?;
    }
    // The processor's processing thread's stack: a case means what the step does.
    let worker = std::thread::Builder::new()
        .name("step-test-worker".into())
        .stack_size(plumber_processor::pipeline::LOOP_STACK)
        .spawn(move || -> std::io::Result<()> {
            let stdin = std::io::stdin().lock();
            let mut stdout = std::io::stdout().lock();
            // The last step compiled, kept while the jobs are of the same step (a data diff
            // runs one version on many records). A stateful step starts each job from empty
            // state, so it is compiled again for each, unless the job carries the state on.
            let mut compiled: Option<(Job, Compiled)> = None;
            for line in stdin.lines() {
                let answer: Answer = match serde_json::from_str::<Job>(&line?) {
                    Ok(job) => {
                        let same = compiled.as_ref().is_some_and(|(of, _)| {
                            of.same_step(&job) && (!job.stateful() || job.carry_state)
                        });
                        if !same {
                            compiled = match compile(&job, case_time) {
                                Ok(step) => Some((job.with_records(Vec::new()), step)),
                                Err(why) => {
                                    write_answer(&mut stdout, &Err(why))?;
                                    continue;
                                }
                            };
                        }
                        match compiled.as_mut() {
                            Some((_, step)) => run_job(step, &job, case_time),
                            None => Err("nothing compiled".into()),
                        }
                    }
                    Err(error) => Err(format!("an unreadable job: {error}")),
                };
                write_answer(&mut stdout, &answer)?;
            }
            Ok(())
        })?;
    worker
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the worker thread panicked")))
}

fn write_answer(out: &mut impl std::io::Write, answer: &Answer) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, answer)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// A step as the worker runs it.
enum Compiled {
    /// The processor's transform of a step that takes each record alone, and the server an
    /// http step calls, started for it.
    Transform {
        step: Box<dyn transform::Transform>,
        /// Held for its life: dropping it stops the server.
        _server: Option<Server>,
    },
    /// A join and its table, filled by the case's records `from:` the table's step.
    Join {
        join: Box<plumber_sql::Join>,
        table: plumber_sql::Table,
        table_step: String,
    },
    /// A `GROUP BY` query and the state of the one partition a case's records are on.
    Stateful {
        query: Box<plumber_sql::Aggregation>,
        state: plumber_sql::PartitionState,
        max_groups: usize,
    },
}

/// An http step's server, started by the worker as `plumber up` starts it; killed with the
/// step (the worker's parent kills its whole process group besides).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Starts `command` with `PORT` set to a free port, in the worker's directory and
    /// environment (the step's), and waits until the port takes connections.
    fn start(command: &[String], within: Duration) -> Result<(Server, u16), String> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| "the http step's `command:` is empty".to_owned())?;
        let port = crate::runtime::local::free_port()
            .map_err(|e| format!("no free port for its server: {e}"))?;
        let child = Command::new(program)
            .args(args)
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run its server `{program}`: {e}"))?;
        let mut server = Server(child);
        let deadline = Instant::now() + within;
        let address = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
        loop {
            if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return Ok((server, port));
            }
            if let Ok(Some(status)) = server.0.try_wait() {
                return Err(format!(
                    "its server `{}` exited ({status}) before it listened on $PORT",
                    command.join(" ")
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "its server `{}` did not listen on $PORT ({port}) within {} s",
                    command.join(" "),
                    within.as_secs_f64()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// How the worker's exec and http transforms try a record: as the processor does by default
/// (its `--attempts`, and `--transform-timeout` per call), within the case's time.
fn retries(case_time: Duration) -> transform::Retries {
    use plumber_processor::config::{DEFAULT_ATTEMPTS, DEFAULT_TRANSFORM_TIMEOUT};
    transform::Retries {
        call_timeout: case_time.min(Duration::from_secs(DEFAULT_TRANSFORM_TIMEOUT)),
        attempts: DEFAULT_ATTEMPTS,
        budget: case_time,
    }
}

fn compile(job: &Job, case_time: Duration) -> Result<Compiled, String> {
    Ok(match &job.transform {
        Transform::Jq { program } => Compiled::Transform {
            step: Box::new(
                transform::jq::Jq::compile_with_env(program, job.env.clone())
                    .map_err(|e| e.to_string())?,
            ),
            _server: None,
        },
        Transform::Exec { command, .. } => Compiled::Transform {
            step: Box::new(
                transform::exec::Exec::new(
                    command.clone(),
                    retries(case_time),
                    plumber_processor::metrics::Metrics::new(),
                )
                .map_err(|e| e.to_string())?,
            ),
            _server: None,
        },
        Transform::Http {
            command: Some(command),
            path,
            ..
        } => {
            let (server, port) = Server::start(command, case_time)?;
            Compiled::Transform {
                step: Box::new(
                    transform::http::Http::new(
                        format!("http://127.0.0.1:{port}{path}"),
                        retries(case_time),
                        plumber_processor::metrics::Metrics::new(),
                    )
                    .map_err(|e| e.to_string())?,
                ),
                _server: Some(server),
            }
        }
        Transform::Sql {
            query,
            table: Some(table),
            ..
        } => match plumber_sql::compile_any(query, None, true) {
            Ok(plumber_sql::Compiled::Join(join)) => Compiled::Join {
                join,
                table: plumber_sql::Table::default(),
                table_step: table.step.clone(),
            },
            Ok(_) => return Err("the query joins no table".into()),
            Err(problems) => return Err(plumber_sql::Problem::all(&problems)),
        },
        Transform::Sql {
            query,
            state: Some(state),
            ..
        } => {
            let aggregation = match plumber_sql::compile_any(query, None, true) {
                Ok(plumber_sql::Compiled::Stateful(aggregation)) => aggregation,
                Ok(_) => return Err("the query keeps no state".into()),
                Err(problems) => return Err(plumber_sql::Problem::all(&problems)),
            };
            let emit = match state.emit {
                crate::spec::Emit::Close => plumber_sql::Emit::Close,
                crate::spec::Emit::Update => plumber_sql::Emit::Update,
            };
            Compiled::Stateful {
                query: Box::new(
                    aggregation
                        .with_grace(i64::try_from(state.grace_ms).unwrap_or(i64::MAX))
                        .with_emit(emit),
                ),
                state: plumber_sql::PartitionState::default(),
                max_groups: state
                    .max_groups
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(plumber_processor::config::DEFAULT_STATE_MAX_GROUPS),
            }
        }
        Transform::Sql { query, .. } => {
            let topics = job.inputs.clone();
            let inputs: Vec<(String, String)> = if topics.len() > 1 {
                topics.iter().map(|t| (t.clone(), t.clone())).collect()
            } else {
                Vec::new()
            };
            Compiled::Transform {
                step: Box::new(
                    transform::sql::Sql::compile(query, &inputs, &topics)
                        .map_err(|e| e.to_string())?,
                ),
                _server: None,
            }
        }
        Transform::Http { command: None, .. } => {
            return Err("an http step without `command:` has no server to start here".into());
        }
    })
}

/// A job's records through the step, in order: every output, or the first dead letter.
fn run_job(step: &mut Compiled, job: &Job, case_time: Duration) -> Answer {
    let deadline = Instant::now() + case_time;
    let mut outputs = Vec::new();
    for (offset, record) in job.records.iter().enumerate() {
        let headers: Vec<(String, Vec<u8>)> = record
            .headers
            .iter()
            .map(|(n, v)| (n.clone(), v.clone().into_bytes()))
            .collect();
        let input = Input {
            topic: &record.from,
            partition: 0,
            offset: i64::try_from(offset).unwrap_or(i64::MAX),
            timestamp: record.timestamp,
            key: record.key.as_deref().map(str::as_bytes),
            value: Some(&record.value),
            headers: headers
                .iter()
                .map(|(n, v)| (n.as_str(), Some(v.as_slice())))
                .collect(),
        };
        let actual = match step {
            Compiled::Transform { step, .. } => apply(step.as_mut(), &input, &headers, deadline)?,
            Compiled::Join {
                join,
                table,
                table_step,
            } => {
                if record.from == *table_step {
                    // As in the processor, a table record that is no row is skipped.
                    let _ = join.update_table(table, input.key, input.value);
                    continue;
                }
                joined(join, table, &input, &headers)
            }
            Compiled::Stateful {
                query,
                state,
                max_groups,
            } => feed(query, state, *max_groups, &input),
        };
        match actual {
            Actual::Outputs(more) => outputs.extend(more),
            dead @ Actual::DeadLetter { .. } => return Ok(dead),
        }
    }
    Ok(Actual::Outputs(outputs))
}

/// A stream record joined to the table as it stands, as the processor joins it
/// (`processor/src/transform/sql.rs`, `Joined`): each output keeps the record's key and
/// headers.
fn joined(
    join: &plumber_sql::Join,
    table: &plumber_sql::Table,
    input: &Input<'_>,
    headers: &[(String, Vec<u8>)],
) -> Actual {
    let record = plumber_sql::Record {
        value: input.value,
        key: input.key,
        headers: &input.headers,
    };
    match join.feed(table, &record) {
        Ok(values) => Actual::Outputs(
            values
                .into_iter()
                .map(|value| Produced {
                    key: input.key.map(<[u8]>::to_vec),
                    value,
                    headers: headers.to_vec(),
                })
                .collect(),
        ),
        Err(error) => Actual::DeadLetter {
            kind: error.kind.to_owned(),
            message: error.message,
        },
    }
}

/// One record into a `GROUP BY` query's state, as the processor feeds it
/// (`processor/src/transform/sql.rs`, `Aggregate`): what it emits.
fn feed(
    query: &plumber_sql::Aggregation,
    state: &mut plumber_sql::PartitionState,
    max_groups: usize,
    input: &Input<'_>,
) -> Actual {
    let Some(timestamp) = input.timestamp else {
        return Actual::DeadLetter {
            kind: "sql-error".into(),
            message: "the record has no timestamp; a stateful step keeps time by its records' \
                      timestamps (give each input a `timestamp:`)"
                .into(),
        };
    };
    let record = plumber_sql::Record {
        value: input.value,
        key: input.key,
        headers: &input.headers,
    };
    match query.feed_within(state, &record, timestamp, max_groups) {
        Ok(emitted) => {
            let mut outputs = Vec::with_capacity(emitted.len());
            for output in emitted {
                match output.value {
                    Ok(value) => outputs.push(Produced {
                        key: output.key,
                        value,
                        headers: Vec::new(),
                    }),
                    Err(error) => {
                        return Actual::DeadLetter {
                            kind: error.kind.to_owned(),
                            message: error.message,
                        };
                    }
                }
            }
            Actual::Outputs(outputs)
        }
        Err(error) => Actual::DeadLetter {
            kind: error.kind.to_owned(),
            message: error.message,
        },
    }
}

fn apply(
    transform: &mut dyn transform::Transform,
    input: &Input<'_>,
    headers: &[(String, Vec<u8>)],
    deadline: Instant,
) -> Answer {
    // A transform that watches its deadline gives up as in the processor; the worker's
    // parent kills the worker of one that does not (a jq program cannot be interrupted).
    let outcome = transform
        .apply(input, &Stop::default(), deadline)
        .map_err(|e| e.to_string())?;
    Ok(match outcome {
        Outcome::Outputs(outputs) => Actual::Outputs(
            outputs
                .into_iter()
                .map(|o| produced(o, input, headers))
                .collect(),
        ),
        Outcome::Rejected(rejection) => Actual::DeadLetter {
            kind: rejection.kind.to_owned(),
            message: rejection.message,
        },
        Outcome::Abandoned | Outcome::Emitted { .. } | Outcome::Reflected => {
            return Err("the transform answered as a stateful step does".into());
        }
    })
}

/// An output as the processor writes it: the input's key and headers unless it sets its own.
fn produced(output: Output, input: &Input<'_>, headers: &[(String, Vec<u8>)]) -> Produced {
    Produced {
        key: match output.key {
            Some(key) => key,
            None => input.key.map(<[u8]>::to_vec),
        },
        value: output.value,
        headers: output.headers.unwrap_or_else(|| headers.to_vec()),
    }
}

fn compare(expect: &Expect, actual: &Actual) -> Verdict {
    let matches = match (expect, actual) {
        (Expect::DeadLetter(kind), Actual::DeadLetter { kind: got, .. }) => kind == got,
        (Expect::Outputs(expected), Actual::Outputs(got)) => {
            expected.len() == got.len() && expected.iter().zip(got).all(|(e, g)| same(e, g))
        }
        _ => false,
    };
    if matches {
        return Verdict::Passed;
    }
    Verdict::Failed {
        expected: expected_lines(expect),
        actual: match actual {
            Actual::DeadLetter { kind, message } => {
                vec![format!("dead-lettered: {kind}: {message}")]
            }
            Actual::Outputs(records) if records.is_empty() => vec!["no output".into()],
            Actual::Outputs(records) => shown_lines(records.iter().map(actual_line)),
        },
    }
}

/// The most lines a result shows of what a step gave, and of each line: a case (or a sampled
/// record) may make megabytes of outputs, and a verdict is held in the daemon's validations
/// and written into plans and comments.
const SHOWN_LINES: usize = 10;
const SHOWN_LINE_CHARS: usize = 1_000;

/// `lines`, at most [`SHOWN_LINES`] of at most [`SHOWN_LINE_CHARS`] characters, saying what
/// was left out.
pub(crate) fn shown_lines(lines: impl ExactSizeIterator<Item = String>) -> Vec<String> {
    let total = lines.len();
    let mut shown: Vec<String> = lines
        .take(SHOWN_LINES)
        .map(|line| match line.char_indices().nth(SHOWN_LINE_CHARS) {
            Some((cut, _)) => format!("{}… ({} bytes)", &line[..cut], line.len()),
            None => line,
        })
        .collect();
    if total > SHOWN_LINES {
        shown.push(format!("… and {} more", total - SHOWN_LINES));
    }
    shown
}

fn expected_lines(expect: &Expect) -> Vec<String> {
    match expect {
        Expect::DeadLetter(kind) => vec![format!("dead-lettered: {kind}")],
        Expect::Outputs(records) if records.is_empty() => vec!["no output".into()],
        Expect::Outputs(records) => records.iter().map(expected_line).collect(),
    }
}

/// Whether an output is what a case expects of it: its value (JSON equal, or the same raw
/// text), and its key and headers where the case gives them.
fn same(expected: &TestRecord, got: &Produced) -> bool {
    let value = match &expected.value {
        RecordValue::Json(json) => {
            serde_json::from_slice::<serde_json::Value>(&got.value).is_ok_and(|v| &v == json)
        }
        RecordValue::Raw(text) => text.as_bytes() == got.value.as_slice(),
    };
    let key = expected
        .key
        .as_ref()
        .is_none_or(|key| got.key.as_deref() == Some(key.as_bytes()));
    let headers = expected.headers.as_ref().is_none_or(|headers| {
        headers.len() == got.headers.len()
            && headers
                .iter()
                .zip(&got.headers)
                .all(|((n, v), (gn, gv))| n == gn && v.as_bytes() == gv.as_slice())
    });
    value && key && headers
}

fn expected_line(record: &TestRecord) -> String {
    let value = match &record.value {
        RecordValue::Json(json) => json.to_string(),
        RecordValue::Raw(text) => format!("raw {text:?}"),
    };
    let key = record
        .key
        .as_ref()
        .map_or(String::new(), |k| format!("key {k:?} "));
    let headers = record
        .headers
        .as_ref()
        .map_or(String::new(), |h| format!(" headers {h:?}"));
    format!("{key}{value}{headers}")
}

fn actual_line(record: &Produced) -> String {
    let key = record.key.as_ref().map_or("no key ".to_owned(), |k| {
        format!("key {:?} ", String::from_utf8_lossy(k))
    });
    let headers = if record.headers.is_empty() {
        String::new()
    } else {
        let h: Vec<(String, String)> = record
            .headers
            .iter()
            .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        format!(" headers {h:?}")
    };
    format!("{key}{}{headers}", String::from_utf8_lossy(&record.value))
}

/// The results as text: one line per case (`file:line:column: step: name: ok`), the
/// expected and actual lines of each failed case, and a summary.
pub fn text(results: &[CaseResult]) -> String {
    let mut out = String::new();
    let (mut passed, mut failed, mut not_run) = (0, 0, 0);
    for r in results {
        let head = format!("{}:{}:{}: {}: {}", r.file, r.line, r.column, r.step, r.name);
        match &r.verdict {
            Verdict::Passed => {
                passed += 1;
                out.push_str(&format!("{head}: ok\n"));
            }
            Verdict::Failed { expected, actual } => {
                failed += 1;
                out.push_str(&format!("{head}: FAILED\n"));
                for line in expected {
                    out.push_str(&format!("  expected: {line}\n"));
                }
                for line in actual {
                    out.push_str(&format!("  actual:   {line}\n"));
                }
            }
            Verdict::NotRun { why } => {
                not_run += 1;
                out.push_str(&format!("{head}: not run: {why}\n"));
            }
            Verdict::Unfinished { why } => {
                failed += 1;
                out.push_str(&format!("{head}: DID NOT RUN: {why}\n"));
            }
        }
    }
    out.push_str(&format!(
        "{} cases: {passed} passed, {failed} failed, {not_run} not run\n",
        results.len()
    ));
    out
}

/// Whether no case failed or was left unfinished (cases of steps not run here do not fail
/// a run; they are listed).
pub fn all_passed(results: &[CaseResult]) -> bool {
    !results.iter().any(|r| r.verdict.fails())
}

impl Verdict {
    /// Whether the case fails a run: it failed, or the run's time left it unfinished.
    pub fn fails(&self) -> bool {
        matches!(self, Verdict::Failed { .. } | Verdict::Unfinished { .. })
    }
}
