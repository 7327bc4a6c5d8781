//! Step identities (SPEC §4): a SHA-256 over everything that decides what a running step does
//! and where its records go, and over nothing else.
//!
//! A processor's identity covers its transform, env and partitions; its inputs (a source by
//! cluster and topic, a processor by step name and identity, since the name is part of the
//! topic it reads); the sorted set of sink topics it writes; and whether it feeds any processor
//! (whether it has an internal topic). `scale`, `startFrom`, `description`, `owner` and the
//! file's path are not part of it, and input order does not matter. Because an input's identity
//! is part of its consumer's, changing a step changes the identity of everything downstream:
//! the whole subtree is cut over.
//!
//! The encoding is explicit (tag, length, bytes) instead of a serialiser's output, so it can
//! only change when this file does. Bump `VERSION` if it ever must.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::spec::{EnvValue, Transform};

const VERSION: &[u8] = b"plumber-identity-v1";

/// Hex digits of an identity used in topic and group names.
pub const SHORT_LEN: usize = 12;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Identity([u8; 32]);

impl Identity {
    /// The first [`SHORT_LEN`] hex digits.
    pub fn short(&self) -> String {
        self.hex()[..SHORT_LEN].to_owned()
    }

    /// All 64 hex digits, without the formatting machinery: every plan, status and API answer
    /// names every processor by it (`write!` per byte made a large plan's JSON several times
    /// slower).
    fn hex(&self) -> HexDigits {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; 64];
        for (i, byte) in self.0.iter().enumerate() {
            digits[2 * i] = DIGITS[usize::from(byte >> 4)];
            digits[2 * i + 1] = DIGITS[usize::from(byte & 15)];
        }
        HexDigits(digits)
    }
}

/// An identity's hex digits, on the stack.
struct HexDigits([u8; 64]);

impl std::ops::Deref for HexDigits {
    type Target = str;
    fn deref(&self) -> &str {
        // Only ASCII digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.short())
    }
}

impl Serialize for Identity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.hex())
    }
}

impl std::str::FromStr for Identity {
    type Err = String;

    /// Parses the 64 hex digits [`Display`](fmt::Display) writes.
    fn from_str(hex: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("`{hex}` is not an identity (64 hex digits)");
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(invalid());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| invalid())?;
        }
        Ok(Identity(bytes))
    }
}

impl<'de> Deserialize<'de> for Identity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let hex = String::deserialize(deserializer)?;
        hex.parse().map_err(serde::de::Error::custom)
    }
}

/// How a processor's input enters its identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum InputRef<'a> {
    Source(Identity),
    Processor { name: &'a str, identity: Identity },
}

/// Length-prefixed fields, so no two different definitions encode alike.
struct Canonical(Sha256);

impl Canonical {
    fn new(kind: &str) -> Self {
        let mut hasher = Canonical(Sha256::new());
        hasher.bytes(VERSION);
        hasher.bytes(kind.as_bytes());
        hasher
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn count(&mut self, n: usize) {
        self.0.update((n as u64).to_le_bytes());
    }

    fn inputs(&mut self, inputs: &[InputRef]) {
        let mut sorted = inputs.to_vec();
        sorted.sort();
        sorted.dedup();
        self.count(sorted.len());
        for input in &sorted {
            match input {
                InputRef::Source(identity) => {
                    self.str("source");
                    self.bytes(&identity.0);
                }
                InputRef::Processor { name, identity } => {
                    self.str("processor");
                    self.str(name);
                    self.bytes(&identity.0);
                }
            }
        }
    }

    fn finish(self) -> Identity {
        Identity(self.0.finalize().into())
    }
}

pub fn source(cluster: &str, topic: &str) -> Identity {
    let mut c = Canonical::new("source");
    c.str(cluster);
    c.str(topic);
    c.finish()
}

pub fn sink(cluster: &str, topic: &str, inputs: &[InputRef]) -> Identity {
    let mut c = Canonical::new("sink");
    c.str(cluster);
    c.str(topic);
    c.inputs(inputs);
    c.finish()
}

pub struct ProcessorParts<'a> {
    pub transform: &'a Transform,
    pub env: &'a BTreeMap<String, EnvValue>,
    pub partitions: u32,
    pub inputs: &'a [InputRef<'a>],
    /// (cluster, topic) of each sink this processor feeds.
    pub sinks: &'a [(&'a str, &'a str)],
    pub feeds_processor: bool,
}

pub fn processor(parts: &ProcessorParts) -> Identity {
    let mut c = Canonical::new("processor");
    match parts.transform {
        Transform::Jq { program } => {
            c.str("jq");
            c.str(program);
        }
        Transform::Sql {
            query,
            state,
            table,
        } => {
            c.str("sql");
            c.str(query);
            // The table's step is in the query; its bound is not.
            if let Some(table) = table {
                c.str("table");
                c.count(
                    table
                        .max_bytes
                        .map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX)),
                );
            }
            // Nothing for a stateless query: identities computed before state existed hold.
            if let Some(state) = state {
                c.str("state");
                c.count(usize::try_from(state.grace_ms).unwrap_or(usize::MAX));
                c.str(state.emit.as_str());
                c.count(
                    state
                        .max_groups
                        .map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX)),
                );
                c.str(match state.start {
                    None => "",
                    Some(crate::spec::StateStart::Empty) => "empty",
                    Some(crate::spec::StateStart::Earliest) => "earliest",
                });
            }
        }
        Transform::Exec { command, image } => {
            c.str("exec");
            c.count(command.len());
            command.iter().for_each(|arg| c.str(arg));
            c.str(image.as_deref().unwrap_or(""));
        }
        Transform::Http {
            image,
            port,
            path,
            command,
        } => {
            c.str("http");
            c.str(image);
            c.count(usize::from(*port));
            c.str(path);
            let command = command.as_deref().unwrap_or_default();
            c.count(command.len());
            command.iter().for_each(|arg| c.str(arg));
        }
    }
    c.count(parts.env.len());
    for (name, value) in parts.env {
        c.str(name);
        match value {
            EnvValue::Value(value) => c.str(value),
            EnvValue::Secret { secret_key_ref } => {
                // A length no string has: plain values (and so every identity computed
                // before secrets existed) encode as they always did.
                c.count(usize::MAX);
                c.str(&secret_key_ref.name);
                c.str(&secret_key_ref.key);
            }
        }
    }
    c.count(parts.partitions as usize);
    c.inputs(parts.inputs);
    let mut sinks = parts.sinks.to_vec();
    sinks.sort();
    sinks.dedup();
    c.count(sinks.len());
    for (cluster, topic) in sinks {
        c.str(cluster);
        c.str(topic);
    }
    c.count(usize::from(parts.feeds_processor));
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jq(program: &str) -> Transform {
        Transform::Jq {
            program: program.into(),
        }
    }

    fn parts<'a>(
        transform: &'a Transform,
        env: &'a BTreeMap<String, EnvValue>,
        inputs: &'a [InputRef<'a>],
        sinks: &'a [(&'a str, &'a str)],
    ) -> ProcessorParts<'a> {
        ProcessorParts {
            transform,
            env,
            partitions: 6,
            inputs,
            sinks,
            feeds_processor: true,
        }
    }

    #[test]
    fn identities_are_64_hex_digits_and_short_is_a_prefix() {
        let id = source("default", "clicks");
        let hex = id.to_string();
        assert_eq!(hex.len(), 64);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(hex.starts_with(&id.short()));
        assert_eq!(id.short().len(), SHORT_LEN);
        let byte_by_byte: String = id.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, byte_by_byte);
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{hex}\""));
        assert_eq!(hex.parse::<Identity>(), Ok(id));
    }

    #[test]
    fn order_of_inputs_and_sinks_does_not_matter() {
        let t = jq(".");
        let env = BTreeMap::new();
        let a = InputRef::Source(source("default", "a"));
        let b = InputRef::Processor {
            name: "b",
            identity: source("default", "b"),
        };
        let one = processor(&parts(
            &t,
            &env,
            &[a.clone(), b.clone()],
            &[("d", "x"), ("d", "y")],
        ));
        let two = processor(&parts(&t, &env, &[b, a], &[("d", "y"), ("d", "x")]));
        assert_eq!(one, two);
    }

    #[test]
    fn every_defining_part_changes_the_identity() {
        let env = BTreeMap::new();
        let env2 = BTreeMap::from([("A".to_owned(), EnvValue::Value("1".to_owned()))]);
        let secret = |name: &str, key: &str| EnvValue::Secret {
            secret_key_ref: crate::spec::SecretRef {
                name: name.into(),
                key: key.into(),
            },
        };
        let env3 = BTreeMap::from([("A".to_owned(), secret("s", "k"))]);
        let env4 = BTreeMap::from([("A".to_owned(), secret("s", "k2"))]);
        // Not the same as a plain value that happens to spell the reference.
        let env5 = BTreeMap::from([("A".to_owned(), EnvValue::Value("sk".to_owned()))]);
        let t = jq(".");
        let t2 = jq(". ");
        let input = [InputRef::Source(source("default", "a"))];
        let other_input = [InputRef::Source(source("default", "b"))];
        let base = processor(&parts(&t, &env, &input, &[]));
        let variants = [
            processor(&parts(&t2, &env, &input, &[])),
            processor(&parts(&t, &env2, &input, &[])),
            processor(&parts(&t, &env3, &input, &[])),
            processor(&parts(&t, &env4, &input, &[])),
            processor(&parts(&t, &env5, &input, &[])),
            processor(&parts(&t, &env, &other_input, &[])),
            processor(&parts(&t, &env, &input, &[("default", "out")])),
            processor(&ProcessorParts {
                partitions: 7,
                ..parts(&t, &env, &input, &[])
            }),
            processor(&ProcessorParts {
                feeds_processor: false,
                ..parts(&t, &env, &input, &[])
            }),
        ];
        for (i, variant) in variants.iter().enumerate() {
            assert_ne!(base, *variant, "variant {i}");
        }
    }

    #[test]
    fn field_boundaries_are_unambiguous() {
        assert_ne!(source("ab", "c"), source("a", "bc"));
    }
}
