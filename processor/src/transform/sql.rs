//! `--sql`: a stateless `SELECT … FROM <input step> [WHERE …]` over each record's JSON
//! value, `_key` and `_headers` for its key and headers (SPEC §8). Each row that passes
//! `WHERE` is one output record with the input's key and headers; a record whose evaluation
//! fails (not a JSON object, a type error, division by zero) is dead-lettered. The query is
//! compiled by `plumber-sql`, as `plumber validate` compiles it; the dialect is in the README.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use plumber_sql::{Aggregation, Compiled, Emit, Join, Problem, Query, Record};

use super::{Error, Outcome, Transform};
use crate::config::{EmitChoice, Rebuild, StateConfig, TableConfig};
use crate::metrics::Metrics;
use crate::record::{Input, Output, Rejection};
use crate::state::{RESTORE_TIMEOUT, ReadFrom, Stores, read_input};
use crate::stop::Stop;
use crate::table::{self, TableFeed};

pub struct Sql {
    query: Query,
    /// For a query whose SELECTs read several input steps: the steps read from each topic.
    /// Empty when every SELECT reads every record.
    steps_of: HashMap<String, Vec<String>>,
}

impl Sql {
    /// `inputs` maps input steps to the topics they are read from (`--sql-input`); `topics`
    /// are the topics the processor consumes.
    pub fn compile(
        query: &str,
        inputs: &[(String, String)],
        topics: &[String],
    ) -> Result<Self, Error> {
        let query = Query::compile(query, None).map_err(|problems| {
            // A query that joins or groups runs with its table or its state: say which flag.
            Error::Sql(match plumber_sql::compile_any(query, None, true) {
                Ok(Compiled::Join(join)) => format!(
                    "the query joins `{table}` as a table: say its topic with --table {table}=TOPIC",
                    table = join.table()
                ),
                Ok(Compiled::Stateful(_)) => {
                    "a query with GROUP BY keeps state: give it its changelog with --state-topic"
                        .into()
                }
                _ => Problem::all(&problems),
            })
        })?;
        let read = query.inputs();
        if read.len() <= 1 && inputs.is_empty() {
            return Ok(Sql {
                query,
                steps_of: HashMap::new(),
            });
        }
        let mut steps_of: HashMap<String, Vec<String>> = HashMap::new();
        for (step, topic) in inputs {
            if !topics.contains(topic) {
                return Err(Error::Sql(format!(
                    "--sql-input {step}={topic}: `{topic}` is not one of the --input topics"
                )));
            }
            steps_of
                .entry(topic.clone())
                .or_default()
                .push(step.clone());
        }
        for step in &read {
            if !inputs.iter().any(|(s, _)| s == step) {
                return Err(Error::Sql(format!(
                    "the query reads `{step}`: say which topic it is with --sql-input {step}=TOPIC"
                )));
            }
        }
        // A consumed topic no SELECT reads would lose its records without a trace.
        if let Some(topic) = topics.iter().find(|t| !steps_of.contains_key(*t)) {
            return Err(Error::Sql(format!(
                "no --sql-input names a step for the input topic `{topic}`"
            )));
        }
        Ok(Sql { query, steps_of })
    }

    /// The outputs for one record, or why it is dead-lettered.
    pub fn eval(&self, input: &Input<'_>) -> Result<Vec<Output>, Rejection> {
        let record = Record {
            value: input.value,
            key: input.key,
            headers: &input.headers,
        };
        let reject = |e: plumber_sql::EvalError| Rejection::new(e.kind, e.message);
        let values = if self.steps_of.is_empty() {
            self.query.eval(&record, None).map_err(reject)?
        } else {
            let mut values = Vec::new();
            for step in self.steps_of.get(input.topic).into_iter().flatten() {
                values.extend(self.query.eval(&record, Some(step)).map_err(reject)?);
            }
            values
        };
        Ok(values.into_iter().map(Output::value).collect())
    }
}

impl Transform for Sql {
    fn apply(
        &mut self,
        input: &Input<'_>,
        _stop: &Stop,
        _deadline: Instant,
    ) -> Result<Outcome, Error> {
        Ok(match self.eval(input) {
            Ok(outputs) => Outcome::Outputs(outputs),
            Err(rejection) => Outcome::Rejected(rejection),
        })
    }

    /// An evaluation is bounded (query size, nesting, the strings it builds) but not timed:
    /// a record that still ran too long is ended by the overseer, as for jq.
    fn interruptible(&self) -> bool {
        false
    }
}

/// A stream–table join: each record of the one input topic joined to the table
/// ([`TableFeed`]) as it stands when the record is processed. It keeps no state of its own.
pub struct Joined {
    join: Join,
    table: Arc<TableFeed>,
}

impl Joined {
    /// `query` with JOIN, its stream read from the one topic the processor consumes
    /// (`topics`), its table from `table`'s (`--table`, which must name the query's table).
    pub fn compile(
        query: &str,
        inputs: &[(String, String)],
        topics: &[String],
        table: &TableConfig,
        client: rdkafka::config::ClientConfig,
        metrics: &Metrics,
    ) -> Result<Self, Error> {
        if !inputs.is_empty() || topics.len() != 1 {
            return Err(Error::Sql(
                "a join reads its stream from one --input topic (and its table with --table)"
                    .into(),
            ));
        }
        let join = match plumber_sql::compile_any(query, None, true)
            .map_err(|p| Error::Sql(Problem::all(&p)))?
        {
            Compiled::Join(join) => *join,
            _ => {
                return Err(Error::Sql(
                    "--table is for a query with JOIN; this one reads no table".into(),
                ));
            }
        };
        if join.table() != table.step {
            return Err(Error::Sql(format!(
                "the query joins `{}` as its table, but --table names `{}`",
                join.table(),
                table.step
            )));
        }
        let beat = metrics.clone();
        let gauges = table::Gauges {
            rows: metrics.table_rows.clone(),
            bytes: metrics.table_bytes.clone(),
            loading: metrics.table_loading.clone(),
            skipped: metrics.table_skipped.clone(),
            beat: Arc::new(move || beat.beat()),
        };
        let feed = TableFeed::new(table, client, join.clone(), gauges);
        Ok(Joined {
            join,
            table: Arc::new(feed),
        })
    }

    /// The table, to load before the first record.
    pub fn table(&self) -> Arc<TableFeed> {
        self.table.clone()
    }
}

impl Transform for Joined {
    fn apply(
        &mut self,
        input: &Input<'_>,
        _stop: &Stop,
        _deadline: Instant,
    ) -> Result<Outcome, Error> {
        let record = Record {
            value: input.value,
            key: input.key,
            headers: &input.headers,
        };
        let joined = self.table.with(|table| self.join.feed(table, &record))?;
        Ok(match joined {
            Ok(values) => Outcome::Outputs(values.into_iter().map(Output::value).collect()),
            Err(e) => Outcome::Rejected(Rejection::new(e.kind, e.message)),
        })
    }

    /// Bounded like a stateless query: ended by the overseer should it still run too long.
    fn interruptible(&self) -> bool {
        false
    }
}

/// A stateful step (`GROUP BY`, `docs/stateful-sql.md`): each record is fed to its
/// partition's state in [`Stores`], restored from the changelog before the partition's first
/// record ([`Transform::prepare`]).
pub struct Aggregate {
    query: Aggregation,
    stores: Arc<Stores>,
    rebuild: Option<Rebuild>,
}

impl Aggregate {
    /// `query` with GROUP BY, reading its one input step from the one topic the processor
    /// consumes (`topics`; `inputs` are `--sql-input`s, which it takes none of).
    pub fn compile(
        query: &str,
        inputs: &[(String, String)],
        topics: &[String],
        state: &StateConfig,
        stores: Arc<Stores>,
    ) -> Result<Self, Error> {
        if !inputs.is_empty() || topics.len() != 1 {
            return Err(Error::Sql(
                "a stateful query reads one input step, from one --input topic".into(),
            ));
        }
        match plumber_sql::compile_any(query, None, true)
            .map_err(|p| Error::Sql(Problem::all(&p)))?
        {
            Compiled::Stateful(aggregation) => Ok(Aggregate::new(*aggregation, state, stores)),
            Compiled::Join(_) => Err(Error::Sql(
                "a JOIN does not run with --state-topic: its table is read from its own topic"
                    .into(),
            )),
            Compiled::Stateless(_) => Err(Error::Sql(
                "--state-topic is for a query with GROUP BY; this one keeps no state".into(),
            )),
        }
    }

    fn new(query: Aggregation, state: &StateConfig, stores: Arc<Stores>) -> Self {
        let grace = i64::try_from(state.grace_ms).unwrap_or(i64::MAX);
        let emit = match state.emit {
            EmitChoice::Close => Emit::Close,
            EmitChoice::Update => Emit::Update,
        };
        Aggregate {
            query: query.with_grace(grace).with_emit(emit),
            stores,
            rebuild: state.rebuild,
        }
    }

    /// Rebuilds a partition the changelog holds no state of from the input records before
    /// `input` (the first one it reads), without emitting: the old life emitted what they
    /// closed. The state then stands just before `input`.
    fn rebuild(&self, input: &Input<'_>, rebuild: Rebuild, metrics: &Metrics) -> Result<(), Error> {
        let from = match (rebuild, input.timestamp) {
            (Rebuild::SpanMs(span), Some(timestamp)) => {
                let span = i64::try_from(span).unwrap_or(i64::MAX);
                ReadFrom::Time(timestamp.saturating_sub(span.saturating_mul(2)))
            }
            _ => ReadFrom::Earliest,
        };
        let (topic, partition) = (input.topic, input.partition);
        let started = Instant::now();
        let mut refused = 0u64;
        let progress = |read: usize| {
            metrics.beat();
            metrics
                .state_restoring
                .set(i64::try_from(read).unwrap_or(i64::MAX));
        };
        let room = self.stores.max_groups();
        let read = read_input(
            self.stores.client().clone(),
            topic,
            partition,
            from,
            input.offset,
            RESTORE_TIMEOUT,
            &progress,
            &mut |message| {
                let record = crate::pipeline::input_of(message);
                let fed = self.stores.with(partition, |state| {
                    let fed = record.timestamp.map(|timestamp| {
                        self.query.feed_within(
                            state,
                            &Record {
                                value: record.value,
                                key: record.key,
                                headers: &record.headers,
                            },
                            timestamp,
                            room,
                        )
                    });
                    state.reflects(record.offset);
                    fed
                });
                if let Some(Some(Err(error))) = fed
                    && error.kind == STATE_FULL
                {
                    refused += 1;
                }
            },
        )?;
        metrics.state_restoring.set(0);
        self.stores.with(partition, |state| {
            state.reflects(input.offset - 1);
        });
        if refused > 0 {
            tracing::warn!(
                topic,
                partition,
                refused,
                "the rebuild left out records that would have opened groups beyond --state-max-groups"
            );
        }
        tracing::info!(
            topic,
            partition,
            from = ?from,
            until = input.offset,
            records = read,
            seconds = started.elapsed().as_secs_f64(),
            "state rebuilt from the input, without emitting"
        );
        Ok(())
    }

    fn feed(&self, input: &Input<'_>) -> Result<Outcome, Error> {
        let record = Record {
            value: input.value,
            key: input.key,
            headers: &input.headers,
        };
        let fed = self
            .stores
            .feed(input.partition, |state, room| {
                if state.offset().is_some_and(|at| at >= input.offset) {
                    return None;
                }
                let fed = match input.timestamp {
                    Some(timestamp) => self.query.feed_within(state, &record, timestamp, room),
                    None => Err(plumber_sql::EvalError {
                        kind: "sql-error",
                        message: "the record has no timestamp; a stateful step keeps time by \
                                  its records' timestamps (Kafka sets one on every record \
                                  since 0.10)"
                            .into(),
                    }),
                };
                state.reflects(input.offset);
                Some(fed)
            })
            .ok_or_else(|| {
                Error::Sql(format!(
                    "the state of {}/{} is not held (not restored)",
                    input.topic, input.partition
                ))
            })?;
        Ok(match fed {
            None => Outcome::Reflected,
            Some(Err(error)) if error.kind == STATE_FULL => Outcome::Rejected(Rejection::new(
                STATE_FULL,
                format!(
                    "{}; raise --state-max-groups (the step file's `stateMaxGroups:`), or \
                     shorten the windows or the grace",
                    error.message
                ),
            )),
            Some(Err(error)) => Outcome::Rejected(Rejection::new(error.kind, error.message)),
            Some(Ok(emitted)) => {
                let mut outputs = Vec::with_capacity(emitted.len());
                let mut failed = Vec::new();
                for output in emitted {
                    match output.value {
                        Ok(value) => outputs.push(Output {
                            key: Some(output.key),
                            value,
                            headers: Some(Vec::new()),
                            timestamp: Some(output.timestamp),
                        }),
                        Err(error) => failed.push(Rejection::new(
                            error.kind,
                            match output.window {
                                Some((start, end)) => format!(
                                    "the result of the window [{start}, {end}) could not be \
                                     computed: {}",
                                    error.message
                                ),
                                None => format!(
                                    "the group's result could not be computed: {}",
                                    error.message
                                ),
                            },
                        )),
                    }
                }
                Outcome::Emitted { outputs, failed }
            }
        })
    }
}

/// The kind of a record refused because the state is at its bound (`--state-max-groups`).
pub const STATE_FULL: &str = "state-full";

impl Transform for Aggregate {
    fn apply(
        &mut self,
        input: &Input<'_>,
        _stop: &Stop,
        _deadline: Instant,
    ) -> Result<Outcome, Error> {
        self.feed(input)
    }

    fn interruptible(&self) -> bool {
        false
    }

    fn prepare(
        &mut self,
        input: &Input<'_>,
        assigned: &dyn Fn(&str) -> Vec<i32>,
        metrics: &Metrics,
    ) -> Result<(), Error> {
        if self.stores.ready(input.partition) {
            return Ok(());
        }
        let progress = |entries: usize| {
            metrics.beat();
            metrics
                .state_restoring
                .set(i64::try_from(entries).unwrap_or(i64::MAX));
        };
        let mut partitions = assigned(input.topic);
        partitions.push(input.partition);
        let restored = self.stores.ensure(&partitions, &progress);
        let read = metrics.state_restoring.get();
        if read > 0 {
            metrics
                .state_restored
                .inc_by(u64::try_from(read).unwrap_or(0));
            metrics.state_restoring.set(0);
        }
        restored?;
        let without_state = self.stores.take_without_state(input.partition);
        match self.rebuild {
            Some(rebuild) if without_state && input.offset > 0 => {
                self.rebuild(input, rebuild, metrics)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(topic: &'a str, value: &'a [u8]) -> Input<'a> {
        Input {
            topic,
            partition: 0,
            offset: 0,
            timestamp: None,
            key: Some(b"k"),
            value: Some(value),
            headers: vec![("trace", Some(b"t1"))],
        }
    }

    fn values(outputs: Vec<Output>) -> Vec<String> {
        outputs
            .into_iter()
            .map(|o| {
                assert_eq!((o.key, o.headers), (None, None), "key and headers kept");
                String::from_utf8(o.value).unwrap()
            })
            .collect()
    }

    #[test]
    fn filters_and_projects_with_key_and_headers() {
        let topics = ["in".to_owned()];
        let sql = Sql::compile(
            "SELECT id, _key AS k, _headers.trace FROM t WHERE speed > 10",
            &[],
            &topics,
        )
        .unwrap();
        assert_eq!(
            values(sql.eval(&input("in", br#"{"id":1,"speed":11}"#)).unwrap()),
            [r#"{"id":1,"k":"k","trace":"t1"}"#]
        );
        assert!(
            sql.eval(&input("in", br#"{"id":2,"speed":3}"#))
                .unwrap()
                .is_empty()
        );
        let rejected = sql
            .eval(&input("in", br#"{"id":3,"speed":"fast"}"#))
            .unwrap_err();
        assert_eq!(rejected.kind, "sql-error");
        assert!(
            rejected.message.contains("cannot compare"),
            "{}",
            rejected.message
        );
        assert_eq!(
            sql.eval(&input("in", b"nope")).unwrap_err().kind,
            "invalid-json"
        );
    }

    #[test]
    fn each_select_of_a_union_reads_its_input_steps_topic() {
        let topics = ["cars.raw".to_owned(), "trucks.raw".to_owned()];
        let inputs = [
            ("cars".to_owned(), "cars.raw".to_owned()),
            ("trucks".to_owned(), "trucks.raw".to_owned()),
        ];
        let sql = Sql::compile(
            "SELECT id, 'car' AS kind FROM cars UNION ALL SELECT id, 'truck' AS kind FROM trucks",
            &inputs,
            &topics,
        )
        .unwrap();
        assert_eq!(
            values(sql.eval(&input("trucks.raw", br#"{"id":7}"#)).unwrap()),
            [r#"{"id":7,"kind":"truck"}"#]
        );
        assert_eq!(
            values(sql.eval(&input("cars.raw", br#"{"id":8}"#)).unwrap()),
            [r#"{"id":8,"kind":"car"}"#]
        );
    }

    #[test]
    fn a_union_without_its_topics_does_not_start() {
        let topics = ["a.raw".to_owned(), "b.raw".to_owned()];
        let query = "SELECT id FROM a UNION ALL SELECT id FROM b";
        let message = |inputs: &[(&str, &str)]| {
            let inputs: Vec<(String, String)> = inputs
                .iter()
                .map(|(s, t)| ((*s).to_owned(), (*t).to_owned()))
                .collect();
            match Sql::compile(query, &inputs, &topics) {
                Err(Error::Sql(m)) => m,
                _ => panic!("starts with {inputs:?}"),
            }
        };
        assert!(message(&[]).contains("--sql-input a=TOPIC"));
        assert!(message(&[("a", "a.raw")]).contains("--sql-input b=TOPIC"));
        assert!(message(&[("a", "a.raw"), ("b", "elsewhere")]).contains("not one of the --input"));
        assert!(message(&[("a", "a.raw"), ("b", "a.raw")]).contains("`b.raw`"));
        let Err(Error::Sql(bad)) = Sql::compile("SELECT COUNT(*) FROM a", &[], &topics) else {
            panic!()
        };
        assert!(bad.contains("aggregate"), "{bad}");
    }
}
