//! CPU cost of the jq transform per record, against copying the record (the floor of any
//! transform). The benchmark record is the one `bench/processor.sh` streams.

#![allow(clippy::expect_used)] // a broken benchmark setup should stop loudly

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use plumber_processor::transform::jq::Jq;

// The processor binary's allocator: much of the transform's cost is allocation.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RECORD: &[u8] = br#"{"id":12345,"user":"u27","page":"/a/b/c","ms":86415}"#;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("transform");
    group.bench_function("copy", |b| b.iter(|| black_box(black_box(RECORD).to_vec())));
    for program in [".", "select(.ms > 10)", ".page |= ascii_upcase"] {
        let jq = Jq::compile(program).expect("compiles");
        group.bench_function(format!("jq {program}"), |b| {
            b.iter(|| black_box(jq.run(black_box(RECORD)).expect("runs")))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
