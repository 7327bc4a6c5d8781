//! Plans of watched refs (SPEC §6, §9): real git histories made with git2 in temp dirs, the
//! daemon's pieces started as `plumber up` starts them (with a Kafka admin that never
//! answers, so nothing is deployed by it: what runs is what a test saves in the store, as a
//! settled cutover would), and `plumber up` itself behind its HTTP API.
//!
//! Every wait is on a condition (the local repository's watcher notices ref changes), with
//! generous timeouts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::daemon::Harness;
use common::{TestRepo, remove, write};
use git2::Oid;
use plumber::daemon::Context;
use plumber::daemon::review::plans::{PlanChange, RefPlan, note_fingerprint};
use plumber::plan::{Action, Change, Deployment};
use plumber::store::TopologyRecord;
use plumber_testkit::{Process, wait_until};

const PATIENCE: Duration = Duration::from_secs(60);
const FEATURE: &str = "refs/heads/feature";

fn source(topology: &str) -> common::Change {
    write(
        &format!("topologies/{topology}/sources/in.yaml"),
        format!("kind: source\ntopic: {topology}\n"),
    )
}

fn clean(topology: &str, threshold: u32) -> common::Change {
    write(
        &format!("topologies/{topology}/steps/clean.yaml"),
        format!("kind: processor\ninput: in\njq: 'select(.v > {threshold})'\n"),
    )
}

fn sink(topology: &str, input: &str) -> common::Change {
    write(
        &format!("topologies/{topology}/sinks/out.yaml"),
        format!("kind: sink\ntopic: {topology}-out\ninput: {input}\n"),
    )
}

/// `main` with two topologies, `orders` and `payments` (source → clean → sink).
fn repository() -> (TestRepo, Oid) {
    let repo = TestRepo::new();
    let main = repo.commit(
        "main",
        "two topologies",
        &[
            source("orders"),
            clean("orders", 1),
            sink("orders", "clean"),
            source("payments"),
            clean("payments", 1),
            sink("payments", "clean"),
        ],
    );
    (repo, main)
}

/// A branch `name` starting at `at`.
fn branch(repo: &TestRepo, name: &str, at: Oid) {
    repo.git
        .reference(&format!("refs/heads/{name}"), at, true, "branch")
        .unwrap();
}

/// [`Harness`] with what a test of plans asks of it.
impl Harness {
    fn plan(&self, name: &str) -> Option<Arc<RefPlan>> {
        self.context().plans.get(name)
    }

    /// Waits until `name` has a plan of `head` (and `base`, if given).
    fn plan_of(&self, name: &str, head: Oid, base: Option<Oid>) -> Arc<RefPlan> {
        let head = head.to_string();
        let base = base.map(|b| b.to_string());
        let mut found = None;
        wait_until(&format!("{name} is planned at {head}"), PATIENCE, || {
            found = self
                .plan(name)
                .filter(|p| p.head == head && base.as_ref().is_none_or(|b| &p.base == b));
            found.is_some()
        });
        found.unwrap()
    }
}

/// What runs of every topology of `commit`, as a settled cutover to it leaves the store.
fn deploy(context: &Context, repo: &TestRepo, commit: Oid) {
    let validation = common::validate_commit(repo, commit);
    for topology in validation.topologies.unwrap() {
        let record = TopologyRecord {
            commit: Some(commit.to_string()),
            bootstrap: Some("127.0.0.1:1".into()),
            deployment: Deployment::of(&topology),
            ..TopologyRecord::default()
        };
        context.records.save(&topology.name, &record).unwrap();
    }
}

fn step_change(plan: &RefPlan, topology: &str, step: &str) -> Change {
    let topology = plan
        .topologies
        .iter()
        .find(|t| t.name == topology)
        .unwrap_or_else(|| panic!("no topology {topology} in {plan:?}"));
    topology
        .steps
        .iter()
        .find(|s| s.name == step)
        .unwrap_or_else(|| panic!("no step {step}"))
        .change
}

fn actions(plan: &RefPlan, topology: &str) -> Vec<Action> {
    plan.topologies
        .iter()
        .find(|t| t.name == topology)
        .map(|t| t.actions.clone())
        .unwrap_or_default()
}

/// The note on `commit`: the review text, without the line that carries its fingerprint
/// (the note's last).
fn note(repo: &git2::Repository, commit: &str) -> Option<String> {
    let note = repo
        .find_note(Some("refs/notes/plumber"), Oid::from_str(commit).unwrap())
        .ok()?;
    let text = note.message()?;
    assert!(note_fingerprint(text).is_some(), "no fingerprint: {text}");
    let end = text.trim_end().rfind('\n').map_or(0, |i| i + 1);
    Some(text[..end].to_owned())
}

#[test]
fn a_branch_gets_a_plan_against_what_runs_that_follows_its_moves_until_it_is_deleted() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    let first = repo.commit("feature", "stricter", &[clean("orders", 5)]);
    let harness = Harness::start_with(&repo.location(), |_| {}, |c| deploy(c, &repo, main));
    let mut events = harness.context().plans.subscribe();

    let plan = harness.plan_of(FEATURE, first, Some(main));
    assert!(plan.valid && plan.valid_alone && plan.conflicts.is_empty() && !plan.preview);
    assert!(plan.errors.is_empty(), "{:?}", plan.errors);
    assert_eq!(plan.from.as_deref(), Some(main.to_string().as_str()));
    assert_eq!(step_change(&plan, "orders", "clean"), Change::Replaced);
    assert_eq!(step_change(&plan, "payments", "clean"), Change::Unchanged);
    assert!(
        actions(&plan, "payments").is_empty(),
        "payments runs as it is"
    );
    let orders = actions(&plan, "orders");
    // clean reads the source its old life reads: its new life starts warm.
    assert!(
        orders
            .iter()
            .any(|a| matches!(a, Action::StartWarm(s) if s.step == "clean"))
            && orders
                .iter()
                .any(|a| matches!(a, Action::StopProcessor { step, .. } if step == "clean")),
        "the engine's cutover of clean: {orders:?}"
    );
    assert!(
        harness.plan("refs/heads/main").is_none(),
        "the tracked branch is no preview of itself"
    );
    // The note on the head is the review text, written once.
    assert!(plan.markdown.contains("`orders`"), "{}", plan.markdown);
    assert_eq!(
        note(&repo.git, &plan.head).as_deref(),
        Some(plan.markdown.as_str())
    );

    // The branch moves: a new plan of the new head.
    let second = repo.commit("feature", "stricter still", &[clean("orders", 9)]);
    let moved = harness.plan_of(FEATURE, second, Some(main));
    assert_ne!(
        actions(&moved, "orders"),
        orders,
        "another identity of clean, other actions"
    );
    assert!(note(&repo.git, &moved.head).is_some());

    // Force-pushed: the branch now points at an unrelated change of payments.
    branch(&repo, "feature", main);
    let rewritten = repo.commit("feature", "rewritten", &[clean("payments", 3)]);
    let forced = harness.plan_of(FEATURE, rewritten, Some(main));
    assert_eq!(step_change(&forced, "orders", "clean"), Change::Unchanged);
    assert_eq!(step_change(&forced, "payments", "clean"), Change::Replaced);

    // Deleted: the plan goes, and says so.
    repo.git.find_reference(FEATURE).unwrap().delete().unwrap();
    wait_until("the deleted ref's plan is dropped", PATIENCE, || {
        harness.plan(FEATURE).is_none()
    });
    wait_until(
        "the removal is announced",
        PATIENCE,
        || matches!(events.try_recv(), Ok(e) if e.change == PlanChange::Removed && e.name == FEATURE),
    );
}

#[test]
fn the_tracked_branch_moving_recomputes_every_plan_and_parses_only_new_trees() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    branch(&repo, "other", main);
    let feature = repo.commit("feature", "orders", &[clean("orders", 5)]);
    let other = repo.commit("other", "payments", &[clean("payments", 5)]);
    let harness = Harness::start(&repo.location(), |_| {});
    harness.plan_of(FEATURE, feature, Some(main));
    harness.plan_of("refs/heads/other", other, Some(main));
    let trees = harness.context().revisions.trees().clone();
    // main's two topologies, and each branch's changed one: nothing twice.
    wait_until("every tree is validated", PATIENCE, || trees.parsed() >= 4);
    assert_eq!(trees.parsed(), 4);
    let computed = harness.context().plans.computed();

    // main moves in a third topology: both plans are made again on the new base, and only
    // the new topology is read and validated (once, for main and both merges).
    let moved = repo.commit(
        "main",
        "a third topology",
        &[
            source("refunds"),
            clean("refunds", 1),
            sink("refunds", "clean"),
        ],
    );
    let feature_plan = harness.plan_of(FEATURE, feature, Some(moved));
    let other_plan = harness.plan_of("refs/heads/other", other, Some(moved));
    for plan in [&feature_plan, &other_plan] {
        assert!(plan.valid);
        assert_eq!(step_change(plan, "refunds", "clean"), Change::Added);
    }
    assert_eq!(step_change(&feature_plan, "orders", "clean"), Change::Added);
    assert_eq!(trees.parsed(), 5, "only refunds is new");
    assert_eq!(harness.context().plans.computed(), computed + 2);

    // One branch moves: only its plan is made again, from its one new topology tree.
    let again = repo.commit("other", "payments again", &[clean("payments", 6)]);
    harness.plan_of("refs/heads/other", again, Some(moved));
    assert_eq!(trees.parsed(), 6);
    assert_eq!(harness.context().plans.computed(), computed + 3);
    assert_eq!(harness.plan(FEATURE).unwrap().head, feature.to_string());
}

#[test]
fn what_runs_changing_makes_the_plans_again_from_it() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    let feature = repo.commit("feature", "orders", &[clean("orders", 5)]);
    let harness = Harness::start_with(&repo.location(), |_| {}, |c| deploy(c, &repo, main));
    let plan = harness.plan_of(FEATURE, feature, Some(main));
    assert_eq!(step_change(&plan, "orders", "clean"), Change::Replaced);

    // As if the branch's tree had been deployed and its cutover settled.
    deploy(harness.context(), &repo, feature);
    harness.context().plans.running_changed();
    let mut replanned = None;
    wait_until("the plan starts from what runs now", PATIENCE, || {
        replanned = harness
            .plan(FEATURE)
            .filter(|p| p.from.as_deref() == Some(feature.to_string().as_str()));
        replanned.is_some()
    });
    let replanned = replanned.unwrap();
    assert_eq!(
        step_change(&replanned, "orders", "clean"),
        Change::Unchanged
    );
    assert!(
        replanned.topologies.iter().all(|t| t.actions.is_empty()),
        "nothing left to do: {:?}",
        replanned.topologies
    );
}

#[test]
fn a_conflicting_branch_names_the_files() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    let feature = repo.commit("feature", "orders at 5", &[clean("orders", 5)]);
    let harness = Harness::start(&repo.location(), |_| {});
    harness.plan_of(FEATURE, feature, Some(main));
    let moved = repo.commit("main", "orders at 7", &[clean("orders", 7)]);
    let plan = harness.plan_of(FEATURE, feature, Some(moved));
    assert!(!plan.valid);
    assert!(plan.valid_alone, "the branch itself is fine");
    assert_eq!(plan.conflicts, ["topologies/orders/steps/clean.yaml"]);
    assert!(plan.topologies.is_empty());
    assert!(
        plan.markdown.contains("topologies/orders/steps/clean.yaml"),
        "{}",
        plan.markdown
    );
    assert_eq!(
        note(&repo.git, &plan.head).as_deref(),
        Some(plan.markdown.as_str())
    );
}

#[test]
fn a_branch_valid_alone_but_broken_by_the_merge_reports_the_error_in_its_file() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    // The branch adds a step reading `clean`…
    let feature = repo.commit(
        "feature",
        "enrich",
        &[write(
            "topologies/orders/steps/enrich.yaml",
            "kind: processor\ninput: clean\njq: '. + {enriched: true}'\n",
        )],
    );
    // …which main renames meanwhile.
    let moved = repo.commit(
        "main",
        "clean is tidy now",
        &[
            remove("topologies/orders/steps/clean.yaml"),
            write(
                "topologies/orders/steps/tidy.yaml",
                "kind: processor\ninput: in\njq: 'select(.v > 1)'\n",
            ),
            sink("orders", "tidy"),
        ],
    );
    let harness = Harness::start(&repo.location(), |_| {});
    let plan = harness.plan_of(FEATURE, feature, Some(moved));
    assert!(!plan.valid && plan.valid_alone && plan.conflicts.is_empty());
    let error = plan.errors.first().expect("an error");
    assert_eq!(error.file, "topologies/orders/steps/enrich.yaml");
    assert!(error.message.contains("clean"), "{}", error.message);
    assert!(
        plan.markdown.contains("valid on its own"),
        "{}",
        plan.markdown
    );
    assert!(plan.markdown.contains("enrich.yaml"), "{}", plan.markdown);
}

/// What `plumber plan REPO --base main --head REF --format markdown [--keep-topics]` prints.
fn cli_markdown(repo: &TestRepo, head: &str, keep_topics: bool) -> String {
    let mut command = Command::new(common::plumber_bin());
    command
        .args(["plan", &repo.location(), "--base", "main", "--head", head])
        .args(["--format", "markdown"]);
    if keep_topics {
        command.arg("--keep-topics");
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_review_text_is_what_plumber_plan_prints_for_the_merge_preview_with_owners_and_kept_topics() {
    let (repo, _) = repository();
    let main = repo.commit(
        "main",
        "owners; enrich after clean",
        &[
            write(".github/CODEOWNERS", "/topologies/orders/ @orders-team\n"),
            write(
                "topologies/orders/steps/enrich.yaml",
                "kind: processor\ninput: clean\njq: '. + {enriched: true}'\n",
            ),
            sink("orders", "enrich"),
        ],
    );
    branch(&repo, "feature", main);
    // Replaced, the old `clean` retires its internal topic (enrich's input), which
    // --keep-topics keeps.
    let feature = repo.commit(
        "feature",
        "orders stricter, payments wider",
        &[clean("orders", 5), clean("payments", 0)],
    );
    let harness = Harness::start_with(
        &repo.location(),
        |c| c.cutover.keep_topics = true,
        |c| deploy(c, &repo, main),
    );
    let plan = harness.plan_of(FEATURE, feature, Some(main));
    assert!(plan.valid && plan.keep_topics);
    let cli = cli_markdown(&repo, FEATURE, true);
    let footer = plan
        .markdown
        .strip_prefix(cli.as_str())
        .unwrap_or_else(|| panic!("the daemon's\n{}\nthe CLI's\n{cli}", plan.markdown));
    assert!(
        footer.contains("Merge preview of `refs/heads/feature` into `main`"),
        "{footer}"
    );
    assert!(cli.contains("@orders-team"), "owners of the base: {cli}");
    assert!(cli.contains("--keep-topics"), "{cli}");
    let orders = plan.topologies.iter().find(|t| t.name == "orders").unwrap();
    assert!(!orders.kept_topics.is_empty(), "{orders:?}");
    assert!(
        !orders
            .actions
            .iter()
            .any(|a| matches!(a, Action::DeleteTopic { .. })),
        "{:?}",
        orders.actions
    );

    // Within a limit: shortened as `markdown_within` shortens the CLI's plan, footer kept.
    let limit = plan.markdown.len() - 200;
    let short = plan.markdown_within(limit);
    assert!(short.len() <= limit, "{} > {limit}", short.len());
    assert!(short.contains("Shortened to fit one comment"), "{short}");
    assert!(short.ends_with(footer), "{short}");
    assert_eq!(plan.markdown_within(plan.markdown.len()), plan.markdown);
}

#[test]
fn a_ref_that_cannot_be_planned_is_cut_between_its_list_items_within_a_limit() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    let many: Vec<common::Change> = (0..40)
        .map(|i| {
            write(
                &format!("topologies/orders/steps/broken{i:02}.yaml"),
                format!("kind: processor\ninput: missing{i:02}\njq: '.'\n"),
            )
        })
        .collect();
    let feature = repo.commit("feature", "broken steps", &many);
    let harness = Harness::start(&repo.location(), |_| {});
    let plan = harness.plan_of(FEATURE, feature, Some(main));
    assert!(!plan.valid && plan.errors.len() >= 40, "{:?}", plan.errors);
    let short = plan.markdown_within(1_000);
    assert!(short.len() <= 1_000, "{}", short.len());
    assert!(short.ends_with("has all of it.\n"), "{short}");
    assert!(plan.markdown.starts_with(short.lines().next().unwrap()));
    for line in short.lines().filter(|l| l.starts_with("- `")) {
        assert!(plan.markdown.contains(line), "a whole error line: {line}");
    }
}

#[test]
fn an_identical_note_is_never_written_again() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    let feature = repo.commit("feature", "orders", &[clean("orders", 5)]);
    let notes = || repo.git.refname_to_id("refs/notes/plumber").unwrap();
    let first = Harness::start(&repo.location(), |_| {});
    let plan = first.plan_of(FEATURE, feature, Some(main));
    let written = notes();
    drop(first);
    // Another daemon (a new state directory) makes the same plan: the note stays as it is
    // (a plan is published only after its note is written or found identical).
    let second = Harness::start(&repo.location(), |_| {});
    let again = second.plan_of(FEATURE, feature, Some(main));
    assert_eq!(again.markdown, plan.markdown);
    assert_eq!(notes(), written, "the notes ref did not move");
    // Notes never move branches.
    assert_eq!(repo.git.refname_to_id(FEATURE).unwrap(), feature);
    assert_eq!(repo.git.refname_to_id("refs/heads/main").unwrap(), main);
}

/// Issue 23: the tracked branch moving under a ref whose plan it leaves as it was writes no
/// note (the plan's text names the new base, what it means is the same); a move that changes
/// the plan (a conflict) writes it again.
#[test]
fn a_note_is_written_when_its_plan_changes_not_when_the_base_moves() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    let feature = repo.commit("feature", "orders at 5", &[clean("orders", 5)]);
    let notes = || repo.git.refname_to_id("refs/notes/plumber").unwrap();
    let harness = Harness::start(&repo.location(), |_| {});
    let plan = harness.plan_of(FEATURE, feature, Some(main));
    let written = notes();

    let docs = repo.commit("main", "docs", &[write("README.md", "# topologies\n")]);
    let moved = harness.plan_of(FEATURE, feature, Some(docs));
    assert_ne!(moved.markdown, plan.markdown, "the text names the new base");
    assert_eq!(moved.fingerprint, plan.fingerprint);
    assert_eq!(notes(), written, "the notes ref did not move");
    assert_eq!(note(&repo.git, &plan.head), Some(plan.markdown.clone()));

    let stricter = repo.commit("main", "orders at 7", &[clean("orders", 7)]);
    let conflict = harness.plan_of(FEATURE, feature, Some(stricter));
    assert!(!conflict.valid);
    assert_ne!(conflict.fingerprint, plan.fingerprint);
    assert_eq!(note(&repo.git, &plan.head), Some(conflict.markdown.clone()));
    let text = repo
        .git
        .find_note(Some("refs/notes/plumber"), feature)
        .unwrap()
        .message()
        .unwrap()
        .to_owned();
    assert_eq!(note_fingerprint(&text), Some(conflict.fingerprint.as_str()));
}

/// The remote form: the mirror fetches pull-request refs too, the note is written in the
/// mirror and pushed back with `push_notes`.
#[test]
fn a_remote_repository_mirrors_pull_request_refs_and_gets_its_notes_pushed() {
    let (repo, main) = repository();
    branch(&repo, "pr-work", main);
    let head = repo.commit("pr-work", "orders", &[clean("orders", 5)]);
    repo.git
        .reference("refs/pull/7/head", head, true, "a pull request")
        .unwrap();
    // The server's side: a bare repository (libgit2 pushes only to bare local ones).
    let served = tempfile::tempdir().unwrap();
    let origin = git2::Repository::init_bare(served.path()).unwrap();
    origin
        .remote_anonymous(&repo.location())
        .unwrap()
        .fetch(&["+refs/*:refs/*"], None, None)
        .unwrap();
    let url = format!("file://{}", served.path().display());
    let harness = Harness::start(&url, |c| {
        c.watch_refs = vec!["refs/pull/*/head".into()];
        c.push_notes = true;
    });
    let plan = harness.plan_of("refs/pull/7/head", head, Some(main));
    assert_eq!(plan.pull_request, Some(7));
    assert!(plan.valid);
    assert!(
        harness.plan("refs/heads/pr-work").is_none(),
        "only the watched patterns"
    );
    let mirror =
        git2::Repository::open_bare(harness.state.path().join("state/mirror.git")).unwrap();
    assert_eq!(
        note(&mirror, &plan.head).as_deref(),
        Some(plan.markdown.as_str())
    );
    wait_until("the note is pushed to the repository", PATIENCE, || {
        note(&origin, &plan.head).as_deref() == Some(plan.markdown.as_str())
    });

    // The pull request goes: the mirror's copy and the plan go too.
    origin
        .find_reference("refs/pull/7/head")
        .unwrap()
        .delete()
        .unwrap();
    wait_until(
        "the closed pull request's plan is dropped",
        PATIENCE,
        || harness.plan("refs/pull/7/head").is_none(),
    );
    assert!(mirror.find_reference("refs/pull/7/head").is_err());
    assert!(
        mirror.find_reference("refs/notes/plumber").is_ok(),
        "a fetch never removes the notes"
    );
}

/// The real `plumber up` on a local repository, asked over HTTP.
#[test]
fn plumber_up_serves_plans_over_http_with_markdown_errors_and_events() {
    let (repo, main) = repository();
    branch(&repo, "feature", main);
    let feature = repo.commit("feature", "orders", &[clean("orders", 5)]);
    let state = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let log = std::fs::File::create(state.path().join("daemon.log")).unwrap();
    let _daemon = Process::spawn(
        "plumber up",
        Command::new(env!("CARGO_BIN_EXE_plumber"))
            .args(["up", &repo.location(), "--branch", "main"])
            .args(["--bootstrap", "127.0.0.1:1"])
            .arg("--state-dir")
            .arg(state.path().join("state"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--watch-refs", "refs/heads/*"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log),
    );
    let server = format!("http://127.0.0.1:{port}");
    let get = |path: &str| -> Option<(u16, String)> {
        let response = ureq::get(&format!("{server}{path}"))
            .config()
            .http_status_as_error(false)
            .build()
            .call()
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.into_body().read_to_string().ok()?))
    };
    let mut listed = serde_json::Value::Null;
    wait_until("GET /api/plans lists the branch", PATIENCE, || {
        listed = get("/api/plans")
            .and_then(|(_, body)| serde_json::from_str(&body).ok())
            .unwrap_or_default();
        listed.as_array().is_some_and(|plans| {
            plans
                .iter()
                .any(|p| p["ref"] == FEATURE && p["head"] == feature.to_string())
        })
    });
    let plans = listed.as_array().unwrap();
    assert_eq!(plans.len(), 1, "main is no preview of itself: {listed}");
    let plan = &plans[0];
    assert_eq!(plan["base"], main.to_string());
    assert_eq!(plan["valid"], true);
    assert_eq!(plan["preview"], false);
    assert_eq!(plan["conflicts"], serde_json::json!([]));
    let orders = plan["topologies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "orders")
        .unwrap();
    // Nothing runs (no broker): everything is added.
    assert_eq!(orders["change"], "added");

    let (status, one) = get("/api/plans/refs%2Fheads%2Ffeature").unwrap();
    assert_eq!(status, 200);
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(&one, plan);
    let (status, markdown) = get("/api/plans/refs%2Fheads%2Ffeature?format=markdown").unwrap();
    assert_eq!(status, 200);
    assert!(markdown.starts_with("### Plumber plan"), "{markdown}");
    assert!(markdown.contains("`orders`"), "{markdown}");
    let (status, within) =
        get("/api/plans/refs%2Fheads%2Ffeature?format=markdown&limit=1000").unwrap();
    assert_eq!(status, 200);
    assert!(
        within.len() <= 1000 && within.len() < markdown.len(),
        "{within}"
    );
    assert!(within.contains("Shortened to fit one comment"), "{within}");
    let (status, missing) = get("/api/plans/refs%2Fheads%2Fnope").unwrap();
    assert_eq!(status, 404);
    let missing: serde_json::Value = serde_json::from_str(&missing).unwrap();
    assert!(
        missing["error"]
            .as_str()
            .unwrap()
            .contains("refs/heads/nope"),
        "{missing}"
    );
    assert_eq!(missing["watched"], serde_json::json!([FEATURE]));

    // A change event on /api/events when a branch moves.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(
            b"GET /api/events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n",
        )
        .unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut lines = BufReader::new(stream).lines();
    wait_until("the event stream answers", PATIENCE, || {
        lines.next().is_some_and(|l| l.unwrap().is_empty())
    });
    let moved = repo.commit("feature", "orders again", &[clean("orders", 6)]);
    let mut seen = String::new();
    wait_until("a plan event names the new head", PATIENCE, || {
        let line = lines.next().unwrap().unwrap();
        seen.push_str(&line);
        seen.push('\n');
        line.starts_with("data:") && line.contains(&moved.to_string())
    });
    assert!(seen.contains("event: plan"), "{seen}");
}
