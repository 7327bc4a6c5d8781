//! CPU cost of the jq and sql transforms per record, against copying the record (the floor
//! of any transform). The first record is the one `bench/processor.sh` streams; the second a
//! vehicle-telemetry record, for the SQL steps and their jq equivalents.
//!
//! Also what booking the record for the overseer adds to each evaluation (the loop does it
//! around every transform), against evaluating on a worker thread with a round trip through
//! channels per record, the design that would let the loop's thread abandon a runaway
//! evaluation (processor/src/overseer.rs says why the overseer does instead).

#![allow(clippy::expect_used)] // a broken benchmark setup should stop loudly

use std::hint::black_box;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use plumber_processor::overseer::{Hand, InHand};
use plumber_processor::record::Input;
use plumber_processor::transform::jq::Jq;
use plumber_processor::transform::sql::Sql;

// The processor binary's allocator: much of the transform's cost is allocation.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RECORD: &[u8] = br#"{"id":12345,"user":"u27","page":"/a/b/c","ms":86415}"#;
/// A vehicle-telemetry record, for the example topology's programs and queries.
const TELEMETRY: &[u8] =
    br#"{"id":12345,"vehicle":"v27","speed":14.2,"lat":52.52,"lon":13.405,"ts":1700000000123}"#;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("transform");
    group.bench_function("copy", |b| b.iter(|| black_box(black_box(RECORD).to_vec())));
    for program in [".", "select(.ms > 10)", ".page |= ascii_upcase"] {
        let jq = Jq::compile(program).expect("compiles");
        group.bench_function(format!("jq {program}"), |b| {
            b.iter(|| black_box(jq.run(black_box(RECORD)).expect("runs")))
        });
    }
    group.bench_function("copy (telemetry)", |b| {
        b.iter(|| black_box(black_box(TELEMETRY).to_vec()))
    });
    for program in [".", "select(.speed > 10)", ".meta.source = \"x\""] {
        let jq = Jq::compile(program).expect("compiles");
        group.bench_function(format!("jq {program} (telemetry)"), |b| {
            b.iter(|| black_box(jq.run(black_box(TELEMETRY)).expect("runs")))
        });
    }

    let jq = Jq::compile(".").expect("compiles");
    let hand = Hand::default();
    group.bench_function("jq . (booked for the overseer, as the loop runs it)", |b| {
        b.iter(|| {
            let started = Instant::now();
            hand.begin(InHand {
                slot: 0,
                offset: 1,
                started,
                deadline: started + Duration::from_secs(60),
                interruptible: false,
            });
            let outputs = jq.run(black_box(RECORD)).expect("runs");
            assert!(hand.end());
            black_box(outputs)
        })
    });

    let (requests, jobs) = channel::<Vec<u8>>();
    let (replies, answers) = channel();
    std::thread::spawn(move || {
        // Compiled here: jaq's values are not Send.
        let jq = Jq::compile(".").expect("compiles");
        for record in jobs {
            if replies.send(jq.run(&record)).is_err() {
                return;
            }
        }
    });
    group.bench_function("jq . (on a worker thread, a channel round trip)", |b| {
        b.iter(|| {
            requests.send(black_box(RECORD).to_vec()).expect("worker");
            black_box(answers.recv().expect("worker").expect("runs"))
        })
    });
    group.finish();

    let mut group = c.benchmark_group("telemetry");
    group.bench_function("copy", |b| {
        b.iter(|| black_box(black_box(TELEMETRY).to_vec()))
    });
    for program in [".", "select(.speed > 10) | {id, speed}"] {
        let jq = Jq::compile(program).expect("compiles");
        group.bench_function(format!("jq {program}"), |b| {
            b.iter(|| black_box(jq.run(black_box(TELEMETRY)).expect("runs")))
        });
    }
    let topics = ["t".to_owned()];
    for query in [
        "SELECT * FROM t",
        "SELECT id, speed FROM t WHERE speed > 10",
    ] {
        let sql = Sql::compile(query, &[], &topics).expect("compiles");
        group.bench_function(format!("sql {query}"), |b| {
            b.iter(|| {
                let input = Input {
                    topic: "t",
                    partition: 0,
                    offset: 0,
                    timestamp: None,
                    key: Some(b"k"),
                    value: Some(black_box(TELEMETRY)),
                    headers: Vec::new(),
                };
                black_box(sql.eval(&input).expect("runs"))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
