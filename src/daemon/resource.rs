//! The daemon's status as `kubectl get topologies` shows it: each topology's entry of the
//! status document projected onto its Topology resource, and the cutover's steps as Events.

use super::{CutoverEvent, StatusSink, status};
use crate::runtime::kube::crd::TopologyStatus;
use crate::store::topology::TopologyStore;

impl StatusSink for TopologyStore {
    fn publish(&self, topology: &status::TopologyStatus, repository: Option<&status::LastError>) {
        if let Err(error) = self.publish_status(&topology.name, observed(topology, repository)) {
            tracing::warn!(topology = %topology.name, %error, "cannot publish the topology's status");
        }
    }

    fn event(&self, topology: &str, event: &CutoverEvent) {
        if let Err(error) = self.record_event(topology, event.reason, &event.note) {
            tracing::warn!(topology, %error, "cannot record an event of the cutover");
        }
    }
}

/// The daemon's status of a topology as its Topology resource shows it.
fn observed(
    topology: &status::TopologyStatus,
    repository: Option<&status::LastError>,
) -> TopologyStatus {
    use crate::runtime::kube::crd::{
        CutoverStatus, Delivery, LastError, Phase, StepKind, StepState, StepStatus, WaitStatus,
    };
    use status::{Kind, Phase as DaemonPhase, StepState as DaemonState};
    let steps: Vec<StepStatus> = topology
        .steps
        .iter()
        .map(|s| StepStatus {
            name: s.name.clone(),
            kind: Some(match s.kind {
                Kind::Source => StepKind::Source,
                Kind::Processor => StepKind::Processor,
                Kind::Sink => StepKind::Sink,
            }),
            state: Some(match s.state {
                DaemonState::External => StepState::External,
                DaemonState::Running => StepState::Running,
                DaemonState::Starting => StepState::Starting,
                // Pending: during a move, a processor whose new life has yet to start.
                DaemonState::Stopped | DaemonState::Pending => StepState::Stopped,
            }),
            identity: s.identity.clone(),
            group: s.group.clone(),
            replicas: None,
            running: None,
            lag: s.lag,
        })
        .collect();
    let processors = steps
        .iter()
        .filter(|s| s.kind == Some(StepKind::Processor))
        .count();
    let ready = steps
        .iter()
        .filter(|s| s.kind == Some(StepKind::Processor) && s.state == Some(StepState::Running))
        .count();
    let lags: Vec<i64> = steps.iter().filter_map(|s| s.lag).collect();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    TopologyStatus {
        observed_generation: None,
        commit: topology.commit.clone(),
        short_commit: topology
            .commit
            .as_ref()
            .map(|c| c.chars().take(12).collect()),
        phase: Some(match topology.phase {
            DaemonPhase::Idle => Phase::Idle,
            DaemonPhase::Cutover => Phase::Cutover,
            DaemonPhase::Error => Phase::Error,
        }),
        steps_ready: Some(format!("{ready}/{processors}")),
        lag: (!lags.is_empty()).then(|| lags.iter().sum()),
        delivery: topology.delivery.map(|delivery| match delivery {
            status::Delivery::ExactlyOnce => Delivery::ExactlyOnce,
            status::Delivery::AtLeastOnce => Delivery::AtLeastOnce,
        }),
        steps,
        cutover: topology.cutover.as_ref().map(|c| CutoverStatus {
            from: None,
            to: Some(c.to.clone()),
            started: None,
            done: Some(count(c.done)),
            remaining: Some(count(c.remaining)),
            current: c.current.clone(),
            waiting: c
                .waiting
                .iter()
                .map(|w| WaitStatus {
                    action: w.action.clone(),
                    reason: w.reason.clone(),
                    failures: i32::try_from(w.failures).unwrap_or(i32::MAX),
                })
                .collect(),
        }),
        last_error: match (&topology.last_error, repository) {
            (Some(message), _) => Some(LastError {
                message: message.clone(),
                ..LastError::default()
            }),
            (None, Some(error)) => {
                let place = error.place.as_ref().map(|p| &p.diagnostic);
                Some(LastError {
                    commit: error.commit.clone(),
                    code: place.map(|d| d.code.to_string()),
                    file: place.map(|d| d.file.clone()),
                    line: place
                        .and_then(|d| d.line)
                        .and_then(|n| i32::try_from(n).ok()),
                    column: place
                        .and_then(|d| d.column)
                        .and_then(|n| i32::try_from(n).ok()),
                    message: error.message.clone(),
                })
            }
            (None, None) => None,
        },
        conditions: Vec::new(),
        record: None,
    }
}
