//! What the engine reads of a processor's own `/metrics` page while it decides: how many
//! partitions a warm start holds for its hand-off, and whether a stopping instance has made
//! its final commit. (The daemon's rates read the same pages on their own schedule,
//! `daemon::rates`.)

use std::net::SocketAddr;
use std::time::Duration;

use super::MetricsEndpoint;

/// The gauge a warm start shows its held partitions in (`plumber-processor`'s metrics).
pub const HANDOFF_WAITING: &str = "plumber_processor_handoff_waiting_partitions";

/// The gauge a stopping processor sets to 1 once its final commit is made with nothing in
/// flight: its group's offsets will not move again.
pub const FINAL_COMMIT_MADE: &str = "plumber_processor_final_commit_made";

/// How long one instance's page may take: the engine waits on it.
const TIMEOUT: Duration = Duration::from_secs(1);

/// How long a stopping instance's page may take: the stop looks again every few
/// milliseconds, and falls back on the instance's exit.
const STOPPING_TIMEOUT: Duration = Duration::from_millis(250);

/// The most of a page read.
const MAX_PAGE: u64 = 4 << 20;

/// Pages read at the same time: a step may run up to 1,000 instances (`scale.max`), and
/// each read is a thread.
const AT_ONCE: usize = 32;

/// The partitions the instances at `endpoints` hold for their hand-off, summed. An instance
/// whose page cannot be read holds none as far as anyone can tell: the engine waits longer,
/// never less. The pages are read 32 at a time, so the engine waits one timeout (1 s) per 32
/// instances at most.
pub fn held(endpoints: &[MetricsEndpoint]) -> u64 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .max_redirects(0)
        .build()
        .into();
    endpoints
        .chunks(AT_ONCE)
        .map(|some| {
            std::thread::scope(|scope| {
                let reads: Vec<_> = some
                    .iter()
                    .map(|endpoint| scope.spawn(|| held_by(&agent, endpoint)))
                    .collect();
                reads
                    .into_iter()
                    .map(|read| read.join().unwrap_or(0))
                    .sum::<u64>()
            })
        })
        .sum()
}

/// What one instance's page says it holds; 0 when it cannot be read.
fn held_by(agent: &ureq::Agent, endpoint: &MetricsEndpoint) -> u64 {
    match page(agent, endpoint.addr) {
        Ok(page) => gauge(&page, HANDOFF_WAITING).unwrap_or(0.0) as u64,
        Err(error) => {
            tracing::debug!(instance = %endpoint.instance, address = %endpoint.addr, %error, "cannot read a warm instance's /metrics");
            0
        }
    }
}

/// Whether the stopping instance serving `/metrics` at `addr` says its final commit is made;
/// false when its page cannot be read (the stop then waits for the instance to exit).
pub fn final_commit_made(addr: SocketAddr) -> bool {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(STOPPING_TIMEOUT))
        .max_redirects(0)
        .build()
        .into();
    page(&agent, addr).is_ok_and(|page| gauge(&page, FINAL_COMMIT_MADE) == Some(1.0))
}

fn page(agent: &ureq::Agent, addr: SocketAddr) -> Result<String, ureq::Error> {
    let url = format!("http://{addr}/metrics");
    agent.get(&url).call().and_then(|mut response| {
        response
            .body_mut()
            .with_config()
            .limit(MAX_PAGE)
            .read_to_string()
    })
}

/// The value of the unlabelled metric `name` on a Prometheus text page.
fn gauge(page: &str, name: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    /// An instance's `/metrics` page, served once.
    fn serving(page: &'static str) -> MetricsEndpoint {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
        });
        MetricsEndpoint {
            instance: addr.to_string(),
            addr,
        }
    }

    #[test]
    fn the_instances_holds_are_summed_and_an_unreadable_page_holds_none() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let endpoints = vec![
            serving("plumber_processor_handoff_waiting_partitions 2\n"),
            serving("plumber_processor_records_consumed_total 7\n"),
            MetricsEndpoint {
                instance: "gone".into(),
                addr: closed,
            },
            serving("plumber_processor_handoff_waiting_partitions 3\n"),
        ];
        assert_eq!(held(&endpoints), 5);
    }

    #[test]
    fn more_instances_than_are_read_at_once_are_all_counted() {
        let endpoints: Vec<MetricsEndpoint> = (0..AT_ONCE + 8)
            .map(|_| serving("plumber_processor_handoff_waiting_partitions 1\n"))
            .collect();
        assert_eq!(held(&endpoints), (AT_ONCE + 8) as u64);
    }

    #[test]
    fn only_a_page_that_says_so_has_made_its_final_commit() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(final_commit_made(
            serving("plumber_processor_final_commit_made 1\n").addr
        ));
        assert!(!final_commit_made(
            serving("plumber_processor_final_commit_made 0\n").addr
        ));
        assert!(!final_commit_made(
            serving("plumber_processor_records_consumed_total 7\n").addr
        ));
        assert!(!final_commit_made(closed));
    }

    #[test]
    fn the_held_gauge_is_read_by_its_exact_name() {
        let page = "# HELP plumber_processor_handoff_waiting_partitions A warm start's…\n\
                    plumber_processor_handoff_waiting_partitions_other 9\n\
                    plumber_processor_handoff_waiting_partitions 3\n";
        assert_eq!(gauge(page, HANDOFF_WAITING), Some(3.0));
        assert_eq!(
            gauge(
                "plumber_processor_records_consumed_total 5\n",
                HANDOFF_WAITING
            ),
            None
        );
    }
}
