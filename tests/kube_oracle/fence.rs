//! A deposed lease holder writes nothing more: the lease is taken from the holder while one
//! of its actions is between two writes (the API server holds the first), and no further
//! object of that action reaches the API server. Once the lease comes back the cutover ends
//! as if nothing happened. And with two replicas: the holder's calls stall until its lease
//! lapses and the other takes over; the deposed one writes nothing after.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::coordination::v1::Lease;

use super::*;

/// A write of one of a processor's objects (not the Lease, not a Topology's status).
pub(super) fn processor_write(r: &RecordedRequest) -> bool {
    r.method != "GET"
        && [
            "/statefulsets/",
            "/scaledobjects/",
            "/triggerauthentications/",
        ]
        .iter()
        .any(|kind| r.path.contains(kind))
}

#[test]
fn a_holder_deposed_between_two_writes_of_an_action_makes_no_more() {
    let scratch = Scratch::new();
    let world = World::new("kube-fence");
    let fake = cluster();
    let kubelet = Kubelet::start(&fake, NS, &processor_binary(), &scratch.path("pods"));
    let holder = Replica::start(&fake, &world, "plumber-0", &scratch.path("plumber-0"));
    wait_until("plumber-0 holds the lease", PATIENCE, || {
        holder.holds_lease()
    });
    let mut revisions = vec![first()];
    let r1 = world.commit("first", &revisions[0]);
    wait_applied(&fake, r1);
    let load = world.start_load(100);
    load.wait_for(200);

    // Injected: the API server holds the first object written for R2 (a StatefulSet of a new
    // life; its ScaledObject comes next, in the same action).
    let taken = AtomicBool::new(false);
    let hold = fake.hold(move |r| processor_write(r) && !taken.swap(true, Ordering::SeqCst));
    let next = revisions[0].clone().replace("a", 2);
    let r2 = world.commit("a v2", &next);
    revisions.push(next);
    wait_until("the first write of R2 is held", PATIENCE, || {
        hold.held() == 1
    });

    // Injected: the lease changes hands meanwhile (the holder's renewals were cut off and
    // another replica took it): the Lease names someone else.
    fake.patch::<Lease>(
        NS,
        "plumber",
        serde_json::json!({"spec": {"holderIdentity": "elsewhere"}}),
    );
    wait_until("plumber-0 knows it lost the lease", PATIENCE, || {
        !holder.holds_lease()
    });
    let held_at = fake
        .requests()
        .iter()
        .filter(|r| processor_write(r))
        .count();
    let held = fake
        .requests()
        .into_iter()
        // Still unanswered: the held one.
        .find(|r| processor_write(r) && r.status.is_none())
        .map(|r| r.path.rsplit('/').next().unwrap_or_default().to_owned())
        .unwrap();
    drop(hold);
    // The held write was sent while plumber-0 held the lease: it lands. The next one of the
    // same action (its ScaledObject, named after the life's group) is refused before it is
    // sent (the runtime says so in the log).
    wait_until("the held StatefulSet lands", PATIENCE, || {
        workloads(&fake)
            .keys()
            .any(|group| workload_name(group) == held)
    });
    let group = workloads(&fake)
        .into_keys()
        .find(|group| workload_name(group) == held)
        .unwrap();
    wait_until("the action's next write is refused", PATIENCE, || {
        std::fs::read_to_string(daemon_log()).is_ok_and(|log| {
            log.lines().any(|l| {
                l.contains("not written: this replica no longer holds the lease")
                    && l.contains(&group)
            })
        })
    });
    let writes: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| processor_write(r))
        .skip(held_at)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(writes, Vec::<String>::new(), "a deposed holder wrote");

    // The lease comes back (the other holder's renewals stopped, plumber-0's took over):
    // the cutover ends exactly once.
    fake.patch::<Lease>(
        NS,
        "plumber",
        serde_json::json!({"spec": {"holderIdentity": "plumber-0"}}),
    );
    wait_until("plumber-0 holds the lease again", PATIENCE, || {
        holder.holds_lease()
    });
    wait_applied(&fake, r2);
    let (sent, final_from) = load.finish(200);
    world.assert_oracle(&revisions, sent, final_from);
    assert_runs(&fake, &kubelet, &world, &revisions[1]);
    holder.stop();
    drop(scratch);
}

/// `kubectl delete lease plumber`: the holder seeks the lease anew, creates the Lease again
/// and acts on.
#[test]
fn a_deleted_lease_is_created_again_and_held() {
    let scratch = Scratch::new();
    let world = World::new("kube-lease-deleted");
    let fake = cluster();
    let holder = Replica::start(&fake, &world, "plumber-0", &scratch.path("plumber-0"));
    wait_until("plumber-0 holds the lease", PATIENCE, || {
        holder.holds_lease()
    });
    let before = fake.get::<Lease>(NS, "plumber").unwrap().metadata.uid;
    assert!(fake.delete::<Lease>(NS, "plumber"));
    wait_until(
        "a new Lease names plumber-0, which holds it",
        PATIENCE,
        || {
            fake.get::<Lease>(NS, "plumber").is_some_and(|lease| {
                lease.metadata.uid != before
                    && lease.spec.and_then(|s| s.holder_identity).as_deref() == Some("plumber-0")
            }) && holder.holds_lease()
        },
    );
    holder.stop();
    drop(scratch);
}

/// Whether `r` was sent by replica `name`.
pub(super) fn sent_by(r: &RecordedRequest, name: &str) -> bool {
    r.client.as_deref() == Some(name)
}

/// A write that only a lease holder may make: anything but a read, the Lease itself (how a
/// replica learns it lost it) and a label on a daemon pod (the Service's holder label,
/// which a deposed replica sets to "false").
pub(super) fn holder_write(r: &RecordedRequest) -> bool {
    !matches!(r.verb(), Verb::Get | Verb::List | Verb::Watch)
        && r.resource() != Some("leases")
        && r.resource() != Some("pods")
}

/// The lease holder's API calls stall in the middle of a cutover (from its first write of
/// R2 on, the API server holds every request it sends, renewals included), so its lease
/// lapses and the standby takes over and finishes the cutover. When the stalled calls are
/// let go, the deposed replica makes no write: every request it sends after the takeover is
/// recorded and checked. Nothing lost, nothing duplicated.
#[test]
fn a_holder_whose_calls_stall_past_its_lease_writes_nothing_after_the_takeover() {
    let mut t = Takeover::new("kube-stall");
    let stalled = Arc::new(AtomicBool::new(false));
    let hold = {
        let stalled = stalled.clone();
        t.fake.hold(move |r| {
            sent_by(r, "plumber-0")
                && (stalled.load(Ordering::SeqCst)
                    || (processor_write(r) && !stalled.swap(true, Ordering::SeqCst)))
        })
    };
    t.replace_a();
    wait_until(
        "plumber-0's calls stall at its first write of R2",
        PATIENCE,
        || stalled.load(Ordering::SeqCst),
    );
    wait_until("plumber-1 takes the lease over", PATIENCE, || {
        t.standby.holds_lease()
    });
    let takeover = t.fake.requests().len();
    assert!(
        hold.held() > 0,
        "plumber-0 was inside a held call when plumber-1 took over"
    );
    wait_applied(&t.fake, t.commits[1]);

    // The stalled calls are answered now (the held write was sent while plumber-0 held the
    // lease and lands); plumber-0 learns it lost the lease and writes nothing more.
    drop(hold);
    let holder = t.holder.take().unwrap();
    wait_until("plumber-0 knows it lost the lease", PATIENCE, || {
        !holder.holds_lease()
    });
    wait_until("plumber-0's stalled calls are answered", PATIENCE, || {
        t.fake
            .requests()
            .iter()
            .all(|r| !sent_by(r, "plumber-0") || r.status.is_some() || r.verb() == Verb::Watch)
    });
    // Under load, long enough for plumber-0 to act on what its calls answered.
    let load = t.load.as_ref().unwrap();
    load.wait_for(load.sent() + 300);
    let after: Vec<String> = t
        .fake
        .requests()
        .iter()
        .skip(takeover)
        .filter(|r| sent_by(r, "plumber-0") && holder_write(r))
        .map(|r| format!("{} ({:?})", r.summary(), r.status))
        .collect();
    assert_eq!(after, Vec::<String>::new(), "the deposed holder wrote");
    let asked = t
        .fake
        .requests()
        .iter()
        .skip(takeover)
        .filter(|r| sent_by(r, "plumber-0"))
        .count();
    assert!(asked > 0, "plumber-0 went on running after the takeover");
    holder.stop();
    t.finish();
}
