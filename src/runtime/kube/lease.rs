//! The `coordination.k8s.io` Lease that elects the one daemon replica that acts (SPEC §7).
//!
//! # Guarantees
//! Every write of the Lease is a replace carrying the `resourceVersion` this replica read
//! just before it (client-go's leader election does the same), so a write that was delayed
//! on its way (a stalled connection, a held request) and arrives after anyone else wrote is
//! refused with a conflict: a deposed holder's late renewal or release cannot move a lease
//! that has changed hands. (kube-lease-manager, used before, patches without a version: a
//! late renewal of the old holder made the new holder's lease look expired, and the old
//! holder took it back while the new one still acted. The stalled-holder test found it.)
//!
//! A replica holds the lease from the moment it *sent* a write that succeeded naming it,
//! for [`LeaseConfig::validity`]: less than the lease's duration. Another replica takes the
//! lease only after it has seen the Lease unchanged (the same `resourceVersion`) for the
//! duration, measured on its own clock from when it first saw that version; that version was
//! written after the holder sent it, so the holder stops acting `duration - validity` before
//! anyone else may start, whatever the clocks say.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease as LeaseObject, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::runtime::{Guard, Term};

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// This replica's name in the Lease (its pod's name).
    pub identity: String,
    /// How long a lease lasts without a renewal.
    pub duration: Duration,
    /// How long before it lapses the holder renews it.
    pub grace: Duration,
    /// How often this replica reads the Lease (to renew it, or to see whether it is free).
    pub check: Duration,
}

impl LeaseConfig {
    /// 30 s leases renewed 10 s before they lapse, read every second.
    pub fn new(name: &str, namespace: &str, identity: &str) -> Self {
        LeaseConfig {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(30),
            grace: Duration::from_secs(10),
            check: Duration::from_secs(1),
        }
    }

    /// How long after it sent a write that named it holder a replica acts: the lease's
    /// duration less one check (another replica's look at the Lease may come that late) and
    /// a margin for the clocks' rates.
    pub fn validity(&self) -> Duration {
        let margin = self.grace / 2;
        self.duration
            .saturating_sub(self.check)
            .saturating_sub(margin)
    }

    /// How long after its last successful write the holder renews.
    fn renew_after(&self) -> Duration {
        self.duration.saturating_sub(self.grace)
    }
}

#[derive(Default)]
struct State {
    /// When this replica sent its last write that succeeded naming it holder.
    confirmed: Mutex<Option<Instant>>,
    /// Counts the stretches of holding: the term held now ([`Lease::term`]).
    terms: AtomicU64,
    /// Set when the lease is given up: the elector stops and this replica never acts again.
    released: AtomicBool,
}

impl State {
    fn confirmed_within(&self, validity: Duration) -> Option<Instant> {
        self.confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .filter(|at| at.elapsed() < validity)
    }

    /// A write sent at `sent` named this replica holder: a new term unless it held the
    /// lease without a break up to then.
    fn confirm(&self, sent: Instant, validity: Duration) {
        let mut confirmed = self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let unbroken = confirmed.is_some_and(|at| sent.saturating_duration_since(at) < validity);
        if !unbroken {
            self.terms.fetch_add(1, Ordering::SeqCst);
        }
        *confirmed = Some(sent);
    }

    fn lose(&self) {
        *self
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// What this replica saw of the Lease: its version, and since when (on this replica's clock).
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    version: String,
    since: Instant,
}

/// What one look at the Lease decides.
#[derive(Debug, Clone, PartialEq)]
enum Decision {
    /// Write this spec, replacing the version read (renew or take over).
    Write(LeaseSpec),
    /// This replica holds the lease and need not renew it yet.
    Hold,
    /// Another replica holds it (or may still): wait.
    Leave,
}

/// Decides from the Lease's `spec` as read, how long it has been seen unchanged, and when
/// this replica last confirmed it held it (`None`: it does not know that it holds it).
fn decide(
    spec: Option<&LeaseSpec>,
    unchanged_for: Duration,
    confirmed_for: Option<Duration>,
    config: &LeaseConfig,
    now: Timestamp,
) -> Decision {
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty());
    let lasts = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(config.duration, Duration::from_secs);
    let seconds = i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX);
    let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
    let renewal = |spec: &LeaseSpec| LeaseSpec {
        renew_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(seconds),
        ..spec.clone()
    };
    match holder {
        // Held by this replica (or by its earlier process of the same name, which is gone:
        // a pod's name is not reused while it runs).
        Some(h) if h == config.identity => match (confirmed_for, spec) {
            (Some(age), _) if age < config.renew_after() => Decision::Hold,
            (_, Some(spec)) => Decision::Write(renewal(spec)),
            (_, None) => Decision::Write(taken(&config.identity, seconds, transitions, now)),
        },
        Some(_) if unchanged_for < lasts => Decision::Leave,
        // Free (given up) or lapsed: take it.
        _ => Decision::Write(taken(&config.identity, seconds, transitions + 1, now)),
    }
}

fn taken(identity: &str, seconds: i32, transitions: i32, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(seconds),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// Held (or sought) for as long as it lives; [`Lease::release`] gives it up for another
/// replica at once, dropping it lets it lapse.
pub struct Lease {
    state: Arc<State>,
    validity: Duration,
    elector: tokio::task::JoinHandle<()>,
    handle: tokio::runtime::Handle,
    api: Api<LeaseObject>,
    /// Where this replica's pod says whether it holds the lease ([`HOLDER_LABEL`]).
    pods: Api<Pod>,
    config: LeaseConfig,
}

impl Lease {
    /// Starts seeking the lease, on the tokio runtime of `handle`.
    pub fn seek(client: Client, handle: &tokio::runtime::Handle, config: LeaseConfig) -> Lease {
        let state = Arc::new(State::default());
        let api: Api<LeaseObject> = Api::namespaced(client.clone(), &config.namespace);
        let pods: Api<Pod> = Api::namespaced(client, &config.namespace);
        let elector = handle.spawn(elect(
            api.clone(),
            pods.clone(),
            config.clone(),
            state.clone(),
        ));
        Lease {
            state,
            validity: config.validity(),
            elector,
            handle: handle.clone(),
            api,
            pods,
            config,
        }
    }

    /// Whether this replica may act now.
    pub fn held(&self) -> bool {
        held(&self.state, self.validity)
    }

    /// [`Lease::held`], for the stores and runtimes that must not act without it.
    pub fn guard(&self) -> Arc<Guard> {
        let state = self.state.clone();
        let validity = self.validity;
        Arc::new(move || held(&state, validity))
    }

    /// The term of the lease held now, for the store that keeps what it wrote in one.
    pub fn term(&self) -> Arc<Term> {
        let state = self.state.clone();
        let validity = self.validity;
        Arc::new(move || held(&state, validity).then(|| state.terms.load(Ordering::SeqCst)))
    }

    /// Stops acting and gives the lease up (waits up to `timeout` for the API server), so
    /// another replica takes over without waiting for it to lapse. Call it from outside the
    /// tokio runtime.
    pub fn release(self, timeout: Duration) {
        let held = self.held();
        self.state.released.store(true, Ordering::SeqCst);
        self.state.lose();
        self.elector.abort();
        let (api, pods, config) = (self.api.clone(), self.pods.clone(), self.config.clone());
        let _ = self.handle.block_on(async move {
            tokio::time::timeout(timeout, async {
                if held {
                    give_up(&api, &config).await;
                }
                label(&pods, &config.identity, false).await;
            })
            .await
        });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.state.released.store(true, Ordering::SeqCst);
        self.state.lose();
        self.elector.abort();
    }
}

/// Reads the Lease every check and writes it when [`decide`] says so, until released.
async fn elect(api: Api<LeaseObject>, pods: Api<Pod>, config: LeaseConfig, state: Arc<State>) {
    let validity = config.validity();
    let mut seen: Option<Seen> = None;
    let mut labelled = None;
    let mut was_held = false;
    while !state.released.load(Ordering::SeqCst) {
        look(&api, &config, &state, &mut seen).await;
        let holds = held(&state, validity);
        if holds != was_held {
            tracing::info!(lease = %config.name, identity = %config.identity, holder = holds, "lease changed");
            was_held = holds;
        }
        if labelled != Some(holds) && label(&pods, &config.identity, holds).await {
            labelled = Some(holds);
        }
        tokio::time::sleep(config.check).await;
    }
}

/// One look at the Lease, and the write it calls for.
async fn look(
    api: &Api<LeaseObject>,
    config: &LeaseConfig,
    state: &State,
    seen: &mut Option<Seen>,
) {
    let validity = config.validity();
    // Sent no earlier than this: what a write that succeeds confirms.
    let sent = Instant::now();
    let lease = match api.get_opt(&config.name).await {
        Ok(lease) => lease,
        Err(error) => {
            tracing::debug!(%error, lease = %config.name, "cannot read the lease");
            return;
        }
    };
    let Some(lease) = lease else {
        // Missing (never made, or `kubectl delete lease`): whoever creates it holds it.
        let object = LeaseObject {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(taken(
                &config.identity,
                i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX),
                0,
                Timestamp::now(),
            )),
        };
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => state.confirm(sent, validity),
            Err(error) => {
                state.lose();
                tracing::debug!(%error, lease = %config.name, "cannot create the lease");
            }
        }
        return;
    };
    let version = lease.metadata.resource_version.clone().unwrap_or_default();
    // Seen from now on, not from when it was asked for: a read held up on its way may bring
    // a version written a moment ago.
    let since = match seen.as_ref() {
        Some(s) if s.version == version => s.since,
        _ => Instant::now(),
    };
    *seen = Some(Seen { version, since });
    let confirmed_for = state.confirmed_within(validity).map(|at| at.elapsed());
    let decision = decide(
        lease.spec.as_ref(),
        since.elapsed(),
        confirmed_for,
        config,
        Timestamp::now(),
    );
    match decision {
        Decision::Hold => {}
        Decision::Leave => state.lose(),
        Decision::Write(spec) => {
            let before = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty());
            let mut written = lease;
            written.spec = Some(spec);
            // The version read rides along: a write that arrives after anyone else's fails.
            match api
                .replace(&config.name, &PostParams::default(), &written)
                .await
            {
                Ok(_) => {
                    state.confirm(sent, validity);
                    match before {
                        None => {
                            tracing::info!(lease = %config.name, identity = %config.identity, "took the Lease, which named no holder (given up, or new)")
                        }
                        Some(holder) if holder != config.identity => {
                            tracing::info!(lease = %config.name, identity = %config.identity, %holder, "took the Lease over: unchanged for its duration")
                        }
                        Some(_) => {}
                    }
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::debug!(lease = %config.name, "the lease changed meanwhile");
                    state.lose();
                }
                Err(error) => {
                    tracing::debug!(%error, lease = %config.name, "cannot write the lease");
                }
            }
        }
    }
}

/// Empties the Lease's holder, unless someone wrote it since this replica last did.
async fn give_up(api: &Api<LeaseObject>, config: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&config.name).await else {
        return;
    };
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref());
    if holder != Some(config.identity.as_str()) {
        return;
    }
    lease.spec = Some(LeaseSpec {
        lease_transitions: lease.spec.as_ref().and_then(|s| s.lease_transitions),
        ..LeaseSpec::default()
    });
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => {
            tracing::info!(lease = %config.name, identity = %config.identity, "lease given up")
        }
        Err(error) => {
            tracing::warn!(%error, lease = %config.name, "cannot give the lease up; it lapses instead")
        }
    }
}

/// The label of the daemon's pods that says whether the pod holds the lease (`"true"`) or
/// not (`"false"`): the daemon's Service selects on it, so the page, the API and webhooks
/// reach the replica that acts (a standby's engine runs no cutover it could show).
pub const HOLDER_LABEL: &str = "plumber.dev/lease-holder";

/// Labels this replica's pod with whether it holds the lease; whether that is settled (done,
/// or there is no such pod: a daemon outside the cluster).
async fn label(pods: &Api<Pod>, pod: &str, holds: bool) -> bool {
    let patch = serde_json::json!({"metadata": {"labels": {HOLDER_LABEL: holds.to_string()}}});
    match pods
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(pod, holds, "labelled this replica's pod");
            true
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            tracing::debug!(pod, "no pod of this name: not labelling it");
            true
        }
        Err(error) => {
            tracing::warn!(%error, pod, holds, "cannot label this replica's pod; trying again");
            false
        }
    }
}

fn held(state: &State, validity: Duration) -> bool {
    !state.released.load(Ordering::SeqCst) && state.confirmed_within(validity).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LeaseConfig {
        LeaseConfig::new("plumber", "ns", "me")
    }

    fn held_by(holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(30),
            lease_transitions: Some(4),
            ..LeaseSpec::default()
        }
    }

    fn s(seconds: u64) -> Duration {
        Duration::from_secs(seconds)
    }

    fn holder_written(decision: &Decision) -> Option<(&str, i32)> {
        match decision {
            Decision::Write(spec) => Some((
                spec.holder_identity.as_deref().unwrap_or_default(),
                spec.lease_transitions.unwrap_or_default(),
            )),
            _ => None,
        }
    }

    #[test]
    fn another_s_lease_is_taken_only_once_seen_unchanged_for_its_duration() {
        let now = Timestamp::now();
        let other = held_by("other");
        assert_eq!(
            decide(Some(&other), s(29), None, &config(), now),
            Decision::Leave
        );
        let taking = decide(Some(&other), s(30), None, &config(), now);
        assert_eq!(
            holder_written(&taking),
            Some(("me", 5)),
            "a new holder: one more transition"
        );
        let free = LeaseSpec::default();
        assert_eq!(
            holder_written(&decide(Some(&free), s(0), None, &config(), now)),
            Some(("me", 1)),
            "a lease given up is taken at once"
        );
    }

    #[test]
    fn the_holder_renews_once_its_grace_begins_and_keeps_the_transitions() {
        let now = Timestamp::now();
        let mine = held_by("me");
        assert_eq!(
            decide(Some(&mine), s(0), Some(s(19)), &config(), now),
            Decision::Hold
        );
        assert_eq!(
            holder_written(&decide(Some(&mine), s(0), Some(s(20)), &config(), now)),
            Some(("me", 4))
        );
        // Named holder without a confirmed write of its own (a restarted process of the
        // same name): it renews before it acts.
        assert_eq!(
            holder_written(&decide(Some(&mine), s(0), None, &config(), now)),
            Some(("me", 4))
        );
    }

    /// A term ends whenever this replica could not have known it held the lease.
    #[test]
    fn a_new_term_begins_after_every_stretch_without_a_confirmed_write() {
        let state = State::default();
        let term = || state.terms.load(Ordering::SeqCst);
        let validity = s(25);
        let start = Instant::now();
        state.confirm(start, validity);
        assert_eq!(term(), 1);
        state.confirm(start + s(20), validity);
        assert_eq!(term(), 1, "renewed within the validity: the same term");
        state.lose();
        state.confirm(start + s(22), validity);
        assert_eq!(term(), 2, "lost in between");
        state.confirm(start + s(60), validity);
        assert_eq!(term(), 3, "no write confirmed for longer than the validity");
    }
}
