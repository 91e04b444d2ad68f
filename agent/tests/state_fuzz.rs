//! Fuzzing the agent's state file (`--state-file`, read when an agent starts and takes over what its
//! predecessor left running) with the seeded structure-aware mutator `rm-replay fuzz` uses, plus
//! record paths swapped for the nastiest things a corrupted file could name (a device, a FIFO, a
//! directory, the process table). The start-up path — parse, decide whether to take a record over,
//! read what an unwatched process left behind, flush its log to the log store — must never panic
//! nor hang, must never take over a process that is not its own wrapper, and a file it cannot read
//! is refused naming the file.
//!
//! The exits file beside it (exits not yet taken, reported by the next agent) has its own target.
//!
//! 2,000 cases in CI; `FUZZ_CASES=N` for a longer run.

use lattice_agent::{
    agent::{read_exits, read_state},
    protocol, runner,
};
use lattice_node_adapters::logstore::{LogStore, Source, Stream};
use lattice_traces::fuzz::{below, mutate};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

#[test]
fn corrupted_state_files_never_panic_hang_or_take_over_another_process() {
    let dir = std::env::temp_dir().join(format!("lattice-state-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let log = dir.join("logs/a-000001.log");
    let status = dir.join("logs/a-000001.status");
    std::fs::write(&log, "step 1\nstep 2\n".repeat(200)).unwrap();
    std::fs::write(&status, "0\n").unwrap();
    let fifo = dir.join("logs/fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let nasty: Vec<String> = [
        "/dev/zero".to_string(),
        "/dev/urandom".into(),
        fifo.display().to_string(),
        dir.display().to_string(),
        "/proc/self/cmdline".into(),
        "".into(),
    ]
    .into();
    // This test's own pid, init's and a pid that is surely free: none is a lattice-task wrapper.
    let seed = format!(
        r#"[
  {{"id": "a-000001", "pid": {me}, "started_ms": 1764000000000, "walltime_s": 3600.0, "grace_ms": 5000,
    "log": "{log}", "status": "{status}", "ring_bytes": 65536, "checkpoint": "signal", "tenant": "physics", "project": "p1"}},
  {{"id": "a-000002", "pid": 1, "started_ms": 0, "walltime_s": null, "grace_ms": 0,
    "log": "{log}", "status": "{status}", "ring_bytes": 18446744073709551615, "checkpoint": "", "tenant": "bio", "project": null}},
  {{"id": "a-000003", "pid": 4194000, "started_ms": 1, "walltime_s": 1e308, "grace_ms": 1,
    "log": "{status}", "status": "{log}", "ring_bytes": 0, "tenant": "chem"}}
]"#,
        me = std::process::id(),
        log = log.display(),
        status = status.display(),
    );
    let store = LogStore::new(dir.join("store"));
    let path = dir.join("state.json");
    let cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let (mut parsed, mut refused, mut records) = (0u64, 0u64, 0u64);
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(20261124 + case);
        let mut text = seed.clone();
        // Half the cases point a record's paths somewhere nasty first.
        if case % 2 == 0 {
            let target = if below(&mut rng, 2) == 0 { &log } else { &status };
            let with = &nasty[below(&mut rng, nasty.len())];
            text = text.replacen(&target.display().to_string(), with, 1 + below(&mut rng, 3));
        }
        // A quarter keep the file's structure (only the paths swapped): those reach the take-over.
        let text = if case % 4 == 0 { text } else { mutate(&text, &mut rng) };
        std::fs::write(&path, &text).unwrap();
        let recs = match read_state(&path) {
            Ok(r) => r,
            Err(e) => {
                refused += 1;
                assert!(
                    e.to_string().starts_with(&format!("state file {}", path.display())),
                    "case {case}: a refusal that does not name the file: {e}"
                );
                continue;
            }
        };
        parsed += 1;
        for rec in recs {
            records += 1;
            assert!(
                !runner::owns(&rec),
                "case {case}: took over pid {} that is no wrapper of ours:\n{text}",
                rec.pid
            );
            let out = runner::ended_unwatched(&rec);
            assert!(
                out.output.len() <= rec.ring_bytes,
                "case {case}: more output than the ring"
            );
            for (stream, log) in [(Stream::Stdout, rec.log.clone()), (Stream::Stderr, rec.err_log())] {
                let src = Source {
                    tenant: &rec.tenant,
                    project: rec.project.as_deref(),
                    alloc: &rec.id,
                    node: "n1",
                    stream,
                };
                let _ = store.flush(&src, &log, 1);
            }
        }
    }
    eprintln!("fuzz agent-state cases={cases} parsed={parsed} refused={refused} records={records}");
    // The mutations reach both the parser's refusals and the take-over path.
    assert!(
        parsed > cases / 10 && refused > cases / 10,
        "parsed {parsed}, refused {refused}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The exits file: parsed or refused naming the file, never a panic; what it parses becomes reports
/// whose id stays inside its own path segment.
#[test]
fn corrupted_exits_files_never_panic_and_never_leave_their_report() {
    let dir = std::env::temp_dir().join(format!("lattice-exits-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let seed = r#"[
  {"id": "a-000001", "kind": "exited", "code": 0, "tail": "done\n"},
  {"id": "a-000002[3]", "kind": "fenced", "code": 143, "tail": ""},
  {"id": "a-000003", "kind": "walltime", "code": 137, "tail": "step 9\n"}
]"#;
    let path = dir.join("state.exits");
    let cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let (mut parsed, mut refused) = (0u64, 0u64);
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(20261125 + case);
        let text = if case % 8 == 0 {
            seed.to_string()
        } else {
            mutate(seed, &mut rng)
        };
        std::fs::write(&path, &text).unwrap();
        match read_exits(&path) {
            Ok(exits) => {
                parsed += 1;
                let mut s = protocol::Session::new("n1", 1, 0);
                for e in exits {
                    s.ended(e);
                }
                for e in s.unreported() {
                    let r = protocol::exit("n1", e);
                    let inner = r
                        .path
                        .strip_prefix("/v1/allocations/")
                        .and_then(|p| p.strip_suffix("/exit"));
                    assert!(
                        inner.is_some_and(|i| !i.contains(['/', '?', '#']) && i != ".." && i != "."),
                        "case {case}: {:?} leaves its segment: {}",
                        e.id,
                        r.path
                    );
                }
            }
            Err(e) => {
                refused += 1;
                assert!(
                    e.to_string().starts_with(&format!("exits file {}", path.display())),
                    "case {case}: a refusal that does not name the file: {e}"
                );
            }
        }
    }
    eprintln!("fuzz agent-exits cases={cases} parsed={parsed} refused={refused}");
    assert!(
        parsed > cases / 10 && refused > cases / 10,
        "parsed {parsed}, refused {refused}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the fuzz target found: a state file naming a device or a FIFO as a record's log or status
/// hung the agent's start-up (reading `/dev/zero` to its end; opening a FIFO nobody writes).
#[test]
fn a_record_naming_a_device_or_a_fifo_is_reported_ended_at_once() {
    let dir = std::env::temp_dir().join(format!("lattice-state-dev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (log, status) in [
        ("/dev/zero", "/dev/zero"),
        (fifo.to_str().unwrap(), fifo.to_str().unwrap()),
    ] {
        let text = format!(
            r#"[{{"id": "a-000009", "pid": 4194001, "started_ms": 0, "walltime_s": null, "grace_ms": 0,
                "log": "{log}", "status": "{status}", "ring_bytes": 1048576}}]"#
        );
        std::fs::write(dir.join("state.json"), text).unwrap();
        let recs = read_state(&dir.join("state.json")).unwrap();
        let out = runner::ended_unwatched(&recs[0]);
        assert!(out.output.is_empty(), "{log}");
        assert!(matches!(out.ending, runner::Ending::Exited(-1)), "{log}");
        let store = LogStore::new(dir.join("store"));
        assert!(
            store
                .flush(
                    &Source {
                        tenant: "t",
                        project: None,
                        alloc: "a-000009",
                        node: "n1",
                        stream: Stream::Stdout,
                    },
                    &recs[0].log,
                    1
                )
                .is_err(),
            "{log}"
        );
        assert!(!dir.join("store").exists(), "nothing stored from {log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
