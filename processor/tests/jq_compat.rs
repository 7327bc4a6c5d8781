//! jq's own test suite (`tests/jq.test`, jq 1.8.2) and the examples of its manual
//! (`tests/man.test`) through the jq transform, exactly as a `jq:` step runs a program.
//!
//! Every case that does not give jq's result is listed, with what it gives instead, in
//! `fixtures/jq/<file>.differences`. The test fails when a case gives something other than
//! what the list says (a case that passed and now fails, or a listed case that now passes:
//! the list is kept honest), and when fewer cases pass than the goal (95 % of `jq.test`,
//! 98 % of `man.test`, counting those that differ only in the text of an error message).
//! `PLUMBER_JQ_COMPAT_WRITE=1` rewrites the lists from the current results.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use plumber_processor::transform::jq::Jq;

/// One case of a jq test file.
struct Case {
    line: usize,
    program: String,
    kind: Kind,
}

enum Kind {
    /// The program, run on `input`, gives exactly `expected`.
    Run {
        input: String,
        expected: Vec<String>,
    },
    /// `%%FAIL`: the program must not compile.
    MustFail,
}

/// How a case came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Pass,
    /// The outputs are jq's except for the text of caught error messages.
    ErrorText,
    /// Other outputs, or fewer or more of them.
    Wrong,
    /// The program does not compile (or, for `%%FAIL`, compiles).
    Compile,
    /// An error that jq does not raise.
    Error,
    /// The input line is not one JSON value for the step's reader.
    Input,
}

impl Outcome {
    fn tag(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::ErrorText => "error-text",
            Outcome::Wrong => "wrong",
            Outcome::Compile => "compile",
            Outcome::Error => "error",
            Outcome::Input => "input",
        }
    }

    fn from_tag(tag: &str) -> Option<Self> {
        [
            Outcome::Pass,
            Outcome::ErrorText,
            Outcome::Wrong,
            Outcome::Compile,
            Outcome::Error,
            Outcome::Input,
        ]
        .into_iter()
        .find(|o| o.tag() == tag)
    }
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jq")
}

/// Reads a test file as jq's test runner does (`src/jq_test.c`): blank lines and lines
/// starting with `#` separate cases; a case is a program, an input and expected outputs, or
/// `%%FAIL` and a program that must not compile, followed by its error message.
fn cases(text: &str) -> Vec<Case> {
    let skip = |line: &str| {
        let line = line.trim_start_matches([' ', '\t']);
        line.is_empty() || line.starts_with('#')
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut cases = Vec::new();
    let mut i = 0;
    let mut must_fail = false;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if skip(line) {
            continue;
        }
        if line == "%%FAIL" || line == "%%FAIL IGNORE MSG" {
            must_fail = true;
            continue;
        }
        let program = line.to_owned();
        let at = i;
        if must_fail {
            must_fail = false;
            while i < lines.len() && !skip(lines[i]) {
                i += 1;
            }
            cases.push(Case {
                line: at,
                program,
                kind: Kind::MustFail,
            });
            continue;
        }
        let input = lines.get(i).copied().unwrap_or_default().to_owned();
        i += 1;
        let mut expected = Vec::new();
        while i < lines.len() && !skip(lines[i]) {
            expected.push(lines[i].to_owned());
            i += 1;
        }
        cases.push(Case {
            line: at,
            program,
            kind: Kind::Run { input, expected },
        });
    }
    cases
}

/// A JSON value for comparing, numbers kept as their text.
#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

/// Reads one JSON value (numbers kept as written; a repeated key keeps its last value).
fn parse(text: &str) -> Option<Json> {
    struct Reader<'a> {
        bytes: &'a [u8],
        at: usize,
    }
    impl Reader<'_> {
        fn ws(&mut self) {
            while self.bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
                self.at += 1;
            }
        }
        fn eat(&mut self, byte: u8) -> bool {
            self.ws();
            let found = self.bytes.get(self.at) == Some(&byte);
            if found {
                self.at += 1;
            }
            found
        }
        fn string(&mut self) -> Option<String> {
            let start = self.at;
            self.at += 1;
            while *self.bytes.get(self.at)? != b'"' {
                if self.bytes[self.at] == b'\\' {
                    self.at += 1;
                }
                self.at += 1;
            }
            self.at += 1;
            serde_json::from_slice(&self.bytes[start..self.at]).ok()
        }
        fn value(&mut self) -> Option<Json> {
            self.ws();
            Some(match *self.bytes.get(self.at)? {
                b'[' => {
                    self.at += 1;
                    let mut items = Vec::new();
                    if !self.eat(b']') {
                        loop {
                            items.push(self.value()?);
                            if self.eat(b']') {
                                break;
                            }
                            self.eat(b',').then_some(())?;
                        }
                    }
                    Json::Arr(items)
                }
                b'{' => {
                    self.at += 1;
                    let mut entries = BTreeMap::new();
                    if !self.eat(b'}') {
                        loop {
                            self.ws();
                            let key = self.string()?;
                            self.eat(b':').then_some(())?;
                            entries.insert(key, self.value()?);
                            if self.eat(b'}') {
                                break;
                            }
                            self.eat(b',').then_some(())?;
                        }
                    }
                    Json::Obj(entries)
                }
                b'"' => Json::Str(self.string()?),
                b'-' | b'0'..=b'9' => {
                    let start = self.at;
                    while self.bytes.get(self.at).is_some_and(|b| {
                        matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                    }) {
                        self.at += 1;
                    }
                    Json::Num(String::from_utf8_lossy(&self.bytes[start..self.at]).into())
                }
                _ => {
                    let rest = &self.bytes[self.at..];
                    let (word, value) = [
                        (&b"null"[..], Json::Null),
                        (b"true", Json::Bool(true)),
                        (b"false", Json::Bool(false)),
                        // jq's reader takes `nan`; as an expected output it is `null`.
                        (b"nan", Json::Null),
                    ]
                    .into_iter()
                    .find(|(word, _)| rest.starts_with(word))?;
                    self.at += word.len();
                    value
                }
            })
        }
    }
    let mut reader = Reader {
        bytes: text.as_bytes(),
        at: 0,
    };
    let value = reader.value()?;
    reader.ws();
    (reader.at == text.len()).then_some(value)
}

/// A number as a decimal: sign, significant digits without leading or trailing zeros, and
/// the exponent of the last digit.
fn decimal(literal: &str) -> (bool, String, i64) {
    let negative = literal.starts_with('-');
    let literal = literal.trim_start_matches('-');
    let (mantissa, exponent) = match literal.find(['e', 'E']) {
        Some(at) => (
            &literal[..at],
            literal[at + 1..].parse::<i64>().unwrap_or(0),
        ),
        None => (literal, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let mut exponent = exponent - frac.len() as i64;
    let trimmed = digits.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    exponent += (trimmed.len() - significant.len()) as i64;
    if significant.is_empty() {
        return (false, String::new(), 0);
    }
    (negative, significant.to_owned(), exponent)
}

/// jq's equality: numbers that passed through unchanged compare as decimals, computed ones as
/// doubles. Longer than a double's 17 digits, a number must match digit for digit.
fn numbers_equal(a: &str, b: &str) -> bool {
    let (da, db) = (decimal(a), decimal(b));
    if da == db {
        return true;
    }
    if da.1.len() > 17 || db.1.len() > 17 {
        return false;
    }
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Whether `a` equals `b`; with `loose_strings`, any two strings are equal (error texts).
fn equal(a: &Json, b: &Json, loose_strings: bool) -> bool {
    match (a, b) {
        (Json::Null, Json::Null) => true,
        (Json::Bool(x), Json::Bool(y)) => x == y,
        (Json::Num(x), Json::Num(y)) => numbers_equal(x, y),
        (Json::Str(x), Json::Str(y)) => loose_strings || x == y,
        (Json::Arr(x), Json::Arr(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| equal(x, y, loose_strings))
        }
        (Json::Obj(x), Json::Obj(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, x), (ky, y))| kx == ky && equal(x, y, loose_strings))
        }
        _ => false,
    }
}

/// Runs one case; `Err` when its outcome is not a pass, with what it gave.
fn run(case: &Case) -> (Outcome, String) {
    // The manual's examples read `$ENV.PAGER`, as a step whose `env:` sets it.
    let env = || [("PAGER".to_owned(), "less".to_owned())];
    let compiled = Jq::compile_with_env(&case.program, env());
    let (input, expected) = match (&case.kind, compiled) {
        (Kind::MustFail, Ok(_)) => return (Outcome::Compile, "compiles".into()),
        (Kind::MustFail, Err(_)) => return (Outcome::Pass, String::new()),
        (Kind::Run { .. }, Err(e)) => return (Outcome::Compile, e.to_string()),
        (Kind::Run { input, expected }, Ok(_)) => (input, expected),
    };
    let jq = Jq::compile_with_env(&case.program, env()).unwrap();
    let expected: Vec<Json> = expected
        .iter()
        .map(|e| parse(e).unwrap_or_else(|| panic!("line {}: expected {e:?}", case.line)))
        .collect();
    let (outputs, error) = jq.run_all(input.as_bytes());
    if let Some(error) = error.as_ref().filter(|_| outputs.is_empty())
        && error.kind == "invalid-json"
    {
        return (Outcome::Input, error.message.clone());
    }
    let actual: Vec<Json> = outputs
        .iter()
        .map(|o| parse(&String::from_utf8_lossy(o)).expect("outputs are JSON"))
        .collect();
    let shown = || {
        let mut shown: Vec<String> = outputs
            .iter()
            .map(|o| String::from_utf8_lossy(o).into_owned())
            .collect();
        if let Some(error) = &error {
            shown.push(format!("error: {}", error.message));
        }
        shown.join(" ")
    };
    // As jq's runner: the expected outputs, in order; an error after them does not count.
    let prefix = |loose| {
        actual.len() >= expected.len()
            && expected
                .iter()
                .zip(&actual)
                .all(|(e, a)| equal(e, a, loose))
    };
    let all_given = actual.len() == expected.len();
    if prefix(false) && all_given {
        (Outcome::Pass, String::new())
    } else if prefix(true) && all_given && case.program.contains("catch") {
        (Outcome::ErrorText, shown())
    } else if error.is_some() && actual.len() < expected.len() {
        (Outcome::Error, shown())
    } else {
        (Outcome::Wrong, shown())
    }
}

fn check_file(name: &str, goal_percent: usize) -> Result<String, String> {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    let cases = cases(&text);
    let results: Vec<(Outcome, String)> = cases
        .iter()
        .map(|case| {
            std::panic::catch_unwind(|| run(case))
                .unwrap_or_else(|_| (Outcome::Error, "the engine panicked".into()))
        })
        .collect();

    let mut report = String::new();
    let mut listed = String::new();
    let mut counts: BTreeMap<Outcome, usize> = BTreeMap::new();
    for (case, (outcome, gave)) in cases.iter().zip(&results) {
        *counts.entry(*outcome).or_default() += 1;
        if *outcome != Outcome::Pass {
            let gave: String = gave.chars().take(200).collect();
            let _ = writeln!(listed, "{}\t{}", outcome.tag(), case.program);
            let _ = writeln!(
                report,
                "{name}:{} {} `{}` gave: {gave}",
                case.line,
                outcome.tag(),
                case.program
            );
        }
    }
    let total = cases.len();
    let passed = counts.get(&Outcome::Pass).copied().unwrap_or(0);
    let error_text = counts.get(&Outcome::ErrorText).copied().unwrap_or(0);
    let summary = format!(
        "{name}: {passed}/{total} exactly, {} with error texts that differ; {counts:?}",
        passed + error_text
    );

    let list_path = fixtures().join(format!("{name}.differences"));
    if std::env::var_os("PLUMBER_JQ_COMPAT_WRITE").is_some() {
        let header = format!(
            "# The cases of {name} whose outputs differ from jq 1.8.2's, one a line: how they\n\
             # differ, a tab, the program. Why: processor/README.md (\"Compatibility with jq\n\
             # 1.8\"). Written by `PLUMBER_JQ_COMPAT_WRITE=1 cargo test -p plumber-processor\n\
             # --test jq_compat`; tests/jq_compat.rs fails when they differ otherwise.\n"
        );
        std::fs::write(&list_path, header + &listed).unwrap();
    }
    let expected_list = std::fs::read_to_string(&list_path).unwrap_or_default();
    let multiset = |text: &str| {
        let mut set: BTreeMap<(String, String), usize> = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (tag, program) = line.split_once('\t').unwrap_or((line, ""));
            assert!(Outcome::from_tag(tag).is_some(), "{line}");
            *set.entry((tag.to_owned(), program.to_owned())).or_default() += 1;
        }
        set
    };
    let (now, listed_before) = (multiset(&listed), multiset(&expected_list));
    let mut problems = String::new();
    for (key, n) in &now {
        let before = listed_before.get(key).copied().unwrap_or(0);
        if *n > before {
            let _ = writeln!(problems, "  now {}, not listed: `{}`", key.0, key.1);
        }
    }
    for (key, n) in &listed_before {
        let now = now.get(key).copied().unwrap_or(0);
        if *n > now {
            let _ = writeln!(
                problems,
                "  listed as {} but no longer so (update the list): `{}`",
                key.0, key.1
            );
        }
    }
    if (passed + error_text) * 100 < goal_percent * total {
        let _ = writeln!(problems, "  below the goal of {goal_percent} %");
    }
    if problems.is_empty() {
        Ok(summary)
    } else {
        Err(format!("{summary}\n{problems}\nall differences:\n{report}"))
    }
}

/// On a thread with a large stack: some cases build deep values.
fn on_big_stack(f: impl FnOnce() -> Result<String, String> + Send + 'static) {
    let result = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
    match result {
        Ok(summary) => eprintln!("{summary}"),
        Err(problems) => panic!("{problems}"),
    }
}

#[test]
fn jq_test_suite() {
    on_big_stack(|| check_file("jq.test", 95));
}

#[test]
fn jq_manual_examples() {
    on_big_stack(|| check_file("man.test", 98));
}
