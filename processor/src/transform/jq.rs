//! `--jq`: the record value is parsed as JSON, each output of the program becomes one record
//! with the input's key and headers (SPEC §8). Programs run on [`plumber_jq`], the engine
//! `plumber validate` checks them with: jaq with jq 1.8's semantics.
//!
//! jaq evaluates on the calling thread and cannot be interrupted: a program that never ends
//! on a record is ended by the [`crate::overseer`], which dead-letters the record and
//! restarts the processor. Records are read with the engine's bounded reader and outputs
//! written with its writer, so what a record carries is parsed at most
//! [`json_in::MAX_DEPTH`] levels deep and nothing is written deeper; values a program builds
//! deeper than that cost stack in jaq itself, which the processing thread's large stack
//! (`pipeline::LOOP_STACK`) absorbs.

use std::time::Instant;

use plumber_jq::{Map, Program, Rc, Stop as Halted, Val, json_in, json_out};

use super::{Error, Outcome, Transform};
use crate::record::{Input, Output, Rejection, display_bounded};
use crate::stop::Stop;

/// Refuses programs that would turn one record into an unbounded stream (`repeat(.)`).
const MAX_OUTPUTS_PER_RECORD: usize = 100_000;

pub struct Jq {
    program: Program,
}

impl Jq {
    /// A program that sees no environment variables in `$ENV`.
    pub fn compile(program: &str) -> Result<Self, Error> {
        Self::compile_with_env(program, std::iter::empty())
    }

    /// A program whose `$ENV` holds `env` (the step's `env:`).
    pub fn compile_with_env(
        program: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, Error> {
        let env: Map = env
            .into_iter()
            .map(|(name, value)| (Val::from(name), Val::from(value)))
            .collect();
        let program = plumber_jq::compile(program, Val::obj(env)).map_err(Error::Jq)?;
        Ok(Jq { program })
    }

    /// The program's outputs for one JSON value, serialised; or the error it raised.
    pub fn run(&self, value: &[u8]) -> Result<Vec<Vec<u8>>, Rejection> {
        match self.run_all(value) {
            (outputs, None) => Ok(outputs),
            (_, Some(rejection)) => Err(rejection),
        }
    }

    /// The outputs the program gave for one JSON value, serialised, up to the first error it
    /// raised, and that error. A step dead-letters the record on an error; jq's test runner
    /// compares what came before it.
    pub fn run_all(&self, value: &[u8]) -> (Vec<Vec<u8>>, Option<Rejection>) {
        let input = match json_in::read(value) {
            Ok(input) => input,
            Err(e) => {
                let message = format!("the record value is not JSON: {e}");
                return (Vec::new(), Some(Rejection::new("invalid-json", message)));
            }
        };
        let mut outputs = Vec::new();
        for output in self.program.run(input) {
            let output = match output {
                Ok(output) => output,
                Err(Halted::Error(e)) => {
                    let rejection = Rejection::new("jq-error", display_bounded(&e));
                    return (outputs, Some(rejection));
                }
                Err(Halted::Halt(code)) => {
                    let message = format!("the program halted with exit code {code}");
                    return (outputs, Some(Rejection::new("jq-error", message)));
                }
            };
            if outputs.len() == MAX_OUTPUTS_PER_RECORD {
                let message = format!(
                    "the program gave more than {MAX_OUTPUTS_PER_RECORD} outputs for one record"
                );
                return (outputs, Some(Rejection::new("jq-error", message)));
            }
            let mut bytes = Vec::with_capacity(value.len());
            if let Err(not_json) = json_out::write(&mut bytes, &output) {
                drop_iteratively(output);
                let message = format!(
                    "the program gave an output that cannot be written as JSON: {}",
                    not_json.0
                );
                return (outputs, Some(Rejection::new("jq-error", message)));
            }
            outputs.push(bytes);
        }
        (outputs, None)
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

    /// On a thread with the processing thread's stack, as in the processor: the reader
    /// recurses once per level, up to jq's limit of 10,000.
    fn on_loop_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(crate::pipeline::LOOP_STACK)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn bad_json_and_program_errors_are_rejections() {
        on_loop_stack(bad_json_and_program_errors);
    }

    fn bad_json_and_program_errors() {
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
        on_loop_stack(fromjson_strict_bounded);
    }

    fn fromjson_strict_bounded() {
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
            refused.message.contains("Exceeds depth limit for parsing"),
            "{}",
            refused.message
        );
        assert!(
            refused.message.len() < 300,
            "the string is not quoted whole"
        );
        // What jq reads in reading JSON: `nan`.
        let nan = jq.run(br#"{"s": "nan"}"#).unwrap();
        assert_eq!(strings(nan), ["null"]);
        for not_one_value in [r#"{"s": "1 2"}"#, r#"{"s": "[1,]"}"#] {
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
                    (build.to_owned(), "10001 levels"),
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
                // As jq's, `tojson` and `tostring` write what is too deep as a marker.
                let skipped = Jq::compile(&format!(
                    "{build} | tojson, tostring | contains(\"<skipped: too deep>\")"
                ))
                .unwrap()
                .run(b"null")
                .unwrap();
                assert_eq!(strings(skipped), ["true", "true"]);
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

    /// The idioms whose jaq meaning dead-lettered records or changed them silently.
    #[test]
    fn common_idioms_mean_what_they_mean_in_jq() {
        for (program, input, expected) in [
            (".meta.source = \"x\"", "{}", r#"{"meta":{"source":"x"}}"#),
            (".a = 1", "null", r#"{"a":1}"#),
            (".[2] = 1", "null", "[null,null,1]"),
            (".tags += [\"new\"]", "{}", r#"{"tags":["new"]}"#),
            (
                "[.[] | join(\",\")]",
                "[[\"a\", null, 1], [null]]",
                r#"["a,,1",""]"#,
            ),
            (".n + 1", r#"{"n": 9007199254740993}"#, "9007199254740992"),
            (
                ".",
                "100000000000000000000000000001",
                "100000000000000000000000000001",
            ),
            ("1.5 * 2, 1 / 3", "null", "3 0.3333333333333333"),
            ("[limit(0; 1, 2)], [first(range(10))]", "null", "[] [0]"),
            ("[.[] | IN(2, 3)]", "[1, 2]", "[false,true]"),
            ("[1, \"a\"] | @csv, @tsv", "null", r#""1,\"a\"" "1\ta""#),
            ("{a: 1} | tostream", "null", r#"[["a"],1] [["a"]]"#),
        ] {
            let outputs = Jq::compile(program).unwrap().run(input.as_bytes());
            let outputs = strings(outputs.unwrap_or_else(|e| panic!("{program}: {e:?}")));
            assert_eq!(outputs.join(" "), expected, "{program}");
        }
        for (program, input, error) in [
            ("1 / 0", "null", "divisor is zero"),
            (".n % 0", r#"{"n": 5}"#, "divisor is zero"),
            ("limit(-1; 1)", "null", "negative count"),
            ("nth(-1; 1)", "null", "negative indices"),
        ] {
            let refused = Jq::compile(program)
                .unwrap()
                .run(input.as_bytes())
                .unwrap_err();
            assert!(
                refused.message.contains(error),
                "{program}: {}",
                refused.message
            );
        }
    }

    /// `halt` ends the outputs; `halt_error` dead-letters; neither ends the processor (jaq's
    /// `halt` exits the process).
    #[test]
    fn halt_does_not_exit_the_processor() {
        let outputs = Jq::compile("1, halt, 2").unwrap().run(b"null").unwrap();
        assert_eq!(strings(outputs), ["1"]);
        let refused = Jq::compile("\"bad\" | halt_error")
            .unwrap()
            .run(b"null")
            .unwrap_err();
        assert!(
            refused.message.contains("exit code 5"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn env_holds_what_the_step_sets() {
        let env = [("MODEL".to_owned(), "v3".to_owned())];
        let jq = Jq::compile_with_env("[$ENV.MODEL, env.MODEL, $ENV.HOME]", env).unwrap();
        assert_eq!(strings(jq.run(b"null").unwrap()), [r#"["v3","v3",null]"#]);
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
