//! A small model of server-side apply's field ownership (`metadata.managedFields`).
//!
//! Ownership is kept per leaf path: objects are descended key by key, while arrays, scalars
//! and empty objects are leaves. The real API server merges lists that have a merge key
//! (`containers` by `name`, …) element by element; here every list is atomic, owned and
//! replaced whole. What this keeps of the real behaviour:
//!
//! - an apply sets the fields it names and removes the fields its manager applied before and
//!   no longer names, unless another manager owns them too;
//! - an apply that changes a field owned by another manager fails with a conflict, unless it
//!   forces, which takes the field over;
//! - an update (PUT, merge or JSON patch, create) makes its manager the owner of every field
//!   it changed, and takes those fields from all other managers.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

pub(crate) type Path = Vec<String>;

/// Which part of an object a request writes: the main resource or its `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scope {
    Main,
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    manager: String,
    operation: Operation,
    scope: Scope,
}

#[derive(Debug, Clone)]
struct Owned {
    api_version: String,
    time: String,
    fields: BTreeSet<Path>,
}

/// A field another manager owns, which an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub(crate) manager: String,
    pub(crate) path: Path,
}

impl Conflict {
    /// `.spec.replicas`, as the API server writes a field in conflict messages.
    pub(crate) fn field(&self) -> String {
        self.path.iter().map(|k| format!(".{k}")).collect()
    }
}

/// The managers of one object and the fields each owns.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ownership {
    entries: BTreeMap<Entry, Owned>,
}

/// The part of an object that field ownership covers in a scope: for the main resource
/// everything but `apiVersion`, `kind`, `status` and the server's own metadata; for the status
/// subresource `status` alone.
pub(crate) fn tracked(object: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    let Some(fields) = object.as_object() else {
        return Value::Object(out);
    };
    for (key, value) in fields {
        match (scope, key.as_str()) {
            (Scope::Status, "status") => {
                out.insert(key.clone(), value.clone());
            }
            (Scope::Status, _) | (Scope::Main, "apiVersion" | "kind" | "status") => {}
            (Scope::Main, "metadata") => {
                let mut metadata = Map::new();
                for k in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(v) = value.get(k) {
                        metadata.insert(k.to_string(), v.clone());
                    }
                }
                if !metadata.is_empty() {
                    out.insert(key.clone(), Value::Object(metadata));
                }
            }
            (Scope::Main, _) => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(out)
}

fn leaves(value: &Value, prefix: &mut Path, out: &mut Vec<(Path, Value)>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, v) in map {
                prefix.push(k.clone());
                leaves(v, prefix, out);
                prefix.pop();
            }
        }
        _ => out.push((prefix.clone(), value.clone())),
    }
}

fn leaves_of(value: &Value) -> Vec<(Path, Value)> {
    let mut out = Vec::new();
    if value.as_object().is_some_and(|m| !m.is_empty()) {
        leaves(value, &mut Vec::new(), &mut out);
    }
    out
}

/// The paths at which `old` and `new` differ, as deep as both sides are objects.
fn diff(old: Option<&Value>, new: Option<&Value>, prefix: &mut Path, out: &mut Vec<Path>) {
    match (old, new) {
        (Some(Value::Object(a)), Some(Value::Object(b))) if !a.is_empty() && !b.is_empty() => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                prefix.push(k.clone());
                diff(a.get(k), b.get(k), prefix, out);
                prefix.pop();
            }
        }
        (a, b) if a != b => out.push(prefix.clone()),
        _ => {}
    }
}

fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

pub(crate) fn get<'v>(value: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(value, |v, k| v.get(k))
}

pub(crate) fn set(value: &mut Value, path: &[String], leaf: Value) {
    let Some((last, parents)) = path.split_last() else {
        *value = leaf;
        return;
    };
    let mut node = value;
    for k in parents {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        node = node
            .as_object_mut()
            .map(|m| {
                m.entry(k.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
            })
            .unwrap_or_else(|| unreachable!("made an object above"));
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    if let Some(map) = node.as_object_mut() {
        map.insert(last.clone(), leaf);
    }
}

fn remove(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = value;
    for k in parents {
        match node.get_mut(k) {
            Some(next) => node = next,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(last);
    }
}

impl Ownership {
    /// Server-side apply of `applied` by `manager` onto `current`: the object it makes, or
    /// the fields in conflict when not forced.
    pub(crate) fn apply(
        &mut self,
        manager: &str,
        scope: Scope,
        current: &Value,
        applied: &Value,
        force: bool,
        meta: (&str, &str),
    ) -> Result<Value, Vec<Conflict>> {
        let applied_leaves = leaves_of(&tracked(applied, scope));
        let mine = Entry {
            manager: manager.to_string(),
            operation: Operation::Apply,
            scope,
        };
        let mut conflicts = Vec::new();
        for (path, value) in &applied_leaves {
            if get(current, path) == Some(value) {
                continue;
            }
            for (entry, owned) in &self.entries {
                if entry.manager == manager || entry.scope != scope {
                    continue;
                }
                for owned_path in owned.fields.iter().filter(|q| related(q, path)) {
                    conflicts.push(Conflict {
                        manager: entry.manager.clone(),
                        path: owned_path.clone(),
                    });
                }
            }
        }
        conflicts.sort_by(|a, b| (&a.path, &a.manager).cmp(&(&b.path, &b.manager)));
        conflicts.dedup();
        if !conflicts.is_empty() && !force {
            return Err(conflicts);
        }

        let mut object = current.clone();
        let new_paths: BTreeSet<Path> = applied_leaves.iter().map(|(p, _)| p.clone()).collect();
        let previous = self
            .entries
            .get(&mine)
            .map(|o| o.fields.clone())
            .unwrap_or_default();
        for dropped in previous.difference(&new_paths) {
            let still_applied = new_paths.iter().any(|p| p.starts_with(dropped));
            let owned_elsewhere = self.entries.iter().any(|(entry, owned)| {
                *entry != mine && owned.fields.iter().any(|q| related(q, dropped))
            });
            if !still_applied && !owned_elsewhere {
                remove(&mut object, dropped);
            }
        }
        for (path, value) in applied_leaves {
            set(&mut object, &path, value);
        }
        for conflict in &conflicts {
            for (entry, owned) in &mut self.entries {
                if entry.manager == conflict.manager && entry.scope == scope {
                    owned.fields.remove(&conflict.path);
                }
            }
        }
        self.entries.insert(
            mine,
            Owned {
                api_version: meta.0.to_string(),
                time: meta.1.to_string(),
                fields: new_paths,
            },
        );
        self.entries.retain(|_, owned| !owned.fields.is_empty());
        Ok(object)
    }

    /// An update (create, replace or non-apply patch) by `manager` from `old` to `new`.
    pub(crate) fn update(
        &mut self,
        manager: &str,
        scope: Scope,
        old: &Value,
        new: &Value,
        meta: (&str, &str),
    ) {
        let (old, new) = (tracked(old, scope), tracked(new, scope));
        let mut changed = Vec::new();
        diff(Some(&old), Some(&new), &mut Vec::new(), &mut changed);
        if changed.is_empty() {
            return;
        }
        for owned in self.entries.values_mut() {
            owned
                .fields
                .retain(|q| !changed.iter().any(|p| related(p, q)));
        }
        let mine = Entry {
            manager: manager.to_string(),
            operation: Operation::Update,
            scope,
        };
        let owned = self.entries.entry(mine).or_insert_with(|| Owned {
            api_version: String::new(),
            time: String::new(),
            fields: BTreeSet::new(),
        });
        owned.api_version = meta.0.to_string();
        owned.time = meta.1.to_string();
        for path in changed {
            if let Some(value) = get(&new, &path) {
                let mut prefix = path.clone();
                let mut found = Vec::new();
                leaves(value, &mut prefix, &mut found);
                owned.fields.extend(found.into_iter().map(|(p, _)| p));
            }
        }
        self.entries.retain(|_, owned| !owned.fields.is_empty());
    }

    /// `metadata.managedFields` as the API server writes it.
    pub(crate) fn render(&self) -> Value {
        let entries = self
            .entries
            .iter()
            .map(|(entry, owned)| {
                let mut tree = Value::Object(Map::new());
                for path in &owned.fields {
                    let keys: Path = path.iter().map(|k| format!("f:{k}")).collect();
                    set(&mut tree, &keys, Value::Object(Map::new()));
                }
                let mut out = serde_json::json!({
                    "manager": entry.manager,
                    "operation": entry.operation.as_str(),
                    "apiVersion": owned.api_version,
                    "time": owned.time,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": tree,
                });
                if entry.scope == Scope::Status {
                    out["subresource"] = Value::from("status");
                }
                out
            })
            .collect();
        Value::Array(entries)
    }

    /// The managers owning `path` (`["spec", "replicas"]`), for tests of the fake itself.
    #[cfg(test)]
    pub(crate) fn owners(&self, path: &[&str]) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, o)| {
                o.fields
                    .iter()
                    .any(|q| q.iter().map(String::as_str).eq(path.iter().copied()))
            })
            .map(|(e, _)| e.manager.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const META: (&str, &str) = ("v1", "2025-01-01T00:00:00Z");

    #[test]
    fn apply_removes_what_its_manager_no_longer_applies() {
        let mut own = Ownership::default();
        let empty = json!({});
        let first = json!({"spec": {"a": 1, "b": {"c": 2}}});
        let object = own
            .apply("m", Scope::Main, &empty, &first, false, META)
            .unwrap();
        assert_eq!(object, first);
        let object = own
            .apply(
                "m",
                Scope::Main,
                &object,
                &json!({"spec": {"a": 3}}),
                false,
                META,
            )
            .unwrap();
        assert_eq!(object, json!({"spec": {"a": 3, "b": {}}}));
    }

    #[test]
    fn apply_conflicts_with_another_manager_unless_forced() {
        let mut own = Ownership::default();
        let object = json!({"spec": {"holder": "a"}});
        own.update("other", Scope::Main, &json!({}), &object, META);
        let err = own
            .apply(
                "m",
                Scope::Main,
                &object,
                &json!({"spec": {"holder": "b"}}),
                false,
                META,
            )
            .unwrap_err();
        assert_eq!(err[0].manager, "other");
        assert_eq!(err[0].field(), ".spec.holder");
        // The same value is no conflict: the field becomes shared.
        own.apply(
            "m",
            Scope::Main,
            &object,
            &json!({"spec": {"holder": "a"}}),
            false,
            META,
        )
        .unwrap();
        assert_eq!(own.owners(&["spec", "holder"]), ["m", "other"]);
        let object = own
            .apply(
                "m",
                Scope::Main,
                &object,
                &json!({"spec": {"holder": "b"}}),
                true,
                META,
            )
            .unwrap();
        assert_eq!(object, json!({"spec": {"holder": "b"}}));
        assert_eq!(own.owners(&["spec", "holder"]), ["m"]);
    }

    #[test]
    fn an_update_takes_the_fields_it_changes() {
        let mut own = Ownership::default();
        let object = own
            .apply(
                "m",
                Scope::Main,
                &json!({}),
                &json!({"spec": {"x": 1, "y": 2}}),
                false,
                META,
            )
            .unwrap();
        let edited = json!({"spec": {"x": 5, "y": 2}});
        own.update("kubectl-edit", Scope::Main, &object, &edited, META);
        assert_eq!(own.owners(&["spec", "x"]), ["kubectl-edit"]);
        assert_eq!(own.owners(&["spec", "y"]), ["m"]);
        let rendered = own.render();
        assert_eq!(rendered.as_array().unwrap().len(), 2);
        assert_eq!(rendered[0]["fieldsV1"], json!({"f:spec": {"f:x": {}}}));
    }

    #[test]
    fn tracked_leaves_out_server_fields() {
        let object = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}},
            "spec": {"x": 1}, "status": {"phase": "Running"}
        });
        assert_eq!(
            tracked(&object, Scope::Main),
            json!({"metadata": {"labels": {"a": "b"}}, "spec": {"x": 1}})
        );
        assert_eq!(
            tracked(&object, Scope::Status),
            json!({"status": {"phase": "Running"}})
        );
    }
}
