//! The `coordination.k8s.io` Lease that elects the one daemon replica that acts (SPEC §7),
//! with kube-lease-manager.
//!
//! # Guarantees
//! A replica counts as holding the lease only while kube-lease-manager says it is the holder
//! **and** it has itself seen, within [`LeaseConfig::validity`], the Lease name it as holder
//! with a renew time it had not seen before. kube-lease-manager keeps reporting "leader" when
//! it cannot reach the API server (it logs the error and backs off); the second condition
//! makes a cut-off replica stop acting `duration - validity` before another one can take the
//! lease over, measured on its own clock only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;

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
    /// How often this replica reads the Lease to confirm it still holds it.
    pub check: Duration,
}

impl LeaseConfig {
    /// 30 s leases renewed 10 s before they lapse, confirmed every second.
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

    /// How long after it saw its own renewal a replica acts: the lease's duration less one
    /// check (the renewal happened before it was seen) and a margin for the other replicas'
    /// clocks.
    pub fn validity(&self) -> Duration {
        let margin = self.grace / 2;
        self.duration
            .saturating_sub(self.check)
            .saturating_sub(margin)
    }
}

#[derive(Default)]
struct State {
    /// What kube-lease-manager last said.
    elected: AtomicBool,
    /// Counts the times this replica was elected: the term it holds ([`Lease::term`]).
    terms: std::sync::atomic::AtomicU64,
    /// When this replica last saw a renewal of its own, and the renew time it saw.
    confirmed: Mutex<Option<(Instant, String)>>,
    /// The Lease object was not there at the last look (someone deleted it).
    missing: AtomicBool,
    /// The Lease named no holder at the last look: its holder gave it up (a rolling
    /// restart). kube-lease-manager's standby sleeps until the lock it last saw would have
    /// lapsed (up to the lease's duration); seeking it anew takes it within a check.
    unheld: AtomicBool,
}

/// Held (or sought) for as long as it lives; [`Lease::release`] gives it up for another
/// replica at once, dropping it lets it lapse.
pub struct Lease {
    state: Arc<State>,
    validity: Duration,
    stop: tokio::sync::watch::Sender<bool>,
    manager: Option<tokio::task::JoinHandle<()>>,
    confirmer: tokio::task::JoinHandle<()>,
    handle: tokio::runtime::Handle,
    /// Where this replica's pod says whether it holds the lease ([`HOLDER_LABEL`]).
    pods: Api<Pod>,
    identity: String,
}

impl Lease {
    /// Starts seeking the lease, on the tokio runtime of `handle`.
    pub fn seek(client: Client, handle: &tokio::runtime::Handle, config: LeaseConfig) -> Lease {
        let state = Arc::new(State::default());
        let validity = config.validity();
        let (stop, mut stopping) = tokio::sync::watch::channel(false);
        let duration = config.duration.as_secs().max(2);
        let grace = config.grace.as_secs().clamp(1, duration - 1);
        let manager = {
            let client = client.clone();
            let config = config.clone();
            let state = state.clone();
            handle.spawn(async move {
                // One manager per life of the Lease object: kube-lease-manager creates the
                // Lease when it starts, but a Lease deleted later (`kubectl delete lease`)
                // it only reports as missing, forever; no replica would act again.
                loop {
                    let built = LeaseManagerBuilder::new(client.clone(), &config.name)
                        .with_namespace(&config.namespace)
                        .with_identity(&config.identity)
                        .with_duration(duration)
                        .with_grace(grace)
                        .build()
                        .await;
                    let manager = match built {
                        Ok(manager) => manager,
                        Err(error) => {
                            tracing::error!(%error, lease = %config.name, "cannot seek the lease; trying again");
                            tokio::select! {
                                _ = tokio::time::sleep(config.grace) => continue,
                                _ = stopping.changed() => return,
                            }
                        }
                    };
                    let (mut elected, task) = manager.watch().await;
                    let again = loop {
                        tokio::select! {
                            changed = elected.changed() => {
                                if changed.is_err() {
                                    break true;
                                }
                                let now = *elected.borrow_and_update();
                                if now && !state.elected.load(Ordering::SeqCst) {
                                    state.terms.fetch_add(1, Ordering::SeqCst);
                                }
                                state.elected.store(now, Ordering::SeqCst);
                                tracing::info!(lease = %config.name, identity = %config.identity, holder = now, "lease changed");
                            }
                            _ = stopping.changed() => break false,
                            _ = tokio::time::sleep(config.check) => {
                                if state.missing.load(Ordering::SeqCst) {
                                    tracing::warn!(lease = %config.name, "the Lease is gone; seeking it anew");
                                    break true;
                                }
                                if state.unheld.load(Ordering::SeqCst)
                                    && !state.elected.load(Ordering::SeqCst)
                                {
                                    tracing::info!(lease = %config.name, identity = %config.identity, "the Lease was given up; seeking it now");
                                    break true;
                                }
                            }
                        }
                    };
                    state.elected.store(false, Ordering::SeqCst);
                    // Closing the channel makes the manager release the lease and end.
                    drop(elected);
                    if !again {
                        let _ = task.await;
                        return;
                    }
                    task.abort();
                    state.missing.store(false, Ordering::SeqCst);
                    state.unheld.store(false, Ordering::SeqCst);
                    tokio::select! {
                        _ = tokio::time::sleep(config.check) => {}
                        _ = stopping.changed() => return,
                    }
                }
            })
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
        let confirmer = {
            let state = state.clone();
            let pods = pods.clone();
            let identity = config.identity.clone();
            let config = config.clone();
            handle.spawn(async move {
                let api: Api<LeaseObject> = Api::namespaced(client, &config.namespace);
                let mut labelled = None;
                loop {
                    match api.get_opt(&config.name).await {
                        Ok(lease) => {
                            state.missing.store(lease.is_none(), Ordering::SeqCst);
                            let unheld =
                                lease
                                    .as_ref()
                                    .and_then(|l| l.spec.as_ref())
                                    .is_some_and(|s| {
                                        s.holder_identity.as_deref().is_none_or(str::is_empty)
                                    });
                            state.unheld.store(unheld, Ordering::SeqCst);
                            confirm(
                                &state,
                                lease.as_ref(),
                                &config.identity,
                                validity,
                                Instant::now(),
                            )
                        }
                        Err(error) => {
                            tracing::debug!(%error, "cannot read the lease; not confirming it")
                        }
                    }
                    let holds = held(&state, validity);
                    if labelled != Some(holds) && label(&pods, &identity, holds).await {
                        labelled = Some(holds);
                    }
                    tokio::time::sleep(config.check).await;
                }
            })
        };
        Lease {
            state,
            validity,
            stop,
            manager: Some(manager),
            confirmer,
            handle: handle.clone(),
            pods,
            identity: config.identity,
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
    pub fn release(mut self, timeout: Duration) {
        self.state.elected.store(false, Ordering::SeqCst);
        let _ = self.stop.send(true);
        self.confirmer.abort();
        let (pods, identity) = (self.pods.clone(), self.identity.clone());
        let _ = self.handle.block_on(async {
            tokio::time::timeout(timeout, label(&pods, &identity, false)).await
        });
        if let Some(manager) = self.manager.take() {
            let _ = self
                .handle
                .block_on(async { tokio::time::timeout(timeout, manager).await });
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.state.elected.store(false, Ordering::SeqCst);
        let _ = self.stop.send(true);
        self.confirmer.abort();
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
    state.elected.load(Ordering::SeqCst)
        && state
            .confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < validity)
}

/// Takes note of a renewal of this replica's lease, or forgets the last one when the Lease
/// names another holder.
fn confirm(
    state: &State,
    lease: Option<&LeaseObject>,
    identity: &str,
    validity: Duration,
    now: Instant,
) {
    let spec = lease.and_then(|l| l.spec.as_ref());
    let holder = spec.and_then(|s| s.holder_identity.as_deref());
    let mut confirmed = state
        .confirmed
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if holder != Some(identity) {
        *confirmed = None;
        return;
    }
    let renewed = spec
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| format!("{:?}", t.0))
        .unwrap_or_default();
    if confirmed.as_ref().is_none_or(|(_, seen)| *seen != renewed) {
        // Confirmed after a stretch without (never, another holder, or too long ago to act
        // on): a new term. Someone else may have written in between, whatever
        // kube-lease-manager says.
        if confirmed
            .as_ref()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= validity)
        {
            state.terms.fetch_add(1, Ordering::SeqCst);
        }
        *confirmed = Some((now, renewed));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(holder: &str, renewed_at_s: i64) -> LeaseObject {
        LeaseObject {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_second(renewed_at_s).unwrap_or_default(),
                )),
                ..LeaseSpec::default()
            }),
            ..LeaseObject::default()
        }
    }

    /// Nobody else writes during one term: a term ends whenever this replica could not have
    /// known it held the lease (another holder, or no renewal seen for `validity`).
    #[test]
    fn a_new_term_begins_after_every_stretch_without_a_confirmed_renewal() {
        let state = State::default();
        let term = || state.terms.load(Ordering::SeqCst);
        let validity = Duration::from_secs(25);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        confirm(&state, Some(&lease("me", 1)), "me", validity, at(0));
        assert_eq!(term(), 1);
        confirm(&state, Some(&lease("me", 2)), "me", validity, at(20));
        assert_eq!(term(), 1, "renewed within the validity: the same term");
        confirm(&state, Some(&lease("other", 3)), "me", validity, at(21));
        confirm(&state, Some(&lease("me", 4)), "me", validity, at(22));
        assert_eq!(term(), 2, "held by another in between");
        confirm(&state, Some(&lease("me", 5)), "me", validity, at(60));
        assert_eq!(term(), 3, "no renewal seen for longer than the validity");
    }
}
