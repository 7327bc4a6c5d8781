//! Compiling jq programs with jaq, the engine `plumber-processor` runs them with, so a program
//! that validates is a program that runs.

use jaq_core::load::parse::Def;
use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, data};
use jaq_json::Val;

type Data = data::JustLut<Val>;

/// Compiles programs against the standard library. Parsing that library is the expensive
/// part, so one checker is built per validation run and reused for every step.
pub struct JqChecker {
    prelude: Vec<Def<&'static str>>,
}

impl Default for JqChecker {
    fn default() -> Self {
        JqChecker {
            prelude: jaq_core::defs()
                .chain(jaq_std::defs())
                .chain(jaq_json::defs())
                .collect(),
        }
    }
}

impl JqChecker {
    /// `Err` carries a message that names what is wrong and where in the program.
    pub fn check(&self, program: &str) -> Result<(), String> {
        self.check_all(&[program]).pop().unwrap_or(Ok(()))
    }

    /// Checks many programs with one compilation, which is what makes validating thousands
    /// of steps fast: compiling the standard library dominates, so it is done once.
    ///
    /// Each program is first parsed alone (syntax errors name their place in it). The valid
    /// ones are then compiled together as `def __plumber_N: (PROGRAM);`; a program that parses
    /// alone is a balanced term, so wrapping cannot change its meaning. Undefined names are
    /// mapped back to their program by offset.
    pub fn check_all(&self, programs: &[&str]) -> Vec<Result<(), String>> {
        let mut results: Vec<Result<(), String>> = programs
            .iter()
            .map(|p| syntax(p, std::iter::empty()))
            .collect();
        let mut code = String::new();
        let mut spans: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, program) in programs.iter().enumerate() {
            if results[i].is_ok() {
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
        let modules = match Loader::new(self.prelude.iter().cloned()).load(
            &arena,
            File {
                code: code.as_str(),
                path: (),
            },
        ) {
            Ok(modules) => modules,
            // Cannot happen for programs that parsed alone; answer per program to be sure.
            Err(_) => {
                for (i, _) in spans {
                    results[i] = syntax(programs[i], self.prelude.iter().cloned());
                }
                return results;
            }
        };
        let funs = jaq_core::funs::<Data>()
            .chain(jaq_std::funs::<Data>())
            .chain(jaq_json::funs::<Data>());
        let Err(errors) = Compiler::<_, Data>::default()
            .with_funs(funs)
            .compile(modules)
        else {
            return results;
        };
        let mut messages: Vec<Vec<String>> = vec![Vec::new(); programs.len()];
        for (name, undefined) in errors.iter().flat_map(|(_, undefined)| undefined.iter()) {
            let at = jaq_core::load::span(&code, name).start;
            if let Some((i, _)) = spans.iter().find(|(_, range)| range.contains(&at)) {
                messages[*i].push(format!("undefined {} `{name}`", undefined.as_str()));
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

/// Lexes and parses `program` against `prelude` (empty for a syntax-only check).
fn syntax(
    program: &str,
    prelude: impl IntoIterator<Item = Def<&'static str>>,
) -> Result<(), String> {
    let arena = Arena::default();
    Loader::new(prelude)
        .load(
            &arena,
            File {
                code: program,
                path: (),
            },
        )
        .map(drop)
        .map_err(|errors| {
            let mut messages = Vec::new();
            for (_, error) in &errors {
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
        })
}

/// "expected X at character N (`rest…`)", where `at` is a slice of `program`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_programs_compile() {
        let jq = JqChecker::default();
        for program in [
            ".",
            "select(.speed > 10) | {id, speed}",
            ".items[] | .name",
            "map(. * 2)",
        ] {
            assert_eq!(jq.check(program), Ok(()), "{program}");
        }
    }

    #[test]
    fn syntax_errors_say_where() {
        let err = JqChecker::default().check("select(.speed > ").unwrap_err();
        assert!(err.contains("expected"), "{err}");
    }

    #[test]
    fn batches_attribute_each_error_to_its_program() {
        let results = JqChecker::default().check_all(&[
            ".a",
            "selectt(.a)",
            "select(.a > ",
            "$nope",
            "def f: .; f | map(.)",
        ]);
        assert_eq!(results[0], Ok(()));
        assert!(results[1].as_ref().unwrap_err().contains("selectt"));
        assert!(results[2].as_ref().unwrap_err().contains("expected"));
        assert!(results[3].as_ref().unwrap_err().contains("$nope"));
        assert_eq!(results[4], Ok(()));
    }

    #[test]
    fn undefined_filters_are_named() {
        let err = JqChecker::default().check("selectt(.a)").unwrap_err();
        assert!(err.contains("selectt"), "{err}");
    }
}
