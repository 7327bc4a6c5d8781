//! Stateful queries (`docs/stateful-sql.md`): `GROUP BY _key [, …] [, TUMBLE | HOP]` with
//! COUNT, SUM, AVG, MIN, MAX and COUNT(DISTINCT), fed one partition's records in offset order.
//!
//! What a partition emits is a function of its records in order and nothing else: stream
//! time is the partition's own, a record that counts is counted in all of its windows at
//! once, and a record that fails (late, or a value an aggregate cannot take) changes nothing.
//! That is what lets a restarted or replaced step rebuild the same state from the same
//! records. [`PartitionState`] is the whole state: what a store and changelog will persist.

use std::collections::{HashMap, HashSet};

use crate::compile::{Compiled, Problem, compile_any};
use crate::expr::{Expr, Row, Snippet};
use crate::value::{self, Value};
use crate::{EvalError, Record, write_value};

/// How a windowed query emits (`emit:` in the step file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// Once per window, when it closes: its final aggregates.
    Close,
    /// After every record that reaches a group: the group's aggregates so far.
    Update,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggFunc {
    CountStar,
    Count,
    CountDistinct,
    Sum,
    Avg,
    Min,
    Max,
}

#[derive(Debug, Clone)]
pub(crate) struct AggSpec {
    pub(crate) func: AggFunc,
    /// `None` for `COUNT(*)`.
    pub(crate) arg: Option<Expr>,
    pub(crate) snippet: Snippet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowKind {
    Tumble { size: i64 },
    Hop { size: i64, advance: i64 },
}

#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// The event time of a record, ms since the epoch (or an RFC 3339 string).
    pub(crate) time: Expr,
    pub(crate) kind: WindowKind,
    pub(crate) snippet: Snippet,
}

impl Window {
    /// Stands in for a window the compiler refused (the query does not compile).
    pub(crate) fn invalid(snippet: Snippet) -> Window {
        Window {
            time: Expr::Literal(Value::Null),
            kind: WindowKind::Tumble { size: 1 },
            snippet,
        }
    }

    /// The windows `[start, end)` holding time `t`, oldest first.
    fn of(&self, t: i64) -> Vec<(i64, i64)> {
        match self.kind {
            WindowKind::Tumble { size } => {
                let start = t.div_euclid(size).saturating_mul(size);
                vec![(start, start.saturating_add(size))]
            }
            WindowKind::Hop { size, advance } => {
                let last = t.div_euclid(advance).saturating_mul(advance);
                let count = size / advance;
                (0..count)
                    .rev()
                    .map(|k| {
                        let start = last.saturating_sub(k.saturating_mul(advance));
                        (start, start.saturating_add(size))
                    })
                    .collect()
            }
        }
    }
}

/// A compiled stateful query.
#[derive(Debug, Clone)]
pub struct Aggregation {
    from: String,
    filter: Option<Expr>,
    groups: Vec<Expr>,
    /// Which of `groups` is `_key`: the outputs' key.
    key_group: usize,
    window: Option<Window>,
    aggs: Vec<AggSpec>,
    columns: Vec<(Vec<u8>, Expr)>,
    having: Option<Expr>,
    pub(crate) paths: Vec<Vec<String>>,
    grace: i64,
    emit: Emit,
}

/// One output of a group: its value, or why the columns could not be computed (it goes to
/// the dead-letter topic in its stead).
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub key: Option<Vec<u8>>,
    pub timestamp: i64,
    pub value: Result<Vec<u8>, EvalError>,
    /// The window `[start, end)` of a windowed output.
    pub window: Option<(i64, i64)>,
}

/// What one partition's records built: its stream time and its open groups.
#[derive(Debug, Clone, Default)]
pub struct PartitionState {
    stream_time: Option<i64>,
    groups: HashMap<Vec<u8>, Group>,
    next_seq: u64,
    /// The input offset of the last record the state reflects ([`PartitionState::reflects`]).
    offset: Option<i64>,
    /// The groups changed (or gone) since [`PartitionState::take_changes`] last ran.
    changed: HashSet<Vec<u8>>,
    /// Whether the partition's own entry changed since then.
    meta_changed: bool,
}

/// One entry of a partition's changelog: a key, and its latest value (`None`: deleted, a
/// tombstone). Folding a partition's entries in order, the last value of each key winning
/// (what a compacted topic keeps), gives the state back ([`PartitionState::restore`]).
pub type Change = (Vec<u8>, Option<Vec<u8>>);

/// The changelog key of the partition's own entry (stream time, group order); a group's key
/// is never empty (it holds at least `_key`'s value and a separator).
const META: &[u8] = b"";

impl PartitionState {
    /// The largest event time of a record that counted, if any did.
    pub fn stream_time(&self) -> Option<i64> {
        self.stream_time
    }

    /// How many groups (windows of a group) are open.
    pub fn open_groups(&self) -> usize {
        self.groups.len()
    }

    /// Notes that the state reflects the record at input `offset` (fed, counted or not): a
    /// restore skips records at or below it.
    pub fn reflects(&mut self, offset: i64) {
        self.offset = Some(offset);
        self.meta_changed = true;
    }

    /// The input offset of the last record the state reflects, if any.
    pub fn offset(&self) -> Option<i64> {
        self.offset
    }

    /// What changed since the last call, as changelog entries: each changed group's value
    /// (or a tombstone for one closed), then the partition's own entry.
    pub fn take_changes(&mut self) -> Vec<Change> {
        if self.changed.is_empty() && !std::mem::take(&mut self.meta_changed) {
            return Vec::new();
        }
        self.meta_changed = false;
        let mut keys: Vec<Vec<u8>> = self.changed.drain().collect();
        keys.sort();
        let mut changes: Vec<Change> = keys
            .into_iter()
            .map(|key| {
                let value = self.groups.get(&key).map(encode_group);
                (key, value)
            })
            .collect();
        let meta = serde_json::json!({
            "streamTime": self.stream_time,
            "nextSeq": self.next_seq,
            "offset": self.offset,
        });
        changes.push((META.to_vec(), Some(meta.to_string().into_bytes())));
        changes
    }

    /// The state a partition's changelog entries (in order) describe. `Err` names an entry
    /// this version cannot read.
    pub fn restore(changes: impl IntoIterator<Item = Change>) -> Result<PartitionState, String> {
        let mut state = PartitionState::default();
        for (key, value) in changes {
            match (key.as_slice(), value) {
                (META, Some(value)) => {
                    let meta: serde_json::Value = serde_json::from_slice(&value)
                        .map_err(|e| format!("the partition's entry is not JSON: {e}"))?;
                    state.stream_time = meta["streamTime"].as_i64();
                    state.next_seq = meta["nextSeq"].as_u64().unwrap_or(0);
                    state.offset = meta["offset"].as_i64();
                }
                (META, None) => {
                    state.stream_time = None;
                    state.next_seq = 0;
                    state.offset = None;
                }
                (_, Some(value)) => {
                    let group = decode_group(&value)?;
                    state.groups.insert(key, group);
                }
                (_, None) => {
                    state.groups.remove(&key);
                }
            }
        }
        Ok(state)
    }
}

fn encode_value(value: &Value<'_>) -> serde_json::Value {
    let mut out = Vec::new();
    match write_value(&mut out, value) {
        Ok(()) => serde_json::from_slice(&out).unwrap_or(serde_json::Value::Null),
        Err(_) => serde_json::Value::Null,
    }
}

fn decode_value(json: &serde_json::Value) -> Result<Value<'static>, String> {
    let text = json.to_string();
    let raw = serde_json::value::RawValue::from_string(text)
        .map_err(|e| format!("a value of a group is not JSON: {e}"))?;
    Value::from_raw(&raw)
        .map(Value::into_static)
        .map_err(|e| e.message)
}

fn encode_group(group: &Group) -> Vec<u8> {
    let accs: Vec<serde_json::Value> = group
        .accs
        .iter()
        .map(|acc| match acc {
            Acc::Count(n) => serde_json::json!({"count": n}),
            Acc::Distinct(seen) => {
                let mut seen: Vec<String> = seen
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect();
                seen.sort();
                serde_json::json!({"distinct": seen})
            }
            Acc::Sum(sum) => serde_json::json!({"sum": sum.as_ref().map(encode_value)}),
            Acc::Avg { sum, count } => serde_json::json!({"avg": [sum, count]}),
            Acc::Extreme(v) => serde_json::json!({"extreme": v.as_ref().map(encode_value)}),
        })
        .collect();
    serde_json::json!({
        "seq": group.seq,
        "values": group.values.iter().map(encode_value).collect::<Vec<_>>(),
        "window": group.window.map(|(start, end)| [start, end]),
        "accs": accs,
    })
    .to_string()
    .into_bytes()
}

fn decode_group(bytes: &[u8]) -> Result<Group, String> {
    let json: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("a group's entry is not JSON: {e}"))?;
    let bad = || format!("a group's entry is not one this version wrote: {json}");
    let values = json["values"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(decode_value)
        .collect::<Result<_, _>>()?;
    let window = match &json["window"] {
        serde_json::Value::Null => None,
        w => Some((
            w[0].as_i64().ok_or_else(bad)?,
            w[1].as_i64().ok_or_else(bad)?,
        )),
    };
    let optional = |v: &serde_json::Value| match v {
        serde_json::Value::Null => Ok(None),
        v => decode_value(v).map(Some),
    };
    let accs = json["accs"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|acc| {
            if let Some(n) = acc.get("count") {
                return n.as_i64().map(Acc::Count).ok_or_else(bad);
            }
            if let Some(seen) = acc.get("distinct") {
                let seen = seen.as_array().ok_or_else(bad)?;
                return Ok(Acc::Distinct(
                    seen.iter()
                        .filter_map(|s| s.as_str().map(|s| s.as_bytes().to_vec()))
                        .collect(),
                ));
            }
            if let Some(sum) = acc.get("sum") {
                return optional(sum).map(Acc::Sum);
            }
            if let Some(avg) = acc.get("avg") {
                return Ok(Acc::Avg {
                    sum: avg[0].as_f64().ok_or_else(bad)?,
                    count: avg[1].as_i64().ok_or_else(bad)?,
                });
            }
            if let Some(v) = acc.get("extreme") {
                return optional(v).map(Acc::Extreme);
            }
            Err(bad())
        })
        .collect::<Result<_, _>>()?;
    Ok(Group {
        seq: json["seq"].as_u64().ok_or_else(bad)?,
        values,
        window,
        accs,
    })
}

#[derive(Debug, Clone)]
struct Group {
    /// The order groups were first seen in: ties between outputs go by it.
    seq: u64,
    values: Vec<Value<'static>>,
    window: Option<(i64, i64)>,
    accs: Vec<Acc>,
}

#[derive(Debug, Clone)]
enum Acc {
    Count(i64),
    Distinct(HashSet<Vec<u8>>),
    /// SQLite's SUM: NULL until a value, an integer until a real (or an overflow).
    Sum(Option<Value<'static>>),
    Avg {
        sum: f64,
        count: i64,
    },
    Extreme(Option<Value<'static>>),
}

impl Acc {
    fn new(func: AggFunc) -> Acc {
        match func {
            AggFunc::CountStar | AggFunc::Count => Acc::Count(0),
            AggFunc::CountDistinct => Acc::Distinct(HashSet::new()),
            AggFunc::Sum => Acc::Sum(None),
            AggFunc::Avg => Acc::Avg { sum: 0.0, count: 0 },
            AggFunc::Min | AggFunc::Max => Acc::Extreme(None),
        }
    }

    fn result(&self) -> Value<'static> {
        match self {
            Acc::Count(n) => Value::Int(*n),
            Acc::Distinct(seen) => Value::Int(i64::try_from(seen.len()).unwrap_or(i64::MAX)),
            Acc::Sum(sum) => sum.clone().unwrap_or(Value::Null),
            Acc::Avg { count: 0, .. } => Value::Null,
            Acc::Avg { sum, count } => Value::Float(sum / *count as f64),
            Acc::Extreme(v) => v.clone().unwrap_or(Value::Null),
        }
    }
}

/// A value as bytes that are equal exactly when SQL calls the values the same group or the
/// same DISTINCT value (1 and 1.0 alike, as in SQLite).
fn identity(value: &Value<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match value {
        Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
            out.extend_from_slice(itoa::Buffer::new().format(*f as i64).as_bytes());
        }
        Value::Float(f) if !f.is_finite() => out.extend_from_slice(b"nan"),
        other => {
            let _ = write_value(&mut out, other);
        }
    }
    out
}

impl Aggregation {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        from: String,
        filter: Option<Expr>,
        groups: Vec<Expr>,
        key_group: usize,
        window: Option<Window>,
        aggs: Vec<AggSpec>,
        columns: Vec<(Vec<u8>, Expr)>,
        having: Option<Expr>,
    ) -> Aggregation {
        let emit = if window.is_some() {
            Emit::Close
        } else {
            Emit::Update
        };
        Aggregation {
            from,
            filter,
            groups,
            key_group,
            window,
            aggs,
            columns,
            having,
            paths: Vec::new(),
            grace: 0,
            emit,
        }
    }

    /// Compiles a query with `GROUP BY`; problems at their line and column, as
    /// [`crate::Query::compile`] (a query without GROUP BY is one, too: it is stateless).
    pub fn compile(sql: &str, inputs: Option<&[&str]>) -> Result<Aggregation, Vec<Problem>> {
        match compile_any(sql, inputs, true)? {
            Compiled::Stateful(aggregation) => Ok(*aggregation),
            Compiled::Stateless(_) => Err(vec![Problem {
                line: 1,
                column: 1,
                message: "the query has no GROUP BY: it is stateless".into(),
            }]),
        }
    }

    /// How long after its end a window takes late records (`grace:`), in ms.
    pub fn with_grace(mut self, grace_ms: i64) -> Self {
        self.grace = grace_ms.max(0);
        self
    }

    /// How a windowed query emits; a query without a window always emits on update.
    pub fn with_emit(mut self, emit: Emit) -> Self {
        if self.window.is_some() {
            self.emit = emit;
        }
        self
    }

    /// The input step it reads.
    pub fn from(&self) -> &str {
        &self.from
    }

    pub fn windowed(&self) -> bool {
        self.window.is_some()
    }

    /// Feeds one record of a partition (`timestamp`: its Kafka timestamp, ms) and returns
    /// what it makes the partition emit. `Err`: the record goes to the dead-letter topic
    /// (`late-record`, `invalid-json`, `sql-error`) and `state` is as it was.
    pub fn feed(
        &self,
        state: &mut PartitionState,
        record: &Record<'_>,
        timestamp: i64,
    ) -> Result<Vec<Output>, EvalError> {
        let mut row = crate::parse_row(record, &self.paths)?;
        row.timestamp = Some(timestamp);
        if let Some(filter) = &self.filter {
            let keep = value::truth(&filter.eval(&row)?)
                .map_err(|m| EvalError::sql(format!("WHERE: {m}")))?;
            if keep != Some(true) {
                return Ok(Vec::new());
            }
        }
        let values: Vec<Value<'static>> = self
            .groups
            .iter()
            .map(|g| g.eval(&row).map(Value::into_static))
            .collect::<Result<_, _>>()?;
        let args: Vec<Option<Value<'static>>> = self
            .aggs
            .iter()
            .map(|a| {
                a.arg
                    .as_ref()
                    .map(|e| e.eval(&row).map(Value::into_static))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        let (time, windows) = match &self.window {
            Some(window) => {
                let time = event_time(&window.time.eval(&row)?, &window.snippet)?;
                (time, window.of(time).into_iter().map(Some).collect())
            }
            None => (timestamp, vec![None]),
        };
        if let (Some(stream_time), Some(Some((start, end)))) = (state.stream_time, windows.first())
            && end.saturating_add(self.grace) <= stream_time
        {
            return Err(EvalError::new(
                "late-record",
                format!(
                    "the record's time {time} falls in the window [{start}, {end}), closed at \
                     {} (its end plus the grace of {} ms); the partition's stream time is \
                     {stream_time}",
                    end.saturating_add(self.grace),
                    self.grace
                ),
            ));
        }
        let mut identity_of_values = Vec::new();
        for value in &values {
            identity_of_values.extend_from_slice(&identity(value));
            identity_of_values.push(0);
        }
        let keys: Vec<Vec<u8>> = windows
            .iter()
            .map(|window| {
                let mut key = identity_of_values.clone();
                if let Some((start, _)) = window {
                    key.extend_from_slice(&start.to_be_bytes());
                }
                key
            })
            .collect();
        // Everything that can fail, before anything changes.
        for key in &keys {
            if let Some(group) = state.groups.get(key) {
                self.check(group, &args)?;
            } else {
                self.check_new(&args)?;
            }
        }

        let mut outputs = Vec::new();
        if self.window.is_some() {
            let stream_time = state.stream_time.map_or(time, |st| st.max(time));
            state.stream_time = Some(stream_time);
            let mut closed: Vec<(Vec<u8>, (i64, i64), u64)> = state
                .groups
                .iter()
                .filter_map(|(key, group)| {
                    let window = group.window?;
                    (window.1.saturating_add(self.grace) <= stream_time)
                        .then(|| (key.clone(), window, group.seq))
                })
                .collect();
            closed.sort_by_key(|(_, (start, end), seq)| (*end, *start, *seq));
            for (key, _, _) in closed {
                state.changed.insert(key.clone());
                if let Some(group) = state.groups.remove(&key)
                    && self.emit == Emit::Close
                {
                    outputs.extend(self.output(&group, timestamp));
                }
            }
        } else {
            state.stream_time = Some(state.stream_time.map_or(time, |st| st.max(time)));
        }
        for (key, window) in keys.into_iter().zip(windows) {
            state.changed.insert(key.clone());
            let next_seq = &mut state.next_seq;
            let group = state.groups.entry(key).or_insert_with(|| {
                *next_seq += 1;
                Group {
                    seq: *next_seq,
                    values: values.clone(),
                    window,
                    accs: self.aggs.iter().map(|a| Acc::new(a.func)).collect(),
                }
            });
            self.add(group, &args);
            if self.emit == Emit::Update {
                outputs.extend(self.output(group, timestamp));
            }
        }
        Ok(outputs)
    }

    /// Whether `args` can join `group` (MIN and MAX compare only values of one kind; SUM and
    /// AVG take numbers).
    fn check(&self, group: &Group, args: &[Option<Value<'static>>]) -> Result<(), EvalError> {
        for ((spec, acc), arg) in self.aggs.iter().zip(&group.accs).zip(args) {
            let Some(arg) = arg.as_ref().filter(|a| !a.is_null()) else {
                continue;
            };
            Self::check_arg(spec, arg)?;
            if let Acc::Extreme(Some(current)) = acc
                && !matches!(value::compare(current, arg), Ok(Some(_)))
            {
                return Err(EvalError::sql(format!(
                    "`{}`: cannot compare {} with {} of earlier records of the group",
                    spec.snippet,
                    arg.kind(),
                    current.kind()
                )));
            }
        }
        Ok(())
    }

    fn check_new(&self, args: &[Option<Value<'static>>]) -> Result<(), EvalError> {
        for (spec, arg) in self.aggs.iter().zip(args) {
            if let Some(arg) = arg.as_ref().filter(|a| !a.is_null()) {
                Self::check_arg(spec, arg)?;
            }
        }
        Ok(())
    }

    fn check_arg(spec: &AggSpec, arg: &Value<'_>) -> Result<(), EvalError> {
        match (spec.func, arg) {
            (AggFunc::Sum | AggFunc::Avg, Value::Int(_) | Value::Float(_)) => Ok(()),
            (AggFunc::Sum | AggFunc::Avg, other) => Err(EvalError::sql(format!(
                "`{}`: {} is not a number",
                spec.snippet,
                other.kind()
            ))),
            (AggFunc::Min | AggFunc::Max, Value::Json(_)) => Err(EvalError::sql(format!(
                "`{}`: {} has no order",
                spec.snippet,
                arg.kind()
            ))),
            _ => Ok(()),
        }
    }

    fn add(&self, group: &mut Group, args: &[Option<Value<'static>>]) {
        for ((spec, acc), arg) in self.aggs.iter().zip(&mut group.accs).zip(args) {
            let arg = arg.as_ref().filter(|a| !a.is_null());
            match (acc, arg) {
                (Acc::Count(n), _) if spec.func == AggFunc::CountStar => *n += 1,
                (Acc::Count(n), Some(_)) => *n += 1,
                (Acc::Distinct(seen), Some(arg)) => {
                    seen.insert(identity(arg));
                }
                (Acc::Sum(sum), Some(arg)) => *sum = Some(add_sum(sum.take(), arg)),
                (Acc::Avg { sum, count }, Some(arg)) => {
                    *sum += value::as_f64(arg);
                    *count += 1;
                }
                (Acc::Extreme(current), Some(arg)) => {
                    let replace = match current.as_ref() {
                        None => true,
                        Some(c) => match value::compare(arg, c) {
                            Ok(Some(order)) => match spec.func {
                                AggFunc::Min => order.is_lt(),
                                _ => order.is_gt(),
                            },
                            _ => false,
                        },
                    };
                    if replace {
                        *current = Some(arg.clone());
                    }
                }
                _ => {}
            }
        }
    }

    /// The output of `group` (nothing when HAVING does not hold).
    fn output(&self, group: &Group, timestamp: i64) -> Option<Output> {
        let mut slots = group.values.clone();
        match group.window {
            Some((start, end)) => slots.extend([Value::Int(start), Value::Int(end)]),
            None => slots.extend([Value::Null, Value::Null]),
        }
        slots.extend(group.accs.iter().map(Acc::result));
        let row = Row::of_slots(&slots);
        let key = match group.values.get(self.key_group) {
            Some(Value::Text(text)) => Some(text.as_bytes().to_vec()),
            _ => None,
        };
        let timestamp = group.window.map_or(timestamp, |(_, end)| end - 1);
        let value = (|| {
            if let Some(having) = &self.having {
                let keep = value::truth(&having.eval(&row)?)
                    .map_err(|m| EvalError::sql(format!("HAVING: {m}")))?;
                if keep != Some(true) {
                    return Ok(None);
                }
            }
            let mut out = Vec::new();
            out.push(b'{');
            for (i, (name, expr)) in self.columns.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(name);
                write_value(&mut out, &expr.eval(&row)?)?;
            }
            out.push(b'}');
            Ok(Some(out))
        })();
        let value = value.transpose()?;
        Some(Output {
            key,
            timestamp,
            value,
            window: group.window,
        })
    }
}

/// SQLite's SUM step: integers add as integers until one overflows or a real comes.
fn add_sum(sum: Option<Value<'static>>, arg: &Value<'_>) -> Value<'static> {
    match (sum, arg) {
        (None, Value::Int(i)) => Value::Int(*i),
        (None, other) => Value::Float(value::as_f64(other)),
        (Some(Value::Int(a)), Value::Int(b)) => match a.checked_add(*b) {
            Some(s) => Value::Int(s),
            None => Value::Float(a as f64 + *b as f64),
        },
        (Some(current), other) => Value::Float(value::as_f64(&current) + value::as_f64(other)),
    }
}

/// A record's event time in ms: a number of ms, or an RFC 3339 string.
fn event_time(value: &Value<'_>, snippet: &str) -> Result<i64, EvalError> {
    match value {
        Value::Int(ms) => Ok(*ms),
        Value::Float(ms) if ms.is_finite() && ms.fract() == 0.0 && ms.abs() < 9.0e15 => {
            Ok(*ms as i64)
        }
        Value::Text(text) => text
            .parse::<jiff::Timestamp>()
            .map(|t| t.as_millisecond())
            .map_err(|e| {
                EvalError::sql(format!(
                    "`{snippet}`: the event time `{text}` is not RFC 3339: {e}"
                ))
            }),
        other => Err(EvalError::sql(format!(
            "`{snippet}`: the event time is {}, not a number of ms or an RFC 3339 string",
            other.kind()
        ))),
    }
}
