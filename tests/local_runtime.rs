//! The local runtime's process handling (SPEC §5 stop, issue 14): stop order of a processor and
//! its `http` server, process-group kills, reaping, adoption after a daemon crash, log bounds.
//!
//! The processor here is a bash stand-in for `plumber-processor` (`LocalConfig::processor`):
//! these tests are about the processes the runtime starts, signals and reaps, and a script
//! says exactly what it does on SIGTERM. It appends what happens to it to `events`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use plumber::runtime::local::{INHERITED_ENV, LocalConfig, LocalRuntime};
use plumber::runtime::{Assignor, Cluster, Delivery, ProcessorSpec, Runtime, Settings};
use plumber::spec::{EnvValue, Scale, SecretRef, Transform};
use plumber_testkit::wait_until;

const PATIENCE: Duration = Duration::from_secs(60);

/// The commit the specs run: its checkout is `checkouts/COMMIT` of the setup's directory.
const COMMIT: &str = "c0ffee";

/// Records `processor-start|term|exit PID` in `$EVENTS` (the start once its SIGTERM trap is
/// set). With `$ARGS` it writes its arguments there, with `$SECRET_OUT` the value of
/// `$API_KEY`, with `$ENV_OUT` its whole environment. On SIGTERM it exits at once, after
/// `$LINGER` seconds (finishing an in-flight record), once the file `$RELEASE` exists, or
/// never (`$ON_TERM=ignore`). With
/// `$CHILD` it starts a child (as an exec transform would) and writes its pid there. With
/// `$LOG_CHUNKS` it writes that many 32 KiB chunks to its log, waiting after each until the
/// log at `$LOG` is no larger than `$LOG_MAX`, then writes `logged` to `$EVENTS`.
const PROCESSOR: &str = r#"#!/usr/bin/env bash
on_term() {
    echo "processor-term $$" >> "$EVENTS"
    [ "$ON_TERM" = ignore ] && return
    [ -n "$LINGER" ] && sleep "$LINGER"
    [ -n "$RELEASE" ] && until [ -e "$RELEASE" ]; do sleep 0.02; done
    echo "processor-exit $$" >> "$EVENTS"
    exit 0
}
trap on_term TERM
echo "processor-start $$" >> "$EVENTS"
if [ -n "$ARGS" ]; then printf '%s\n' "$@" > "$ARGS"; fi
if [ -n "$SECRET_OUT" ]; then printf '%s' "$API_KEY" > "$SECRET_OUT"; fi
if [ -n "$ENV_OUT" ]; then env > "$ENV_OUT"; fi
if [ -n "$CHILD" ]; then sleep 1000 & echo $! > "$CHILD"; fi
if [ -n "$LOG_CHUNKS" ]; then
    chunk=$(head -c 32768 /dev/zero | tr '\0' x)
    for _ in $(seq "$LOG_CHUNKS"); do
        echo "$chunk"
        while [ "$(stat -c %s "$LOG")" -gt "$LOG_MAX" ]; do sleep 0.02; done
    done
    echo logged >> "$EVENTS"
fi
while true; do sleep 1000 & wait $!; done
"#;

/// The `http` step's server: records `sidecar-start|term|exit PID`, writes its environment to
/// `$ENV_OUT.sidecar` with `$ENV_OUT`; with `$DIE_ONCE` its
/// first run exits as soon as its processor has started (and so handles SIGTERM: a processor
/// stopped before its script set the trap would die without a word, and the test would wait
/// for a restart it cannot tell from the first start).
const SIDECAR: &str = r#"
echo "sidecar-start $$" >> "$EVENTS"
if [ -n "$ENV_OUT" ]; then env > "$ENV_OUT.sidecar"; fi
trap 'echo "sidecar-term $$" >> "$EVENTS"; exit 0' TERM
if [ -n "$DIE_ONCE" ] && [ ! -e died ]; then
    until grep -q processor-start "$EVENTS"; do sleep 0.05; done
    touch died
    echo "sidecar-exit $$" >> "$EVENTS"
    exit 1
fi
while true; do sleep 1000 & wait $!; done
"#;

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let processor = dir.path().join("processor.sh");
        fs::write(&processor, PROCESSOR).unwrap();
        fs::set_permissions(&processor, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir_all(dir.path().join("checkouts").join(COMMIT)).unwrap();
        fs::write(
            dir.path().join("checkouts").join(COMMIT).join("sidecar.sh"),
            SIDECAR,
        )
        .unwrap();
        Setup { dir }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn config(&self, stop_timeout: Duration) -> LocalConfig {
        LocalConfig {
            processor: self.dir.path().join("processor.sh"),
            stop_timeout,
            max_backoff: Duration::from_secs(30),
            max_log_bytes: 64 * 1024,
            checkouts: self.dir.path().join("checkouts"),
            secrets: Some(self.dir.path().join("secrets")),
            kafka_credentials: None,
        }
    }

    fn open(&self, stop_timeout: Duration) -> LocalRuntime {
        LocalRuntime::open(&self.state(), self.config(stop_timeout)).unwrap()
    }

    fn spec(&self, sidecar: bool, env: &[(&str, &str)]) -> ProcessorSpec {
        let mut vars: BTreeMap<String, EnvValue> = env
            .iter()
            .map(|(k, v)| (k.to_string(), EnvValue::Value(v.to_string())))
            .collect();
        vars.insert(
            "EVENTS".into(),
            EnvValue::Value(self.events_path().display().to_string()),
        );
        ProcessorSpec {
            input_steps: Default::default(),
            topology: "t".into(),
            step: "p".into(),
            identity: "ab".repeat(32).parse().unwrap(),
            group: "plumber.t.p.abababababab".into(),
            cluster: Cluster::at("127.0.0.1:1"),
            inputs: vec!["in".into()],
            outputs: vec!["out".into()],
            dlq: "plumber.t.p.dlq".into(),
            commit: COMMIT.into(),
            dir: String::new(),
            settings: Settings::default(),
            state: None,
            table: None,
            handoff_group: None,
            transform: if sidecar {
                Transform::Http {
                    image: "unused".into(),
                    port: 8080,
                    path: "/".into(),
                    command: Some(vec!["bash".into(), "sidecar.sh".into()]),
                }
            } else {
                Transform::Jq {
                    program: ".".into(),
                }
            },
            env: vars,
            scale: Scale {
                min: 1,
                max: 1,
                lag_threshold: 100,
            },
            resources: None,
        }
    }

    fn events_path(&self) -> PathBuf {
        self.dir.path().join("events")
    }

    /// `(what, pid)` in the order they happened.
    fn events(&self) -> Vec<(String, i32)> {
        fs::read_to_string(self.events_path())
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let (what, pid) = line.split_once(' ').unwrap_or((line, "0"));
                (what.to_owned(), pid.parse().unwrap_or(0))
            })
            .collect()
    }

    fn position(&self, what: &str, pid: i32) -> Option<usize> {
        self.events()
            .iter()
            .position(|(w, p)| w == what && (pid == 0 || *p == pid))
    }

    fn wait_event(&self, what: &str) -> i32 {
        wait_until(what, PATIENCE, || self.position(what, 0).is_some());
        self.events()
            .into_iter()
            .find(|(w, _)| w == what)
            .map(|(_, pid)| pid)
            .unwrap()
    }
}

/// The state letter of a process (`Z` for a zombie), `None` once it is reaped.
fn process_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')? + 2..)?.chars().next()
}

fn running(pid: i32) -> bool {
    process_state(pid).is_some_and(|state| state != 'Z')
}

fn start_time(pid: i32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(19).unwrap().parse().unwrap()
}

#[test]
fn the_daemons_settings_reach_the_processors_command_line() {
    let setup = Setup::new();
    let runtime = setup.open(PATIENCE);
    let args = setup.events_path().with_file_name("args");
    let mut spec = setup.spec(false, &[("ARGS", &args.display().to_string())]);
    spec.settings = Settings {
        delivery: Some(Delivery::ExactlyOnce),
        record_timeout: Some(7),
        assignor: Some(Assignor::Eager),
    };
    runtime.start(&spec).unwrap();
    wait_until("the processor ran", PATIENCE, || args.exists());
    wait_until("its arguments are written", PATIENCE, || {
        fs::read_to_string(&args).is_ok_and(|a| a.contains("--group"))
    });
    let argv: Vec<String> = fs::read_to_string(&args)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let after = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    assert_eq!(
        after("--delivery").as_deref(),
        Some("exactly-once"),
        "{argv:?}"
    );
    assert_eq!(after("--record-timeout").as_deref(), Some("7"), "{argv:?}");
    assert_eq!(after("--assignor").as_deref(), Some("eager"), "{argv:?}");
    // What a jq program sees in `$ENV`: the names of the step's `env:`.
    let jq_env: Vec<&str> = argv
        .windows(2)
        .filter(|pair| pair[0] == "--jq-env")
        .map(|pair| pair[1].as_str())
        .collect();
    assert_eq!(jq_env, ["ARGS", "EVENTS"], "{argv:?}");
    runtime.stop(&spec.group).unwrap();
}

#[test]
fn a_secret_reference_is_read_from_the_secrets_directory_and_a_missing_one_is_named() {
    let setup = Setup::new();
    let runtime = setup.open(PATIENCE);
    let out = setup.events_path().with_file_name("secret");
    let mut spec = setup.spec(false, &[("SECRET_OUT", &out.display().to_string())]);
    spec.env.insert(
        "API_KEY".into(),
        EnvValue::Secret {
            secret_key_ref: SecretRef {
                name: "scoring".into(),
                key: "api-key".into(),
            },
        },
    );
    // Not there yet: the start fails, naming the file, and can be retried.
    let error = runtime.start(&spec).unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(
        error.to_string().contains("secrets/scoring/api-key"),
        "{error}"
    );
    assert!(runtime.processors().unwrap().is_empty());

    let secrets = setup.dir.path().join("secrets").join("scoring");
    fs::create_dir_all(&secrets).unwrap();
    fs::write(secrets.join("api-key"), "s3cr3t\n").unwrap();
    runtime.start(&spec).unwrap();
    wait_until("the processor wrote its secret", PATIENCE, || {
        fs::read_to_string(&out).is_ok_and(|v| !v.is_empty())
    });
    assert_eq!(fs::read_to_string(&out).unwrap(), "s3cr3t");
    let args = fs::read_to_string(
        setup
            .state()
            .join("processes")
            .join(format!("{}.json", spec.group)),
    )
    .unwrap();
    assert!(
        !args.contains("s3cr3t"),
        "the record keeps the reference only: {args}"
    );
    runtime.stop(&spec.group).unwrap();
}

/// SPEC §11: a processor and its server start from a clean environment, never the daemon's
/// own (which may hold `PLUMBER_GIT_PASSWORD`, cloud credentials, tokens of its shell).
#[test]
fn processors_and_their_servers_see_only_a_minimal_environment_and_what_the_step_declares() {
    // Cargo gives the test process (here: the daemon) variables no processor should see.
    let daemon_only = "CARGO_PKG_NAME";
    assert!(std::env::var_os(daemon_only).is_some(), "the daemon has it");
    let setup = Setup::new();
    let runtime = setup.open(PATIENCE);
    let out = setup.events_path().with_file_name("env");
    let spec = setup.spec(
        true,
        &[("ENV_OUT", &out.display().to_string()), ("MODEL", "v3")],
    );
    runtime.start(&spec).unwrap();
    let sidecar_out = out.with_extension("sidecar");
    wait_until("both wrote their environment", PATIENCE, || {
        [&out, &sidecar_out]
            .iter()
            .all(|f| fs::read_to_string(f).is_ok_and(|v| v.contains("MODEL=")))
    });
    for file in [&out, &sidecar_out] {
        let env = fs::read_to_string(file).unwrap();
        let names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(n, _)| n)
            .collect();
        assert!(
            !names.contains(&daemon_only),
            "{}: {names:?}",
            file.display()
        );
        assert!(
            names.contains(&"PATH") && names.contains(&"MODEL"),
            "{names:?}"
        );
        // bash adds its own (PWD, SHLVL, _); everything else comes from the runtime.
        let allowed: Vec<&str> = INHERITED_ENV
            .into_iter()
            .chain([
                "PWD", "SHLVL", "_", "OLDPWD", "PORT", "MODEL", "ENV_OUT", "EVENTS",
            ])
            .chain(["PLUMBER_LOCAL_RUNTIME", "PLUMBER_LOCAL_INSTANCE"])
            .collect();
        let unexpected: Vec<&&str> = names.iter().filter(|n| !allowed.contains(n)).collect();
        assert!(unexpected.is_empty(), "{}: {unexpected:?}", file.display());
    }
    runtime.stop(&spec.group).unwrap();
}

#[test]
fn an_http_server_is_stopped_only_after_its_processor_has_exited() {
    let setup = Setup::new();
    let runtime = setup.open(PATIENCE);
    // The processor takes a second after SIGTERM to finish its in-flight record, which needs
    // the server until the end.
    let spec = setup.spec(true, &[("LINGER", "1")]);
    runtime.start(&spec).unwrap();
    let processor = setup.wait_event("processor-start");
    setup.wait_event("sidecar-start");

    runtime.stop(&spec.group).unwrap();
    let exit = setup.position("processor-exit", processor);
    let sidecar_term = setup.position("sidecar-term", 0);
    assert!(
        exit.is_some() && sidecar_term.is_some() && exit < sidecar_term,
        "the processor exits before its server is asked to stop: {:?}",
        setup.events()
    );
    assert_eq!(process_state(processor), None, "the processor is reaped");
}

/// Serves the `/metrics` page a `plumber-processor` would at `addr`: the final commit is
/// made once `made` says so.
fn serve_metrics(addr: &str, made: impl Fn() -> bool + Send + 'static) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind(addr).unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let page = format!("plumber_processor_final_commit_made {}\n", u8::from(made()));
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
}

/// A processor that made its final commit changes nothing in Kafka any more: the stop
/// returns then, and the runtime still finishes its exit (reaped, its server stopped after
/// it) whether it ends on its own or is killed meanwhile.
#[test]
fn a_stop_returns_once_the_final_commit_is_made_and_the_exit_is_finished_later() {
    for killed in [false, true] {
        let setup = Setup::new();
        let runtime = setup.open(PATIENCE);
        let (args, release) = (setup.dir.path().join("args"), setup.dir.path().join("go"));
        let spec = setup.spec(
            true,
            &[
                ("ARGS", &args.display().to_string()),
                ("RELEASE", &release.display().to_string()),
            ],
        );
        runtime.start(&spec).unwrap();
        let processor = setup.wait_event("processor-start");
        setup.wait_event("sidecar-start");
        let arguments = fs::read_to_string(&args).unwrap();
        let lines: Vec<&str> = arguments.lines().collect();
        let at = lines.iter().position(|a| *a == "--metrics").unwrap();
        let events = setup.events_path();
        // The commit is made when the processor is asked to stop.
        serve_metrics(lines[at + 1], move || {
            fs::read_to_string(&events).is_ok_and(|e| e.contains("processor-term"))
        });

        runtime.stop(&spec.group).unwrap();
        assert!(setup.position("processor-term", processor).is_some());
        assert!(
            running(processor) && setup.position("processor-exit", processor).is_none(),
            "the stop returned while the processor still leaves its group: {:?}",
            setup.events()
        );
        assert!(
            setup.position("sidecar-term", 0).is_none(),
            "its server is stopped only after it"
        );
        if killed {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(processor),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
        } else {
            fs::write(&release, "").unwrap();
        }
        wait_until("the processor is reaped", PATIENCE, || {
            process_state(processor).is_none()
        });
        setup.wait_event("sidecar-term");
        if !killed {
            assert!(
                setup.position("processor-exit", processor) < setup.position("sidecar-term", 0),
                "{:?}",
                setup.events()
            );
        }
        assert!(
            runtime.processors().unwrap().is_empty(),
            "nothing is restarted"
        );
    }
}

#[test]
fn a_stop_timeout_kills_the_whole_process_group_and_reaps_it() {
    let setup = Setup::new();
    let runtime = setup.open(Duration::from_secs(1));
    let child_file = setup.dir.path().join("child.pid");
    // Ignores SIGTERM, and has a child (an exec transform's program) in its process group.
    let spec = setup.spec(
        false,
        &[
            ("ON_TERM", "ignore"),
            ("CHILD", &child_file.display().to_string()),
        ],
    );
    runtime.start(&spec).unwrap();
    let processor = setup.wait_event("processor-start");
    wait_until("the child's pid is written", PATIENCE, || {
        fs::read_to_string(&child_file).is_ok_and(|s| s.ends_with('\n'))
    });
    let child: i32 = fs::read_to_string(&child_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(running(child));

    let stopped = runtime.stop(&spec.group);
    assert!(
        matches!(stopped, Err(plumber::runtime::Error::Stop { .. })),
        "{stopped:?}"
    );
    assert!(setup.position("processor-term", processor).is_some());
    assert_eq!(process_state(processor), None, "the processor is reaped");
    // Killed with its group; reparented, so reaped by whoever adopted it.
    wait_until("the child is gone", PATIENCE, || !running(child));
}

#[test]
fn a_processor_whose_server_died_is_stopped_and_reaped_before_the_pair_restarts() {
    let setup = Setup::new();
    let runtime = setup.open(PATIENCE);
    // The first server exits at once; its processor takes 2 s to stop, longer than the first
    // restart's backoff.
    let spec = setup.spec(true, &[("DIE_ONCE", "1"), ("LINGER", "2")]);
    runtime.start(&spec).unwrap();
    let first = setup.wait_event("processor-start");
    setup.wait_event("sidecar-exit");
    wait_until("the pair restarts", PATIENCE, || {
        setup
            .events()
            .iter()
            .filter(|(w, _)| w == "processor-start")
            .count()
            >= 2
    });
    let exit = setup.position("processor-exit", first);
    let second_start = setup
        .events()
        .iter()
        .enumerate()
        .filter(|(_, (w, _))| w == "processor-start")
        .nth(1)
        .map(|(i, _)| i);
    assert!(
        exit.is_some() && exit < second_start,
        "the old processor exits before the new one starts: {:?}",
        setup.events()
    );
    wait_until("the first processor is reaped", PATIENCE, || {
        process_state(first).is_none()
    });
    runtime.stop(&spec.group).unwrap();
}

#[test]
fn a_reused_pid_is_never_adopted_or_signalled() {
    let setup = Setup::new();
    let spec = setup.spec(false, &[]);
    // A previous daemon's records, whose pid now belongs to a stranger (same start time, as
    // read now), and another runtime's process tagged for a different state directory.
    let processes = setup.state().join("processes");
    fs::create_dir_all(&processes).unwrap();
    let mut stranger: Child = Command::new("sleep").arg("300").spawn().unwrap();
    let pid = stranger.id() as i32;
    fs::write(
        processes.join(format!("{}.json", spec.group)),
        serde_json::to_vec(&spec).unwrap(),
    )
    .unwrap();
    fs::write(
        processes.join(format!("{}.0.pid", spec.group)),
        format!("{pid} {}", start_time(pid)),
    )
    .unwrap();

    let runtime = setup.open(PATIENCE);
    setup.wait_event("processor-start");
    runtime.stop(&spec.group).unwrap();
    drop(runtime);
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "the stranger was signalled"
    );
    stranger.kill().unwrap();
    stranger.wait().unwrap();
}

#[test]
fn a_restarted_daemon_adopts_its_own_instance() {
    let setup = Setup::new();
    let spec = setup.spec(true, &[]);
    let first = setup.open(PATIENCE);
    first.start(&spec).unwrap();
    let processor = setup.wait_event("processor-start");
    let sidecar = setup.wait_event("sidecar-start");
    // The daemon dies: its supervisor goes, the instance keeps running.
    drop(first);

    let second = setup.open(PATIENCE);
    let status = second.processors().unwrap();
    assert_eq!(status.len(), 1);
    assert_eq!((status[0].running, status[0].restarts), (1, 0));
    second.stop(&spec.group).unwrap();
    let exit = setup.position("processor-exit", processor);
    let sidecar_term = setup.position("sidecar-term", sidecar);
    assert!(
        exit.is_some() && sidecar_term.is_some() && exit < sidecar_term,
        "the adopted pair stops in order: {:?}",
        setup.events()
    );
    assert_eq!(
        setup
            .events()
            .iter()
            .filter(|(w, _)| w == "processor-start")
            .count(),
        1,
        "adopted, not started again: {:?}",
        setup.events()
    );
}

#[test]
fn logs_are_rotated_at_their_size_keeping_one_previous_file() {
    let setup = Setup::new();
    let runtime = setup.open(PATIENCE);
    let spec = setup.spec(false, &[]);
    let log: PathBuf = setup
        .state()
        .join("logs")
        .join(format!("{}.0.log", spec.group));
    let max = setup.config(PATIENCE).max_log_bytes;
    let mut spec = spec;
    // 64 chunks of 32 KiB: 2 MiB, 32 times the limit.
    for (k, v) in [
        ("LOG_CHUNKS", "64".to_string()),
        ("LOG", log.display().to_string()),
        ("LOG_MAX", max.to_string()),
    ] {
        spec.env.insert(k.into(), EnvValue::Value(v));
    }
    runtime.start(&spec).unwrap();
    setup.wait_event("logged");
    let size = |path: &Path| fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let previous = log.with_extension("log.1");
    assert!(size(&log) <= max, "{}", size(&log));
    assert!(
        size(&previous) > 0 && size(&previous) <= max + 33 * 1024,
        "one previous file, no larger than the limit and a chunk: {}",
        size(&previous)
    );
    let files = fs::read_dir(log.parent().unwrap()).unwrap().count();
    assert_eq!(files, 2, "the log and one previous file");
    runtime.stop(&spec.group).unwrap();
}
