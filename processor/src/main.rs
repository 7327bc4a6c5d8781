//! `plumber-processor`: the unit that runs one processing step (SPEC §5, §8).
//!
//! The Kafka consume → transform → produce loop lands with the processor issue; until then the
//! binary states that plainly instead of pretending to run.

fn main() -> std::process::ExitCode {
    eprintln!("plumber-processor: not implemented yet (see the processor issue)");
    std::process::ExitCode::from(2)
}
