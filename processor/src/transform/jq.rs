//! `--jq`: the record value is parsed as JSON, each output of the program becomes one record
//! with the input's key and headers (SPEC §8). Compiled with jaq, the engine `plumber
//! validate` checks programs with.
//!
//! jaq evaluates on the calling thread and cannot be interrupted: a program that never ends
//! on a record is ended by the [`crate::overseer`], which dead-letters the record and
//! restarts the processor. `fromjson`, `tojson` and `tostring` are replaced by the crate's
//! bounded reader and writer, so what a record carries is parsed at most
//! [`json_in::MAX_DEPTH`] levels deep and nothing is written deeper; values a program builds
//! deeper than that cost stack in jaq itself, which the processing thread's large stack
//! (`pipeline::LOOP_STACK`) absorbs.

use std::time::Instant;

use jaq_core::load::{Arena, File, Loader};
use jaq_core::native::{Filter, Fun, bome, run, v};
use jaq_core::{Compiler, Ctx, DataT, RunPtr, Vars, data, unwrap_valr};
use jaq_json::{Rc, Val, ValR};

use super::{Error, Outcome, Transform, json_in, json_out};
use crate::record::{Input, Output, Rejection, display_bounded};
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
        // `tostring` is jaq's `"\(.)"`, its unbounded writer; ours is native (below).
        let defs = jaq_core::defs()
            .filter(|def| def.name != "tostring")
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
            .chain(
                jaq_json::funs::<Data>()
                    .filter(|(name, _, _)| !matches!(*name, "fromjson" | "tojson")),
            )
            .chain(bounded_natives::<Data>());
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
            let output = output.map_err(|e| Rejection::new("jq-error", display_bounded(&e)))?;
            if outputs.len() == MAX_OUTPUTS_PER_RECORD {
                return Err(Rejection::new(
                    "jq-error",
                    format!(
                        "the program gave more than {MAX_OUTPUTS_PER_RECORD} outputs for one record"
                    ),
                ));
            }
            let mut bytes = Vec::with_capacity(value.len());
            if let Err(not_json) = json_out::write(&mut bytes, &output) {
                drop_iteratively(output);
                return Err(Rejection::new(
                    "jq-error",
                    format!(
                        "the program gave an output that cannot be written as JSON: {}",
                        not_json.0
                    ),
                ));
            }
            outputs.push(bytes);
        }
        Ok(outputs)
    }
}

impl Transform for Jq {
    fn apply(
        &mut self,
        input: &Input<'_>,
        _stop: &Stop,
        _deadline: Instant,
    ) -> Result<Outcome, Error> {
        Ok(match self.run(input.value.unwrap_or(b"null")) {
            Ok(values) => Outcome::Outputs(values.into_iter().map(Output::value).collect()),
            Err(rejection) => Outcome::Rejected(rejection),
        })
    }

    fn interruptible(&self) -> bool {
        false
    }
}

/// `fromjson`, `tojson` and `tostring` through the crate's bounded reader and writer.
fn bounded_natives<D: for<'a> DataT<V<'a> = Val>>() -> impl Iterator<Item = Fun<D>> {
    let filters: [Filter<RunPtr<D>>; 3] = [
        ("fromjson", v(0), |cv| bome(from_json(&cv.1))),
        ("tojson", v(0), |cv| bome(to_json(&cv.1))),
        ("tostring", v(0), |cv| match cv.1 {
            text @ Val::TStr(_) => bome(Ok(text)),
            other => bome(to_json(&other)),
        }),
    ];
    filters.into_iter().map(run::<D>)
}

/// jq's `fromjson`: exactly one strict JSON value (jaq's reads several, and recurses without
/// a bound: a string holding 100,000 `[` overflowed the stack).
fn from_json(value: &Val) -> ValR {
    let text = value.try_as_utf8_bytes_owned()?;
    json_in::read(&text).map_err(|e| {
        let start: String = String::from_utf8_lossy(&text[..text.len().min(40)]).into();
        let more = if text.len() > 40 { "…" } else { "" };
        jaq_json::Error::str(format_args!("cannot parse {start:?}{more} as JSON: {e}"))
    })
}

fn to_json(value: &Val) -> ValR {
    let mut out = Vec::new();
    json_out::write(&mut out, value)
        .map_err(|e| jaq_json::Error::str(format_args!("cannot write as JSON: {}", e.0)))?;
    Ok(Val::utf8_str(out))
}

/// Drops a value that may be nested arbitrarily deep without recursing: dropping a million
/// nested arrays the usual way takes 50 MB of stack.
fn drop_iteratively(value: Val) {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Val::Arr(items) => {
                if let Ok(items) = Rc::try_unwrap(items) {
                    pending.extend(items);
                }
            }
            Val::Obj(entries) => {
                if let Ok(entries) = Rc::try_unwrap(entries) {
                    for (key, item) in entries {
                        pending.push(key);
                        pending.push(item);
                    }
                }
            }
            _ => {}
        }
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
    fn fromjson_reads_strict_bounded_json() {
        let jq = Jq::compile(".s | fromjson").unwrap();
        assert_eq!(
            strings(jq.run(br#"{"s": "[1, {\"a\": 2}]"}"#).unwrap()),
            [r#"[1,{"a":2}]"#]
        );
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let record = serde_json::json!({ "s": deep }).to_string();
        let refused = jq.run(record.as_bytes()).unwrap_err();
        assert_eq!(refused.kind, "jq-error");
        assert!(
            refused.message.contains("512 levels"),
            "{}",
            refused.message
        );
        assert!(
            refused.message.len() < 200,
            "the string is not quoted whole"
        );
        for not_one_value in [r#"{"s": "1 2"}"#, r#"{"s": "NaN"}"#] {
            assert_eq!(
                jq.run(not_one_value.as_bytes()).unwrap_err().kind,
                "jq-error"
            );
        }
    }

    /// On a thread with the processing thread's stack, as in the processor: jaq itself
    /// recurses to drop or display such values (about 50 bytes of stack per level to drop).
    #[test]
    fn deep_values_a_program_builds_are_errors_not_crashes() {
        std::thread::Builder::new()
            .stack_size(crate::pipeline::LOOP_STACK)
            .spawn(|| {
                let build = "reduce range(100000) as $_ (0; [.])";
                for (program, what) in [
                    (build.to_owned(), "512 levels"),
                    (format!("{build} | tojson"), "512 levels"),
                    (format!("{build} | tostring"), "512 levels"),
                    (format!("{build} | error"), "cut"),
                ] {
                    let refused = Jq::compile(&program).unwrap().run(b"null").unwrap_err();
                    assert_eq!(refused.kind, "jq-error", "{program}");
                    assert!(
                        refused.message.contains(what),
                        "{program}: {}",
                        refused.message
                    );
                }
                let dropped = Jq::compile("reduce range(1000000) as $_ (0; [.]) | length")
                    .unwrap()
                    .run(b"null")
                    .unwrap();
                assert_eq!(strings(dropped), ["1"]);
                let shallow = Jq::compile("[1, {a: .}] | tojson, tostring, (.[1] | tostring)")
                    .unwrap()
                    .run(b"\"x\"")
                    .unwrap();
                assert_eq!(
                    strings(shallow),
                    [
                        r#""[1,{\"a\":\"x\"}]""#,
                        r#""[1,{\"a\":\"x\"}]""#,
                        r#""{\"a\":\"x\"}""#
                    ]
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn huge_error_messages_are_cut() {
        let jq = Jq::compile(r#"error("x" * 2000000)"#).unwrap();
        let refused = jq.run(b"null").unwrap_err();
        assert!(refused.message.len() < 5000, "{}", refused.message.len());
        assert!(refused.message.ends_with("cut)"), "marked as cut");
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
