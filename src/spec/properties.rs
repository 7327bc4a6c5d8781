//! Which librdkafka properties a cluster's `properties` may set (SPEC §2, §11).
//!
//! Every client of a cluster gets them: the daemon's admin client and every processor. A
//! property is a lever on what those clients do, so what `plumber.yaml` may set is an
//! allow-list, not a deny-list: librdkafka has hundreds of settings and new versions add more,
//! and several of them run code (`plugin.library.paths`, `sasl.kerberos.kinit.cmd`), send
//! credentials elsewhere (`sasl.oauthbearer.token.endpoint.url`) or quietly break the delivery
//! promise (`acks`, `enable.ssl.certificate.verification`). What Git may set is connection,
//! security-protocol and throughput tuning; everything that decides acknowledgement,
//! idempotence, isolation, commits, TLS verification, credentials or code is Plumber's.
//!
//! The operator's own settings (the daemon configuration's `kafka.clusters.*.properties`)
//! are not held to the allow-list (an operator may need a setting Git may not touch), only to
//! the refusals that protect the delivery promise and the credentials.

/// Who sets a property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `plumber.yaml`, from a commit anyone with a branch can write.
    Repository,
    /// The daemon's configuration, set by the operator outside Git.
    Operator,
}

/// Properties `plumber.yaml` may set: connection, security protocol and throughput tuning.
const ALLOWED: &[&str] = &[
    // How to reach and authenticate to the brokers (the secrets come from `credentials`).
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "ssl.cipher.suites",
    "ssl.curves.list",
    "ssl.sigalgs.list",
    "client.rack",
    "client.dns.lookup",
    "broker.address.family",
    "broker.address.ttl",
    // Connections and metadata.
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "socket.keepalive.enable",
    "socket.nagle.disable",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "connections.max.idle.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "request.timeout.ms",
    "api.version.request.timeout.ms",
    "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms",
    "topic.metadata.refresh.fast.interval.ms",
    "topic.metadata.refresh.sparse",
    "topic.metadata.propagation.max.ms",
    "message.max.bytes",
    "receive.message.max.bytes",
    // Producing: batching and compression (a send still counts only once acknowledged).
    "linger.ms",
    "queue.buffering.max.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "batch.num.messages",
    "batch.size",
    "compression.type",
    "compression.codec",
    "compression.level",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "sticky.partitioning.linger.ms",
    // Consuming: fetch sizes and group timing.
    "fetch.min.bytes",
    "fetch.max.bytes",
    "fetch.wait.max.ms",
    "fetch.error.backoff.ms",
    "fetch.queue.backoff.ms",
    "max.partition.fetch.bytes",
    "fetch.message.max.bytes",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "coordinator.query.interval.ms",
    "check.crcs",
];

/// Settings Plumber decides for every client, whoever asks.
const PLUMBER_S: &[(&str, &str)] = &[
    ("bootstrap.servers", "the cluster's `bootstrap` sets it"),
    ("metadata.broker.list", "the cluster's `bootstrap` sets it"),
    ("group.id", "each processor's group is named by Plumber"),
    (
        "group.instance.id",
        "Plumber names each processor's members",
    ),
    ("group.protocol", "Plumber runs the consumer group protocol"),
    (
        "partition.assignment.strategy",
        "the daemon chooses the assignor (`plumber up --assignor`) and every instance of a group must use the same",
    ),
    ("client.id", "Plumber names each client after its group"),
    (
        "transactional.id",
        "exactly-once processors take theirs from their group and instance",
    ),
    (
        "allow.auto.create.topics",
        "topics are created by Plumber (internal ones) or by their owners (sources and sinks), never by a client",
    ),
    (
        "auto.offset.reset",
        "the cutover sets every group's offsets explicitly; a step's `startFrom` chooses where a new step starts",
    ),
];

/// Settings that weaken the delivery promise (SPEC §4): refused for everyone, with what to do
/// instead.
const DELIVERY: &[(&str, &str)] = &[
    (
        "acks",
        "a send counts as delivered only once every in-sync replica has it (`acks=all`); fewer acknowledgements let a broker failure lose records Plumber counted as delivered. Set `min.insync.replicas` on the topics (`defaults.topicConfig`) to choose durability",
    ),
    (
        "request.required.acks",
        "a send counts as delivered only once every in-sync replica has it (`acks=all`); fewer acknowledgements let a broker failure lose records Plumber counted as delivered. Set `min.insync.replicas` on the topics (`defaults.topicConfig`) to choose durability",
    ),
    (
        "enable.idempotence",
        "Plumber chooses idempotence with the delivery mode (exactly-once where the brokers have transactions)",
    ),
    (
        "max.in.flight.requests.per.connection",
        "at-least-once processors keep one request in flight so that retries never reorder a partition",
    ),
    (
        "max.in.flight",
        "at-least-once processors keep one request in flight so that retries never reorder a partition",
    ),
    (
        "enable.gapless.guarantee",
        "Plumber chooses the producer's guarantees with the delivery mode",
    ),
    (
        "retries",
        "Plumber decides how sends are retried; a record that cannot be sent stops its processor before its offset is committed",
    ),
    (
        "message.send.max.retries",
        "Plumber decides how sends are retried; a record that cannot be sent stops its processor before its offset is committed",
    ),
    (
        "transaction.timeout.ms",
        "it follows the processor's commit interval",
    ),
    (
        "isolation.level",
        "processors read committed records only (`read_committed`): an aborted transaction's records must never be processed",
    ),
    (
        "enable.auto.commit",
        "a processor commits an offset only once its record was produced or dead-lettered",
    ),
    (
        "enable.auto.offset.store",
        "a processor commits an offset only once its record was produced or dead-lettered",
    ),
    (
        "auto.commit.interval.ms",
        "a processor commits an offset only once its record was produced or dead-lettered",
    ),
    (
        "enable.partition.eof",
        "processors and the cutover's drain checks read partition ends themselves",
    ),
    (
        "enable.ssl.certificate.verification",
        "brokers' certificates are always verified; give the CA as `ca.crt` in the cluster's credentials instead",
    ),
    (
        "ssl.endpoint.identification.algorithm",
        "brokers' host names are always checked against their certificates (`https`); give the CA as `ca.crt` in the cluster's credentials instead",
    ),
];

/// Settings that run code or load files into the daemon and every processor.
const CODE: &[&str] = &[
    "plugin.library.paths",
    "sasl.kerberos.kinit.cmd",
    "ssl.engine.id",
    "ssl_engine_id",
    "ssl.providers",
    "ssl.engine.location",
    "interceptors",
];

/// Whether `key` is a credential: a secret value, or a file only the runtime can provide.
pub fn is_credential(key: &str) -> bool {
    key.contains("password")
        || key.contains("secret")
        || key.starts_with("sasl.oauthbearer.")
        || key.starts_with("sasl.kerberos.")
        || key == "sasl.username"
        || key == "sasl.jaas.config"
        || key.ends_with(".pem")
        || key.ends_with(".location")
}

/// What is wrong with setting `key` to `value`, from `origin`; `None`: it may.
pub fn problem(key: &str, value: &str, origin: Origin) -> Option<String> {
    if is_credential(key) {
        return Some(format!(
            "`{key}` is a credential and never lives in Git or a ConfigMap: put it in the \
             Secret named by the cluster's `credentials` (locally: a file `{key}` in the \
             directory of `plumber up --kafka-credentials`)"
        ));
    }
    if CODE.contains(&key) {
        return Some(format!(
            "`{key}` would make every client of the cluster (the daemon's too) load or run code; \
             Plumber does not pass it on"
        ));
    }
    if key == "ssl.endpoint.identification.algorithm" && value.eq_ignore_ascii_case("https") {
        return None;
    }
    if key == "security.protocol" {
        let known = ["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"];
        return (!known.iter().any(|p| value.eq_ignore_ascii_case(p))).then(|| {
            format!(
                "`security.protocol: {value}` is not one of {}",
                known.join(", ")
            )
        });
    }
    if let Some((_, why)) = DELIVERY.iter().find(|(k, _)| *k == key) {
        return Some(format!(
            "`{key}` weakens the delivery promise and is Plumber's to set: {why}"
        ));
    }
    if let Some((_, why)) = PLUMBER_S.iter().find(|(k, _)| *k == key) {
        return Some(format!(
            "`{key}` is set by Plumber itself ({why}); remove it from `properties`"
        ));
    }
    match origin {
        Origin::Operator => None,
        Origin::Repository if ALLOWED.contains(&key) => None,
        Origin::Repository => Some(format!(
            "`{key}` is not a property `plumber.yaml` may set: Git may tune connections, \
             security protocol, batching and fetching (docs/security.md, \"Cluster properties and credentials\"); a \
             setting the operator needs belongs in the daemon's configuration \
             (`kafka.clusters.<name>.properties`)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_weakens_delivery_or_tls_is_refused_from_anyone() {
        for (key, value) in [
            ("acks", "0"),
            ("acks", "1"),
            ("request.required.acks", "1"),
            ("enable.idempotence", "false"),
            ("isolation.level", "read_uncommitted"),
            ("enable.auto.commit", "true"),
            ("enable.ssl.certificate.verification", "false"),
            ("ssl.endpoint.identification.algorithm", "none"),
            ("max.in.flight.requests.per.connection", "5"),
        ] {
            for origin in [Origin::Repository, Origin::Operator] {
                let problem = problem(key, value, origin);
                assert!(
                    problem
                        .as_deref()
                        .is_some_and(|p| p.contains("delivery promise")),
                    "{key}: {value} from {origin:?}: {problem:?}"
                );
            }
        }
    }

    #[test]
    fn code_and_credentials_are_refused_and_tuning_is_not() {
        for key in [
            "plugin.library.paths",
            "sasl.kerberos.kinit.cmd",
            "sasl.oauthbearer.token.endpoint.url",
            "sasl.password",
            "ssl.key.location",
        ] {
            assert!(problem(key, "x", Origin::Operator).is_some(), "{key}");
            assert!(problem(key, "x", Origin::Repository).is_some(), "{key}");
        }
        for (key, value) in [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("ssl.endpoint.identification.algorithm", "https"),
            ("linger.ms", "20"),
            ("compression.type", "zstd"),
        ] {
            assert_eq!(problem(key, value, Origin::Repository), None, "{key}");
        }
        assert!(problem("security.protocol", "bogus", Origin::Repository).is_some());
        // What Git may not tune, the operator may.
        assert!(problem("statistics.interval.ms", "1000", Origin::Repository).is_some());
        assert_eq!(
            problem("statistics.interval.ms", "1000", Origin::Operator),
            None
        );
    }
}
