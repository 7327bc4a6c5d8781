//! jq's own test suite (`tests/jq.test`, jq 1.8.2) and the examples of its manual
//! (`tests/man.test`) through the jq transform, exactly as a `jq:` step runs a program.
//!
//! Every case that does not give jq's result is listed in `fixtures/jq/<file>.differences`
//! with its input, jq's outputs and exactly what we give instead. The test fails when a case
//! gives anything other than what the list says (a case that passed and now fails, a listed
//! case that now passes or gives other outputs: the list is kept honest), and when fewer cases
//! pass than the goal (95 % of `jq.test`, 98 % of `man.test`, counting those that differ only
//! in the text of an error message). A case differs only in error text when our outputs are
//! jq's except for strings that our run got from a caught error (`catch`): a marked run of
//! the program tells those strings from the others (`mark_caught_errors`).
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
    /// The outputs are jq's except for strings that came from a caught error: the message
    /// jq caught, in words of our own.
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

/// Whether `a` equals `b`.
fn equal(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Null, Json::Null) => true,
        (Json::Bool(x), Json::Bool(y)) => x == y,
        (Json::Num(x), Json::Num(y)) => numbers_equal(x, y),
        (Json::Str(x), Json::Str(y)) => x == y,
        (Json::Arr(x), Json::Arr(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| equal(x, y))
        }
        (Json::Obj(x), Json::Obj(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, x), (ky, y))| kx == ky && equal(x, y))
        }
        _ => false,
    }
}

/// What a `catch` handler of a marked program receives in front of an error message.
const MARK: char = '\u{1}';

/// The program with every `catch` handler's input marked: `catch T` becomes `catch (if type
/// == "string" then "\u0001" + . else . end | T)`. Run on the same input, the marked program
/// gives the same outputs except that a message its handlers passed on starts with [`MARK`]:
/// so the strings of an output that came from a caught error can be told from the others.
/// `None` when a handler is not a simple term (a keyword, an operator): such a case is never
/// taken for an error-text difference.
fn mark_caught_errors(program: &str) -> Option<String> {
    let chars: Vec<char> = program.chars().collect();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    // The end of the string literal opening at `at`; interpolations (`\(…)`) are skipped as
    // escapes, which only matters for a `catch` inside one (then the marking fails to compile).
    let string_end = |mut at: usize| {
        at += 1;
        while at < chars.len() && chars[at] != '"' {
            at += if chars[at] == '\\' { 2 } else { 1 };
        }
        (at < chars.len()).then_some(at + 1)
    };
    // The end of the bracketed group opening at `at`.
    let group_end = |mut at: usize| {
        let mut depth = 0usize;
        while at < chars.len() {
            match chars[at] {
                '"' => {
                    at = string_end(at)?;
                    continue;
                }
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(at + 1);
                    }
                }
                _ => {}
            }
            at += 1;
        }
        None
    };
    let mut out = String::new();
    let mut at = 0;
    let mut marked = false;
    while at < chars.len() {
        let c = chars[at];
        if c == '"' {
            let end = string_end(at)?;
            out.extend(&chars[at..end]);
            at = end;
            continue;
        }
        let is_catch = chars[at..].starts_with(&['c', 'a', 't', 'c', 'h'])
            && (at == 0 || !word(chars[at - 1]))
            && chars.get(at + 5).is_none_or(|c| !word(*c));
        if !is_catch {
            out.push(c);
            at += 1;
            continue;
        }
        // The handler: a postfix term, that is literals, `.`, names, `$names` and bracketed
        // groups, up to the first space or operator outside brackets.
        let mut start = at + 5;
        while chars.get(start).is_some_and(|c| c.is_whitespace()) {
            start += 1;
        }
        let mut end = start;
        while let Some(&c) = chars.get(end) {
            end = match c {
                '(' | '[' | '{' => group_end(end)?,
                '"' => string_end(end)?,
                '.' | '?' | '$' => end + 1,
                c if word(c) => end + 1,
                _ => break,
            };
        }
        let handler: String = chars[start..end].iter().collect();
        let keyword = ["if", "try", "reduce", "foreach", "def", "label", "not"]
            .iter()
            .any(|k| handler.starts_with(k) && !handler[k.len()..].starts_with(word));
        if handler.is_empty() || keyword {
            return None;
        }
        out.push_str(r#"catch (if type == "string" then "\u0001" + . else . end | "#);
        out.push_str(&handler);
        out.push(')');
        marked = true;
        at = end;
    }
    marked.then_some(out)
}

/// Whether `ours` is jq's `expected` but for strings that came from a caught error, in
/// wording of their own; `marked` is `ours` as the program of [`mark_caught_errors`] gave it.
fn equal_but_error_texts(expected: &Json, ours: &Json, marked: &Json) -> bool {
    match (expected, ours, marked) {
        // A caught message may say what jq says in other words; any other string is jq's.
        (Json::Str(e), Json::Str(o), Json::Str(m)) => match m.strip_prefix(MARK) {
            Some(caught) => caught == o,
            None => e == o && m == o,
        },
        (Json::Arr(e), Json::Arr(o), Json::Arr(m)) => {
            e.len() == o.len()
                && o.len() == m.len()
                && e.iter()
                    .zip(o)
                    .zip(m)
                    .all(|((e, o), m)| equal_but_error_texts(e, o, m))
        }
        (Json::Obj(e), Json::Obj(o), Json::Obj(m)) => {
            e.len() == o.len()
                && o.len() == m.len()
                && e.iter().zip(o).zip(m).all(|(((ke, e), (ko, o)), (km, m))| {
                    ke == ko && ko == km && equal_but_error_texts(e, o, m)
                })
        }
        _ => equal(expected, ours) && equal(ours, marked),
    }
}

/// What one case gave: its outcome, our outputs as we wrote them, and the error that ended
/// the run (or the compile error).
struct Gave {
    outcome: Outcome,
    outputs: Vec<String>,
    error: Option<String>,
}

impl Gave {
    fn new(outcome: Outcome, outputs: Vec<String>, error: Option<String>) -> Self {
        Gave {
            outcome,
            outputs,
            error,
        }
    }
}

/// The manual's examples read `$ENV.PAGER`, as a step whose `env:` sets it.
fn compile(program: &str) -> Result<Jq, String> {
    Jq::compile_with_env(program, [("PAGER".to_owned(), "less".to_owned())])
        .map_err(|e| e.to_string())
}

/// Runs a compiled program: its outputs, and the error that ended it.
fn run_program(
    jq: &Jq,
    input: &str,
) -> (Vec<String>, Option<plumber_processor::record::Rejection>) {
    let (outputs, error) = jq.run_all(input.as_bytes());
    let outputs = outputs
        .iter()
        .map(|o| String::from_utf8_lossy(o).into_owned())
        .collect();
    (outputs, error)
}

/// Runs one case.
fn run(case: &Case) -> Gave {
    let compiled = compile(&case.program);
    let (input, expected, jq) = match (&case.kind, compiled) {
        (Kind::MustFail, Ok(_)) => return Gave::new(Outcome::Compile, vec![], None),
        (Kind::MustFail, Err(_)) => return Gave::new(Outcome::Pass, vec![], None),
        (Kind::Run { .. }, Err(e)) => return Gave::new(Outcome::Compile, vec![], Some(e)),
        (Kind::Run { input, expected }, Ok(jq)) => (input, expected, jq),
    };
    let expected: Vec<Json> = expected
        .iter()
        .map(|e| parse(e).unwrap_or_else(|| panic!("line {}: expected {e:?}", case.line)))
        .collect();
    let (outputs, error) = run_program(&jq, input);
    let message = error.as_ref().map(|e| e.message.clone());
    if outputs.is_empty()
        && let Some(error) = &error
        && error.kind == "invalid-json"
    {
        return Gave::new(Outcome::Input, outputs, message);
    }
    let actual: Vec<Json> = outputs
        .iter()
        .map(|o| parse(o).expect("outputs are JSON"))
        .collect();
    // As jq's runner: the expected outputs, in order; an error after them does not count.
    let all_given = actual.len() == expected.len();
    if all_given && expected.iter().zip(&actual).all(|(e, a)| equal(e, a)) {
        return Gave::new(Outcome::Pass, outputs, message);
    }
    let error_texts = || {
        let marked = mark_caught_errors(&case.program)?;
        let (marked, _) = run_program(&compile(&marked).ok()?, input);
        let marked: Vec<Json> = marked.iter().map(|m| parse(m)).collect::<Option<_>>()?;
        Some(
            marked.len() == actual.len()
                && expected
                    .iter()
                    .zip(&actual)
                    .zip(&marked)
                    .all(|((e, a), m)| equal_but_error_texts(e, a, m)),
        )
    };
    let outcome = if all_given && error_texts() == Some(true) {
        Outcome::ErrorText
    } else if error.is_some() && actual.len() < expected.len() {
        Outcome::Error
    } else {
        Outcome::Wrong
    };
    Gave::new(outcome, outputs, message)
}

/// One case that does not give jq's result, as the list of differences holds it. Two entries
/// are the same difference when all but `line` are equal: the program, its input, what jq
/// gives (the expected lines of the test file) and exactly what we give.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Difference {
    /// How it differs (an [`Outcome`] tag).
    how: String,
    /// Where in the test file; for readers, not compared.
    line: usize,
    program: String,
    /// None for a `%%FAIL` case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input: Option<String>,
    /// jq's outputs as the test file writes them; `["%%FAIL"]` when jq refuses the program.
    jq: Vec<String>,
    /// Our outputs as the step writes them.
    ours: Vec<String>,
    /// The error that ended our run, or why the program does not compile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Difference {
    fn new(case: &Case, gave: &Gave) -> Self {
        let (input, jq) = match &case.kind {
            Kind::Run { input, expected } => (Some(input.clone()), expected.clone()),
            Kind::MustFail => (None, vec!["%%FAIL".to_owned()]),
        };
        Difference {
            how: gave.outcome.tag().to_owned(),
            line: case.line,
            program: case.program.clone(),
            input,
            jq,
            ours: gave.outputs.clone(),
            error: gave.error.clone(),
        }
    }

    /// What identifies the difference: everything but where it is.
    fn key(&self) -> Difference {
        Difference {
            line: 0,
            ..self.clone()
        }
    }
}

fn check_file(name: &str, goal_percent: usize) -> Result<String, String> {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    let cases = cases(&text);
    let results: Vec<Gave> = cases
        .iter()
        .map(|case| {
            std::panic::catch_unwind(|| run(case)).unwrap_or_else(|_| {
                Gave::new(Outcome::Error, vec![], Some("the engine panicked".into()))
            })
        })
        .collect();

    let mut report = String::new();
    let mut differences = Vec::new();
    let mut counts: BTreeMap<Outcome, usize> = BTreeMap::new();
    for (case, gave) in cases.iter().zip(&results) {
        *counts.entry(gave.outcome).or_default() += 1;
        if gave.outcome != Outcome::Pass {
            let difference = Difference::new(case, gave);
            let _ = writeln!(
                report,
                "{name}:{} {}",
                case.line,
                serde_json::to_string(&difference).unwrap()
            );
            differences.push(difference);
        }
    }
    let total = cases.len();
    let passed = counts.get(&Outcome::Pass).copied().unwrap_or(0);
    let error_text = counts.get(&Outcome::ErrorText).copied().unwrap_or(0);
    let summary = format!(
        "{name}: {passed}/{total} exactly ({:.1} %), {} counting error texts in other words; {counts:?}",
        passed as f64 * 100.0 / total as f64,
        passed + error_text
    );

    let list_path = fixtures().join(format!("{name}.differences"));
    if std::env::var_os("PLUMBER_JQ_COMPAT_WRITE").is_some() {
        let mut list = format!(
            "# The cases of {name} whose outputs differ from jq 1.8.2's, one JSON object a line:\n\
             # how they differ, the line in {name}, the program, its input, jq's outputs as\n\
             # {name} has them, ours exactly as a step writes them, and the error that ended\n\
             # our run. Why: processor/README.md (\"Compatibility with jq 1.8\"). Written by\n\
             # `PLUMBER_JQ_COMPAT_WRITE=1 cargo test -p plumber-processor --test jq_compat`;\n\
             # tests/jq_compat.rs fails when a case gives anything else than its line says.\n"
        );
        for difference in &differences {
            list.push_str(&serde_json::to_string(difference).unwrap());
            list.push('\n');
        }
        std::fs::write(&list_path, list).unwrap();
    }
    let expected_list = std::fs::read_to_string(&list_path).unwrap_or_default();
    let mut listed: BTreeMap<Difference, usize> = BTreeMap::new();
    for line in expected_list
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let difference: Difference = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}: {e}: {line}", list_path.display()));
        assert!(Outcome::from_tag(&difference.how).is_some(), "{line}");
        *listed.entry(difference.key()).or_default() += 1;
    }
    let mut now: BTreeMap<Difference, usize> = BTreeMap::new();
    for difference in &differences {
        *now.entry(difference.key()).or_default() += 1;
    }
    let mut problems = String::new();
    for difference in &differences {
        let key = difference.key();
        if now[&key] > listed.get(&key).copied().unwrap_or(0) {
            let _ = writeln!(
                problems,
                "  {name}:{} gives what the list does not say: {}",
                difference.line,
                serde_json::to_string(difference).unwrap()
            );
        }
    }
    for (key, n) in &listed {
        if *n > now.get(key).copied().unwrap_or(0) {
            let _ = writeln!(
                problems,
                "  listed but no longer given (update the list): {}",
                serde_json::to_string(key).unwrap()
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

fn case(program: &str, input: &str, expected: &[&str]) -> Case {
    Case {
        line: 0,
        program: program.to_owned(),
        kind: Kind::Run {
            input: input.to_owned(),
            expected: expected.iter().map(|e| (*e).to_owned()).collect(),
        },
    }
}

/// Only a string our run caught from an error may differ in words: any other string that
/// differs is a wrong output, `catch` in the program or not.
#[test]
fn only_caught_error_messages_count_as_error_texts() {
    let outcome = |program, expected: &[&str]| run(&case(program, "[1]", expected)).outcome;
    let caught = r#"try error("ours") catch ."#;
    assert_eq!(outcome(caught, &[r#""ours""#]), Outcome::Pass);
    assert_eq!(outcome(caught, &[r#""jq's""#]), Outcome::ErrorText);
    // Inside other outputs, beside strings that must match.
    let inside = r#""a", (.[] | try error("ours") catch ["KO", ., "b"])"#;
    assert_eq!(
        outcome(inside, &[r#""a""#, r#"["KO", "jq's", "b"]"#]),
        Outcome::ErrorText
    );
    assert_eq!(
        outcome(inside, &[r#""x""#, r#"["KO", "ours", "b"]"#]),
        Outcome::Wrong,
        "a string beside the caught one"
    );
    assert_eq!(
        outcome(inside, &[r#""a""#, r#"["KO", "jq's", "x"]"#]),
        Outcome::Wrong,
        "a string in the handler's output that is not the message"
    );
    assert_eq!(
        outcome(r#"try "ours" catch ."#, &[r#""jq's""#]),
        Outcome::Wrong,
        "a try body's output is no error message"
    );
    assert_eq!(
        outcome(caught, &[r#""jq's""#, "1"]),
        Outcome::Wrong,
        "fewer outputs"
    );
    // A handler that is no simple term is never taken for one.
    assert_eq!(
        outcome(
            r#"try error("ours") catch if true then . else 0 end"#,
            &[r#""jq's""#]
        ),
        Outcome::Wrong
    );
    assert_eq!(
        mark_caught_errors(r#""catch" | try .a catch .b[0], (try 1 catch ["x", .])"#).as_deref(),
        Some(concat!(
            r#""catch" | try .a catch (if type == "string" then "\u0001" + . else . end | .b[0]), "#,
            r#"(try 1 catch (if type == "string" then "\u0001" + . else . end | ["x", .]))"#
        ))
    );
}
