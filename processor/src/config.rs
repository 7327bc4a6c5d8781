//! The command line of SPEC §5, also read from `PLUMBER_*` environment variables (pods).

use std::net::SocketAddr;
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};

/// Runs one Plumber step: consumes its input topics, transforms every record, produces the
/// results to its output topics and commits.
#[derive(Debug, Parser)]
#[command(name = "plumber-processor", version)]
#[command(group(ArgGroup::new("transform").required(true).args(["jq", "sql", "exec", "exec_json", "http"])))]
#[command(after_help = "Examples:\n  \
    plumber-processor --bootstrap localhost:9092 --group g --input in --output out --jq 'select(.ok)'\n  \
    plumber-processor --bootstrap localhost:9092 --group g --input in --output out --sql 'SELECT id FROM in WHERE ok'\n  \
    plumber-processor --bootstrap localhost:9092 --group g --input in --output out --exec -- python3 step.py\n  \
    plumber-processor --bootstrap localhost:9092 --group g --input in --output out --http http://localhost:8080/score")]
pub struct Args {
    /// Kafka bootstrap servers (HOST:PORT[,HOST:PORT…]).
    #[arg(long, env = "PLUMBER_BOOTSTRAP", value_name = "HOST:PORT")]
    pub bootstrap: String,
    /// Consumer group; also the prefix of the transactional id.
    #[arg(long, env = "PLUMBER_GROUP")]
    pub group: String,
    /// Topic to consume (repeat, or comma-separated in PLUMBER_INPUTS).
    #[arg(
        long = "input",
        env = "PLUMBER_INPUTS",
        value_delimiter = ',',
        required = true
    )]
    pub inputs: Vec<String>,
    /// Topic every output record is produced to (repeat, or comma-separated in PLUMBER_OUTPUTS).
    #[arg(long = "output", env = "PLUMBER_OUTPUTS", value_delimiter = ',')]
    pub outputs: Vec<String>,
    /// jq program applied to each record's JSON value; each result is one output record.
    #[arg(long, env = "PLUMBER_JQ", value_name = "PROGRAM")]
    pub jq: Option<String>,
    /// SQL query run on each record's JSON value: `SELECT … FROM <input step> [WHERE …]`;
    /// each row that passes WHERE is one output record.
    #[arg(long, env = "PLUMBER_SQL", value_name = "QUERY")]
    pub sql: Option<String>,
    /// Which topic an input step of the query's FROM is read from (repeat, or comma-separated
    /// in PLUMBER_SQL_INPUTS). Needed when the query's SELECTs read several input steps
    /// (UNION ALL): each runs on the records of its step's topic.
    #[arg(
        long = "sql-input",
        env = "PLUMBER_SQL_INPUTS",
        value_delimiter = ',',
        value_name = "STEP=TOPIC",
        value_parser = parse_property
    )]
    pub sql_inputs: Vec<(String, String)>,
    /// The changelog topic of a stateful SQL step (`GROUP BY`): compacted, with the input's
    /// partition count; the processor restores each partition's state from it and writes the
    /// state's changes to it with every commit (`docs/stateful-sql.md`). The daemon creates it.
    #[arg(
        long = "state-topic",
        env = "PLUMBER_STATE_TOPIC",
        value_name = "TOPIC"
    )]
    pub state_topic: Option<String>,
    /// The table of a stream–table join: the query's step read as a table, and its topic.
    /// Every instance reads the topic whole, from its beginning, outside the group, before its
    /// first stream record, and keeps reading it (`docs/stateful-sql.md`).
    #[arg(
        long = "table",
        env = "PLUMBER_TABLE",
        value_name = "STEP=TOPIC",
        value_parser = parse_property
    )]
    pub table: Option<(String, String)>,
    /// The most memory a join's table may take (keys, values and about 64 bytes a row): a
    /// table topic past it stops the processor, naming this flag, rather than taking the
    /// node's memory.
    #[arg(
        long = "table-max-bytes",
        env = "PLUMBER_TABLE_MAX_BYTES",
        value_name = "BYTES",
        default_value_t = DEFAULT_TABLE_MAX_BYTES
    )]
    pub table_max_bytes: usize,
    /// How long after its end a window takes late records, in milliseconds (`grace:`).
    #[arg(
        long = "grace-ms",
        env = "PLUMBER_GRACE_MS",
        value_name = "MS",
        default_value_t = 0
    )]
    pub grace_ms: u64,
    /// When a windowed query emits: once per window when it closes, or on every update.
    #[arg(long, env = "PLUMBER_EMIT", value_enum, default_value_t = EmitChoice::Close)]
    pub emit: EmitChoice,
    /// A partition whose state the changelog does not hold is first rebuilt from the input's
    /// records before the first one it reads: those from SPAN_MS (twice, for event time that
    /// trails the records' timestamps) before that record's timestamp, or from the earliest;
    /// fed without emitting. What a replaced stateful step's new life starts with
    /// (`docs/stateful-sql.md`).
    #[arg(long, env = "PLUMBER_REBUILD", value_name = "SPAN_MS|earliest", value_parser = parse_rebuild)]
    pub rebuild: Option<Rebuild>,
    /// The most groups (a key's window, or a key's running aggregate) this instance keeps
    /// open, each value a `COUNT(DISTINCT …)` holds counting as one more; a record that would
    /// go past it is dead-lettered (`state-full`) instead of growing memory without bound.
    /// At most about 0.4 KB of memory each.
    #[arg(
        long = "state-max-groups",
        env = "PLUMBER_STATE_MAX_GROUPS",
        value_name = "N",
        default_value_t = DEFAULT_STATE_MAX_GROUPS
    )]
    pub state_max_groups: usize,
    /// An environment variable the jq program sees in `$ENV` and `env` (repeat, or
    /// comma-separated in PLUMBER_JQ_ENV): the step's `env:`. It sees no others.
    #[arg(
        long = "jq-env",
        env = "PLUMBER_JQ_ENV",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub jq_env: Vec<String>,
    /// Run the command after `--` as a long-lived child speaking the exec line protocol.
    #[arg(long, requires = "command")]
    pub exec: bool,
    /// The exec command as a JSON array (for pods): '["python3","step.py"]'.
    #[arg(
        long = "exec-json",
        env = "PLUMBER_EXEC",
        value_name = "JSON",
        hide_short_help = true
    )]
    pub exec_json: Option<String>,
    /// POST each record to this URL (the sidecar protocol).
    #[arg(long, env = "PLUMBER_HTTP", value_name = "URL")]
    pub http: Option<String>,
    /// The exec command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
    /// Dead-letter topic for records the transform cannot handle. Without it such a record
    /// stops the processor (uncommitted) instead of being dropped.
    #[arg(long, env = "PLUMBER_DLQ", value_name = "TOPIC")]
    pub dlq: Option<String>,
    /// Serve Prometheus metrics on /metrics and liveness on /healthz at this address.
    #[arg(long, env = "PLUMBER_METRICS", value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Delivery guarantee. `auto` runs exactly-once when the brokers support transactions,
    /// asking them until they answer; the daemon passes the mode explicitly.
    #[arg(long, env = "PLUMBER_DELIVERY", value_enum, default_value_t = DeliveryChoice::Auto)]
    pub delivery: DeliveryChoice,
    /// How often consumed offsets are committed (at-least-once) or transactions are committed
    /// (exactly-once), in milliseconds. Default: 1000 at-least-once, 100 exactly-once.
    #[arg(long, env = "PLUMBER_COMMIT_INTERVAL_MS", value_name = "MS")]
    pub commit_interval_ms: Option<u64>,
    /// Seconds one exec or http call may take before it counts as failed (and is retried,
    /// within the record timeout).
    #[arg(
        long,
        env = "PLUMBER_TRANSFORM_TIMEOUT",
        default_value_t = DEFAULT_TRANSFORM_TIMEOUT,
        value_name = "SECS",
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub transform_timeout: u64,
    /// Seconds one record may take in the transform, all attempts and backoffs included;
    /// a record still unfinished then is dead-lettered (kind `timeout`).
    #[arg(
        long,
        env = "PLUMBER_RECORD_TIMEOUT",
        default_value_t = 60,
        value_name = "SECS",
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub record_timeout: u64,
    /// Attempts per record for exec crashes and http 5xx or timeouts before dead-lettering.
    #[arg(long, env = "PLUMBER_ATTEMPTS", default_value_t = DEFAULT_ATTEMPTS, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub attempts: u32,
    /// How the group hands partitions over when members come and go: `cooperative`
    /// (KIP-429, librdkafka's cooperative-sticky assignor) moves only the partitions that
    /// change owner, the others keep flowing; `eager` (librdkafka's default range,roundrobin)
    /// stops every member of the group at every change. All members of a group must use the
    /// same one.
    #[arg(long, env = "PLUMBER_ASSIGNOR", value_enum, default_value_t = Assignor::Cooperative)]
    pub assignor: Assignor,
    /// Identifies this instance in the transactional id (default: $HOSTNAME, else the pid).
    /// A restarted instance with the same id fences its predecessor.
    #[arg(long, env = "PLUMBER_INSTANCE")]
    pub instance: Option<String>,
    /// A warm start: join the group and hold every partition it gives, unread, until its
    /// start is known: the group's committed offset, else the one this group (written by the
    /// cutover engine, never joined) holds for it. So a successor is connected and assigned
    /// before its predecessor stops, and starts exactly where the predecessor stopped.
    #[arg(long, env = "PLUMBER_HANDOFF_GROUP", value_name = "GROUP")]
    pub handoff_group: Option<String>,
    /// Extra librdkafka property for every client, e.g. -X security.protocol=SSL.
    #[arg(short = 'X', long = "kafka", value_name = "KEY=VALUE", value_parser = parse_property)]
    pub kafka: Vec<(String, String)>,
    /// A directory of the cluster's credentials, one librdkafka property per file
    /// (`sasl.password`, …; `ca.crt`, `tls.crt`, `tls.key` as certificate files): a mounted
    /// Kubernetes Secret, or what `plumber up --kafka-credentials` names.
    #[arg(long, env = "PLUMBER_KAFKA_CREDENTIALS", value_name = "DIR")]
    pub kafka_credentials: Option<std::path::PathBuf>,
    /// Log format on stderr; `auto` is JSON unless stderr is a terminal.
    #[arg(long, env = "PLUMBER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
}

/// `--state-max-groups` unless set: 200,000 groups is about 80 MB of memory.
pub const DEFAULT_STATE_MAX_GROUPS: usize = 200_000;

/// `--transform-timeout`'s default, seconds.
pub const DEFAULT_TRANSFORM_TIMEOUT: u64 = 30;

/// `--attempts`' default.
pub const DEFAULT_ATTEMPTS: u32 = 4;

/// `--table-max-bytes`: 256 MiB, a table of about a million rows of 200 bytes.
pub const DEFAULT_TABLE_MAX_BYTES: usize = 256 << 20;

/// The table of a stream–table join (`--table`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableConfig {
    /// The query's step read as the table.
    pub step: String,
    pub topic: String,
    pub max_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmitChoice {
    Close,
    Update,
}

/// Where a stateful step keeps its state, and its bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// The changelog topic.
    pub topic: String,
    pub grace_ms: u64,
    pub emit: EmitChoice,
    pub max_groups: usize,
    pub rebuild: Option<Rebuild>,
}

/// How far back a partition without state is rebuilt from its input (`--rebuild`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    /// From this many milliseconds before the first record's timestamp (twice that).
    SpanMs(u64),
    Earliest,
}

fn parse_rebuild(raw: &str) -> Result<Rebuild, String> {
    if raw == "earliest" {
        return Ok(Rebuild::Earliest);
    }
    raw.parse()
        .map(Rebuild::SpanMs)
        .map_err(|_| format!("expected milliseconds or `earliest`, got `{raw}`"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeliveryChoice {
    Auto,
    ExactlyOnce,
    AtLeastOnce,
}

/// The rebalance protocol of the consumer group, by the assignors that implement it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Assignor {
    /// KIP-429: incremental revocations and assignments.
    Cooperative,
    /// Every rebalance revokes every partition of every member first.
    Eager,
}

impl Assignor {
    /// `partition.assignment.strategy`. librdkafka refuses to mix eager and cooperative
    /// assignors in one list, so there is no list that migrates a running group.
    pub fn strategy(self) -> &'static str {
        match self {
            Assignor::Cooperative => "cooperative-sticky",
            // librdkafka's default, what the processor used before it chose.
            Assignor::Eager => "range,roundrobin",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Auto,
    Json,
    Text,
}

/// The guarantee the pipeline runs with, once `auto` is resolved against the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    /// Offsets committed after the outputs are acknowledged; outputs sent in order, one
    /// request in flight per broker (see `kafka::producer`).
    /// A crash may reprocess records since the last commit; a graceful stop does not.
    AtLeastOnce,
    /// Outputs and offsets committed in one Kafka transaction.
    ExactlyOnce,
}

/// Which transform a step runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransformSpec {
    Jq(String),
    /// The query and, by input step, the topic it is read from.
    Sql {
        query: String,
        inputs: Vec<(String, String)>,
    },
    Exec(Vec<String>),
    Http(String),
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub bootstrap: String,
    pub group: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub transform: TransformSpec,
    /// The environment variables a jq program sees (`--jq-env`).
    pub jq_env: Vec<String>,
    /// A stateful SQL step's changelog and bounds (`--state-topic`).
    pub state: Option<StateConfig>,
    /// A join's table (`--table`).
    pub table: Option<TableConfig>,
    pub dlq: Option<String>,
    pub metrics: Option<SocketAddr>,
    pub delivery: DeliveryChoice,
    pub commit_interval: Option<Duration>,
    pub transform_timeout: Duration,
    pub record_timeout: Duration,
    pub attempts: u32,
    pub assignor: Assignor,
    pub instance: String,
    pub kafka: Vec<(String, String)>,
    /// `--handoff-group`.
    pub handoff_group: Option<String>,
}

impl DeliveryMode {
    /// The mode as the command line names it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryMode::AtLeastOnce => "at-least-once",
            DeliveryMode::ExactlyOnce => "exactly-once",
        }
    }
}

impl std::fmt::Display for DeliveryMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Config {
    /// The commit interval for `mode`: short for transactions, because read_committed readers
    /// downstream only see records once their transaction commits.
    pub fn commit_interval(&self, mode: DeliveryMode) -> Duration {
        self.commit_interval.unwrap_or(match mode {
            DeliveryMode::AtLeastOnce => Duration::from_millis(1000),
            DeliveryMode::ExactlyOnce => Duration::from_millis(100),
        })
    }

    pub fn transactional_id(&self) -> String {
        format!("{}.{}", self.group, self.instance)
    }
}

impl TryFrom<Args> for Config {
    type Error = String;

    fn try_from(args: Args) -> Result<Self, String> {
        if !args.sql_inputs.is_empty() && args.sql.is_none() {
            return Err("--sql-input goes with --sql".into());
        }
        if args.state_topic.is_some() && args.sql.is_none() {
            return Err("--state-topic goes with --sql (a query with GROUP BY)".into());
        }
        if args
            .state_topic
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err("--state-topic must name a topic".into());
        }
        if args.table.is_some() && args.sql.is_none() {
            return Err("--table goes with --sql (a query with JOIN)".into());
        }
        if args.table.is_some() && args.state_topic.is_some() {
            return Err(
                "--table and --state-topic do not go together: a query joins or groups, not both"
                    .into(),
            );
        }
        if args
            .table
            .as_ref()
            .is_some_and(|(_, topic)| topic.trim().is_empty())
        {
            return Err("--table STEP=TOPIC must name a topic".into());
        }
        if args.table_max_bytes == 0 {
            return Err("--table-max-bytes must be at least 1".into());
        }
        let table = args.table.map(|(step, topic)| TableConfig {
            step,
            topic,
            max_bytes: args.table_max_bytes,
        });
        if args.state_max_groups == 0 {
            return Err("--state-max-groups must be at least 1".into());
        }
        if args.rebuild.is_some() && args.state_topic.is_none() {
            return Err("--rebuild goes with --state-topic".into());
        }
        let state = args.state_topic.map(|topic| StateConfig {
            topic,
            grace_ms: args.grace_ms,
            emit: args.emit,
            max_groups: args.state_max_groups,
            rebuild: args.rebuild,
        });
        let transform = if let Some(program) = args.jq {
            TransformSpec::Jq(program)
        } else if let Some(query) = args.sql {
            TransformSpec::Sql {
                query,
                inputs: args.sql_inputs,
            }
        } else if let Some(url) = args.http {
            TransformSpec::Http(url)
        } else if args.exec {
            TransformSpec::Exec(args.command)
        } else if let Some(json) = args.exec_json {
            let command: Vec<String> = serde_json::from_str(&json).map_err(|e| {
                format!("PLUMBER_EXEC must be a JSON array of strings like [\"python3\",\"step.py\"]: {e}")
            })?;
            TransformSpec::Exec(command)
        } else {
            return Err("one of --jq, --sql, --exec or --http is required".into());
        };
        if let TransformSpec::Exec(command) = &transform
            && command.first().is_none_or(|program| program.is_empty())
        {
            return Err("--exec needs a command after `--`, e.g. --exec -- python3 step.py".into());
        }
        let nonempty = |what: &str, names: &[String]| {
            if names.iter().any(|name| name.trim().is_empty()) {
                Err(format!("{what} topic names must not be empty"))
            } else {
                Ok(())
            }
        };
        nonempty("input", &args.inputs)?;
        nonempty("output", &args.outputs)?;
        let instance = args
            .instance
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| format!("pid{}", std::process::id()));
        Ok(Config {
            bootstrap: args.bootstrap,
            group: args.group,
            inputs: args.inputs,
            outputs: args.outputs,
            transform,
            jq_env: args.jq_env,
            state,
            table,
            dlq: args.dlq,
            metrics: args.metrics,
            delivery: args.delivery,
            commit_interval: args.commit_interval_ms.map(Duration::from_millis),
            transform_timeout: Duration::from_secs(args.transform_timeout),
            record_timeout: Duration::from_secs(args.record_timeout),
            attempts: args.attempts,
            assignor: args.assignor,
            handoff_group: args.handoff_group,
            instance,
            kafka: {
                let mut kafka = args.kafka;
                if let Some(dir) = &args.kafka_credentials {
                    kafka.extend(
                        plumber_kafka_probe::credentials::properties(dir)
                            .map_err(|e| e.to_string())?,
                    );
                }
                kafka
            },
        })
    }
}

fn parse_property(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got `{raw}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let args = Args::try_parse_from(
            [
                "plumber-processor",
                "--bootstrap",
                "b:9092",
                "--group",
                "g",
                "--input",
                "in",
            ]
            .iter()
            .chain(args),
        )
        .map_err(|e| e.to_string())?;
        Config::try_from(args)
    }

    #[test]
    fn credentials_files_become_client_properties_and_a_bad_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sasl.password"), "pw\n").unwrap();
        let path = dir.path().display().to_string();
        let config = parse(&[
            "--jq",
            ".",
            "-X",
            "security.protocol=SASL_SSL",
            "--kafka-credentials",
            &path,
        ])
        .unwrap();
        assert_eq!(
            config.kafka,
            vec![
                ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
                ("sasl.password".to_owned(), "pw".to_owned()),
            ]
        );
        let error = parse(&["--jq", ".", "--kafka-credentials", "/nonexistent/kafka"]).unwrap_err();
        assert!(error.contains("/nonexistent/kafka"), "{error}");
    }

    #[test]
    fn exec_command_follows_the_double_dash() {
        let config = parse(&["--exec", "--", "python3", "step.py", "--flag"]).unwrap();
        assert_eq!(
            config.transform,
            TransformSpec::Exec(vec!["python3".into(), "step.py".into(), "--flag".into()])
        );
    }

    #[test]
    fn exactly_one_transform_is_required() {
        assert!(parse(&[]).unwrap_err().contains("required"));
        assert!(parse(&["--jq", ".", "--http", "http://x"]).is_err());
    }

    #[test]
    fn sql_takes_a_query_and_the_topics_of_its_input_steps() {
        let config = parse(&[
            "--sql",
            "SELECT id FROM a UNION ALL SELECT id FROM b",
            "--sql-input",
            "a=t1",
            "--sql-input",
            "b=t2",
        ])
        .unwrap();
        assert_eq!(
            config.transform,
            TransformSpec::Sql {
                query: "SELECT id FROM a UNION ALL SELECT id FROM b".into(),
                inputs: vec![("a".into(), "t1".into()), ("b".into(), "t2".into())],
            }
        );
        assert!(parse(&["--sql", "SELECT 1", "--jq", "."]).is_err());
        assert!(parse(&["--jq", ".", "--sql-input", "a=t"]).is_err());
        assert!(parse(&["--sql", "SELECT * FROM a", "--sql-input", "a"]).is_err());
    }

    #[test]
    fn a_join_names_its_table_step_and_topic() {
        let query = "SELECT o.id, c.name FROM orders o JOIN customers c ON o.cust = c._key";
        let config = parse(&["--sql", query, "--table", "customers=cust-topic"]).unwrap();
        assert_eq!(
            config.table,
            Some(TableConfig {
                step: "customers".into(),
                topic: "cust-topic".into(),
                max_bytes: DEFAULT_TABLE_MAX_BYTES,
            })
        );
        assert!(parse(&["--jq", ".", "--table", "c=t"]).is_err());
        assert!(parse(&["--sql", query, "--table", "c=t", "--state-topic", "s"]).is_err());
        assert!(parse(&["--sql", query, "--table", "c=t", "--table-max-bytes", "0"]).is_err());
    }

    #[test]
    fn the_assignor_is_cooperative_unless_eager_is_asked_for() {
        let config = parse(&["--jq", "."]).unwrap();
        assert_eq!(config.assignor, Assignor::Cooperative);
        assert_eq!(config.assignor.strategy(), "cooperative-sticky");
        let config = parse(&["--jq", ".", "--assignor", "eager"]).unwrap();
        assert_eq!(config.assignor, Assignor::Eager);
        assert!(parse(&["--jq", ".", "--assignor", "sticky"]).is_err());
    }

    #[test]
    fn kafka_properties_need_a_key() {
        let config = parse(&["--jq", ".", "-X", "linger.ms=5"]).unwrap();
        assert_eq!(config.kafka, vec![("linger.ms".into(), "5".into())]);
        assert!(
            parse(&["--jq", ".", "-X", "=5"])
                .unwrap_err()
                .contains("KEY=VALUE")
        );
    }
}
