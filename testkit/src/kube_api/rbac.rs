//! RBAC for the fake API server: which requests [`Rbac`] allows, and the 403 of those it
//! does not, as kube-apiserver's RBAC authorizer decides and words them.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::{Value, json};

use super::server::{APPLY, ApiError};
use super::store::{Key, Resource, Store};
use super::{FakeApi, RecordedRequest};

/// RBAC for the fake API server: requests are answered 403 `Forbidden` unless a rule of the
/// Roles and ClusterRoles given allows them, as kube-apiserver's RBAC authorizer decides.
///
/// [`FakeApi::with_rbac`] turns RBAC on (it is off by default). The rules are read from the
/// Roles' and ClusterRoles' YAML ([`Rbac::with_roles_yaml`]), so a test holds the manifests
/// a cluster would get (`deploy/role.yaml`) to what the code under test does:
///
/// ```no_run
/// use plumber_testkit::kube_api::{FakeApi, Rbac};
///
/// let role = std::fs::read_to_string("../deploy/role.yaml").unwrap();
/// let fake = FakeApi::new()
///     .with_rbac(Rbac::service_account("plumber", "plumber").with_roles_yaml(&role, "plumber"));
/// ```
///
/// # What is checked
///
/// Each request's attributes are derived as kube-apiserver's `RequestInfoFactory` derives them
/// ([`Attributes::of`]): API group (core is `""`), namespace, resource, subresource, name, and
/// the verb from the method and query: `GET` of a named object `get`, of a collection `list`,
/// with `watch` set (not `0` or `false`) `watch`; `POST` `create`; `PUT` `update`; `PATCH`
/// (any patch, server-side apply included) `patch`; `DELETE` of a named object `delete`, of a
/// collection `deletecollection`. A list or watch whose `fieldSelector` requires
/// `metadata.name=N` is named `N`, as on the real server (so `resourceNames` can allow it).
///
/// A rule allows a request when its verbs, API groups and resources each hold the request's
/// (or `*`; a subresource is `resource/subresource`, which `*/subresource` matches too), and it
/// names no `resourceNames` or the request's name among them. A create has no name, so a rule
/// with `resourceNames` never allows it, nor a list or watch without a name selector. A
/// server-side apply of an object that does not exist creates it: it needs `create` as well
/// as `patch`, and without it is answered 403 as kube-apiserver answers it (`… is forbidden: `,
/// with no reason after the colon). Whether it exists is decided when the request arrives (the
/// real server decides when it writes: a schema violation would be answered 422 first).
///
/// Each Role is taken as bound to the user in its namespace (by a RoleBinding there): it
/// allows namespaced requests in that namespace only, never a cluster-scoped one. Each
/// ClusterRole is taken as bound cluster-wide (by a ClusterRoleBinding). Every user also has
/// what Kubernetes' default ClusterRoles give every authenticated user
/// (`system:discovery`, `system:public-info-viewer`, `system:basic-user`): `GET` of `/api`,
/// `/apis` and below them without a resource (discovery), `/version`, `/healthz`, `/livez`,
/// `/readyz`, `/openapi`, and creating self-subject reviews.
///
/// A denied request is recorded with status 403 and answered at once, as authorization comes
/// before everything else in the API server: it is neither held ([`FakeApi::hold`]) nor
/// failed by an injected fault ([`FakeApi::fail_next`]), and it counts against neither.
///
/// Not modelled: RoleBindings and ClusterRoleBindings themselves (every role given is bound to
/// the one user), groups, ClusterRoles bound in a namespace, aggregated ClusterRoles
/// (`aggregationRule`), impersonation, and the escalation checks on writing RBAC objects.
#[derive(Debug, Clone)]
pub struct Rbac {
    user: String,
    grants: Vec<Grant>,
}

/// A rule, and where it applies: a Role's namespace, or everywhere for a ClusterRole's.
#[derive(Debug, Clone)]
struct Grant {
    namespace: Option<String>,
    rule: PolicyRule,
}

impl Rbac {
    /// Requests from the ServiceAccount `name` of `namespace` (user
    /// `system:serviceaccount:<namespace>:<name>`), allowed only what every authenticated
    /// user is until roles are added.
    pub fn service_account(namespace: &str, name: &str) -> Rbac {
        let strings = |items: &[&str]| Some(items.iter().map(|s| s.to_string()).collect());
        // Kubernetes' defaults for `system:authenticated`: discovery and public information
        // (system:discovery, system:public-info-viewer), self-subject reviews (system:basic-user).
        let defaults = [
            PolicyRule {
                non_resource_urls: strings(&[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ]),
                verbs: vec!["get".to_string()],
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: strings(&["authorization.k8s.io"]),
                resources: strings(&["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
                verbs: vec!["create".to_string()],
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: strings(&["authentication.k8s.io"]),
                resources: strings(&["selfsubjectreviews"]),
                verbs: vec!["create".to_string()],
                ..PolicyRule::default()
            },
        ];
        Rbac {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            grants: defaults
                .into_iter()
                .map(|rule| Grant {
                    namespace: None,
                    rule,
                })
                .collect(),
        }
    }

    /// Adds the rules of every Role and ClusterRole in `yaml` (one or more documents; other
    /// kinds are skipped), each bound to the user: a Role in its `metadata.namespace`, or in
    /// `namespace` when it names none (as kustomize's `namespace:` would place it); a
    /// ClusterRole everywhere. Panics when the text is not YAML, a Role or ClusterRole does not
    /// read as one, or there is neither in it: a test that meant to grant something would
    /// otherwise see only 403s.
    pub fn with_roles_yaml(mut self, yaml: &str, namespace: &str) -> Rbac {
        let documents: Vec<Value> = serde_saphyr::from_multiple(yaml)
            .unwrap_or_else(|e| panic!("the roles are not YAML the fake API server reads: {e}"));
        let mut found = 0;
        for document in documents {
            match document.get("kind").and_then(Value::as_str) {
                Some("Role") => {
                    let role: Role = serde_json::from_value(document)
                        .unwrap_or_else(|e| panic!("a Role does not read as one: {e}"));
                    let scope = role
                        .metadata
                        .namespace
                        .unwrap_or_else(|| namespace.to_string());
                    self.grants
                        .extend(
                            role.rules
                                .unwrap_or_default()
                                .into_iter()
                                .map(|rule| Grant {
                                    namespace: Some(scope.clone()),
                                    rule,
                                }),
                        );
                    found += 1;
                }
                Some("ClusterRole") => {
                    let role: ClusterRole = serde_json::from_value(document)
                        .unwrap_or_else(|e| panic!("a ClusterRole does not read as one: {e}"));
                    self.grants
                        .extend(
                            role.rules
                                .unwrap_or_default()
                                .into_iter()
                                .map(|rule| Grant {
                                    namespace: None,
                                    rule,
                                }),
                        );
                    found += 1;
                }
                _ => {}
            }
        }
        assert!(
            found > 0,
            "there is no Role or ClusterRole in the YAML given"
        );
        self
    }

    /// `system:serviceaccount:<namespace>:<name>`.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Whether some rule allows a request of these attributes.
    pub fn allows(&self, attributes: &Attributes) -> bool {
        self.grants.iter().any(|grant| grant.allows(attributes))
    }

    /// The `Status` kube-apiserver answers a request of these attributes with when no rule
    /// allows it.
    fn forbidden(&self, attributes: &Attributes) -> ApiError {
        let user = &self.user;
        let verb = &attributes.verb;
        let why = if !attributes.resource_request {
            format!("User {user:?} cannot {verb} path {:?}", attributes.path)
        } else {
            let mut resource = attributes.resource.clone();
            if !attributes.subresource.is_empty() {
                resource = format!("{resource}/{}", attributes.subresource);
            }
            let group = &attributes.api_group;
            match attributes.namespace.as_str() {
                "" => format!(
                    "User {user:?} cannot {verb} resource {resource:?} in API group {group:?} at \
                     the cluster scope"
                ),
                ns => format!(
                    "User {user:?} cannot {verb} resource {resource:?} in API group {group:?} in \
                     the namespace {ns:?}"
                ),
            }
        };
        attributes.forbidden(&why)
    }
}

impl Grant {
    fn allows(&self, attributes: &Attributes) -> bool {
        let rule = &self.rule;
        let any = |list: &Option<Vec<String>>, wanted: &str| {
            list.iter()
                .flatten()
                .any(|item| item == "*" || item == wanted)
        };
        if !rule.verbs.iter().any(|v| v == "*" || *v == attributes.verb) {
            return false;
        }
        if !attributes.resource_request {
            // Non-resource URLs are granted by ClusterRoles only.
            return self.namespace.is_none()
                && rule.non_resource_urls.iter().flatten().any(|url| {
                    url == "*"
                        || *url == attributes.path
                        || url
                            .strip_suffix('*')
                            .is_some_and(|prefix| attributes.path.starts_with(prefix))
                });
        }
        if let Some(namespace) = &self.namespace
            && *namespace != attributes.namespace
        {
            return false;
        }
        if !any(&rule.api_groups, &attributes.api_group) {
            return false;
        }
        let combined = if attributes.subresource.is_empty() {
            attributes.resource.clone()
        } else {
            format!("{}/{}", attributes.resource, attributes.subresource)
        };
        let resource_matches = rule.resources.iter().flatten().any(|r| {
            r == "*"
                || *r == combined
                || (!attributes.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(attributes.subresource.as_str()))
        });
        if !resource_matches {
            return false;
        }
        match &rule.resource_names {
            Some(names) if !names.is_empty() => names.contains(&attributes.name),
            _ => true,
        }
    }
}

/// What RBAC decides on, derived from a request as kube-apiserver's `RequestInfoFactory` and
/// authorization filter derive it. See [`Rbac`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`;
    /// for a non-resource request the method in lower case.
    pub verb: String,
    pub path: String,
    /// Whether the path names a resource (`/api/v1/…/pods`), not discovery or `/version`.
    pub resource_request: bool,
    /// Empty for the core group.
    pub api_group: String,
    pub api_version: String,
    /// Empty for cluster-scoped requests and requests across all namespaces.
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    /// Empty when the request names no object.
    pub name: String,
}

impl Attributes {
    /// The attributes of a request of `method` on `path` with the (decoded) `query`.
    pub fn of(method: &str, path: &str, query: &BTreeMap<String, String>) -> Attributes {
        let non_resource = || Attributes {
            verb: method.to_ascii_lowercase(),
            path: path.to_string(),
            ..Attributes::default()
        };
        let mut parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if parts.len() < 3 {
            return non_resource();
        }
        let mut attributes = Attributes {
            path: path.to_string(),
            resource_request: true,
            ..Attributes::default()
        };
        match parts[0] {
            "api" => {}
            "apis" if parts.len() >= 4 => attributes.api_group = parts.remove(1).to_string(),
            _ => return non_resource(),
        }
        parts.remove(0);
        attributes.api_version = parts.remove(0).to_string();
        // The deprecated `/watch/` and `/proxy/` prefixes name the verb; else the method does.
        if matches!(parts[0], "watch" | "proxy") {
            if parts.len() < 2 {
                return non_resource();
            }
            attributes.verb = parts.remove(0).to_string();
        } else {
            attributes.verb = match method {
                "POST" => "create",
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => "",
            }
            .to_string();
        }
        if parts[0] == "namespaces" && parts.len() > 1 {
            attributes.namespace = parts[1].to_string();
            // `namespaces/{ns}/status` and `/finalize` are the Namespace's subresources.
            if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
                parts.drain(..2);
            }
        }
        attributes.resource = parts[0].to_string();
        if let Some(name) = parts.get(1) {
            attributes.name = name.to_string();
        }
        if attributes.verb != "proxy"
            && let Some(sub) = parts.get(2)
        {
            attributes.subresource = sub.to_string();
        }
        if attributes.name.is_empty() && attributes.verb == "get" {
            let watch = query
                .get("watch")
                .is_some_and(|w| w != "0" && !w.eq_ignore_ascii_case("false"));
            attributes.verb = if watch { "watch" } else { "list" }.to_string();
            if let Some(name) = query
                .get("fieldSelector")
                .and_then(|selector| named(selector))
            {
                attributes.name = name;
            }
        }
        if attributes.name.is_empty() && attributes.verb == "delete" {
            attributes.verb = "deletecollection".to_string();
        }
        attributes
    }

    /// The attributes of a request as the fake API server recorded it.
    pub fn of_request(request: &RecordedRequest) -> Attributes {
        Attributes::of(&request.method, &request.path, &request.query)
    }

    /// 403 `Forbidden` on these attributes, `why` after the colon.
    fn forbidden(&self, why: &str) -> ApiError {
        let group_resource = if self.api_group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.api_group)
        };
        let message = match (group_resource.as_str(), self.name.as_str()) {
            ("", _) => format!("forbidden: {why}"),
            (resource, "") => format!("{resource} is forbidden: {why}"),
            (resource, name) => format!("{resource} {name:?} is forbidden: {why}"),
        };
        let mut error = ApiError::new(403, "Forbidden", message);
        // `StatusDetails` leaves empty fields out.
        let mut details = serde_json::Map::new();
        for (field, value) in [
            ("name", &self.name),
            ("group", &self.api_group),
            ("kind", &self.resource),
        ] {
            if !value.is_empty() {
                details.insert(field.to_string(), json!(value));
            }
        }
        error.details = Value::Object(details);
        error
    }
}

/// The name a field selector requires (`metadata.name=N` or `==`, among other terms), if it is
/// a valid path segment: what makes a list or watch "named" for RBAC.
fn named(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let value = term
            .trim()
            .strip_prefix("metadata.name")?
            .trim_start()
            .strip_prefix('=')?;
        let value = value.strip_prefix('=').unwrap_or(value).trim();
        let valid = !matches!(value, "" | "." | "..") && !value.contains(['/', '%']);
        valid.then(|| value.to_string())
    })
}

/// The 403 to answer `request` with, if RBAC is on and does not allow it.
pub(super) fn denied(
    rbac: Option<&Rbac>,
    store: &Store,
    request: &RecordedRequest,
) -> Option<ApiError> {
    let rbac = rbac?;
    let attributes = Attributes::of_request(request);
    if !rbac.allows(&attributes) {
        return Some(rbac.forbidden(&attributes));
    }
    // A server-side apply of an object that is not there creates it: kube-apiserver checks
    // `create` then too, and answers its 403 with the authorizer's reason, empty for RBAC.
    // (An apply to a missing object's subresource creates nothing: it is a 404.)
    let creates = attributes.verb == "patch"
        && request
            .content_type
            .as_deref()
            .is_some_and(|c| c.starts_with(APPLY))
        && request
            .target()
            .filter(|t| t.subresource.is_none())
            .and_then(|t| {
                Some(Key {
                    resource: Resource::new(&t.group, &t.resource),
                    namespace: t.namespace.clone().unwrap_or_default(),
                    name: t.name.clone()?,
                })
            })
            .is_some_and(|key| store.stored(&key).is_none());
    let create = Attributes {
        verb: "create".to_string(),
        ..attributes
    };
    (creates && !rbac.allows(&create)).then(|| create.forbidden(""))
}

impl FakeApi {
    /// Answers 403 to every request `rbac` does not allow (see [`Rbac`]); without it,
    /// everything is allowed.
    pub fn with_rbac(self, rbac: Rbac) -> FakeApi {
        self.lock().rbac = Some(rbac);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(method: &str, uri: &str) -> Attributes {
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let query = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.replace("%3D", "="))
            })
            .collect();
        Attributes::of(method, path, &query)
    }

    fn summary(a: &Attributes) -> String {
        format!(
            "{} {}|{}|{}|{}|{}",
            a.verb, a.api_group, a.namespace, a.resource, a.subresource, a.name
        )
    }

    #[test]
    fn verbs_and_resources_as_the_api_server_derives_them() {
        for (method, uri, want) in [
            ("GET", "/api/v1/namespaces/ns/pods/p", "get |ns|pods||p"),
            ("GET", "/api/v1/namespaces/ns/pods", "list |ns|pods||"),
            (
                "GET",
                "/api/v1/namespaces/ns/pods?watch=true",
                "watch |ns|pods||",
            ),
            (
                "GET",
                "/api/v1/namespaces/ns/pods?watch=1",
                "watch |ns|pods||",
            ),
            (
                "GET",
                "/api/v1/namespaces/ns/pods?watch=false",
                "list |ns|pods||",
            ),
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases?watch=true&fieldSelector=metadata.name%3Dplumber",
                "watch coordination.k8s.io|ns|leases||plumber",
            ),
            ("GET", "/api/v1/pods", "list ||pods||"),
            (
                "GET",
                "/api/v1/namespaces/ns/pods/p/log",
                "get |ns|pods|log|p",
            ),
            (
                "POST",
                "/apis/apps/v1/namespaces/ns/deployments",
                "create apps|ns|deployments||",
            ),
            (
                "PUT",
                "/apis/plumber.dev/v1alpha1/namespaces/ns/topologies/t/status",
                "update plumber.dev|ns|topologies|status|t",
            ),
            (
                "PATCH",
                "/apis/apps/v1/namespaces/ns/deployments/d/scale",
                "patch apps|ns|deployments|scale|d",
            ),
            (
                "DELETE",
                "/apis/apps/v1/namespaces/ns/deployments/d",
                "delete apps|ns|deployments||d",
            ),
            (
                "DELETE",
                "/apis/apps/v1/namespaces/ns/deployments",
                "deletecollection apps|ns|deployments||",
            ),
            ("GET", "/api/v1/namespaces/ns", "get |ns|namespaces||ns"),
            (
                "PUT",
                "/api/v1/namespaces/ns/finalize",
                "update |ns|namespaces|finalize|ns",
            ),
            ("GET", "/api/v1/namespaces", "list ||namespaces||"),
            (
                "GET",
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/admin",
                "get rbac.authorization.k8s.io||clusterroles||admin",
            ),
            (
                "GET",
                "/api/v1/watch/namespaces/ns/pods",
                "watch |ns|pods||",
            ),
        ] {
            assert_eq!(summary(&attributes(method, uri)), want, "{method} {uri}");
        }
        for uri in [
            "/version",
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
        ] {
            let a = attributes("GET", uri);
            assert!(!a.resource_request, "{uri}");
            assert_eq!(a.verb, "get");
        }
    }

    #[test]
    fn rules_match_as_kubernetes_rbac_does() {
        let rbac = Rbac::service_account("ns", "sa").with_roles_yaml(
            r#"
kind: Role
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: r}
rules:
  - {apiGroups: [""], resources: ["pods", "pods/log"], verbs: ["get", "list"]}
  - {apiGroups: ["coordination.k8s.io"], resources: ["leases"], resourceNames: ["mine"], verbs: ["*"]}
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: c}
rules:
  - {apiGroups: ["*"], resources: ["*/scale"], verbs: ["get"]}
  - {nonResourceURLs: ["/metrics"], verbs: ["get"]}
"#,
            "ns",
        );
        let allowed = |method, uri| rbac.allows(&attributes(method, uri));
        assert!(allowed("GET", "/api/v1/namespaces/ns/pods/p"));
        assert!(allowed("GET", "/api/v1/namespaces/ns/pods/p/log"));
        assert!(!allowed("GET", "/api/v1/namespaces/ns/pods/p/exec"));
        assert!(
            !allowed("GET", "/api/v1/namespaces/other/pods"),
            "a Role is of its namespace"
        );
        assert!(!allowed("GET", "/api/v1/pods"), "nor cluster-wide");
        assert!(!allowed("GET", "/api/v1/namespaces/ns/pods?watch=true"));
        assert!(allowed(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases/mine"
        ));
        assert!(!allowed(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases/yours"
        ));
        assert!(!allowed(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
        ));
        assert!(!allowed(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
        ));
        assert!(allowed(
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases?fieldSelector=metadata.name%3Dmine"
        ));
        assert!(allowed(
            "GET",
            "/apis/apps/v1/namespaces/any/deployments/d/scale"
        ));
        assert!(!allowed(
            "GET",
            "/apis/apps/v1/namespaces/any/deployments/d"
        ));
        assert!(allowed("GET", "/metrics"));
        assert!(allowed("GET", "/apis/apps/v1"), "discovery");
        assert!(allowed("GET", "/version"));
        assert!(!allowed("POST", "/version"));
        assert!(!allowed("GET", "/logs"));
    }

    #[test]
    fn forbidden_as_kube_apiserver_words_it() {
        let rbac = Rbac::service_account("plumber", "plumber");
        let status = |method, uri| rbac.forbidden(&attributes(method, uri)).status();
        assert_eq!(
            status("GET", "/api/v1/namespaces/plumber/secrets"),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "secrets is forbidden: User \"system:serviceaccount:plumber:plumber\" \
                            cannot list resource \"secrets\" in API group \"\" in the namespace \"plumber\"",
                "reason": "Forbidden", "details": {"kind": "secrets"}, "code": 403,
            })
        );
        assert_eq!(
            status(
                "PATCH",
                "/apis/apps/v1/namespaces/plumber/deployments/web/scale"
            )["message"],
            "deployments.apps \"web\" is forbidden: User \"system:serviceaccount:plumber:plumber\" \
             cannot patch resource \"deployments/scale\" in API group \"apps\" in the namespace \"plumber\""
        );
        assert_eq!(
            status(
                "GET",
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/admin"
            )["message"],
            "clusterroles.rbac.authorization.k8s.io \"admin\" is forbidden: User \
             \"system:serviceaccount:plumber:plumber\" cannot get resource \"clusterroles\" in API \
             group \"rbac.authorization.k8s.io\" at the cluster scope"
        );
        let path = status("GET", "/logs");
        assert_eq!(
            path["message"],
            "forbidden: User \"system:serviceaccount:plumber:plumber\" cannot get path \"/logs\""
        );
        assert_eq!(path["details"], json!({}));
    }
}
