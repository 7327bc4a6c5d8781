//! Counters for every outcome of a record, latency histograms and consumer lag, served as
//! Prometheus text on `/metrics`, with liveness on `/healthz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// What a step keeps beyond its records in flight, and serves gauges of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Nothing,
    /// A stateful step's groups (`--state-topic`).
    State,
    /// A join's table (`--table`).
    Table,
}

/// Cheap to clone: every metric is shared.
#[derive(Clone)]
pub struct Metrics {
    pub consumed: Counter,
    /// Output records acknowledged by the brokers (per output topic).
    pub produced: Counter,
    /// Inputs whose transform gave no output.
    pub filtered: Counter,
    /// Inputs sent to the dead-letter topic, by `kind`.
    pub dead_lettered: Family<Labels, Counter>,
    /// The sum over kinds, for the run summary (not exported).
    pub dead_lettered_total: Counter,
    /// Exec or http attempts repeated after a crash, a 5xx or a timeout.
    pub transform_retries: Counter,
    /// Exec children started after the first.
    pub exec_restarts: Counter,
    /// Inputs left uncommitted because a stop cut them short (the next owner processes them).
    pub abandoned: Counter,
    pub transform_seconds: Histogram,
    pub commit_seconds: Histogram,
    /// Commits of offsets (at-least-once) or transactions (exactly-once).
    pub commits: Counter,
    /// Background offset commits that failed (retried at the next interval).
    pub commit_failures: Counter,
    pub consumer_lag: Family<Labels, Gauge>,
    /// 1 for the delivery mode running, by `mode`.
    pub delivery_mode: Family<Labels, Gauge>,
    /// How long each transaction stayed open, from its first send to its commit.
    pub transaction_open_seconds: Histogram,
    /// Transactions aborted after an abortable error, their records processed again.
    pub transaction_aborts: Counter,
    /// Times the processor replaced itself (exec) to end a transform that overran its
    /// deadline; carried across those restarts.
    pub self_restarts: Counter,
    /// A stateful step's open groups (windows of a key, or running aggregates).
    pub state_groups: Gauge,
    /// A stateful step's watermark: the least stream time of its partitions, ms.
    pub state_stream_time: Gauge,
    /// Changelog entries read by the restore under way (0 when none is).
    pub state_restoring: Gauge,
    /// Changelog entries read by restores since the start.
    pub state_restored: Counter,
    /// A join's table: its rows, and about the memory they take.
    pub table_rows: Gauge,
    pub table_bytes: Gauge,
    /// Table records read by the load under way (0 once the table is loaded).
    pub table_loading: Gauge,
    /// Table records that are no row (no key, not a JSON object): skipped.
    pub table_skipped: Counter,
    /// A warm start's partitions assigned and held unread until the hand-off names their
    /// start (`--handoff-group`).
    pub handoff_waiting: Gauge,
    /// 1 once a stop's final commit is made with nothing left in flight: the process will
    /// not read, send or commit again, and what remains (leaving the group, closing) changes
    /// nothing in Kafka. The local runtime's stop returns then.
    pub final_commit_made: Gauge,
    heartbeat: Arc<AtomicU64>,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The metrics of a stateless step.
    pub fn new() -> Self {
        Self::for_step(Kept::Nothing)
    }

    /// The metrics of a step; one that keeps state or a table also serves their gauges.
    pub fn for_step(kept: Kept) -> Self {
        let mut registry = Registry::with_prefix("plumber_processor");
        let metrics = Metrics {
            consumed: Counter::default(),
            produced: Counter::default(),
            filtered: Counter::default(),
            dead_lettered: Family::default(),
            dead_lettered_total: Counter::default(),
            transform_retries: Counter::default(),
            exec_restarts: Counter::default(),
            abandoned: Counter::default(),
            // 10 µs … 168 s
            transform_seconds: Histogram::new(exponential_buckets(0.000_01, 4.0, 13)),
            // 0.5 ms … 4 s
            commit_seconds: Histogram::new(exponential_buckets(0.000_5, 2.0, 14)),
            commits: Counter::default(),
            commit_failures: Counter::default(),
            consumer_lag: Family::default(),
            delivery_mode: Family::default(),
            // 1 ms … 65 s
            transaction_open_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            transaction_aborts: Counter::default(),
            self_restarts: Counter::default(),
            state_groups: Gauge::default(),
            state_stream_time: Gauge::default(),
            state_restoring: Gauge::default(),
            state_restored: Counter::default(),
            table_rows: Gauge::default(),
            table_bytes: Gauge::default(),
            table_loading: Gauge::default(),
            table_skipped: Counter::default(),
            handoff_waiting: Gauge::default(),
            final_commit_made: Gauge::default(),
            heartbeat: Arc::new(AtomicU64::new(now_millis())),
            registry: Arc::new(Registry::default()),
        };
        registry.register(
            "handoff_waiting_partitions",
            "A warm start's partitions held unread until the hand-off names their start",
            metrics.handoff_waiting.clone(),
        );
        registry.register(
            "final_commit_made",
            "Whether the stop's final commit is made with nothing in flight (1): the group's offsets will not move again",
            metrics.final_commit_made.clone(),
        );
        registry.register(
            "records_consumed",
            "Input records consumed",
            metrics.consumed.clone(),
        );
        registry.register(
            "records_produced",
            "Output records acknowledged by the brokers",
            metrics.produced.clone(),
        );
        registry.register(
            "records_filtered",
            "Input records with no output",
            metrics.filtered.clone(),
        );
        registry.register(
            "records_dead_lettered",
            "Input records sent to the dead-letter topic",
            metrics.dead_lettered.clone(),
        );
        registry.register(
            "records_abandoned",
            "Input records left uncommitted by a stop",
            metrics.abandoned.clone(),
        );
        registry.register(
            "transform_retries",
            "Transform attempts repeated after a failure",
            metrics.transform_retries.clone(),
        );
        registry.register(
            "exec_restarts",
            "Exec child processes restarted",
            metrics.exec_restarts.clone(),
        );
        registry.register(
            "transform_duration_seconds",
            "Time to transform one input record",
            metrics.transform_seconds.clone(),
        );
        registry.register(
            "commit_duration_seconds",
            "Time to commit offsets or a transaction",
            metrics.commit_seconds.clone(),
        );
        registry.register(
            "commits",
            "Offset or transaction commits",
            metrics.commits.clone(),
        );
        registry.register(
            "commit_failures",
            "Offset commits that failed and were retried at the next interval",
            metrics.commit_failures.clone(),
        );
        registry.register(
            "consumer_lag",
            "Records behind the end of each input partition",
            metrics.consumer_lag.clone(),
        );
        registry.register(
            "delivery_mode",
            "1 for the delivery mode this processor runs (label mode)",
            metrics.delivery_mode.clone(),
        );
        registry.register(
            "transaction_open_seconds",
            "How long each transaction stayed open, first send to commit (exactly-once)",
            metrics.transaction_open_seconds.clone(),
        );
        registry.register(
            "transaction_aborts",
            "Transactions aborted after an abortable error; their records are processed again",
            metrics.transaction_aborts.clone(),
        );
        registry.register(
            "self_restarts",
            "Times the processor restarted itself to end a transform past its deadline",
            metrics.self_restarts.clone(),
        );
        match kept {
            Kept::Nothing => {}
            Kept::State => metrics.register_state(&mut registry),
            Kept::Table => metrics.register_table(&mut registry),
        }
        Metrics {
            registry: Arc::new(registry),
            ..metrics
        }
    }

    fn register_state(&self, registry: &mut Registry) {
        let metrics = self;
        registry.register(
            "state_groups",
            "Open groups of a stateful step (a key's window, or its running aggregate)",
            metrics.state_groups.clone(),
        );
        registry.register(
            "state_stream_time_ms",
            "Least stream time of a stateful step's partitions (its window watermark), ms",
            metrics.state_stream_time.clone(),
        );
        registry.register(
            "state_restoring_entries",
            "Changelog entries read by the restore under way",
            metrics.state_restoring.clone(),
        );
        registry.register(
            "state_restored_entries",
            "Changelog entries read by restores",
            metrics.state_restored.clone(),
        );
    }

    fn register_table(&self, registry: &mut Registry) {
        registry.register(
            "table_rows",
            "Rows of a join's table",
            self.table_rows.clone(),
        );
        registry.register(
            "table_bytes",
            "About the memory a join's table takes (--table-max-bytes bounds it)",
            self.table_bytes.clone(),
        );
        registry.register(
            "table_loading_records",
            "Table records read by the load under way (0 once loaded)",
            self.table_loading.clone(),
        );
        registry.register(
            "table_skipped_records",
            "Table records skipped: no key, or not a JSON object",
            self.table_skipped.clone(),
        );
    }

    /// Carries over what earlier images of this process counted before they replaced
    /// themselves, `restarts` times, each after dead-lettering a record that timed out.
    pub fn resume_after_self_restarts(&self, restarts: u64) {
        self.self_restarts.inc_by(restarts);
        self.dead_lettered
            .get_or_create(&vec![("kind", crate::transform::TIMEOUT.to_owned())])
            .inc_by(restarts);
    }

    pub fn set_delivery_mode(&self, mode: crate::config::DeliveryMode) {
        self.delivery_mode
            .get_or_create(&vec![("mode", mode.as_str().to_owned())])
            .set(1);
    }

    pub fn dead_lettered(&self, kind: &'static str) {
        self.dead_lettered
            .get_or_create(&vec![("kind", kind.to_owned())])
            .inc();
        self.dead_lettered_total.inc();
    }

    pub fn set_lag(&self, topic: &str, partition: i32, lag: i64) {
        self.consumer_lag
            .get_or_create(&vec![
                ("topic", topic.to_owned()),
                ("partition", partition.to_string()),
            ])
            .set(lag);
    }

    /// The pipeline calls this every loop turn; `/healthz` fails when it stops doing so.
    pub fn beat(&self) {
        self.heartbeat.store(now_millis(), Ordering::Relaxed);
    }

    fn alive_within(&self, window: Duration) -> bool {
        let last = self.heartbeat.load(Ordering::Relaxed);
        now_millis().saturating_sub(last) <= window.as_millis() as u64
    }

    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    /// Serves `/metrics` and `/healthz` on `addr` from a thread of its own. Binding happens
    /// before returning, so a taken port is an error here, not a silent log line.
    ///
    /// `/healthz` fails once the loop has not turned for `stuck_after`.
    pub fn serve(&self, addr: SocketAddr, stuck_after: Duration) -> std::io::Result<SocketAddr> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let metrics = self.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::error!(%error, "metrics server could not start");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let app = axum::Router::new()
                        .route(
                            "/metrics",
                            axum::routing::get({
                                let metrics = metrics.clone();
                                move || async move {
                                    (
                                        [(
                                            axum::http::header::CONTENT_TYPE,
                                            "text/plain; version=0.0.4; charset=utf-8",
                                        )],
                                        metrics.encode(),
                                    )
                                }
                            }),
                        )
                        .route(
                            "/healthz",
                            axum::routing::get(move || async move {
                                if metrics.alive_within(stuck_after) {
                                    (axum::http::StatusCode::OK, "ok\n")
                                } else {
                                    (
                                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                                        "the processing loop is stuck\n",
                                    )
                                }
                            }),
                        );
                    let served = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => axum::serve(listener, app).await,
                        Err(error) => Err(error),
                    };
                    if let Err(error) = served {
                        tracing::error!(%error, "metrics server stopped");
                    }
                });
            })?;
        Ok(bound)
    }
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_exported() {
        let metrics = Metrics::new();
        metrics.consumed.inc();
        metrics.dead_lettered("invalid-json");
        metrics.set_lag("in", 2, 40);
        metrics.set_delivery_mode(crate::config::DeliveryMode::ExactlyOnce);
        let text = metrics.encode();
        assert!(
            text.contains("plumber_processor_records_consumed_total 1"),
            "{text}"
        );
        assert!(
            text.contains(
                r#"plumber_processor_records_dead_lettered_total{kind="invalid-json"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"plumber_processor_consumer_lag{topic="in",partition="2"} 40"#),
            "{text}"
        );
        assert!(
            text.contains("plumber_processor_transform_duration_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains(r#"plumber_processor_delivery_mode{mode="exactly-once"} 1"#),
            "{text}"
        );
    }
}
