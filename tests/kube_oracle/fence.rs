//! A deposed lease holder writes nothing more: the lease is taken from the holder while one
//! of its actions is between two writes (the API server holds the first), and no further
//! object of that action reaches the API server. Once the lease comes back the cutover ends
//! as if nothing happened.

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::coordination::v1::Lease;

use super::*;

/// A write of one of a processor's objects (not the Lease, not a Topology's status).
fn processor_write(r: &RecordedRequest) -> bool {
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
/// and acts on (kube-lease-manager alone only reports it missing, forever).
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
