//! Golden tests: the exact text, Markdown and JSON that `plumber` prints for the example
//! repository and a change to it. Regenerate with `UPDATE_GOLDEN=1 cargo test --test golden`
//! and review the diff like any other change.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use std::path::PathBuf;

use common::{TestRepo, example_files, remove, run, write};

fn check(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {}; run with UPDATE_GOLDEN=1", path.display()));
    assert_eq!(
        actual, expected,
        "{name} differs from tests/golden/{name}; if the change is intended, UPDATE_GOLDEN=1"
    );
}

/// The example repository, then a pull request's worth of changes to it.
fn history() -> (TestRepo, String, String) {
    let repo = TestRepo::new();
    let base = repo.commit_snapshot("main", "example", &example_files());
    let moving = "topologies/vehicle-telemetry/steps/moving.yaml";
    let head = repo.commit(
        "main",
        "faster vehicles only (jq and SQL), scale desktop, drop mobile, add a counter",
        &[
            write(
                moving,
                "kind: processor\ninput: telemetry\njq: 'select(.speed > 20)'\nscale: { min: 1, max: 10, lagThreshold: 500 }\n",
            ),
            write(
                "topologies/vehicle-telemetry/steps/fast-vehicles-sql.yaml",
                "kind: processor\ninput: telemetry\nsql: |\n  SELECT vehicle, speed\n  FROM telemetry\n  WHERE speed > 20\n",
            ),
            write(
                "topologies/clicks/steps/desktop.yaml",
                "kind: processor\ninput: normalize\nexec:\n  command: [python3, desktop.py]\n  image: ghcr.io/acme/clicks-desktop:1.0\nenv: { SECTION_DEPTH: \"1\" }\nscale: { min: 2, max: 8 }\n",
            ),
            remove("topologies/clicks/steps/mobile.yaml"),
            remove("topologies/clicks/steps/mobile.test.yaml"),
            remove("topologies/clicks/sinks/mobile-clicks.yaml"),
            write(
                "topologies/clicks/steps/pages.yaml",
                "kind: processor\ninput: normalize\njq: '{page}'\nstartFrom: earliest\n",
            ),
            write(
                "topologies/clicks/sinks/page-views.yaml",
                "kind: sink\ntopic: clicks.pages\ninput: pages\n",
            ),
        ],
    );
    (repo, base.to_string(), head.to_string())
}

#[test]
fn plan_outputs() {
    let (repo, base, head) = history();
    let location = repo.location();
    for (format, file) in [
        ("text", "plan.txt"),
        ("markdown", "plan.md"),
        ("json", "plan.json"),
    ] {
        let (code, stdout, stderr) = run(&[
            "plan", &location, "--from", &base, "--to", &head, "--format", format,
        ]);
        assert_eq!(code, 0, "{stderr}");
        check(file, &stdout);
    }
}

#[test]
fn graph_outputs() {
    let (repo, base, _) = history();
    let location = repo.location();
    for (format, file) in [
        ("dot", "graph.dot"),
        ("mermaid", "graph.mmd"),
        ("json", "graph.json"),
    ] {
        let (code, stdout, stderr) = run(&["graph", &location, "--rev", &base, "--format", format]);
        assert_eq!(code, 0, "{stderr}");
        check(file, &stdout);
    }
}

#[test]
fn render_outputs() {
    let (repo, base, _) = history();
    let (code, stdout, stderr) = run(&[
        "render",
        &repo.location(),
        "--rev",
        &base,
        "--repository",
        "https://git.example.com/data/topologies.git",
    ]);
    assert_eq!(code, 0, "{stderr}");
    check("render.yaml", &stdout);
}

#[test]
fn validation_outputs() {
    let (repo, _, _) = history();
    let broken = repo.commit(
        "main",
        "typos",
        &[
            write(
                "topologies/clicks/steps/pages.yaml",
                "kind: processor\ninput: normalise\njq: '{page'\nstartFrom: sometime\n",
            ),
            write(
                "topologies/clicks/sinks/page-views.yaml",
                "kind: sink\ntopic: clicks pages\ninput: pages\nowner: [web]\n",
            ),
        ],
    );
    let location = repo.location();
    for (format, file) in [("text", "validate.txt"), ("json", "validate.json")] {
        let (code, stdout, _) = run(&[
            "validate",
            &location,
            "--rev",
            &broken.to_string(),
            "--format",
            format,
        ]);
        assert_eq!(code, 1);
        check(file, &stdout);
    }
}
