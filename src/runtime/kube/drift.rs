//! Whether a live object still holds what Plumber applied: every field of the applied
//! object has its value in the live one. What the server or other managers added (defaults,
//! `status`, KEDA's `replicas`, more labels) is no drift, as server-side apply would leave
//! it; a field of Plumber's changed or removed by hand is.

use serde_json::Value;

/// Whether `live` holds every field of `applied` with its value. Lists must have the same
/// length, element by element (every list Plumber renders is its own whole: containers,
/// env, triggers). A `null` in `applied` asks for nothing.
pub fn holds(live: &Value, applied: &Value) -> bool {
    match (live, applied) {
        (_, Value::Null) => true,
        (Value::Object(live), Value::Object(applied)) => {
            applied.iter().all(|(key, wanted)| match live.get(key) {
                Some(found) => holds(found, wanted),
                None => wanted.is_null(),
            })
        }
        (Value::Array(live), Value::Array(applied)) => {
            live.len() == applied.len() && live.iter().zip(applied).all(|(l, a)| holds(l, a))
        }
        (Value::Number(live), Value::Number(applied)) => {
            live == applied || live.as_f64() == applied.as_f64()
        }
        (live, applied) => live == applied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn applied() -> Value {
        json!({
            "metadata": {"name": "p", "labels": {"a": "1"}},
            "spec": {"containers": [{"name": "c", "args": ["--x", "1"]}], "replicas": null}
        })
    }

    #[test]
    fn what_others_added_is_no_drift() {
        let live = json!({
            "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "resourceVersion": "7"},
            "spec": {
                "containers": [{"name": "c", "args": ["--x", "1"], "imagePullPolicy": "Always"}],
                "replicas": 3
            },
            "status": {"readyReplicas": 3}
        });
        assert!(holds(&live, &applied()));
    }

    #[test]
    fn a_changed_removed_or_added_element_of_ours_is_drift() {
        let mut changed = applied();
        changed["metadata"]["labels"]["a"] = json!("2");
        assert!(!holds(&changed, &applied()));
        let mut removed = applied();
        removed["metadata"]["labels"] = json!({});
        assert!(!holds(&removed, &applied()));
        let mut longer = applied();
        longer["spec"]["containers"][0]["args"] = json!(["--x", "1", "--y"]);
        assert!(!holds(&longer, &applied()));
        assert!(!holds(&json!({}), &applied()));
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(holds(&json!({"n": 1.0}), &json!({"n": 1})));
        assert!(!holds(&json!({"n": 2}), &json!({"n": 1})));
    }
}
