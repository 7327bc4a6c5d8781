//! `sql:` steps in the repository: validated when loaded, every problem at the line and
//! column inside the query where it is written (whatever the YAML style), part of the
//! step's identity, and shown by `graph` and `plan`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use common::{TestRepo, run, write};
use plumber::graph::Topology;
use plumber::spec::{FileContent, SourceFile};

const SOURCES: [(&str, &str); 3] = [
    ("sources/telemetry", "kind: source\ntopic: telemetry\n"),
    ("sources/trucks", "kind: source\ntopic: trucks\n"),
    ("sinks/out", "kind: sink\ntopic: out\ninput: step\n"),
];

fn files(step: &str) -> Vec<SourceFile> {
    SOURCES
        .iter()
        .copied()
        .chain([("steps/step", step)])
        .map(|(name, yaml)| SourceFile {
            path: format!("topologies/t/{name}.yaml"),
            content: FileContent::Bytes(yaml.as_bytes().to_vec()),
        })
        .collect()
}

/// The errors of a topology whose processor `step` has this file.
fn errors(step: &str) -> Vec<(String, u32, u32, String)> {
    plumber::validate(&files(step))
        .errors()
        .map(|d| {
            (
                d.code.to_string(),
                d.line.unwrap_or(0),
                d.column.unwrap_or(0),
                d.message.clone(),
            )
        })
        .collect()
}

fn topology(step: &str) -> Topology {
    let validation = plumber::validate(&files(step));
    let errors: Vec<_> = validation.errors().collect();
    assert!(errors.is_empty(), "{step}: {errors:?}");
    validation.topologies.unwrap().remove(0)
}

/// The single `invalid-sql` error of `step`, as (line, column, message).
fn sql_error(step: &str) -> (u32, u32, String) {
    let mut all = errors(step);
    assert_eq!(all.len(), 1, "{step}: {all:?}");
    let (code, line, column, message) = all.remove(0);
    assert_eq!(code, "invalid-sql", "{step}: {message}");
    (line, column, message)
}

#[test]
fn queries_in_every_yaml_style_validate() {
    let styles = [
        "kind: processor\ninput: telemetry\nsql: SELECT id, speed * 3.6 AS kmh FROM telemetry WHERE speed > 10\n",
        "kind: processor\ninput: telemetry\nsql: 'SELECT id FROM telemetry WHERE name = ''it''''s'''\n",
        "kind: processor\ninput: telemetry\nsql: \"SELECT id,\\n  _headers.trace\\tFROM telemetry\"\n",
        "kind: processor\ninput: telemetry\nsql: |\n  SELECT id,\n         UPPER(name) AS name\n  FROM telemetry\n  WHERE speed BETWEEN 10 AND 100\n",
        "kind: processor\ninput: telemetry\nsql: >\n  SELECT *\n  FROM telemetry\n",
        "kind: processor\ninput: [telemetry, trucks]\nsql: |\n  SELECT id, speed FROM telemetry\n  UNION ALL\n  SELECT id, velocity AS speed FROM trucks\n",
    ];
    for step in styles {
        topology(step);
    }
}

#[test]
fn problems_are_reported_inside_the_query_whatever_its_style() {
    // Plain: `GROUP` is at column 26 of the query, the query at column 6 of line 3.
    let (line, column, message) =
        sql_error("kind: processor\ninput: telemetry\nsql: SELECT id FROM telemetry GROUP BY id\n");
    assert_eq!((line, column), (3, 31), "{message}");
    assert!(
        message.contains("GROUP BY must include `_key`"),
        "{message}"
    );

    // Double-quoted, with escapes before the problem.
    let (line, column, message) = sql_error(
        "kind: processor\ninput: telemetry\nsql: \"SELECT \\\"id\\\",\\n COUNT(*) FROM telemetry\"\n",
    );
    assert_eq!((line, column), (3, 24), "{message}");
    assert!(message.contains("COUNT is an aggregate"), "{message}");

    // A literal block: the third line of the query is the file's sixth.
    let (line, column, message) = sql_error(
        "kind: processor\ninput: telemetry\nsql: |\n  SELECT id\n  FROM telemetry\n  WHERE nosuch(id) > 1\n",
    );
    assert_eq!((line, column), (6, 9), "{message}");
    assert!(message.contains("unknown function `nosuch`"), "{message}");

    // A folded block: folding joins the lines, positions stay where they are written.
    let (line, column, message) = sql_error(
        "kind: processor\ninput: telemetry\nsql: >-\n    SELECT id\n    FROM telemetry\n    ORDER BY id\n",
    );
    assert_eq!((line, column), (6, 5), "{message}");
    assert!(message.contains("ORDER BY"), "{message}");

    // A syntax error at the end of a block.
    let (line, column, message) = sql_error(
        "kind: processor\ninput: telemetry\nsql: |\n  SELECT id\n  FROM telemetry WHERE\n",
    );
    assert_eq!((line, column), (5, 23), "{message}");
    assert!(message.contains("syntax error"), "{message}");

    // Single-quoted, after a doubled quote.
    let (line, column, message) = sql_error(
        "kind: processor\ninput: telemetry\nsql: 'SELECT ''a'' AS x, 1 / 0 AS y FROM telemetry'\n",
    );
    assert_eq!((line, column), (3, 26), "{message}");
    assert!(message.contains("division by zero"), "{message}");
}

#[test]
fn every_problem_of_every_query_is_reported_at_once() {
    let step = "kind: processor\ninput: telemetry\nsql: |\n  SELECT COUNT(id), UPPER(1)\n  FROM telemetry\n  GROUP BY id\n  LIMIT 3\n";
    let found: Vec<(u32, u32)> = errors(step).iter().map(|e| (e.1, e.2)).collect();
    // COUNT is at home in a query with GROUP BY; grouping by `id` alone is not.
    assert_eq!(found, [(4, 21), (6, 3), (7, 3)]);

    // Across files: every step's query is checked.
    let mut files =
        files("kind: processor\ninput: telemetry\nsql: SELECT id FROM telemetry ORDER BY id\n");
    files.push(SourceFile {
        path: "topologies/t/steps/other.yaml".into(),
        content: FileContent::Bytes(
            b"kind: processor\ninput: telemetry\nsql: SELECT DISTINCT id FROM telemetry\n".to_vec(),
        ),
    });
    let validation = plumber::validate(&files);
    let sql: Vec<(&str, Option<u32>)> = validation
        .errors()
        .filter(|d| d.code.to_string() == "invalid-sql")
        .map(|d| (d.file.as_str(), d.column))
        .collect();
    assert_eq!(
        sql,
        [
            ("topologies/t/steps/other.yaml", Some(13)),
            ("topologies/t/steps/step.yaml", Some(31)),
        ]
    );
}

#[test]
fn from_names_the_inputs_and_a_fan_in_reads_all_of_them() {
    let (line, column, message) =
        sql_error("kind: processor\ninput: telemetry\nsql: SELECT id FROM trucks\n");
    assert_eq!((line, column), (3, 21));
    assert!(message.contains("the step reads `telemetry`"), "{message}");

    let (_, _, message) =
        sql_error("kind: processor\ninput: [telemetry, trucks]\nsql: SELECT id FROM telemetry\n");
    assert!(
        message.contains("UNION ALL SELECT … FROM trucks"),
        "{message}"
    );

    let (line, column, message) = sql_error(
        "kind: processor\ninput: [telemetry, trucks]\nsql: SELECT id, speed FROM telemetry UNION ALL SELECT id, velocity FROM trucks\n",
    );
    assert_eq!((line, column), (3, 48));
    assert!(message.contains("named alike"), "{message}");
}

#[test]
fn sql_is_one_of_the_transforms() {
    let all = errors("kind: processor\ninput: telemetry\njq: .\nsql: SELECT * FROM telemetry\n");
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!((all[0].0.as_str(), all[0].1), ("transform-count", 4));
    let none = errors("kind: processor\ninput: telemetry\n");
    assert!(none[0].3.contains("`sql`"), "{none:?}");
    let not_a_string = errors("kind: processor\ninput: telemetry\nsql: [SELECT]\n");
    assert_eq!(not_a_string[0].0, "invalid-value", "{not_a_string:?}");
}

#[test]
fn the_query_is_part_of_the_identity() {
    let identity = |query: &str| {
        let topology = topology(&format!(
            "kind: processor\ninput: telemetry\nsql: {query}\n"
        ));
        let id = topology.find("step").unwrap();
        topology.step(id).identity
    };
    let a = identity("SELECT id FROM telemetry WHERE speed > 10");
    assert_eq!(a, identity("SELECT id FROM telemetry WHERE speed > 10"));
    assert_ne!(a, identity("SELECT id FROM telemetry WHERE speed > 11"));
}

#[test]
fn graph_and_plan_show_the_query() {
    let repo = TestRepo::new();
    let query = "SELECT id, speed FROM telemetry WHERE speed > 10";
    let commit = repo.commit(
        "main",
        "sql step",
        &[
            write(
                "topologies/t/sources/telemetry.yaml",
                "kind: source\ntopic: telemetry\n",
            ),
            write(
                "topologies/t/steps/fast.yaml",
                format!("kind: processor\ninput: telemetry\nsql: {query}\n"),
            ),
            write(
                "topologies/t/sinks/out.yaml",
                "kind: sink\ntopic: out\ninput: fast\n",
            ),
        ],
    );
    let rev = commit.to_string();
    let location = repo.location();
    let (code, json, err) = run(&["graph", &location, "--rev", &rev, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let graph: serde_json::Value = serde_json::from_str(&json).unwrap();
    let fast = graph["topologies"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "fast")
        .unwrap()
        .clone();
    assert_eq!(
        fast["transform"],
        serde_json::json!({"sql": {"query": query}})
    );
    let (code, dot, _) = run(&["graph", &location, "--rev", &rev, "--format", "dot"]);
    assert_eq!(code, 0);
    assert!(dot.contains("fast\\nsql"), "{dot}");

    let (code, plan, err) = run(&["plan", &location, "--to", &rev, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let start = plan["topologies"][0]["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == "start-processor" && a["step"] == "fast")
        .unwrap_or_else(|| panic!("{plan}"))
        .clone();
    assert_eq!(start["transform"]["sql"]["query"], query);
    let (code, text, _) = run(&["plan", &location, "--to", &rev]);
    assert_eq!(code, 0);
    assert!(text.contains(query), "{text}");
}

#[test]
fn cli_reports_sql_errors_at_their_place() {
    let repo = TestRepo::new();
    let commit = repo.commit(
        "main",
        "bad sql",
        &[
            write("topologies/t/sources/telemetry.yaml", "kind: source\ntopic: telemetry\n"),
            write(
                "topologies/t/steps/fast.yaml",
                "kind: processor\ninput: telemetry\nsql: |\n  SELECT id\n  FROM telemetry\n  GROUP BY id\n",
            ),
            write("topologies/t/sinks/out.yaml", "kind: sink\ntopic: out\ninput: fast\n"),
        ],
    );
    let (code, out, _) = run(&["validate", &repo.location(), "--rev", &commit.to_string()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("topologies/t/steps/fast.yaml:6:3: invalid-sql: GROUP BY must include `_key`"),
        "{out}"
    );
}

/// The local runtime starts a sql step as `--sql QUERY` with `--sql-input STEP=TOPIC` for
/// each input step (here with a stand-in processor that writes its arguments down).
#[test]
fn the_local_runtime_passes_the_query_and_the_topics_of_its_input_steps() {
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt as _;
    use std::time::Duration;

    use plumber::runtime::local::{LocalConfig, LocalRuntime};
    use plumber::runtime::{ProcessorSpec, Runtime};
    use plumber::spec::Transform;

    let dir = tempfile::tempdir().unwrap();
    let args = dir.path().join("args");
    let script = dir.path().join("processor.sh");
    std::fs::write(
        &script,
        format!(
            "#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > {0}.tmp && mv {0}.tmp {0}\ntrap 'exit 0' TERM\nwhile true; do sleep 1000 & wait $!; done\n",
            args.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runtime = LocalRuntime::open(
        &dir.path().join("state"),
        LocalConfig {
            processor: script,
            stop_timeout: Duration::from_secs(30),
            max_backoff: Duration::from_secs(30),
            max_log_bytes: 64 * 1024,
            checkouts: dir.path().to_path_buf(),
            secrets: None,
            kafka_credentials: None,
        },
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("c0ffee")).unwrap();
    let query = "SELECT id FROM cars\nUNION ALL SELECT id FROM trucks";
    let spec = ProcessorSpec {
        topology: "t".into(),
        step: "both".into(),
        identity: "cd".repeat(32).parse().unwrap(),
        group: "plumber.t.both.cdcdcdcdcdcd".into(),
        cluster: plumber::runtime::Cluster::at("127.0.0.1:1"),
        inputs: vec![
            "cars.raw".into(),
            "plumber.t.fast-trucks.abababababab".into(),
        ],
        input_steps: BTreeMap::from([
            ("cars".into(), "cars.raw".into()),
            ("trucks".into(), "plumber.t.fast-trucks.abababababab".into()),
        ]),
        outputs: vec!["out".into()],
        dlq: "plumber.t.both.dlq".into(),
        transform: Transform::Sql {
            query: query.into(),
            state: None,
            table: None,
        },
        env: BTreeMap::new(),
        scale: plumber::spec::Scale {
            min: 1,
            max: 1,
            lag_threshold: 1,
        },
        resources: None,
        commit: "c0ffee".into(),
        dir: String::new(),
        settings: Default::default(),
        state: None,
        table: None,
        handoff_group: None,
    };
    runtime.start(&spec).unwrap();
    plumber_testkit::wait_until(
        "the processor wrote its arguments",
        Duration::from_secs(60),
        || args.exists(),
    );
    let written = std::fs::read_to_string(&args).unwrap();
    runtime.stop(&spec.group).unwrap();
    let lines: Vec<&str> = written.lines().collect();
    let after = |flag: &str| -> Vec<String> {
        lines
            .windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].to_owned())
            .collect()
    };
    // The query is one argument, line break and all.
    assert!(
        written.contains("--sql\nSELECT id FROM cars\nUNION ALL SELECT id FROM trucks\n"),
        "{written}"
    );
    assert_eq!(
        after("--sql-input"),
        ["cars=cars.raw", "trucks=plumber.t.fast-trucks.abababababab"]
    );
    assert_eq!(
        after("--input"),
        ["cars.raw", "plumber.t.fast-trucks.abababababab"]
    );
}

/// A query with GROUP BY is a stateful step: it validates with its state settings, which
/// go with it only; a bad setting is reported at its key.
#[test]
fn a_stateful_query_validates_with_its_state_settings_and_only_with_them() {
    let counting = "kind: processor\ninput: telemetry\nsql: |\n  SELECT _key AS car, COUNT(*) AS n, window_start\n  FROM telemetry\n  GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)\n";
    let set = topology(&format!(
        "{counting}grace: 30s\nemit: update\nstateMaxGroups: 5000\nstateStart: empty\n"
    ));
    let (_, step) = set.steps().find(|(_, s)| s.name == "step").unwrap();
    let plumber::graph::StepKind::Processor { transform, .. } = &step.kind else {
        panic!("a processor");
    };
    let plumber::spec::Transform::Sql {
        state: Some(state), ..
    } = transform
    else {
        panic!("a stateful sql step: {transform:?}");
    };
    assert_eq!(state.grace_ms, 30_000);
    assert_eq!(state.emit, plumber::spec::Emit::Update);
    assert_eq!(state.max_groups, Some(5_000));
    assert_eq!(state.start, Some(plumber::spec::StateStart::Empty));
    // Defaults: no grace, emit on close.
    let plain = topology(counting);
    let (_, step) = plain.steps().find(|(_, s)| s.name == "step").unwrap();
    assert!(matches!(
        &step.kind,
        plumber::graph::StepKind::Processor {
            transform: plumber::spec::Transform::Sql { state: Some(s), .. },
            ..
        } if s.grace_ms == 0 && s.emit == plumber::spec::Emit::Close
    ));

    let bad = errors(&format!("{counting}grace: soon\nemit: often\n"));
    assert_eq!(
        bad.iter().map(|e| (e.1, e.2)).collect::<Vec<_>>(),
        [(7, 1), (8, 1)],
        "{bad:?}"
    );
    assert!(
        bad[0].3.contains("`grace` is a duration like `30s`"),
        "{bad:?}"
    );
    assert!(
        bad[1].3.contains("`emit` must be one of close | update"),
        "{bad:?}"
    );
    let long = errors(&format!("{counting}grace: 30d\n"));
    assert!(long[0].3.contains("at most 7d"), "{long:?}");

    let stateless =
        errors("kind: processor\ninput: telemetry\nsql: SELECT id FROM telemetry\ngrace: 5s\n");
    assert_eq!(stateless.len(), 1, "{stateless:?}");
    assert_eq!((stateless[0].1, stateless[0].2), (4, 1));
    assert!(
        stateless[0]
            .3
            .contains("`grace` is for a `sql` step with GROUP BY"),
        "{stateless:?}"
    );
    let jq = errors("kind: processor\ninput: telemetry\njq: .\nemit: update\n");
    assert!(jq[0].3.contains("a `jq` step keeps none"), "{jq:?}");
}

/// A JOIN validates with its table, a source, and `tableMaxBytes`; the table is not read
/// through the step's group (it is no input of its start), and it may not be a processor.
#[test]
fn a_join_validates_with_a_source_as_its_table() {
    let join = "kind: processor\ninput: [telemetry, trucks]\nsql: SELECT t.id, c.name FROM telemetry t JOIN trucks c ON t.truck = c._key\n";
    let set = topology(&format!("{join}tableMaxBytes: 67108864\n"));
    let id = set.find("step").unwrap();
    let plumber::graph::StepKind::Processor {
        transform: plumber::spec::Transform::Sql {
            table: Some(table), ..
        },
        ..
    } = &set.step(id).kind
    else {
        panic!("a join");
    };
    assert_eq!(table.step, "trucks");
    assert_eq!(table.max_bytes, Some(64 << 20));
    assert_eq!(set.table_input(id), set.find("trucks"));
    assert_eq!(set.group_inputs(id), vec![set.find("telemetry").unwrap()]);
    let plan = plumber::plan::plan_topology(None, Some(&set));
    let start = plan
        .actions
        .iter()
        .find_map(|a| match a {
            plumber::plan::Action::StartProcessor(s) if s.step == "step" => Some(s),
            _ => None,
        })
        .expect("the join starts");
    let inputs: Vec<&str> = start.inputs.iter().map(|i| i.topic.as_str()).collect();
    assert_eq!(inputs, ["telemetry"], "the table is read outside the group");
    assert_eq!(start.table.as_deref(), Some("trucks"));
    // The plan says what the new life reads of its table, in the action and apart.
    let action =
        plumber::output::plan::describe(&plumber::plan::Action::StartProcessor(start.clone()));
    assert!(
        action.contains("reading `telemetry` from latest")
            && action.contains("table: `trucks` read whole, from its beginning"),
        "{action}"
    );
    let whole = plumber::plan::Plan {
        from: None,
        to: "c1".into(),
        topologies: vec![plan.clone()],
        keep_topics: false,
    };
    let comment = plumber::output::plan::markdown(&whole, std::slice::from_ref(&set), &[]);
    assert!(
        comment.contains(
            "State of the stateful steps that start:\n\n- `step`: its table `trucks` read whole"
        ),
        "{comment}"
    );

    let small = errors(&format!("{join}tableMaxBytes: 10\n"));
    assert_eq!((small[0].1, small[0].2), (4, 1), "{small:?}");
    let elsewhere = errors(
        "kind: processor\ninput: telemetry\nsql: SELECT id FROM telemetry\ntableMaxBytes: 1048576\n",
    );
    assert!(
        elsewhere[0]
            .3
            .contains("`tableMaxBytes` is for a `sql` step with JOIN"),
        "{elsewhere:?}"
    );
    let grouped = errors(&format!("{join}grace: 5s\n"));
    assert!(
        grouped[0]
            .3
            .contains("`grace` is for a `sql` step with GROUP BY"),
        "{grouped:?}"
    );

    // A processor's output as the table: refused at the input that names it.
    let mut files = files(
        "kind: processor\ninput:\n  - telemetry\n  - fleet\nsql: SELECT t.id, c.name FROM telemetry t JOIN fleet c ON t.truck = c._key\n",
    );
    files.push(SourceFile {
        path: "topologies/t/steps/fleet.yaml".into(),
        content: FileContent::Bytes(b"kind: processor\ninput: trucks\njq: .\n".to_vec()),
    });
    let validation = plumber::validate(&files);
    let refused: Vec<_> = validation.errors().collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].file, "topologies/t/steps/step.yaml");
    assert_eq!((refused[0].line, refused[0].column), (Some(4), Some(5)));
    assert!(
        refused[0].message.contains("a table is a source"),
        "{}",
        refused[0].message
    );
}
