//! Stateful queries (`docs/stateful-sql.md`): `GROUP BY _key [, …] [, TUMBLE | HOP]` with
//! COUNT, SUM, AVG, MIN, MAX and COUNT(DISTINCT), fed one partition's records in offset order.
//!
//! What a partition emits is a function of its records in order and nothing else: stream
//! time is the partition's own, a record that counts is counted in all of its windows at
//! once, and a record that fails (late, or a value an aggregate cannot take) changes nothing.
//! That is what lets a restarted or replaced step rebuild the same state from the same
//! records. [`PartitionState`] is the whole state: what a store and changelog will persist.

use std::collections::{BTreeMap, BTreeSet, HashSet};

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

/// What a query's state is made of, as written (normalized by the SQL parser): two queries
/// with the same definition build the same state from the same records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StateDefinition {
    pub(crate) from: String,
    pub(crate) filter: Option<String>,
    pub(crate) groups: Vec<String>,
    /// The window function as written, e.g. `TUMBLE(_timestamp, INTERVAL '1' MINUTE)`.
    pub(crate) window: Option<String>,
    /// Each aggregate as written, in the order the state keeps them.
    pub(crate) aggregates: Vec<String>,
}

/// What a replaced stateful step's new life can start from (`docs/stateful-sql.md`, "Cutover
/// of a stateful step").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarryOver {
    /// The old life's state is the new one's: restore from its changelog.
    Reuse,
    /// Rebuild from the inputs: each partition read back to where its stream time was
    /// `span_ms` before the cutover's, without emitting.
    Rebuild { span_ms: i64 },
    /// Neither: the reviewer decides (start empty, or rebuild from the earliest offset).
    Cannot { why: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowKind {
    Tumble {
        size: i64,
    },
    Hop {
        size: i64,
        advance: i64,
    },
    /// Records closer than `gap` to each other, per group: `[first, last + gap)`.
    Session {
        gap: i64,
    },
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
            WindowKind::Session { gap } => vec![(t, t.saturating_add(gap))],
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
    pub(crate) definition: StateDefinition,
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
    /// By the group's values (their identities) and, windowed, its window's start: a
    /// group's sessions are one range.
    groups: BTreeMap<Vec<u8>, Group>,
    /// The windowed groups in the order they close: (end, start, seq, key).
    closing: BTreeSet<(i64, i64, u64, Vec<u8>)>,
    next_seq: u64,
    /// The input offset of the last record the state reflects ([`PartitionState::reflects`]).
    offset: Option<i64>,
    /// The groups changed (or gone) since [`PartitionState::take_changes`] last ran.
    changed: HashSet<Vec<u8>>,
    /// Whether the partition's own entry changed since then.
    meta_changed: bool,
    /// The values the groups' `COUNT(DISTINCT …)` sets hold, all together.
    distinct: usize,
}

/// One entry of a partition's changelog: a key, and its latest value (`None`: deleted, a
/// tombstone). Folding a partition's entries in order, the last value of each key winning
/// (what a compacted topic keeps), gives the state back ([`PartitionState::restore`]).
pub type Change = (Vec<u8>, Option<Vec<u8>>);

/// The changelog key of the partition's own entry (stream time, group order, offset). A
/// group's key begins with JSON text, never with a zero byte; and an empty key would not do,
/// as some clients send it as no key at all.
const META: &[u8] = b"\0";

impl PartitionState {
    /// The largest event time of a record that counted, if any did.
    pub fn stream_time(&self) -> Option<i64> {
        self.stream_time
    }

    /// How many groups (windows of a group) are open.
    pub fn open_groups(&self) -> usize {
        self.groups.len()
    }

    /// What the state's bound counts ([`Aggregation::feed_within`]): its open groups, and
    /// the values their `COUNT(DISTINCT …)` sets hold (a steady group would otherwise grow
    /// without end, one value at a time).
    pub fn entries(&self) -> usize {
        self.groups.len() + self.distinct
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

    fn insert(&mut self, key: Vec<u8>, group: Group) {
        self.remove(&key);
        if let Some((start, end)) = group.window {
            self.closing.insert((end, start, group.seq, key.clone()));
        }
        self.distinct += group.distinct_values();
        self.groups.insert(key, group);
    }

    fn remove(&mut self, key: &[u8]) -> Option<Group> {
        let group = self.groups.remove(key)?;
        if let Some((start, end)) = group.window {
            self.closing.remove(&(end, start, group.seq, key.to_vec()));
        }
        self.distinct -= group.distinct_values();
        Some(group)
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
                    state.insert(key, group);
                }
                (_, None) => {
                    state.remove(&key);
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
    // Collected through `Result`, a vector has room for four: exact, a group of a million
    // takes 200 bytes less.
    let (mut values, mut accs): (Vec<Value<'static>>, Vec<Acc>) = (values, accs);
    values.shrink_to_fit();
    accs.shrink_to_fit();
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

impl Group {
    /// The values its `COUNT(DISTINCT …)` sets hold.
    fn distinct_values(&self) -> usize {
        self.accs
            .iter()
            .map(|acc| match acc {
                Acc::Distinct(seen) => seen.len(),
                _ => 0,
            })
            .sum()
    }
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
            definition: StateDefinition::default(),
            grace: 0,
            emit,
        }
    }

    /// What the new life of a step that ran `old` and will run `self` can start from: the
    /// old state when both build the same state from the same records (the columns,
    /// HAVING and emission may differ); else a rebuild over the widest window and its grace,
    /// where windows bound what the state depends on; else nothing.
    pub fn carry_over(&self, old: &Aggregation) -> CarryOver {
        if self.definition == old.definition && self.grace == old.grace {
            return CarryOver::Reuse;
        }
        self.without_old_state()
    }

    /// What a new life with no old state it can restore starts from: a rebuild over the
    /// widest window and its grace, where windows bound what the state depends on; else
    /// nothing.
    pub fn without_old_state(&self) -> CarryOver {
        match self.window.as_ref().map(|w| w.kind) {
            Some(WindowKind::Tumble { size }) | Some(WindowKind::Hop { size, .. }) => {
                CarryOver::Rebuild {
                    span_ms: size.saturating_add(self.grace),
                }
            }
            Some(WindowKind::Session { .. }) => CarryOver::Cannot {
                why: "a session has no bounded length: no bounded history rebuilds its state"
                    .into(),
            },
            None => CarryOver::Cannot {
                why: "an aggregate without a window covers every record ever read".into(),
            },
        }
    }

    /// What the state is made of, as text: two queries with the same fingerprint build the
    /// same state from the same records ([`CarryOver::Reuse`]). A changelog is named by it.
    pub fn state_fingerprint(&self) -> String {
        let d = &self.definition;
        format!(
            "from={:?} where={:?} groups={:?} window={:?} aggregates={:?} grace={}",
            d.from, d.filter, d.groups, d.window, d.aggregates, self.grace
        )
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
        self.feed_within(state, record, timestamp, usize::MAX)
    }

    /// [`Aggregation::feed`], with `state` allowed at most `max_groups` open groups once the
    /// record is in (the windows it closes first): a record that would make more is refused
    /// (`state-full`) and `state` is as it was. Refusing only the records that open groups
    /// keeps the step running at its bound, and a record that closes windows still frees them.
    pub fn feed_within(
        &self,
        state: &mut PartitionState,
        record: &Record<'_>,
        timestamp: i64,
        max_groups: usize,
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
        let time = match &self.window {
            Some(window) => event_time(&window.time.eval(&row)?, &window.snippet)?,
            None => timestamp,
        };
        let mut identity_of_values = Vec::new();
        for value in &values {
            identity_of_values.extend_from_slice(&identity(value));
            identity_of_values.push(0);
        }
        let keyed = |window: Option<(i64, i64)>| {
            let mut key = identity_of_values.clone();
            if let Some((start, _)) = window {
                key.extend_from_slice(&start.to_be_bytes());
            }
            key
        };
        let targets: Vec<Target> = match &self.window {
            None => vec![(keyed(None), None, Vec::new())],
            Some(Window {
                kind: WindowKind::Session { gap },
                ..
            }) => {
                let merged: Vec<Vec<u8>> = state
                    .groups
                    .range(identity_of_values.clone()..)
                    .take_while(|(key, _)| key.starts_with(&identity_of_values))
                    .filter(|(_, group)| {
                        group.window.is_some_and(|(first, end)| {
                            time > first.saturating_sub(*gap) && time < end
                        })
                    })
                    .map(|(key, _)| key.clone())
                    .collect();
                let (first, end) = merged
                    .iter()
                    .filter_map(|key| state.groups.get(key)?.window)
                    .fold((time, time.saturating_add(*gap)), |(a, b), (c, d)| {
                        (a.min(c), b.max(d))
                    });
                vec![(keyed(Some((first, end))), Some((first, end)), merged)]
            }
            Some(window) => window
                .of(time)
                .into_iter()
                .map(|w| (keyed(Some(w)), Some(w), Vec::new()))
                .collect(),
        };
        // Late: the record's earliest window closed already (for a session: the one it
        // would open alone; one it joins is open).
        if let (Some(stream_time), Some((_, Some((start, end)), _))) =
            (state.stream_time, targets.first())
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
        // Everything that can fail, before anything changes.
        for (key, _, merged) in &targets {
            let existing: Vec<&Group> = std::iter::once(key)
                .chain(merged)
                .filter_map(|k| state.groups.get(k))
                .collect();
            self.check(&existing, &args)?;
        }
        let stream_time = state.stream_time.map_or(time, |st| st.max(time));
        if max_groups < usize::MAX {
            let opened = targets
                .iter()
                .filter(|(key, _, _)| !state.groups.contains_key(key))
                .count();
            // A merge keeps the merged sessions' distinct values (as many, or fewer).
            let merged_away: usize = targets
                .iter()
                .map(|(key, _, merged)| merged.iter().filter(|m| *m != key).count())
                .sum();
            let new_values: usize = targets
                .iter()
                .map(|(key, _, merged)| {
                    let existing: Vec<&Group> = std::iter::once(key)
                        .chain(merged)
                        .filter_map(|k| state.groups.get(k))
                        .collect();
                    self.new_distinct(&existing, &args)
                })
                .sum();
            let closing: usize = state
                .closing
                .iter()
                .take_while(|c| c.0.saturating_add(self.grace) <= stream_time)
                .map(|c| 1 + state.groups.get(&c.3).map_or(0, Group::distinct_values))
                .sum();
            let after =
                (state.entries() + opened + new_values).saturating_sub(merged_away + closing);
            if (opened > 0 || new_values > 0) && after > max_groups {
                return Err(EvalError::new(
                    "state-full",
                    format!(
                        "the record would grow the state beyond its bound of {max_groups} \
                         entries (the partition holds {} groups, and {} values of COUNT(DISTINCT \
                         …), now)",
                        state.groups.len(),
                        state.distinct
                    ),
                ));
            }
        }

        let mut outputs = Vec::new();
        state.stream_time = Some(stream_time);
        while let Some(first) = state.closing.first()
            && first.0.saturating_add(self.grace) <= stream_time
        {
            let key = first.3.clone();
            state.changed.insert(key.clone());
            if let Some(group) = state.remove(&key)
                && self.emit == Emit::Close
            {
                outputs.extend(self.output(&group, timestamp));
            }
        }
        for (key, window, merged) in targets {
            // A group that stays where it is (no session merged into it) is changed in place.
            if merged.is_empty()
                && let Some(group) = state.groups.get_mut(&key)
                && group.window == window
            {
                let before = group.distinct_values();
                self.add(group, &args);
                let added = group.distinct_values() - before;
                if self.emit == Emit::Update {
                    outputs.extend(self.output(group, timestamp));
                }
                state.distinct += added;
                state.changed.insert(key);
                continue;
            }
            let mut group = match state.remove(&key) {
                Some(group) => group,
                None => {
                    state.next_seq += 1;
                    Group {
                        seq: state.next_seq,
                        values: values.clone(),
                        window,
                        accs: self.aggs.iter().map(|a| Acc::new(a.func)).collect(),
                    }
                }
            };
            for other in merged {
                state.changed.insert(other.clone());
                if let Some(other) = state.remove(&other) {
                    group.seq = group.seq.min(other.seq);
                    for ((spec, acc), from) in
                        self.aggs.iter().zip(group.accs.iter_mut()).zip(other.accs)
                    {
                        merge(spec.func, acc, from);
                    }
                }
            }
            group.window = window;
            self.add(&mut group, &args);
            if self.emit == Emit::Update {
                outputs.extend(self.output(&group, timestamp));
            }
            state.changed.insert(key.clone());
            state.insert(key, group);
        }
        Ok(outputs)
    }

    /// The `COUNT(DISTINCT …)` values `args` would add to `groups` (one group, or the
    /// sessions it merges) that none of them holds yet.
    fn new_distinct(&self, groups: &[&Group], args: &[Option<Value<'static>>]) -> usize {
        self.aggs
            .iter()
            .zip(args)
            .enumerate()
            .filter(|(_, (spec, arg))| {
                spec.func == AggFunc::CountDistinct && arg.as_ref().is_some_and(|a| !a.is_null())
            })
            .filter(|(i, (_, arg))| {
                let Some(arg) = arg else { return false };
                let id = identity(arg);
                !groups.iter().any(
                    |g| matches!(g.accs.get(*i), Some(Acc::Distinct(seen)) if seen.contains(&id)),
                )
            })
            .count()
    }

    /// Whether `args` can join `groups` (one group, or the sessions it merges): MIN and MAX
    /// compare only values of one kind, SUM and AVG take numbers.
    fn check(&self, groups: &[&Group], args: &[Option<Value<'static>>]) -> Result<(), EvalError> {
        for (i, (spec, arg)) in self.aggs.iter().zip(args).enumerate() {
            let arg = arg.as_ref().filter(|a| !a.is_null());
            if let Some(arg) = arg {
                Self::check_arg(spec, arg)?;
            }
            let extremes: Vec<&Value<'static>> = groups
                .iter()
                .filter_map(|g| match g.accs.get(i) {
                    Some(Acc::Extreme(Some(v))) => Some(v),
                    _ => None,
                })
                .chain(arg)
                .collect();
            if let Some((first, rest)) = extremes.split_first() {
                for other in rest {
                    if !matches!(value::compare(first, other), Ok(Some(_))) {
                        return Err(EvalError::sql(format!(
                            "`{}`: cannot compare {} with {} of earlier records of the group",
                            spec.snippet,
                            other.kind(),
                            first.kind()
                        )));
                    }
                }
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

/// A group a record joins: its key, its window, and the keys of the open sessions it merges.
type Target = (Vec<u8>, Option<(i64, i64)>, Vec<Vec<u8>>);

/// Folds the accumulator of a session into the one it merges with.
fn merge(func: AggFunc, into: &mut Acc, from: Acc) {
    match (into, from) {
        (Acc::Count(a), Acc::Count(b)) => *a += b,
        (Acc::Distinct(a), Acc::Distinct(b)) => a.extend(b),
        (Acc::Sum(a), Acc::Sum(Some(b))) => *a = Some(add_sum(a.take(), &b)),
        (Acc::Avg { sum, count }, Acc::Avg { sum: s, count: c }) => {
            *sum += s;
            *count += c;
        }
        (Acc::Extreme(a), Acc::Extreme(Some(b))) => {
            let replace = match a.as_ref() {
                None => true,
                Some(current) => match value::compare(&b, current) {
                    Ok(Some(order)) if func == AggFunc::Min => order.is_lt(),
                    Ok(Some(order)) => order.is_gt(),
                    _ => false,
                },
            };
            if replace {
                *a = Some(b);
            }
        }
        _ => {}
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
