//! Compiling jq programs with [`plumber_jq`], the engine `plumber-processor` runs them with,
//! so a program that validates is a program that runs, with the same meaning.

/// How deeply a jq program may nest, as [`nesting`] counts it. jaq's lexer, parser and
/// compiler recurse once per level, so a deeper program (a 1 MiB step file holds 500,000
/// levels) would overflow the stack instead of being reported; real programs stay far below.
/// [`crate::VALIDATION_STACK_BYTES`] is sized for programs at this limit.
pub const MAX_NESTING: usize = 256;

/// Compiles programs against jq's library. Parsing that library is the expensive part, so
/// one checker is built per validation run and reused for every step.
#[derive(Default)]
pub struct JqChecker {
    engine: plumber_jq::Checker,
}

impl JqChecker {
    /// `Err` carries a message that names what is wrong and where in the program.
    pub fn check(&self, program: &str) -> Result<(), String> {
        self.check_all(&[program]).pop().unwrap_or(Ok(()))
    }

    /// Checks many programs with one compilation, which is what makes validating thousands
    /// of steps fast. Programs nested too deeply are refused before the engine sees them:
    /// parsing one is what would overflow the stack.
    pub fn check_all(&self, programs: &[&str]) -> Vec<Result<(), String>> {
        let too_deep = |p: &str| nesting(p) > MAX_NESTING;
        let shallow: Vec<&str> = programs.iter().copied().filter(|p| !too_deep(p)).collect();
        let mut checked = self.engine.check_all(&shallow).into_iter();
        programs
            .iter()
            .map(|p| {
                if too_deep(p) {
                    Err(format!(
                        "it is nested more than {MAX_NESTING} levels deep (each bracket, \
                         string, interpolation, operator and keyword such as `if` or `try` \
                         adds a level); simplify the program"
                    ))
                } else {
                    checked.next().unwrap_or(Ok(()))
                }
            })
            .collect()
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

    /// What the processor runs, validation accepts: jq 1.8's syntax and library.
    #[test]
    fn jq_programs_validate_as_they_run() {
        let jq = JqChecker::default();
        for program in [
            "{} | .meta.source = \"x\"",
            ".[] as [$a] ?// $a | $a",
            "[$__loc__]",
            "[.a, .b] | @csv",
            "select(.kind | IN(\"a\", \"b\"))",
            "INDEX(.id) | tostream",
            "$ENV.MODEL",
            "pick(.a) | trimstr(\"x\")",
        ] {
            assert_eq!(jq.check(program), Ok(()), "{program}");
        }
        let err = jq.check("import \"lib\" as lib; lib::f").unwrap_err();
        assert!(err.contains("`import` is not supported"), "{err}");
        let err = jq.check("input").unwrap_err();
        assert!(err.contains("one record at a time"), "{err}");
        let err = jq.check("{(0): 1}").unwrap_err();
        assert!(err.contains("object key"), "{err}");
    }

    #[test]
    fn undefined_filters_are_named() {
        let err = JqChecker::default().check("selectt(.a)").unwrap_err();
        assert!(err.contains("selectt"), "{err}");
    }
}
