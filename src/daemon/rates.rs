//! Records/s per step, from the processors' own `/metrics`: at every look the observer reads
//! each running instance's counters once ([`Runtime::metrics_endpoints`] says where), and a
//! step's rate is the increase of its instances' `records_consumed` over the time between
//! two readings, summed over the instances.
//!
//! - A counter lower than at the last reading was reset (the process restarted, or replaced
//!   itself): its whole value is the increase.
//! - An instance read for the first time (new, or restarted under another name) gives no rate
//!   yet; one that cannot be read gives none either (unknown, not 0), and keeps its last
//!   reading, so the next one spans the gap. A step's rate is the sum over the instances that
//!   give one, `None` when none does.
//! - The daemon's `/metrics` has `plumber_processor_records_per_second{topology,step}` (absent
//!   while unknown) and, as counters of what the readings added up to since this daemon
//!   started, `plumber_processor_records_total` and
//!   `plumber_processor_records_dead_lettered_total`.
//!
//! All instances are read concurrently (`CONCURRENCY` at a time, `TIMEOUT` each) on a
//! current-thread executor of the scraper's own, so a look waits for about the slowest read,
//! not their sum.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use http_body_util::BodyExt as _;

use super::status::{Metrics, StepLabels};
use crate::runtime::{MetricsEndpoint, ProcessorStatus, Runtime};

/// How long one instance's `/metrics` may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Reads in flight at once: sockets, not threads.
const CONCURRENCY: usize = 256;
/// A `/metrics` page longer than this is refused (a processor's is a few KB).
const MAX_PAGE: usize = 4 << 20;

const CONSUMED: &str = "plumber_processor_records_consumed_total";
const DEAD_LETTERED: &str = "plumber_processor_records_dead_lettered_total";
/// A stateful step's gauges (`docs/stateful-sql.md`): open groups, its partitions' least
/// stream time, and the changelog entries a restore under way has read.
const STATE_GROUPS: &str = "plumber_processor_state_groups";
const STATE_STREAM_TIME: &str = "plumber_processor_state_stream_time_ms";
const STATE_RESTORING: &str = "plumber_processor_state_restoring_entries";
/// A join's table gauges: its rows, about their memory, and a load's progress.
const TABLE_ROWS: &str = "plumber_processor_table_rows";
const TABLE_BYTES: &str = "plumber_processor_table_bytes";
const TABLE_LOADING: &str = "plumber_processor_table_loading_records";

/// The scraper: what it last read of every instance, and the rates it gave.
#[derive(Default)]
pub struct Rates {
    executor: OnceLock<Option<tokio::runtime::Runtime>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    meter: Meter,
    by_group: BTreeMap<String, f64>,
    /// A stateful processor's state, summed over the instances read at the last look.
    state_by_group: BTreeMap<String, StateGauges>,
    /// A join's table, as its instances hold it at the last look.
    table_by_group: BTreeMap<String, TableGauges>,
    /// The steps (topology, step) whose gauge is set.
    exported: BTreeSet<(String, String)>,
}

impl Rates {
    /// Input records/s of the processor of `group`, as of the last look; `None` while
    /// unknown.
    pub fn per_second(&self, group: &str) -> Option<f64> {
        self.state().by_group.get(group).copied()
    }

    /// A stateful processor's state as of the last look: groups and restore progress summed
    /// over its instances, the least stream time; `None` for a stateless one, or unknown.
    pub fn state_of(&self, group: &str) -> Option<StateGauges> {
        self.state().state_by_group.get(group).copied()
    }

    /// A join's table as of the last look (each instance holds all of it: the largest
    /// instance's rows and bytes, and the load furthest behind); `None` for other steps.
    pub fn table_of(&self, group: &str) -> Option<TableGauges> {
        self.state().table_by_group.get(group).copied()
    }

    /// Reads the `/metrics` of every instance of the `running` processors once, and updates
    /// the rates and `metrics`.
    pub fn scrape(
        &self,
        runtime: &dyn Runtime,
        running: &BTreeMap<String, ProcessorStatus>,
        metrics: &Metrics,
    ) {
        let endpoints = runtime.metrics_endpoints().unwrap_or_else(|error| {
            tracing::debug!(%error, "cannot tell where the processors serve /metrics");
            BTreeMap::new()
        });
        let jobs: Vec<(String, MetricsEndpoint)> = endpoints
            .into_iter()
            .filter(|(group, _)| running.contains_key(group))
            .flat_map(|(group, endpoints)| endpoints.into_iter().map(move |e| (group.clone(), e)))
            .collect();
        let mut reads: BTreeMap<String, Vec<(String, Option<Reading>)>> = running
            .keys()
            .map(|group| (group.clone(), Vec::new()))
            .collect();
        let mut state_by_group: BTreeMap<String, StateGauges> = BTreeMap::new();
        let mut table_by_group: BTreeMap<String, TableGauges> = BTreeMap::new();
        for (group, endpoint, reading) in self.read_all(jobs) {
            if let Some(gauges) = reading.as_ref().and_then(|r| r.counts.state) {
                state_by_group
                    .entry(group.clone())
                    .and_modify(|sum| *sum = sum.add(gauges))
                    .or_insert(gauges);
            }
            if let Some(gauges) = reading.as_ref().and_then(|r| r.counts.table) {
                table_by_group
                    .entry(group.clone())
                    .and_modify(|most| *most = most.widest(gauges))
                    .or_insert(gauges);
            }
            reads
                .entry(group)
                .or_default()
                .push((endpoint.instance, reading));
        }
        let rounds = self.state().meter.round(&reads);
        // A step's lives (an old and a new one, during a move) add up on the daemon's metrics.
        let mut steps: BTreeMap<(String, String), Round> = BTreeMap::new();
        for (group, round) in &rounds {
            let Some(processor) = running.get(group) else {
                continue;
            };
            let step = steps
                .entry((processor.topology.clone(), processor.step.clone()))
                .or_default();
            step.consumed += round.consumed;
            step.dead_lettered += round.dead_lettered;
            if let Some(rate) = round.per_second {
                *step.per_second.get_or_insert(0.0) += rate;
            }
        }
        let mut state = self.state();
        for ((topology, step_name), step) in &steps {
            let labels = &labels(topology, step_name);
            metrics
                .records_consumed
                .get_or_create(labels)
                .inc_by(step.consumed);
            metrics
                .records_dead_lettered
                .get_or_create(labels)
                .inc_by(step.dead_lettered);
            match step.per_second {
                Some(rate) => {
                    metrics.records_per_second.get_or_create(labels).set(rate);
                    state.exported.insert((topology.clone(), step_name.clone()));
                }
                None => {
                    metrics.records_per_second.remove(labels);
                    state
                        .exported
                        .remove(&(topology.clone(), step_name.clone()));
                }
            }
        }
        let gone: Vec<(String, String)> = state
            .exported
            .iter()
            .filter(|key| !steps.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            metrics.records_per_second.remove(&labels(&key.0, &key.1));
            state.exported.remove(&key);
        }
        state.by_group = rounds
            .into_iter()
            .filter_map(|(group, round)| Some((group, round.per_second?)))
            .collect();
        state.state_by_group = state_by_group;
        state.table_by_group = table_by_group;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads every endpoint concurrently; `None` for one that could not be read.
    fn read_all(
        &self,
        jobs: Vec<(String, MetricsEndpoint)>,
    ) -> Vec<(String, MetricsEndpoint, Option<Reading>)> {
        if jobs.is_empty() {
            return Vec::new();
        }
        let executor = self.executor.get_or_init(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| tracing::warn!(%error, "cannot start the metrics scraper; records/s stay unknown"))
                .ok()
        });
        let Some(executor) = executor else {
            return jobs.into_iter().map(|(g, e)| (g, e, None)).collect();
        };
        executor.block_on(
            futures::stream::iter(jobs)
                .map(|(group, endpoint)| async move {
                    let reading = match read(endpoint.addr).await {
                        Ok(counts) => Some(Reading {
                            counts,
                            at: Instant::now(),
                        }),
                        Err(error) => {
                            tracing::debug!(group, instance = %endpoint.instance, address = %endpoint.addr, %error, "cannot read a processor's /metrics; its rate is unknown");
                            None
                        }
                    };
                    (group, endpoint, reading)
                })
                .buffer_unordered(CONCURRENCY)
                .collect(),
        )
    }
}

fn labels(topology: &str, step: &str) -> StepLabels {
    StepLabels {
        topology: topology.to_owned(),
        step: step.to_owned(),
    }
}

/// Why an instance's `/metrics` could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("no answer within {} ms", TIMEOUT.as_millis())]
    Timeout,
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("cannot make the request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("answered {0}")]
    Status(hyper::StatusCode),
    #[error("the page is not readable: {0}")]
    Page(String),
}

/// One `GET /metrics` on `addr`, within [`TIMEOUT`].
async fn read(addr: SocketAddr) -> Result<Counts, ReadError> {
    tokio::time::timeout(TIMEOUT, async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(ReadError::Connect)?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        let request = hyper::Request::get("/metrics")
            .header(hyper::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())?;
        // The connection is driven beside the exchange and ends once the exchange, which owns
        // the sender, is done: nothing is left running after a read.
        let exchange = async move {
            let response = sender.send_request(request).await?;
            if !response.status().is_success() {
                return Err(ReadError::Status(response.status()));
            }
            let page = http_body_util::Limited::new(response.into_body(), MAX_PAGE)
                .collect()
                .await
                .map_err(|e| ReadError::Page(e.to_string()))?
                .to_bytes();
            let page = std::str::from_utf8(&page).map_err(|e| ReadError::Page(e.to_string()))?;
            parse(page).map_err(ReadError::Page)
        };
        let (counts, _) = tokio::join!(exchange, connection);
        counts
    })
    .await
    .map_err(|_| ReadError::Timeout)?
}

/// What a rate is computed from, summed over the series of each counter.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Counts {
    pub consumed: f64,
    pub dead_lettered: f64,
    /// A stateful processor's gauges; `None` when the page has none.
    pub state: Option<StateGauges>,
    /// A join's table gauges; `None` when the page has none.
    pub table: Option<TableGauges>,
}

/// A join's table in one instance, as its `/metrics` says.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TableGauges {
    pub rows: f64,
    /// About the memory the rows take.
    pub bytes: f64,
    /// Table records read by a load under way (0: loaded).
    pub loading: f64,
}

impl TableGauges {
    /// Two instances' tables: each holds the whole table, so the larger of each gauge.
    fn widest(self, other: TableGauges) -> TableGauges {
        TableGauges {
            rows: self.rows.max(other.rows),
            bytes: self.bytes.max(other.bytes),
            loading: self.loading.max(other.loading),
        }
    }
}

/// A stateful processor's state, as its `/metrics` says.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StateGauges {
    /// Open groups (a key's window, or its running aggregate).
    pub groups: f64,
    /// The least stream time of its partitions (its window watermark), ms; `None` before
    /// any record counted.
    pub stream_time: Option<f64>,
    /// Changelog entries read by restores under way (0: none is).
    pub restoring: f64,
}

impl StateGauges {
    /// Two instances' state together: groups and restores add up, the watermark is the
    /// lesser (no window below it is open in either).
    fn add(self, other: StateGauges) -> StateGauges {
        StateGauges {
            groups: self.groups + other.groups,
            stream_time: match (self.stream_time, other.stream_time) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            restoring: self.restoring + other.restoring,
        }
    }
}

/// The counters of a processor's `/metrics` page (Prometheus or OpenMetrics text). Only
/// sample lines of the two counters are read: `name{labels} value [timestamp]`. Not the
/// `prometheus-parse` crate: it splits labels at every `,` `=` and `}`, also inside quoted
/// values, which the format lets hold anything, and skips a sample it cannot read silently.
pub(crate) fn parse(page: &str) -> Result<Counts, String> {
    let mut counts = Counts::default();
    let mut found = false;
    for line in page.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let name = &line[..name_end];
        let target = match name {
            CONSUMED => &mut counts.consumed,
            DEAD_LETTERED => &mut counts.dead_lettered,
            STATE_GROUPS => &mut counts.state.get_or_insert_with(StateGauges::default).groups,
            STATE_RESTORING => {
                &mut counts
                    .state
                    .get_or_insert_with(StateGauges::default)
                    .restoring
            }
            STATE_STREAM_TIME => counts
                .state
                .get_or_insert_with(StateGauges::default)
                .stream_time
                .get_or_insert(0.0),
            TABLE_ROWS => &mut counts.table.get_or_insert_with(TableGauges::default).rows,
            TABLE_BYTES => &mut counts.table.get_or_insert_with(TableGauges::default).bytes,
            TABLE_LOADING => {
                &mut counts
                    .table
                    .get_or_insert_with(TableGauges::default)
                    .loading
            }
            _ => continue,
        };
        let rest = &line[name_end..];
        let after_labels = if rest.starts_with('{') {
            labels_end(rest).ok_or_else(|| format!("unterminated labels: {line}"))?
        } else {
            rest
        };
        let value: f64 = after_labels
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no value: {line}"))?;
        *target += value;
        found |= name == CONSUMED;
    }
    if !found {
        return Err(format!("no {CONSUMED}"));
    }
    Ok(counts)
}

/// What follows the `{…}` that `text` starts with (label values are quoted and may hold `}`
/// and escaped quotes).
fn labels_end(text: &str) -> Option<&str> {
    let mut quoted = false;
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return text.get(at + 1..),
            _ => {}
        }
    }
    None
}

/// An instance's counters and when they were read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub counts: Counts,
    pub at: Instant,
}

/// What one look gives a group.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Round {
    /// Summed over the instances that give a rate; `None` when none does.
    pub per_second: Option<f64>,
    /// Records consumed since the last readings (of the instances read twice).
    pub consumed: u64,
    pub dead_lettered: u64,
}

/// The last reading of every instance, by group and instance.
#[derive(Default)]
pub(crate) struct Meter {
    last: BTreeMap<(String, String), Reading>,
}

impl Meter {
    /// One look: each group's instances with what was read of each (`None`: unreadable). An
    /// instance missing from the look is forgotten.
    pub(crate) fn round(
        &mut self,
        reads: &BTreeMap<String, Vec<(String, Option<Reading>)>>,
    ) -> BTreeMap<String, Round> {
        let mut seen = BTreeSet::new();
        let mut rounds = BTreeMap::new();
        for (group, instances) in reads {
            let mut round = Round::default();
            for (instance, reading) in instances {
                let key = (group.clone(), instance.clone());
                seen.insert(key.clone());
                let Some(reading) = reading else {
                    continue;
                };
                if let Some(previous) = self.last.get(&key) {
                    let consumed = increase(previous.counts.consumed, reading.counts.consumed);
                    let dead_lettered =
                        increase(previous.counts.dead_lettered, reading.counts.dead_lettered);
                    round.consumed += consumed as u64;
                    round.dead_lettered += dead_lettered as u64;
                    let elapsed = reading.at.saturating_duration_since(previous.at);
                    if !elapsed.is_zero() {
                        *round.per_second.get_or_insert(0.0) += consumed / elapsed.as_secs_f64();
                    }
                }
                self.last.insert(key, *reading);
            }
            rounds.insert(group.clone(), round);
        }
        self.last.retain(|key, _| seen.contains(key));
        rounds
    }
}

/// How much a counter grew; one that went down was reset, and counted `now` since.
fn increase(before: f64, now: f64) -> f64 {
    if now >= before { now - before } else { now }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_counters_are_read_from_a_processors_page() {
        let metrics = plumber_processor::metrics::Metrics::new();
        metrics.consumed.inc_by(42);
        metrics.dead_lettered("invalid-json");
        metrics.dead_lettered("timeout");
        metrics.dead_lettered("timeout");
        let counts = parse(&metrics.encode()).unwrap();
        assert_eq!(
            counts,
            Counts {
                consumed: 42.0,
                dead_lettered: 3.0,
                state: None,
                table: None,
            }
        );
    }

    /// A stateful processor's gauges, as it serves them.
    #[test]
    fn a_stateful_processors_state_is_read_from_its_page() {
        let metrics =
            plumber_processor::metrics::Metrics::for_step(plumber_processor::metrics::Kept::State);
        metrics.consumed.inc_by(5);
        metrics.state_groups.set(1_200);
        metrics.state_stream_time.set(1_796_256_000_000);
        metrics.state_restoring.set(30);
        let counts = parse(&metrics.encode()).unwrap();
        let state = counts.state.expect("state gauges");
        assert_eq!(state.groups, 1_200.0);
        assert_eq!(state.stream_time, Some(1_796_256_000_000.0));
        assert_eq!(state.restoring, 30.0);
        let other = StateGauges {
            groups: 10.0,
            stream_time: Some(1_796_255_000_000.0),
            restoring: 0.0,
        };
        assert_eq!(
            state.add(other),
            StateGauges {
                groups: 1_210.0,
                stream_time: Some(1_796_255_000_000.0),
                restoring: 30.0,
            }
        );
    }

    /// A join's table gauges, as it serves them; two instances hold the same table.
    #[test]
    fn a_joins_table_is_read_from_its_page() {
        let metrics =
            plumber_processor::metrics::Metrics::for_step(plumber_processor::metrics::Kept::Table);
        metrics.consumed.inc_by(5);
        metrics.table_rows.set(300);
        metrics.table_bytes.set(30_000);
        metrics.table_loading.set(12);
        let counts = parse(&metrics.encode()).unwrap();
        let table = counts.table.expect("table gauges");
        assert_eq!(
            table,
            TableGauges {
                rows: 300.0,
                bytes: 30_000.0,
                loading: 12.0,
            }
        );
        assert!(counts.state.is_none());
        let loaded = TableGauges {
            rows: 310.0,
            bytes: 29_000.0,
            loading: 0.0,
        };
        assert_eq!(
            table.widest(loaded),
            TableGauges {
                rows: 310.0,
                bytes: 30_000.0,
                loading: 12.0,
            }
        );
    }

    #[test]
    fn labels_values_and_timestamps_are_parsed() {
        let page = "# TYPE x counter\n\
            plumber_processor_records_consumed_total 7 1700000000\n\
            plumber_processor_records_dead_lettered_total{kind=\"a} \\\"b\"} 2.5\n\
            plumber_processor_records_consumed_totalx 100\n\
            plumber_processor_records_dead_lettered_total{kind=\"c\"} 1\n";
        assert_eq!(
            parse(page).unwrap(),
            Counts {
                consumed: 7.0,
                dead_lettered: 3.5,
                state: None,
                table: None,
            }
        );
        assert!(parse("# EOF\n").is_err(), "no consumed counter");
        assert!(parse("plumber_processor_records_consumed_total{a=\"1\" 3\n").is_err());
        assert!(parse("plumber_processor_records_consumed_total\n").is_err());
    }

    /// Says where its processors serve `/metrics`; runs nothing.
    struct Serving(BTreeMap<String, Vec<MetricsEndpoint>>);

    impl Runtime for Serving {
        fn start(&self, _: &crate::runtime::ProcessorSpec) -> crate::runtime::Result<()> {
            unreachable!()
        }
        fn stop(&self, _: &str) -> crate::runtime::Result<()> {
            unreachable!()
        }
        fn restart(&self, _: &str) -> crate::runtime::Result<()> {
            unreachable!()
        }
        fn update(
            &self,
            _: &str,
            _: &crate::spec::Scale,
            _: Option<&crate::spec::Resources>,
        ) -> crate::runtime::Result<()> {
            unreachable!()
        }
        fn processors(&self) -> crate::runtime::Result<Vec<ProcessorStatus>> {
            unreachable!()
        }
        fn metrics_endpoints(
            &self,
        ) -> crate::runtime::Result<BTreeMap<String, Vec<MetricsEndpoint>>> {
            Ok(self.0.clone())
        }
    }

    fn processor(group: &str, step: &str) -> (String, ProcessorStatus) {
        let status = ProcessorStatus {
            topology: "t".into(),
            step: step.into(),
            identity: "i".into(),
            group: group.into(),
            replicas: 2,
            running: 2,
            restarts: 0,
            commit: None,
        };
        (group.to_owned(), status)
    }

    #[test]
    fn a_scrape_reads_the_processors_own_pages_and_an_unreachable_one_is_unknown() {
        let serve = || {
            let metrics = plumber_processor::metrics::Metrics::new();
            let addr = metrics
                .serve("127.0.0.1:0".parse().unwrap(), Duration::from_secs(60))
                .unwrap();
            (metrics, addr)
        };
        let (one, one_addr) = serve();
        let (two, two_addr) = serve();
        // Nothing listens there.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let endpoint = |instance: &str, addr| MetricsEndpoint {
            instance: instance.into(),
            addr,
        };
        let runtime = Serving(BTreeMap::from([
            (
                "g".to_owned(),
                vec![endpoint("1", one_addr), endpoint("2", two_addr)],
            ),
            ("h".to_owned(), vec![endpoint("1", closed)]),
        ]));
        let running: BTreeMap<String, ProcessorStatus> =
            [processor("g", "a"), processor("h", "b")].into();
        let rates = Rates::default();
        let metrics = Metrics::default();
        let page = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
            text
        };

        rates.scrape(&runtime, &running, &metrics);
        assert_eq!(rates.per_second("g"), None, "one reading gives no rate");
        one.consumed.inc_by(30);
        two.consumed.inc_by(10);
        two.dead_lettered("invalid-json");
        let started = Instant::now();
        rates.scrape(&runtime, &running, &metrics);
        let elapsed = started.elapsed().as_secs_f64();
        let rate = rates.per_second("g").unwrap();
        assert!(rate > 0.0, "{rate}");
        assert_eq!(rates.per_second("h"), None, "unreachable: unknown, not 0");
        let text = page();
        assert!(
            text.contains(r#"plumber_processor_records_total{topology="t",step="a"} 40"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"plumber_processor_records_dead_lettered_total{topology="t",step="a"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"plumber_processor_records_per_second{topology="t",step="a"} "#),
            "{text}"
        );
        assert!(
            !text.contains(r#"plumber_processor_records_per_second{topology="t",step="b"}"#),
            "an unknown rate has no gauge: {text}"
        );
        assert!(elapsed < 5.0, "a round is quick: {elapsed} s");

        // `g` stops: its gauge goes.
        let running: BTreeMap<String, ProcessorStatus> = [processor("h", "b")].into();
        rates.scrape(&runtime, &running, &metrics);
        assert_eq!(rates.per_second("g"), None);
        assert!(!page().contains(r#"plumber_processor_records_per_second{topology="t",step="a"}"#));
    }

    fn at(start: Instant, seconds: u64, consumed: f64) -> Option<Reading> {
        Some(Reading {
            counts: Counts {
                consumed,
                dead_lettered: 0.0,
                state: None,
                table: None,
            },
            at: start + Duration::from_secs(seconds),
        })
    }

    fn look(meter: &mut Meter, reads: &[(&str, &str, Option<Reading>)]) -> BTreeMap<String, Round> {
        let mut by_group: BTreeMap<String, Vec<(String, Option<Reading>)>> = BTreeMap::new();
        for (group, instance, reading) in reads {
            by_group
                .entry((*group).to_owned())
                .or_default()
                .push(((*instance).to_owned(), *reading));
        }
        meter.round(&by_group)
    }

    fn rate(rounds: &BTreeMap<String, Round>, group: &str) -> Option<f64> {
        rounds[group].per_second
    }

    #[test]
    fn rates_sum_over_instances_and_survive_resets_and_gaps() {
        let t = Instant::now();
        let mut meter = Meter::default();
        // First readings: no rate yet.
        let rounds = look(
            &mut meter,
            &[("g", "a", at(t, 0, 100.0)), ("g", "b", at(t, 0, 5.0))],
        );
        assert_eq!(rate(&rounds, "g"), None);
        assert_eq!(rounds["g"].consumed, 0);

        // 10/s and 5/s over 2 s.
        let rounds = look(
            &mut meter,
            &[("g", "a", at(t, 2, 120.0)), ("g", "b", at(t, 2, 15.0))],
        );
        assert_eq!(rate(&rounds, "g"), Some(15.0));
        assert_eq!(rounds["g"].consumed, 30);

        // `a` restarted in place (its counter went down): 8 records since; `b` unreachable.
        let rounds = look(&mut meter, &[("g", "a", at(t, 4, 8.0)), ("g", "b", None)]);
        assert_eq!(rate(&rounds, "g"), Some(4.0), "b's rate is unknown, not 0");
        assert_eq!(rounds["g"].consumed, 8);

        // Both unreachable: unknown.
        let rounds = look(&mut meter, &[("g", "a", None), ("g", "b", None)]);
        assert_eq!(rate(&rounds, "g"), None);

        // `b` back after the gap: its increase over the 4 s since its last reading.
        let rounds = look(&mut meter, &[("g", "a", None), ("g", "b", at(t, 6, 35.0))]);
        assert_eq!(rate(&rounds, "g"), Some(5.0));
    }

    #[test]
    fn instances_coming_and_going_count_from_their_second_reading() {
        let t = Instant::now();
        let mut meter = Meter::default();
        look(
            &mut meter,
            &[("g", "a", at(t, 0, 0.0)), ("h", "x", at(t, 0, 0.0))],
        );
        // `b` is new (a scale-up, or `a` restarted under a new pid): no rate from it yet.
        let rounds = look(
            &mut meter,
            &[("g", "a", at(t, 1, 3.0)), ("g", "b", at(t, 1, 50.0))],
        );
        assert_eq!(rate(&rounds, "g"), Some(3.0));
        assert!(
            !rounds.contains_key("h"),
            "a group that stopped is not reported"
        );
        // `a` left; `b` goes on. `h` started again: its instance was forgotten, so it starts
        // over instead of giving a rate across the time it did not run.
        let rounds = look(
            &mut meter,
            &[("g", "b", at(t, 3, 60.0)), ("h", "x", at(t, 3, 90.0))],
        );
        assert_eq!(rate(&rounds, "g"), Some(5.0));
        assert_eq!(rate(&rounds, "h"), None);
        // A group running without a readable endpoint: unknown.
        let rounds = look(&mut meter, &[]);
        assert!(rounds.is_empty());
        let mut reads = BTreeMap::new();
        reads.insert("g".to_owned(), Vec::new());
        assert_eq!(meter.round(&reads)["g"].per_second, None);
    }
}
