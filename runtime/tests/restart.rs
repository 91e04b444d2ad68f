//! A restart of `lattice-runtime` — the binary, killed with SIGKILL or stopped with SIGTERM — loses no
//! acknowledged allocation and reuses no id: queued ones are queued again with their submission time,
//! running ones are re-attached to their nodes with their original start (not run again), ended ones
//! stay visible. Once with simulated agents (the `minimal.yaml` setup) and once with two real
//! `lattice-agent` processes (the `dev-agents.yaml` setup), whose job must run exactly once.
//! User errors of the binary print `error: …` and no backtrace.

mod common;
use common::{agent_binary, call, free_port, wait_until};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Processes killed (SIGKILL) when the test ends, however it ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `lattice-runtime` process on `config`; its output goes to `log`.
fn runtime(config: &Path, log: &Path) -> Child {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_lattice-runtime"))
        .arg("--config")
        .arg(config)
        .arg("--bootstrap")
        .env("RUST_LOG", "info,openraft=warn")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("lattice-runtime starts")
}

fn healthy(base: &str) -> bool {
    call("GET", &format!("{base}/v1/allocations"), None).0 == 200
}

fn list(base: &str) -> Vec<Value> {
    let (status, v) = call("GET", &format!("{base}/v1/allocations"), None);
    assert_eq!(status, 200, "{v}");
    v["allocations"].as_array().unwrap().clone()
}

fn get(base: &str, id: &str) -> Value {
    let (status, v) = call("GET", &format!("{base}/v1/allocations/{id}"), None);
    assert_eq!(status, 200, "{id}: {v}");
    v
}

fn submit(base: &str, body: Value) -> String {
    let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn signal(child: &Child, sig: i32) {
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lattice-restart-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What must not change for an allocation across a restart: tenant, submission time, nodes, and the
/// start — as the quorum recorded it with the nodes, which is the leader's proposal time, so within
/// the commit latency of the start shown before.
fn strip(v: &Value) -> (Value, Value, Value, Value) {
    (
        v["id"].clone(),
        v["tenant"].clone(),
        v["submitted_ms"].clone(),
        v["nodes"].clone(),
    )
}

fn same_start(a: &Value, b: &Value) {
    let (x, y) = (a["started_ms"].as_u64(), b["started_ms"].as_u64());
    match (x, y) {
        (Some(x), Some(y)) => assert!(x.abs_diff(y) < 500, "{} started at {x}, then {y}", a["id"]),
        _ => assert_eq!(x, y, "{}", a["id"]),
    }
}

#[test]
fn a_killed_runtime_keeps_every_acknowledged_allocation_and_never_reuses_ids() {
    let dir = fresh_dir("sim");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // The minimal setup: one member, 8 simulated nodes.
    let minimal = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/minimal.yaml")).unwrap();
    let config = dir.join("minimal.yaml");
    std::fs::write(
        &config,
        minimal
            .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
            .replace("127.0.0.1:50051", &format!("127.0.0.1:{}", free_port()))
            .replace("../../lattice-data/node-1", &dir.join("data").display().to_string())
            // Restarts, not weights: the default EASY vCluster starts work at once (the shipped
            // profile's passes come every 15 s).
            .replace("profile: ../../profiles/balanced.yaml", "")
            .replace("cycle: 1s", "cycle: 100ms"),
    )
    .unwrap();
    let log = dir.join("runtime.log");
    let mut procs = Procs(vec![runtime(&config, &log)]);
    wait_until("the runtime to serve", Duration::from_secs(20), || healthy(&base));

    let job = |secs: u64| {
        json!({"tenant": "physics", "entrypoint": format!("sleep {secs}"), "resources": {"nodes": 1},
               "lifecycle": {"type": "bounded", "walltime": "10m"}})
    };
    // One that ends before the restart, then 8 running (one per node) and 4 pending behind them.
    let done = submit(&base, job(0));
    wait_until("the first to end", Duration::from_secs(10), || {
        get(&base, &done)["state"] == "completed"
    });
    let running: Vec<String> = (0..8).map(|_| submit(&base, job(6))).collect();
    let pending: Vec<String> = (0..4).map(|_| submit(&base, job(1))).collect();
    assert_eq!(pending.last().unwrap(), "a-000013");
    wait_until("8 running", Duration::from_secs(10), || {
        running.iter().all(|id| get(&base, id)["state"] == "running")
    });
    let before: Vec<Value> = list(&base);
    assert_eq!(before.len(), 13);

    // kill -9 and start again.
    signal(&procs.0[0], libc::SIGKILL);
    procs.0[0].wait().unwrap();
    let restarted = Instant::now();
    procs.0[0] = runtime(&config, &log);
    wait_until("the restarted runtime to serve", Duration::from_secs(20), || {
        healthy(&base)
    });
    let after = list(&base);
    let ids = |l: &[Value]| {
        l.iter()
            .map(|v| v["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&after),
        ids(&before),
        "every acknowledged allocation is back, under its id"
    );
    assert_eq!(get(&base, &done)["state"], "completed", "an ended one stays visible");
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(strip(a), strip(b), "{} changed across the restart", b["id"]);
        same_start(a, b);
    }
    for id in &running {
        // Re-attached to its nodes with its original start: running, not queued again.
        assert_eq!(get(&base, id)["state"], "running", "{id}");
    }
    for id in &pending {
        assert_eq!(get(&base, id)["state"], "pending", "{id}");
    }
    // The next id continues; a-000001 is never handed out again.
    let next = submit(&base, job(1));
    assert_eq!(next, "a-000014");
    // The re-attached runs end 6 s after their original start, not 6 s after the restart.
    wait_until("everything to end", Duration::from_secs(30), || {
        list(&base).iter().all(|v| v["state"] == "completed")
    });
    for id in &running {
        let v = get(&base, id);
        let (s, e) = (v["started_ms"].as_u64().unwrap(), v["ended_ms"].as_u64().unwrap());
        assert!((5_900..9_000).contains(&(e - s)), "{id} ran {} ms", e - s);
    }
    let _ = restarted;

    // A graceful stop (SIGTERM) keeps everything too, ended ones included.
    signal(&procs.0[0], libc::SIGTERM);
    procs.0[0].wait().unwrap();
    procs.0[0] = runtime(&config, &log);
    wait_until("the runtime to serve again", Duration::from_secs(20), || healthy(&base));
    let again = list(&base);
    assert_eq!(again.len(), 14);
    assert!(again.iter().all(|v| v["state"] == "completed"), "{again:?}");
    assert_eq!(submit(&base, job(0)), "a-000015");
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_runtime_reattaches_real_agents_jobs_without_running_them_again() {
    let dir = fresh_dir("agents");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // The shipped one-machine setup with real agents.
    let cfg_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let text = std::fs::read_to_string(format!("{cfg_dir}/dev-agents.yaml")).unwrap();
    let config = dir.join("dev-agents.yaml");
    std::fs::write(
        &config,
        text.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
            .replace("127.0.0.1:50051", &format!("127.0.0.1:{}", free_port()))
            .replace("../../lattice-data/dev-agents", &dir.join("data").display().to_string())
            .replace("dev-nodes.yaml", &format!("{cfg_dir}/dev-nodes.yaml"))
            .replace("cycle: 1s", "cycle: 100ms"),
    )
    .unwrap();
    let log = dir.join("runtime.log");
    let mut procs = Procs(vec![runtime(&config, &log)]);
    wait_until("the runtime to serve", Duration::from_secs(20), || healthy(&base));
    let agent = agent_binary();
    for node in ["node-001", "node-002"] {
        procs.0.push(
            Command::new(&agent)
                .args(["--node-id", node, "--quorum-endpoint", &base])
                .args(["--poll", "100ms", "--heartbeat", "200ms"])
                .arg("--log-dir")
                .arg(dir.join(format!("logs-{node}")))
                .arg("--state-file")
                .arg(dir.join(format!("state-{node}.json")))
                .arg("--scratch-dir")
                .arg(dir.join(format!("scratch-{node}")))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("lattice-agent starts"),
        );
    }
    wait_until("both agents to register", Duration::from_secs(20), || {
        let (_, v) = call("GET", &format!("{base}/v1/nodes"), None);
        v["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().filter(|n| n["fingerprint"].is_string()).count() == 2)
    });
    // A 2-node job that notes each start in a file, then runs 4 s.
    let starts = dir.join("starts");
    let id = submit(
        &base,
        json!({"tenant": "physics", "resources": {"nodes": 2}, "lifecycle": {"walltime": "10m"},
               "entrypoint": format!("echo \"$LATTICE_TASK_INDEX\" >> {}; sleep 4", starts.display())}),
    );
    wait_until("both tasks to start", Duration::from_secs(20), || {
        std::fs::read_to_string(&starts).is_ok_and(|s| s.lines().count() == 2)
    });
    let before = get(&base, &id);
    assert_eq!(before["state"], "running");

    signal(&procs.0[0], libc::SIGKILL);
    procs.0[0].wait().unwrap();
    procs.0[0] = runtime(&config, &log);
    wait_until("the restarted runtime to serve", Duration::from_secs(20), || {
        healthy(&base)
    });
    let after = get(&base, &id);
    assert_eq!(strip(&after), strip(&before), "re-attached to its nodes");
    same_start(&after, &before);
    let end = wait_for_end(&base, &id);
    assert_eq!(
        (end["state"].as_str(), end["end_reason"].as_str()),
        (Some("completed"), Some("success"))
    );
    // Each node ran it exactly once: the agents kept their processes and were not told to start
    // them again.
    let lines = std::fs::read_to_string(&starts).unwrap();
    let mut tasks: Vec<&str> = lines.lines().collect();
    tasks.sort_unstable();
    assert_eq!(tasks, ["0", "1"], "each task started once");
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait_for_end(base: &str, id: &str) -> Value {
    let mut last = Value::Null;
    wait_until("the job to end", Duration::from_secs(30), || {
        last = get(base, id);
        last["ended_ms"].is_u64()
    });
    last
}

/// Runs `cmd` with RUST_BACKTRACE=1 and checks it fails as a user error: exit 1, `error: …`, no
/// backtrace; its stderr.
fn user_error(cmd: &mut Command) -> String {
    let o = cmd.env("RUST_BACKTRACE", "1").output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.starts_with("error: "), "{e}");
    assert!(!e.to_lowercase().contains("backtrace"), "{e}");
    e
}

#[test]
fn user_errors_print_the_message_not_a_backtrace() {
    let e =
        user_error(Command::new(env!("CARGO_BIN_EXE_lattice-runtime")).args(["--config", "/nonexistent/lattice.yaml"]));
    assert!(e.contains("/nonexistent/lattice.yaml"), "{e}");
    user_error(
        Command::new(agent_binary())
            .args(["--node-id", "n1", "--quorum-endpoint", "http://127.0.0.1:1"])
            .args([
                "--bootstrap-cert",
                "/nonexistent/cert.pem",
                "--bootstrap-key",
                "/nonexistent/key.pem",
            ]),
    );
    // Usage errors are clap's: exit 2.
    let o = Command::new(env!("CARGO_BIN_EXE_lattice-runtime"))
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn with_real_agents_nothing_is_placed_on_a_node_whose_agent_never_registered() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = fresh_dir("booting");
    let running = rt.block_on(async {
        let yaml = format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 3\nsimulate_agents: false\ncycle: 100ms\n",
            dir.display()
        );
        lattice_runtime::start(lattice_runtime::RuntimeConfig::parse("t.yaml", &yaml).unwrap(), true)
            .await
            .unwrap()
    });
    let base = format!("http://{}", running.rest_addr);
    wait_until("the member to serve", Duration::from_secs(20), || healthy(&base));
    let state = |n: &str| call("GET", &format!("{base}/v1/nodes/{n}"), None).1["state"].clone();
    // Only sim-002's agent registers: sim-000 and sim-001 stay Booting, the job goes to sim-002.
    for n in ["sim-000", "sim-001", "sim-002"] {
        assert_eq!(state(n), "booting", "{n}");
    }
    let (s, v) = call("POST", &format!("{base}/v1/nodes/sim-002/register"), Some(json!({})));
    assert_eq!((s, v["state"].as_str()), (200, Some("ready")), "{v}");
    let id = submit(
        &base,
        json!({"tenant": "physics", "entrypoint": "true", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"}}),
    );
    wait_until("the job to be placed", Duration::from_secs(10), || {
        get(&base, &id)["state"] == "running"
    });
    assert_eq!(get(&base, &id)["nodes"], json!(["sim-002"]));
    assert_eq!(state("sim-000"), "booting");
    // A 2-node job waits: only one node has an agent.
    let two = submit(
        &base,
        json!({"tenant": "physics", "entrypoint": "true", "resources": {"nodes": 2}, "lifecycle": {"walltime": "1m"}}),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(&base, &two)["state"], "pending");
    rt.block_on(running.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}

/// After a take-over, a node holding a re-attached allocation keeps its agent's silence timer, but
/// its heartbeat sequence is unknown to the new control plane: its first heartbeat is answered "has
/// not registered" (the agent registers again and its sequence restarts), so an earlier heartbeat
/// delivered again is never taken (found by DST, seed 550).
#[test]
fn a_taken_over_nodes_agent_registers_before_its_heartbeats_count() {
    let mut c = common::balanced_control(2);
    c.real_agents = true;
    c.set_clock(lattice_engine::Time(1_000_000));
    let req: lattice_control::SubmitRequest = serde_json::from_value(json!({"tenant": "t",
        "entrypoint": "sleep 600", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1h"}}))
    .unwrap();
    let id = c.submit(req).unwrap();
    let node = c.nodes()[0].name.clone();
    c.reattach(
        &id,
        std::slice::from_ref(&node),
        (999_000, 998_000),
        &Default::default(),
        None,
    )
    .unwrap();
    let e = c.heartbeat(&node, 14).unwrap_err();
    assert!(e.message.contains("has not registered"), "{e}");
    c.register_agent(&node).unwrap();
    c.heartbeat(&node, 1).unwrap();
    let e = c.heartbeat(&node, 1).unwrap_err();
    assert!(
        e.message.contains("replayed"),
        "a heartbeat delivered again is refused: {e}"
    );
    assert_eq!(
        c.view_named(&id).unwrap().state,
        "running",
        "the re-attached run goes on"
    );
}

/// An operator's standing drain holds when the node comes back: a new leader's node whose agent
/// registers (Booting → Ready) drains at once, and lifting the order undrains it; a disable holds
/// through the agent's registration until lifted.
#[test]
fn a_standing_drain_holds_when_the_node_comes_back() {
    let mut c = common::balanced_control(2);
    c.real_agents = true;
    c.set_clock(lattice_engine::Time(1_000_000));
    c.await_agents();
    let node = c.nodes()[1].name.clone();
    assert_eq!(c.node_state_of(&node).as_deref(), Some("booting"));
    c.set_admin(&node, true, false);
    assert_eq!(
        c.node_state_of(&node).as_deref(),
        Some("booting"),
        "nothing to drain yet"
    );
    c.register_agent(&node).unwrap();
    assert_eq!(c.node_state_of(&node).as_deref(), Some("drained"), "up again, drained");
    // Lifting the order (the operator's undrain) brings it back.
    c.set_admin(&node, false, false);
    assert_eq!(c.node_state_of(&node).as_deref(), Some("ready"));
    // A disabled node goes down and stays down until enabled.
    c.set_admin(&node, false, true);
    assert_eq!(c.node_state_of(&node).as_deref(), Some("down"));
    c.register_agent(&node).unwrap();
    assert_eq!(
        c.node_state_of(&node).as_deref(),
        Some("down"),
        "its agent is back, the order holds"
    );
    c.set_admin(&node, false, false);
    assert_eq!(c.node_state_of(&node).as_deref(), Some("ready"), "enabled");
}

/// The REST base URL of whichever member leads, if one does.
fn leader_of(bases: &[String]) -> Option<String> {
    bases
        .iter()
        .find(|b| call("GET", &format!("{b}/healthz"), None).1["raft_state"] == "Leader")
        .cloned()
}

/// A three-member quorum of real `lattice-runtime` processes under SIGKILL: the leader killed while a
/// client submits, then every member killed at once (a whole-cluster crash: no process drains or
/// flushes anything) and started again from its disk. Every acknowledged submission is there
/// afterwards under its id with what was submitted (its tag), no id is held twice or handed out again,
/// and the restarted quorum still runs work to its end.
/// Three `lattice-runtime` members (processes) on loopback: their REST bases and how to start
/// member `i` (member 1 forms the quorum; a member started with --bootstrap after its first start
/// ignores the flag: its store has state).
struct Quorum {
    bases: Vec<String>,
    configs: Vec<PathBuf>,
    logs: Vec<PathBuf>,
}

impl Quorum {
    fn new(dir: &Path, extra: &str) -> Quorum {
        let grpc: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let rest: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let members: String = grpc
            .iter()
            .enumerate()
            .map(|(i, p)| format!("  {}: 127.0.0.1:{p}\n", i + 1))
            .collect();
        let configs = (0..3)
            .map(|i| {
                let c = dir.join(format!("m{}.yaml", i + 1));
                std::fs::write(
                    &c,
                    format!(
                        "node_id: {id}\nrest_listen: 127.0.0.1:{r}\ngrpc_listen: 127.0.0.1:{g}\ndata_dir: {d}/m{id}\n{extra}members:\n{members}",
                        id = i + 1,
                        r = rest[i],
                        g = grpc[i],
                        d = dir.display()
                    ),
                )
                .unwrap();
                c
            })
            .collect();
        Quorum {
            bases: rest.iter().map(|p| format!("http://127.0.0.1:{p}")).collect(),
            configs,
            logs: (0..3).map(|i| dir.join(format!("m{}.log", i + 1))).collect(),
        }
    }

    fn start(&self, i: usize) -> Child {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.logs[i])
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lattice-runtime"));
        cmd.arg("--config").arg(&self.configs[i]);
        if i == 0 {
            cmd.arg("--bootstrap");
        }
        cmd.env("RUST_LOG", "info,openraft=warn")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("lattice-runtime starts")
    }
}

#[test]
fn a_sigkilled_three_member_quorum_loses_no_acknowledged_submission() {
    let dir = fresh_dir("quorum");
    let q = Quorum::new(&dir, "simulated_nodes: 4\ncycle: 100ms\n");
    let bases = q.bases.clone();
    let start = |i: usize| q.start(i);
    let mut procs = Procs((0..3).map(start).collect());
    wait_until("a leader", Duration::from_secs(30), || leader_of(&bases).is_some());

    // Submits with tag `seq`, following the leader; what was acknowledged (201) and under which id.
    let mut acked: Vec<(String, u32)> = Vec::new();
    let mut seq = 0u32;
    let mut submit_some = |n: usize, acked: &mut Vec<(String, u32)>| {
        let t0 = Instant::now();
        let target = acked.len() + n;
        while acked.len() < target {
            assert!(t0.elapsed() < Duration::from_secs(60), "no progress submitting");
            let Some(leader) = leader_of(&bases) else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            seq += 1;
            // Long ones stay queued or running across the crashes; every fifth ends quickly.
            let secs = if seq.is_multiple_of(5) { 0.2 } else { 600.0 };
            let body = json!({"tenant": "physics", "entrypoint": format!("sleep {secs}"),
                "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "20m"},
                "tags": {"seq": seq.to_string()}});
            let (status, v) = call("POST", &format!("{leader}/v1/allocations"), Some(body));
            if status == 201 {
                acked.push((v["id"].as_str().unwrap().to_string(), seq));
            }
        }
    };
    submit_some(20, &mut acked);

    // SIGKILL the leader mid-stream; the others elect one and take more; the killed one comes back
    // from its disk and catches up.
    let leader = leader_of(&bases).unwrap();
    let li = bases.iter().position(|b| *b == leader).unwrap();
    signal(&procs.0[li], libc::SIGKILL);
    procs.0[li].wait().unwrap();
    submit_some(15, &mut acked);
    procs.0[li] = start(li);
    submit_some(15, &mut acked);

    // The whole cluster crashes at once, and comes back.
    for c in &mut procs.0 {
        signal(c, libc::SIGKILL);
    }
    for c in &mut procs.0 {
        c.wait().unwrap();
    }
    for i in 0..3 {
        procs.0[i] = start(i);
    }
    wait_until(
        "a leader after the whole-cluster crash",
        Duration::from_secs(60),
        || leader_of(&bases).is_some_and(|b| healthy(&b)),
    );

    let check = |acked: &[(String, u32)]| {
        let leader = leader_of(&bases).expect("a leader");
        let all = list(&leader);
        let mut ids = std::collections::BTreeSet::new();
        for a in &all {
            assert!(ids.insert(a["id"].to_string()), "id {} held twice", a["id"]);
        }
        for (id, seq) in acked {
            let (status, v) = call("GET", &format!("{leader}/v1/allocations/{id}"), None);
            assert_eq!(status, 200, "acknowledged {id} (seq {seq}) is lost: {v}");
            assert_eq!(
                v["tags"]["seq"],
                seq.to_string(),
                "{id} is another submission than the one acknowledged under it"
            );
        }
    };
    check(&acked);
    eprintln!(
        "{} acknowledged before the whole-cluster crash, all found; member {} was the first leader killed",
        acked.len(),
        li + 1
    );
    // New submissions get new ids, and the quorum still runs work to its end.
    let before: std::collections::BTreeSet<String> = acked.iter().map(|(id, _)| id.clone()).collect();
    submit_some(5, &mut acked);
    for (id, _) in &acked[acked.len() - 5..] {
        assert!(!before.contains(id), "{id} handed out again");
    }
    check(&acked);
    let quick: Vec<String> = acked
        .iter()
        .filter(|(_, s)| s.is_multiple_of(5))
        .map(|(id, _)| id.clone())
        .collect();
    // Only 4 nodes, held by long runs: cancel those so the quick ones get through.
    let leader = leader_of(&bases).unwrap();
    for (id, s) in &acked {
        if !s.is_multiple_of(5) {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let _ = agent.delete(&format!("{leader}/v1/allocations/{id}")).call();
        }
    }
    wait_until("the quick ones to complete", Duration::from_secs(60), || {
        let Some(l) = leader_of(&bases) else { return false };
        quick
            .iter()
            .all(|id| call("GET", &format!("{l}/v1/allocations/{id}"), None).1["state"] == "completed")
    });
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Group commit under SIGKILL: 32 clients submit to the leader of three members as fast as it
/// acknowledges (each acknowledgment one of many sharing a disk commit and a mirror round); the
/// leader is SIGKILLed mid-stream, with submissions in flight. Every acknowledged id is found
/// afterwards on the new leader with what was submitted under it, and no id is held twice.
#[test]
fn a_leader_sigkilled_during_a_high_rate_run_loses_no_acknowledged_submission() {
    let dir = fresh_dir("high-rate");
    let q = Quorum::new(
        &dir,
        "simulated_nodes: 4\ncycle: 1s\nauth:\n  rate_limit_per_minute: 100000000\n",
    );
    let mut procs = Procs((0..3).map(|i| q.start(i)).collect());
    wait_until("a leader", Duration::from_secs(30), || leader_of(&q.bases).is_some());
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..32)
        .map(|c| {
            let (acked, stop, bases) = (acked.clone(), stop.clone(), q.bases.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(5)))
                    .build()
                    .into();
                let mut n = 0u32;
                let mut leader = None;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Some(base) = leader.clone().or_else(|| leader_of(&bases)) else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    n += 1;
                    let tag = format!("c{c}-{n}");
                    let body = json!({"tenant": "physics", "entrypoint": "sleep 600",
                        "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "20m"},
                        "tags": {"seq": tag}});
                    match agent.post(&format!("{base}/v1/allocations")).send_json(&body) {
                        Ok(mut r) if r.status() == 201 => {
                            let v: Value = r.body_mut().read_json().unwrap();
                            acked.lock().unwrap().push((v["id"].as_str().unwrap().to_string(), tag));
                            leader = Some(base);
                        }
                        _ => {
                            leader = None;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            })
        })
        .collect();
    wait_until("500 acknowledged", Duration::from_secs(60), || {
        acked.lock().unwrap().len() >= 500
    });
    let leader = leader_of(&q.bases).unwrap();
    let li = q.bases.iter().position(|b| *b == leader).unwrap();
    signal(&procs.0[li], libc::SIGKILL);
    procs.0[li].wait().unwrap();
    let before = acked.lock().unwrap().len();
    wait_until("more acknowledged by the new leader", Duration::from_secs(60), || {
        acked.lock().unwrap().len() >= before + 200
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let leader = leader_of(&q.bases).expect("a leader");
    let all = list(&leader);
    let mut tags = std::collections::BTreeMap::new();
    for a in &all {
        assert!(
            tags.insert(a["id"].as_str().unwrap().to_string(), a["tags"]["seq"].clone())
                .is_none(),
            "id {} held twice",
            a["id"]
        );
    }
    for (id, tag) in &acked {
        assert_eq!(
            tags.get(id).and_then(|t| t.as_str()),
            Some(tag.as_str()),
            "acknowledged {id} ({tag}) is lost or another submission's"
        );
    }
    eprintln!(
        "{} acknowledged ({before} before member {} the leader was SIGKILLed), all found",
        acked.len(),
        li + 1
    );
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
