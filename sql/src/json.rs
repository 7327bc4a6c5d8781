//! The record's JSON, read only as deep as the query looks: an object is split into its
//! fields, each kept as the raw text it was written as, so fields the query does not touch
//! are never converted and `SELECT *` or a projected field copies them verbatim.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::Deserializer;
use serde::de::{self, MapAccess, Visitor};
use serde_json::value::RawValue;

/// Objects with more fields than this find duplicate keys through a hash map.
const LINEAR_DEDUP: usize = 32;

/// The fields of a JSON object in their order. A key written twice keeps its first
/// position and its last value, as JSON readers that keep the last value do.
#[derive(Debug, Default)]
pub struct Object<'a> {
    pub fields: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> Object<'a> {
    /// `Ok(None)` when the text is valid JSON but not an object.
    pub fn parse(text: &'a str) -> Result<Option<Object<'a>>, serde_json::Error> {
        if !text.trim_start().starts_with('{') {
            // Still validated: the caller rejects what is not JSON at all.
            serde_json::from_str::<&RawValue>(text)?;
            return Ok(None);
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let object = de.deserialize_map(ObjectVisitor)?;
        de.end()?;
        Ok(Some(object))
    }

    pub fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.fields
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
    }
}

/// The value at `path` inside a JSON text: `None` when a step of the path is missing or is
/// not an object.
pub fn lookup<'a>(mut value: &'a RawValue, path: &[String]) -> Option<&'a RawValue> {
    for name in path {
        let object = Object::parse(value.get()).ok()??;
        value = object.get(name)?;
    }
    Some(value)
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Object<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<'de>, A::Error> {
        let mut fields: Vec<(Cow<'de, str>, &'de RawValue)> = Vec::new();
        let mut index: Option<HashMap<String, usize>> = None;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value: &'de RawValue = map.next_value()?;
            let existing = match &mut index {
                Some(index) => index.get(key.as_ref()).copied(),
                None => fields.iter().position(|(k, _)| *k == key),
            };
            if let Some(at) = existing {
                fields[at].1 = value;
                continue;
            }
            if let Some(index) = &mut index {
                index.insert(key.to_string(), fields.len());
            }
            fields.push((key, value));
            if index.is_none() && fields.len() > LINEAR_DEDUP {
                index = Some(
                    fields
                        .iter()
                        .enumerate()
                        .map(|(i, (k, _))| (k.to_string(), i))
                        .collect(),
                );
            }
        }
        Ok(Object { fields })
    }
}

/// A key, borrowed from the input unless it has escapes.
struct KeySeed;

impl<'de> de::DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// Appends `s` as a JSON string.
pub fn write_string(out: &mut Vec<u8>, s: &str) {
    // Serialising a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_keep_their_order_and_text() {
        let text = r#" {"b": 1.50, "a": {"x": [1, 2]}, "c\u0041": "s"} "#;
        let object = Object::parse(text).unwrap().unwrap();
        let names: Vec<&str> = object.fields.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names, ["b", "a", "cA"]);
        assert_eq!(object.get("b").unwrap().get(), "1.50");
        assert_eq!(object.get("a").unwrap().get(), r#"{"x": [1, 2]}"#);
        let nested = lookup(object.get("a").unwrap(), &["x".into()]).unwrap();
        assert_eq!(nested.get(), "[1, 2]");
        assert!(lookup(object.get("b").unwrap(), &["x".into()]).is_none());
    }

    #[test]
    fn duplicate_keys_keep_the_first_place_and_the_last_value() {
        let small = Object::parse(r#"{"a":1,"b":2,"a":3}"#).unwrap().unwrap();
        assert_eq!(small.fields.len(), 2);
        assert_eq!(small.get("a").unwrap().get(), "3");
        let mut big = String::from("{");
        for i in 0..100 {
            big.push_str(&format!("\"k{i}\":{i},"));
        }
        big.push_str("\"k5\":\"last\"}");
        let object = Object::parse(&big).unwrap().unwrap();
        assert_eq!(object.fields.len(), 100);
        assert_eq!(object.fields[5].1.get(), "\"last\"");
    }

    #[test]
    fn non_objects_and_bad_json() {
        assert!(Object::parse("[1]").unwrap().is_none());
        assert!(Object::parse("5").unwrap().is_none());
        assert!(Object::parse("{nope").is_err());
        assert!(Object::parse("[nope").is_err());
        assert!(Object::parse("{} x").is_err());
        let deep = "[".repeat(100_000);
        assert!(Object::parse(&format!("{{\"a\":{deep}")).is_err());
    }
}
