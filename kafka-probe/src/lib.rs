//! What the daemon and every processor need alike to be a client of a Kafka cluster: what
//! the cluster supports, asked once by the daemon (per cluster, to decide the delivery mode
//! of every processor) and by `plumber-processor --delivery auto`; and the cluster's
//! [`credentials`], read from files.
//!
//! Its own crate because both need it and neither should carry the other's dependencies.

pub mod credentials;

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, Producer as _, ProducerContext};

/// Produce with transactions, commit offsets in them, and end them (KIP-98, KIP-447).
const TRANSACTION_APIS: [&str; 5] = [
    "InitProducerId",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "EndTxn",
    "TxnOffsetCommit",
];

/// Whether every broker a client of `client` (bootstrap servers and any security settings)
/// reaches supports the transaction APIs, from the API versions they announce. librdkafka
/// exposes those only in its `feature` debug log, so a short-lived client records that log.
/// `None` when no broker answered within `timeout`: not an answer, ask again.
pub fn brokers_support_transactions(client: &ClientConfig, timeout: Duration) -> Option<bool> {
    let mut client = client.clone();
    client
        .set("debug", "feature")
        .set_log_level(RDKafkaLogLevel::Debug);
    let producer: BaseProducer<ApiProbe> = client.create_with_context(ApiProbe::default()).ok()?;
    let reached = producer.client().fetch_metadata(None, timeout).is_ok();
    // The log lines travel through the client's queue: serve it.
    for _ in 0..3 {
        producer.poll(Duration::from_millis(50));
    }
    let seen = producer
        .context()
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if !reached || seen.brokers == 0 {
        return None;
    }
    Some(
        TRANSACTION_APIS
            .iter()
            .all(|api| seen.apis.iter().any(|seen| seen == api)),
    )
}

#[derive(Default)]
struct ApiProbe {
    seen: Mutex<SeenApis>,
}

#[derive(Default, Clone)]
struct SeenApis {
    brokers: usize,
    apis: Vec<String>,
}

impl ClientContext for ApiProbe {
    fn log(&self, _level: RDKafkaLogLevel, facility: &str, message: &str) {
        if facility != "APIVERSION" {
            return;
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if message.ends_with("Broker API support:") {
            seen.brokers += 1;
        } else if let Some(api) = api_name(message) {
            seen.apis.push(api.to_owned());
        }
    }
}

impl ProducerContext for ApiProbe {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// `…:   ApiKey EndTxn (26) Versions 0..3` → `EndTxn`.
fn api_name(line: &str) -> Option<&str> {
    let rest = &line[line.find("ApiKey ")? + "ApiKey ".len()..];
    rest.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_names_are_read_from_librdkafka_feature_lines() {
        let line = "127.0.0.1:9092/1:   ApiKey EndTxn (26) Versions 0..3";
        assert_eq!(api_name(line), Some("EndTxn"));
        assert_eq!(api_name("Broker API support:"), None);
    }

    #[test]
    fn no_broker_is_no_answer() {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", "127.0.0.1:1");
        assert_eq!(
            brokers_support_transactions(&client, Duration::from_millis(500)),
            None
        );
    }
}
