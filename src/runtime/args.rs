//! The processor's command line, built once for every runtime: what a local process is
//! started with is what a pod's container runs (SPEC §5).
//!
//! Only where the processor runs differs between runtimes, and that is a [`Placement`]: the
//! instance name, how it reaches an `http` step's server, where the cluster's credentials
//! are mounted and where it serves `/metrics` and `/healthz`.

use std::collections::BTreeMap;
use std::path::Path;

use super::ProcessorSpec;
use crate::plan::Carry;
use crate::spec::{EnvValue, Transform};

/// Where one instance of a processor runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement<'a> {
    /// The instance's name in logs, metrics and its transactional id; `None` leaves it to
    /// `PLUMBER_INSTANCE` (a pod's name, from the downward API).
    pub instance: Option<&'a str>,
    /// The port an `http` step's server listens on beside the processor (default: the
    /// step's `port`; the local runtime picks a free one per instance).
    pub http_port: Option<u16>,
    /// The directory holding the cluster's credentials, one file per librdkafka property.
    pub credentials: Option<&'a Path>,
    /// Where the processor serves `/metrics` and `/healthz`.
    pub metrics: Option<&'a str>,
}

/// The arguments of `plumber-processor` (without the program name).
pub fn processor_args(spec: &ProcessorSpec, placement: &Placement<'_>) -> Vec<String> {
    let mut args = Vec::new();
    let mut flag = |name: &str, value: &str| {
        args.push(format!("--{name}"));
        args.push(value.to_owned());
    };
    flag("bootstrap", &spec.cluster.bootstrap);
    flag("group", &spec.group);
    flag("dlq", &spec.dlq);
    if let Some(instance) = placement.instance {
        flag("instance", instance);
    }
    flag("log-format", "json");
    for input in &spec.inputs {
        flag("input", input);
    }
    for output in &spec.outputs {
        flag("output", output);
    }
    if let Some(delivery) = spec.settings.delivery {
        flag("delivery", delivery.as_str());
    }
    if let Some(seconds) = spec.settings.record_timeout {
        flag("record-timeout", &seconds.to_string());
    }
    if let Some(assignor) = spec.settings.assignor {
        flag("assignor", assignor.as_str());
    }
    if let Some(group) = &spec.handoff_group {
        flag("handoff-group", group);
    }
    for (key, value) in &spec.cluster.properties {
        flag("kafka", &format!("{key}={value}"));
    }
    if let Some(dir) = placement.credentials {
        flag("kafka-credentials", &dir.display().to_string());
    }
    if let Some(metrics) = placement.metrics {
        flag("metrics", metrics);
    }
    match &spec.transform {
        Transform::Jq { program } => {
            flag("jq", program);
            // `$ENV` in the program is the step's `env:`, and nothing else.
            for name in spec.env.keys() {
                flag("jq-env", name);
            }
        }
        Transform::Sql {
            query,
            state,
            table,
        } => {
            flag("sql", query);
            if let (Some(table), Some(topic)) = (table, &spec.table) {
                // The stream is the one --input: no `--sql-input`.
                flag("table", &format!("{}={topic}", table.step));
                if let Some(max) = table.max_bytes {
                    flag("table-max-bytes", &max.to_string());
                }
            } else if let (Some(settings), Some(run)) = (state, &spec.state) {
                // One input step, read from one topic: no `--sql-input`.
                flag("state-topic", &run.topic);
                flag("grace-ms", &settings.grace_ms.to_string());
                flag("emit", settings.emit.as_str());
                if let Some(max) = settings.max_groups {
                    flag("state-max-groups", &max.to_string());
                }
                match &run.carry {
                    Carry::Rebuild { span_ms } => flag("rebuild", &span_ms.to_string()),
                    Carry::Earliest => flag("rebuild", "earliest"),
                    Carry::Restore | Carry::Empty | Carry::Cannot { .. } => {}
                }
            } else {
                for (step, topic) in &spec.input_steps {
                    flag("sql-input", &format!("{step}={topic}"));
                }
            }
        }
        Transform::Http { port, path, .. } => {
            let port = placement.http_port.unwrap_or(*port);
            flag("http", &format!("http://127.0.0.1:{port}{path}"));
        }
        Transform::Exec { command, .. } => {
            args.push("--exec".into());
            args.push("--".into());
            args.extend(command.iter().cloned());
        }
    }
    args
}

/// The step's environment variables with values written in the file; secret references are
/// the runtime's to resolve (a file locally, `secretKeyRef` in a pod).
pub fn plain_env(spec: &ProcessorSpec) -> BTreeMap<&str, &str> {
    spec.env
        .iter()
        .filter_map(|(name, value)| match value {
            EnvValue::Value(value) => Some((name.as_str(), value.as_str())),
            EnvValue::Secret { .. } => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::Parser;
    use plumber_processor::config::{Args, Config, DeliveryChoice, TransformSpec};

    use super::*;
    use crate::runtime::{Assignor, Cluster, Delivery, Settings};
    use crate::spec::{Scale, SecretRef};

    fn spec(transform: Transform) -> ProcessorSpec {
        ProcessorSpec {
            topology: "t".into(),
            step: "s".into(),
            identity: "ab".repeat(32).parse().unwrap(),
            group: "plumber.t.s.abababababab.2".into(),
            cluster: Cluster {
                bootstrap: "k1:9092,k2:9092".into(),
                properties: BTreeMap::from([
                    ("security.protocol".into(), "SASL_SSL".into()),
                    ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
                ]),
                credentials: Some("kafka-user".into()),
            },
            inputs: vec!["a".into(), "plumber.t.up.cdcdcdcdcdcd".into()],
            input_steps: BTreeMap::from([
                ("raw".into(), "a".into()),
                ("up".into(), "plumber.t.up.cdcdcdcdcdcd".into()),
            ]),
            outputs: vec!["plumber.t.s.abababababab.2".into(), "sink".into()],
            dlq: "plumber.t.s.dlq".into(),
            transform,
            env: BTreeMap::from([
                ("MODEL".into(), EnvValue::Value("v3 --jq x".into())),
                (
                    "API_KEY".into(),
                    EnvValue::Secret {
                        secret_key_ref: SecretRef {
                            name: "scoring".into(),
                            key: "api-key".into(),
                        },
                    },
                ),
            ]),
            scale: Scale {
                min: 0,
                max: 3,
                lag_threshold: 10,
            },
            resources: None,
            commit: "c0ffee".into(),
            dir: "topologies/t/steps".into(),
            settings: Settings {
                delivery: Some(Delivery::ExactlyOnce),
                record_timeout: Some(7),
                assignor: Some(Assignor::Eager),
            },
            state: None,
            table: None,
            handoff_group: None,
        }
    }

    /// A stateful step's changelog, bounds and rebuild reach the processor; it reads one
    /// input, so no `--sql-input`.
    #[test]
    fn a_stateful_step_s_state_settings_reach_the_processor() {
        use crate::plan::{Carry, StateRun};
        use crate::spec::{Emit, SqlState};
        let mut counting = spec(Transform::Sql {
            query: "SELECT _key, COUNT(*) AS n FROM raw GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)".into(),
            state: Some(SqlState {
                grace_ms: 30_000,
                emit: Emit::Update,
                max_groups: Some(5_000),
                start: None,
            }),
            table: None,
        });
        counting.inputs = vec!["a".into()];
        counting.state = Some(StateRun {
            topic: "plumber.t.s.0123456789ab.state".into(),
            carry: Carry::Rebuild { span_ms: 90_000 },
        });
        let config = parsed(&counting, &Placement::default());
        let state = config.state.expect("state settings");
        assert_eq!(state.topic, "plumber.t.s.0123456789ab.state");
        assert_eq!(state.grace_ms, 30_000);
        assert_eq!(state.emit, plumber_processor::config::EmitChoice::Update);
        assert_eq!(state.max_groups, 5_000);
        assert_eq!(
            state.rebuild,
            Some(plumber_processor::config::Rebuild::SpanMs(90_000))
        );
        assert!(
            matches!(config.transform, TransformSpec::Sql { ref inputs, .. } if inputs.is_empty())
        );
        counting.state = Some(StateRun {
            topic: "plumber.t.s.0123456789ab.state".into(),
            carry: Carry::Restore,
        });
        assert_eq!(
            parsed(&counting, &Placement::default())
                .state
                .and_then(|s| s.rebuild),
            None
        );
    }

    /// A join reads its stream as its one input and its table with `--table`, bounded as
    /// the step file says.
    #[test]
    fn a_join_s_table_reaches_the_processor() {
        use crate::spec::SqlTable;
        let mut joining = spec(Transform::Sql {
            query: "SELECT o.*, c.name FROM up o JOIN raw c ON o.cust = c._key".into(),
            state: None,
            table: Some(SqlTable {
                step: "raw".into(),
                max_bytes: Some(64 << 20),
            }),
        });
        joining.inputs = vec!["plumber.t.up.cdcdcdcdcdcd".into()];
        joining.table = Some("a".into());
        let config = parsed(&joining, &Placement::default());
        let table = config.table.expect("the table");
        assert_eq!((table.step.as_str(), table.topic.as_str()), ("raw", "a"));
        assert_eq!(table.max_bytes, 64 << 20);
        assert_eq!(config.inputs, vec!["plumber.t.up.cdcdcdcdcdcd".to_owned()]);
        assert!(
            matches!(config.transform, TransformSpec::Sql { ref inputs, .. } if inputs.is_empty())
        );
    }

    /// What the processor itself makes of the arguments: the test that what a runtime
    /// renders is what `plumber-processor` runs.
    fn parsed(spec: &ProcessorSpec, placement: &Placement<'_>) -> Config {
        let mut argv = vec!["plumber-processor".to_owned()];
        argv.extend(processor_args(spec, placement));
        let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        Config::try_from(args).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
    }

    #[test]
    fn every_setting_reaches_the_processor_as_it_parses_them() {
        let credentials = PathBuf::from("/etc/plumber/kafka");
        let sql = spec(Transform::Sql {
            query: "SELECT * FROM raw UNION ALL SELECT * FROM up".into(),
            state: None,
            table: None,
        });
        let placement = Placement {
            instance: Some("3"),
            metrics: Some("0.0.0.0:9400"),
            ..Placement::default()
        };
        let config = parsed(&sql, &placement);
        assert_eq!(config.bootstrap, "k1:9092,k2:9092");
        assert_eq!(config.group, sql.group);
        assert_eq!(config.inputs, sql.inputs);
        assert_eq!(config.outputs, sql.outputs);
        assert_eq!(config.dlq.as_deref(), Some("plumber.t.s.dlq"));
        assert_eq!(config.instance, "3");
        assert_eq!(config.delivery, DeliveryChoice::ExactlyOnce);
        assert_eq!(config.record_timeout.as_secs(), 7);
        assert_eq!(config.assignor, plumber_processor::config::Assignor::Eager);
        assert_eq!(config.metrics.map(|a| a.port()), Some(9400));
        assert!(
            config
                .kafka
                .contains(&("security.protocol".into(), "SASL_SSL".into()))
        );
        assert_eq!(
            config.transform,
            TransformSpec::Sql {
                query: "SELECT * FROM raw UNION ALL SELECT * FROM up".into(),
                inputs: vec![
                    ("raw".into(), "a".into()),
                    ("up".into(), "plumber.t.up.cdcdcdcdcdcd".into())
                ],
            }
        );
        // Only where the credentials are, never what they are, is on the command line.
        let with_credentials = processor_args(
            &sql,
            &Placement {
                credentials: Some(&credentials),
                ..placement
            },
        );
        let joined = with_credentials.join(" ");
        assert!(
            joined.contains("--kafka-credentials /etc/plumber/kafka"),
            "{joined}"
        );
    }

    #[test]
    fn jq_sees_the_names_of_the_steps_env_and_values_stay_out_of_the_arguments() {
        let jq = spec(Transform::Jq {
            program: ".v = $ENV.MODEL".into(),
        });
        let config = parsed(&jq, &Placement::default());
        assert_eq!(
            config.transform,
            TransformSpec::Jq(".v = $ENV.MODEL".into())
        );
        assert_eq!(
            config.jq_env,
            vec!["API_KEY".to_owned(), "MODEL".to_owned()]
        );
        let args = processor_args(&jq, &Placement::default()).join(" ");
        assert!(!args.contains("v3 --jq x"), "{args}");
        assert_eq!(plain_env(&jq), BTreeMap::from([("MODEL", "v3 --jq x")]));
    }

    #[test]
    fn exec_and_http_commands_pass_through_untouched() {
        let exec = spec(Transform::Exec {
            command: vec!["python3".into(), "--output".into(), "x.py".into()],
            image: None,
        });
        assert_eq!(
            parsed(&exec, &Placement::default()).transform,
            TransformSpec::Exec(vec!["python3".into(), "--output".into(), "x.py".into()])
        );
        let http = spec(Transform::Http {
            image: "score:2".into(),
            port: 8080,
            path: "/score".into(),
            command: None,
        });
        assert_eq!(
            parsed(&http, &Placement::default()).transform,
            TransformSpec::Http("http://127.0.0.1:8080/score".into())
        );
        let moved = Placement {
            http_port: Some(41234),
            ..Placement::default()
        };
        assert_eq!(
            parsed(&http, &moved).transform,
            TransformSpec::Http("http://127.0.0.1:41234/score".into())
        );
    }
}
