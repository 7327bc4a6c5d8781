//! Validation of written objects against a CRD's `openAPIV3Schema`, as the API server does
//! for custom resources, with the `jsonschema` crate.
//!
//! The OpenAPI v3 schema is read as JSON Schema draft 4 after two rewrites: `nullable: true`
//! admits `null`, and `x-kubernetes-int-or-string: true` means integer or string. On top of
//! the schema, an unknown field is a violation (the API server's `fieldValidation=Strict`;
//! by default it would drop the field and warn), except under
//! `x-kubernetes-preserve-unknown-fields: true` or `additionalProperties`. Not checked:
//! `metadata` (beyond the schema's own `type: object`), `format`s, CEL rules
//! (`x-kubernetes-validations`), defaults (not applied), list-type uniqueness.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// The compiled schemas of kinds, by `(group, kind)` and optionally version.
#[derive(Default)]
pub(crate) struct Schemas {
    kinds: BTreeMap<(String, String), Vec<Versioned>>,
}

/// A schema, of one version or (`None`) of every version.
type Versioned = (Option<String>, Compiled);

struct Compiled {
    raw: Value,
    validator: jsonschema::Validator,
}

/// `nullable` and `x-kubernetes-int-or-string`, rewritten into JSON Schema.
fn to_json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out: Map<String, Value> = map
                .iter()
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        // Maps of schemas, and schemas, and lists of schemas.
                        "properties" | "patternProperties" | "definitions" => match v {
                            Value::Object(props) => Value::Object(
                                props
                                    .iter()
                                    .map(|(p, s)| (p.clone(), to_json_schema(s)))
                                    .collect(),
                            ),
                            other => other.clone(),
                        },
                        "items" | "additionalProperties" | "not" => to_json_schema(v),
                        "allOf" | "anyOf" | "oneOf" => match v {
                            Value::Array(items) => {
                                Value::Array(items.iter().map(to_json_schema).collect())
                            }
                            other => other.clone(),
                        },
                        _ => v.clone(),
                    };
                    (k.clone(), v)
                })
                .collect();
            if map.get("nullable") == Some(&Value::Bool(true))
                && let Some(Value::String(t)) = map.get("type")
            {
                out.insert("type".into(), json!([t, "null"]));
            }
            if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
                && !map.contains_key("anyOf")
                && !map.contains_key("type")
            {
                out.insert(
                    "anyOf".into(),
                    json!([{"type": "integer"}, {"type": "string"}]),
                );
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// `spec.triggers[0].metadata`, as the API server names a field, from a JSON pointer.
fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    out
}

/// The fields of `value` that `schema` does not declare.
fn unknown_fields(
    value: &Value,
    schema: &Value,
    path: &str,
    top: bool,
    out: &mut Vec<(String, String)>,
) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (key, child) in map {
                // The API server knows these of every object, declared in a CRD's schema
                // or not.
                if top && matches!(key.as_str(), "metadata" | "apiVersion" | "kind") {
                    continue;
                }
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(child_schema), _) => {
                        unknown_fields(child, child_schema, &child_path, false, out)
                    }
                    (None, Some(Value::Object(child_schema))) => unknown_fields(
                        child,
                        &Value::Object(child_schema.clone()),
                        &child_path,
                        false,
                        out,
                    ),
                    (None, Some(Value::Bool(true))) => {}
                    (None, _) if properties.is_some() => {
                        out.push((
                            child_path,
                            "field not declared in schema (unknown field)".into(),
                        ));
                    }
                    (None, _) => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    unknown_fields(item, item_schema, &format!("{path}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

impl Schemas {
    /// Adds the schema of a kind (all versions when `version` is `None`). Panics when it does
    /// not compile: a test's setup is broken.
    pub(crate) fn add(&mut self, group: &str, kind: &str, version: Option<&str>, schema: &Value) {
        let converted = to_json_schema(schema);
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft4)
            .should_validate_formats(false)
            .build(&converted)
            .unwrap_or_else(|e| panic!("the schema of {kind}.{group} does not compile: {e}"));
        self.kinds
            .entry((group.to_string(), kind.to_string()))
            .or_default()
            .push((
                version.map(str::to_string),
                Compiled {
                    raw: schema.clone(),
                    validator,
                },
            ));
    }

    /// Adds every version's schema of a CustomResourceDefinition. Panics on a CRD without
    /// group, kind or schemas.
    pub(crate) fn add_crd(&mut self, crd: &Value) {
        let group = crd
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("the CRD has no spec.group"));
        let kind = crd
            .pointer("/spec/names/kind")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("the CRD of {group} has no spec.names.kind"));
        let versions = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("the CRD {kind}.{group} has no spec.versions"));
        for version in versions {
            let name = version["name"]
                .as_str()
                .unwrap_or_else(|| panic!("a version of the CRD {kind}.{group} has no name"));
            let schema = version
                .pointer("/schema/openAPIV3Schema")
                .unwrap_or_else(|| {
                    panic!("version {name} of the CRD {kind}.{group} has no schema")
                });
            self.add(group, kind, Some(name), schema);
        }
    }

    /// The violations of `object` (field, message), or `Ok` when it is valid or its kind has
    /// no schema.
    pub(crate) fn validate(
        &self,
        group: &str,
        api_version: &str,
        kind: &str,
        object: &Value,
    ) -> Result<(), Vec<(String, String)>> {
        let Some(candidates) = self.kinds.get(&(group.to_string(), kind.to_string())) else {
            return Ok(());
        };
        let version = api_version.rsplit('/').next().unwrap_or(api_version);
        let compiled = candidates
            .iter()
            .find(|(v, _)| v.as_deref() == Some(version))
            .or_else(|| candidates.iter().find(|(v, _)| v.is_none()));
        let Some((_, compiled)) = compiled else {
            return Err(vec![(
                "apiVersion".into(),
                format!(
                    "Unsupported value: {api_version:?}: the schema of {kind}.{group} has no such version"
                ),
            )]);
        };
        let mut violations: Vec<(String, String)> = compiled
            .validator
            .iter_errors(object)
            .map(|e| (field_path(e.instance_path().as_str()), e.to_string()))
            .map(|(field, message)| {
                let field = if field.is_empty() {
                    "<root>".to_string()
                } else {
                    field
                };
                (field, message)
            })
            .collect();
        unknown_fields(object, &compiled.raw, "", true, &mut violations);
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schemas() -> Schemas {
        let mut schemas = Schemas::default();
        schemas.add(
            "example.com",
            "Widget",
            None,
            &json!({
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "port": {"x-kubernetes-int-or-string": true},
                            "note": {"type": "string", "nullable": true},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}}
                        }
                    }
                }
            }),
        );
        schemas
    }

    fn check(spec: Value) -> Result<(), Vec<(String, String)>> {
        let object = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "uid": "u"}, "spec": spec,
        });
        schemas().validate("example.com", "example.com/v1", "Widget", &object)
    }

    #[test]
    fn valid_objects_pass() {
        check(json!({"size": 2, "port": "http", "note": null, "extra": {"any": [1]}, "labels": {"a": "b"}, "items": [{"a": "x"}]})).unwrap();
        check(json!({"size": 2, "port": 8080})).unwrap();
    }

    #[test]
    fn violations_name_their_fields() {
        let violations = check(
            json!({"size": 0, "port": true, "items": [{"b": "x"}], "labels": {"a": 1}, "typo": 1}),
        )
        .unwrap_err();
        let fields: Vec<&str> = violations.iter().map(|(f, _)| f.as_str()).collect();
        for expected in [
            "spec.size",
            "spec.port",
            "spec.items[0].b",
            "spec.labels.a",
            "spec.typo",
        ] {
            assert!(
                fields.contains(&expected),
                "{expected} not in {violations:?}"
            );
        }
        let missing = check(json!({})).unwrap_err();
        assert_eq!(missing[0].0, "spec", "{missing:?}");
    }
}
