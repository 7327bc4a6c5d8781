//! jq syntax that jaq's parser lacks, rewritten into jq that it has, before parsing:
//!
//! - `$__loc__` becomes `{"file":"<top-level>","line":N}`, the line it is on;
//! - destructuring alternatives `E as P1 ?// P2 | BODY` become `E as $v | try ($v as P1 |
//!   BODY) catch (… $v as P2 | BODY)`, every variable of every pattern bound to null first,
//!   which is what jq does: the next pattern is tried when destructuring or the body fails;
//! - object keys that are constant non-strings (`{(0): 1}`) are refused, as jq refuses them;
//! - `import`, `include` and `module` are refused: a step is one program, with no files.

use jaq_core::load::Lexer;
use jaq_core::load::lex::{StrPart, Tok, Token};

/// The program with jq's syntax rewritten, or why jq would refuse it.
pub fn rewrite(program: &str) -> Result<String, String> {
    let mut program = program.to_owned();
    // Programs that do not lex are left to the parser to report.
    let Ok(tokens) = Lexer::new(program.as_str()).lex() else {
        return Ok(program);
    };
    if let Some(Token(word @ ("import" | "include" | "module"), Tok::Word)) = tokens.first() {
        return Err(format!(
            "`{word}` is not supported: a jq step is one program, without module files; \
             define what you need with `def` in the program"
        ));
    }
    refuse_constant_keys(&tokens)?;
    let mut edits = Vec::new();
    locations(&program, &tokens, &mut edits);
    small_syntax(&program, &tokens, &mut edits);
    program = apply(&program, edits);
    // One alternative at a time: each rewrite copies the body, which may hold more, so nested
    // alternatives multiply the program: bounded, so that a program cannot exhaust memory.
    // Every rewrite makes the program longer, so this ends.
    let most = 16 * program.len() + (64 << 10);
    loop {
        if program.len() > most {
            return Err(
                "too many nested destructuring alternatives (`?//`): each copies the \
                        rest of the program; nest fewer"
                    .into(),
            );
        }
        let Ok(tokens) = Lexer::new(program.as_str()).lex() else {
            break;
        };
        match alternatives(&program, &tokens) {
            Some(edit) => program = apply(&program, vec![edit]),
            None => break,
        }
    }
    Ok(program)
}

type Edit = (std::ops::Range<usize>, String);

fn apply(program: &str, mut edits: Vec<Edit>) -> String {
    edits.sort_by_key(|(range, _)| std::cmp::Reverse(range.start));
    let mut out = program.to_owned();
    for (range, text) in edits {
        out.replace_range(range, &text);
    }
    out
}

fn span(program: &str, token: &Token<&str>) -> std::ops::Range<usize> {
    jaq_core::load::span(program, token.0)
}

/// Calls `f` on every list of tokens: the program's, each block's, each interpolation's.
fn each_list<'a>(tokens: &'a [Token<&'a str>], f: &mut impl FnMut(&'a [Token<&'a str>])) {
    f(tokens);
    for token in tokens {
        match &token.1 {
            Tok::Block(inner) => each_list(inner, f),
            Tok::Str(parts) => {
                for part in parts {
                    if let StrPart::Term(Token(_, Tok::Block(inner))) = part {
                        each_list(inner, f);
                    }
                }
            }
            _ => {}
        }
    }
}

fn is_sym(token: Option<&Token<&str>>, sym: &str) -> bool {
    matches!(token, Some(Token(s, Tok::Sym)) if *s == sym)
}

fn is_word(token: Option<&Token<&str>>, word: &str) -> bool {
    matches!(token, Some(Token(s, Tok::Word)) if *s == word)
}

fn refuse_constant_keys(tokens: &[Token<&str>]) -> Result<(), String> {
    let mut found = None;
    each_list(tokens, &mut |list| {
        let object = matches!(list.first(), Some(Token(s, _)) if list.len() > 1 && !s.is_empty())
            && found.is_none();
        if !object {
            return;
        }
        for (i, token) in list.iter().enumerate() {
            let Token(text, Tok::Block(inner)) = token else {
                continue;
            };
            let entry_start = i == 0 || is_sym(list.get(i - 1), ",");
            if !text.starts_with('(') || !entry_start || !is_sym(list.get(i + 1), ":") {
                continue;
            }
            // `(KEY)` holds KEY and the closing parenthesis.
            if let [key, _close] = inner.as_slice() {
                let kind = match key {
                    Token(_, Tok::Num) => "number",
                    Token("true" | "false", Tok::Word) => "boolean",
                    Token("null", Tok::Word) => "null",
                    _ => continue,
                };
                found = Some(format!("Cannot use {kind} ({}) as object key", key.0));
            }
        }
    });
    found.map_or(Ok(()), Err)
}

/// `.5` (a number) becomes `0.5`; `{$name: pattern}` in a destructuring pattern becomes
/// `{$name, "name": pattern}`.
fn small_syntax(program: &str, tokens: &[Token<&str>], edits: &mut Vec<Edit>) {
    each_list(tokens, &mut |list| {
        for (i, token) in list.iter().enumerate() {
            if let (Token(".", Tok::Sym), Some(number @ Token(_, Tok::Num))) =
                (token, list.get(i + 1))
                && span(program, token).end == span(program, number).start
            {
                edits.push((span(program, token), "0.".into()));
            }
        }
    });
    pattern_keys(program, tokens, false, edits);
    // `reduce E as …` and `foreach E as …` where E is more than a term (`.[] / .[]`), which
    // jq takes and jaq's parser does not: E in parentheses.
    each_list(tokens, &mut |list| {
        for (i, token) in list.iter().enumerate() {
            if !(is_word(Some(token), "reduce") || is_word(Some(token), "foreach")) {
                continue;
            }
            let Some(as_at) = (i + 1..list.len()).find(|&j| is_word(list.get(j), "as")) else {
                continue;
            };
            if as_at > i + 2 {
                let (first, last) = (&list[i + 1], &list[as_at - 1]);
                edits.push((
                    span(program, first).start..span(program, first).start,
                    "(".into(),
                ));
                edits.push((span(program, last).end..span(program, last).end, ")".into()));
            }
        }
    });
}

fn pattern_keys(program: &str, list: &[Token<&str>], pattern: bool, edits: &mut Vec<Edit>) {
    for (i, token) in list.iter().enumerate() {
        match &token.1 {
            Tok::Block(inner) => {
                let after_as = i > 0 && is_word(list.get(i - 1), "as")
                    || i > 1 && is_sym(list.get(i - 1), "//") && is_sym(list.get(i - 2), "?");
                let pattern = (pattern || after_as) && !token.0.starts_with('(');
                if pattern && token.0.starts_with('{') {
                    for (j, entry) in inner.iter().enumerate() {
                        if let Token(name, Tok::Var) = entry
                            && is_sym(inner.get(j + 1), ":")
                            && (j == 0 || is_sym(inner.get(j - 1), ","))
                        {
                            let key = format!("{name}, \"{}\"", &name[1..]);
                            edits.push((span(program, entry), key));
                        }
                    }
                }
                pattern_keys(program, inner, pattern, edits);
            }
            Tok::Str(parts) => {
                for part in parts {
                    if let StrPart::Term(Token(_, Tok::Block(inner))) = part {
                        pattern_keys(program, inner, false, edits);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Edits that replace every `$__loc__` with its location.
fn locations(program: &str, tokens: &[Token<&str>], edits: &mut Vec<Edit>) {
    each_list(tokens, &mut |list| {
        for (i, token) in list.iter().enumerate() {
            if !matches!(token, Token("$__loc__", Tok::Var)) {
                continue;
            }
            let range = span(program, token);
            let line = program[..range.start].matches('\n').count() + 1;
            let location = format!("{{\"file\":\"<top-level>\",\"line\":{line}}}");
            // `{$__loc__}` is shorthand for `{"__loc__": $__loc__}`.
            let in_object = program[..range.start].trim_end().ends_with(['{', ','])
                && (is_sym(list.get(i + 1), ",") || is_sym(list.get(i + 1), "}"))
                && (i == 0 || is_sym(list.get(i - 1), ","));
            let text = if in_object {
                format!("\"__loc__\": {location}")
            } else {
                location
            };
            edits.push((range, text));
        }
    });
}

/// The edit that rewrites the first destructuring alternative (`?//`) found.
fn alternatives(program: &str, tokens: &[Token<&str>]) -> Option<Edit> {
    let mut edit = None;
    each_list(tokens, &mut |list| {
        if edit.is_none() {
            edit = alternatives_in(program, list);
        }
    });
    edit
}

fn alternatives_in(program: &str, list: &[Token<&str>]) -> Option<Edit> {
    let first_alt =
        (0..list.len()).find(|&i| is_sym(list.get(i), "?") && is_sym(list.get(i + 1), "//"))?;
    let as_at = (0..first_alt).rev().find(|&i| is_word(list.get(i), "as"))?;
    // The patterns: between `as` and each `?//`, and the last one up to `|`.
    let mut patterns = Vec::new();
    let mut start = as_at + 1;
    let mut i = start;
    let pipe = loop {
        let token = list.get(i)?;
        if is_sym(Some(token), "?") && is_sym(list.get(i + 1), "//") {
            patterns.push(start..i);
            i += 2;
            start = i;
        } else if is_sym(Some(token), "|") {
            patterns.push(start..i);
            break i;
        } else {
            i += 1;
        }
    };
    // The body extends as far as a pipe does: to the end of the enclosing block, or to a
    // `;`, `then`, `elif`, `else`, `end` or `catch` that does not belong to it.
    let mut depth = 0usize;
    let mut end = pipe + 1;
    while let Some(token) = list.get(end) {
        let closing = end + 1 == list.len() && matches!(token.0, ")" | "]" | "}");
        if closing {
            break;
        }
        match token {
            Token("if" | "def", Tok::Word) => depth += 1,
            Token("end", Tok::Word) | Token(";", Tok::Sym) if depth > 0 => depth -= 1,
            Token("then" | "elif" | "else" | "end" | "catch", Tok::Word) | Token(";", Tok::Sym)
                if depth == 0 =>
            {
                break;
            }
            _ => {}
        }
        end += 1;
    }
    let text = |range: std::ops::Range<usize>| -> &str {
        match (
            list.get(range.start),
            range.end.checked_sub(1).and_then(|e| list.get(e)),
        ) {
            (Some(first), Some(last)) => {
                &program[span(program, first).start..span(program, last).end]
            }
            _ => "",
        }
    };
    let body = text(pipe + 1..end);
    let mut variables: Vec<&str> = Vec::new();
    for pattern in &patterns {
        each_list(&list[pattern.clone()], &mut |tokens| {
            for token in tokens {
                if let Token(name, Tok::Var) = token
                    && !variables.contains(name)
                {
                    variables.push(name);
                }
            }
        });
    }
    let mut rewritten = String::from("as $__plumber_alt | . as $__plumber_dot | ");
    for variable in &variables {
        rewritten.push_str(&format!("null as {variable} | "));
    }
    let last = patterns.len() - 1;
    for (n, pattern) in patterns.iter().enumerate() {
        let attempt = format!("$__plumber_alt as {} | {body}", text(pattern.clone()));
        if n < last {
            rewritten.push_str(&format!("try ({attempt}) catch ($__plumber_dot | "));
        } else {
            rewritten.push_str(&format!("{attempt}{}", ")".repeat(last)));
        }
    }
    let from = span(program, &list[as_at]).start;
    let to = if end > pipe + 1 {
        span(program, &list[end - 1]).end
    } else {
        span(program, &list[pipe]).end
    };
    Some((from..to, rewritten))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_name_their_line() {
        assert_eq!(
            rewrite("1 |\n$__loc__").unwrap(),
            "1 |\n{\"file\":\"<top-level>\",\"line\":2}"
        );
        assert_eq!(
            rewrite("{a, $__loc__}").unwrap(),
            "{a, \"__loc__\": {\"file\":\"<top-level>\",\"line\":1}}"
        );
        assert_eq!(rewrite("\"$__loc__\"").unwrap(), "\"$__loc__\"");
    }

    #[test]
    fn alternatives_become_try_catch() {
        let rewritten = rewrite(".[] as [$a] ?// $a | $a").unwrap();
        assert_eq!(
            rewritten,
            ".[] as $__plumber_alt | . as $__plumber_dot | null as $a | try ($__plumber_alt \
             as [$a] | $a) catch ($__plumber_dot | $__plumber_alt as $a | $a)"
        );
    }

    #[test]
    fn nested_alternatives_cannot_grow_without_bound() {
        let nested = (0..24).fold(String::from("$x0"), |body, i| {
            format!(". as [$x{i}] ?// $y{i} | ({body})")
        });
        let err = rewrite(&nested).unwrap_err();
        assert!(err.contains("nest fewer"), "{err}");
    }

    #[test]
    fn what_jq_refuses_is_refused() {
        assert!(rewrite("{(0): 1}").is_err());
        assert!(rewrite(". as {(true): $x} | $x").is_err());
        assert!(rewrite("{(\"a\"): 1}").is_ok());
        assert!(rewrite("import \"a\" as a; .").is_err());
        assert!(rewrite("include \"a\"; .").is_err());
    }
}
