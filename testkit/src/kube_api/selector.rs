//! `labelSelector` and `fieldSelector` query parameters, as the API server parses them.

use std::collections::BTreeSet;

use serde_json::Value;

/// One requirement of a label selector; a selector is their conjunction.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
}

/// A parsed `labelSelector`: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`,
/// comma-separated (AND). The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub(crate) fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        for term in split_terms(text)? {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(LabelSelector(requirements))
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
            Requirement::In(k, vs) => label(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

/// Splits at commas outside parentheses (`a in (x,y),b` is two terms).
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced ')' in label selector {text:?}"))?;
            }
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in label selector {text:?}"));
    }
    terms.push(&text[start..]);
    Ok(terms)
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(
            label_key(key, term)?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(
            label_key(key, term)?,
            value.trim().to_string(),
        ));
    }
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::NotExists(label_key(key, term)?));
    }
    if let Some(open) = term.find('(') {
        let head = term[..open].trim();
        let values = term[open..]
            .strip_prefix('(')
            .and_then(|rest| rest.strip_suffix(')'))
            .ok_or_else(|| format!("malformed set in label selector term {term:?}"))?;
        let values: BTreeSet<String> = values
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        let mut words = head.split_whitespace();
        let (key, op) = match (words.next(), words.next(), words.next()) {
            (Some(key), Some(op), None) => (key, op),
            _ => return Err(format!("malformed label selector term {term:?}")),
        };
        let key = label_key(key, term)?;
        return match op {
            "in" => Ok(Requirement::In(key, values)),
            "notin" => Ok(Requirement::NotIn(key, values)),
            _ => Err(format!(
                "unknown operator {op:?} in label selector term {term:?}"
            )),
        };
    }
    Ok(Requirement::Exists(label_key(term, term)?))
}

fn label_key(key: &str, term: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(format!("invalid label key in label selector term {term:?}"));
    }
    Ok(key.to_string())
}

/// A parsed `fieldSelector`: `metadata.name` and `metadata.namespace` with `=`, `==` or `!=`,
/// comma-separated (AND). Other fields are refused, as the API server refuses fields a
/// resource does not index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub(crate) fn parse(text: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid field selector term {term:?}"));
            };
            let field = field.trim();
            if field != "metadata.name" && field != "metadata.namespace" {
                return Err(format!(
                    "field label not supported: {field} (the fake API server knows \
                     metadata.name and metadata.namespace)"
                ));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn equality_inequality_and_existence_are_anded() {
        let object = labelled(json!({"app": "web", "tier": "front"}));
        let matches = |s: &str| LabelSelector::parse(s).unwrap().matches(&object);
        assert!(matches(""));
        assert!(matches("app=web"));
        assert!(matches("app==web,tier"));
        assert!(matches("app!=db"));
        assert!(matches("!missing"));
        assert!(!matches("app=web,tier=back"));
        assert!(!matches("missing"));
        assert!(!matches("!app"));
        assert!(!matches("app!=web"));
    }

    #[test]
    fn set_based_requirements() {
        let object = labelled(json!({"app": "web"}));
        let matches = |s: &str| LabelSelector::parse(s).unwrap().matches(&object);
        assert!(matches("app in (web, db)"));
        assert!(matches("app in (web,db),other notin (x)"));
        assert!(!matches("app notin (web)"));
        assert!(!matches("other in (x)"));
        assert!(LabelSelector::parse("app in (web").is_err());
        assert!(LabelSelector::parse("app within (web)").is_err());
    }

    #[test]
    fn field_selector_on_name_and_namespace_only() {
        let object = labelled(json!({}));
        let matches = |s: &str| FieldSelector::parse(s).unwrap().matches(&object);
        assert!(matches("metadata.name=x"));
        assert!(matches("metadata.name!=y,metadata.namespace=ns"));
        assert!(!matches("metadata.name=y"));
        assert!(FieldSelector::parse("status.phase=Running").is_err());
    }
}
