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
        let arena = Arena::default();
        let modules = Loader::new(self.prelude.iter().cloned())
            .load(
                &arena,
                File {
                    code: program,
                    path: (),
                },
            )
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
            })?;
        let funs = jaq_core::funs::<Data>()
            .chain(jaq_std::funs::<Data>())
            .chain(jaq_json::funs::<Data>());
        Compiler::<_, Data>::default()
            .with_funs(funs)
            .compile(modules)
            .map(drop)
            .map_err(|errors| {
                errors
                    .iter()
                    .flat_map(|(_, undefined)| undefined.iter())
                    .map(|(name, kind)| format!("undefined {} `{name}`", kind.as_str()))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
    }
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
    fn undefined_filters_are_named() {
        let err = JqChecker::default().check("selectt(.a)").unwrap_err();
        assert!(err.contains("selectt"), "{err}");
    }
}
