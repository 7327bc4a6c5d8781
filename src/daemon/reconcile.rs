//! One reconcile step of one topology: from what its record says runs to the desired
//! revision, by one engine action; and what status shows of it.

use std::sync::Arc;
use std::time::Instant;

use super::facts::Fact;
use super::status::{OutcomeLabels, TopologyLabel, WaitStatus};
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
    let _busy = context.threads.busy("a step of the cutover engine");
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
    context.store.apply(Fact::Delivery {
        topology: name.to_owned(),
        delivery,
    });
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
            context.store.apply(Fact::Waiting {
                topology: name.to_owned(),
                waits: waits
                    .into_iter()
                    .map(|w| WaitStatus {
                        action: w.action,
                        reason: w.reason,
                        failures: w.failures,
                    })
                    .collect(),
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
            context.store.apply(Fact::Started {
                topology: name.to_owned(),
                from: from.map(str::to_owned),
                to: to.to_owned(),
                at: cutover::now(),
            });
        }
        Event::Action {
            done,
            remaining,
            action,
        } => {
            metrics.cutover_actions.get_or_create(&label).inc();
            context.store.apply(Fact::Acted {
                topology: name.to_owned(),
                done,
                remaining,
                action: cutover::describe(action),
            });
        }
        Event::Progressed { .. } => {}
        Event::Remaining { moving, actions } => context.store.apply(Fact::Remaining {
            topology: name.to_owned(),
            from: moving.from.clone(),
            to: moving.to.clone(),
            started_at: moving.started_at,
            done: moving.done,
            left: actions.to_vec(),
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
            context.store.apply(Fact::Settled {
                topology: name.to_owned(),
                commit: to.to_owned(),
            });
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

/// Actions as an Event's note lists them: as many as fit its 1,000 characters, then how many
/// more.
fn listed(actions: &[String]) -> String {
    const ROOM: usize = 900;
    let mut out = String::new();
    for (shown, action) in actions.iter().enumerate() {
        if !out.is_empty() && out.len() + action.len() > ROOM {
            out.push_str(&format!("; and {} more", actions.len() - shown));
            break;
        }
        if !out.is_empty() {
            out.push_str("; ");
        }
        out.push_str(action);
    }
    out
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
        // One Event per batch of actions that took effect, not per action: a first deploy
        // of 20 steps is two Events, not 45 (each is a request to the API server).
        Event::Progressed {
            actions,
            done,
            left,
        } => CutoverEvent {
            reason: "CutoverProgress",
            note: format!("{} ({done} done, {left} left)", listed(actions)),
        },
        // A settle that moved nothing is no cutover phase (1,000 of them per commit).
        Event::Finished { moved: false, .. } | Event::Action { .. } | Event::Remaining { .. } => {
            return None;
        }
        Event::Finished { to, .. } => CutoverEvent {
            reason: "CutoverFinished",
            note: format!("runs {}", short(to)),
        },
    })
}
