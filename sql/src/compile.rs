//! From SQL text to a [`Query`]: parsed by sqlparser, then checked against what a stateless
//! step can do, every problem reported at its line and column in the query.

use std::collections::HashMap;

use sqlparser::ast::{
    self, BinaryOperator, CastKind, CeilFloorKind, DataType, DateTimeField, ExactNumberInfo,
    FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident, InTarget, ObjectName,
    ObjectNamePart, SelectItem, SetExpr, SetOperator, SetQuantifier, Spanned, Statement,
    TableFactor, TrimWhereField, UnaryOperator,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Location, Span, Token, TokenWithSpan, Tokenizer};

use crate::aggregate::{AggFunc, AggSpec, Aggregation, StateDefinition, Window, WindowKind};
use crate::expr::{CmpOp, Expr, Row, Snippet};
use crate::func::{self, Func, Side, SqlType};
use crate::join::Join;
use crate::value::{Arith, Value};
use crate::{Arm, Column, Query};

/// Queries with more tokens than this are refused before they are parsed. Real step queries
/// stay far below; the bound keeps a huge query (a step file holds up to 1 MiB) from building
/// a syntax tree deep enough to exhaust the stack.
pub const MAX_TOKENS: usize = 4096;

/// Expressions nested deeper than this are refused (each operator, function call and
/// parenthesis is a level).
pub const MAX_DEPTH: usize = 128;

/// The most windows of a HOP one record falls in (its size over its advance): each is a
/// group the record updates and state it holds, so a step file cannot make one record cost
/// millions.
pub const MAX_HOPS: i64 = 1_000;

/// Snippets of the query in runtime error messages are cut at this many characters.
const SNIPPET_CHARS: usize = 60;

/// A problem of a query, at a 1-based line and column (in characters) of its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl Problem {
    fn at(location: Location, message: impl Into<String>) -> Self {
        let (line, column) = if location.line == 0 {
            (1, 1)
        } else {
            (location.line, location.column.max(1))
        };
        Problem {
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(column).unwrap_or(u32::MAX),
            message: message.into(),
        }
    }
}

impl Problem {
    /// Every problem of a query on one line, each at its line and column.
    pub fn all(problems: &[Problem]) -> String {
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

const START: Location = Location { line: 1, column: 1 };

const ONE_RECORD: &str = "a SQL step sees one record at a time";

/// Keywords that cannot be field names unless quoted.
const RESERVED: [&str; 27] = [
    "SELECT", "FROM", "WHERE", "GROUP", "ORDER", "BY", "HAVING", "LIMIT", "UNION", "ALL", "AND",
    "OR", "NOT", "AS", "ON", "JOIN", "CASE", "WHEN", "THEN", "ELSE", "END", "IS", "NULL", "IN",
    "BETWEEN", "LIKE", "DISTINCT",
];

/// The stack of the thread a query is compiled on. sqlparser's syntax tree is recursive and
/// its frames are large (a few KiB per level in debug builds), and a long chain such as
/// `a + b + c + …` nests one level per operator: [`MAX_TOKENS`] bounds the depth, this bounds
/// the stack it needs. Only touched pages take memory.
const COMPILE_STACK_BYTES: usize = 64 * 1024 * 1024;

/// What a query compiles to: stateless (one record in, its outputs out) or stateful (a
/// `GROUP BY`: see [`Aggregation`]; a JOIN: see [`Join`]).
#[derive(Debug)]
pub enum Compiled {
    Stateless(Query),
    Stateful(Box<Aggregation>),
    Join(Box<Join>),
}

pub fn compile(sql: &str, inputs: Option<&[&str]>) -> Result<Query, Vec<Problem>> {
    match compile_any(sql, inputs, false)? {
        Compiled::Stateless(query) => Ok(query),
        // A stateless compile refuses GROUP BY and JOIN before it gets here.
        Compiled::Stateful(_) | Compiled::Join(_) => Err(vec![Problem::at(
            START,
            "GROUP BY and JOIN need a stateful step",
        )]),
    }
}

impl Aggregation {
    /// Compiles a query with `GROUP BY`; problems at their line and column, as
    /// [`crate::Query::compile`] (a query without GROUP BY is one, too: it is stateless).
    pub fn compile(sql: &str, inputs: Option<&[&str]>) -> Result<Aggregation, Vec<Problem>> {
        match compile_any(sql, inputs, true)? {
            Compiled::Stateful(aggregation) => Ok(*aggregation),
            _ => Err(vec![Problem {
                line: 1,
                column: 1,
                message: "the query has no GROUP BY".into(),
            }]),
        }
    }
}

impl Join {
    /// Compiles a query with a JOIN; problems at their line and column.
    pub fn compile(sql: &str, inputs: Option<&[&str]>) -> Result<Join, Vec<Problem>> {
        match compile_any(sql, inputs, true)? {
            Compiled::Join(join) => Ok(*join),
            _ => Err(vec![Problem {
                line: 1,
                column: 1,
                message: "the query has no JOIN".into(),
            }]),
        }
    }
}

/// Compiles a step's query, whichever kind it is (`stateful`: whether GROUP BY and JOIN are
/// taken; when false they are refused at their line and column, naming the docs).
pub fn compile_any(
    sql: &str,
    inputs: Option<&[&str]>,
    stateful: bool,
) -> Result<Compiled, Vec<Problem>> {
    std::thread::scope(|scope| {
        let compiling = std::thread::Builder::new()
            .name("sql-compile".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, || compile_here(sql, inputs, stateful));
        match compiling {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // Out of threads or memory: this thread's stack is the best there is.
            Err(_) => compile_here(sql, inputs, stateful),
        }
    })
}

fn compile_here(
    sql: &str,
    inputs: Option<&[&str]>,
    stateful: bool,
) -> Result<Compiled, Vec<Problem>> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| {
            vec![Problem::at(
                e.location,
                format!("syntax error: {}", e.message),
            )]
        })?;
    let mut significant = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF));
    if significant.clone().next().is_none() {
        return Err(vec![Problem::at(
            START,
            "the query is empty; write `SELECT … FROM <input step>`",
        )]);
    }
    if let Some(past) = significant.nth(MAX_TOKENS) {
        return Err(vec![Problem::at(
            past.span.start,
            format!("the query has more than {MAX_TOKENS} tokens; split the step"),
        )]);
    }
    let statements = Parser::new(&dialect)
        .with_tokens_with_locations(tokens.clone())
        .parse_statements()
        .map_err(|e| vec![hint_quoting(parser_problem(e, end_of(&tokens)), &tokens)])?;

    let mut compiler = Compiler {
        sql,
        tokens: &tokens,
        problems: Vec::new(),
        paths: Vec::new(),
        path_index: HashMap::new(),
        qualifier: None,
        arms: Vec::new(),
        arm_names: Vec::new(),
        too_deep: false,
        select_aliases: Vec::new(),
        stateful,
        output: None,
        aggregation: None,
        join: None,
        table_qualifier: None,
        on_side: false,
        path_sides: Vec::new(),
        reads: Vec::new(),
    };
    match statements.as_slice() {
        [] => compiler.problem(
            START,
            "the query is empty; write `SELECT … FROM <input step>`",
        ),
        [statement] => compiler.statement(statement),
        [_, second, ..] => compiler.problem(
            second.span().start,
            "a SQL step runs one SELECT; remove the `;` and what follows",
        ),
    }
    if let Some(inputs) = inputs {
        compiler.check_inputs(inputs);
    }
    let Compiler {
        mut problems,
        arms,
        paths,
        aggregation,
        join,
        path_sides,
        ..
    } = compiler;
    // A syntax error sqlparser let through makes the other findings noise.
    if problems
        .iter()
        .any(|p| p.message.starts_with("syntax error"))
    {
        problems.retain(|p| p.message.starts_with("syntax error"));
    }
    if problems.is_empty() {
        Ok(match (aggregation, join) {
            (Some(mut aggregation), _) => {
                aggregation.paths = paths;
                Compiled::Stateful(Box::new(aggregation))
            }
            (None, Some(mut join)) => {
                join.paths = paths;
                join.table_paths = path_sides;
                Compiled::Join(Box::new(join))
            }
            (None, None) => Compiled::Stateless(Query { arms, paths }),
        })
    } else {
        problems.sort_by_key(|p| (p.line, p.column));
        problems.dedup();
        Err(problems)
    }
}

/// `FROM raw-clicks` reads as a subtraction: say how step names with `-` are written.
fn hint_quoting(mut problem: Problem, tokens: &[TokenWithSpan]) -> Problem {
    let significant: Vec<&TokenWithSpan> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    let at = significant.iter().position(|t| {
        (t.span.start.line, t.span.start.column)
            == (u64::from(problem.line), u64::from(problem.column))
    });
    if let Some(at) = at.filter(|&at| at >= 2)
        && significant[at].token == Token::Minus
        && let (Token::Word(name), Token::Word(from)) =
            (&significant[at - 1].token, &significant[at - 2].token)
        && from.keyword == Keyword::FROM
    {
        let next = match significant.get(at + 1).map(|t| &t.token) {
            Some(Token::Word(w)) => format!("-{}", w.value),
            _ => String::new(),
        };
        problem.message.push_str(&format!(
            "; a step name with `-` is written in double quotes: FROM \"{}{next}\"",
            name.value
        ));
    }
    problem
}

/// Where the last token of the query ends.
fn end_of(tokens: &[TokenWithSpan]) -> Location {
    tokens
        .iter()
        .rev()
        .find(|t| !matches!(t.token, Token::Whitespace(_) | Token::EOF))
        .map_or(START, |t| t.span.end)
}

/// sqlparser puts the location at the end of its messages: " at Line: 1, Column: 8"; an
/// error at the end of the query has none.
fn parser_problem(error: ParserError, end: Location) -> Problem {
    let message = match error {
        ParserError::TokenizerError(m) | ParserError::ParserError(m) => m,
        ParserError::RecursionLimitExceeded => {
            return Problem::at(
                START,
                "the query nests too deeply for the SQL parser; simplify it",
            );
        }
    };
    let (text, location) = match message.rsplit_once(" at Line: ") {
        Some((text, at)) => {
            let mut numbers = at.split(", Column: ").map(|n| n.trim().parse::<u64>());
            match (numbers.next(), numbers.next()) {
                (Some(Ok(line)), Some(Ok(column))) => (text.to_owned(), Location { line, column }),
                _ => (message.clone(), START),
            }
        }
        None if message.ends_with("found: EOF") => (
            message.replace("found: EOF", "found the end of the query"),
            end,
        ),
        None => (message.clone(), START),
    };
    Problem::at(location, format!("syntax error: {text}"))
}

struct Compiler<'q> {
    sql: &'q str,
    tokens: &'q [TokenWithSpan],
    problems: Vec<Problem>,
    paths: Vec<Vec<String>>,
    path_index: HashMap<(bool, Vec<String>), usize>,
    /// The name fields may be qualified with in the arm being compiled (FROM name or alias).
    qualifier: Option<String>,
    arms: Vec<Arm>,
    /// Column names of each arm without `*`, and where the arm starts, to check that the arms
    /// of a UNION ALL name their columns alike.
    arm_names: Vec<(Location, Option<Vec<String>>)>,
    /// Whether a too deep expression was reported (once is enough).
    too_deep: bool,
    /// While compiling a WHERE: the names SELECT gives to something other than the field of
    /// that name, which a bare name in WHERE does not mean.
    select_aliases: Vec<String>,
    /// Whether GROUP BY is allowed (a stateful query).
    stateful: bool,
    /// While compiling the columns or HAVING of a GROUP BY: what they may read.
    output: Option<OutputScope>,
    /// The GROUP BY query compiled, if it is one.
    aggregation: Option<Aggregation>,
    /// The stream–table join compiled, if it is one.
    join: Option<Join>,
    /// In a join: the name the table's fields are qualified with.
    table_qualifier: Option<String>,
    /// While compiling the stream's side of a join's ON: the table may not be read.
    on_side: bool,
    /// Whether each of `paths` is read from the table of a join (else from the record).
    path_sides: Vec<bool>,
    /// The input steps a GROUP BY or join reads, and where: checked like the FROMs of arms.
    reads: Vec<(String, Location)>,
}

/// What the columns of a GROUP BY may read: the grouping expressions (matched by their
/// text), the window's bounds, and aggregates (collected as they are met).
struct OutputScope {
    groups: Vec<String>,
    windowed: bool,
    aggs: Vec<AggSpec>,
    /// Each of `aggs` as written.
    aggregate_texts: Vec<String>,
}

impl OutputScope {
    /// The slot of `window_start`; `window_end` is the next, then the aggregates.
    fn window_slot(&self) -> usize {
        self.groups.len()
    }
}

impl Compiler<'_> {
    fn problem(&mut self, at: Location, message: impl Into<String>) {
        self.problems.push(Problem::at(at, message));
    }

    /// Where a keyword first appears at or after `after`: the position of clauses the syntax
    /// tree does not locate.
    fn keyword_at(&self, keyword: Keyword, after: Location) -> Location {
        self.tokens
            .iter()
            .find(|t| {
                (t.span.start.line, t.span.start.column) >= (after.line, after.column)
                    && matches!(&t.token, Token::Word(w) if w.keyword == keyword)
            })
            .map_or(after, |t| t.span.start)
    }

    fn byte_offset(&self, location: Location) -> Option<usize> {
        let line = usize::try_from(location.line).ok()?.checked_sub(1)?;
        let column = usize::try_from(location.column).ok()?.checked_sub(1)?;
        let mut start = 0;
        for _ in 0..line {
            start += self.sql.get(start..)?.find('\n')? + 1;
        }
        let rest = self.sql.get(start..)?;
        Some(
            start
                + rest
                    .char_indices()
                    .nth(column)
                    .map_or(rest.len(), |(i, _)| i),
        )
    }

    /// The query's text of `span`, shortened, for error messages.
    fn snippet(&self, span: Span, fallback: &dyn std::fmt::Display) -> Snippet {
        let text = match (self.byte_offset(span.start), self.byte_offset(span.end)) {
            (Some(a), Some(b)) if a < b => self.sql.get(a..b).map(str::to_owned),
            _ => None,
        }
        .unwrap_or_else(|| fallback.to_string());
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut short: String = text.chars().take(SNIPPET_CHARS).collect();
        if short.len() < text.len() {
            short.push('…');
        }
        short.into_boxed_str()
    }

    fn statement(&mut self, statement: &Statement) {
        match statement {
            Statement::Query(query) => self.query(query),
            other => {
                let what = other
                    .to_string()
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_uppercase();
                self.problem(
                    other.span().start,
                    format!("a SQL step runs a SELECT, not {what}"),
                );
            }
        }
    }

    fn query(&mut self, query: &ast::Query) {
        let start = query.span().start;
        if let Some(with) = &query.with {
            self.problem(
                with.span().start,
                "WITH is not supported: a SQL step is one SELECT over its input",
            );
        }
        if query.order_by.is_some() {
            self.problem(
                self.keyword_at(Keyword::ORDER, start),
                "ORDER BY is not supported: a SQL step sees one record at a time, and \
                 records keep the order they arrive in",
            );
        }
        if query.limit_clause.is_some() || query.fetch.is_some() {
            let at = [Keyword::LIMIT, Keyword::OFFSET, Keyword::FETCH]
                .into_iter()
                .map(|k| self.keyword_at(k, start))
                .find(|&l| l != start)
                .unwrap_or(start);
            self.problem(
                at,
                "LIMIT, OFFSET and FETCH are not supported: a SQL step is stateless and \
                 cannot count records; filter with WHERE",
            );
        }
        if !query.locks.is_empty()
            || query.for_clause.is_some()
            || query.settings.is_some()
            || query.format_clause.is_some()
            || !query.pipe_operators.is_empty()
        {
            self.problem(
                query.body.span().end,
                "only SELECT … FROM … [WHERE …] is supported here; remove what follows",
            );
        }
        self.set_expr(&query.body);
    }

    fn set_expr(&mut self, body: &SetExpr) {
        match body {
            SetExpr::Select(select) => self.select(select),
            SetExpr::Query(query) => self.query(query),
            SetExpr::SetOperation {
                left,
                op,
                set_quantifier,
                right,
            } => {
                let at = left.span().end;
                match (op, set_quantifier) {
                    (SetOperator::Union, SetQuantifier::All) => {}
                    (SetOperator::Union, _) => self.problem(
                        self.keyword_at(Keyword::UNION, at),
                        "UNION removes duplicates, which needs every record seen so far; \
                         write UNION ALL",
                    ),
                    (other, _) => self.problem(
                        at,
                        format!(
                            "{other} compares records with each other; a SQL step sees one \
                             record at a time (UNION ALL is supported)"
                        ),
                    ),
                }
                self.set_expr(left);
                self.set_expr(right);
            }
            other => self.problem(
                other.span().start,
                "only SELECT … FROM <input step> [WHERE …] is supported",
            ),
        }
    }

    fn select(&mut self, select: &ast::Select) {
        let start = select.select_token.0.span.start;
        let refuse = |c: &mut Self, at: Location, what: &str, why: &str| {
            c.problem(at, format!("{what} is not supported: {why}"));
        };
        const ONE_AT_A_TIME: &str = "a SQL step sees one record at a time";
        if select.distinct.is_some() {
            refuse(
                self,
                self.keyword_at(Keyword::DISTINCT, start),
                "DISTINCT",
                "it needs every record seen so far",
            );
        }
        if select.top.is_some() {
            refuse(
                self,
                self.keyword_at(Keyword::TOP, start),
                "TOP",
                ONE_AT_A_TIME,
            );
        }
        if select.into.is_some() {
            refuse(
                self,
                self.keyword_at(Keyword::INTO, start),
                "SELECT INTO",
                "a step's outputs go to the steps that read it",
            );
        }
        let mut grouped = None;
        match &select.group_by {
            GroupByExpr::Expressions(exprs, modifiers)
                if exprs.is_empty() && modifiers.is_empty() => {}
            GroupByExpr::Expressions(exprs, modifiers) if self.stateful && modifiers.is_empty() => {
                grouped = Some(exprs);
            }
            _ if self.stateful => refuse(
                self,
                self.keyword_at(Keyword::GROUP, start),
                "this form of GROUP BY",
                "list expressions, `_key` among them, and at most one window",
            ),
            _ => refuse(
                self,
                self.keyword_at(Keyword::GROUP, start),
                "GROUP BY",
                "it needs a stateful step (docs/stateful-sql.md): the processor runs one with \
                 --state-topic, which `plumber` sets for a step file's GROUP BY",
            ),
        }
        if select.having.is_some() && grouped.is_none() {
            refuse(
                self,
                self.keyword_at(Keyword::HAVING, start),
                "HAVING",
                "it filters groups: it goes with GROUP BY",
            );
        }
        let others = [
            (
                !select.lateral_views.is_empty(),
                Keyword::LATERAL,
                "LATERAL VIEW",
            ),
            (select.prewhere.is_some(), Keyword::PREWHERE, "PREWHERE"),
            (
                !select.connect_by.is_empty(),
                Keyword::CONNECT,
                "CONNECT BY",
            ),
            (
                !select.cluster_by.is_empty(),
                Keyword::CLUSTER,
                "CLUSTER BY",
            ),
            (
                !select.distribute_by.is_empty(),
                Keyword::DISTRIBUTE,
                "DISTRIBUTE BY",
            ),
            (!select.sort_by.is_empty(), Keyword::SORT, "SORT BY"),
            (!select.named_window.is_empty(), Keyword::WINDOW, "WINDOW"),
            (select.qualify.is_some(), Keyword::QUALIFY, "QUALIFY"),
            (select.exclude.is_some(), Keyword::EXCLUDE, "EXCLUDE"),
            (
                select.value_table_mode.is_some(),
                Keyword::AS,
                "SELECT AS VALUE",
            ),
            (
                !select.optimizer_hints.is_empty() || select.select_modifiers.is_some(),
                Keyword::SELECT,
                "this SELECT modifier",
            ),
        ];
        for (present, keyword, what) in others {
            if present {
                refuse(self, self.keyword_at(keyword, start), what, ONE_AT_A_TIME);
            }
        }
        if !matches!(select.flavor, ast::SelectFlavor::Standard) {
            refuse(self, start, "FROM before SELECT", "write SELECT … FROM …");
        }

        let joined = matches!(select.from.as_slice(), [table] if !table.joins.is_empty());
        if self.stateful && joined {
            if grouped.is_some() {
                self.problem(
                    self.keyword_at(Keyword::GROUP, start),
                    "a join and a GROUP BY in one query: join in one step, group in the next",
                );
            }
            return self.join_select(select, start);
        }
        if let Some(groups) = grouped {
            return self.aggregate_select(select, start, groups);
        }
        let from = self.from(select, start);
        self.qualifier = from.as_ref().map(|(_, qualifier)| qualifier.clone());

        let mut columns = Vec::with_capacity(select.projection.len());
        let mut names: Vec<String> = Vec::new();
        let mut star = false;
        for item in &select.projection {
            match item {
                SelectItem::Wildcard(options) => {
                    self.wildcard_options(options, item.span().start);
                    if star {
                        self.problem(item.span().start, "`*` appears twice");
                    }
                    star = true;
                    columns.push(Column::Star);
                }
                SelectItem::QualifiedWildcard(kind, options) => {
                    self.wildcard_options(options, item.span().start);
                    let qualified = match kind {
                        ast::SelectItemQualifiedWildcardKind::ObjectName(name) => {
                            single_name(name).map(|n| n.value.clone())
                        }
                        ast::SelectItemQualifiedWildcardKind::Expr(_) => None,
                    };
                    if qualified.is_none() || qualified != self.qualifier {
                        self.problem(
                            item.span().start,
                            format!("`{item}` does not name the step this SELECT reads; write `*`"),
                        );
                    }
                    if star {
                        self.problem(item.span().start, "`*` appears twice");
                    }
                    star = true;
                    columns.push(Column::Star);
                }
                SelectItem::UnnamedExpr(e) => {
                    let expr = self.expr(e, 0);
                    let name = Self::natural_name(e);
                    self.column(&mut columns, &mut names, name, item.span().start, expr);
                }
                SelectItem::ExprWithAlias { expr: e, alias } => {
                    let expr = self.expr(e, 0);
                    self.column(
                        &mut columns,
                        &mut names,
                        alias.value.clone(),
                        alias.span.start,
                        expr,
                    );
                }
                SelectItem::ExprWithAliases { aliases, .. } => {
                    let at = aliases.first().map_or(item.span().start, |a| a.span.start);
                    self.problem(at, "a column has one name: write `expr AS name`");
                }
            }
        }

        self.select_aliases = select
            .projection
            .iter()
            .filter_map(|item| match item {
                SelectItem::ExprWithAlias { expr, alias } => {
                    let same_field = match expr {
                        ast::Expr::Identifier(i) => i.value == alias.value,
                        ast::Expr::CompoundIdentifier(ids) => {
                            ids.len() == 2
                                && self.qualifier.as_deref() == Some(ids[0].value.as_str())
                                && ids[1].value == alias.value
                        }
                        _ => false,
                    };
                    (!same_field).then(|| alias.value.clone())
                }
                _ => None,
            })
            .collect();
        let filter = select.selection.as_ref().map(|e| {
            let expr = self.expr(e, 0);
            if let Expr::Literal(v) = &expr
                && !matches!(v, Value::Bool(_) | Value::Null)
            {
                self.problem(
                    e.span().start,
                    format!("WHERE needs a condition (a boolean), found {}", v.kind()),
                );
            }
            expr
        });
        self.qualifier = None;
        self.select_aliases.clear();
        self.arm_names.push((start, (!star).then(|| names.clone())));
        self.arms.push(Arm {
            from: from.map(|(name, _)| name).unwrap_or_default(),
            columns,
            filter,
            named: names,
        });
    }

    /// A SELECT with GROUP BY (a stateful query): WHERE and GROUP BY over records, the
    /// columns and HAVING over groups.
    fn aggregate_select(&mut self, select: &ast::Select, start: Location, group_by: &[ast::Expr]) {
        if !self.arms.is_empty() || self.aggregation.is_some() {
            self.problem(start, "a query with GROUP BY is one SELECT: no UNION ALL");
        }
        let from = self.from(select, start);
        if let Some((name, _)) = &from {
            self.reads.push((name.clone(), start));
        }
        self.qualifier = from.as_ref().map(|(_, qualifier)| qualifier.clone());
        let filter = select.selection.as_ref().map(|e| self.expr(e, 0));
        let mut groups = Vec::new();
        let mut texts = Vec::new();
        let mut window: Option<Window> = None;
        let mut window_text = None;
        for ast in group_by {
            if let Some(found) = self.window(ast) {
                if window.is_some() {
                    self.problem(ast.span().start, "GROUP BY has one window at most");
                }
                window = Some(found);
                window_text = Some(canonical(ast));
                continue;
            }
            groups.push(self.expr(ast, 0));
            texts.push(ast.to_string());
        }
        let key_group = groups.iter().position(|g| matches!(g, Expr::Key));
        if key_group.is_none() {
            self.problem(
                self.keyword_at(Keyword::GROUP, start),
                "GROUP BY must include `_key`: one instance sees all records of a key (they \
                 are in one partition), not all records of another field; to group by a \
                 field, key the records by it in the step before",
            );
        }
        self.output = Some(OutputScope {
            groups: texts,
            windowed: window.is_some(),
            aggs: Vec::new(),
            aggregate_texts: Vec::new(),
        });
        let mut columns: Vec<(Vec<u8>, Expr)> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for item in &select.projection {
            let (expr, name, at) = match item {
                SelectItem::UnnamedExpr(e) => {
                    (self.expr(e, 0), Self::natural_name(e), item.span().start)
                }
                SelectItem::ExprWithAlias { expr, alias } => {
                    (self.expr(expr, 0), alias.value.clone(), alias.span.start)
                }
                _ => {
                    self.problem(
                        item.span().start,
                        "a query with GROUP BY names its columns: grouping expressions, \
                         `window_start`, `window_end` and aggregates (no `*`)",
                    );
                    continue;
                }
            };
            if names.contains(&name) {
                self.problem(
                    at,
                    format!("two columns are named `{name}`; rename one with AS"),
                );
            }
            let mut key = Vec::with_capacity(name.len() + 3);
            crate::json::write_string(&mut key, &name);
            key.push(b':');
            names.push(name);
            columns.push((key, expr));
        }
        let having = select.having.as_ref().map(|e| self.expr(e, 0));
        let (aggs, aggregates) = self
            .output
            .take()
            .map(|scope| (scope.aggs, scope.aggregate_texts))
            .unwrap_or_default();
        self.qualifier = None;
        let definition = StateDefinition {
            from: from
                .as_ref()
                .map(|(name, _)| name.clone())
                .unwrap_or_default(),
            filter: select.selection.as_ref().map(ToString::to_string),
            groups: group_by
                .iter()
                .filter(|g| window_name(g).is_none())
                .map(ToString::to_string)
                .collect(),
            window: window_text,
            aggregates,
        };
        let mut aggregation = Aggregation::new(
            from.map(|(name, _)| name).unwrap_or_default(),
            filter,
            groups,
            key_group.unwrap_or(0),
            window,
            aggs,
            columns,
            having,
        );
        aggregation.definition = definition;
        self.aggregation = Some(aggregation);
    }

    /// `TUMBLE(time, size)` or `HOP(time, size, advance)` in GROUP BY; `None` for anything
    /// else (a grouping expression).
    fn window(&mut self, ast: &ast::Expr) -> Option<Window> {
        let (ast::Expr::Function(function), Some(name)) = (ast, window_name(ast)) else {
            return None;
        };
        let at = function.name.span().start;
        let args: Vec<&ast::Expr> = match &function.args {
            FunctionArguments::List(list) => list
                .args
                .iter()
                .filter_map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let snippet = self.snippet(ast.span(), ast);
        let wanted = match name.as_str() {
            "TUMBLE" => "TUMBLE(time, INTERVAL 'n' unit)",
            "HOP" => "HOP(time, INTERVAL 'size' unit, INTERVAL 'advance' unit)",
            _ => "SESSION(time, INTERVAL 'gap' unit)",
        };
        let count = if name == "HOP" { 3 } else { 2 };
        if args.len() != count {
            self.problem(at, format!("write {wanted}"));
            return Some(Window::invalid(snippet));
        }
        let time = self.expr(args[0], 0);
        let mut sizes = Vec::new();
        for arg in &args[1..] {
            match interval_ms(arg) {
                Ok(ms) => sizes.push(ms),
                Err(why) => {
                    self.problem(arg.span().start, format!("{why}; write {wanted}"));
                    return Some(Window::invalid(snippet));
                }
            }
        }
        let kind = match sizes.as_slice() {
            [gap] if name == "SESSION" => WindowKind::Session { gap: *gap },
            [size] => WindowKind::Tumble { size: *size },
            [size, advance] if size % advance == 0 && size / advance > MAX_HOPS => {
                self.problem(
                    args[2].span().start,
                    format!(
                        "a HOP window of {size} ms advancing by {advance} ms puts each record \
                         in {} windows; at most {MAX_HOPS}: advance by at least {} ms",
                        size / advance,
                        size / MAX_HOPS + i64::from(size % MAX_HOPS != 0),
                    ),
                );
                return Some(Window::invalid(snippet));
            }
            [size, advance] if size % advance == 0 => WindowKind::Hop {
                size: *size,
                advance: *advance,
            },
            [size, advance] => {
                self.problem(
                    args[2].span().start,
                    format!(
                        "a HOP window's size ({size} ms) must be a multiple of its advance \
                         ({advance} ms)"
                    ),
                );
                return Some(Window::invalid(snippet));
            }
            _ => return Some(Window::invalid(snippet)),
        };
        Some(Window {
            time,
            kind,
            snippet,
        })
    }

    /// An aggregate in the columns or HAVING of a GROUP BY: its argument is compiled over
    /// records, and the call reads the group's value of it.
    fn aggregate_call(&mut self, function: &ast::Function, ast: &ast::Expr, depth: usize) -> Expr {
        let upper = function.name.to_string().to_ascii_uppercase();
        let at = function.name.span().start;
        let FunctionArguments::List(list) = &function.args else {
            self.problem(at, format!("{upper} needs its argument in parentheses"));
            return Expr::Literal(Value::Null);
        };
        let distinct = matches!(
            list.duplicate_treatment,
            Some(ast::DuplicateTreatment::Distinct)
        );
        if function.filter.is_some() || function.over.is_some() || !list.clauses.is_empty() {
            return self.unsupported(ast, &format!("this form of {upper}"));
        }
        let arg = match list.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] if upper == "COUNT" && !distinct => {
                None
            }
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => {
                // The argument reads the record, not the group.
                let scope = self.output.take();
                let arg = self.expr(e, depth);
                self.output = scope;
                Some(arg)
            }
            _ => {
                self.problem(at, format!("{upper} takes one argument (COUNT also `*`)"));
                return Expr::Literal(Value::Null);
            }
        };
        let func = match (upper.as_str(), distinct, &arg) {
            ("COUNT", false, None) => AggFunc::CountStar,
            ("COUNT", false, Some(_)) => AggFunc::Count,
            ("COUNT", true, Some(_)) => AggFunc::CountDistinct,
            ("SUM", false, Some(_)) => AggFunc::Sum,
            ("AVG", false, Some(_)) => AggFunc::Avg,
            ("MIN", false, Some(_)) => AggFunc::Min,
            ("MAX", false, Some(_)) => AggFunc::Max,
            (_, true, _) => {
                self.problem(
                    at,
                    format!("{upper}(DISTINCT …) is not supported; COUNT(DISTINCT …) is"),
                );
                return Expr::Literal(Value::Null);
            }
            _ => {
                self.problem(
                    at,
                    format!(
                        "the aggregate {upper} is not supported; COUNT, SUM, AVG, MIN and MAX are"
                    ),
                );
                return Expr::Literal(Value::Null);
            }
        };
        let snippet = self.snippet(ast.span(), ast);
        let Some(scope) = self.output.as_mut() else {
            return Expr::Literal(Value::Null);
        };
        let slot = scope.window_slot() + 2 + scope.aggs.len();
        scope.aggs.push(AggSpec { func, arg, snippet });
        scope.aggregate_texts.push(canonical(ast));
        Expr::Slot(slot)
    }

    /// `SELECT … FROM stream s [LEFT] JOIN table t ON <stream expression> = t._key [WHERE …]`.
    fn join_select(&mut self, select: &ast::Select, start: Location) {
        if !self.arms.is_empty() || self.join.is_some() {
            self.problem(start, "a query with a JOIN is one SELECT: no UNION ALL");
        }
        let [from] = select.from.as_slice() else {
            return;
        };
        let stream = self.relation(&from.relation);
        let [joined, more @ ..] = from.joins.as_slice() else {
            return;
        };
        if let Some(extra) = more.first() {
            self.problem(
                extra.relation.span().start,
                "a query joins one table; join the next in another step",
            );
        }
        let table = self.relation(&joined.relation);
        let wanted = "write `ON <stream>.<field> = <table>._key`";
        let (left, constraint) = match &joined.join_operator {
            ast::JoinOperator::Join(c) | ast::JoinOperator::Inner(c) => (false, c),
            ast::JoinOperator::Left(c) | ast::JoinOperator::LeftOuter(c) => (true, c),
            _ => {
                self.problem(
                    self.keyword_at(Keyword::JOIN, from.relation.span().end),
                    "a stream joins a table with JOIN or LEFT JOIN (a table has no order, and \
                     a stream no end: RIGHT, FULL and CROSS have no meaning here)",
                );
                return;
            }
        };
        for (name, at) in [
            (&stream, from.relation.span().start),
            (&table, joined.relation.span().start),
        ] {
            if let Some((name, _)) = name {
                self.reads.push((name.clone(), at));
            }
        }
        self.qualifier = stream.as_ref().map(|(_, q)| q.clone());
        self.table_qualifier = table.as_ref().map(|(_, q)| q.clone());
        if self.qualifier.is_some() && self.qualifier == self.table_qualifier {
            self.problem(
                joined.relation.span().start,
                "the stream and the table need names of their own: `FROM orders o JOIN customers c`",
            );
        }
        let on = match constraint {
            ast::JoinConstraint::On(ast::Expr::BinaryOp {
                left: a,
                op: BinaryOperator::Eq,
                right: b,
            }) => {
                let is_table_key = |e: &ast::Expr| match e {
                    ast::Expr::CompoundIdentifier(ids) => {
                        ids.len() == 2
                            && Some(&ids[0].value) == self.table_qualifier.as_ref()
                            && ids[1].value == "_key"
                    }
                    _ => false,
                };
                let stream_side = match (is_table_key(a), is_table_key(b)) {
                    (false, true) => Some(a),
                    (true, false) => Some(b),
                    _ => None,
                };
                match stream_side {
                    Some(side) => {
                        self.on_side = true;
                        let on = self.expr(side, 0);
                        self.on_side = false;
                        Some(on)
                    }
                    None => {
                        self.problem(a.span().start, wanted);
                        None
                    }
                }
            }
            ast::JoinConstraint::On(other) => {
                self.problem(other.span().start, wanted);
                None
            }
            _ => {
                self.problem(joined.relation.span().end, wanted);
                None
            }
        };
        let mut columns = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for item in &select.projection {
            match item {
                SelectItem::Wildcard(options) => {
                    self.wildcard_options(options, item.span().start);
                    columns.push(Column::Star);
                }
                SelectItem::QualifiedWildcard(
                    ast::SelectItemQualifiedWildcardKind::ObjectName(name),
                    options,
                ) if single_name(name).map(|n| &n.value) == self.qualifier.as_ref() => {
                    self.wildcard_options(options, item.span().start);
                    columns.push(Column::Star);
                }
                SelectItem::UnnamedExpr(e) => {
                    let expr = self.expr(e, 0);
                    self.column(
                        &mut columns,
                        &mut names,
                        Self::natural_name(e),
                        item.span().start,
                        expr,
                    );
                }
                SelectItem::ExprWithAlias { expr: e, alias } => {
                    let expr = self.expr(e, 0);
                    self.column(
                        &mut columns,
                        &mut names,
                        alias.value.clone(),
                        alias.span.start,
                        expr,
                    );
                }
                _ => self.problem(
                    item.span().start,
                    "`*` is the stream's fields; name the table's columns (`c.name`)",
                ),
            }
        }
        let filter = select.selection.as_ref().map(|e| self.expr(e, 0));
        self.qualifier = None;
        self.table_qualifier = None;
        self.join = Some(Join::new(
            stream.map(|(name, _)| name).unwrap_or_default(),
            table.map(|(name, _)| name).unwrap_or_default(),
            left,
            on.unwrap_or(Expr::Literal(Value::Null)),
            Arm {
                from: String::new(),
                columns,
                filter,
                named: names,
            },
        ));
    }

    fn wildcard_options(&mut self, options: &ast::WildcardAdditionalOptions, at: Location) {
        if options.opt_ilike.is_some()
            || options.opt_exclude.is_some()
            || options.opt_except.is_some()
            || options.opt_replace.is_some()
            || options.opt_rename.is_some()
        {
            self.problem(
                at,
                "`*` takes no options here (EXCLUDE, EXCEPT, REPLACE, RENAME); name the columns",
            );
        }
    }

    fn column(
        &mut self,
        columns: &mut Vec<Column>,
        names: &mut Vec<String>,
        name: String,
        at: Location,
        expr: Expr,
    ) {
        if names.contains(&name) {
            self.problem(
                at,
                format!("two columns are named `{name}`; rename one with AS"),
            );
        }
        let passthrough = match expr {
            Expr::Field(i) => Some(i),
            _ => None,
        };
        let mut key = Vec::with_capacity(name.len() + 3);
        crate::json::write_string(&mut key, &name);
        key.push(b':');
        names.push(name);
        columns.push(Column::Value {
            key,
            expr,
            passthrough,
        });
    }

    /// The input step this SELECT reads and the name its fields may be qualified with.
    fn from(&mut self, select: &ast::Select, start: Location) -> Option<(String, String)> {
        let [table] = select.from.as_slice() else {
            if select.from.is_empty() {
                self.problem(
                    start,
                    "a SQL step reads its input step: add `FROM <input step>`",
                );
            } else {
                self.problem(
                    select.from[1].relation.span().start,
                    "FROM with several tables is a join; a SQL step sees one record at a time \
                     (for several inputs write `SELECT … FROM a UNION ALL SELECT … FROM b`)",
                );
            }
            return None;
        };
        if !table.joins.is_empty() {
            self.problem(
                self.keyword_at(Keyword::JOIN, table.relation.span().end),
                "JOIN is not supported: a SQL step sees one record at a time (a stateful step \
                 joins a stream to a table: docs/stateful-sql.md)",
            );
        }
        self.relation(&table.relation)
    }

    /// The input step a FROM or JOIN names, and the name its fields may be qualified with.
    fn relation(&mut self, relation: &TableFactor) -> Option<(String, String)> {
        match relation {
            TableFactor::Table {
                name,
                alias,
                args,
                with_hints,
                version,
                with_ordinality,
                partitions,
                json_path,
                sample,
                ..
            } => {
                let plain = args.is_none()
                    && with_hints.is_empty()
                    && version.is_none()
                    && !with_ordinality
                    && partitions.is_empty()
                    && json_path.is_none()
                    && sample.is_none()
                    && alias.as_ref().is_none_or(|a| a.columns.is_empty());
                let Some(ident) = single_name(name).filter(|_| plain) else {
                    self.problem(
                        name.span().start,
                        "FROM names the input step, e.g. `FROM telemetry`",
                    );
                    return None;
                };
                let qualifier = alias
                    .as_ref()
                    .map_or_else(|| ident.value.clone(), |a| a.name.value.clone());
                Some((ident.value.clone(), qualifier))
            }
            TableFactor::Derived { .. } => {
                self.problem(
                    relation.span().start,
                    "subqueries are not supported: FROM names the input step",
                );
                None
            }
            other => {
                self.problem(
                    other.span().start,
                    "FROM names the input step, e.g. `FROM telemetry`",
                );
                None
            }
        }
    }

    /// Every FROM names an input, every input is read, and the arms of a UNION ALL name their
    /// columns alike.
    fn check_inputs(&mut self, inputs: &[&str]) {
        let froms: Vec<(String, Location)> = self
            .arms
            .iter()
            .zip(&self.arm_names)
            .map(|(arm, (at, _))| (arm.from.clone(), *at))
            .chain(self.reads.iter().cloned())
            .collect();
        let mut all_inputs = true;
        for (from, at) in &froms {
            if !from.is_empty() && !inputs.contains(&from.as_str()) {
                all_inputs = false;
                let at = self.location_of_from(from, *at);
                self.problem(
                    at,
                    format!(
                        "FROM `{from}`: the step reads {}; FROM names one of its inputs",
                        list(inputs)
                    ),
                );
            }
        }
        // A FROM that names no input is the mistake to report, not the input it misses.
        if let Some((first, first_at)) = froms.first()
            && all_inputs
            && froms.iter().all(|(from, _)| !from.is_empty())
        {
            for input in inputs {
                if !froms.iter().any(|(from, _)| from == input) {
                    let what = if froms.len() == 1 {
                        format!(
                            "the step reads `{input}` too, but the query reads only `{}`; \
                             add `UNION ALL SELECT … FROM {input}`, or remove `{input}` from `input`",
                            first
                        )
                    } else {
                        format!(
                            "the step reads `{input}`, but no SELECT of the query reads it; \
                             add `UNION ALL SELECT … FROM {input}`, or remove it from `input`"
                        )
                    };
                    self.problem(*first_at, what);
                }
            }
        }
        let named: Vec<(Location, Vec<String>)> = self
            .arm_names
            .iter()
            .filter_map(|(at, names)| names.clone().map(|n| (*at, n)))
            .collect();
        if let Some((_, first)) = named.first() {
            for (at, names) in &named[1..] {
                if names != first {
                    self.problem(
                        *at,
                        format!(
                            "this SELECT names its columns {}, the first SELECT {}; in a UNION \
                             ALL they must be named alike (rename with AS)",
                            list_names(names),
                            list_names(first)
                        ),
                    );
                }
            }
        }
    }

    fn location_of_from(&self, from: &str, after: Location) -> Location {
        let from_keyword = self.keyword_at(Keyword::FROM, after);
        self.tokens
            .iter()
            .find(|t| {
                (t.span.start.line, t.span.start.column) > (from_keyword.line, from_keyword.column)
                    && matches!(&t.token, Token::Word(w) if w.value == from)
            })
            .map_or(from_keyword, |t| t.span.start)
    }

    fn natural_name(ast: &ast::Expr) -> String {
        match ast {
            ast::Expr::Identifier(ident) => ident.value.clone(),
            ast::Expr::CompoundIdentifier(idents) => {
                idents.last().map(|i| i.value.clone()).unwrap_or_default()
            }
            ast::Expr::Nested(inner) => Self::natural_name(inner),
            _ => ast.to_string(),
        }
    }

    /// The index of a field path of the record (or, `table`, of a join's table).
    fn path(&mut self, path: Vec<String>, table: bool) -> usize {
        if let Some(i) = self.path_index.get(&(table, path.clone())) {
            return *i;
        }
        let i = self.paths.len();
        self.path_index.insert((table, path.clone()), i);
        self.paths.push(path);
        self.path_sides.push(table);
        i
    }

    fn name_ref(&mut self, idents: &[Ident]) -> Expr {
        let names: Vec<&str> = idents.iter().map(|i| i.value.as_str()).collect();
        let at = idents.first().map_or(START, |i| i.span.start);
        if let Some(scope) = &self.output {
            let slot = scope.window_slot();
            let windowed = scope.windowed;
            return match names.as_slice() {
                ["window_start"] if windowed => Expr::Slot(slot),
                ["window_end"] if windowed => Expr::Slot(slot + 1),
                _ => {
                    let name = names.join(".");
                    self.problem(
                        at,
                        format!(
                            "`{name}` is neither in GROUP BY nor inside an aggregate: add it \
                             to GROUP BY, or write an aggregate of it such as MAX({name})"
                        ),
                    );
                    Expr::Literal(Value::Null)
                }
            };
        }
        if names == ["_timestamp"] {
            if self.stateful {
                return Expr::Timestamp;
            }
            self.problem(
                at,
                "`_timestamp` (the record's time) is for the windows of a stateful query",
            );
            return Expr::Literal(Value::Null);
        }
        if let [ident] = idents
            && ident.quote_style.is_none()
            && RESERVED.contains(&ident.value.to_ascii_uppercase().as_str())
        {
            // sqlparser reads a keyword where an expression is missing as a column name.
            self.problem(
                at,
                format!(
                    "syntax error: expected an expression before `{}` (a field of that name \
                     is written in double quotes)",
                    ident.value
                ),
            );
            return Expr::Literal(Value::Null);
        }
        if let [ident] = idents
            && self.select_aliases.contains(&ident.value)
        {
            // SQL evaluates WHERE before SELECT: the name is the record's field, which is
            // rarely what was meant.
            let field = match &self.qualifier {
                Some(q) => format!("{q}.{}", ident.value),
                None => ident.value.clone(),
            };
            self.problem(
                at,
                format!(
                    "`{0}` here is the record's field `{0}`, not the column SELECT names `{0}` \
                     (WHERE runs before SELECT); repeat the column's expression, or write \
                     `{field}` to mean the field",
                    ident.value
                ),
            );
        }
        if names.len() > 1
            && let Some(table) = &self.table_qualifier
            && Some(table.as_str()) == names.first().copied()
        {
            if self.on_side {
                self.problem(
                    at,
                    "this side of ON reads the stream's record; the other is the table's `_key`",
                );
                return Expr::Literal(Value::Null);
            }
            return match &names[1..] {
                ["_key"] => Expr::TableKey,
                ["_key", ..] | ["_headers", ..] => {
                    self.problem(at, "the table has `_key` (a string) and fields, no headers");
                    Expr::Literal(Value::Null)
                }
                rest => {
                    Expr::Field(self.path(rest.iter().map(|s| (*s).to_owned()).collect(), true))
                }
            };
        }
        let qualified = names.len() > 1 && self.qualifier.as_deref() == names.first().copied();
        let rest = if qualified { &names[1..] } else { &names[..] };
        if !qualified {
            match rest {
                ["_key"] => return Expr::Key,
                ["_key", ..] => {
                    self.problem(at, "`_key` is the record key, a string: it has no fields");
                    return Expr::Literal(Value::Null);
                }
                ["_headers"] => return Expr::Headers,
                ["_headers", name] => return Expr::Header((*name).to_owned()),
                ["_headers", ..] => {
                    self.problem(at, "a header name with dots is quoted: `_headers.\"a.b\"`");
                    return Expr::Literal(Value::Null);
                }
                _ => {}
            }
        }
        Expr::Field(self.path(rest.iter().map(|s| (*s).to_owned()).collect(), false))
    }

    /// Evaluates expressions that read nothing of the record once, now: their errors are
    /// reported here instead of dead-lettering every record.
    fn fold(&mut self, expr: Expr, ast: &ast::Expr) -> Expr {
        let constant = match &expr {
            Expr::Literal(_)
            | Expr::Field(_)
            | Expr::Key
            | Expr::Header(_)
            | Expr::Headers
            | Expr::Timestamp
            | Expr::TableKey
            | Expr::Slot(_) => false,
            other => children(other).iter().all(|c| c.is_literal()),
        };
        if !constant {
            return expr;
        }
        let empty = Row::empty();
        match expr.eval(&empty) {
            Ok(value) => Expr::Literal(value.into_static()),
            Err(e) => {
                self.problem(
                    ast.span().start,
                    format!("{} (for every record)", e.message),
                );
                expr
            }
        }
    }

    fn expr(&mut self, ast: &ast::Expr, depth: usize) -> Expr {
        if depth > MAX_DEPTH {
            if !std::mem::replace(&mut self.too_deep, true) {
                self.problem(
                    ast.span().start,
                    format!(
                        "the expression nests more than {MAX_DEPTH} levels deep (each operator, \
                         function and parenthesis is a level); simplify it"
                    ),
                );
            }
            return Expr::Literal(Value::Null);
        }
        if let Some(scope) = &self.output {
            let text = ast.to_string();
            if let Some(i) = scope.groups.iter().position(|g| *g == text) {
                return Expr::Slot(i);
            }
        }
        let expr = self.expr_unfolded(ast, depth + 1);
        self.fold(expr, ast)
    }

    fn boxed(&mut self, ast: &ast::Expr, depth: usize) -> Box<Expr> {
        Box::new(self.expr(ast, depth))
    }

    /// Refuses a construct: "`snippet`: WHAT is not supported[; WHY]".
    fn unsupported(&mut self, ast: &ast::Expr, what: &str) -> Expr {
        self.unsupported_because(ast, what, "")
    }

    fn unsupported_because(&mut self, ast: &ast::Expr, what: &str, why: &str) -> Expr {
        let snippet = self.snippet(ast.span(), ast);
        let why = if why.is_empty() {
            String::new()
        } else {
            format!("; {why}")
        };
        self.problem(
            ast.span().start,
            format!("`{snippet}`: {what} is not supported in a SQL step{why}"),
        );
        Expr::Literal(Value::Null)
    }

    fn expr_unfolded(&mut self, ast: &ast::Expr, depth: usize) -> Expr {
        use ast::Expr as A;
        let snippet = |c: &Self| c.snippet(ast.span(), ast);
        match ast {
            A::Identifier(ident) => self.name_ref(std::slice::from_ref(ident)),
            A::CompoundIdentifier(idents) => self.name_ref(idents),
            A::Value(v) => self.literal(&v.value, v.span.start, false),
            A::Nested(inner) => self.expr(inner, depth),
            A::UnaryOp { op, expr } => match op {
                UnaryOperator::Minus => {
                    // `-9223372036854775808` is an integer, although its digits alone are not.
                    if let A::Value(v) = expr.as_ref()
                        && matches!(v.value, ast::Value::Number(..))
                    {
                        return self.literal(&v.value, v.span.start, true);
                    }
                    Expr::Neg(self.boxed(expr, depth), snippet(self))
                }
                UnaryOperator::Plus => Expr::Arith(
                    Arith::Add,
                    Box::new(Expr::Literal(Value::Int(0))),
                    self.boxed(expr, depth),
                    snippet(self),
                ),
                UnaryOperator::Not => Expr::Not(self.boxed(expr, depth), snippet(self)),
                other => self.unsupported(ast, &format!("the operator `{other}`")),
            },
            A::BinaryOp { left, op, right } => {
                let arith = |op| Some(Ok(op));
                let cmp = |op| Some(Err(op));
                let kind = match op {
                    BinaryOperator::Plus => arith(Arith::Add),
                    BinaryOperator::Minus => arith(Arith::Sub),
                    BinaryOperator::Multiply => arith(Arith::Mul),
                    BinaryOperator::Divide => arith(Arith::Div),
                    BinaryOperator::Modulo => arith(Arith::Rem),
                    BinaryOperator::Eq => cmp(CmpOp::Eq),
                    BinaryOperator::NotEq => cmp(CmpOp::NotEq),
                    BinaryOperator::Lt => cmp(CmpOp::Lt),
                    BinaryOperator::LtEq => cmp(CmpOp::LtEq),
                    BinaryOperator::Gt => cmp(CmpOp::Gt),
                    BinaryOperator::GtEq => cmp(CmpOp::GtEq),
                    BinaryOperator::And | BinaryOperator::Or | BinaryOperator::StringConcat => None,
                    other => return self.unsupported(ast, &format!("the operator `{other}`")),
                };
                let (l, r) = (self.boxed(left, depth), self.boxed(right, depth));
                match (kind, op) {
                    (Some(Ok(arith)), _) => Expr::Arith(arith, l, r, snippet(self)),
                    (Some(Err(cmp)), _) => Expr::Compare(cmp, l, r, snippet(self)),
                    (None, BinaryOperator::And) => Expr::And(l, r, snippet(self)),
                    (None, BinaryOperator::Or) => Expr::Or(l, r, snippet(self)),
                    (None, _) => Expr::Concat(l, r, snippet(self)),
                }
            }
            A::IsNull(e) => Expr::IsNull(self.boxed(e, depth), false),
            A::IsNotNull(e) => Expr::IsNull(self.boxed(e, depth), true),
            A::IsTrue(e)
            | A::IsNotTrue(e)
            | A::IsFalse(e)
            | A::IsNotFalse(e)
            | A::IsUnknown(e)
            | A::IsNotUnknown(e) => {
                let (value, negated) = match ast {
                    A::IsTrue(_) => (Some(true), false),
                    A::IsNotTrue(_) => (Some(true), true),
                    A::IsFalse(_) => (Some(false), false),
                    A::IsNotFalse(_) => (Some(false), true),
                    A::IsUnknown(_) => (None, false),
                    _ => (None, true),
                };
                Expr::Is {
                    expr: self.boxed(e, depth),
                    value,
                    negated,
                    snippet: snippet(self),
                }
            }
            A::IsDistinctFrom(a, b) | A::IsNotDistinctFrom(a, b) => Expr::Distinct {
                left: self.boxed(a, depth),
                right: self.boxed(b, depth),
                negated: matches!(ast, A::IsNotDistinctFrom(..)),
                snippet: snippet(self),
            },
            A::In {
                expr,
                target,
                negated,
                ..
            } => match target {
                InTarget::List(list) => Expr::In {
                    expr: self.boxed(expr, depth),
                    list: list.iter().map(|e| self.expr(e, depth)).collect(),
                    negated: *negated,
                    snippet: snippet(self),
                },
                InTarget::Subquery(_) | InTarget::Table { .. } => {
                    self.unsupported_because(ast, "IN with a subquery", ONE_RECORD)
                }
                InTarget::Unnest(_) => self.unsupported(ast, "IN UNNEST"),
            },
            A::Between {
                expr,
                negated,
                low,
                high,
            } => Expr::Between {
                expr: self.boxed(expr, depth),
                low: self.boxed(low, depth),
                high: self.boxed(high, depth),
                negated: *negated,
                snippet: snippet(self),
            },
            A::Like {
                negated,
                any,
                expr,
                pattern,
                escape_char,
            }
            | A::ILike {
                negated,
                any,
                expr,
                pattern,
                escape_char,
            } => {
                if *any {
                    return self.unsupported(ast, "LIKE ANY");
                }
                Expr::Like {
                    expr: self.boxed(expr, depth),
                    pattern: self.boxed(pattern, depth),
                    escape: escape_char.as_ref().map(|e| self.boxed(e, depth)),
                    negated: *negated,
                    case_insensitive: matches!(ast, A::ILike { .. }),
                    snippet: snippet(self),
                }
            }
            A::Case {
                operand,
                conditions,
                else_result,
                ..
            } => Expr::Case {
                operand: operand.as_ref().map(|o| self.boxed(o, depth)),
                whens: conditions
                    .iter()
                    .map(|w| (self.expr(&w.condition, depth), self.expr(&w.result, depth)))
                    .collect(),
                otherwise: else_result.as_ref().map(|e| self.boxed(e, depth)),
                snippet: snippet(self),
            },
            A::Cast {
                kind,
                expr,
                data_type,
                format,
            } => {
                if format.is_some() {
                    return self.unsupported(ast, "CAST … FORMAT");
                }
                let Some(to) = self.sql_type(data_type, expr.span().end) else {
                    return Expr::Literal(Value::Null);
                };
                Expr::Cast {
                    expr: self.boxed(expr, depth),
                    to,
                    try_cast: matches!(kind, CastKind::TryCast | CastKind::SafeCast),
                    snippet: snippet(self),
                }
            }
            A::Ceil { expr, field } | A::Floor { expr, field } => {
                if !matches!(
                    field,
                    CeilFloorKind::DateTimeField(DateTimeField::NoDateTime)
                ) {
                    return self.unsupported(ast, "CEIL and FLOOR with a second argument");
                }
                let func = if matches!(ast, A::Ceil { .. }) {
                    Func::Ceil
                } else {
                    Func::Floor
                };
                Expr::Call {
                    func,
                    args: vec![self.expr(expr, depth)],
                    snippet: snippet(self),
                }
            }
            A::Substring {
                expr,
                substring_from,
                substring_for,
                ..
            } => {
                let Some(from) = substring_from else {
                    return self.unsupported(ast, "SUBSTRING without a start");
                };
                let mut args = vec![self.expr(expr, depth), self.expr(from, depth)];
                if let Some(length) = substring_for {
                    args.push(self.expr(length, depth));
                }
                Expr::Call {
                    func: Func::Substr,
                    args,
                    snippet: snippet(self),
                }
            }
            A::Trim {
                trim_where,
                trim_what,
                expr,
                trim_characters,
            } => {
                let side = match trim_where {
                    None | Some(TrimWhereField::Both) => Side::Both,
                    Some(TrimWhereField::Leading) => Side::Leading,
                    Some(TrimWhereField::Trailing) => Side::Trailing,
                };
                let mut args = vec![self.expr(expr, depth)];
                match (trim_what, trim_characters.as_deref()) {
                    (Some(what), None) => args.push(self.expr(what, depth)),
                    (None, Some([chars])) => args.push(self.expr(chars, depth)),
                    (None, None) => {}
                    _ => return self.unsupported(ast, "this form of TRIM"),
                }
                Expr::Call {
                    func: Func::Trim(side),
                    args,
                    snippet: snippet(self),
                }
            }
            A::Function(function) => self.function(function, ast, depth),
            A::Subquery(_) | A::Exists { .. } => {
                self.unsupported_because(ast, "a subquery", ONE_RECORD)
            }
            A::CompoundFieldAccess { .. } | A::JsonAccess { .. } => self.unsupported_because(
                ast,
                "indexing (`[…]`, `->`)",
                "nested fields are written `a.b`; for arrays use a jq step",
            ),
            A::Wildcard(_) | A::QualifiedWildcard(..) => {
                self.unsupported(ast, "`*` inside an expression")
            }
            _ => self.unsupported(ast, "this expression"),
        }
    }

    fn literal(&mut self, value: &ast::Value, at: Location, negative: bool) -> Expr {
        let number = |text: &str| -> Option<Value<'static>> {
            if !text.contains(['.', 'e', 'E'])
                && let Ok(i) = text.parse::<i64>()
            {
                return Some(Value::Int(i));
            }
            text.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Value::Float)
        };
        let v = match value {
            ast::Value::Number(text, _) => {
                let signed = if negative {
                    format!("-{text}")
                } else {
                    text.clone()
                };
                match number(&signed) {
                    Some(v) => v,
                    None => {
                        self.problem(at, format!("the number {text} is out of range"));
                        Value::Null
                    }
                }
            }
            ast::Value::SingleQuotedString(s) => Value::Text(s.clone().into()),
            ast::Value::Boolean(b) => Value::Bool(*b),
            ast::Value::Null => Value::Null,
            ast::Value::Placeholder(p) => {
                self.problem(at, format!("parameters (`{p}`) are not supported"));
                Value::Null
            }
            other => {
                self.problem(
                    at,
                    format!(
                        "the literal `{other}` is not supported; strings are written 'in single quotes'"
                    ),
                );
                Value::Null
            }
        };
        Expr::Literal(v)
    }

    /// The type of a CAST whose operand ends at `after`.
    fn sql_type(&mut self, data_type: &DataType, after: Location) -> Option<SqlType> {
        use DataType as D;
        // The syntax tree does not locate types: the type is the token after `AS` (or `::`).
        let at = self
            .tokens
            .iter()
            .skip_while(|t| (t.span.start.line, t.span.start.column) < (after.line, after.column))
            .filter(|t| !matches!(t.token, Token::Whitespace(_)))
            .nth(1)
            .map_or(after, |t| t.span.start);
        Some(match data_type {
            D::Int(None)
            | D::Integer(None)
            | D::BigInt(None)
            | D::SmallInt(None)
            | D::Int2(None)
            | D::Int4(None)
            | D::Int8(None)
            | D::Int64
            | D::Signed
            | D::SignedInteger => SqlType::Integer,
            D::Double(ExactNumberInfo::None)
            | D::DoublePrecision
            | D::Real
            | D::Float(ExactNumberInfo::None)
            | D::Float4
            | D::Float8
            | D::Float64 => SqlType::Double,
            D::Varchar(None) | D::CharacterVarying(None) | D::Text | D::String(None) => {
                SqlType::Varchar
            }
            D::Bool | D::Boolean => SqlType::Boolean,
            D::Varchar(Some(_)) | D::CharacterVarying(Some(_)) | D::String(Some(_)) => {
                self.problem(
                    at,
                    format!("`{data_type}`: strings have no length limit here; write VARCHAR"),
                );
                return None;
            }
            D::Decimal(_) | D::Numeric(_) | D::Dec(_) => {
                self.problem(
                    at,
                    format!(
                        "`{data_type}` is not supported: numbers are INTEGER or DOUBLE; write DOUBLE"
                    ),
                );
                return None;
            }
            other => {
                self.problem(
                    at,
                    format!(
                        "CAST to `{other}` is not supported; cast to INTEGER, DOUBLE, VARCHAR or BOOLEAN"
                    ),
                );
                return None;
            }
        })
    }

    fn function(&mut self, function: &ast::Function, ast: &ast::Expr, depth: usize) -> Expr {
        let name = function.name.to_string();
        let at = function.name.span().start;
        if function.over.is_some() {
            self.problem(
                at,
                format!(
                    "window functions (`{name}(…) OVER`) are not supported: they need many \
                     records, and a SQL step sees one at a time"
                ),
            );
            return Expr::Literal(Value::Null);
        }
        if func::is_aggregate(&name) && self.output.is_some() {
            return self.aggregate_call(function, ast, depth);
        }
        if func::is_aggregate(&name) && self.stateful {
            self.problem(
                at,
                format!(
                    "{} is an aggregate: it belongs in the columns or HAVING of a query with \
                     GROUP BY _key (not in WHERE or GROUP BY; a query without GROUP BY has \
                     no groups to aggregate)",
                    name.to_uppercase()
                ),
            );
            return Expr::Literal(Value::Null);
        }
        if func::is_aggregate(&name) {
            self.problem(
                at,
                format!(
                    "the aggregate function {} needs a stateful step (GROUP BY _key, \
                     docs/stateful-sql.md; the processor runs one with --state-topic)",
                    name.to_uppercase()
                ),
            );
            return Expr::Literal(Value::Null);
        }
        let upper = name.to_ascii_uppercase();
        let known = upper == "COALESCE" || Func::by_name(&upper).is_some();
        if !known {
            self.problem(
                at,
                format!(
                    "unknown function `{name}`; a SQL step supports {}",
                    func::SUPPORTED
                ),
            );
            return Expr::Literal(Value::Null);
        }
        if function.filter.is_some()
            || !function.within_group.is_empty()
            || function.null_treatment.is_some()
            || function.uses_odbc_syntax
            || !matches!(function.parameters, FunctionArguments::None)
        {
            return self.unsupported(ast, &format!("this form of {upper}"));
        }
        let list = match &function.args {
            FunctionArguments::List(list)
                if list.duplicate_treatment.is_none() && list.clauses.is_empty() =>
            {
                list
            }
            FunctionArguments::None => {
                self.problem(at, format!("{upper} needs its arguments in parentheses"));
                return Expr::Literal(Value::Null);
            }
            _ => return self.unsupported(ast, &format!("this form of {upper}")),
        };
        let mut args = Vec::with_capacity(list.args.len());
        for arg in &list.args {
            match arg {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => args.push(self.expr(e, depth)),
                _ => return self.unsupported(ast, &format!("this argument of {upper}")),
            }
        }
        if upper == "COALESCE" {
            if args.is_empty() {
                self.problem(at, "COALESCE needs at least one argument");
            }
            return Expr::Coalesce(args);
        }
        let Some((func, min, max)) = Func::by_name(&upper) else {
            return Expr::Literal(Value::Null);
        };
        if args.len() < min || args.len() > max {
            let wanted = match (min, max) {
                (a, b) if a == b => format!("{a}"),
                (a, usize::MAX) => format!("at least {a}"),
                (a, b) => format!("{a} or {b}"),
            };
            self.problem(
                at,
                format!(
                    "{upper} takes {wanted} argument{}, found {}",
                    if max == 1 { "" } else { "s" },
                    args.len()
                ),
            );
            return Expr::Literal(Value::Null);
        }
        Expr::Call {
            func,
            args,
            snippet: self.snippet(ast.span(), ast),
        }
    }
}

/// The window function `ast` calls, in capitals, if it is one.
fn window_name(ast: &ast::Expr) -> Option<String> {
    let ast::Expr::Function(function) = ast else {
        return None;
    };
    let name = function.name.to_string().to_ascii_uppercase();
    matches!(name.as_str(), "TUMBLE" | "HOP" | "SESSION").then_some(name)
}

/// An expression as written, but a function call's name in capitals (`count(*)` and
/// `COUNT(*)` are one aggregate).
fn canonical(ast: &ast::Expr) -> String {
    let text = ast.to_string();
    match ast {
        ast::Expr::Function(function) => {
            let name = function.name.to_string();
            match text.strip_prefix(&name) {
                Some(rest) => format!("{}{rest}", name.to_ascii_uppercase()),
                None => text,
            }
        }
        _ => text,
    }
}

/// `INTERVAL '5' MINUTE` or `INTERVAL '5 minutes'` in milliseconds.
fn interval_ms(ast: &ast::Expr) -> Result<i64, String> {
    let ast::Expr::Interval(interval) = ast else {
        return Err(format!("`{ast}` is not an INTERVAL"));
    };
    let text = match interval.value.as_ref() {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(t) | ast::Value::Number(t, _) => t.clone(),
            other => return Err(format!("`{other}` is not a number of units")),
        },
        other => return Err(format!("`{other}` is not a number of units")),
    };
    let (number, unit) = match &interval.leading_field {
        Some(field) => (text.trim().to_owned(), field.to_string()),
        None => {
            let mut parts = text.split_whitespace();
            let number = parts.next().unwrap_or_default().to_owned();
            (number, parts.next().unwrap_or_default().to_owned())
        }
    };
    let unit_ms: i64 = match unit.to_ascii_uppercase().trim_end_matches('S') {
        "MILLISECOND" => 1,
        "SECOND" => 1_000,
        "MINUTE" => 60_000,
        "HOUR" => 3_600_000,
        "DAY" => 86_400_000,
        other => {
            return Err(format!(
                "the unit `{other}` is not one of MILLISECOND, SECOND, MINUTE, HOUR, DAY"
            ));
        }
    };
    let count: i64 = number
        .parse()
        .map_err(|_| format!("`{number}` is not a whole number of units"))?;
    count
        .checked_mul(unit_ms)
        .filter(|ms| *ms >= 1)
        .ok_or_else(|| format!("`{ast}` must be at least 1 ms and fit 64 bits of ms"))
}

fn single_name(name: &ObjectName) -> Option<&Ident> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => Some(ident),
        _ => None,
    }
}

fn list(names: &[&str]) -> String {
    match names {
        [one] => format!("`{one}`"),
        _ => names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn list_names(names: &[String]) -> String {
    format!(
        "({})",
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The direct subexpressions of `expr`.
fn children(expr: &Expr) -> Vec<&Expr> {
    match expr {
        Expr::Literal(_)
        | Expr::Field(_)
        | Expr::Key
        | Expr::Header(_)
        | Expr::Headers
        | Expr::Timestamp
        | Expr::TableKey
        | Expr::Slot(_) => vec![],
        Expr::Neg(e, _) | Expr::Not(e, _) | Expr::IsNull(e, _) => vec![e],
        Expr::Is { expr, .. } | Expr::Cast { expr, .. } => vec![expr],
        Expr::Arith(_, a, b, _)
        | Expr::Concat(a, b, _)
        | Expr::Compare(_, a, b, _)
        | Expr::And(a, b, _)
        | Expr::Or(a, b, _)
        | Expr::Distinct {
            left: a, right: b, ..
        } => vec![a, b],
        Expr::In { expr, list, .. } => std::iter::once(&**expr).chain(list).collect(),
        Expr::Between {
            expr, low, high, ..
        } => vec![expr, low, high],
        Expr::Like {
            expr,
            pattern,
            escape,
            ..
        } => {
            let mut c: Vec<&Expr> = vec![expr, pattern];
            c.extend(escape.as_deref());
            c
        }
        Expr::Case {
            operand,
            whens,
            otherwise,
            ..
        } => operand
            .as_deref()
            .into_iter()
            .chain(whens.iter().flat_map(|(w, t)| [w, t]))
            .chain(otherwise.as_deref())
            .collect(),
        Expr::Coalesce(args) | Expr::Call { args, .. } => args.iter().collect(),
    }
}
