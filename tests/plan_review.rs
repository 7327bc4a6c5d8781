//! The plan a reviewer reads: why each step changed, who owns its file (CODEOWNERS, read from
//! the commit), what `--keep-topics` leaves out, and the Markdown fitted into a forge
//! comment. Real git histories in temporary directories; the `plumber` binary as users run
//! it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use common::{TestRepo, run, write};
use plumber::output::plan::{GITHUB_COMMENT_LIMIT, markdown, markdown_within};
use plumber::spec::{FileContent, SourceFile};
use serde_json::Value;

const SOURCE: &str = "kind: source\ntopic: in\n";
const SINK: &str = "kind: sink\ntopic: out\ninput: b\n";

fn processor(input: &str, jq: &str) -> String {
    format!("kind: processor\ninput: {input}\njq: '{jq}'\n")
}

/// `in → a → b → out` under `dir` (`""` or `sub/`), on `main`.
fn linear(repo: &TestRepo, dir: &str, extra: Vec<common::Change>) -> git2::Oid {
    let mut changes = vec![
        write(&format!("{dir}topologies/t/sources/in.yaml"), SOURCE),
        write(
            &format!("{dir}topologies/t/steps/a.yaml"),
            processor("in", "."),
        ),
        write(
            &format!("{dir}topologies/t/steps/b.yaml"),
            processor("a", "."),
        ),
        write(&format!("{dir}topologies/t/sinks/out.yaml"), SINK),
    ];
    changes.extend(extra);
    repo.commit("main", "linear", &changes)
}

fn plan_json(args: &[&str]) -> Value {
    let (code, stdout, stderr) = run(&[&["plan"], args, &["--format", "json"]].concat());
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

fn step<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["topologies"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {plan:#}"))
}

fn owners(plan: &Value, name: &str) -> Vec<String> {
    step(plan, name)["owners"]
        .as_array()
        .map(|o| o.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

const RULES: &str = "/topologies/*/steps/ @acme/science\n/topologies/*/sinks/ @acme/engineering\n";

#[test]
fn owners_come_from_the_commit_s_codeowners_in_github_s_order() {
    let repo = TestRepo::new();
    let c1 = linear(
        &repo,
        "",
        vec![
            write("docs/CODEOWNERS", "* @docs-team\n"),
            write("CODEOWNERS", "* @root-team\n"),
            write(".github/CODEOWNERS", RULES),
        ],
    );
    // The working tree says otherwise: it is never read.
    std::fs::create_dir_all(repo.path().join(".github")).unwrap();
    std::fs::write(repo.path().join(".github/CODEOWNERS"), "* @working-tree\n").unwrap();
    let c2 = repo.commit(
        "main",
        "change a, rewire out",
        &[
            write("topologies/t/steps/a.yaml", processor("in", "select(.x)")),
            write(
                "topologies/t/sinks/out.yaml",
                "kind: sink\ntopic: out\ninput: a\n",
            ),
        ],
    );
    let location = repo.location();
    let (c1, c2) = (c1.to_string(), c2.to_string());
    let plan = plan_json(&[&location, "--from", &c1, "--to", &c2]);
    assert_eq!(
        owners(&plan, "a"),
        ["@acme/science"],
        ".github/ comes first"
    );
    assert_eq!(owners(&plan, "out"), ["@acme/engineering"]);
    assert!(owners(&plan, "in").is_empty(), "unchanged steps ask nobody");
    assert_eq!(step(&plan, "a")["file"], "topologies/t/steps/a.yaml");

    // Without .github/CODEOWNERS, the one at the root; without it, docs/.
    let c3 = repo.commit("main", "drop", &[common::remove(".github/CODEOWNERS")]);
    let c4 = repo.commit(
        "main",
        "change b",
        &[write(
            "topologies/t/steps/b.yaml",
            processor("a", "select(.y)"),
        )],
    );
    let plan = plan_json(&[
        &location,
        "--from",
        &c3.to_string(),
        "--to",
        &c4.to_string(),
    ]);
    assert_eq!(owners(&plan, "b"), ["@root-team"]);
    let c5 = repo.commit("main", "drop", &[common::remove("CODEOWNERS")]);
    let c6 = repo.commit(
        "main",
        "change b",
        &[write(
            "topologies/t/steps/b.yaml",
            processor("a", "select(.z)"),
        )],
    );
    let plan = plan_json(&[
        &location,
        "--from",
        &c5.to_string(),
        "--to",
        &c6.to_string(),
    ]);
    assert_eq!(owners(&plan, "b"), ["@docs-team"]);

    // Text and Markdown say it too.
    let (_, text, _) = run(&["plan", &location, "--from", &c1, "--to", &c2]);
    assert!(
        text.contains("topologies/t/steps/a.yaml (owners @acme/science)"),
        "{text}"
    );
    let (_, md, _) = run(&[
        "plan", &location, "--from", &c1, "--to", &c2, "--format", "markdown",
    ]);
    assert!(
        md.contains("| `a` | processor | replaced | changed `jq`, `sinks` | `topologies/t/steps/a.yaml` | @acme/science |"),
        "{md}"
    );
}

#[test]
fn without_codeowners_nobody_is_named() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "", vec![]);
    let c2 = repo.commit(
        "main",
        "change a",
        &[write(
            "topologies/t/steps/a.yaml",
            processor("in", "select(.x)"),
        )],
    );
    let plan = plan_json(&[
        &repo.location(),
        "--from",
        &c1.to_string(),
        "--to",
        &c2.to_string(),
    ]);
    assert!(step(&plan, "a").get("owners").is_none(), "{plan:#}");
}

#[test]
fn a_topology_repository_in_a_subdirectory_is_owned_by_the_git_root_s_codeowners() {
    let repo = TestRepo::new();
    let c1 = linear(
        &repo,
        "data/",
        vec![
            write("CODEOWNERS", "/data/topologies/t/steps/ @acme/science\n"),
            // Not where GitHub looks: ignored.
            write("data/CODEOWNERS", "* @nobody\n"),
        ],
    );
    let c2 = repo.commit(
        "main",
        "change a",
        &[write(
            "data/topologies/t/steps/a.yaml",
            processor("in", "select(.x)"),
        )],
    );
    std::fs::create_dir_all(repo.path().join("data")).unwrap();
    let location = repo.path().join("data").to_string_lossy().into_owned();
    let plan = plan_json(&[
        &location,
        "--from",
        &c1.to_string(),
        "--to",
        &c2.to_string(),
    ]);
    assert_eq!(step(&plan, "a")["file"], "topologies/t/steps/a.yaml");
    assert_eq!(owners(&plan, "a"), ["@acme/science"]);
}

#[test]
fn a_merge_preview_gives_reasons_and_the_base_s_owners() {
    let repo = TestRepo::new();
    let base = linear(&repo, "", vec![write("CODEOWNERS", RULES)]);
    repo.git
        .branch("feature", &repo.git.find_commit(base).unwrap(), false)
        .unwrap();
    repo.commit(
        "feature",
        "change a, and name myself its owner",
        &[
            write(
                "topologies/t/steps/a.yaml",
                "kind: processor\ninput: in\njq: 'select(.x)'\nenv: { MODE: fast }\n",
            ),
            write("CODEOWNERS", "* @intruder\n"),
        ],
    );
    // main moves on meanwhile: the preview is the merge, planned against main.
    repo.commit(
        "main",
        "scale b",
        &[write(
            "topologies/t/steps/b.yaml",
            format!("{}scale: {{ min: 2, max: 3 }}\n", processor("a", ".")),
        )],
    );
    let location = repo.location();
    let plan = plan_json(&[&location, "--base", "main", "--head", "feature"]);
    let a = step(&plan, "a");
    assert_eq!(a["change"], "replaced");
    assert_eq!(a["reason"]["changed"][0]["field"], "jq");
    assert_eq!(a["reason"]["changed"][0]["from"], ".");
    assert_eq!(a["reason"]["changed"][0]["to"], "select(.x)");
    assert_eq!(a["reason"]["changed"][1]["field"], "env.MODE");
    assert_eq!(a["reason"]["changed"][1]["from"], Value::Null);
    assert_eq!(
        owners(&plan, "a"),
        ["@acme/science"],
        "a branch cannot name its own owners"
    );
    let b = step(&plan, "b");
    assert_eq!(b["change"], "replaced");
    assert_eq!(b["reason"]["upstream"], serde_json::json!(["a"]));
    assert!(
        b["reason"].get("changed").is_none(),
        "b's scale is main's already: {b:#}"
    );
    let out = step(&plan, "out");
    assert_eq!(out["change"], "unchanged", "a sink is never replaced");
    assert!(out.get("reason").is_none());

    let (_, md, _) = run(&[
        "plan", &location, "--base", "main", "--head", "feature", "--format", "markdown",
    ]);
    assert!(
        md.contains("| `b` | processor | replaced | its input `a` changed |"),
        "{md}"
    );
    assert!(
        md.contains("```diff\n@@ jq @@\n-.\n+select(.x)\n@@ env.MODE @@\n+\"fast\"\n```"),
        "{md}"
    );
    assert!(!md.contains("@intruder"), "{md}");
}

#[test]
fn plan_preview_shows_what_a_preview_environment_of_the_pull_request_runs() {
    let repo = TestRepo::new();
    let base = linear(&repo, "", vec![]);
    repo.git
        .branch("feature", &repo.git.find_commit(base).unwrap(), false)
        .unwrap();
    let head = repo.commit(
        "feature",
        "change b",
        &[write(
            "topologies/t/steps/b.yaml",
            processor("a", "select(.x)"),
        )],
    );
    // As a forge's mirror has it.
    repo.git
        .reference("refs/pull/7/head", head, false, "the pull request")
        .unwrap();
    let location = repo.location();
    let plan = plan_json(&[
        &location,
        "--base",
        "main",
        "--head",
        "refs/pull/7/head",
        "--preview",
    ]);
    let preview = &plan["preview"];
    assert_eq!(preview["slug"], "pr-7", "{plan:#}");
    let topology = &preview["topologies"][0];
    assert_eq!(topology["topology"], "t");
    assert_eq!(topology["preview"], "t.pr-7");
    // Only the changed step runs; it reads what `a` writes now, live.
    assert_eq!(topology["processors"], serde_json::json!(["b"]));
    let a_topic = topology["reads"][0].as_str().unwrap();
    assert!(a_topic.starts_with("plumber.t.a."), "{topology:#}");
    assert_eq!(
        topology["shadowTopics"],
        serde_json::json!({"out.preview.pr-7": "out"})
    );

    let (code, text, stderr) = run(&[
        "plan",
        &location,
        "--base",
        "main",
        "--head",
        &head.to_string(),
        "--preview",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        text.contains("writes: out.preview.") && text.contains("(instead of out)"),
        "{text}"
    );
    // Without --preview the plan says nothing of it.
    let plan = plan_json(&[&location, "--base", "main", "--head", "refs/pull/7/head"]);
    assert!(plan.get("preview").is_none(), "{plan:#}");
}

#[test]
fn plan_keep_topics_lists_the_retired_topics_as_kept_not_as_deletions() {
    let repo = TestRepo::new();
    let c1 = linear(&repo, "", vec![]);
    let c2 = repo.commit(
        "main",
        "change a",
        &[write(
            "topologies/t/steps/a.yaml",
            processor("in", "select(.x)"),
        )],
    );
    let location = repo.location();
    let (c1, c2) = (c1.to_string(), c2.to_string());
    let deletions = |plan: &Value| -> Vec<String> {
        plan["topologies"][0]["actions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["action"] == "delete-topic")
            .map(|a| a["topic"].as_str().unwrap().to_owned())
            .collect()
    };
    let deleting = plan_json(&[&location, "--from", &c1, "--to", &c2]);
    let retired = deletions(&deleting);
    assert_eq!(retired.len(), 1, "{deleting:#}");
    assert_eq!(deleting["keepTopics"], false);
    assert!(deleting["topologies"][0].get("keptTopics").is_none());

    let keeping = plan_json(&[&location, "--from", &c1, "--to", &c2, "--keep-topics"]);
    assert_eq!(keeping["keepTopics"], true);
    assert!(deletions(&keeping).is_empty(), "{keeping:#}");
    assert_eq!(
        keeping["topologies"][0]["keptTopics"],
        serde_json::json!(retired)
    );

    let (_, text, _) = run(&[
        "plan",
        &location,
        "--from",
        &c1,
        "--to",
        &c2,
        "--keep-topics",
    ]);
    assert!(!text.contains("delete topic"), "{text}");
    assert!(
        text.contains(&format!(
            "kept, not deleted (--keep-topics):\n       {}\n",
            retired[0]
        )),
        "{text}"
    );
    let (_, md, _) = run(&[
        "plan",
        &location,
        "--from",
        &c1,
        "--to",
        &c2,
        "--keep-topics",
        "--format",
        "markdown",
    ]);
    assert!(!md.contains("delete topic"), "{md}");
    assert!(
        md.contains(&format!(
            "Kept, not deleted (`--keep-topics`): `{}`.",
            retired[0]
        )),
        "{md}"
    );
}

/// `topologies` topologies, each a source feeding a chain of `chain` processors and a sink;
/// `version` changes the first processor of every chain, so each whole chain is replaced.
fn generated(topologies: usize, chain: usize, version: u32) -> Vec<plumber::graph::Topology> {
    let mut files = Vec::new();
    let mut file = |path: String, yaml: String| {
        files.push(SourceFile {
            path,
            content: FileContent::Bytes(yaml.into_bytes()),
        })
    };
    for t in 0..topologies {
        let dir = format!("topologies/topology-{t:03}");
        file(
            format!("{dir}/sources/in.yaml"),
            format!("kind: source\ntopic: in-{t}\n"),
        );
        for s in 0..chain {
            let input = if s == 0 {
                "in".to_owned()
            } else {
                format!("step-{:03}", s - 1)
            };
            let program = if s == 0 {
                format!(
                    "select(.version == {version}) | {{id, value: .value * 2, note: \"a longer program\"}}"
                )
            } else {
                format!(". + {{hop: {s}}}")
            };
            file(
                format!("{dir}/steps/step-{s:03}.yaml"),
                format!("kind: processor\ninput: {input}\njq: '{program}'\n"),
            );
        }
        file(
            format!("{dir}/sinks/out.yaml"),
            format!("kind: sink\ntopic: out-{t}\ninput: step-{:03}\n", chain - 1),
        );
    }
    let validation = plumber::validate(&files);
    validation
        .topologies
        .unwrap_or_else(|| panic!("invalid: {:?}", validation.diagnostics))
}

/// Checks that `md` is whole Markdown: every code fence closed, every table with a header,
/// a delimiter row and rows of the same width, ended by a blank line.
fn assert_well_formed(md: &str) {
    let mut fence: Option<usize> = None;
    let mut table: Option<usize> = None;
    let lines: Vec<&str> = md.lines().collect();
    for (n, line) in lines.iter().copied().enumerate() {
        let ticks = line.len() - line.trim_start_matches('`').len();
        match fence {
            Some(open) => {
                if ticks >= open && line.trim_start_matches('`').trim().is_empty() {
                    fence = None;
                }
                continue;
            }
            None if ticks >= 3 => {
                assert!(table.is_none(), "line {n}: a fence inside a table");
                fence = Some(ticks);
                continue;
            }
            None => {}
        }
        let cells = line.replace("\\|", "").matches('|').count();
        match (table, line.starts_with('|')) {
            (None, true) => {
                let next = lines.get(n + 1).copied().unwrap_or_default();
                assert!(
                    next.starts_with("|---"),
                    "line {n}: a table without delimiter: {line}"
                );
                table = Some(cells);
            }
            (Some(width), true) => {
                assert_eq!(cells, width, "line {n}: a row of another width: {line}")
            }
            (Some(_), false) => {
                assert!(
                    line.is_empty(),
                    "line {n}: a table not ended by a blank line"
                );
                table = None;
            }
            (None, false) => {}
        }
    }
    assert!(fence.is_none(), "a code block is not closed");
}

#[test]
fn markdown_within_a_limit_fits_stays_whole_and_says_what_it_left_out() {
    for (topologies, chain) in [(3, 50), (12, 30), (40, 20)] {
        let old = generated(topologies, chain, 1);
        let new = generated(topologies, chain, 2);
        let plan = plumber::plan::plan(
            Some(("a".repeat(40).as_str(), &old)),
            (&"b".repeat(40), &new),
        );
        let full = markdown(&plan, &new, &old);
        assert!(
            full.len() > GITHUB_COMMENT_LIMIT,
            "{topologies}×{chain}: only {} bytes",
            full.len()
        );
        assert_well_formed(&full);
        for limit in [GITHUB_COMMENT_LIMIT, 20_000, 4_000] {
            let within = markdown_within(&plan, &new, &old, limit);
            let case = format!("{topologies}×{chain} within {limit}");
            assert!(within.len() <= limit, "{case}: {} bytes", within.len());
            assert_well_formed(&within);
            assert!(
                within.contains("Shortened to fit one comment: ")
                    || within.contains("too long for this comment"),
                "{case}: does not say it is shortened:\n{within}"
            );
            assert!(within.starts_with("### Plumber plan: "), "{case}");
            // Whatever was cut says so where it was cut.
            let shown_actions = within
                .lines()
                .filter(|l| l.contains(". stop `") || l.contains(". start `"))
                .count();
            let all_actions = full
                .lines()
                .filter(|l| l.contains(". stop `") || l.contains(". start `"))
                .count();
            if shown_actions < all_actions {
                assert!(
                    within.contains(" more action")
                        || within.contains("more changed topolog")
                        || within.contains("too long"),
                    "{case}: actions left out silently"
                );
            }
            // It keeps as much as fits: the summary table stays whenever there is room.
            if limit >= 20_000 {
                assert!(within.contains("| Topology | Change |"), "{case}");
            }
        }
    }
}

#[test]
fn markdown_within_changes_nothing_that_fits_and_cuts_the_diagram_first() {
    let old = generated(3, 30, 1);
    let new = generated(3, 30, 2);
    let plan = plumber::plan::plan(
        Some(("a".repeat(40).as_str(), &old)),
        (&"b".repeat(40), &new),
    );
    let full = markdown(&plan, &new, &old);
    assert_eq!(markdown_within(&plan, &new, &old, full.len()), full);
    let shorter = markdown_within(&plan, &new, &old, full.len() - 1);
    assert_well_formed(&shorter);
    assert!(shorter.len() < full.len());
    assert!(
        shorter.contains("the diagrams show only changed steps and their neighbours")
            || shorter.contains("the diagrams are left out"),
        "{shorter}"
    );
    // Every action is still there: the diagram went first.
    let actions = |md: &str| {
        md.lines()
            .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
            .count()
    };
    assert_eq!(actions(&shorter), actions(&full));
}

#[test]
fn markdown_within_drops_the_summary_rows_of_unchanged_topologies_before_any_change() {
    // 2,000 topologies, one of them changed: the summary's rows alone pass GitHub's limit.
    let old = generated(2_000, 1, 1);
    let mut new = generated(1, 1, 2);
    new.extend(old.iter().skip(1).cloned());
    let plan = plumber::plan::plan(Some(("a", &old)), ("b", &new));
    let full = markdown(&plan, &new, &old);
    assert!(full.len() > GITHUB_COMMENT_LIMIT, "{}", full.len());
    let within = markdown_within(&plan, &new, &old, GITHUB_COMMENT_LIMIT);
    assert!(within.len() <= GITHUB_COMMENT_LIMIT, "{}", within.len());
    assert_well_formed(&within);
    assert!(
        within.contains("the summary lists only changed topologies"),
        "{within}"
    );
    assert!(within.contains("1999 unchanged topologies are not listed."));
    assert!(within.contains("| `topology-000` | "));
    assert!(!within.contains("| `topology-001` | "));
    // The changed topology is whole: its section, its diagram and every action.
    assert!(within.contains("#### `topology-000`"));
    assert!(within.contains("```mermaid"));
    let actions = |md: &str| md.matches(". stop `").count() + md.matches(". start `").count();
    assert!(actions(&full) > 0);
    assert_eq!(actions(&within), actions(&full));
}

/// One topology: a source read by `width` processors, each writing its own sink; `version`
/// changes only the first processor.
fn fan(width: usize, version: u32) -> Vec<plumber::graph::Topology> {
    let mut files = vec![SourceFile {
        path: "topologies/fan/in.yaml".into(),
        content: FileContent::Bytes(b"kind: source\ntopic: in\n".to_vec()),
    }];
    for s in 0..width {
        let v = if s == 0 { version } else { 1 };
        files.push(SourceFile {
            path: format!("topologies/fan/p-{s:03}.yaml"),
            content: FileContent::Bytes(
                format!("kind: processor\ninput: in\njq: '.v = {v}'\n").into_bytes(),
            ),
        });
        files.push(SourceFile {
            path: format!("topologies/fan/out-{s:03}.yaml"),
            content: FileContent::Bytes(
                format!("kind: sink\ntopic: out-{s}\ninput: p-{s:03}\n").into_bytes(),
            ),
        });
    }
    plumber::validate(&files).topologies.unwrap()
}

#[test]
fn a_shortened_diagram_draws_the_changed_steps_and_their_neighbours() {
    let (old, new) = (fan(300, 1), fan(300, 2));
    let plan = plumber::plan::plan(Some(("a", &old)), ("b", &new));
    let full = markdown(&plan, &new, &old);
    assert!(full.len() > 40_000, "{}", full.len());
    let within = markdown_within(&plan, &new, &old, 40_000);
    assert_well_formed(&within);
    assert!(within.contains("the diagrams show only changed steps and their neighbours"));
    let nodes: Vec<&str> = within
        .lines()
        .filter(|l| l.starts_with("  fan__") && !l.contains("-->"))
        .collect();
    assert_eq!(nodes.len(), 3, "p-000, its source and its sink: {nodes:#?}");
    assert!(within.contains("  fan__in --> fan__p_000\n  fan__p_000 --> fan__out_000\n"));
    // Nothing else was cut.
    assert_eq!(
        within.matches(". stop `").count() + within.matches(". start `").count(),
        full.matches(". stop `").count() + full.matches(". start `").count()
    );
}
