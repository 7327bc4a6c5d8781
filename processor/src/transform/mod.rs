//! Transforms turn one input record into zero or more outputs, or reject it (SPEC §8).
//! One module per kind: [`jq`], [`exec`] (child process, line protocol) and [`http`]
//! (sidecar). The exec and http wire formats are documented in their modules and the README.

mod child;
pub mod exec;
pub mod http;
pub mod jq;
pub mod sql;

use std::time::Instant;

use crate::config::{Config, TransformSpec};
use crate::metrics::Metrics;
use crate::record::{Input, Output, Rejection};
use crate::stop::Stop;

/// What became of one input.
#[derive(Debug)]
pub enum Outcome {
    /// Zero or more outputs; zero means filtered out.
    Outputs(Vec<Output>),
    /// The transform cannot handle this record: dead-letter it.
    Rejected(Rejection),
    /// A stop cut the record short; it is left uncommitted for the group's next owner.
    Abandoned,
}

/// Errors that stop the processor: the step itself is broken, not one record.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the jq program does not compile: {0}")]
    Jq(String),
    #[error("the SQL query cannot run: {0}")]
    Sql(String),
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid --http URL `{0}`: {1}")]
    Url(String, String),
}

pub trait Transform {
    /// Transforms one record. `deadline` ends the record's budget (`--record-timeout`): a
    /// record unfinished then is rejected with kind [`TIMEOUT`].
    fn apply(
        &mut self,
        input: &Input<'_>,
        stop: &Stop,
        deadline: Instant,
    ) -> Result<Outcome, Error>;

    /// Whether `apply` returns by itself at the deadline and when a stop abandons the record
    /// (exec, http). One that cannot (jq) is ended by the [`crate::overseer`].
    fn interruptible(&self) -> bool;
}

/// The most an exec answer line or an http answer body may hold (all outputs of one record):
/// a child or sidecar that writes more cannot make the processor's memory grow without bound.
pub const MAX_ANSWER: usize = 16 << 20;

/// The kind of a record dead-lettered because its transform ran out of time.
pub const TIMEOUT: &str = "timeout";

/// The rejection of a record whose budget ran out.
pub fn timed_out(budget: std::time::Duration, detail: &str) -> Rejection {
    Rejection::new(
        TIMEOUT,
        format!(
            "the transform did not finish the record within --record-timeout ({} s){detail}",
            budget.as_secs()
        ),
    )
}

/// How exec and http try a record: each call up to `call_timeout`, up to `attempts` times,
/// all within the record's budget.
#[derive(Debug, Clone, Copy)]
pub struct Retries {
    pub call_timeout: std::time::Duration,
    pub attempts: u32,
    pub budget: std::time::Duration,
}

fn retries(config: &Config) -> Retries {
    Retries {
        call_timeout: config.transform_timeout,
        attempts: config.attempts,
        budget: config.record_timeout,
    }
}

pub fn build(config: &Config, metrics: &Metrics) -> Result<Box<dyn Transform>, Error> {
    Ok(match &config.transform {
        TransformSpec::Jq(program) => Box::new(jq::Jq::compile_with_env(
            program,
            // What the step's `env:` set; a name it did not set is left out.
            config
                .jq_env
                .iter()
                .filter_map(|name| Some((name.clone(), std::env::var(name).ok()?))),
        )?),
        TransformSpec::Sql { query, inputs } => {
            Box::new(sql::Sql::compile(query, inputs, &config.inputs)?)
        }
        TransformSpec::Exec(command) => Box::new(exec::Exec::new(
            command.clone(),
            retries(config),
            metrics.clone(),
        )?),
        TransformSpec::Http(url) => Box::new(http::Http::new(
            url.clone(),
            retries(config),
            metrics.clone(),
        )?),
    })
}
