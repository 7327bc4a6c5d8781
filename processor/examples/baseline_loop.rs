//! The benchmark baseline: a minimal hand-written rdkafka consume → produce loop with the
//! same guarantee as the processor at-least-once (offsets committed after a flush), the same
//! producer settings, and no transform, metrics or dead letters.
//!
//! `baseline_loop BOOTSTRAP GROUP INPUT OUTPUT` — stops on SIGTERM. Prints `partitions
//! assigned` to stderr when it owns its partitions, as the processor logs it: the benchmark
//! times catching up from there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bootstrap, group, input, output] = args.as_slice() else {
        return Err("usage: baseline_loop BOOTSTRAP GROUP INPUT OUTPUT".into());
    };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;

    let consumer: BaseConsumer<Announce> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // As the processor, so that latency compares the loops, not the fetch settings.
        .set("fetch.wait.max.ms", "100")
        .create_with_context(Announce)?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "false")
        .set("max.in.flight.requests.per.connection", "1")
        .set("linger.ms", "5")
        .create()?;
    consumer.subscribe(&[input.as_str()])?;

    let mut last_commit = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            let message = message?;
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output);
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            if let Some(value) = message.payload() {
                record = record.payload(value);
            }
            if let Some(headers) = message.headers() {
                record = record.headers(headers.detach());
            }
            while let Err((error, back)) = producer.send(record) {
                if !matches!(
                    error.rdkafka_error_code(),
                    Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                ) {
                    return Err(error.into());
                }
                record = back;
                producer.poll(Duration::from_millis(10));
            }
        }
        producer.poll(Duration::ZERO);
        if last_commit.elapsed() >= Duration::from_secs(1) {
            producer.flush(Duration::from_secs(10))?;
            consumer
                .commit_consumer_state(CommitMode::Sync)
                .or_else(ignore_nothing_to_commit)?;
            last_commit = Instant::now();
        }
    }
    producer.flush(Duration::from_secs(10))?;
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .or_else(ignore_nothing_to_commit)?;
    Ok(())
}

struct Announce;

impl ClientContext for Announce {}

impl ConsumerContext for Announce {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Assign(_)) {
            eprintln!("partitions assigned");
        }
    }
}

fn ignore_nothing_to_commit(
    error: rdkafka::error::KafkaError,
) -> Result<(), rdkafka::error::KafkaError> {
    match error.rdkafka_error_code() {
        Some(rdkafka::types::RDKafkaErrorCode::NoOffset) => Ok(()),
        _ => Err(error),
    }
}
