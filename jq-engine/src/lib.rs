//! The jq engine of Plumber's `jq:` steps, one definition for the processor that runs
//! programs and the daemon that validates them, so a program that validates is a program
//! that runs, with the same meaning.
//!
//! It is jaq (jaq-core's parser and interpreter, jaq-std's library) with what jq 1.8 does
//! where jaq differs: its own value type ([`Val`], adapted from jaq-json: paths through null,
//! division by zero, numbers as jq 1.8 has them), jq's definitions on top of jaq's
//! (`defs.jq`), natives for what jq has natively, and a rewrite of the syntax jaq lacks
//! (`rewrite`). What still differs from jq is listed in processor/README.md.

mod funs;
mod jq_parse;
pub mod json_in;
pub mod json_out;
mod num;
mod rewrite;
mod value;

use jaq_core::load::parse::Def;
use jaq_core::load::{Arena, File, Loader};
use jaq_core::native::Fun;
use jaq_core::{Compiler, Ctx, Vars, data};

pub use num::Num;
pub use value::{Map, Rc, Val};

/// A jq run-time error: its value (a message, or what `error(v)` raised).
pub type Error = jaq_core::Error<Val>;

type Data = data::JustLut<Val>;

/// jaq's definitions that this crate replaces with natives of its own.
const REPLACED_DEFS: &[&str] = &["tostring", "delpaths", "tonumber", "env", "nan", "infinite"];

/// jaq's natives that jq's definitions (`defs.jq`) wrap: also given a `_plumber_` name.
const WRAPPED: &[&str] = &[
    "limit",
    "skip",
    "mktime",
    "strftime",
    "strflocaltime",
    "sort",
    "group_by",
];

/// The library: jaq's definitions, then jq's (which shadow them).
fn defs() -> impl Iterator<Item = Def<&'static str>> {
    let ours = jaq_core::load::parse(include_str!("defs.jq"), |p| p.defs()).unwrap_or_default();
    jaq_core::defs()
        .chain(jaq_std::defs())
        .filter(|def| !REPLACED_DEFS.contains(&def.name))
        .chain(ours)
}

/// The natives: this crate's, and jaq's that it does not replace. jaq's `limit` and `skip`
/// are also given other names: jq's, which refuse negative counts, call them (`defs.jq`).
fn funs() -> Vec<Fun<Data>> {
    let ours: Vec<Fun<Data>> = funs::funs::<Data>().collect();
    let replaced = |name: &str, arity: usize| {
        ours.iter()
            .any(|(n, args, _)| *n == name && args.len() == arity)
    };
    let mut all: Vec<Fun<Data>> = jaq_core::funs::<Data>()
        .chain(jaq_std::funs::<Data>())
        .filter(|(name, args, _)| !replaced(name, args.len()))
        .collect();
    // jaq's own definitions call them by their names.
    all.extend(
        jaq_core::funs::<Data>()
            .chain(jaq_std::funs::<Data>())
            .filter_map(|(name, args, f)| {
                let wrapped = *WRAPPED.iter().find(|w| **w == name)?;
                Some((wrapped_name(wrapped), args, f))
            }),
    );
    all.extend(ours);
    all
}

fn wrapped_name(name: &str) -> &'static str {
    match name {
        "limit" => "_plumber_limit",
        "skip" => "_plumber_skip",
        "mktime" => "_plumber_mktime",
        "strftime" => "_plumber_strftime",
        "strflocaltime" => "_plumber_strflocaltime",
        "sort" => "_plumber_sort",
        _ => "_plumber_group_by",
    }
}

/// The global variables every program sees.
const GLOBALS: &[&str] = &["$ENV"];

/// A compiled program.
pub struct Program {
    filter: jaq_core::Filter<Data>,
    env: Val,
}

/// Compiles `program`; `env` is what `$ENV` and `env` give. `Err` names what is wrong and
/// where in the program.
pub fn compile(program: &str, env: Val) -> Result<Program, String> {
    let rewritten = rewrite::rewrite(program)?;
    let arena = Arena::default();
    let modules = Loader::new(defs())
        .load(
            &arena,
            File {
                code: rewritten.as_str(),
                path: (),
            },
        )
        .map_err(|errors| load_errors(&rewritten, &errors))?;
    let funs = funs();
    builtins(&funs);
    let filter = Compiler::default()
        .with_funs(funs)
        .with_global_vars(GLOBALS.iter().copied())
        .compile(modules)
        .map_err(|errors| {
            let names: Vec<String> = errors
                .into_iter()
                .flat_map(|(_, undefined)| undefined)
                .map(|(name, kind)| undefined(name, kind.as_str()))
                .collect();
            names.join("; ")
        })?;
    Ok(Program { filter, env })
}

/// How a program stopped short of its last output.
#[derive(Debug)]
pub enum Stop {
    /// An error it raised and did not catch.
    Error(Error),
    /// `halt_error` or `halt(N)` with N other than 0: the exit code.
    Halt(i32),
}

impl Program {
    /// The outputs of the program for `input`, up to the first error. `halt` ends them.
    pub fn run(&self, input: Val) -> impl Iterator<Item = Result<Val, Stop>> + '_ {
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([self.env.clone()]));
        let mut halted = false;
        self.filter.id.run((ctx, input)).map_while(move |output| {
            if halted {
                return None;
            }
            match output {
                Ok(value) => Some(Ok(value)),
                Err(exn) => match exn.get_err() {
                    Ok(error) => Some(Err(Stop::Error(error))),
                    // Never exit the process as jaq does: the outputs end here.
                    Err(exn) => match exn.get_halt() {
                        Ok(0) | Err(_) => None,
                        Ok(code) => {
                            halted = true;
                            Some(Err(Stop::Halt(code)))
                        }
                    },
                },
            }
        })
    }
}

/// Sets `builtins` to the library's names, once.
fn builtins(funs: &[Fun<Data>]) {
    funs::BUILTINS.get_or_init(|| {
        let mut names: Vec<String> = defs()
            .map(|def| format!("{}/{}", def.name, def.args.len()))
            .chain(
                funs.iter()
                    .map(|(name, args, _)| format!("{name}/{}", args.len())),
            )
            .filter(|name| !name.starts_with('_') && !name.starts_with('@'))
            .collect();
        names.sort();
        names.dedup();
        names
    });
}

/// What validation says of an undefined name: for jq's that a step cannot have, why, and
/// what to write instead.
fn undefined(name: &str, kind: &str) -> String {
    let instead = match name {
        "input" | "inputs" => " (a step gets one record at a time: there is no next input to read)",
        "$__prog_args" | "$named" | "$positional" => {
            " (a step has no arguments: use the step's `env:` and `$ENV`)"
        }
        "modulemeta" | "get_prog_origin" | "get_jq_origin" => " (a step has no modules)",
        _ => "",
    };
    format!("undefined {kind} `{name}`{instead}")
}

fn load_errors(program: &str, errors: &jaq_core::load::Errors<&str, ()>) -> String {
    let mut messages = Vec::new();
    for (_, error) in errors {
        match error {
            jaq_core::load::Error::Io(items) => {
                messages.extend(items.iter().map(|(_, msg)| msg.clone()))
            }
            jaq_core::load::Error::Lex(items) => messages.extend(
                items
                    .iter()
                    .map(|(expect, at)| near(program, expect.as_str(), at)),
            ),
            jaq_core::load::Error::Parse(items) => messages.extend(
                items
                    .iter()
                    .map(|(expect, at)| near(program, expect.as_str(), at)),
            ),
        }
    }
    messages.join("; ")
}

/// "expected X at character N (found `rest…`)", where `at` is a slice of `program`.
fn near(program: &str, expected: &str, at: &str) -> String {
    let offset = (at.as_ptr() as usize).saturating_sub(program.as_ptr() as usize);
    let character = program
        .get(..offset)
        .map_or(0, |before| before.chars().count())
        + 1;
    let found: String = at.chars().take(20).collect();
    if found.is_empty() {
        format!("expected {expected} at the end of the program")
    } else {
        format!("expected {expected} at character {character} (found `{found}`)")
    }
}

/// Compiles many programs at once against the library, for validation: compiling the
/// library dominates, so it is done once for all of them.
pub struct Checker {
    prelude: Vec<Def<&'static str>>,
}

impl Default for Checker {
    fn default() -> Self {
        Checker {
            prelude: defs().collect(),
        }
    }
}

impl Checker {
    /// One result per program, `Err` naming what is wrong and where in the program.
    ///
    /// Each program is first rewritten and parsed alone (syntax errors name their place in
    /// it). The valid ones are then compiled together as `def __plumber_N: (PROGRAM);`; a
    /// program that parses alone is a balanced term, so wrapping cannot change its meaning.
    /// Undefined names are mapped back to their program by offset.
    pub fn check_all(&self, programs: &[&str]) -> Vec<Result<(), String>> {
        let rewritten: Vec<Result<String, String>> = programs
            .iter()
            .map(|p| {
                let rewritten = rewrite::rewrite(p)?;
                syntax(&rewritten)?;
                Ok(rewritten)
            })
            .collect();
        let mut results: Vec<Result<(), String>> = rewritten
            .iter()
            .map(|r| r.as_ref().map(drop).map_err(Clone::clone))
            .collect();
        let mut code = String::new();
        let mut spans: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, program) in rewritten.iter().enumerate() {
            if let Ok(program) = program {
                code.push_str(&format!("def __plumber_{i}: (\n"));
                let start = code.len();
                code.push_str(program);
                spans.push((i, start..code.len()));
                code.push_str("\n);\n");
            }
        }
        if spans.is_empty() {
            return results;
        }
        code.push('.');
        let arena = Arena::default();
        let loaded = Loader::new(self.prelude.iter().cloned()).load(
            &arena,
            File {
                code: code.as_str(),
                path: (),
            },
        );
        let modules = match loaded {
            Ok(modules) => modules,
            // Cannot happen for programs that parsed alone; answer per program to be sure.
            Err(_) => {
                for (i, _) in spans {
                    results[i] = compile(programs[i], Val::Null).map(drop);
                }
                return results;
            }
        };
        let Err(errors) = Compiler::<_, Data>::default()
            .with_funs(funs())
            .with_global_vars(GLOBALS.iter().copied())
            .compile(modules)
        else {
            return results;
        };
        let mut messages: Vec<Vec<String>> = vec![Vec::new(); programs.len()];
        for (name, kind) in errors.iter().flat_map(|(_, undefined)| undefined.iter()) {
            let at = jaq_core::load::span(&code, name).start;
            if let Some((i, _)) = spans.iter().find(|(_, range)| range.contains(&at)) {
                messages[*i].push(undefined(name, kind.as_str()));
            }
        }
        for (i, found) in messages.into_iter().enumerate() {
            if !found.is_empty() {
                results[i] = Err(found.join("; "));
            }
        }
        results
    }
}

/// Lexes and parses `program` alone.
fn syntax(program: &str) -> Result<(), String> {
    let arena = Arena::default();
    Loader::new(std::iter::empty())
        .load(
            &arena,
            File {
                code: program,
                path: (),
            },
        )
        .map(drop)
        .map_err(|errors| load_errors(program, &errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `defs()` would silently leave out jq's definitions if they did not parse.
    #[test]
    fn jq_definitions_parse() {
        let ours = jaq_core::load::parse(include_str!("defs.jq"), |p| p.defs());
        let ours: Vec<Def<&str>> = ours.expect("defs.jq parses");
        assert!(ours.iter().any(|def| def.name == "IN"));
    }

    fn outputs(program: &str, input: &str) -> Vec<String> {
        let program = compile(program, Val::Null).unwrap();
        let input = json_in::read(input.as_bytes()).unwrap();
        program
            .run(input)
            .map(|o| match o {
                Ok(v) => v.to_string(),
                Err(Stop::Error(e)) => format!("error: {e}"),
                Err(Stop::Halt(code)) => format!("halt {code}"),
            })
            .collect()
    }

    #[test]
    fn destructuring_alternatives_try_each_pattern() {
        assert_eq!(outputs(".[] as [$a] ?// $a | $a", "[[1], 2]"), ["1", "2"]);
        assert_eq!(
            outputs(
                ". as {$a, $b: [$c]} | [$a, $b, $c]",
                r#"{"a": 1, "b": [2]}"#
            ),
            ["[1,[2],2]"]
        );
    }

    /// jq 1.8 shows a value in a message as at most 29 bytes of its JSON, the cut at a
    /// character boundary and marked with `...` and the closing delimiter.
    #[test]
    fn messages_show_values_as_jq_does() {
        let negated = |input: &str| outputs("try -. catch .", input);
        assert_eq!(
            negated(r#""xx☆☆☆☆☆☆☆☆""#),
            [r#""string (\"xx☆☆☆☆☆☆☆☆\") cannot be negated""#]
        );
        assert_eq!(
            negated(r#""xxxx☆☆☆☆☆☆☆☆""#),
            [r#""string (\"xxxx☆☆☆☆☆☆...\") cannot be negated""#]
        );
        assert_eq!(
            outputs(r#"try (. + "x") catch ."#, "123456789012345678901234567890"),
            [r#""number (12345678901234567890123456...) and string (\"x\") cannot be added""#]
        );
        assert_eq!(
            negated("[1234567890,1234567890,1234567890]"),
            [r#""array ([1234567890,1234567890,12...]) cannot be negated""#]
        );
        assert_eq!(
            negated(r#"{"aaaaaaaaaaaaaaaaaaaaaaaaaa":1}"#),
            [r#""object ({\"aaaaaaaaaaaaaaaaaaaaaaa...}) cannot be negated""#]
        );
    }

    #[test]
    fn error_messages_are_jqs() {
        let caught =
            |program: &str, input: &str| outputs(&format!("try ({program}) catch ."), input);
        let cases = [
            (
                "utf8bytelength",
                "[1]",
                "array ([1]) only strings have UTF-8 byte length",
            ),
            ("ltrim", "1", "trim input must be a string"),
            ("bsearch(1)", "{}", "object ({}) cannot be searched from"),
            (
                "_strindices(\"a\")",
                "1",
                "number (1) cannot be searched, as it is not a string",
            ),
            ("_strindices(1)", "\"a\"", "number (1) is not a string"),
            ("fromjson", "1", "number (1) only strings can be parsed"),
            (
                "join(\",\")",
                "[\"a\",[1]]",
                "string (\"a,\") and array ([1]) cannot be added",
            ),
            ("mktime", "1", "mktime requires array inputs"),
            (
                "mktime",
                "[2024,1,1,0,0,null]",
                "mktime requires parsed datetime inputs",
            ),
            (
                "strftime(\"%Y\")",
                "\"x\"",
                "strftime/1 requires parsed datetime inputs",
            ),
            (
                "strftime(1)",
                "[2024]",
                "strftime/1 requires a string format",
            ),
            (
                "strflocaltime(\"%Y\")",
                "[null]",
                "strflocaltime/1 requires parsed datetime inputs",
            ),
            (".[nan] = 1", "[]", "Cannot set array element at NaN index"),
            (".[1:2] = \"x\"", "\"abc\"", "Cannot update string slices"),
            (
                "setpath([{\"start\":1}]; \"x\")",
                "\"abc\"",
                "Cannot update string slices",
            ),
            (
                ".[[1]] |= 1",
                "[1]",
                "Cannot update field at array index of array",
            ),
        ];
        for (program, input, message) in cases {
            let message = Val::from(message.to_owned()).to_string();
            assert_eq!(caught(program, input), [message], "{program} on {input}");
        }
        // What still works around the checks.
        assert_eq!(outputs("mktime", "[2024,8,21]"), ["1726876800"]);
        assert_eq!(outputs("strftime(\"%Y\")", "[2024,0,1]"), ["\"2024\""]);
        assert_eq!(outputs("_strindices(\"b\")", "\"abcb\""), ["[1,3]"]);
        assert_eq!(outputs("[.[] | trim]", "[\" a \"]"), ["[\"a\"]"]);
    }

    #[test]
    fn checker_agrees_with_compile() {
        let programs = [
            ".a = 1",
            "$__loc__",
            "nosuch",
            "{(1): 2}",
            ". as [$a] ?// $a | $a",
        ];
        let checked = Checker::default().check_all(&programs);
        for (program, checked) in programs.iter().zip(checked) {
            let compiled = compile(program, Val::Null).map(drop);
            assert_eq!(checked.is_ok(), compiled.is_ok(), "{program}: {checked:?}");
        }
    }
}
