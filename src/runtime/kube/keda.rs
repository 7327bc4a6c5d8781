//! KEDA's `ScaledObject` and `TriggerAuthentication` (keda.sh/v1alpha1), typed with the
//! fields Plumber sets. KEDA owns their definitions: tests check rendered objects against
//! KEDA's own CRD schemas, and no CRD is generated from these types.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Scales a processor's StatefulSet on the lag of its consumer group.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "keda.sh",
    version = "v1alpha1",
    kind = "ScaledObject",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ScaledObjectSpec {
    pub scale_target_ref: ScaleTargetRef,
    pub min_replica_count: i32,
    pub max_replica_count: i32,
    /// Seconds between KEDA's looks at the lag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub polling_interval: Option<i32>,
    /// Seconds after the last active trigger before scaling to `minReplicaCount` (0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_period: Option<i32>,
    pub triggers: Vec<ScaleTrigger>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTargetRef {
    /// `apps/v1` (KEDA's default); set with `kind` for anything but a Deployment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `Deployment` when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleTrigger {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authentication_ref: Option<AuthenticationRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthenticationRef {
    pub name: String,
}

/// Where a trigger's secret parameters come from.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "keda.sh",
    version = "v1alpha1",
    kind = "TriggerAuthentication",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct TriggerAuthenticationSpec {
    pub secret_target_ref: Vec<SecretTargetRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecretTargetRef {
    /// The trigger's parameter (`username`, `password`, `ca`, …).
    pub parameter: String,
    /// The Secret.
    pub name: String,
    pub key: String,
}
