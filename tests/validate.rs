//! Validation of real commits: every error code of SPEC §3 at its exact place, all at once,
//! and bad input of every kind answered with a precise error instead of a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use common::{TestRepo, link, remove, run, validate_commit, write};
use plumber::diagnostic::Diagnostic;

fn located(diagnostics: &[Diagnostic]) -> Vec<(String, String, Option<u32>, Option<u32>)> {
    diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| (d.code.to_string(), d.file.clone(), d.line, d.column))
        .collect()
}

fn at(
    code: &str,
    file: &str,
    line: u32,
    column: u32,
) -> (String, String, Option<u32>, Option<u32>) {
    (code.into(), file.into(), Some(line), Some(column))
}

#[test]
fn every_error_of_a_commit_is_reported_at_its_key() {
    let repo = TestRepo::new();
    let t = "topologies/shop";
    let commit = repo.commit(
        "main",
        "broken",
        &[
            write(&format!("{t}/sources/orders.yaml"), "kind: source\ntopic: orders\ninput: x\n"),
            write(
                &format!("{t}/steps/enrich.yaml"),
                "kind: processor\ninput: [orders, missing]\njq: 'select(.a > '\npartitons: 3\nscale: { min: 5, max: 2 }\n",
            ),
            write(&format!("{t}/steps/both.yaml"), "kind: processor\ninput: orders\njq: .\nexec: { command: [cat] }\n"),
            write(&format!("{t}/steps/none.yaml"), "kind: processor\ninput: orders\n"),
            write(&format!("{t}/more/none.yml"), "kind: processor\ninput: orders\njq: .\n"),
            write(&format!("{t}/steps/weird.yaml"), "kind: transformer\n"),
            write(&format!("{t}/steps/nokind.yaml"), "input: orders\n"),
            write(&format!("{t}/steps/after-sink.yaml"), "kind: processor\ninput: out\njq: .\n"),
            write(&format!("{t}/steps/Bad_Name.yaml"), "kind: processor\ninput: orders\njq: .\n"),
            write(&format!("{t}/steps/syntax.yaml"), "kind: [processor\n"),
            write(&format!("{t}/steps/partitions.yaml"), "kind: processor\ninput: orders\njq: .\npartitions: 0\n"),
            write(&format!("{t}/sinks/out.yaml"), "kind: sink\ntopic: orders\ninput: enrich\n"),
            write("topologies/loop/sources/s.yaml", "kind: source\ntopic: s\n"),
            write("topologies/loop/a.yaml", "kind: processor\ninput: [s, c]\njq: .\n"),
            write("topologies/loop/b.yaml", "kind: processor\ninput: a\njq: .\n"),
            write("topologies/loop/c.yaml", "kind: processor\ninput: b\njq: .\n"),
            write("topologies/loop/o.yaml", "kind: sink\ntopic: o\ninput: c\n"),
            write("topologies/Bad_Topo/x.yaml", "kind: source\ntopic: x\n"),
        ],
    );
    let validation = validate_commit(&repo, commit);
    assert!(!validation.is_valid());
    let mut expected = vec![
        (
            "invalid-name".to_string(),
            "topologies/Bad_Topo".to_string(),
            None,
            None,
        ),
        ("cycle".into(), "topologies/loop".into(), None, None),
        at("duplicate-step", &format!("{t}/steps/none.yaml"), 1, 1),
        at("invalid-edge", &format!("{t}/sinks/out.yaml"), 2, 8).clone(),
        at("invalid-edge", &format!("{t}/sources/orders.yaml"), 3, 1),
        at("transform-count", &format!("{t}/steps/both.yaml"), 4, 1),
        at("unknown-input", &format!("{t}/steps/enrich.yaml"), 2, 17),
        at("invalid-jq", &format!("{t}/steps/enrich.yaml"), 3, 1),
        at("unknown-field", &format!("{t}/steps/enrich.yaml"), 4, 1),
        at("invalid-value", &format!("{t}/steps/enrich.yaml"), 5, 1),
        at("invalid-edge", &format!("{t}/steps/after-sink.yaml"), 2, 8),
        at("invalid-name", &format!("{t}/steps/Bad_Name.yaml"), 1, 1),
        at("missing-field", &format!("{t}/steps/nokind.yaml"), 1, 1),
        at("transform-count", &format!("{t}/steps/none.yaml"), 1, 1),
        at("invalid-value", &format!("{t}/steps/partitions.yaml"), 4, 1),
        at("yaml-syntax", &format!("{t}/steps/syntax.yaml"), 2, 1),
        at("invalid-kind", &format!("{t}/steps/weird.yaml"), 1, 1),
    ];
    // The sink writes `orders`, which source `orders` reads.
    expected.push(at("topic-loop", &format!("{t}/sinks/out.yaml"), 2, 8));
    expected.retain(|e| e != &at("invalid-edge", &format!("{t}/sinks/out.yaml"), 2, 8));
    let mut found = located(&validation.diagnostics);
    found.sort();
    expected.sort();
    assert_eq!(found, expected, "{:#?}", validation.diagnostics);

    let cycle = validation
        .diagnostics
        .iter()
        .find(|d| d.code.as_str() == "cycle")
        .expect("a cycle error");
    assert!(cycle.message.contains("a → b → c → a"), "{}", cycle.message);
    let unknown = validation
        .diagnostics
        .iter()
        .find(|d| d.code.as_str() == "unknown-field")
        .expect("an unknown-field error");
    assert!(
        unknown.message.contains("did you mean `partitions`"),
        "{}",
        unknown.message
    );
}

#[test]
fn warnings_do_not_fail_validation() {
    let repo = TestRepo::new();
    let commit = repo.commit(
        "main",
        "warnings",
        &[
            write("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
            write("topologies/t/unused.yaml", "kind: source\ntopic: unused\n"),
            write(
                "topologies/t/nowhere.yaml",
                "kind: processor\ninput: in\njq: .\n",
            ),
            write(
                "topologies/t/copy.yaml",
                "kind: processor\ninput: in\njq: .\n",
            ),
            write(
                "topologies/t/out.yaml",
                "kind: sink\ntopic: out\ninput: copy\n",
            ),
        ],
    );
    let validation = validate_commit(&repo, commit);
    assert!(validation.is_valid(), "{:#?}", validation.diagnostics);
    let warnings: Vec<(String, String)> = validation
        .warnings()
        .map(|d| (d.code.to_string(), d.file.clone()))
        .collect();
    assert_eq!(
        warnings,
        vec![
            (
                "dead-end".to_string(),
                "topologies/t/nowhere.yaml".to_string()
            ),
            (
                "unread-source".to_string(),
                "topologies/t/unused.yaml".to_string()
            ),
        ]
    );
}

#[test]
fn unreadable_files_get_precise_errors() {
    let repo = TestRepo::new();
    let mut huge = b"kind: source\ntopic: t\n# ".to_vec();
    huge.resize(2 * 1024 * 1024, b'x');
    let commit = repo.commit(
        "main",
        "bad files",
        &[
            write(
                "topologies/t/latin1.yaml",
                b"kind: source\ntopic: caf\xe9\n",
            ),
            write("topologies/t/huge.yaml", &huge),
            link("topologies/t/linked.yaml", "../../../etc/passwd"),
            link("topologies/elsewhere", "/tmp"),
            write("topologies/t/empty.yaml", ""),
            write(
                "topologies/t/two.yaml",
                "kind: source\ntopic: a\n---\nkind: source\ntopic: b\n",
            ),
            write(
                "topologies/t/dup.yaml",
                "kind: source\ntopic: a\ntopic: b\n",
            ),
            write("topologies/t/list.yaml", "- kind: source\n"),
        ],
    );
    let validation = validate_commit(&repo, commit);
    let found: Vec<(String, String, Option<u32>)> = validation
        .errors()
        .map(|d| (d.code.to_string(), d.file.clone(), d.line))
        .collect();
    let expect = [
        ("unsupported-entry", "topologies/elsewhere", None),
        ("yaml-syntax", "topologies/t/dup.yaml", Some(3)),
        ("missing-field", "topologies/t/empty.yaml", Some(1)),
        ("file-too-large", "topologies/t/huge.yaml", None),
        ("invalid-encoding", "topologies/t/latin1.yaml", Some(2)),
        ("unsupported-entry", "topologies/t/linked.yaml", None),
        ("invalid-value", "topologies/t/list.yaml", Some(1)),
        ("yaml-syntax", "topologies/t/two.yaml", Some(3)),
    ];
    let expect: Vec<(String, String, Option<u32>)> = expect
        .iter()
        .map(|(c, f, l)| (c.to_string(), f.to_string(), *l))
        .collect();
    assert_eq!(found, expect, "{:#?}", validation.diagnostics);
}

#[test]
fn names_that_kafka_or_kubernetes_would_refuse_are_errors() {
    let repo = TestRepo::new();
    let long = "x".repeat(41);
    let commit = repo.commit(
        "main",
        "names",
        &[
            write("topologies/t/in.yaml", "kind: source\ntopic: 'has space'\n"),
            write(
                "topologies/t/internal.yaml",
                "kind: source\ntopic: plumber.t.x\n",
            ),
            write(
                &format!("topologies/t/{long}.yaml"),
                "kind: source\ntopic: ok\n",
            ),
            write(
                "topologies/t/env.yaml",
                "kind: processor\ninput: in\njq: .\nenv: { 2BAD: x, GOOD: [1] }\n",
            ),
            write(
                "topologies/t/where.yaml",
                "kind: source\ntopic: w\ncluster: nowhere\n",
            ),
        ],
    );
    let validation = validate_commit(&repo, commit);
    let found: Vec<(String, String, Option<u32>)> = validation
        .errors()
        .map(|d| (d.code.to_string(), d.file.clone(), d.line))
        .collect();
    let expected: Vec<(String, String, Option<u32>)> = [
        ("invalid-value", "topologies/t/env.yaml", Some(4)),
        ("invalid-value", "topologies/t/env.yaml", Some(4)),
        ("invalid-value", "topologies/t/in.yaml", Some(2)),
        ("invalid-value", "topologies/t/internal.yaml", Some(2)),
        ("invalid-value", "topologies/t/where.yaml", Some(3)),
        (
            "invalid-name",
            &format!("topologies/t/{long}.yaml"),
            Some(1),
        ),
    ]
    .iter()
    .map(|(c, f, l)| (c.to_string(), f.to_string(), *l))
    .collect();
    let mut sorted_found = found.clone();
    sorted_found.sort();
    let mut sorted_expected = expected;
    sorted_expected.sort();
    assert_eq!(
        sorted_found, sorted_expected,
        "{:#?}",
        validation.diagnostics
    );
}

#[test]
fn a_topology_may_live_in_a_subdirectory_of_the_git_repository() {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        "monorepo",
        &[
            write("data/topologies/t/in.yaml", "kind: source\ntopic: in\n"),
            write(
                "data/topologies/t/copy.yaml",
                "kind: processor\ninput: in\njq: .\n",
            ),
            write(
                "data/topologies/t/out.yaml",
                "kind: sink\ntopic: out\ninput: copy\n",
            ),
        ],
    );
    std::fs::create_dir_all(repo.path().join("data")).unwrap();
    let location = repo.path().join("data").to_string_lossy().into_owned();
    let (code, stdout, stderr) = run(&["validate", &location]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("valid: 1 topology, 3 steps"), "{stdout}");
}

#[test]
fn cli_reports_text_and_json_with_exit_codes() {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        "good",
        &[write("topologies/t/in.yaml", "kind: source\ntopic: in\n")],
    );
    repo.commit(
        "main",
        "bad",
        &[write(
            "topologies/t/p.yaml",
            "kind: processor\ninput: nope\njq: .\n",
        )],
    );
    let location = repo.location();

    let (code, stdout, _) = run(&["validate", &location, "--rev", "HEAD~1"]);
    assert_eq!(code, 0, "{stdout}");

    let (code, stdout, _) = run(&["validate", &location]);
    assert_eq!(code, 1);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("topologies/t/p.yaml:2:8: unknown-input: unknown input `nope`")),
        "{stdout}"
    );
    assert!(
        stdout.contains("invalid: 1 error, 2 warnings at "),
        "{stdout}"
    );

    let (code, stdout, _) = run(&["validate", &location, "--format", "json"]);
    assert_eq!(code, 1);
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(json["valid"], false);
    assert_eq!(json["commit"].as_str().map(str::len), Some(40));
    assert_eq!(
        json["topologies"],
        serde_json::json!([{"name": "t", "steps": 2}])
    );
    assert_eq!(
        json["errors"][0],
        serde_json::json!({"code": "unknown-input", "file": "topologies/t/p.yaml", "line": 2, "column": 8,
            "message": "unknown input `nope`; topology `t` has no step named so (step names are file names)"})
    );
    assert!(json["warnings"].is_array());
}

#[test]
fn repository_problems_exit_2_with_a_clear_message() {
    let empty = TestRepo::new();
    let (code, _, stderr) = run(&["validate", &empty.location()]);
    assert_eq!(code, 2);
    assert!(stderr.contains("has no commits yet"), "{stderr}");

    let repo = TestRepo::new();
    repo.commit("main", "one", &[write("README.md", "hi")]);
    let (code, _, stderr) = run(&["validate", &repo.location(), "--rev", "no-such-branch"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("revision `no-such-branch` not found"),
        "{stderr}"
    );

    let (code, stdout, _) = run(&["validate", &format!("file://{}", repo.location())]);
    assert_eq!(
        code, 0,
        "a repository without topologies is valid: {stdout}"
    );

    let not_a_repo = tempfile::tempdir().unwrap();
    let (code, _, stderr) = run(&["validate", &not_a_repo.path().to_string_lossy()]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot open a git repository"), "{stderr}");

    let (code, _, stderr) = run(&["validate", "https://example.com/repo.git"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not a local path"), "{stderr}");
}

#[test]
fn files_outside_topologies_and_removed_files_do_not_matter() {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        "one",
        &[
            write("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
            write("topologies/t/bad.yaml", "kind: [\n"),
            write("docs/whatever.yaml", "kind: [\n"),
            write("topologies/t/notes.md", "# notes"),
            write("topologies/t/.hidden/x.yaml", "kind: [\n"),
        ],
    );
    let commit = repo.commit("main", "fix", &[remove("topologies/t/bad.yaml")]);
    let validation = validate_commit(&repo, commit);
    assert!(validation.is_valid(), "{:#?}", validation.diagnostics);
    assert_eq!(validation.found, vec![("t".to_string(), 1)]);
}

#[test]
fn reserved_plumber_env_names_are_errors_at_the_key() {
    let repo = TestRepo::new();
    let commit = repo.commit(
        "main",
        "reserved env",
        &[
            write("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
            write(
                "topologies/t/p.yaml",
                "kind: processor\ninput: in\njq: .\nenv:\n  MODEL: v2\n  PLUMBER_DELIVERY: at-least-once\n",
            ),
            write("topologies/t/out.yaml", "kind: sink\ntopic: out\ninput: p\n"),
        ],
    );
    let validation = validate_commit(&repo, commit);
    assert_eq!(
        located(&validation.diagnostics),
        vec![at("invalid-value", "topologies/t/p.yaml", 6, 3)],
        "{:#?}",
        validation.diagnostics
    );
    let message = &validation.errors().next().unwrap().message;
    assert!(
        message.contains("`PLUMBER_DELIVERY` is reserved") && message.contains("rename"),
        "{message}"
    );
}

#[test]
fn secrets_credentials_and_resources_are_checked_where_they_are_written() {
    let repo = TestRepo::new();
    let good = repo.commit(
        "main",
        "secrets",
        &[
            write(
                "plumber.yaml",
                "clusters:\n  default:\n    bootstrap: k:9092\n    properties:\n      security.protocol: SASL_SSL\n      sasl.mechanism: SCRAM-SHA-512\n    credentials: { secret: kafka-user }\n",
            ),
            write("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
            write(
                "topologies/t/p.yaml",
                "kind: processor\ninput: in\njq: .\nenv:\n  MODEL: v3\n  API_KEY: { secretKeyRef: { name: scoring, key: api-key } }\nresources: { cpu: 500m, memory: 256Mi }\n",
            ),
            write("topologies/t/out.yaml", "kind: sink\ntopic: out\ninput: p\n"),
        ],
    );
    let validation = validate_commit(&repo, good);
    assert!(validation.is_valid(), "{:#?}", validation.diagnostics);

    let bad = repo.commit(
        "main",
        "bad secrets",
        &[
            write(
                "plumber.yaml",
                "clusters:\n  default:\n    bootstrap: k:9092\n    properties:\n      sasl.password: hunter2\n      group.id: mine\n    credentials: { secret: Kafka_User }\n",
            ),
            write(
                "topologies/t/p.yaml",
                "kind: processor\ninput: in\njq: .\nenv:\n  A: { secretKeyRef: { name: scoring } }\n  B: { secretKeyRef: { name: s, key: ../x } }\n  C: { valueFrom: x }\nresources: { cpu: lots, memory: 256MB, gpu: 1 }\n",
            ),
        ],
    );
    let validation = validate_commit(&repo, bad);
    assert_eq!(
        located(&validation.diagnostics),
        vec![
            at("invalid-value", "plumber.yaml", 5, 7),
            at("invalid-value", "plumber.yaml", 6, 7),
            at("invalid-value", "plumber.yaml", 7, 28),
            at("missing-field", "topologies/t/p.yaml", 5, 8),
            at("invalid-value", "topologies/t/p.yaml", 6, 38),
            at("missing-field", "topologies/t/p.yaml", 7, 3),
            at("unknown-field", "topologies/t/p.yaml", 7, 8),
            at("invalid-value", "topologies/t/p.yaml", 8, 19),
            at("invalid-value", "topologies/t/p.yaml", 8, 33),
            at("unknown-field", "topologies/t/p.yaml", 8, 40),
        ],
        "{:#?}",
        validation.diagnostics
    );
    let messages: Vec<&str> = validation.errors().map(|d| d.message.as_str()).collect();
    let password = messages
        .iter()
        .find(|m| m.contains("sasl.password"))
        .unwrap();
    assert!(password.contains("never lives in Git"), "{password}");
    assert!(
        !messages.iter().any(|m| m.contains("hunter2")),
        "{messages:?}"
    );
}

/// SPEC §11: `plumber.yaml` reaches every client of the cluster, the daemon's too; what
/// weakens delivery or TLS, runs code or is not a known tuning knob is an error at its key.
#[test]
fn properties_that_weaken_delivery_tls_or_run_code_are_errors_at_their_key() {
    let repo = TestRepo::new();
    let refused = [
        ("acks", "\"1\""),
        ("request.required.acks", "0"),
        ("enable.idempotence", "\"false\""),
        ("max.in.flight.requests.per.connection", "5"),
        ("isolation.level", "read_uncommitted"),
        ("enable.auto.commit", "\"true\""),
        ("enable.ssl.certificate.verification", "\"false\""),
        ("ssl.endpoint.identification.algorithm", "none"),
        ("plugin.library.paths", "/tmp/evil.so"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            "https://attacker.example/token",
        ),
        ("debug", "all"),
    ];
    let mut yaml = String::from("clusters:\n  default:\n    bootstrap: k:9092\n    properties:\n");
    yaml.push_str("      linger.ms: 20\n      security.protocol: SASL_SSL\n");
    for (key, value) in refused {
        yaml.push_str(&format!("      {key}: {value}\n"));
    }
    let commit = repo.commit(
        "main",
        "weakening properties",
        &[
            write("plumber.yaml", &yaml),
            write("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
            write("topologies/t/p.yaml", "kind: processor\ninput: in\njq: .\n"),
            write(
                "topologies/t/out.yaml",
                "kind: sink\ntopic: out\ninput: p\n",
            ),
        ],
    );
    let validation = validate_commit(&repo, commit);
    let expected: Vec<_> = (0..refused.len())
        .map(|i| at("invalid-value", "plumber.yaml", 7 + i as u32, 7))
        .collect();
    assert_eq!(
        located(&validation.diagnostics),
        expected,
        "{:#?}",
        validation.diagnostics
    );
    for (diagnostic, (key, _)) in validation.errors().zip(refused) {
        assert!(
            diagnostic.message.contains(&format!("`{key}`")),
            "{key}: {}",
            diagnostic.message
        );
    }
    let acks = validation.errors().next().unwrap();
    assert!(
        acks.message.contains("delivery promise") && acks.message.contains("min.insync.replicas"),
        "says why and what to do instead: {}",
        acks.message
    );
}

/// Programs nested `depth` levels in each way jaq's parser recurses, each under the file cap.
fn deep_jq_programs(depth: usize) -> Vec<(&'static str, String)> {
    vec![
        (
            "parentheses",
            format!("{}.{}", "(".repeat(depth), ")".repeat(depth)),
        ),
        (
            "arrays",
            format!("{}.{}", "[".repeat(depth), "]".repeat(depth)),
        ),
        (
            "interpolations",
            format!("{}.{}", "\"\\(".repeat(depth), ")\"".repeat(depth)),
        ),
        ("negations", format!("{}1", "-".repeat(depth))),
        ("pipes", format!("{}.", ".|".repeat(depth))),
        ("sums", format!("1{}", "+1".repeat(depth))),
        ("tries", format!("{}.", "try ".repeat(depth))),
    ]
}

fn jq_step(program: &str) -> String {
    // A YAML literal block keeps the program as written.
    format!("kind: processor\ninput: in\njq: |\n  {program}\n")
}

#[test]
fn deeply_nested_jq_programs_are_errors_not_crashes() {
    // 200,000 levels (400 KB) overflowed the stack of `plumber validate`; through the CLI, so
    // a crash is an exit status instead of the end of this test binary.
    for (how, program) in deep_jq_programs(200_000) {
        let repo = TestRepo::new();
        repo.commit(
            "main",
            how,
            &[
                write("topologies/t/in.yaml", "kind: source\ntopic: in\n"),
                write("topologies/t/deep.yaml", jq_step(&program)),
                write(
                    "topologies/t/out.yaml",
                    "kind: sink\ntopic: out\ninput: deep\n",
                ),
            ],
        );
        let (code, stdout, stderr) = run(&["validate", &repo.location()]);
        assert_eq!(code, 1, "{how}: {stdout}{stderr}");
        assert!(
            stdout.contains("topologies/t/deep.yaml:3:1: invalid-jq:")
                && stdout.contains("nested")
                && stdout.contains("levels"),
            "{how}: {stdout}"
        );
    }
}

#[test]
fn validate_is_safe_on_a_small_stack() {
    // The daemon calls `plumber::validate` from its own threads: the depth limits must hold
    // there too, whatever that thread's stack. 256 KiB is far below any default.
    let files: Vec<_> = deep_jq_programs(200_000)
        .into_iter()
        .map(|(how, program)| (format!("topologies/t/{how}.yaml"), jq_step(&program)))
        .chain([
            (
                "topologies/t/in.yaml".to_string(),
                "kind: source\ntopic: in\n".to_string(),
            ),
            // The deepest program that is allowed, and YAML nested up to the file cap.
            (
                "topologies/t/ok.yaml".to_string(),
                jq_step(&format!("{}.{}", "(".repeat(100), ")".repeat(100))),
            ),
            (
                "topologies/t/yaml.yaml".to_string(),
                "a:\n".to_string() + &"  - ".repeat(200_000),
            ),
        ])
        .map(|(path, content)| plumber::spec::SourceFile {
            path,
            content: plumber::spec::FileContent::Bytes(content.into_bytes()),
        })
        .collect();
    let validation = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || plumber::validate(&files))
        .unwrap()
        .join()
        .expect("validation returns on a small stack");
    let mut found: Vec<(String, String)> = validation
        .errors()
        .map(|d| (d.code.to_string(), d.file.clone()))
        .collect();
    found.sort();
    let mut expected: Vec<(String, String)> = deep_jq_programs(1)
        .into_iter()
        .map(|(how, _)| ("invalid-jq".to_string(), format!("topologies/t/{how}.yaml")))
        .chain([(
            "yaml-syntax".to_string(),
            "topologies/t/yaml.yaml".to_string(),
        )])
        .collect();
    expected.sort();
    assert_eq!(found, expected, "{:#?}", validation.diagnostics);
}

#[test]
fn deeply_nested_directories_are_read_without_a_crash() {
    // libgit2's tree walk recursed once per directory level: 100,000 levels overflowed the
    // stack of `plumber validate` before any validation ran.
    let repo = TestRepo::new();
    let git = &repo.git;
    // Loose tree objects written directly (zlib with one stored block): through libgit2 the
    // 100,000 writes take half a minute in a debug build.
    let objects = git.path().join("objects");
    let entry = |mode: &str, name: &str, id: git2::Oid| {
        let mut body = format!("{mode} {name}\0").into_bytes();
        body.extend_from_slice(id.as_bytes());
        let tree = git2::Oid::hash_object(git2::ObjectType::Tree, &body).unwrap();
        let mut raw = format!("tree {}\0", body.len()).into_bytes();
        raw.extend_from_slice(&body);
        let (mut a, mut b) = (1u32, 0u32);
        for byte in &raw {
            a = (a + u32::from(*byte)) % 65_521;
            b = (b + a) % 65_521;
        }
        let length = u16::try_from(raw.len()).unwrap();
        let mut zlib = vec![0x78, 0x01, 0x01];
        zlib.extend_from_slice(&length.to_le_bytes());
        zlib.extend_from_slice(&(!length).to_le_bytes());
        zlib.extend_from_slice(&raw);
        zlib.extend_from_slice(&(b << 16 | a).to_be_bytes());
        let hex = tree.to_string();
        let dir = objects.join(&hex[..2]);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(&hex[2..]), zlib).unwrap();
        tree
    };
    let blob = git.blob(b"kind: source\ntopic: deep\n").unwrap();
    let mut tree = entry("100644", "deep.yaml", blob);
    for name in std::iter::repeat_n("a", 100_000).chain(["t", "topologies"]) {
        tree = entry("40000", name, tree);
    }
    let tree = git.find_tree(tree).unwrap();
    let signature = git2::Signature::now("Test", "test@example.com").unwrap();
    git.commit(
        Some("refs/heads/main"),
        &signature,
        &signature,
        "deep",
        &tree,
        &[],
    )
    .unwrap();
    let (code, stdout, stderr) = run(&["validate", &repo.location()]);
    let tail = |s: &str| s.chars().rev().take(300).collect::<String>();
    assert_eq!(code, 0, "{} {}", tail(&stdout), tail(&stderr));
    assert!(
        stdout.contains("valid: 1 topology, 1 step"),
        "{}",
        tail(&stdout)
    );
}
