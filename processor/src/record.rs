//! Records as transforms see them, the JSON envelope of the exec and http protocols, and the
//! headers of dead-lettered records (SPEC §8).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// One consumed record, borrowed from the consumer's buffer.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

impl<'a> Input<'a> {
    /// A record known only by where it is: the dead letter of a record that could not be
    /// read again.
    pub fn reference(topic: &'a str, partition: i32, offset: i64) -> Self {
        Input {
            topic,
            partition,
            offset,
            timestamp: None,
            key: None,
            value: None,
            headers: Vec::new(),
        }
    }
}

/// One record a transform produced for an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// `None`: keep the input's key.
    pub key: Option<Option<Vec<u8>>>,
    pub value: Vec<u8>,
    /// `None`: keep the input's headers.
    pub headers: Option<Vec<(String, Vec<u8>)>>,
    /// ms since the epoch; `None`: the producer's clock (a window's result carries its
    /// window's last instant instead).
    pub timestamp: Option<i64>,
}

impl Output {
    /// An output with the input's key and headers.
    pub fn value(value: Vec<u8>) -> Self {
        Output {
            key: None,
            value,
            headers: None,
            timestamp: None,
        }
    }
}

/// Why a record could not be handled; it goes to the dead-letter topic with this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// A short stable label (`invalid-json`, `jq-error`, `exec-error`, `http-status`, …), used
    /// as the `plumber.error.kind` header and the metric label.
    pub kind: &'static str,
    pub message: String,
}

/// Error messages (the `plumber.error` header, log lines) are cut to this many bytes: a
/// program can raise an error of any size, and a header of megabytes would make the
/// dead-letter copy too large for the broker.
pub const MAX_MESSAGE: usize = 4096;

impl Rejection {
    /// A rejection whose message is cut to [`MAX_MESSAGE`] bytes, with a marker.
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            kind,
            message: bounded(message.into()),
        }
    }
}

/// `message` cut to [`MAX_MESSAGE`] bytes (at a character boundary), saying how much was cut.
pub fn bounded(mut message: String) -> String {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let mut cut = MAX_MESSAGE;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = message.len() - cut;
    message.truncate(cut);
    message.push_str(&format!("… ({dropped} more bytes cut)"));
    message
}

/// `value` displayed, cut to [`MAX_MESSAGE`] bytes. Formatting stops there, so a value nested
/// a million levels deep costs no more stack than [`MAX_MESSAGE`] levels.
pub fn display_bounded(value: &dyn std::fmt::Display) -> String {
    struct Bounded(String);
    impl std::fmt::Write for Bounded {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            let room = MAX_MESSAGE - self.0.len();
            if text.len() <= room {
                self.0.push_str(text);
                return Ok(());
            }
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.0.push_str(&text[..cut]);
            Err(std::fmt::Error)
        }
    }
    let mut out = Bounded(String::new());
    if std::fmt::write(&mut out, format_args!("{value}")).is_err() {
        out.0.push_str("… (cut)");
    }
    out.0
}

/// An upper bound of the size librdkafka checks against `message.max.bytes` before it
/// queues a record (`rd_kafka_msg_new0`): the worst-case overhead of a v2 record, its key
/// and value, and its headers with their two length varints each.
pub fn wire_size<'h>(
    key: usize,
    value: usize,
    headers: impl Iterator<Item = (&'h str, usize)>,
) -> usize {
    const RECORD_OVERHEAD: usize = 36;
    const HEADER_OVERHEAD: usize = 20;
    RECORD_OVERHEAD
        + key
        + value
        + headers
            .map(|(name, value)| HEADER_OVERHEAD + name.len() + value)
            .sum::<usize>()
}

/// The JSON object the exec and http protocols send for each input record.
#[derive(Serialize)]
pub struct Envelope<'a> {
    /// The exec protocol's answer names it (a number that never repeats within a process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    pub key: Option<&'a str>,
    pub headers: BTreeMap<&'a str, &'a str>,
    pub value: &'a RawValue,
}

const NULL: &str = "null";

impl<'a> Envelope<'a> {
    /// The envelope of `input`, or why it cannot be expressed: a value that is not JSON, a key
    /// or header that is not UTF-8. A missing value (a tombstone) is `null`.
    pub fn of(input: &Input<'a>) -> Result<Self, Rejection> {
        let value = json_value(input.value)?;
        let key = input
            .key
            .map(|key| {
                std::str::from_utf8(key)
                    .map_err(|_| Rejection::new("invalid-key", "the record key is not UTF-8"))
            })
            .transpose()?;
        let mut headers = BTreeMap::new();
        for (name, value) in &input.headers {
            let value = std::str::from_utf8(value.unwrap_or_default()).map_err(|_| {
                Rejection::new(
                    "invalid-header",
                    format!("the value of header `{name}` is not UTF-8"),
                )
            })?;
            headers.insert(*name, value);
        }
        Ok(Envelope {
            id: None,
            topic: input.topic,
            partition: input.partition,
            offset: input.offset,
            timestamp: input.timestamp,
            key,
            headers,
            value,
        })
    }

    pub fn to_json(&self) -> Vec<u8> {
        // Serialising borrowed strings and a pre-validated raw value cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The record value as validated JSON; a tombstone is `null`.
pub fn json_value(value: Option<&[u8]>) -> Result<&RawValue, Rejection> {
    let Some(bytes) = value else {
        return raw_null();
    };
    serde_json::from_slice::<&RawValue>(bytes)
        .map_err(|e| Rejection::new("invalid-json", format!("the record value is not JSON: {e}")))
}

fn raw_null() -> Result<&'static RawValue, Rejection> {
    serde_json::from_str::<&RawValue>(NULL).map_err(|e| Rejection::new("internal", e.to_string()))
}

/// One output object of the exec and http protocols:
/// `{"value": …}` with optional `"key"` (string or null) and `"headers"` (object of strings);
/// or `{"error": "why"}` to dead-letter the input.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireOutput {
    #[serde(default)]
    value: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    key: Option<Option<String>>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    error: Option<String>,
}

/// Distinguishes a missing field (outer `None`) from an explicit `null` (inner `None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

impl WireOutput {
    /// The output record, or the rejection the transform asked for.
    pub fn into_output(self, kind: &'static str) -> Result<Output, Rejection> {
        if let Some(message) = self.error {
            return Err(Rejection::new(kind, message));
        }
        let Some(value) = self.value else {
            return Err(Rejection::new(
                "protocol",
                "an output object needs a \"value\" (or an \"error\")",
            ));
        };
        Ok(Output {
            key: self.key.map(|key| key.map(String::into_bytes)),
            value: value.get().as_bytes().to_vec(),
            headers: self.headers.map(|headers| {
                headers
                    .into_iter()
                    .map(|(name, value)| (name, value.into_bytes()))
                    .collect()
            }),
            timestamp: None,
        })
    }
}

/// The exec protocol's answer line: `{"id": N, "outputs": [output objects…]}`, or
/// `{"id": N, "error": "why"}` to dead-letter the input.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecAnswer {
    pub id: u64,
    #[serde(default)]
    outputs: Option<Vec<WireOutput>>,
    #[serde(default)]
    error: Option<String>,
}

impl ExecAnswer {
    /// The outputs, or the rejection the child asked for or the mistake it made.
    pub fn into_outputs(self) -> Result<Vec<Output>, Rejection> {
        match (self.outputs, self.error) {
            (None, Some(message)) => Err(Rejection::new("exec-error", message)),
            (Some(outputs), None) => outputs
                .into_iter()
                .map(|output| output.into_output("exec-error"))
                .collect(),
            _ => Err(Rejection::new(
                "protocol",
                "an answer needs exactly one of \"outputs\" (an array, [] to filter) and \"error\"",
            )),
        }
    }
}

/// Parses one output object of the wire protocols.
pub fn parse_wire_output(json: &[u8], kind: &'static str) -> Result<Output, Rejection> {
    serde_json::from_slice::<WireOutput>(json)
        .map_err(|e| Rejection::new("protocol", format!("invalid output object: {e}")))?
        .into_output(kind)
}

/// Header names of a dead-lettered record, added to the record's own headers.
pub mod dlq_header {
    pub const ERROR: &str = "plumber.error";
    pub const ERROR_KIND: &str = "plumber.error.kind";
    pub const SOURCE_TOPIC: &str = "plumber.source.topic";
    pub const SOURCE_PARTITION: &str = "plumber.source.partition";
    pub const SOURCE_OFFSET: &str = "plumber.source.offset";
    pub const GROUP: &str = "plumber.group";
    /// Present when the copy carries no value (nor key and headers, if those were too large):
    /// why, and where the original is.
    pub const OMITTED: &str = "plumber.value.omitted";
}

/// The headers a dead-lettered copy of `input` carries after the input's own.
pub fn dead_letter_headers(
    input: &Input<'_>,
    rejection: &Rejection,
    group: &str,
) -> Vec<(&'static str, String)> {
    vec![
        (dlq_header::ERROR, rejection.message.clone()),
        (dlq_header::ERROR_KIND, rejection.kind.to_owned()),
        (dlq_header::SOURCE_TOPIC, input.topic.to_owned()),
        (dlq_header::SOURCE_PARTITION, input.partition.to_string()),
        (dlq_header::SOURCE_OFFSET, input.offset.to_string()),
        (dlq_header::GROUP, group.to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(value: Option<&'a [u8]>, key: Option<&'a [u8]>) -> Input<'a> {
        Input {
            topic: "t",
            partition: 2,
            offset: 7,
            timestamp: Some(5),
            key,
            value,
            headers: vec![("h", Some(b"v"))],
        }
    }

    #[test]
    fn envelope_carries_the_value_verbatim() {
        let input = input(Some(br#"{"a": [1, 2.50]}"#), Some(b"k"));
        let json = Envelope::of(&input).unwrap().to_json();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"topic":"t","partition":2,"offset":7,"timestamp":5,"key":"k","headers":{"h":"v"},"value":{"a": [1, 2.50]}}"#
        );
    }

    #[test]
    fn tombstones_are_null_and_bad_values_are_rejected() {
        let envelope = Envelope::of(&input(None, None)).unwrap();
        assert_eq!(envelope.value.get(), "null");
        assert_eq!(envelope.key, None);
        let bad = Envelope::of(&input(Some(b"{nope"), None)).err().unwrap();
        assert_eq!(bad.kind, "invalid-json");
        let bad_key = Envelope::of(&input(Some(b"1"), Some(&[0xff])))
            .err()
            .unwrap();
        assert_eq!(bad_key.kind, "invalid-key");
    }

    #[test]
    fn wire_outputs_keep_or_replace_key_and_headers() {
        let kept = parse_wire_output(br#"{"value": {"x": 1}}"#, "exec-error").unwrap();
        assert_eq!(kept, Output::value(br#"{"x": 1}"#.to_vec()));
        let cleared =
            parse_wire_output(br#"{"value": 1, "key": null, "headers": {}}"#, "e").unwrap();
        assert_eq!(cleared.key, Some(None));
        assert_eq!(cleared.headers, Some(vec![]));
        let keyed = parse_wire_output(br#"{"value": 1, "key": "k2"}"#, "e").unwrap();
        assert_eq!(keyed.key, Some(Some(b"k2".to_vec())));
    }

    #[test]
    fn messages_are_cut_at_a_character_with_a_marker() {
        assert_eq!(bounded("short".into()), "short");
        let long = "é".repeat(MAX_MESSAGE);
        let cut = bounded(long.clone());
        assert!(cut.len() < MAX_MESSAGE + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("… ({} more bytes cut)", long.len() - MAX_MESSAGE)));
        let value = "x".repeat(10 * MAX_MESSAGE);
        let shown = display_bounded(&value);
        assert_eq!(shown.len(), MAX_MESSAGE + "… (cut)".len());
        assert_eq!(display_bounded(&"fits"), "fits");
        assert_eq!(Rejection::new("k", long).message, cut);
    }

    /// The estimate never lets through what librdkafka refuses as too large.
    #[test]
    fn wire_size_is_at_least_what_librdkafka_checks() {
        use rdkafka::message::{Header, OwnedHeaders};
        use rdkafka::producer::{BaseProducer, BaseRecord};
        const LIMIT: usize = 2000;
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.max.bytes", LIMIT.to_string())
            .create()
            .unwrap();
        let mut refusals = 0;
        for (key, header) in [(0, 0), (7, 0), (3, 100), (0, 1500)] {
            for value in LIMIT - 200..LIMIT + 10 {
                let (k, v, h) = (vec![b'k'; key], vec![b'v'; value], vec![b'h'; header]);
                let mut record = BaseRecord::<[u8], [u8]>::to("t").payload(&v[..]);
                if key > 0 {
                    record = record.key(&k[..]);
                }
                if header > 0 {
                    record = record.headers(OwnedHeaders::new().insert(Header {
                        key: "name",
                        value: Some(&h[..]),
                    }));
                }
                let headers = (header > 0).then_some(("name", header));
                let estimate = wire_size(key, value, headers.into_iter());
                let refused = producer.send(record).is_err();
                assert!(
                    !(refused && estimate <= LIMIT),
                    "librdkafka refused {key}+{value}+{header} bytes, estimated {estimate}"
                );
                refusals += usize::from(refused);
            }
        }
        assert!(refusals > 0, "the sizes straddle librdkafka's limit");
    }

    #[test]
    fn exec_answers_name_their_record_and_hold_outputs_or_an_error() {
        let parse = |text: &str| serde_json::from_str::<ExecAnswer>(text);
        let answer =
            parse(r#"{"id": 7, "outputs": [{"value": 1}, {"value": 2, "key": null}]}"#).unwrap();
        assert_eq!(answer.id, 7);
        assert_eq!(answer.into_outputs().unwrap().len(), 2);
        let filtered = parse(r#"{"id": 8, "outputs": []}"#).unwrap();
        assert!(filtered.into_outputs().unwrap().is_empty());
        let asked = parse(r#"{"id": 9, "error": "no page"}"#).unwrap();
        assert_eq!(
            asked.into_outputs(),
            Err(Rejection::new("exec-error", "no page"))
        );
        let inner = parse(r#"{"id": 9, "outputs": [{"error": "no page"}]}"#).unwrap();
        assert_eq!(inner.into_outputs().unwrap_err().kind, "exec-error");
        let both = parse(r#"{"id": 9, "outputs": [], "error": "x"}"#).unwrap();
        assert_eq!(both.into_outputs().unwrap_err().kind, "protocol");
        let neither = parse(r#"{"id": 9}"#).unwrap();
        assert_eq!(neither.into_outputs().unwrap_err().kind, "protocol");
        assert!(parse(r#"{"outputs": []}"#).is_err(), "the id is required");
        assert!(
            parse(r#"{"value": 1}"#).is_err(),
            "the old protocol's lines are not answers"
        );
    }

    #[test]
    fn wire_errors_and_mistakes_are_rejections() {
        let asked = parse_wire_output(br#"{"error": "no speed"}"#, "exec-error").unwrap_err();
        assert_eq!(asked, Rejection::new("exec-error", "no speed"));
        let typo = parse_wire_output(br#"{"valeu": 1}"#, "e").unwrap_err();
        assert_eq!(typo.kind, "protocol");
        assert!(typo.message.contains("valeu"), "{}", typo.message);
        assert_eq!(parse_wire_output(b"{}", "e").unwrap_err().kind, "protocol");
    }
}
