//! What one look's read of the processors' `/metrics` costs the observer
//! (`daemon::rates::Rates::scrape`): N instances, each a real processor metrics server
//! (`plumber_processor::metrics::Metrics::serve`, on loopback), read concurrently; and the
//! worst cases, N instances that refuse the connection or accept it and never answer.
//!
//! `bash bench/scrape.sh` writes `bench/results/scrape.md`. Knobs: BENCH_INSTANCES (50,500),
//! BENCH_REPS (10).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails loudly

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use plumber::daemon::rates::Rates;
use plumber::daemon::status::Metrics;
use plumber::runtime::{MetricsEndpoint, ProcessorSpec, ProcessorStatus, Result, Runtime};
use plumber::spec::{Resources, Scale};

/// Says where its processors serve `/metrics`; runs nothing.
struct Serving(BTreeMap<String, Vec<MetricsEndpoint>>);

impl Runtime for Serving {
    fn start(&self, _: &ProcessorSpec) -> Result<()> {
        unreachable!()
    }
    fn stop(&self, _: &str) -> Result<()> {
        unreachable!()
    }
    fn restart(&self, _: &str) -> Result<()> {
        unreachable!()
    }
    fn update(&self, _: &str, _: &Scale, _: Option<&Resources>) -> Result<()> {
        unreachable!()
    }
    fn processors(&self) -> Result<Vec<ProcessorStatus>> {
        unreachable!()
    }
    fn metrics_endpoints(&self) -> Result<BTreeMap<String, Vec<MetricsEndpoint>>> {
        Ok(self.0.clone())
    }
}

fn knobs(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Milliseconds per look over `reps` looks at `addrs` (one processor each), median and max.
fn looks(addrs: &[SocketAddr], reps: usize) -> (f64, f64) {
    let endpoints: BTreeMap<String, Vec<MetricsEndpoint>> = addrs
        .iter()
        .enumerate()
        .map(|(n, addr)| {
            (
                format!("g{n}"),
                vec![MetricsEndpoint {
                    instance: "0".into(),
                    addr: *addr,
                }],
            )
        })
        .collect();
    let running: BTreeMap<String, ProcessorStatus> = endpoints
        .keys()
        .map(|group| {
            let status = ProcessorStatus {
                topology: "t".into(),
                step: group.clone(),
                identity: "i".into(),
                group: group.clone(),
                replicas: 1,
                running: 1,
                restarts: 0,
                commit: None,
            };
            (group.clone(), status)
        })
        .collect();
    let runtime = Serving(endpoints);
    let rates = Rates::default();
    let metrics = Metrics::default();
    let mut times = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        rates.scrape(&runtime, &running, &metrics);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let max = times.iter().copied().fold(0.0, f64::max);
    (median(times), max)
}

fn main() {
    let reps = knobs("BENCH_REPS", "10").first().copied().unwrap_or(10);
    let mut out = String::new();
    writeln!(
        out,
        "| instances | served: ms per look, median [max] | refused | never answer |"
    )
    .unwrap();
    writeln!(out, "|---:|---:|---:|---:|").unwrap();
    for n in knobs("BENCH_INSTANCES", "50,500") {
        let servers: Vec<(plumber_processor::metrics::Metrics, SocketAddr)> = (0..n)
            .map(|_| {
                let metrics = plumber_processor::metrics::Metrics::new();
                metrics.consumed.inc_by(1_000);
                let addr = metrics
                    .serve("127.0.0.1:0".parse().unwrap(), Duration::from_secs(60))
                    .unwrap();
                (metrics, addr)
            })
            .collect();
        let served: Vec<SocketAddr> = servers.iter().map(|(_, a)| *a).collect();
        let (served_median, served_max) = looks(&served, reps);
        let refused: Vec<SocketAddr> = (0..n)
            .map(|_| {
                TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
            })
            .collect();
        let (refused_median, _) = looks(&refused, reps.min(3));
        // Listening, never accepting: the connection is made, no answer comes.
        let silent: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let silent_addrs: Vec<SocketAddr> =
            silent.iter().map(|l| l.local_addr().unwrap()).collect();
        let (silent_median, _) = looks(&silent_addrs, 1);
        writeln!(
            out,
            "| {n} | {served_median:.1} [{served_max:.1}] | {refused_median:.1} | {silent_median:.0} |"
        )
        .unwrap();
        drop(silent);
    }
    print!("{out}");
}
