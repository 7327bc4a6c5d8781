//! `plumber test`: step tests beside step files, run with the processor's own transforms:
//! passing and failing cases of jq and sql steps (an expected dead letter included), a step
//! the command does not run said so, and bad test files reported at file:line like step files.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

mod common;

use common::{TestRepo, run, write};

const SOURCES: [(&str, &str); 3] = [
    (
        "topologies/t/sources/cars.yaml",
        "kind: source\ntopic: cars\n",
    ),
    (
        "topologies/t/sources/trucks.yaml",
        "kind: source\ntopic: trucks\n",
    ),
    (
        "topologies/t/sinks/out.yaml",
        "kind: sink\ntopic: out\ninput: [fast, both, score]\n",
    ),
];

const FAST: &str =
    "kind: processor\ninput: cars\njq: 'select(.speed > 20) | {id, kmh: (.speed * 3.6)}'\n";
const BOTH: &str = "kind: processor\ninput: [cars, trucks]\nsql: SELECT id, 'car' AS kind FROM cars UNION ALL SELECT id, 'truck' AS kind FROM trucks\n";
const SCORE: &str = "kind: processor\ninput: cars\nexec:\n  command: [python3, score.py]\n";

const FAST_TESTS: &str = r#"cases:
  - name: a fast car passes, converted
    input: { key: car-1, value: { id: 1, speed: 30 }, headers: { trace: t1 } }
    output:
      - { key: car-1, value: { id: 1, kmh: 108 }, headers: { trace: t1 } }
  - name: a slow car is filtered out
    input: { value: { id: 2, speed: 5 } }
    output: []
  - name: text is dead-lettered
    input: { raw: "not json" }
    deadLetter: invalid-json
  - name: a wrong expectation fails
    input: { value: { id: 3, speed: 40 } }
    output:
      - value: { id: 3, kmh: 999 }
"#;

const BOTH_TESTS: &str = r#"cases:
  - name: a truck is labelled
    input: { from: trucks, value: { id: 7 } }
    output:
      - value: { id: 7, kind: truck }
  - name: a car is labelled
    input: { value: { id: 8 } }
    output:
      - value: { id: 8, kind: car }
"#;

const SCORE_TESTS: &str = r#"cases:
  - name: scored
    input: { value: { id: 1 } }
    output: [{ value: { id: 1, score: 1 } }]
"#;

/// `score.yaml`'s command: the exec protocol, one answer line per record.
const SCORE_PY: &str = r#"import json, sys
for line in sys.stdin:
    record = json.loads(line)
    print(json.dumps({"id": record["id"], "outputs": [{"value": {**record["value"], "score": 1}}]}), flush=True)
"#;

fn commit(repo: &TestRepo, extra: &[(&str, &str)]) -> String {
    let mut files: Vec<_> = SOURCES.iter().map(|(p, c)| write(p, *c)).collect();
    files.push(write("topologies/t/steps/fast.yaml", FAST));
    files.push(write("topologies/t/steps/both.yaml", BOTH));
    files.push(write("topologies/t/steps/score.yaml", SCORE));
    files.push(write("topologies/t/steps/score.py", SCORE_PY));
    files.extend(extra.iter().map(|(p, c)| write(p, *c)));
    repo.commit("main", "steps and tests", &files).to_string()
}

#[test]
fn each_case_passes_or_fails_with_what_it_expected_and_what_came() {
    let repo = TestRepo::new();
    let rev = commit(
        &repo,
        &[
            ("topologies/t/steps/fast.test.yaml", FAST_TESTS),
            ("topologies/t/steps/both.test.yaml", BOTH_TESTS),
            ("topologies/t/steps/score.test.yaml", SCORE_TESTS),
        ],
    );
    // Test files are not steps: the commit validates.
    let (code, out, _) = run(&["validate", &repo.location(), "--rev", &rev]);
    assert_eq!(code, 0, "{out}");

    let (code, out, err) = run(&["test", &repo.location(), "--rev", &rev]);
    assert_eq!(code, 1, "a case fails: {out}{err}");
    let fast = "topologies/t/steps/fast.test.yaml";
    for line in [
        format!("{fast}:2:5: fast: a fast car passes, converted: ok"),
        format!("{fast}:6:5: fast: a slow car is filtered out: ok"),
        format!("{fast}:9:5: fast: text is dead-lettered: ok"),
        format!("{fast}:12:5: fast: a wrong expectation fails: FAILED"),
        "  expected: {\"id\":3,\"kmh\":999}".to_owned(),
        "  actual:   no key {\"id\":3,\"kmh\":144}".to_owned(),
        "topologies/t/steps/both.test.yaml:2:5: both: a truck is labelled: ok".to_owned(),
        "topologies/t/steps/both.test.yaml:6:5: both: a car is labelled: ok".to_owned(),
        "topologies/t/steps/score.test.yaml:2:5: score: scored: ok".to_owned(),
        "7 cases: 6 passed, 1 failed, 0 not run".to_owned(),
    ] {
        assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    }
    // Without commands, the exec step's case is not run, and says why.
    let (code, out, err) = run(&["test", &repo.location(), "--rev", &rev, "--no-commands"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("score: scored: not run: an exec step runs a command of the commit: not with `--no-commands`"),
        "{out}"
    );
    assert!(
        out.contains("7 cases: 5 passed, 1 failed, 1 not run"),
        "{out}"
    );

    // One step, as JSON.
    let (code, out, _) = run(&[
        "test",
        &repo.location(),
        "--rev",
        &rev,
        "--step",
        "both",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["passed"], true);
    let results: Vec<(&str, &str)> = json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["result"].as_str().unwrap()))
        .collect();
    assert_eq!(
        results,
        [
            ("a truck is labelled", "passed"),
            ("a car is labelled", "passed")
        ]
    );
}

#[test]
fn bad_test_files_are_reported_at_their_line_like_step_files() {
    let repo = TestRepo::new();
    let rev = commit(
        &repo,
        &[
            (
                "topologies/t/steps/fast.test.yaml",
                "cases:\n  - name: no expectation\n    input: { value: 1 }\n  - name: both\n    input: { value: 1, raw: x }\n    output: []\n",
            ),
            ("topologies/t/steps/gone.test.yaml", "cases: []\n"),
        ],
    );
    let (code, out, _) = run(&["validate", &repo.location(), "--rev", &rev]);
    assert_eq!(code, 1, "{out}");
    for line in [
        "topologies/t/steps/fast.test.yaml:2:5: missing-field: case `no expectation` says what it expects",
        "topologies/t/steps/fast.test.yaml:5:24: invalid-value: a record has `value`",
        "topologies/t/steps/gone.test.yaml:1:1: invalid-value: tests step `gone`, which topology `t` does not have",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    let (code, _, err) = run(&["test", &repo.location(), "--rev", &rev]);
    assert_eq!(code, 1, "an invalid commit's tests do not run: {err}");
}

/// The example repository ships tests of its jq and sql steps, and they pass.
#[test]
fn the_example_repository_s_step_tests_pass() {
    let repo = TestRepo::new();
    let rev = repo
        .commit_snapshot("main", "example", &common::example_files())
        .to_string();
    let (code, out, err) = run(&["test", &repo.location(), "--rev", &rev]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.ends_with("15 cases: 15 passed, 0 failed, 0 not run\n"),
        "{out}"
    );
}

/// `plumber plan` runs the step tests of what it plans: a failed case makes the plan fail at
/// the case's line, as an invalid step would; when they pass the plan is made.
#[test]
fn a_plan_fails_when_a_step_test_fails() {
    let repo = TestRepo::new();
    let passing = commit(&repo, &[("topologies/t/steps/both.test.yaml", BOTH_TESTS)]);
    let (code, out, err) = run(&["plan", &repo.location(), "--to", &passing]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("start `fast`"), "{out}");

    let failing = commit(&repo, &[("topologies/t/steps/fast.test.yaml", FAST_TESTS)]);
    let (code, out, err) = run(&["plan", &repo.location(), "--to", &failing]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(
            "topologies/t/steps/fast.test.yaml:12:5: test-failed: step test `a wrong expectation fails` of `fast` failed: expected {\"id\":3,\"kmh\":999}; got no key {\"id\":3,\"kmh\":144}"
        ),
        "{out}"
    );
    assert!(out.contains("invalid: 1 error;"), "{out}");
    assert!(!out.contains("start `fast`"), "nothing is planned: {out}");
}

/// A case whose program never ends, or takes all memory, fails on its own: its worker
/// process is killed at the case's time or dies at its memory limit, and the cases after it
/// run in a new one. When the run's time is out, the cases left fail as not finished.
#[test]
fn a_case_that_never_ends_or_takes_all_memory_fails_alone() {
    let repo = TestRepo::new();
    let endless = "kind: processor\ninput: cars\njq: 'if .spin then last(range(1e15)) elif .hog then reduce range(64) as $i (\"x\"; . + .) | length else . end'\n";
    let tests = r#"cases:
  - name: spins
    input: { value: { spin: true } }
    output: [{ value: 1 }]
  - name: passes after the spinning one
    input: { value: { id: 1 } }
    output: [{ value: { id: 1 } }]
  - name: takes all memory
    input: { value: { hog: true } }
    output: [{ value: 1 }]
  - name: passes after the greedy one
    input: { value: { id: 2 } }
    output: [{ value: { id: 2 } }]
"#;
    let rev = commit(
        &repo,
        &[
            ("topologies/t/steps/spin.yaml", endless),
            ("topologies/t/steps/spin.test.yaml", tests),
        ],
    );
    let (code, out, err) = run(&[
        "test",
        &repo.location(),
        "--rev",
        &rev,
        "--case-time",
        "1",
        "--test-memory",
        "67108864",
        "--format",
        "json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cases = json["cases"].as_array().unwrap();
    let by_name = |name: &str| cases.iter().find(|c| c["name"] == name).unwrap().clone();
    let spins = by_name("spins");
    assert_eq!(spins["result"], "failed", "{spins}");
    assert!(
        spins["actual"][0]
            .as_str()
            .unwrap()
            .starts_with("dead-lettered: timeout"),
        "{spins}"
    );
    let hog = by_name("takes all memory");
    assert_eq!(hog["result"], "failed", "{hog}");
    assert!(
        hog["actual"][0]
            .as_str()
            .unwrap()
            .contains("the process running the case died"),
        "{hog}"
    );
    for name in [
        "passes after the spinning one",
        "passes after the greedy one",
    ] {
        assert_eq!(by_name(name)["result"], "passed", "{name}: {out}");
    }

    // With less time for the whole run than the spinning case takes, the cases after it
    // are not finished, and fail the run.
    let (code, out, err) = run(&[
        "test",
        &repo.location(),
        "--rev",
        &rev,
        "--case-time",
        "5",
        "--test-time",
        "1",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("spin: passes after the greedy one: DID NOT RUN: the step tests' time (1 s"),
        "{out}"
    );
    assert!(
        out.ends_with("4 cases: 0 passed, 4 failed, 0 not run\n"),
        "{out}"
    );
}

/// A step that keeps state between records is tested with several: `inputs` run in order on
/// one partition's state, each at its `timestamp`, and `output` is everything they made it
/// emit. Here a window closes when a record past its end arrives.
#[test]
fn a_stateful_step_is_tested_with_a_case_of_several_records() {
    let repo = TestRepo::new();
    let per_minute = "kind: processor\ninput: cars\nsql: |\n  SELECT _key AS car, COUNT(*) AS readings, MAX(speed) AS top, window_start\n  FROM cars\n  GROUP BY _key, TUMBLE(_timestamp, INTERVAL '1' MINUTE)\n";
    let tests = r#"cases:
  - name: a minute's readings are counted when the minute is over
    inputs:
      - { key: car-1, value: { speed: 30 }, timestamp: 60000 }
      - { key: car-1, value: { speed: 50 }, timestamp: 90000 }
      - { key: car-1, value: { speed: 10 }, timestamp: 120000 }
    output:
      - { key: car-1, value: { car: car-1, readings: 2, top: 50, window_start: 60000 } }
  - name: nothing is emitted while the minute is open
    inputs:
      - { key: car-2, value: { speed: 30 }, timestamp: 60000 }
    output: []
  - name: a record without a timestamp is dead-lettered
    input: { key: car-3, value: { speed: 30 } }
    deadLetter: sql-error
  - name: a wrong count fails
    inputs:
      - { key: car-1, value: { speed: 30 }, timestamp: 60000 }
      - { key: car-1, value: { speed: 10 }, timestamp: 120000 }
    output:
      - { value: { car: car-1, readings: 5, top: 30, window_start: 60000 } }
"#;
    let rev = commit(
        &repo,
        &[
            ("topologies/t/steps/per-minute.yaml", per_minute),
            ("topologies/t/steps/per-minute.test.yaml", tests),
        ],
    );
    let (code, out, err) = run(&[
        "test",
        &repo.location(),
        "--rev",
        &rev,
        "--step",
        "per-minute",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let file = "topologies/t/steps/per-minute.test.yaml";
    for line in [
        format!(
            "{file}:2:5: per-minute: a minute's readings are counted when the minute is over: ok"
        ),
        format!("{file}:9:5: per-minute: nothing is emitted while the minute is open: ok"),
        format!("{file}:13:5: per-minute: a record without a timestamp is dead-lettered: ok"),
        format!("{file}:16:5: per-minute: a wrong count fails: FAILED"),
        "4 cases: 3 passed, 1 failed, 0 not run".to_owned(),
    ] {
        assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    }
    assert!(
        out.contains(
            r#"actual:   key "car-1" {"car":"car-1","readings":1,"top":30,"window_start":60000}"#
        ),
        "{out}"
    );

    // `input` and `inputs` together, or a timestamp that is no number, at their line.
    let bad = commit(
        &repo,
        &[
            ("topologies/t/steps/per-minute.yaml", per_minute),
            (
                "topologies/t/steps/per-minute.test.yaml",
                "cases:\n  - name: both\n    input: { value: 1 }\n    inputs: [{ value: 1 }]\n    output: []\n  - name: when\n    inputs: [{ value: 1, timestamp: soon }]\n    output: []\n",
            ),
        ],
    );
    let (code, out, _) = run(&["validate", &repo.location(), "--rev", &bad]);
    assert_eq!(code, 1, "{out}");
    for line in [
        "topologies/t/steps/per-minute.test.yaml:4:5: invalid-value: a case has `input` (one record) or `inputs` (a list), not both",
        "topologies/t/steps/per-minute.test.yaml:7:26: invalid-value: `timestamp` is milliseconds since 1970",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

/// A join is tested with its table in the case: records `from:` the table's step are its
/// rows (the latest per key), the others are the stream's, joined to the table as it stands
/// when each comes.
#[test]
fn a_join_is_tested_with_its_table_rows_in_the_case() {
    let repo = TestRepo::new();
    let named = "kind: processor\ninput: [cars, trucks]\nsql: SELECT c.id, t.name FROM cars c LEFT JOIN trucks t ON c.truck = t._key\n";
    let tests = r#"cases:
  - name: a car is named by the table as it stands
    inputs:
      - { from: trucks, key: t1, value: { name: Optimus } }
      - { key: car-1, value: { id: 1, truck: t1 } }
      - { from: trucks, key: t1, value: { name: Megatron } }
      - { key: car-2, value: { id: 2, truck: t1 } }
      - { key: car-3, value: { id: 3, truck: t9 } }
    output:
      - { key: car-1, value: { id: 1, name: Optimus } }
      - { key: car-2, value: { id: 2, name: Megatron } }
      - { key: car-3, value: { id: 3, name: null } }
  - name: a wrong name fails
    inputs:
      - { from: trucks, key: t1, value: { name: Optimus } }
      - { value: { id: 1, truck: t1 } }
    output:
      - { value: { id: 1, name: Bumblebee } }
"#;
    let rev = commit(
        &repo,
        &[
            ("topologies/t/steps/named.yaml", named),
            ("topologies/t/steps/named.test.yaml", tests),
        ],
    );
    let (code, out, err) = run(&["test", &repo.location(), "--rev", &rev, "--step", "named"]);
    assert_eq!(code, 1, "{out}{err}");
    for line in [
        "named: a car is named by the table as it stands: ok",
        "named: a wrong name fails: FAILED",
        r#"  actual:   no key {"id":1,"name":"Optimus"}"#,
        "2 cases: 1 passed, 1 failed, 0 not run",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

/// What a failed case shows of a step's outputs is bounded: a program that answers one
/// record with hundreds of large outputs fails with ten lines of at most a thousand
/// characters, and a count of the rest (the verdict is held by the daemon and written into
/// plans and comments).
#[test]
fn a_failed_case_shows_a_bounded_part_of_huge_outputs() {
    let repo = TestRepo::new();
    let flood =
        "kind: processor\ninput: cars\njq: 'range(300) | {i: ., pad: ([range(300)] | tostring)}'\n";
    let tests = "cases:\n  - name: floods\n    input: { value: {} }\n    output: []\n";
    let rev = commit(
        &repo,
        &[
            ("topologies/t/steps/flood.yaml", flood),
            ("topologies/t/steps/flood.test.yaml", tests),
        ],
    );
    let (code, out, err) = run(&[
        "test",
        &repo.location(),
        "--rev",
        &rev,
        "--step",
        "flood",
        "--format",
        "json",
    ]);
    assert_eq!(code, 1, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let actual = json["cases"][0]["actual"].as_array().unwrap();
    assert_eq!(actual.len(), 11, "{actual:#?}");
    assert_eq!(actual[10], "… and 290 more");
    assert!(
        actual[..10]
            .iter()
            .all(|line| line.as_str().unwrap().chars().count() < 1_100),
        "{actual:#?}"
    );
    assert!(out.len() < 50_000, "{} bytes of results", out.len());
}

/// An exec step's command and an http step's server, run from the commit's checkout through
/// the processor's own exec and http transforms: an answer, an error answer dead-lettered
/// `exec-error`, a child that crashes at every attempt `exec-failed`, one that hangs past
/// the case's time `timeout` (and is killed with everything it started), a 4xx answer
/// `http-error`. `plumber plan` runs them only with `--run-commands`.
#[test]
fn exec_and_http_steps_are_tested_through_the_processor_s_own_path() {
    let repo = TestRepo::new();
    let pids = tempfile::tempdir().unwrap();
    let exec = format!(
        "kind: processor\ninput: cars\nexec:\n  command: [python3, tag.py]\nenv: {{ PIDS: {} }}\n",
        pids.path().display()
    );
    let tag_py = r#"import json, os, subprocess, sys, time
# Each child notes its pid and that of a grandchild it starts, which never ends by itself.
helper = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
with open(os.path.join(os.environ["PIDS"], str(os.getpid())), "w") as f:
    f.write(f"{os.getpid()}\n{helper.pid}\n")
for line in sys.stdin:
    record = json.loads(line)
    value = record["value"]
    if value.get("crash"):
        sys.exit(3)
    if value.get("hang"):
        time.sleep(1000)
    if value.get("bad"):
        print(json.dumps({"id": record["id"], "error": "bad reading"}), flush=True)
        continue
    print(json.dumps({"id": record["id"], "outputs": [{"value": {**value, "tag": os.environ["TAG"]}}]}), flush=True)
"#;
    let http = "kind: processor\ninput: cars\nhttp:\n  image: example/risk:1\n  port: 8080\n  path: /score\n  command: [python3, serve.py]\nenv: { FACTOR: \"2\" }\n";
    let serve_py = r#"import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Score(BaseHTTPRequestHandler):
    def do_POST(self):
        record = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        value = record["value"]
        if "speed" not in value:
            self.send_response(422)
            self.end_headers()
            self.wfile.write(b"no speed")
            return
        body = json.dumps([{"value": {**value, "risk": value["speed"] * int(os.environ["FACTOR"])}}]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Score).serve_forever()
"#;
    let exec_tests = r#"cases:
  - name: tagged
    input: { key: c1, value: { id: 1 } }
    output: [{ key: c1, value: { id: 1, tag: blue } }]
  - name: an error answer
    input: { value: { bad: true } }
    deadLetter: exec-error
  - name: a crash at every attempt
    input: { value: { crash: true } }
    deadLetter: exec-failed
  - name: a hang
    input: { value: { hang: true } }
    deadLetter: timeout
  - name: tagged after all that
    input: { value: { id: 2 } }
    output: [{ value: { id: 2, tag: blue } }]
  - name: a wrong expectation
    input: { value: { id: 3 } }
    output: [{ value: { id: 3, tag: red } }]
"#;
    let http_tests = r#"cases:
  - name: scored
    input: { value: { id: 1, speed: 21 } }
    output: [{ value: { id: 1, speed: 21, risk: 42 } }]
  - name: refused
    input: { value: { id: 2 } }
    deadLetter: http-status
"#;
    let exec = exec.replace("env: {", "env: { TAG: blue,");
    let rev = commit(
        &repo,
        &[
            ("topologies/t/steps/tag/tag.yaml", exec.as_str()),
            ("topologies/t/steps/tag/tag.py", tag_py),
            ("topologies/t/steps/tag/tag.test.yaml", exec_tests),
            ("topologies/t/steps/risk/risk.yaml", http),
            ("topologies/t/steps/risk/serve.py", serve_py),
            ("topologies/t/steps/risk/risk.test.yaml", http_tests),
        ],
    );
    let (code, out, err) = run(&[
        "test",
        &repo.location(),
        "--rev",
        &rev,
        "--case-time",
        "3",
        "--format",
        "json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cases = json["cases"].as_array().unwrap();
    let result = |name: &str| {
        let case = cases.iter().find(|c| c["name"] == name).unwrap();
        (
            case["result"].as_str().unwrap().to_owned(),
            case.to_string(),
        )
    };
    for name in [
        "tagged",
        "an error answer",
        "a crash at every attempt",
        "a hang",
        "tagged after all that",
        "scored",
        "refused",
    ] {
        let (result, case) = result(name);
        assert_eq!(result, "passed", "{case}");
    }
    let (wrong, case) = result("a wrong expectation");
    assert_eq!(wrong, "failed", "{case}");
    assert!(case.contains("blue"), "what came is shown: {case}");
    // Every child the cases started, and what each of them started, is gone.
    let started: Vec<i32> = std::fs::read_dir(pids.path())
        .unwrap()
        .flat_map(|entry| {
            std::fs::read_to_string(entry.unwrap().path())
                .unwrap()
                .lines()
                .map(|pid| pid.parse().unwrap())
                .collect::<Vec<i32>>()
        })
        .collect();
    assert!(started.len() >= 4, "a child per crash or hang: {started:?}");
    let gone = || started.iter().all(|&pid| zombie(pid));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(gone(), "left running: {started:?}");

    // `plumber plan` runs commands only when asked to.
    let (code, out, err) = run(&["plan", &repo.location(), "--to", &rev, "--case-time", "3"]);
    assert_eq!(code, 0, "cases not run only warn: {out}{err}");
    assert!(
        err.contains("test-not-run: step test `tagged` of `tag` is not run: an exec step runs a command of the commit: `plumber plan` runs them with `--run-commands`"),
        "{err}"
    );
    let (code, out, err) = run(&[
        "plan",
        &repo.location(),
        "--to",
        &rev,
        "--case-time",
        "3",
        "--run-commands",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("topologies/t/steps/tag/tag.test.yaml:17:5: test-failed: step test `a wrong expectation` of `tag` failed"),
        "{out}"
    );
    assert!(!out.contains("test-not-run"), "{out}");
}

/// Whether `pid` has exited (reaped, or not yet: its parent, killed, left it to init).
fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The daemon with `--run-commands` runs the step tests of a branch commit's exec and http
/// steps from the commit's checkout once it validated: a failed case makes the commit
/// invalid (never applied), at the case's line. Without it they are not run (a warning), and
/// the commit is applied as before.
#[test]
fn a_daemon_that_runs_commands_applies_no_commit_whose_exec_step_test_fails() {
    use plumber::daemon::{Error, Revisions, Source};
    let repo = TestRepo::new();
    let failing = r#"cases:
  - name: scored twice
    input: { value: { id: 1 } }
    output: [{ value: { id: 1, score: 2 } }]
"#;
    let rev = commit(&repo, &[("topologies/t/steps/score.test.yaml", failing)]);
    let state = tempfile::tempdir().unwrap();
    let dir = plumber::store::StateDir::open(state.path()).unwrap();
    let limits = plumber::steptest::Limits {
        program: Some(common::plumber_bin().into()),
        ..Default::default()
    };
    let revisions = |run_commands| {
        Revisions::new(
            Source::new(&repo.location(), state.path()),
            &dir,
            plumber::spec::StepSecrets::Unchecked,
            plumber::spec::budget::Budget::default(),
            limits.clone(),
            run_commands,
        )
    };
    match revisions(true).load(&rev) {
        Err(Error::Invalid { errors, first, .. }) => {
            assert!(
                errors.contains("step test `scored twice` of `score` failed"),
                "{errors}"
            );
            let first = first.unwrap();
            assert_eq!(
                (first.file.as_str(), first.line),
                ("topologies/t/steps/score.test.yaml", Some(2))
            );
        }
        Err(other) => panic!("not refused for its test: {other}"),
        Ok(_) => panic!("a commit whose exec step test fails was accepted"),
    }
    assert!(revisions(false).load(&rev).is_ok());
}
