//! One reconcile step of one topology: from what its record says runs to the desired
//! revision, by one engine action; and what status shows of it.

use std::sync::Arc;
use std::time::Instant;

use super::status::{
    ActionState, ActionStatus, CutoverStatus, OutcomeLabels, Phase, TopologyLabel, WaitStatus,
};
use super::{AdminUse, Context, CutoverEvent, Error, Revision};
use crate::cutover::{self, Advance, Engine, Event, Target, Waits};
use crate::runtime::{Delivery, Settings};

/// What a step did, for the worker's scheduling.
pub(super) enum Step {
    /// An action took effect: go on at once.
    Progressed,
    /// Nothing left until the desired revision changes.
    Settled,
    /// The topology is gone and nothing of it runs.
    Removed,
    /// Everything left waits; look again at the instant given.
    Waiting(Instant),
}

pub(super) fn reconcile(
    name: &str,
    context: &Arc<Context>,
    desired: &Revision,
    waits: &mut Waits,
) -> Result<Step, Error> {
    let topology = desired.topology(name);
    let cluster = topology.map(|t| context.cluster(desired, t)).transpose()?;
    let bootstrap = match &cluster {
        Some(cluster) => cluster.bootstrap.clone(),
        // Gone from the repository: its lives and topics are where its record says.
        None => match context.records.load(name)?.bootstrap {
            Some(bootstrap) => bootstrap,
            // Never deployed anywhere: nothing to retire.
            None => return Ok(Step::Removed),
        },
    };
    let admin = context.admin(AdminUse::Cutover, &bootstrap)?;
    let delivery = context.delivery(&bootstrap, admin.as_ref())?;
    context
        .store
        .topology(name, |t| t.delivery = Some(delivery.as_str().to_owned()));
    context
        .store
        .metrics
        .exactly_once
        .get_or_create(&TopologyLabel {
            topology: name.to_owned(),
        })
        .set(i64::from(delivery == Delivery::ExactlyOnce));
    let target = Target {
        commit: &desired.commit,
        topology,
        cluster: cluster.as_ref(),
        settings: Settings {
            delivery: Some(delivery),
            record_timeout: Some(context.config.record_timeout.as_secs().max(1)),
            assignor: Some(context.config.assignor),
        },
    };
    let on_event = |event: Event<'_>| show(name, context, event);
    let engine = Engine {
        topology: name,
        admin: admin.as_ref(),
        runtime: context.runtime.as_ref(),
        store: context.records.as_ref(),
        config: &context.config.cutover,
        on_event: &on_event,
    };
    Ok(match engine.advance(&target, waits)? {
        Advance::Progressed => Step::Progressed,
        Advance::Settled { .. } => Step::Settled,
        Advance::Removed => Step::Removed,
        Advance::Waiting { until, waits } => {
            context.store.topology(name, |t| {
                t.last_error = waits
                    .iter()
                    .find(|w| w.failures > 0)
                    .map(|w| format!("{}: {}", w.action, w.reason));
                if let Some(c) = &mut t.cutover {
                    c.waiting = waits
                        .into_iter()
                        .map(|w| WaitStatus {
                            action: w.action,
                            reason: w.reason,
                            failures: w.failures,
                        })
                        .collect();
                }
            });
            Step::Waiting(until)
        }
    })
}

/// Status and metrics of the engine's events.
fn show(name: &str, context: &Context, event: Event<'_>) {
    // A settle that moved nothing is no cutover phase: no Event (1,000 of them per commit).
    if let Some(sink) = &context.status_sink
        && let Some(described) = describe_event(&event)
    {
        sink.event(name, &described);
    }
    let label = TopologyLabel {
        topology: name.to_owned(),
    };
    let metrics = &context.store.metrics;
    match event {
        Event::Started { from, to, .. } => {
            metrics.in_cutover.get_or_create(&label).set(1);
            context.store.topology(name, |t| {
                t.phase = Phase::Cutover;
                t.commit = from.map(str::to_owned);
                t.cutover = Some(CutoverStatus {
                    from: from.map(str::to_owned),
                    to: to.to_owned(),
                    started_at: Some(cutover::now()),
                    ..CutoverStatus::default()
                });
            });
        }
        Event::Action {
            done,
            remaining,
            action,
        } => {
            metrics.cutover_actions.get_or_create(&label).inc();
            context.store.topology(name, |t| {
                t.phase = Phase::Cutover;
                let c = t.cutover.get_or_insert_with(CutoverStatus::default);
                c.done = done;
                c.remaining = remaining;
                let current = cutover::describe(action);
                for a in &mut c.actions {
                    if a.action == current {
                        a.state = ActionState::Running;
                        a.reason = None;
                    }
                }
                c.current = Some(current);
            });
        }
        Event::Remaining { moving, actions } => context.store.topology(name, |t| {
            t.phase = Phase::Cutover;
            let c = t.cutover.get_or_insert_with(CutoverStatus::default);
            c.from.clone_from(&moving.from);
            c.to.clone_from(&moving.to);
            c.started_at = Some(moving.started_at);
            c.done = moving.done;
            c.remaining = actions.len();
            c.actions = shown_actions(&c.actions, actions);
        }),
        Event::Finished { to, started_at, .. } => {
            metrics.in_cutover.get_or_create(&label).set(0);
            if let Some(started_at) = started_at {
                metrics
                    .cutover_seconds
                    .get_or_create(&label)
                    .observe(cutover::now().saturating_sub(started_at) as f64);
                metrics
                    .cutovers
                    .get_or_create(&OutcomeLabels {
                        topology: name.to_owned(),
                        outcome: "applied".into(),
                    })
                    .inc();
                tracing::info!(topology = name, commit = to, "cutover finished");
            }
            context.store.topology(name, |t| {
                t.phase = Phase::Idle;
                t.commit = Some(to.to_owned());
                t.cutover = None;
                t.last_error = None;
            });
            context.store.clear_error_of(name);
            // What runs changed: the plans of the watched refs start from it.
            context.plans.running_changed();
            if started_at.is_some() {
                show_history(name, to, context);
            }
        }
    }
}

/// A finished move's history entry, for the event stream (the web page adds it).
fn show_history(name: &str, to: &str, context: &Context) {
    match context.records.history() {
        Ok(entries) => {
            let newest = entries
                .into_iter()
                .rev()
                .find(|e| e.topology == name && e.to == to);
            if let Some(shown) = newest.and_then(|e| context.shown_history(vec![e]).pop()) {
                context.events.publish("history", &shown);
            }
        }
        Err(error) => tracing::debug!(%error, topology = name, "cannot read the history"),
    }
}

/// Action by action: those shown before that are no longer left are done (in the order they
/// were shown), then what is left.
fn shown_actions(before: &[ActionStatus], left: &[cutover::Outlook]) -> Vec<ActionStatus> {
    let mut shown: Vec<ActionStatus> = before
        .iter()
        .filter(|a| a.state == ActionState::Done || !left.iter().any(|l| l.action == a.action))
        .map(|a| ActionStatus {
            state: ActionState::Done,
            reason: None,
            ..a.clone()
        })
        .collect();
    shown.extend(left.iter().map(|l| {
        let (state, reason) = match (&l.waiting, &l.blocked_by) {
            (Some(reason), _) => (ActionState::Waiting, Some(reason.clone())),
            (None, Some(blocker)) => (ActionState::Pending, Some(format!("waits for {blocker}"))),
            (None, None) => (ActionState::Pending, None),
        };
        ActionStatus {
            action: l.action.clone(),
            state,
            reason,
            failures: l.failures,
        }
    }));
    shown
}

/// A cutover's event as the cluster's Events show it (`None`: it is no cutover phase).
fn describe_event(event: &Event<'_>) -> Option<CutoverEvent> {
    let short = |commit: &str| commit.chars().take(12).collect::<String>();
    Some(match event {
        Event::Started {
            from,
            to,
            superseded,
        } => CutoverEvent {
            reason: "CutoverStarted",
            note: match (from, superseded) {
                (_, Some(older)) => format!(
                    "moving to {} instead of {}, from where the move stands",
                    short(to),
                    short(older)
                ),
                (Some(from), None) => format!("moving from {} to {}", short(from), short(to)),
                (None, None) => format!("deploying {}", short(to)),
            },
        },
        Event::Action {
            done,
            remaining,
            action,
        } => CutoverEvent {
            reason: "CutoverAction",
            note: format!(
                "{} ({} done, {} left)",
                cutover::describe(action),
                done,
                remaining
            ),
        },
        // A settle that moved nothing is no cutover phase (1,000 of them per commit).
        Event::Finished { moved: false, .. } | Event::Remaining { .. } => return None,
        Event::Finished { to, .. } => CutoverEvent {
            reason: "CutoverFinished",
            note: format!("runs {}", short(to)),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outlook(action: &str, waiting: Option<&str>, blocked_by: Option<&str>) -> cutover::Outlook {
        cutover::Outlook {
            action: action.into(),
            waiting: waiting.map(str::to_owned),
            failures: u32::from(waiting.is_some()),
            blocked_by: blocked_by.map(str::to_owned),
        }
    }

    #[test]
    fn actions_shown_before_and_no_longer_left_are_done_in_the_order_shown() {
        let first = shown_actions(
            &[],
            &[
                outlook("start b", None, None),
                outlook("drain a", Some("lag 4"), None),
                outlook("stop a", None, Some("drain a")),
            ],
        );
        let states: Vec<_> = first
            .iter()
            .map(|a| (a.state, a.reason.as_deref()))
            .collect();
        assert_eq!(
            states,
            [
                (ActionState::Pending, None),
                (ActionState::Waiting, Some("lag 4")),
                (ActionState::Pending, Some("waits for drain a")),
            ]
        );
        // `start b` took effect, then `drain a`: both done, in the order they were shown.
        let second = shown_actions(&first, &[outlook("stop a", None, None)]);
        let third = shown_actions(&second, &[]);
        let shown: Vec<_> = third.iter().map(|a| (a.action.as_str(), a.state)).collect();
        assert_eq!(
            shown,
            [
                ("start b", ActionState::Done),
                ("drain a", ActionState::Done),
                ("stop a", ActionState::Done),
            ]
        );
        assert!(third.iter().all(|a| a.reason.is_none()));
    }
}
