//! Name rules: topology and step names become parts of Kubernetes object names, labels and
//! Kafka topic names, so they are checked before anything is built from them.

/// Topology and step names are at most this long so that
/// `plumber.<topology>.<step>.<id12>` and Kubernetes label values stay within limits.
pub const MAX_NAME_LEN: usize = 40;

/// Why `name` is not a DNS-1123 label of at most [`MAX_NAME_LEN`] characters, if it is not.
pub fn dns_label_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the name is empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!(
            "`{name}` is {} characters long; names are at most {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        let hint = if bad.is_ascii_uppercase() || bad == '_' || bad == '.' {
            format!(" (try `{}`)", suggest_label(name))
        } else {
            String::new()
        };
        return Some(format!(
            "`{name}` contains `{bad}`; names use lowercase letters, digits and `-`{hint}"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Some(format!(
            "`{name}` must start and end with a letter or digit"
        ));
    }
    None
}

fn suggest_label(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '_' | '.' | ' ' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect::<String>()
        .trim_matches('-')
        .to_owned()
}

/// Why `topic` is not a legal Kafka topic name for a user topic, if it is not.
pub fn topic_problem(topic: &str) -> Option<String> {
    if topic.is_empty() || topic.len() > 249 {
        return Some(format!(
            "topic names have 1 to 249 characters, `{topic}` has {}",
            topic.len()
        ));
    }
    if topic == "." || topic == ".." {
        return Some(format!("`{topic}` is not a legal Kafka topic name"));
    }
    if let Some(bad) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "topic `{topic}` contains `{bad}`; Kafka topic names use letters, digits, `.`, `_` and `-`"
        ));
    }
    if topic.starts_with("plumber.") {
        return Some(format!(
            "topic `{topic}` is in the `plumber.` namespace, which holds Plumber's internal topics"
        ));
    }
    None
}

/// Environment variables of steps may not start with this: `plumber-processor` reads its own
/// settings (delivery, group, topics, …) from `PLUMBER_*` variables, so a step's `env` could
/// silently reconfigure it.
pub const RESERVED_ENV_PREFIX: &str = "PLUMBER_";

/// Environment variable names as Kubernetes and POSIX shells accept them, outside the
/// [`RESERVED_ENV_PREFIX`].
pub fn env_name_problem(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !(first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')) {
        return Some(format!(
            "`{name}` is not an environment variable name (letters, digits and `_`, not starting with a digit)"
        ));
    }
    if name.starts_with(RESERVED_ENV_PREFIX) {
        return Some(format!(
            "`{name}` is reserved: names starting with `{RESERVED_ENV_PREFIX}` are plumber-processor's own settings, \
             which the daemon sets; rename the variable"
        ));
    }
    None
}

/// Kubernetes Secret names (DNS-1123 subdomains): `secretKeyRef.name`, `credentials.secret`.
pub fn secret_name_problem(name: &str) -> Option<String> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    (!valid).then(|| {
        format!(
            "`{name}` is not a Secret name (lowercase letters, digits, `-` and `.`, at most 253 \
             characters, starting and ending with a letter or digit)"
        )
    })
}

/// Keys of a Secret's data (`secretKeyRef.key`); locally also a file name, so never a path.
pub fn secret_key_problem(key: &str) -> Option<String> {
    let valid = !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (!valid).then(|| {
        format!("`{key}` is not a Secret key (letters, digits, `-`, `_` and `.`, not `.` or `..`)")
    })
}

/// Kubernetes quantities as `resources` takes them: a decimal number with an optional
/// suffix (`500m`, `0.5`, `256Mi`, `1G`).
pub fn quantity_problem(quantity: &str) -> Option<String> {
    const SUFFIXES: [&str; 14] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let digits_end = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(digits_end);
    let number_ok = !number.is_empty()
        && number.matches('.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    (!(number_ok && SUFFIXES.contains(&suffix))).then(|| {
        format!(
            "`{quantity}` is not a Kubernetes quantity (a number with an optional suffix, \
             e.g. `500m` CPU or `256Mi` memory)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "clicks", "fast-only", "a1", &"x".repeat(40)] {
            assert_eq!(dns_label_problem(ok), None, "{ok}");
        }
        for bad in ["", "-a", "a-", "Fast", "a_b", "a.b", "ä", &"x".repeat(41)] {
            assert!(dns_label_problem(bad).is_some(), "{bad}");
        }
        let msg = dns_label_problem("Fast_Only").unwrap();
        assert!(msg.contains("try `fast-only`"), "{msg}");
    }

    #[test]
    fn topics() {
        for ok in ["clicks.raw", "a_b-c", "X"] {
            assert_eq!(topic_problem(ok), None, "{ok}");
        }
        for bad in ["", ".", "..", "a b", "a/b", "plumber.x", &"t".repeat(250)] {
            assert!(topic_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn secret_names_keys_and_quantities() {
        assert_eq!(secret_name_problem("kafka-user"), None);
        assert_eq!(secret_name_problem("a.b-1"), None);
        for bad in ["", "Kafka", "a_b", "-a", "a..b", "a."] {
            assert!(secret_name_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(secret_key_problem("api-key"), None);
        assert_eq!(secret_key_problem("tls.crt"), None);
        for bad in ["", ".", "..", "a/b", "a b"] {
            assert!(secret_key_problem(bad).is_some(), "{bad}");
        }
        for ok in ["500m", "1", "0.5", "256Mi", "1G", "2Gi"] {
            assert_eq!(quantity_problem(ok), None, "{ok}");
        }
        for bad in ["", "m", "1.2.3", "256MB", "-1", "1 Gi", "lots"] {
            assert!(quantity_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name_problem("MODEL_V2"), None);
        assert!(env_name_problem("2X").is_some());
        assert!(env_name_problem("A-B").is_some());
        assert!(env_name_problem("").is_some());
        let reserved = env_name_problem("PLUMBER_DELIVERY").unwrap();
        assert!(reserved.contains("reserved"), "{reserved}");
        // Only the exact prefix: the processor reads exactly these names.
        assert_eq!(env_name_problem("PLUMBERS"), None);
        assert_eq!(env_name_problem("plumber_delivery"), None);
    }
}
