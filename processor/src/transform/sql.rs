//! `--sql`: a stateless `SELECT … FROM <input step> [WHERE …]` over each record's JSON
//! value, `_key` and `_headers` for its key and headers (SPEC §8). Each row that passes
//! `WHERE` is one output record with the input's key and headers; a record whose evaluation
//! fails (not a JSON object, a type error, division by zero) is dead-lettered. The query is
//! compiled by `plumber-sql`, as `plumber validate` compiles it; the dialect is in the README.

use std::collections::HashMap;

use plumber_sql::{Query, Record};

use std::time::Instant;

use super::{Error, Outcome, Transform};
use crate::record::{Input, Output, Rejection};
use crate::stop::Stop;

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
            Error::Sql(
                problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            )
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
