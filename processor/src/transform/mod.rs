//! Transforms turn one input record into zero or more outputs, or reject it (SPEC §8).
//! One module per kind: [`jq`], [`exec`] (child process, line protocol) and [`http`]
//! (sidecar). The exec and http wire formats are documented in their modules and the README.

pub mod exec;
pub mod http;
pub mod jq;
mod json_in;
mod json_out;
pub mod sql;

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
    fn apply(&mut self, input: &Input<'_>, stop: &Stop) -> Result<Outcome, Error>;
}

pub fn build(config: &Config, metrics: &Metrics) -> Result<Box<dyn Transform>, Error> {
    Ok(match &config.transform {
        TransformSpec::Jq(program) => Box::new(jq::Jq::compile(program)?),
        TransformSpec::Sql { query, inputs } => {
            Box::new(sql::Sql::compile(query, inputs, &config.inputs)?)
        }
        TransformSpec::Exec(command) => Box::new(exec::Exec::new(
            command.clone(),
            config.transform_timeout,
            config.attempts,
            metrics.clone(),
        )?),
        TransformSpec::Http(url) => Box::new(http::Http::new(
            url.clone(),
            config.transform_timeout,
            config.attempts,
            metrics.clone(),
        )?),
    })
}
