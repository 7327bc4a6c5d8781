//! SQLite as the oracle of stateful queries (`docs/stateful-sql.md`): generated records of one
//! partition (keys, some without; fields missing or NULL; event times in order, out of order
//! and late) go through [`Aggregation::feed`] one by one, and what it emits is compared with
//! SQLite's `GROUP BY` over the same records.
//!
//! Which records count, and which records each window holds, is decided here from the spec
//! ([`Model`]), not taken from the engine: a record passes `WHERE` when SQLite says so, and is
//! late when its earliest window (for a session, the one it would open alone) ended, plus the
//! grace, at or before the stream time of the records that counted before it; a session
//! takes the records closer than its gap and merges the sessions a record bridges. SQLite then
//! aggregates each window's records:
//! - emitting on close: after each record, exactly the windows it closed, once, with SQLite's
//!   aggregates over their records;
//! - emitting on update (and without a window): after each record that counts, one output per
//!   window of the record, with SQLite's aggregates over that window's records so far.
//!
//! Every late record must come back as a `late-record` error, every other as outputs.
//!
//! And state restored from a changelog is the state: a partition whose changes were taken
//! every few records, rebuilt from them at one of those points and fed the records after it,
//! emits exactly what the partition that never stopped emitted for them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use plumber_sql::{Aggregation, Emit, PartitionState, Record};
use proptest::prelude::*;
use rusqlite::Connection;
use rusqlite::types::Value as Lite;
use serde_json::Value as Json;

#[derive(Debug, Clone, Copy)]
enum Win {
    Tumble(i64),
    Hop(i64, i64),
    Session(i64),
    None,
}

impl Win {
    fn of(self, t: i64) -> Vec<(i64, i64)> {
        match self {
            Win::Tumble(size) => {
                let start = t.div_euclid(size) * size;
                vec![(start, start + size)]
            }
            Win::Hop(size, advance) => {
                let last = t.div_euclid(advance) * advance;
                (0..size / advance)
                    .rev()
                    .map(|k| (last - k * advance, last - k * advance + size))
                    .collect()
            }
            Win::Session(_) | Win::None => vec![],
        }
    }

    fn sql(self, time: &str) -> String {
        match self {
            Win::Tumble(size) => format!(", TUMBLE({time}, INTERVAL '{size} milliseconds')"),
            Win::Hop(size, advance) => format!(
                ", HOP({time}, INTERVAL '{size} milliseconds', INTERVAL '{advance} milliseconds')"
            ),
            Win::Session(gap) => format!(", SESSION({time}, INTERVAL '{gap} milliseconds')"),
            Win::None => String::new(),
        }
    }
}

#[derive(Debug, Clone)]
struct Rec {
    key: Option<String>,
    x: Option<i64>,
    y: Option<f64>,
    cat: Option<String>,
    /// The event time, as the Kafka timestamp or the field `t`.
    time: i64,
}

impl Rec {
    fn json(&self, time_field: bool) -> String {
        let mut object = serde_json::Map::new();
        if let Some(x) = self.x {
            object.insert("x".into(), x.into());
        }
        if let Some(y) = self.y {
            object.insert("y".into(), y.into());
        }
        if let Some(cat) = &self.cat {
            object.insert("cat".into(), cat.clone().into());
        }
        if time_field {
            object.insert("t".into(), self.time.into());
        }
        Json::Object(object).to_string()
    }
}

#[derive(Debug, Clone)]
struct Case {
    window: Win,
    grace: i64,
    filter: &'static str,
    update: bool,
    time_field: bool,
    records: Vec<Rec>,
}

const FILTERS: [&str; 4] = ["", "x > 2", "cat <> 'b'", "x IS NOT NULL OR y > 0"];

fn case() -> impl Strategy<Value = Case> {
    let window = prop_oneof![
        (1i64..=4).prop_map(|s| Win::Tumble(s * 10)),
        ((1i64..=2), (2i64..=3)).prop_map(|(a, k)| Win::Hop(a * 5 * k, a * 5)),
        (1i64..=4).prop_map(|g| Win::Session(g * 4)),
        Just(Win::None),
    ];
    let record = (
        prop::option::weighted(0.9, prop::sample::select(vec!["k1", "k2", "k3"])),
        prop::option::weighted(0.8, -5i64..10),
        prop::option::weighted(0.8, (-20i64..20).prop_map(|v| v as f64 / 4.0 + 0.125)),
        prop::option::weighted(0.8, prop::sample::select(vec!["a", "b", "c"])),
        -30i64..12,
    );
    (
        window,
        prop::sample::select(vec![0i64, 5, 20]),
        prop::sample::select(FILTERS.to_vec()),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(record, 0..60),
    )
        .prop_map(|(window, grace, filter, update, time_field, raw)| {
            // Times drift upwards with jitter: some out of order, some late.
            let mut clock = 1_000i64;
            let records = raw
                .into_iter()
                .map(|(key, x, y, cat, jitter)| {
                    clock += 4;
                    Rec {
                        key: key.map(str::to_owned),
                        x,
                        y,
                        cat: cat.map(str::to_owned),
                        time: clock + jitter,
                    }
                })
                .collect();
            Case {
                window,
                grace,
                filter,
                update,
                time_field,
                records,
            }
        })
}

const COLUMNS: &str = "COUNT(*) AS n, COUNT(x) AS nx, COUNT(DISTINCT cat) AS dc, SUM(x) AS sx, \
                       AVG(y) AS ay, MIN(x) AS mn, MAX(y) AS mx, MIN(cat) AS mc";

fn query(case: &Case) -> String {
    let time = if case.time_field { "t" } else { "_timestamp" };
    let bounds = match case.window {
        Win::None => "",
        _ => "window_start AS ws, window_end AS we, ",
    };
    let filter = if case.filter.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", case.filter)
    };
    format!(
        "SELECT _key AS k, {bounds}{COLUMNS} FROM s{filter} GROUP BY _key{}",
        case.window.sql(time)
    )
}

/// What SQLite says of one group's records: the columns of [`COLUMNS`].
fn sqlite_group(db: &Connection, key: &Option<String>, seqs: &[usize]) -> Vec<Lite> {
    let list = seqs
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let sql = format!(
        "SELECT COUNT(*), COUNT(x), COUNT(DISTINCT cat), SUM(x), AVG(y), MIN(x), MAX(y), \
         MIN(cat) FROM r WHERE seq IN ({list}) AND key IS ?1"
    );
    db.query_row(&sql, [key], |row| {
        (0..8).map(|i| row.get::<_, Lite>(i)).collect()
    })
    .unwrap()
}

fn same(ours: &Json, theirs: &Lite) -> bool {
    match (ours, theirs) {
        (Json::Null, Lite::Null) => true,
        (Json::Number(n), Lite::Integer(i)) => n.as_i64() == Some(*i),
        (Json::Number(n), Lite::Real(r)) => n
            .as_f64()
            .is_some_and(|f| (f - r).abs() <= 1e-9 * r.abs().max(1.0)),
        (Json::String(s), Lite::Text(t)) => s == t,
        _ => false,
    }
}

/// One group of the model: its key, its window (`(0, 0)` without one) and its records.
type ModelGroup = (Option<String>, (i64, i64), Vec<usize>);

/// The spec, record by record: which records are late, which groups a record closes and
/// which it updates, for SQLite to aggregate.
#[derive(Default)]
struct Model {
    stream_time: Option<i64>,
    open: Vec<ModelGroup>,
}

enum Step {
    Late,
    Counted {
        closed: Vec<ModelGroup>,
        updated: Vec<ModelGroup>,
    },
}

impl Model {
    fn step(&mut self, case: &Case, seq: usize) -> Step {
        let rec = &case.records[seq];
        let t = rec.time;
        // The windows the record joins, each with the open sessions it merges (indices).
        let joins: Vec<((i64, i64), Vec<usize>)> = match case.window {
            Win::None => vec![((0, 0), vec![])],
            Win::Session(gap) => {
                let merged: Vec<usize> = (0..self.open.len())
                    .filter(|&i| {
                        let (first, end) = self.open[i].1;
                        self.open[i].0 == rec.key && t > first - gap && t < end
                    })
                    .collect();
                let bounds = merged
                    .iter()
                    .map(|&i| self.open[i].1)
                    .fold((t, t + gap), |(a, b), (c, d)| (a.min(c), b.max(d)));
                vec![(bounds, merged)]
            }
            w => w.of(t).into_iter().map(|b| (b, vec![])).collect(),
        };
        let late = !matches!(case.window, Win::None)
            && self
                .stream_time
                .is_some_and(|st| joins[0].0.1 + case.grace <= st);
        if late {
            return Step::Late;
        }
        let st = self.stream_time.map_or(t, |st| st.max(t));
        self.stream_time = Some(st);
        // Merged sessions leave the open list with their records (nothing closes them now:
        // they end after t).
        let mut joins: Vec<((i64, i64), Vec<usize>)> = joins
            .into_iter()
            .map(|(bounds, mut merged)| {
                merged.sort_unstable_by(|a, b| b.cmp(a));
                let members = merged
                    .into_iter()
                    .flat_map(|i| self.open.remove(i).2)
                    .collect();
                (bounds, members)
            })
            .collect();
        let mut closed = Vec::new();
        if !matches!(case.window, Win::None) {
            let (shut, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.open)
                .into_iter()
                .partition(|g| g.1.1 + case.grace <= st);
            self.open = open;
            closed = shut;
        }
        let mut updated = Vec::new();
        for (bounds, members) in joins.drain(..) {
            let at = match self
                .open
                .iter()
                .position(|g| g.0 == rec.key && g.1 == bounds)
            {
                Some(at) => at,
                None => {
                    self.open.push((rec.key.clone(), bounds, members));
                    self.open.len() - 1
                }
            };
            self.open[at].2.push(seq);
            updated.push(self.open[at].clone());
        }
        Step::Counted { closed, updated }
    }
}

fn run(case: &Case) -> Result<(), TestCaseError> {
    let sql = query(case);
    let aggregation = Aggregation::compile(&sql, Some(&["s"]))
        .map_err(|p| TestCaseError::fail(format!("{sql}: {p:?}")))?
        .with_grace(case.grace)
        .with_emit(if case.update {
            Emit::Update
        } else {
            Emit::Close
        });
    let db = Connection::open_in_memory().unwrap();
    db.execute_batch("CREATE TABLE r (seq INTEGER, key TEXT, x INTEGER, y REAL, cat TEXT)")
        .unwrap();
    let filter = if case.filter.is_empty() {
        "1"
    } else {
        case.filter
    };
    let mut model = Model::default();
    let mut state = PartitionState::default();
    for (seq, rec) in case.records.iter().enumerate() {
        let passes: Option<i64> = db
            .query_row(
                &format!("SELECT ({filter}) FROM (SELECT ?1 AS x, ?2 AS y, ?3 AS cat)"),
                rusqlite::params![rec.x, rec.y, rec.cat],
                |row| row.get(0),
            )
            .unwrap();
        let value = rec.json(case.time_field);
        let timestamp = if case.time_field { 7 } else { rec.time };
        let fed = aggregation.feed(
            &mut state,
            &Record {
                value: Some(value.as_bytes()),
                key: rec.key.as_deref().map(str::as_bytes),
                headers: &[],
            },
            timestamp,
        );
        if passes != Some(1) {
            prop_assert!(
                matches!(&fed, Ok(outputs) if outputs.is_empty()),
                "{}\nrecord {} fails WHERE but: {:?}",
                sql,
                seq,
                fed
            );
            continue;
        }
        let (outputs, model_closed, model_updated) = match (fed, model.step(case, seq)) {
            (Err(e), Step::Late) if e.kind == "late-record" => continue,
            (fed, Step::Late) => {
                return Err(TestCaseError::fail(format!(
                    "{sql}\nrecord {seq} {value} is late by the spec, here: {fed:?}"
                )));
            }
            (Err(e), Step::Counted { .. }) => {
                return Err(TestCaseError::fail(format!(
                    "{sql}\nrecord {seq} {value}: {e:?}, but it counts by the spec"
                )));
            }
            (Ok(outputs), Step::Counted { closed, updated }) => (outputs, closed, updated),
        };
        db.execute(
            "INSERT INTO r VALUES (?1, ?2, ?3, ?4, ?5)",
            rusqlite::params![seq as i64, rec.key, rec.x, rec.y, rec.cat],
        )
        .unwrap();
        // What it emits: on update, each group it joined; on close, each group it closed.
        let mut expected = if case.update || matches!(case.window, Win::None) {
            model_updated
        } else {
            model_closed
        };
        let mut got: Vec<&plumber_sql::Output> = outputs.iter().collect();
        let window_of = |o: &plumber_sql::Output| o.window.unwrap_or((0, 0));
        let key_of = |o: &plumber_sql::Output| {
            o.key
                .as_ref()
                .map(|k| String::from_utf8(k.clone()).unwrap())
        };
        got.sort_by_key(|o| (key_of(o), window_of(o)));
        expected.sort_by_key(|g| (g.0.clone(), g.1));
        let got_groups: Vec<(Option<String>, (i64, i64))> =
            got.iter().map(|o| (key_of(o), window_of(o))).collect();
        let want_groups: Vec<(Option<String>, (i64, i64))> =
            expected.iter().map(|g| (g.0.clone(), g.1)).collect();
        prop_assert_eq!(
            got_groups,
            want_groups,
            "{}\ngroups emitted after record {}",
            sql,
            seq
        );
        for (output, (key, _, members)) in got.into_iter().zip(&expected) {
            check(&sql, &db, output, key, members, seq)?;
        }
    }
    Ok(())
}

fn check(
    sql: &str,
    db: &Connection,
    output: &plumber_sql::Output,
    key: &Option<String>,
    members: &[usize],
    seq: usize,
) -> Result<(), TestCaseError> {
    let value = output
        .value
        .as_ref()
        .map_err(|e| TestCaseError::fail(format!("{sql}\noutput failed: {e:?}")))?;
    let ours: Json = serde_json::from_slice(value).unwrap();
    let theirs = sqlite_group(db, key, members);
    let names = ["n", "nx", "dc", "sx", "ay", "mn", "mx", "mc"];
    for (name, lite) in names.iter().zip(&theirs) {
        prop_assert!(
            same(&ours[name], lite),
            "{}\nafter record {}: {} is {} here, {:?} in SQLite (group {:?} of records {:?})",
            sql,
            seq,
            name,
            ours[name],
            lite,
            key,
            members
        );
    }
    prop_assert!(same(
        &ours["k"],
        &key.clone().map_or(Lite::Null, Lite::Text)
    ));
    if let Some((start, end)) = output.window {
        prop_assert_eq!(&ours["ws"], &Json::from(start));
        prop_assert_eq!(&ours["we"], &Json::from(end));
        prop_assert_eq!(output.timestamp, end - 1);
    }
    Ok(())
}

fn restored(case: &Case, every: usize, crash: usize) -> Result<(), TestCaseError> {
    let sql = query(case);
    let aggregation = Aggregation::compile(&sql, Some(&["s"]))
        .unwrap()
        .with_grace(case.grace)
        .with_emit(if case.update {
            Emit::Update
        } else {
            Emit::Close
        });
    let values: Vec<String> = case
        .records
        .iter()
        .map(|r| r.json(case.time_field))
        .collect();
    let feed = |state: &mut PartitionState, i: usize| {
        let rec = &case.records[i];
        aggregation.feed(
            state,
            &Record {
                value: Some(values[i].as_bytes()),
                key: rec.key.as_deref().map(str::as_bytes),
                headers: &[],
            },
            if case.time_field { 7 } else { rec.time },
        )
    };
    let mut never_stopped = PartitionState::default();
    let expected: Vec<_> = (0..case.records.len())
        .map(|i| feed(&mut never_stopped, i))
        .collect();
    // The last commit at or before the crash: every record before it is in the changelog.
    let committed = crash.min(case.records.len()) / every * every;
    let mut before = PartitionState::default();
    let mut changelog = Vec::new();
    for i in 0..committed {
        let _ = feed(&mut before, i);
        before.reflects(i as i64);
        if (i + 1) % every == 0 {
            changelog.extend(before.take_changes());
        }
    }
    let mut state = PartitionState::restore(changelog).map_err(TestCaseError::fail)?;
    prop_assert_eq!(
        state.offset(),
        committed.checked_sub(1).map(|o| o as i64),
        "the restored state knows the last record it reflects"
    );
    for (i, expected) in expected.iter().enumerate().skip(committed) {
        prop_assert_eq!(
            &feed(&mut state, i),
            expected,
            "{}\nrecord {} after a restore at {} (changes taken every {})",
            sql,
            i,
            committed,
            every
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn windowed_and_running_aggregates_agree_with_sqlite(case in case()) {
        run(&case)?;
    }

    #[test]
    fn state_restored_from_its_changelog_emits_what_the_state_would_have(
        case in case(),
        every in 1usize..6,
        crash in 0usize..60,
    ) {
        restored(&case, every, crash)?;
    }
}
