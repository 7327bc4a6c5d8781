//! Compiling jq programs with jaq, the engine `plumber-processor` runs them with, so a program
//! that validates is a program that runs.

use jaq_core::load::parse::Def;
use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, data};
use jaq_json::Val;

type Data = data::JustLut<Val>;

/// How deeply a jq program may nest, as [`nesting`] counts it. jaq's lexer, parser and
/// compiler recurse once per level, so a deeper program (a 1 MiB step file holds 500,000
/// levels) would overflow the stack instead of being reported; real programs stay far below.
/// [`crate::VALIDATION_STACK_BYTES`] is sized for programs at this limit.
pub const MAX_NESTING: usize = 256;

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
            .map(|p| {
                // Measured before jaq sees it: parsing a too deep program is the crash.
                if nesting(p) > MAX_NESTING {
                    return Err(format!(
                        "it is nested more than {MAX_NESTING} levels deep (each bracket, \
                         string, interpolation, operator and keyword such as `if` or `try` \
                         adds a level); simplify the program"
                    ));
                }
                syntax(p, std::iter::empty())
            })
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

/// An upper bound of how deeply jaq recurses on `program`, computed without recursion: along
/// the deepest path of brackets, strings and interpolations, each of them counts one, plus
/// every operator character and nesting keyword directly inside it (a chain `a + b + c` nests
/// as deeply as `((a + b) + c)` in jaq's syntax tree, wherever in it the deepest part is).
/// What jaq keeps in flat lists does not count: object entries, arguments (`;`), slices and
/// object keys (`:`), the branches of an `if`. Overcounting is fine: real programs stay far
/// below the limit.
pub fn nesting(program: &str) -> usize {
    /// An open bracket, string or interpolation.
    struct Open {
        string: bool,
        /// An object's entries are a list in jaq: `,` does not chain there.
        object: bool,
        /// Operators and keywords directly inside it.
        inner: usize,
        /// The nesting of its deepest closed child.
        deepest_child: usize,
    }
    fn open(string: bool, object: bool) -> Open {
        Open {
            string,
            object,
            inner: 0,
            deepest_child: 0,
        }
    }
    /// Closes the innermost scope into its parent; the top level is never closed here.
    fn close(stack: &mut Vec<Open>) {
        if stack.len() > 1
            && let Some(done) = stack.pop()
            && let Some(parent) = stack.last_mut()
        {
            let nesting = 1 + done.inner + done.deepest_child;
            parent.deepest_child = parent.deepest_child.max(nesting);
        }
    }
    fn count(stack: &mut [Open]) {
        if let Some(innermost) = stack.last_mut() {
            innermost.inner += 1;
        }
    }
    let mut stack = vec![open(false, false)];
    let bytes = program.as_bytes();
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        i += 1;
        if stack.last().is_some_and(|innermost| innermost.string) {
            match byte {
                b'\\' if bytes.get(i) == Some(&b'(') => {
                    i += 1;
                    stack.push(open(false, false));
                }
                b'\\' => i += 1,
                b'"' => close(&mut stack),
                _ => {}
            }
            continue;
        }
        match byte {
            b'#' => {
                while bytes.get(i).is_some_and(|&b| b != b'\n') {
                    i += 1;
                }
            }
            b'"' => stack.push(open(true, false)),
            b'(' | b'[' => stack.push(open(false, false)),
            b'{' => stack.push(open(false, true)),
            // Also ends an interpolation; an unbalanced closer is the parser's to report.
            b')' | b']' | b'}' => close(&mut stack),
            b',' if stack.last().is_some_and(|innermost| innermost.object) => {}
            b'|' | b',' | b'=' | b'+' | b'-' | b'*' | b'/' | b'%' | b'<' | b'>' | b'!' | b'?' => {
                count(&mut stack)
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let start = i - 1;
                while bytes
                    .get(i)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
                {
                    i += 1;
                }
                if matches!(
                    bytes.get(start..i).unwrap_or_default(),
                    b"def"
                        | b"if"
                        | b"try"
                        | b"reduce"
                        | b"foreach"
                        | b"label"
                        | b"as"
                        | b"and"
                        | b"or"
                ) {
                    count(&mut stack);
                }
            }
            _ => {}
        }
    }
    // An unterminated program still counts what it opened.
    while stack.len() > 1 {
        close(&mut stack);
    }
    stack
        .first()
        .map_or(1, |top| 1 + top.inner + top.deepest_child)
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
    fn nesting_counts_brackets_strings_operators_and_keywords() {
        assert_eq!(nesting("."), 1);
        assert_eq!(nesting("(.)"), 2);
        assert_eq!(nesting(".a | .b"), 2);
        assert_eq!(nesting("[.a | .b] | .c"), 4);
        // A comment or a string's content does not nest; an interpolation does.
        assert_eq!(nesting(". # ((((\n"), 1);
        assert_eq!(nesting("\"(((\""), 2);
        assert_eq!(nesting("\"\\(.a | .b)\""), 4);
        assert_eq!(nesting("try try ."), 3);
        // Closed scopes give their nesting back.
        assert_eq!(nesting("(.|.|.) , (.)"), 5);
        // Lists in jaq's syntax tree do not nest.
        assert_eq!(nesting("{a: 1, b: 2, c: 3}"), 2);
        assert_eq!(nesting("if . then 1 elif . then 2 else 3 end"), 2);
        assert_eq!(nesting("def f: 1; def g: 2; f | g"), 4);
    }

    #[test]
    fn programs_nested_beyond_the_limit_are_errors() {
        let at_limit = format!(
            "{}.{}",
            "(".repeat(MAX_NESTING - 1),
            ")".repeat(MAX_NESTING - 1)
        );
        assert_eq!(nesting(&at_limit), MAX_NESTING);
        let beyond = format!("({at_limit})");
        // On the stack validation runs on: jaq needs it for programs at the limit.
        let (at, over) = std::thread::Builder::new()
            .stack_size(crate::VALIDATION_STACK_BYTES)
            .spawn(move || {
                let jq = JqChecker::default();
                (jq.check(&at_limit), jq.check(&beyond))
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(at, Ok(()));
        let err = over.unwrap_err();
        assert!(
            err.contains(&format!("more than {MAX_NESTING} levels")),
            "{err}"
        );
    }

    #[test]
    fn undefined_filters_are_named() {
        let err = JqChecker::default().check("selectt(.a)").unwrap_err();
        assert!(err.contains("selectt"), "{err}");
    }
}
