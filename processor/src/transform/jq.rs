//! `--jq`: the record value is parsed as JSON, each output of the program becomes one record
//! with the input's key and headers (SPEC §8). Compiled with jaq, the engine `plumber
//! validate` checks programs with.

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data, unwrap_valr};
use jaq_json::Val;

use super::{Error, Outcome, Transform, json_in, json_out};
use crate::record::{Input, Output, Rejection};
use crate::stop::Stop;

type Data = data::JustLut<Val>;

/// Refuses programs that would turn one record into an unbounded stream (`repeat(.)`).
const MAX_OUTPUTS_PER_RECORD: usize = 100_000;

pub struct Jq {
    filter: jaq_core::Filter<Data>,
}

impl Jq {
    pub fn compile(program: &str) -> Result<Self, Error> {
        let arena = Arena::default();
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let modules = Loader::new(defs)
            .load(
                &arena,
                File {
                    code: program,
                    path: (),
                },
            )
            .map_err(|errors| {
                let mut messages = Vec::new();
                for (_, error) in errors {
                    match error {
                        jaq_core::load::Error::Io(items) => {
                            messages.extend(items.into_iter().map(|(_, m)| m))
                        }
                        jaq_core::load::Error::Lex(items) => messages.extend(
                            items
                                .into_iter()
                                .map(|(expect, at)| near(program, expect.as_str(), at)),
                        ),
                        jaq_core::load::Error::Parse(items) => messages.extend(
                            items
                                .into_iter()
                                .map(|(expect, at)| near(program, expect.as_str(), at)),
                        ),
                    }
                }
                Error::Jq(messages.join("; "))
            })?;
        let funs = jaq_core::funs::<Data>()
            .chain(jaq_std::funs::<Data>())
            .chain(jaq_json::funs::<Data>());
        let filter = Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .map_err(|errors| {
                let names: Vec<String> = errors
                    .into_iter()
                    .flat_map(|(_, undefined)| undefined)
                    .map(|(name, kind)| format!("undefined {} `{name}`", kind.as_str()))
                    .collect();
                Error::Jq(names.join("; "))
            })?;
        Ok(Jq { filter })
    }

    /// The program's outputs for one JSON value, serialised; or the error it raised.
    pub fn run(&self, value: &[u8]) -> Result<Vec<Vec<u8>>, Rejection> {
        let input = json_in::read(value).map_err(|e| {
            Rejection::new("invalid-json", format!("the record value is not JSON: {e}"))
        })?;
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([]));
        let mut outputs = Vec::new();
        for output in self.filter.id.run((ctx, input)).map(unwrap_valr) {
            let output = output.map_err(|e| Rejection::new("jq-error", e.to_string()))?;
            if outputs.len() == MAX_OUTPUTS_PER_RECORD {
                return Err(Rejection::new(
                    "jq-error",
                    format!(
                        "the program gave more than {MAX_OUTPUTS_PER_RECORD} outputs for one record"
                    ),
                ));
            }
            let mut bytes = Vec::with_capacity(value.len());
            json_out::write(&mut bytes, &output).map_err(|not_json| {
                Rejection::new(
                    "jq-error",
                    format!(
                        "the program gave an output that is not JSON: {}",
                        not_json.0
                    ),
                )
            })?;
            outputs.push(bytes);
        }
        Ok(outputs)
    }
}

impl Transform for Jq {
    fn apply(&mut self, input: &Input<'_>, _stop: &Stop) -> Result<Outcome, Error> {
        Ok(match self.run(input.value.unwrap_or(b"null")) {
            Ok(values) => Outcome::Outputs(values.into_iter().map(Output::value).collect()),
            Err(rejection) => Outcome::Rejected(rejection),
        })
    }
}

fn near(program: &str, expected: &str, at: &str) -> String {
    let offset = (at.as_ptr() as usize).saturating_sub(program.as_ptr() as usize);
    let shown: String = at.chars().take(20).collect();
    if shown.is_empty() {
        format!("expected {expected} at the end of the program")
    } else {
        format!("expected {expected} at byte {offset}, near `{shown}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(outputs: Vec<Vec<u8>>) -> Vec<String> {
        outputs
            .into_iter()
            .map(|o| String::from_utf8(o).unwrap())
            .collect()
    }

    #[test]
    fn filter_map_and_flat_map() {
        let jq = Jq::compile("select(.n > 1) | .tags[] | {tag: ., n: 1}").unwrap();
        assert_eq!(
            jq.run(br#"{"n": 1, "tags": ["a"]}"#).unwrap(),
            Vec::<Vec<u8>>::new()
        );
        assert_eq!(
            strings(jq.run(br#"{"n": 2, "tags": ["a", "b"]}"#).unwrap()),
            [r#"{"tag":"a","n":1}"#, r#"{"tag":"b","n":1}"#]
        );
    }

    #[test]
    fn bad_json_and_program_errors_are_rejections() {
        let jq = Jq::compile(r#"if .bad then error("bad record") else . end"#).unwrap();
        assert_eq!(jq.run(b"{nope").unwrap_err().kind, "invalid-json");
        // Deep enough to overflow the stack of an unbounded reader: refused, not a crash.
        let deep = "[".repeat(200_000) + &"]".repeat(200_000);
        let refused = jq.run(deep.as_bytes()).unwrap_err();
        assert_eq!(refused.kind, "invalid-json");
        assert!(refused.message.contains("levels"), "{}", refused.message);
        let raised = jq.run(br#"{"bad": true}"#).unwrap_err();
        assert_eq!(raised.kind, "jq-error");
        assert!(raised.message.contains("bad record"), "{}", raised.message);
    }

    #[test]
    fn unbounded_output_is_refused() {
        let jq = Jq::compile("repeat(.)").unwrap();
        assert!(jq.run(b"1").unwrap_err().message.contains("more than"));
    }

    #[test]
    fn compile_errors_name_the_problem() {
        let Err(Error::Jq(message)) = Jq::compile("select(.a") else {
            panic!()
        };
        assert!(message.contains("expected"), "{message}");
        let Err(Error::Jq(message)) = Jq::compile("nosuchfn(1)") else {
            panic!()
        };
        assert!(message.contains("nosuchfn"), "{message}");
    }
}
