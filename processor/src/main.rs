use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use plumber_processor::config::{Args, LogFormat};
use plumber_processor::metrics::{Kept, Metrics};
use plumber_processor::overseer::SELF_RESTARTS_ENV;
use plumber_processor::pipeline::report;
use plumber_processor::stop::Stop;
use plumber_processor::{Config, run};
use tracing_subscriber::EnvFilter;

// The jq path allocates a few dozen small values per record (jaq's parsed JSON); with glibc's
// malloc that was a quarter of the transform's cost (processor/benches/transform.rs). The
// `override` feature makes librdkafka allocate through mimalloc too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // First, before any thread starts: every thread inherits the blocked signals.
    let stop = Stop::on_signals();
    let args = Args::parse();
    init_logging(args.log_format);
    let stop = match stop {
        Ok(stop) => stop,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return ExitCode::from(2);
        }
    };
    let config = match Config::try_from(args) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let metrics = Metrics::for_step(if config.state.is_some() {
        Kept::State
    } else if config.table.is_some() {
        Kept::Table
    } else {
        Kept::Nothing
    });
    if let Some(restarts) = std::env::var(SELF_RESTARTS_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
    {
        // Each one dead-lettered a record that timed out, in an earlier image of this process.
        metrics.resume_after_self_restarts(restarts);
        tracing::info!(restarts, "restarted itself after a record timed out");
    }
    let code = report(run(&config, &stop, &metrics), &stop);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}
