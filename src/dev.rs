//! `plumber dev`: helpers for trying Plumber on one machine. In production, data engineers
//! own source and sink topics and real producers write them; locally these stand in.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Subcommand;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};

use plumber::graph::StepKind;
use plumber::kafka::{Admin as _, KafkaAdmin};
use plumber::repo::Repository;

#[derive(Subcommand)]
pub enum Dev {
    /// Create every source and sink topic of a revision (Plumber never creates those itself).
    Topics {
        #[arg(default_value = ".")]
        repo: String,
        #[arg(long, default_value = "HEAD")]
        rev: String,
        #[arg(long, env = "PLUMBER_BOOTSTRAP", default_value = "127.0.0.1:9092")]
        bootstrap: String,
        #[arg(long, default_value_t = 3)]
        partitions: u32,
    },
    /// Write sample JSON records (clicks and vehicle telemetry fields) to topics at a steady
    /// rate, until stopped or `--count` records.
    Load {
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        #[arg(long, env = "PLUMBER_BOOTSTRAP", default_value = "127.0.0.1:9092")]
        bootstrap: String,
        /// Records per second per topic.
        #[arg(long, default_value_t = 5)]
        rate: u32,
        #[arg(long)]
        count: Option<u64>,
    },
    /// Print the records arriving on topics (from their end), one line each.
    Tail {
        #[arg(long = "topic", required = true)]
        topics: Vec<String>,
        #[arg(long, env = "PLUMBER_BOOTSTRAP", default_value = "127.0.0.1:9092")]
        bootstrap: String,
        /// Start from the beginning instead of the end.
        #[arg(long)]
        from_beginning: bool,
    },
}

pub fn run(command: Dev) -> Result<()> {
    match command {
        Dev::Topics {
            repo,
            rev,
            bootstrap,
            partitions,
        } => {
            let repo = Repository::open(&repo)?;
            let commit = repo.resolve(&rev)?;
            let validation = plumber::validate(&repo.snapshot(commit)?.files);
            let topologies = validation
                .topologies
                .context("the revision is not valid; run `plumber validate` for the errors")?;
            let admin = KafkaAdmin::connect(&bootstrap)?;
            let mut topics: Vec<&str> = topologies
                .iter()
                .flat_map(|t| t.steps().map(|(_, s)| &s.kind))
                .filter_map(|kind| match kind {
                    StepKind::Source { topic } | StepKind::Sink { topic } => Some(topic.as_str()),
                    StepKind::Processor { .. } => None,
                })
                .collect();
            topics.sort_unstable();
            topics.dedup();
            for topic in topics {
                admin.create_topic(topic, partitions, None, &Default::default())?;
                println!("{topic}");
            }
            Ok(())
        }
        Dev::Load {
            topics,
            bootstrap,
            rate,
            count,
        } => load(&bootstrap, &topics, rate.max(1), count),
        Dev::Tail {
            topics,
            bootstrap,
            from_beginning,
        } => tail(&bootstrap, &topics, from_beginning),
    }
}

fn tail(bootstrap: &str, topics: &[String], from_beginning: bool) -> Result<()> {
    use rdkafka::Message as _;
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("plumber-dev-tail-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set(
            "auto.offset.reset",
            if from_beginning { "earliest" } else { "latest" },
        )
        .create()
        .context("creating the consumer")?;
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).context("subscribing")?;
    loop {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(message)) => println!(
                "{} {}/{}@{} {} {}",
                message
                    .timestamp()
                    .to_millis()
                    .map(|ms| ms.to_string())
                    .unwrap_or_default(),
                message.topic(),
                message.partition(),
                message.offset(),
                String::from_utf8_lossy(message.key().unwrap_or_default()),
                String::from_utf8_lossy(message.payload().unwrap_or_default())
            ),
            Some(Err(error)) => eprintln!("{error}"),
            None => {}
        }
    }
}

fn load(bootstrap: &str, topics: &[String], rate: u32, count: Option<u64>) -> Result<()> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        // Ordered without idempotence: librdkafka's idempotent producer busy-waits on a broker
        // that acknowledges slowly (tansu), and a duplicated sample record harms nothing.
        .set("enable.idempotence", "false")
        .set("max.in.flight.requests.per.connection", "1")
        .set("linger.ms", "5")
        .create()
        .context("creating the producer")?;
    const PLATFORMS: [&str; 4] = ["ios", "android", "web", "WEB"];
    const PAGES: [&str; 4] = ["/", "/shop/shoes", "/shop/hats/red", "/help/returns"];
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut seq: u64 = 0;
    while count.is_none_or(|c| seq < c) {
        let due = started + Duration::from_secs_f64(seq as f64 / f64::from(rate));
        while Instant::now() < due {
            producer.poll(due.saturating_duration_since(Instant::now()));
        }
        let value = serde_json::json!({
            "seq": seq,
            "user": format!("u{}", seq % 17),
            "page": PAGES[(seq % 4) as usize],
            "platform": PLATFORMS[(seq / 4 % 4) as usize],
            "ts": started.elapsed().as_millis() as u64,
            "vehicle": format!("v{}", seq % 5),
            "speed": (seq * 7) % 40,
        })
        .to_string();
        let key = format!("k{}", seq % 50);
        for topic in topics {
            let record = BaseRecord::to(topic).key(&key).payload(&value);
            if let Err((error, _)) = producer.send(record) {
                anyhow::bail!("sending to {topic}: {error}");
            }
        }
        seq += 1;
        if last_report.elapsed() >= Duration::from_secs(10) {
            eprintln!("{seq} records sent to {}", topics.join(", "));
            last_report = Instant::now();
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .context("waiting for the last records")?;
    eprintln!("{seq} records sent to {}", topics.join(", "));
    Ok(())
}
