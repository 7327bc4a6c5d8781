//! Transforms turn one input record into zero or more outputs, or reject it (SPEC §8).
//! One module per kind: [`jq`], [`exec`] (child process, line protocol) and [`http`]
//! (sidecar). The exec and http wire formats are documented in their modules and the README.

mod child;
pub mod exec;
pub mod http;
pub mod jq;
pub mod sql;

use std::sync::Arc;
use std::time::Instant;

use crate::config::{Config, TransformSpec};
use crate::metrics::Metrics;
use crate::record::{Input, Output, Rejection};
use crate::state::Stores;
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
    /// A stateful step's outputs (windows the record closed, its own update), and the
    /// dead-letter copies of the record for outputs that could not be computed.
    Emitted {
        outputs: Vec<Output>,
        failed: Vec<Rejection>,
    },
    /// A stateful step's restored state reflects this record already (its outputs were
    /// sent before the state was written): nothing to do.
    Reflected,
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
    #[error(transparent)]
    Restore(#[from] crate::state::RestoreError),
    #[error(transparent)]
    Table(#[from] crate::table::TableError),
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

    /// Makes ready what `input` needs before its budget starts: a stateful step restores
    /// its partition's state from the changelog the first time it sees the partition (with
    /// the other partitions of its topic the instance is assigned, `assigned` says which).
    fn prepare(
        &mut self,
        _input: &Input<'_>,
        _assigned: &dyn Fn(&str) -> Vec<i32>,
        _metrics: &Metrics,
    ) -> Result<(), Error> {
        Ok(())
    }
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

/// What a transform needs made ready before the processor joins its group: a join's table.
pub type Table = Option<Arc<crate::table::TableFeed>>;

/// The transform `config` asks for; `stores` holds a stateful step's state (`--state-topic`).
pub fn build(
    config: &Config,
    metrics: &Metrics,
    stores: Option<Arc<Stores>>,
) -> Result<(Box<dyn Transform>, Table), Error> {
    if let (TransformSpec::Sql { query, inputs }, Some(table)) = (&config.transform, &config.table)
    {
        let mut client = crate::kafka::reader_config(config);
        client.set("group.id", format!("{}.table", config.group));
        let joined = sql::Joined::compile(query, inputs, &config.inputs, table, client, metrics)?;
        let feed = joined.table();
        return Ok((Box::new(joined), Some(feed)));
    }
    if let (TransformSpec::Sql { query, inputs }, Some(state), Some(stores)) =
        (&config.transform, &config.state, stores)
    {
        return Ok((
            Box::new(sql::Aggregate::compile(
                query,
                inputs,
                &config.inputs,
                state,
                stores,
            )?),
            None,
        ));
    }
    let transform: Box<dyn Transform> = match &config.transform {
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
    };
    Ok((transform, None))
}
