use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use plumber_processor::config::{Args, LogFormat};
use plumber_processor::metrics::Metrics;
use plumber_processor::stop::Stop;
use plumber_processor::{Config, run};
use tracing_subscriber::EnvFilter;

// The jq path allocates a few dozen small values per record (jaq's parsed JSON); with glibc's
// malloc that was a quarter of the transform's cost (processor/benches/transform.rs). The
// `override` feature makes librdkafka allocate through mimalloc too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    let config = match Config::try_from(args) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let stop = match Stop::on_signals() {
        Ok(stop) => stop,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return ExitCode::from(2);
        }
    };
    match run(&config, &stop, &Metrics::new()) {
        Ok(summary) => {
            tracing::info!(
                mode = ?summary.mode,
                consumed = summary.consumed,
                produced = summary.produced,
                filtered = summary.filtered,
                dead_lettered = summary.dead_lettered,
                abandoned = summary.abandoned,
                "stopped"
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            // Every error's message already names its cause.
            tracing::error!(%error, "processor failed");
            ExitCode::from(1)
        }
    }
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
