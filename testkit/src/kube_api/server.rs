//! What the fake API server answers to one request: routing by kube's URL scheme, the verbs,
//! preconditions and `Status` errors.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use super::RecordedRequest;
use super::fields::{Conflict, Ownership, Scope};
use super::schema::Schemas;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Key, Resource, Store, metadata_mut, now};

pub(crate) const APPLY: &str = "application/apply-patch+yaml";
pub(crate) const MERGE: &str = "application/merge-patch+json";
pub(crate) const STRATEGIC: &str = "application/strategic-merge-patch+json";
pub(crate) const JSON_PATCH: &str = "application/json-patch+json";

/// The manager of a write that names none (the API server derives one from the user agent).
const UNNAMED_MANAGER: &str = "unknown";

/// A request path, parsed: `/api/v1/namespaces/{ns}/{plural}[/{name}[/{subresource}]]`,
/// `/apis/{group}/{version}/…`, and the same without `namespaces/{ns}` for cluster-scoped
/// objects and lists across all namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// API group, empty for the core group.
    pub group: String,
    pub version: String,
    /// `None` for cluster-scoped objects and lists across namespaces.
    pub namespace: Option<String>,
    /// The resource's plural: `deployments`, `scaledobjects`.
    pub resource: String,
    pub name: Option<String>,
    /// `status`, for the status subresource.
    pub subresource: Option<String>,
}

impl Target {
    pub(crate) fn parse(path: &str) -> Option<Target> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
            _ => (None, rest),
        };
        let (resource, name, subresource) = match rest {
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(name.to_string()), None),
            [resource, name, sub] => (*resource, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        if resource.is_empty() || name.as_deref() == Some("") {
            return None;
        }
        Some(Target {
            group: group.to_string(),
            version: version.to_string(),
            namespace,
            resource: resource.to_string(),
            name,
            subresource,
        })
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn resource(&self) -> Resource {
        Resource::new(&self.group, &self.resource)
    }

    fn key(&self, name: &str) -> Key {
        Key {
            resource: self.resource(),
            namespace: self.namespace.clone().unwrap_or_default(),
            name: name.to_string(),
        }
    }
}

/// A failed request, answered with a `Status` object.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: String,
    pub(crate) message: String,
    pub(crate) details: Value,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: Value::Null,
        }
    }

    fn with_details(mut self, resource: &Resource, name: &str) -> ApiError {
        self.details = json!({"name": name, "group": resource.group, "kind": resource.plural});
        self
    }

    fn not_found(resource: &Resource, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.qualified()),
        )
        .with_details(resource, name)
    }

    fn no_route(path: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    fn modified(resource: &Resource, name: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                resource.qualified()
            ),
        )
        .with_details(resource, name)
    }

    fn apply_conflicts(
        resource: &Resource,
        name: &str,
        api_version: &str,
        conflicts: &[Conflict],
    ) -> ApiError {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|c| {
                json!({
                    "reason": "FieldManagerConflict",
                    "message": format!("conflict with \"{}\" using {api_version}", c.manager),
                    "field": c.field(),
                })
            })
            .collect();
        let list: Vec<String> = conflicts
            .iter()
            .map(|c| {
                format!(
                    "conflict with \"{}\" using {api_version}: {}",
                    c.manager,
                    c.field()
                )
            })
            .collect();
        let plural = if conflicts.len() == 1 { "" } else { "s" };
        let mut error = ApiError::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {} conflict{plural}: {}",
                conflicts.len(),
                list.join("\n")
            ),
        )
        .with_details(resource, name);
        error.details["causes"] = Value::Array(causes);
        error
    }

    /// 422 Invalid, with one cause per violation (`field`, `message`).
    pub(crate) fn invalid(
        kind: &str,
        group: &str,
        name: &str,
        violations: &[(String, String)],
    ) -> ApiError {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let summary: Vec<String> = violations
            .iter()
            .map(|(field, message)| format!("{field}: {message}"))
            .collect();
        let causes: Vec<Value> = violations
            .iter()
            .map(|(field, message)| json!({"reason": "FieldValueInvalid", "message": message, "field": field}))
            .collect();
        let mut error = ApiError::new(
            422,
            "Invalid",
            format!(
                "{qualified} \"{name}\" is invalid: [{}]",
                summary.join(", ")
            ),
        );
        error.details = json!({"name": name, "group": group, "kind": kind, "causes": causes});
        error
    }

    pub(crate) fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !self.details.is_null() {
            status["details"] = self.details.clone();
        }
        status
    }
}

/// What a request was answered with; `mutated` when the store may have changed.
pub(crate) struct Reply {
    pub(crate) code: u16,
    pub(crate) body: Body,
    pub(crate) mutated: bool,
}

/// What a reply carries: an object, or a list whose items are the store's own rendered
/// objects (serialized from there, never copied).
pub(crate) enum Body {
    Object(Value),
    List(ListBody),
}

#[derive(Serialize)]
pub(crate) struct ListBody {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: Value,
    #[serde(serialize_with = "shared_items")]
    items: Vec<Arc<Value>>,
}

impl Serialize for Body {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Body::Object(object) => object.serialize(s),
            Body::List(list) => list.serialize(s),
        }
    }
}

fn shared_items<S: serde::Serializer>(items: &[Arc<Value>], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(items.iter().map(|item| &**item))
}

impl Reply {
    fn read(body: Value) -> Reply {
        Reply {
            code: 200,
            body: Body::Object(body),
            mutated: false,
        }
    }

    fn wrote(code: u16, body: Value) -> Reply {
        Reply {
            code,
            body: Body::Object(body),
            mutated: true,
        }
    }

    fn listed(body: ListBody, mutated: bool) -> Reply {
        Reply {
            code: 200,
            body: Body::List(body),
            mutated,
        }
    }
}

type Answer = Result<Reply, ApiError>;

pub(crate) fn handle(store: &mut Store, schemas: &Schemas, request: &RecordedRequest) -> Answer {
    if request.path == "/version" {
        return Ok(Reply::read(json!({
            "major": "1", "minor": "37", "gitVersion": "v1.37.0-plumber-fake",
            "platform": "linux/amd64",
        })));
    }
    let target = request
        .target()
        .ok_or_else(|| ApiError::no_route(&request.path))?;
    let scope = match target.subresource.as_deref() {
        None => Scope::Main,
        Some("status") => Scope::Status,
        Some(_) => return Err(ApiError::no_route(&request.path)),
    };
    let mut context = Context {
        store,
        schemas,
        request,
        target: target.clone(),
        scope,
    };
    let name = context.target.name.clone();
    // Watches (`GET` of a collection with `watch=true`) are answered by `watch::open`, before.
    match (request.method.as_str(), name) {
        ("GET", None) if scope == Scope::Main => context.list(),
        ("GET", Some(name)) => context.get(&name),
        ("POST", None) if scope == Scope::Main => context.create(),
        ("PUT", Some(name)) => context.replace(&name),
        ("PATCH", Some(name)) => context.patch(&name),
        ("DELETE", Some(name)) if scope == Scope::Main => context.delete(&name),
        ("DELETE", None) if scope == Scope::Main => context.delete_collection(),
        (method, _) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported on {}", request.path),
        )),
    }
}

struct Context<'a> {
    store: &'a mut Store,
    schemas: &'a Schemas,
    request: &'a RecordedRequest,
    target: Target,
    scope: Scope,
}

fn str_at<'v>(value: &'v Value, pointer: &str) -> Option<&'v str> {
    value.pointer(pointer).and_then(Value::as_str)
}

impl Context<'_> {
    fn resource(&self) -> Resource {
        self.target.resource()
    }

    fn query(&self, name: &str) -> Option<&str> {
        self.request.query.get(name).map(String::as_str)
    }

    fn dry_run(&self) -> bool {
        self.query("dryRun") == Some("All")
    }

    fn manager(&self) -> &str {
        self.query("fieldManager").unwrap_or(UNNAMED_MANAGER)
    }

    fn body_object(&self) -> Result<Value, ApiError> {
        match &self.request.body {
            Some(body @ Value::Object(_)) => Ok(body.clone()),
            Some(Value::String(_)) => Err(ApiError::bad_request(
                "the request body is not JSON (the fake API server reads JSON only, also for \
                 apply patches)",
            )),
            Some(_) => Err(ApiError::bad_request(
                "the request body is not a JSON object",
            )),
            None => Err(ApiError::bad_request("the request has no body")),
        }
    }

    /// `apiVersion` and `kind` of a written object: as given, else what the store knows.
    fn type_of(&self, object: &Value) -> (String, String) {
        let known = self.store.kind(&self.resource()).cloned();
        let api_version = str_at(object, "/apiVersion")
            .map(str::to_string)
            .unwrap_or_else(|| self.target.api_version());
        let kind = str_at(object, "/kind")
            .map(str::to_string)
            .or(known.map(|(_, kind)| kind))
            .unwrap_or_default();
        (api_version, kind)
    }

    fn check_identity(&self, object: &Value, name: Option<&str>) -> Result<(), ApiError> {
        if let (Some(given), Some(name)) = (str_at(object, "/metadata/name"), name)
            && given != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({given}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(given) = str_at(object, "/metadata/namespace") {
            let namespace = self.target.namespace.as_deref().unwrap_or_default();
            if given != namespace {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({given}) does not match the \
                     namespace sent on the request ({namespace})"
                )));
            }
        }
        let (api_version, kind) = (str_at(object, "/apiVersion"), str_at(object, "/kind"));
        if let (Some(api_version), Some(kind)) = (api_version, kind)
            && let Some((known_version, known_kind)) = self.store.kind(&self.resource())
        {
            let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
            if kind != known_kind || group != self.target.group {
                return Err(ApiError::bad_request(format!(
                    "the object's kind {api_version}/{kind} is not that of {} ({known_version}/{known_kind})",
                    self.resource().qualified()
                )));
            }
        }
        Ok(())
    }

    fn check_revision(&self, given: &Value, current: &Value, name: &str) -> Result<(), ApiError> {
        match str_at(given, "/metadata/resourceVersion") {
            Some(rv) if Some(rv) != str_at(current, "/metadata/resourceVersion") => {
                Err(ApiError::modified(&self.resource(), name))
            }
            _ => Ok(()),
        }
    }

    fn validate(&self, object: &Value, name: &str) -> Result<(), ApiError> {
        let (api_version, kind) = self.type_of(object);
        self.schemas
            .validate(&self.target.group, &api_version, &kind, object)
            .map_err(|violations| ApiError::invalid(&kind, &self.target.group, name, &violations))
    }

    /// Validates, then stores unless a dry run.
    fn store(&mut self, key: &Key, object: Value, ownership: Ownership, code: u16) -> Answer {
        self.validate(&object, &key.name)?;
        if self.dry_run() {
            return Ok(Reply {
                code,
                body: Body::Object(object),
                mutated: false,
            });
        }
        let stored = self.store.commit(key, object, ownership);
        Ok(Reply::wrote(code, stored))
    }

    fn get(&self, name: &str) -> Answer {
        self.store
            .get(&self.target.key(name))
            .map(Reply::read)
            .ok_or_else(|| ApiError::not_found(&self.resource(), name))
    }

    fn selected(&self) -> Result<Vec<Arc<Value>>, ApiError> {
        let labels = LabelSelector::parse(self.query("labelSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(self.query("fieldSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        Ok(self
            .store
            .list_shared(&self.resource(), self.target.namespace.as_deref())
            .into_iter()
            .filter(|o| labels.matches(o) && fields.matches(o))
            .collect())
    }

    fn list_of(&self, items: Vec<Arc<Value>>) -> ListBody {
        let kind = self
            .store
            .kind(&self.resource())
            .map_or_else(|| "List".to_string(), |(_, kind)| format!("{kind}List"));
        ListBody {
            api_version: self.target.api_version(),
            kind,
            metadata: json!({"resourceVersion": self.store.revision()}),
            items,
        }
    }

    fn list(&self) -> Answer {
        Ok(Reply::listed(self.list_of(self.selected()?), false))
    }

    fn create(&mut self) -> Answer {
        let mut object = self.body_object()?;
        self.check_identity(&object, None)?;
        let name = match (
            str_at(&object, "/metadata/name"),
            str_at(&object, "/metadata/generateName"),
        ) {
            (Some(name), _) if !name.is_empty() => name.to_string(),
            (_, Some(prefix)) => format!("{prefix}{:05x}", self.store.generated_name()),
            _ => {
                let (_, kind) = self.type_of(&object);
                return Err(ApiError::invalid(
                    &kind,
                    &self.target.group,
                    "",
                    &[(
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
        };
        if str_at(&object, "/metadata/resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let key = self.target.key(&name);
        if self.store.stored(&key).is_some() {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", self.resource().qualified()),
            )
            .with_details(&self.resource(), &name));
        }
        let (api_version, kind) = self.type_of(&object);
        object["apiVersion"] = Value::from(api_version.clone());
        object["kind"] = Value::from(kind);
        if let Some(map) = object.as_object_mut() {
            map.remove("status"); // the status subresource's: ignored on create
        }
        let metadata = metadata_mut(&mut object);
        for field in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "managedFields",
        ] {
            metadata.remove(field);
        }
        let mut ownership = Ownership::default();
        let time = now();
        ownership.update(
            self.manager(),
            Scope::Main,
            &json!({}),
            &object,
            (&api_version, &time),
        );
        self.store(&key, object, ownership, 201)
    }

    /// The object a write makes in this scope: the main resource keeps the stored status,
    /// the status subresource changes nothing but the status.
    fn scoped(&self, current: &Value, written: Value) -> Value {
        match self.scope {
            Scope::Main => {
                let mut object = written;
                match current.get("status") {
                    Some(status) => object["status"] = status.clone(),
                    None => {
                        if let Some(map) = object.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
                object
            }
            Scope::Status => {
                let mut object = current.clone();
                match written.get("status") {
                    Some(status) => object["status"] = status.clone(),
                    None => {
                        if let Some(map) = object.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
                object
            }
        }
    }

    fn replace(&mut self, name: &str) -> Answer {
        let body = self.body_object()?;
        self.check_identity(&body, Some(name))?;
        let key = self.target.key(name);
        let stored = self
            .store
            .stored(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&self.resource(), name))?;
        self.check_revision(&body, &stored.object, name)?;
        let mut object = self.scoped(&stored.object, body);
        let (api_version, kind) = self.type_of(&object);
        object["apiVersion"] = Value::from(api_version.clone());
        object["kind"] = Value::from(kind);
        let mut ownership = stored.ownership.clone();
        let time = now();
        ownership.update(
            self.manager(),
            self.scope,
            &stored.object,
            &object,
            (&api_version, &time),
        );
        self.store(&key, object, ownership, 200)
    }

    fn patch(&mut self, name: &str) -> Answer {
        let content_type = self.request.content_type.as_deref().unwrap_or_default();
        let content_type = content_type.split(';').next().unwrap_or_default().trim();
        match content_type {
            APPLY => self.apply(name),
            MERGE | STRATEGIC | JSON_PATCH => self.update_patch(name, content_type),
            other => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format: {other:?}"),
            )),
        }
    }

    fn apply(&mut self, name: &str) -> Answer {
        let applied = self.body_object()?;
        let Some(manager) = self.query("fieldManager").map(str::to_string) else {
            return Err(ApiError::invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                &[(
                    "fieldManager".into(),
                    "Required value: is required for apply patch".into(),
                )],
            ));
        };
        let force = self.query("force") == Some("true");
        let (Some(api_version), Some(kind)) =
            (str_at(&applied, "/apiVersion"), str_at(&applied, "/kind"))
        else {
            return Err(ApiError::bad_request(
                "an apply patch must set apiVersion and kind",
            ));
        };
        let (api_version, kind) = (api_version.to_string(), kind.to_string());
        self.check_identity(&applied, Some(name))?;
        let key = self.target.key(name);
        let existing = self.store.stored(&key).cloned();
        if existing.is_none() && self.scope == Scope::Status {
            return Err(ApiError::not_found(&self.resource(), name));
        }
        if let Some(existing) = &existing {
            self.check_revision(&applied, &existing.object, name)?;
        }
        let (current, mut ownership) = match existing.clone() {
            Some(stored) => (stored.object, stored.ownership),
            None => {
                let mut skeleton =
                    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
                if let Some(ns) = &self.target.namespace {
                    skeleton["metadata"]["namespace"] = Value::from(ns.clone());
                }
                (skeleton, Ownership::default())
            }
        };
        let time = now();
        let mut object = ownership
            .apply(
                &manager,
                self.scope,
                &current,
                &applied,
                force,
                (&api_version, &time),
            )
            .map_err(|conflicts| {
                ApiError::apply_conflicts(&self.resource(), name, &api_version, &conflicts)
            })?;
        if self.scope == Scope::Main {
            object["apiVersion"] = Value::from(api_version);
            object["kind"] = Value::from(kind);
        }
        let code = if existing.is_some() { 200 } else { 201 };
        self.store(&key, object, ownership, code)
    }

    fn update_patch(&mut self, name: &str, content_type: &str) -> Answer {
        let key = self.target.key(name);
        let stored = self
            .store
            .stored(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&self.resource(), name))?;
        let mut patched = stored.object.clone();
        match content_type {
            JSON_PATCH => {
                let body = self
                    .request
                    .body
                    .clone()
                    .ok_or_else(|| ApiError::bad_request("the request has no body"))?;
                let patch: json_patch::Patch = serde_json::from_value(body)
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut patched, &patch.0).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the JSON patch does not apply: {e}"),
                    )
                })?;
            }
            _ => {
                let body = self.body_object()?;
                self.check_revision(&body, &stored.object, name)?;
                json_patch::merge(&mut patched, &body);
            }
        }
        let mut object = self.scoped(&stored.object, patched);
        let (api_version, kind) = self.type_of(&object);
        object["apiVersion"] = Value::from(api_version.clone());
        object["kind"] = Value::from(kind);
        let mut ownership = stored.ownership.clone();
        let time = now();
        ownership.update(
            self.manager(),
            self.scope,
            &stored.object,
            &object,
            (&api_version, &time),
        );
        self.store(&key, object, ownership, 200)
    }

    fn delete_options(&self) -> Value {
        match &self.request.body {
            Some(body @ Value::Object(_)) => body.clone(),
            _ => json!({}),
        }
    }

    fn delete(&mut self, name: &str) -> Answer {
        let options = self.delete_options();
        let key = self.target.key(name);
        let stored = self
            .store
            .stored(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&self.resource(), name))?;
        for (field, option, pointer) in [
            ("UID", "uid", "/metadata/uid"),
            (
                "ResourceVersion",
                "resourceVersion",
                "/metadata/resourceVersion",
            ),
        ] {
            if let Some(wanted) = options
                .pointer(&format!("/preconditions/{option}"))
                .and_then(Value::as_str)
            {
                let actual = str_at(&stored.object, pointer).unwrap_or_default();
                if wanted != actual {
                    return Err(ApiError::new(
                        409,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: \
                             {field} in precondition: {wanted}, {field} in object meta: {actual}",
                            self.resource().qualified()
                        ),
                    )
                    .with_details(&self.resource(), name));
                }
            }
        }
        let dry_run = self.dry_run()
            || options["dryRun"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        if dry_run {
            return Ok(Reply::read(self.store.get(&key).unwrap_or_default()));
        }
        Ok(Reply::wrote(200, self.delete_now(&key)))
    }

    /// Deletes (or, with finalizers, marks for deletion) and answers as the API server does:
    /// the object while it is being finalized, and for Pods; else a `Success` Status.
    fn delete_now(&mut self, key: &Key) -> Value {
        let has_finalizers = self
            .store
            .stored(key)
            .and_then(|s| s.object.pointer("/metadata/finalizers"))
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            return self.store.mark_deleted(key).unwrap_or_default();
        }
        let deleted = self.store.remove(key).unwrap_or_default();
        if key.resource == Resource::new("", "pods") {
            return deleted;
        }
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": key.name,
                "group": key.resource.group,
                "kind": key.resource.plural,
                "uid": str_at(&deleted, "/metadata/uid").unwrap_or_default(),
            },
        })
    }

    fn delete_collection(&mut self) -> Answer {
        let selected = self.selected()?;
        if self.dry_run() {
            return Ok(Reply::listed(self.list_of(selected), false));
        }
        let mut deleted = Vec::new();
        for object in selected {
            let name = str_at(&object, "/metadata/name").unwrap_or_default();
            let key = Key {
                resource: self.resource(),
                namespace: str_at(&object, "/metadata/namespace")
                    .unwrap_or_default()
                    .to_string(),
                name: name.to_string(),
            };
            self.delete_now(&key);
            deleted.push(object);
        }
        Ok(Reply::listed(self.list_of(deleted), true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_kube_url_scheme() {
        let t = Target::parse("/apis/apps/v1/namespaces/ns/deployments/web").unwrap();
        assert_eq!(
            (
                t.group.as_str(),
                t.version.as_str(),
                t.namespace.as_deref(),
                t.resource.as_str(),
                t.name.as_deref()
            ),
            ("apps", "v1", Some("ns"), "deployments", Some("web"))
        );
        let t = Target::parse("/api/v1/namespaces/ns/pods").unwrap();
        assert_eq!(
            (t.group.as_str(), t.resource.as_str(), t.name),
            ("", "pods", None)
        );
        let t =
            Target::parse("/apis/plumber.dev/v1alpha1/namespaces/ns/topologies/t/status").unwrap();
        assert_eq!(t.subresource.as_deref(), Some("status"));
        let t = Target::parse("/apis/apps/v1/deployments").unwrap();
        assert_eq!(t.namespace, None);
        let t = Target::parse("/api/v1/namespaces/plumber").unwrap();
        assert_eq!(
            (t.resource.as_str(), t.name.as_deref()),
            ("namespaces", Some("plumber"))
        );
        assert_eq!(Target::parse("/version"), None);
        assert_eq!(Target::parse("/apis/apps"), None);
    }
}
