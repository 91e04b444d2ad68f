//! A control plane and two real `lattice-agent` processes on loopback: a 2-node job runs as real
//! processes with the seed's environment on both nodes and completes; a job that outlives its
//! walltime is terminated; a failing command fails the allocation; a cancelled job's processes are
//! stopped and its nodes run the next job; each agent registered its conformance fingerprint; and
//! a restarted agent takes over its running job from the state file; and when an agent dies under a
//! running job its node goes Down and the job is requeued elsewhere. A uenv job runs in its SquashFS
//! image, mounted for its processes alone. An MPI program (Debian's MPICH) runs as 4 ranks over 2
//! agents through Lattice's PMI — from a batch script's `lattice launch` and its `srun` — and a
//! failing rank or a fence that never completes aborts the launch with the seed's reason.

use lattice_testkit::{Agents, agent_command, call};
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

fn wait_for(base: &str, id: &str, pred: impl Fn(&Value) -> bool, within: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let (_, v) = call("GET", &format!("{base}/v1/allocations/{id}"), None);
        if pred(&v) {
            return v;
        }
        assert!(t0.elapsed() < within, "{id}: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until each of `nodes` is ready (a sensitive claim takes ready nodes at once or is refused).
fn wait_ready(base: &str, nodes: &[&str], within: Duration) {
    let t0 = Instant::now();
    for n in nodes {
        loop {
            let (_, v) = call("GET", &format!("{base}/v1/nodes/{n}"), None);
            if v["state"] == "ready" {
                break;
            }
            assert!(t0.elapsed() < within, "{n}: {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn two_agents_run_real_jobs() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (rt, running) = control_plane(&dir, 2, "agents:\n  heartbeat_timeout: 1s\n  grace: 1s\n");
    let base = format!("http://{}", running.rest_addr);
    // A Pushgateway stand-in: keeps every PUT body.
    let pushed = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let gateway = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let push_url = format!("http://{}/metrics/job/lattice-agent", gateway.local_addr().unwrap());
    {
        let pushed = pushed.clone();
        std::thread::spawn(move || {
            use std::io::{BufRead, BufReader, Read, Write};
            for s in gateway.incoming().flatten() {
                let mut r = BufReader::new(s);
                let mut len = 0usize;
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0u8; len];
                let _ = r.read_exact(&mut body);
                pushed.lock().unwrap().push(String::from_utf8_lossy(&body).into_owned());
                let _ = r
                    .get_mut()
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            }
        });
    }
    let spawn = |n: &str| {
        agent_command(n, &base, &dir)
            .args(["--telemetry-mode", "debug", "--metrics-push", &push_url])
            .args(["--grace", "300ms", "--checkpoint-answer-timeout", "1s", "--shm-dir"])
            .arg(dir.join("shm"))
            .spawn()
            .expect("lattice-agent starts")
    };
    let agents = Agents(["sim-000", "sim-001"].iter().map(|n| spawn(n)).collect());
    // Both registered with a fingerprint.
    let t0 = Instant::now();
    loop {
        let (_, v) = call("GET", &format!("{base}/v1/nodes"), None);
        let fps: Vec<&str> = v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["fingerprint"].as_str())
            .collect();
        if fps.len() == 2 {
            assert!(fps.iter().all(|f| f.len() == 64), "{fps:?}");
            assert_eq!(fps[0], fps[1], "same machine, same fingerprint");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "agents did not register: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // On request the agent recomputes its fingerprint and reports it again (registering anew).
    let (_, n) = call("GET", &format!("{base}/v1/nodes/sim-001"), None);
    let before = n["fingerprint_ms"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (status, v) = call("POST", &format!("{base}/v1/nodes/sim-001/fingerprint"), None);
    assert_eq!(status, 202, "{v}");
    let t0 = Instant::now();
    loop {
        let (_, n) = call("GET", &format!("{base}/v1/nodes/sim-001"), None);
        if n["fingerprint_ms"].as_u64().unwrap() > before {
            assert_eq!(n["fingerprint"].as_str().unwrap().len(), 64);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "not reported again: {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let submit = |entrypoint: &str, nodes: u32, walltime: &str| {
        let (status, v) = call(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "physics", "entrypoint": entrypoint, "resources": {"nodes": nodes},
                        "lifecycle": {"walltime": walltime}}),
            ),
        );
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let ended = |v: &Value| v["ended_ms"].is_u64();

    // A real 2-node job: each task sees its index and the node list.
    let a = submit(
        "hostname; echo task $LATTICE_TASK_INDEX of $LATTICE_NNODES on $LATTICE_NODELIST",
        2,
        "1m",
    );
    let v = wait_for(&base, &a, ended, Duration::from_secs(10));
    assert_eq!(
        (v["state"].as_str(), v["end_reason"].as_str()),
        (Some("completed"), Some("success")),
        "{v}"
    );
    for (i, n) in ["sim-000", "sim-001"].iter().enumerate() {
        let log = std::fs::read_to_string(dir.join(format!("logs-{n}/{a}.log"))).unwrap();
        let task = v["nodes"].as_array().unwrap().iter().position(|x| x == n).unwrap();
        assert!(
            log.contains(&format!("task {task} of 2 on sim-000,sim-001")),
            "{i}: {log}"
        );
    }

    let (_, l) = call("GET", &format!("{base}/v1/allocations/{a}/logs"), None);
    for n in ["sim-000", "sim-001"] {
        assert!(
            l["nodes"][n].as_str().unwrap().contains("of 2 on sim-000,sim-001"),
            "{l}"
        );
    }

    // A checkpoint request reaches the task as SIGUSR1 (the book's signal hint) and the job goes on.
    let h = submit(
        "trap 'echo checkpoint-hint' USR1; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.2; done; echo finished",
        1,
        "1m",
    );
    wait_for(&base, &h, |v| v["state"] == "running", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(400));
    let (status, v) = call("POST", &format!("{base}/v1/allocations/{h}/checkpoint"), None);
    assert_eq!(status, 202, "{v}");
    let v = wait_for(&base, &h, ended, Duration::from_secs(10));
    assert_eq!(v["end_reason"], "success", "{v}");
    let (_, l) = call("GET", &format!("{base}/v1/allocations/{h}/logs"), None);
    let text = l["nodes"][v["nodes"][0].as_str().unwrap()]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("checkpoint-hint") && text.contains("finished"), "{text}");

    // The other two mechanisms the application may declare. Shmem: the agent sets byte 0 of the flag
    // file; the task sees it, "checkpoints", clears it and sets done (byte 1).
    let with_mechanism = |entrypoint: &str, mechanism: &str| {
        let (status, v) = call(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "physics", "entrypoint": entrypoint, "resources": {"nodes": 1},
                        "lifecycle": {"walltime": "1m"},
                        "checkpoint": {"strategy": "manual", "mechanism": mechanism}}),
            ),
        );
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let hint_and_log = |id: &str| {
        wait_for(&base, id, |v| v["state"] == "running", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
        let (status, v) = call("POST", &format!("{base}/v1/allocations/{id}/checkpoint"), None);
        assert_eq!(status, 202, "{v}");
        let v = wait_for(&base, id, ended, Duration::from_secs(10));
        assert_eq!(v["end_reason"], "success", "{v}");
        let (_, l) = call("GET", &format!("{base}/v1/allocations/{id}/logs"), None);
        l["nodes"][v["nodes"][0].as_str().unwrap()]
            .as_str()
            .unwrap()
            .to_string()
    };
    let s = with_mechanism(
        r#"trap 'echo got-signal' USR1; f=$LATTICE_CHECKPOINT_FLAG; i=0
           while [ $i -lt 60 ]; do
             if [ "$(od -An -tu1 -N1 "$f" | tr -d ' ')" = 1 ]; then echo shmem-hint; printf '\000\001' > "$f"; break; fi
             sleep 0.05; i=$((i+1))
           done; echo finished"#,
        "shmem",
    );
    let text = hint_and_log(&s);
    assert!(text.contains("shmem-hint") && !text.contains("got-signal"), "{text}");
    // gRPC callback: the application registers its endpoint (here the test plays the application's
    // server); the agent calls it instead of signalling.
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let c2 = calls.clone();
    let app = lattice_node_adapters::checkpoint::spawn_app_endpoint(
        std::sync::Arc::new(move |r: &lattice_node_adapters::checkpoint::pb::CheckpointRequest| {
            c2.lock().unwrap().push(r.allocation_id.clone());
            vec![lattice_node_adapters::checkpoint::pb::CheckpointProgress {
                estimated_s: 1,
                percent: 100,
                defer_s: 0,
                done: true,
            }]
        }),
        Duration::from_millis(10),
    )
    .unwrap();
    let g = with_mechanism(
        &format!(
            "trap 'echo got-signal' USR1; echo {app} > $LATTICE_CHECKPOINT_ENDPOINT_FILE; for i in 1 2 3 4 5 6 7 8; do sleep 0.2; done"
        ),
        "grpc",
    );
    let text = hint_and_log(&g);
    assert!(!text.contains("got-signal"), "{text}");
    assert_eq!(*calls.lock().unwrap(), vec![g.clone()]);
    // No endpoint registered: the hint falls back to SIGUSR1 rather than being lost.
    let n = with_mechanism(
        "trap 'echo got-signal' USR1; for i in 1 2 3 4 5 6 7 8; do sleep 0.2; done",
        "grpc",
    );
    let text = hint_and_log(&n);
    assert!(text.contains("got-signal"), "{text}");

    // Telemetry: while a 2-node job runs, each agent pushes its counters every second (debug mode).
    let t = submit("sleep 1.5", 2, "1m");
    wait_for(&base, &t, ended, Duration::from_secs(10));
    let bodies = pushed.lock().unwrap().clone();
    let line = format!("lattice_alloc_processes{{alloc=\"{t}\",node=\"sim-000\"}}");
    assert!(
        bodies.iter().any(|b| b.contains(&line)),
        "no sample of {t} on sim-000 among {} pushes",
        bodies.len()
    );

    // A failing command fails the allocation; one past its walltime is killed.
    let b = submit("exit 3", 1, "1m");
    let v = wait_for(&base, &b, ended, Duration::from_secs(10));
    assert_eq!(v["end_reason"], "exit_failure", "{v}");
    let c = submit("sleep 30", 1, "1s");
    let t = Instant::now();
    let v = wait_for(&base, &c, ended, Duration::from_secs(10));
    assert_eq!(v["end_reason"], "walltime_exceeded", "{v}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "killed at its walltime, not at the end of the sleep"
    );

    // Cancel a running job: its processes stop and its nodes take the next job.
    let d = submit("sleep 30", 2, "1m");
    wait_for(&base, &d, |v| v["state"] == "running", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    let (status, _) = call("DELETE", &format!("{base}/v1/allocations/{d}"), None);
    assert_eq!(status, 200);
    // Its processes were stopped: each agent wrote the log it writes when a process ends.
    let t = Instant::now();
    while !["sim-000", "sim-001"]
        .iter()
        .all(|n| dir.join(format!("logs-{n}/{d}.log")).exists())
    {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the cancelled job's processes still run"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let e = submit("true", 2, "1m");
    let v = wait_for(&base, &e, ended, Duration::from_secs(10));
    assert_eq!(v["end_reason"], "success", "{v}");

    // Restart an agent under a running job: the new one takes the process over from the state file
    // and reports its end; the job completes where it ran.
    let mut agents = agents;
    let g = submit("echo started; sleep 1.5; echo survived", 1, "1m");
    let v = wait_for(&base, &g, |v| v["state"] == "running", Duration::from_secs(10));
    let node = v["nodes"][0].as_str().unwrap().to_string();
    let k = if node == "sim-000" { 0 } else { 1 };
    std::thread::sleep(Duration::from_millis(300));
    agents.0[k].kill().unwrap();
    agents.0[k].wait().unwrap();
    agents.0[k] = spawn(&node);
    let v = wait_for(&base, &g, ended, Duration::from_secs(10));
    assert_eq!(v["end_reason"], "success", "{v}");
    assert_eq!(v["nodes"][0].as_str(), Some(node.as_str()), "it was not rerun: {v}");
    let (_, l) = call("GET", &format!("{base}/v1/allocations/{g}/logs"), None);
    let text = l["nodes"][&node].as_str().unwrap();
    assert!(text.contains("survived"), "{l}");
    assert_eq!(
        text.matches("started").count(),
        1,
        "taken over, not started again: {text}"
    );

    // Kill an agent under a running job: its heartbeats stop, its node goes Degraded then Down, and
    // the job is requeued (the default policy on node failure) and runs on the other node.
    let f = submit("sleep 2", 1, "1m");
    let v = wait_for(&base, &f, |v| v["state"] == "running", Duration::from_secs(10));
    let first = v["nodes"][0].as_str().unwrap().to_string();
    let k = if first == "sim-000" { 0 } else { 1 };
    agents.0[k].kill().unwrap();
    agents.0[k].wait().unwrap();
    let v = wait_for(&base, &f, ended, Duration::from_secs(15));
    assert_eq!(v["end_reason"], "success", "{v}");
    assert_ne!(
        v["nodes"][0].as_str(),
        Some(first.as_str()),
        "it ran again elsewhere: {v}"
    );
    let (_, n) = call("GET", &format!("{base}/v1/nodes/{first}"), None);
    assert_eq!(n["state"], "down", "{n}");
    drop(agents);
    rt.block_on(running.shutdown());
}

/// A single-member control plane whose `nodes` nodes are run by real agents, `extra` YAML appended;
/// returned once it leads.
fn control_plane(
    dir: &std::path::Path,
    nodes: u32,
    extra: &str,
) -> (tokio::runtime::Runtime, lattice_runtime::Running) {
    let _ = std::fs::remove_dir_all(dir);
    lattice_testkit::control_plane(dir, nodes, &format!("simulate_agents: false\n{extra}"))
}

/// A TCP relay to `backend` that can be cut (every connection dropped, new ones refused) and healed:
/// a network partition between an agent and its control plane.
struct Relay {
    addr: std::net::SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    fn start(backend: std::net::SocketAddr) -> Relay {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c = cut.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: connection reset
                }
                let Ok(server) = std::net::TcpStream::connect(backend) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let c = c.clone();
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        from.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                        let mut buf = [0u8; 16384];
                        loop {
                            if c.load(Ordering::SeqCst) {
                                break;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => break,
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { addr, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_partitioned_agent_keeps_running_buffers_heartbeats_and_replays_them() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-partition-{}", std::process::id()));
    // The partition (2 s) is shorter than the heartbeat timeout: the node must stay Ready.
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let relay = Relay::start(running.rest_addr);
    let agent = Agents(vec![
        agent_command("sim-000", &format!("http://{}", relay.addr), &dir)
            .spawn()
            .unwrap(),
    ]);
    // The agent has registered (a job shows `running` from the quorum's commit, which may come
    // before the agent's first call: a cut then would be a registration retried, not a partition).
    let t0 = Instant::now();
    loop {
        let (_, n) = call("GET", &format!("{base}/v1/nodes/sim-000"), None);
        if n["fingerprint"].is_string() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the agent did not register: {n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "entrypoint": "sleep 1; echo through-the-partition",
                    "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"}}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    wait_for(&base, &id, |v| v["state"] == "running", Duration::from_secs(10));
    // Cut: the job ends during the partition; the agent keeps its exit and its heartbeats.
    relay.set_cut(true);
    std::thread::sleep(Duration::from_secs(2));
    let (_, v) = call("GET", &format!("{base}/v1/allocations/{id}"), None);
    assert_eq!(v["state"], "running", "the control plane has not heard yet: {v}");
    relay.set_cut(false);
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(10));
    assert_eq!(v["end_reason"], "success", "the buffered exit was delivered: {v}");
    let t0 = Instant::now();
    let n = loop {
        let (_, n) = call("GET", &format!("{base}/v1/nodes/sim-000"), None);
        if n["last_partition"].is_object() {
            break n;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no replay recorded: {n}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let p = &n["last_partition"];
    let beats = p["heartbeats"].as_u64().unwrap();
    // 2 s at 200 ms: about 10 heartbeats buffered (timeouts of the cut connections stretch a few).
    assert!((4..=11).contains(&beats), "{n}");
    let span = p["to_ms"].as_u64().unwrap() - p["from_ms"].as_u64().unwrap();
    assert!((600..=2400).contains(&span), "{n}");
    assert_eq!(n["state"], "ready", "{n}");
    drop(agent);
    rt.block_on(running.shutdown());
}

/// An exit the control plane has not taken survives its agent: a job ends during a partition, the
/// agent is SIGKILLed before it could report it, and the next agent — given every endpoint, the first
/// of which answers nothing — reports it once the partition heals. The job runs once.
#[test]
fn an_exit_not_yet_taken_survives_the_agent_being_killed() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-exits-{}", std::process::id()));
    // Heartbeats may stop for a while (the partition and the agent's restart) without the node going
    // Down or the agent fencing its work.
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 30s\n  grace: 30s\n");
    let base = format!("http://{}", running.rest_addr);
    let relay = Relay::start(running.rest_addr);
    let endpoint = format!("http://{}", relay.addr);
    let mut agent = Agents(vec![agent_command("sim-000", &endpoint, &dir).spawn().unwrap()]);
    let runs = dir.join("runs");
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "entrypoint": format!("echo run >> {}; sleep 1; exit 3", runs.display()),
            "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"}}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    while !runs.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the job never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    relay.set_cut(true);
    // The job ends during the partition: its exit is kept on disk until taken.
    let exits = dir.join("state-sim-000.exits");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&exits).is_ok_and(|t| t.contains(&id)) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the exit was never kept");
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.0[0].kill().unwrap(); // SIGKILL
    agent.0[0].wait().unwrap();
    let (_, v) = call("GET", &format!("{base}/v1/allocations/{id}"), None);
    assert_eq!(v["state"], "running", "the control plane has not heard: {v}");
    relay.set_cut(false);
    // Port 9 on loopback answers nothing: the agent moves on to the next endpoint.
    agent.0[0] = agent_command("sim-000", &format!("http://127.0.0.1:9,{endpoint}"), &dir)
        .spawn()
        .unwrap();
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(15));
    assert_eq!(v["end_reason"], "exit_failure", "the kept exit was reported: {v}");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        1,
        "it ran once"
    );
    let t0 = Instant::now();
    while std::fs::read_to_string(&exits).is_ok_and(|t| t.contains(&id)) {
        assert!(t0.elapsed() < Duration::from_secs(5), "a taken exit stays on disk");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(agent);
    rt.block_on(running.shutdown());
}

#[test]
fn an_agent_with_a_bootstrap_certificate_runs_jobs_over_mtls() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-mtls-{}", std::process::id()));
    let tls = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../runtime/tests/fixtures/tls");
    let f = |n: &str| tls.join(n).display().to_string();
    let (rt, running) = control_plane(
        &dir,
        2,
        &format!(
            "tls:\n  cert: {}\n  key: {}\n  ca: {}\n  mtls: true\n",
            f("member.pem"),
            f("member.key"),
            f("ca.pem")
        ),
    );
    let base = format!("https://{}", running.rest_addr);
    let spawn = |node: &str, cert: &str| {
        agent_command(node, &base, &dir)
            .args(["--bootstrap-ca", &f("ca.pem")])
            .args(["--bootstrap-cert", &f(&format!("{cert}.pem"))])
            .args(["--bootstrap-key", &f(&format!("{cert}.key"))])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // sim-000 with its own certificate; "sim-001" with sim-000's certificate is an impostor.
    let mut agents = Agents(vec![
        spawn("sim-000", "agent-sim-000"),
        spawn("sim-001", "agent-sim-000"),
    ]);
    let client = {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
        let pem = |n: &str| std::fs::read(tls.join(n)).unwrap();
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::new_with_certs(&[
                Certificate::from_pem(&pem("ca.pem")).unwrap()
            ]))
            .client_cert(Some(ClientCert::new_with_certs(
                &[Certificate::from_pem(&pem("client.pem")).unwrap()],
                PrivateKey::from_pem(&pem("client.key")).unwrap(),
            )))
            .build();
        ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .build()
            .new_agent()
    };
    let get = |path: &str| -> Value {
        let mut r = client.get(&format!("{base}{path}")).call().unwrap();
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
    };
    let mut r = client
        .post(&format!("{base}/v1/allocations"))
        .send_json(
            json!({"tenant": "physics", "entrypoint": "echo over-mtls on $LATTICE_NODELIST",
                          "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"}}),
        )
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let v = loop {
        let v = get(&format!("/v1/allocations/{id}"));
        if v["ended_ms"].is_u64() {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (v["end_reason"].as_str(), v["nodes"][0].as_str()),
        (Some("success"), Some("sim-000")),
        "{v}"
    );
    let l = get(&format!("/v1/allocations/{id}/logs"));
    assert!(
        l["nodes"]["sim-000"].as_str().unwrap().contains("over-mtls on sim-000"),
        "{l}"
    );
    // The impostor never registered: the control plane refused it (403) on every attempt.
    let n = get("/v1/nodes/sim-001");
    assert!(n["fingerprint"].is_null(), "{n}");
    let mut impostor = agents.0.remove(1);
    let _ = impostor.kill();
    let mut err = String::new();
    std::io::Read::read_to_string(impostor.stderr.as_mut().unwrap(), &mut err).unwrap();
    let _ = impostor.wait();
    assert!(
        err.contains("403") && err.contains("names sim-000, not node sim-001"),
        "{err}"
    );
    drop(agents);
    rt.block_on(running.shutdown());
}

#[test]
fn output_is_stored_in_zstd_chunks_and_followed_live() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-logs-{}", std::process::id()));
    let bucket = dir.join("bucket");
    let (rt, running) = control_plane(&dir, 1, &format!("log_store: {}\n", bucket.display()));
    let base = format!("http://{}", running.rest_addr);
    let agent = Agents(vec![
        agent_command("sim-000", &base, &dir)
            .args(["--log-flush", "300ms", "--log-store"])
            .arg(&bucket)
            .spawn()
            .unwrap(),
    ]);
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "project": "climate", "resources": {"nodes": 1},
                    "entrypoint": "i=1; while [ $i -le 30 ]; do echo line $i; echo warn $i >&2; i=$((i+1)); sleep 0.1; done",
                    "lifecycle": {"walltime": "1m"}}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    wait_for(&base, &id, |v| v["state"] == "running", Duration::from_secs(10));
    // Follow: the agent streams new output with its polls while someone asks — stdout and stderr
    // each as its own stream.
    let mut text = String::new();
    let mut errors = String::new();
    let (mut next, mut next_err) = (0u64, 0u64);
    let mut live_before_end = false;
    let t0 = Instant::now();
    loop {
        for (stream, got, next) in [("stdout", &mut text, &mut next), ("stderr", &mut errors, &mut next_err)] {
            let (status, v) = call(
                "GET",
                &format!("{base}/v1/allocations/{id}/logs/live?stream={stream}&after=sim-000:{next}"),
                None,
            );
            assert_eq!((status, v["stream"].as_str()), (200, Some(stream)), "{v}");
            if let Some(o) = v["nodes"]["sim-000"].as_object() {
                assert_eq!(o["offset"].as_u64(), Some(*next), "contiguous: {v}");
                got.push_str(o["data"].as_str().unwrap());
                *next = o["next"].as_u64().unwrap();
            }
        }
        let (_, a) = call("GET", &format!("{base}/v1/allocations/{id}"), None);
        if !a["ended_ms"].is_u64() && text.contains("line 3\n") {
            live_before_end = true;
        }
        if text.contains("line 30\n") && errors.contains("warn 30\n") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "followed so far: {text} / {errors}"
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(live_before_end, "output arrived while the job ran");
    let expected: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    let expected_err: String = (1..=30).map(|i| format!("warn {i}\n")).collect();
    assert_eq!(text, expected, "every line once, in order, stdout only");
    assert_eq!(errors, expected_err, "every stderr line once, in order, stderr only");
    let bad = call(
        "GET",
        &format!("{base}/v1/allocations/{id}/logs/live?after=sim-000"),
        None,
    );
    assert_eq!((bad.0, bad.1["field"].as_str()), (400, Some("after")), "{}", bad.1);

    // History: from the store's zstd chunks, by byte range too.
    wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(10));
    let (_, l) = call("GET", &format!("{base}/v1/allocations/{id}/logs"), None);
    assert_eq!(l["source"], "store", "{l}");
    assert_eq!(l["nodes"]["sim-000"].as_str(), Some(expected.as_str()));
    let (_, l) = call(
        "GET",
        &format!("{base}/v1/allocations/{id}/logs?offset=7&limit=7"),
        None,
    );
    assert_eq!(l["nodes"]["sim-000"].as_str(), Some("line 2\n"), "{l}");
    let (_, l) = call("GET", &format!("{base}/v1/allocations/{id}/logs?stream=stderr"), None);
    assert_eq!(
        (l["stream"].as_str(), l["nodes"]["sim-000"].as_str()),
        (Some("stderr"), Some(expected_err.as_str())),
        "{l}"
    );
    let bad = call("GET", &format!("{base}/v1/allocations/{id}/logs?stream=both"), None);
    assert_eq!((bad.0, bad.1["field"].as_str()), (400, Some("stream")), "{}", bad.1);
    assert!(
        bucket
            .join(format!("physics/climate/{id}/logs/stderr/sim-000/metadata.json"))
            .exists()
    );
    let node_dir = bucket.join(format!("physics/climate/{id}/logs/stdout/sim-000"));
    let chunks = std::fs::read_dir(&node_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log.zst"))
        .count();
    assert!(chunks >= 2, "flushed periodically while it ran: {chunks} chunk(s)");
    let meta: Value = serde_json::from_slice(&std::fs::read(node_dir.join("metadata.json")).unwrap()).unwrap();
    assert_eq!(meta["chunks"].as_array().unwrap().len(), chunks, "{meta}");
    drop(agent);
    rt.block_on(running.shutdown());
}

/// Preemption and wipes through two real agents on loopback, with a preempting vCluster (a short
/// cycle). Two class-1 allocations fill both nodes: `ckpt` takes hints by signal and writes its
/// "checkpoint" (the completion file) when told; `plain` has no checkpoint. A class-9 allocation
/// needing both nodes preempts them: `ckpt`'s agent hints, waits for the checkpoint, then stops the
/// process (really gone: its pid no longer exists); `plain` is stopped at once. The victims show
/// `suspended` / `preempted` with the reason; after the class-9 run they run again — `ckpt` with
/// `LATTICE_RESTART_FROM` (the work its checkpoint kept), `plain` from the start. Then a sensitive
/// claim ends with each agent running the site's wipe command: the node is wiped, audited and back
/// in service; an agent without a wipe command fails its node's wipe and that node alone is quarantined.
#[test]
fn preemption_and_wipes_through_real_agents() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-preempt-{}", std::process::id()));
    let profile = std::env::temp_dir().join(format!("lattice-agent-preempt-{}.yaml", std::process::id()));
    std::fs::write(
        &profile,
        "batch:\n  priority: 0.5\n  wait_time: 0.5\n  fair_share: 0\n  topology: 0\n  data_readiness: 0\n  backlog: 0\n  \
         energy: 0\n  checkpoint: 0\n  conformance: 0\n  policy: backfill\n  cycle_interval: 200ms\n",
    )
    .unwrap();
    let (rt, running) = control_plane(&dir, 2, &format!("profile: {}\n", profile.display()));
    let base = format!("http://{}", running.rest_addr);
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let spawn = |n: &str, wipe: Option<&str>| {
        let mut c = agent_command(n, &base, &dir);
        c.args(["--grace", "300ms", "--shm-dir"]).arg(dir.join("shm"));
        if let Some(w) = wipe {
            c.args(["--wipe-command", w]);
        }
        c.spawn().expect("lattice-agent starts")
    };
    let wipe_cmd = format!("echo $LATTICE_ALLOC_ID >> {}/wiped-$LATTICE_NODE", work.display());
    let mut agents = Agents(vec![
        spawn("sim-000", Some(&wipe_cmd)),
        spawn("sim-001", Some(&wipe_cmd)),
    ]);
    let t0 = Instant::now();
    loop {
        let (_, v) = call("GET", &format!("{base}/v1/nodes"), None);
        let n = v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["fingerprint"].is_string())
            .count();
        if n == 2 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "agents did not register: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let submit = |body: Value| {
        let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let w = work.display();
    // The checkpointing task: records its pid and runs; on SIGUSR1 "writes its checkpoint" and says
    // so with the completion file; a restarted run reports where it resumes from and finishes.
    let ckpt = submit(json!({
        "tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1h"}, "preemption_class": 1,
        "checkpoint": {"strategy": "auto", "mechanism": "signal", "estimated_minutes": 1},
        "entrypoint": format!(
            "if [ -n \"$LATTICE_RESTART_FROM\" ]; then echo resumed $LATTICE_RESTART_FROM >> {w}/ckpt; exit 0; fi
             echo $$ > {w}/ckpt.pid; echo fresh >> {w}/ckpt
             trap 'echo checkpoint >> {w}/ckpt; touch \"$LATTICE_CHECKPOINT_DONE\"' USR1
             i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"),
    }));
    let plain = submit(json!({
        "tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1h"}, "preemption_class": 1,
        "entrypoint": format!(
            "echo run >> {w}/plain; if [ -f {w}/plain.once ]; then exit 0; fi; touch {w}/plain.once; echo $$ > {w}/plain.pid; sleep 60"),
    }));
    for id in [&ckpt, &plain] {
        wait_for(&base, id, |v| v["state"] == "running", Duration::from_secs(10));
    }
    let pid_of = |f: &str| {
        let t0 = Instant::now();
        loop {
            if let Some(p) = std::fs::read_to_string(work.join(f))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                return p;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{f} was not written");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (ckpt_pid, plain_pid) = (pid_of("ckpt.pid"), pid_of("plain.pid"));
    let high = submit(
        json!({"tenant": "climate", "resources": {"nodes": 2}, "lifecycle": {"walltime": "1m"},
                             "preemption_class": 9, "entrypoint": "sleep 1"}),
    );
    // The victims wait again, with the reason: `ckpt` resumes from its checkpoint, `plain` restarts.
    let v = wait_for(&base, &ckpt, |v| v["state"] == "suspended", Duration::from_secs(15));
    assert!(v["preemption"].as_str().is_some_and(|r| r.contains(&high)), "{v}");
    let v = wait_for(
        &base,
        &plain,
        |v| v["state"] == "preempted" || v["started_ms"].is_u64() && v["preempted"].as_u64() == Some(1),
        Duration::from_secs(15),
    );
    assert!(v["preemption"].as_str().is_some_and(|r| r.contains("priority")), "{v}");
    // Their processes are really gone (the checkpointing one only after its checkpoint).
    let alive = |pid: i32| unsafe { libc::kill(pid, 0) } == 0;
    let t0 = Instant::now();
    while alive(ckpt_pid) || alive(plain_pid) {
        assert!(t0.elapsed() < Duration::from_secs(5), "a victim's process still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = wait_for(&base, &high, |v| v["ended_ms"].is_u64(), Duration::from_secs(15));
    assert_eq!(v["end_reason"], "success", "{v}");
    for id in [&ckpt, &plain] {
        let v = wait_for(&base, id, |v| v["ended_ms"].is_u64(), Duration::from_secs(15));
        assert_eq!(v["end_reason"], "success", "{v}");
    }
    let trace = std::fs::read_to_string(work.join("ckpt")).unwrap();
    let lines: Vec<&str> = trace.lines().collect();
    assert_eq!(lines[..2], ["fresh", "checkpoint"], "{trace}");
    let resumed: f64 = lines[2]
        .strip_prefix("resumed ")
        .expect("a resumed run")
        .parse()
        .unwrap();
    assert!(resumed > 0.0, "{trace}");
    assert_eq!(std::fs::read_to_string(work.join("plain")).unwrap(), "run\nrun\n");

    // A sensitive claim: released, each node wiped by the site's command, audited, back in service.
    let claim = submit(
        json!({"tenant": "bio", "resources": {"nodes": 2}, "lifecycle": {"walltime": "1m"},
                              "sensitive": true, "entrypoint": "true"}),
    );
    wait_for(&base, &claim, |v| v["ended_ms"].is_u64(), Duration::from_secs(10));
    let audit = |id: &str, n: usize| {
        let t0 = Instant::now();
        loop {
            let (_, v) = call("GET", &format!("{base}/v1/audit/logs?allocation={id}"), None);
            let actions: Vec<String> = v["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["action"].as_str().unwrap().to_string())
                .filter(|a| a != "api_call")
                .collect();
            if actions.len() >= n {
                return actions;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // One wipe entry per node: each agent reports its own node's outcome.
    assert_eq!(audit(&claim, 5), ["claim", "start", "release", "wipe", "wipe"]);
    for n in ["sim-000", "sim-001"] {
        assert_eq!(
            std::fs::read_to_string(work.join(format!("wiped-{n}"))).unwrap(),
            format!("{claim}\n")
        );
        let (_, v) = call("GET", &format!("{base}/v1/nodes/{n}"), None);
        assert_eq!(v["state"], "ready", "{v}");
    }
    // Each node's own outcome: sim-001's agent has no wipe command, so its wipe fails and that node
    // is quarantined (never reused unwiped); sim-000 is wiped and back in service.
    agents.0[1].kill().unwrap();
    agents.0[1].wait().unwrap();
    agents.0[1] = spawn("sim-001", None);
    wait_ready(&base, &["sim-000", "sim-001"], Duration::from_secs(10));
    let claim = submit(
        json!({"tenant": "bio", "resources": {"nodes": 2}, "lifecycle": {"walltime": "1m"},
                              "sensitive": true, "entrypoint": "true"}),
    );
    wait_for(&base, &claim, |v| v["ended_ms"].is_u64(), Duration::from_secs(10));
    let mut actions = audit(&claim, 5);
    actions[3..].sort();
    assert_eq!(actions, ["claim", "start", "release", "quarantine", "wipe"]);
    let (_, v) = call("GET", &format!("{base}/v1/audit/logs?allocation={claim}"), None);
    let by_action: std::collections::BTreeMap<String, String> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap().to_string(), e["detail"].to_string()))
        .collect();
    assert!(
        by_action["wipe"].contains("sim-000") && !by_action["wipe"].contains("sim-001"),
        "{v}"
    );
    assert!(
        by_action["quarantine"].contains("sim-001") && !by_action["quarantine"].contains("sim-000"),
        "{v}"
    );
    for (n, state) in [("sim-000", "ready"), ("sim-001", "down")] {
        let (_, v) = call("GET", &format!("{base}/v1/nodes/{n}"), None);
        assert_eq!(v["state"], state, "{v}");
    }
    drop(agents);
    rt.block_on(running.shutdown());
    let _ = std::fs::remove_file(profile);
}

/// A reactive allocation scales on what its tasks report: it starts on one node; its task writes
/// `queue_depth 50` (target 10) to `LATTICE_METRICS_FILE`, the agents send it with their polls, and
/// after the scale-up window the allocation holds both nodes — its task runs on the second one too.
/// When the queue drains (`queue_depth 0`), it shrinks back to one node and the task on the node it
/// gave back is stopped.
#[test]
fn a_reactive_allocation_scales_on_the_metric_its_tasks_report() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-reactive-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 2, "");
    let base = format!("http://{}", running.rest_addr);
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let _agents = Agents(
        ["sim-000", "sim-001"]
            .iter()
            .map(|n| {
                agent_command(n, &base, &dir)
                    .args(["--telemetry-mode", "debug", "--grace", "300ms", "--shm-dir"])
                    .arg(dir.join("shm"))
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let w = work.display();
    std::fs::write(work.join("load"), "queue_depth 50\n").unwrap();
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(json!({
            "tenant": "physics", "resources": {"nodes": 1},
            "lifecycle": {"type": "reactive", "metric": "queue_depth", "target": 10,
                          "scale_policy": {"min": 1, "max": 2, "evaluation_interval": "200ms",
                                           "scale_up_window": "1s", "scale_down_window": "1s", "cooldown": "1s"}},
            "entrypoint": format!(
                "touch {w}/on-$LATTICE_TASK_INDEX-$(hostname)-$$; while true; do cp {w}/load \"$LATTICE_METRICS_FILE\"; sleep 0.1; done"),
        })),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let v = wait_for(&base, &id, |v| v["state"] == "running", Duration::from_secs(10));
    assert_eq!(v["nodes"].as_array().unwrap().len(), 1, "starts at its minimum: {v}");
    let v = wait_for(
        &base,
        &id,
        |v| v["nodes"].as_array().is_some_and(|n| n.len() == 2),
        Duration::from_secs(20),
    );
    // The task runs on both nodes (each agent started it: two marker files, task indexes 0 and 1).
    let markers = || -> Vec<String> {
        let mut m: Vec<String> = std::fs::read_dir(&work)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("on-"))
            .collect();
        m.sort();
        m
    };
    let t0 = Instant::now();
    while markers().len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?} {v}", markers());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        markers()[0].starts_with("on-0-") && markers()[1].starts_with("on-1-"),
        "{:?}",
        markers()
    );
    // The queue drains: back to one node; the task on the node given back is stopped.
    std::fs::write(work.join("load"), "queue_depth 0\n").unwrap();
    let v = wait_for(
        &base,
        &id,
        |v| v["nodes"].as_array().is_some_and(|n| n.len() == 1),
        Duration::from_secs(20),
    );
    let kept = v["nodes"][0].as_str().unwrap().to_string();
    let gone = if kept == "sim-000" { "sim-001" } else { "sim-000" };
    let t0 = Instant::now();
    while !dir.join(format!("logs-{gone}/{id}.log")).exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the task on {gone} still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(v["state"], "running", "{v}");
    let (status, _) = call("DELETE", &format!("{base}/v1/allocations/{id}"), None);
    assert_eq!(status, 200);
    rt.block_on(running.shutdown());
}

/// Fencing: an agent cut off from the control plane past its lease (the heartbeat timeout plus the
/// node's grace, told with every accepted heartbeat) stops its work itself, before the control plane
/// declares the node Down and requeues the allocation elsewhere — an allocation never runs twice at
/// once. Once the link heals the agent reports the run as fenced, and the run elsewhere goes on.
#[test]
fn an_agent_cut_off_past_its_lease_stops_its_work_before_it_is_requeued_elsewhere() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-fence-{}", std::process::id()));
    // Lease: 1 s + 3 s. The agent fences ~1.4 s (its 1 s stop grace and two beats) before that.
    let (rt, running) = control_plane(&dir, 2, "agents:\n  heartbeat_timeout: 1s\n  grace: 3s\n");
    let base = format!("http://{}", running.rest_addr);
    let registered = |node: &str| {
        let t0 = Instant::now();
        loop {
            let (_, n) = call("GET", &format!("{base}/v1/nodes/{node}"), None);
            if n["fingerprint"].is_string() {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{node} did not register: {n}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let relay = Relay::start(running.rest_addr);
    let mut agents = Agents(vec![
        agent_command("sim-000", &format!("http://{}", relay.addr), &dir)
            .args(["--grace", "1s"])
            .spawn()
            .unwrap(),
    ]);
    registered("sim-000");
    // Each run appends its shell's pid (then becomes `sleep`): the first runs on sim-000, the only
    // node with an agent.
    let runs = dir.join("runs");
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "entrypoint": format!("echo $$ >> {}; exec sleep 60", runs.display()),
                    "resources": {"nodes": 1}, "lifecycle": {"walltime": "5m"}}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let pids = || -> Vec<i32> {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let t0 = Instant::now();
    while pids().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the first run did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = pids()[0];
    agents.0.push(
        agent_command("sim-001", &base, &dir)
            .args(["--grace", "1s"])
            .spawn()
            .unwrap(),
    );
    registered("sim-001");
    relay.set_cut(true);
    // The requeued run starts on sim-001 once sim-000 is Down; by then the first one is gone.
    let t0 = Instant::now();
    while pids().len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(20), "not requeued: {:?}", pids());
        std::thread::sleep(Duration::from_millis(20));
    }
    let alive = unsafe { libc::kill(first, 0) } == 0;
    assert!(
        !alive,
        "the cut-off run (pid {first}) still ran when the requeued one started"
    );
    relay.set_cut(false);
    // The fenced run's report reaches the control plane without ending the run elsewhere.
    std::thread::sleep(Duration::from_secs(2));
    let v = wait_for(&base, &id, |v| v["state"] == "running", Duration::from_secs(5));
    assert_eq!(v["nodes"], json!(["sim-001"]), "{v}");
    assert_eq!(pids().len(), 2, "run exactly twice in all: {:?}", pids());
    drop(agents);
    rt.block_on(running.shutdown());
}

/// Mount namespaces and loop mounts need root; images are built with squashfs-tools (CI installs
/// it, and runs as root: there a missing part fails the test instead of skipping it).
fn can_mount_uenvs() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    let tools = Command::new("mksquashfs").arg("-version").output().is_ok();
    if !(root && tools) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this as root with squashfs-tools installed (root: {root}, mksquashfs: {tools})"
        );
        eprintln!("skipped: needs root and mksquashfs");
    }
    root && tools
}

/// `mksquashfs SRC IMAGE` into the registry layout (`REG/NAME/VERSION/TAG.squashfs` and its SHA-256).
fn publish_uenv(src: &std::path::Path, registry: &std::path::Path, rel: &str, digest_of: Option<&[u8]>) {
    use sha2::Digest;
    let image = registry.join(format!("{rel}.squashfs"));
    std::fs::create_dir_all(image.parent().unwrap()).unwrap();
    let ok = Command::new("mksquashfs")
        .arg(src)
        .arg(&image)
        .args(["-noappend", "-quiet", "-all-root"])
        .status()
        .expect("mksquashfs runs");
    assert!(ok.success());
    let bytes = std::fs::read(&image).unwrap();
    let digest: String = sha2::Sha256::digest(digest_of.unwrap_or(&bytes))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(registry.join(format!("{rel}.squashfs.sha256")), format!("{digest}\n")).unwrap();
}

/// The seed's uenv submission (`environment: {uenv: "prgenv-gnu/24.11:v1", view: "default"}`) through
/// a real agent: the image is pulled from the registry into the node-local cache, verified, and mounted
/// for the job's processes alone — the job reads its files at the mount point and runs its view's
/// programs with the view's variables, while the host (and the next job, without a uenv) sees an
/// empty mount point. An image whose bytes do not match the registry's digest is a prologue failure,
/// retried and then failed with the seed's message; nothing of it enters the cache.
#[test]
fn a_uenv_job_sees_its_image_and_no_other_process_does() {
    if !can_mount_uenvs() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("lattice-agent-uenv-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let (registry, cache, mnt) = (dir.join("registry"), dir.join("cache"), dir.join("mnt"));
    // The image: a file, a program in its view's bin, and the view in meta/env.json.
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("bin")).unwrap();
    std::fs::create_dir_all(src.join("meta")).unwrap();
    std::fs::write(src.join("hello"), "hello from prgenv-gnu\n").unwrap();
    std::fs::write(src.join("bin/greet"), "#!/bin/sh\necho greet from the view\n").unwrap();
    std::fs::set_permissions(
        src.join("bin/greet"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let env_json = json!({"views": {"default": {"env": {"values": {
        "list": {"PATH": [{"op": "prepend", "value": [format!("{}/bin", mnt.display())]}]},
        "scalar": {"PRGENV": "gnu-24.11"}
    }}}}});
    std::fs::write(src.join("meta/env.json"), env_json.to_string()).unwrap();
    publish_uenv(&src, &registry, "prgenv-gnu/24.11/v1", None);
    // A broken image: its bytes are not the ones the registry's digest names.
    publish_uenv(&src, &registry, "broken/1.0/v1", Some(b"other bytes"));
    // A second good image, and a cache that holds one and a half images: pulling it evicts the first.
    publish_uenv(&src, &registry, "other/1.0/v1", None);
    let image_size = std::fs::metadata(registry.join("prgenv-gnu/24.11/v1.squashfs"))
        .unwrap()
        .len();
    let mut agent = agent_command("sim-000", &base, &dir);
    agent
        .args(["--uenv-registry", &format!("file://{}", registry.display())])
        .arg("--image-cache")
        .arg(&cache)
        .arg("--uenv-mount")
        .arg(&mnt)
        .args(["--image-cache-size", &(image_size * 3 / 2).to_string()]);
    let _agents = Agents(vec![agent.spawn().unwrap()]);
    let submit = |body: Value| -> String {
        let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let ended = |v: &Value| v["ended_ms"].is_u64();
    let log_of = |id: &str| std::fs::read_to_string(dir.join(format!("logs-sim-000/{id}.log"))).unwrap_or_default();

    let a = submit(
        json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
        "environment": {"uenv": "prgenv-gnu/24.11:v1", "view": "default"},
        "entrypoint": "cat \"$UENV_MOUNT_POINT/hello\"; greet; echo \"prgenv=$PRGENV uenv=$LATTICE_UENV\"; sleep 2"}),
    );
    // While it runs, the host's mount point stays empty: the mount is the job's alone.
    let t0 = Instant::now();
    while !log_of(&a).contains("prgenv=") {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the uenv job never ran: {}",
            log_of(&a)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_dir(&mnt).unwrap().count(),
        0,
        "the host sees the job's uenv"
    );
    let v = wait_for(&base, &a, ended, Duration::from_secs(15));
    assert_eq!(v["end_reason"], "success", "{v} {}", log_of(&a));
    assert_eq!(v["environment"]["uenv"], "prgenv-gnu/24.11:v1", "{v}");
    let log = log_of(&a);
    assert!(log.contains("hello from prgenv-gnu"), "{log}");
    assert!(log.contains("greet from the view"), "{log}");
    assert!(log.contains("prgenv=gnu-24.11 uenv=prgenv-gnu/24.11:v1"), "{log}");
    assert!(cache.join("uenv/prgenv-gnu_24.11_v1.squashfs").is_file());

    // Another uenv: the cache is over its high watermark with both, so the least recently used image —
    // no longer mounted by anything — is evicted (the index says so too).
    let d = submit(
        json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
        "environment": {"uenv": "other/1.0:v1"}, "entrypoint": "cat \"$UENV_MOUNT_POINT/hello\""}),
    );
    let v = wait_for(&base, &d, ended, Duration::from_secs(15));
    assert_eq!(v["end_reason"], "success", "{v} {}", log_of(&d));
    assert!(cache.join("uenv/other_1.0_v1.squashfs").is_file());
    assert!(!cache.join("uenv/prgenv-gnu_24.11_v1.squashfs").exists());
    let index = std::fs::read_to_string(cache.join("uenv/metadata.json")).unwrap();
    assert!(
        index.contains("other_1.0_v1.squashfs") && !index.contains("prgenv-gnu"),
        "{index}"
    );

    // The next job, without a uenv, on the same node: nothing at the mount point.
    let b = submit(
        json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
        "entrypoint": format!("echo entries=$(ls -A {} | wc -l)", mnt.display())}),
    );
    let v = wait_for(&base, &b, ended, Duration::from_secs(15));
    assert_eq!(v["end_reason"], "success", "{v}");
    assert!(log_of(&b).contains("entries=0"), "{}", log_of(&b));

    // A hash mismatch is a prologue failure: retried (here on the only node) until the engine's retries
    // are spent, then failed with the seed's message as its output; the cache keeps nothing of it.
    let c = submit(
        json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
        "environment": {"uenv": "broken/1.0:v1"}, "entrypoint": "echo should not run"}),
    );
    let v = wait_for(&base, &c, ended, Duration::from_secs(20));
    assert_eq!(
        (v["state"].as_str(), v["end_reason"].as_str()),
        (Some("failed"), Some("prologue_failure")),
        "{v}"
    );
    assert!(!log_of(&c).contains("should not run"));
    let (_, l) = call("GET", &format!("{base}/v1/allocations/{c}/logs?stream=stderr"), None);
    assert!(
        l["nodes"]["sim-000"]
            .as_str()
            .unwrap_or_default()
            .contains("uenv pull failed: hash mismatch"),
        "{l}"
    );
    assert!(!cache.join("uenv/broken_1.0_v1.squashfs").exists());
    assert!(!cache.join("uenv/broken_1.0_v1.squashfs.partial").exists());

    // `lattice cache warm|list|evict`: an operator's warm pulls the image (verified) and marks it
    // sticky; the node's cache as its agent reports it; a warm of a broken image fails with the reason
    // and caches nothing; evict removes it.
    let cache_of = |want: &dyn Fn(&Value) -> bool| {
        let t0 = Instant::now();
        loop {
            let (_, v) = call("GET", &format!("{base}/v1/cache?node=sim-000"), None);
            if want(&v["nodes"]["sim-000"]) {
                return v["nodes"]["sim-000"].clone();
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/cache/warm"),
        Some(json!({"image": "prgenv-gnu/24.11:v1", "nodes": ["sim-000"], "sticky": true})),
    );
    assert_eq!((status, v["nodes"].clone()), (202, json!(["sim-000"])), "{v}");
    let c = cache_of(&|c: &Value| {
        c["images"].as_array().is_some_and(|i| {
            i.iter()
                .any(|i| i["file"] == "prgenv-gnu_24.11_v1.squashfs" && i["sticky"] == true)
        })
    });
    assert_eq!(c["outcomes"].as_array().unwrap().last().unwrap()["ok"], true, "{c}");
    assert!(cache.join("uenv/prgenv-gnu_24.11_v1.squashfs").is_file());
    // The cache holds one and a half images: the sticky one is never evicted to make room.
    let last_for = |image: &'static str| {
        move |c: &Value| {
            c["outcomes"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o["image"] == image))
        }
    };
    let outcome_of = |c: &Value, image: &str| {
        c["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|o| o["image"] == image)
            .unwrap()
            .clone()
    };
    call(
        "POST",
        &format!("{base}/v1/cache/warm"),
        Some(json!({"image": "other/1.0:v1", "nodes": ["sim-000"]})),
    );
    let o = outcome_of(&cache_of(&last_for("other/1.0:v1")), "other/1.0:v1");
    assert_eq!(o["ok"], false, "{o}");
    assert!(o["detail"].as_str().unwrap().contains("image cache full"), "{o}");
    assert!(
        cache.join("uenv/prgenv-gnu_24.11_v1.squashfs").is_file(),
        "the sticky image stays"
    );
    // Refusals change nothing: an unknown node, a bad name.
    for (body, field) in [
        (json!({"image": "prgenv-gnu/24.11:v1", "nodes": ["sim-009"]}), "nodes"),
        (json!({"image": "../x"}), "image"),
    ] {
        let (status, v) = call("POST", &format!("{base}/v1/cache/evict"), Some(body));
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{v}");
    }
    assert!(cache.join("uenv/prgenv-gnu_24.11_v1.squashfs").is_file());
    // An operator's evict removes it (sticky only spares it from automatic eviction).
    call(
        "POST",
        &format!("{base}/v1/cache/evict"),
        Some(json!({"image": "prgenv-gnu/24.11:v1"})),
    );
    cache_of(&|c: &Value| {
        c["images"]
            .as_array()
            .is_some_and(|i| !i.iter().any(|i| i["file"] == "prgenv-gnu_24.11_v1.squashfs"))
    });
    assert!(!cache.join("uenv/prgenv-gnu_24.11_v1.squashfs").exists());
    // A warm of an image whose digest does not match fails with the reason and caches nothing.
    call(
        "POST",
        &format!("{base}/v1/cache/warm"),
        Some(json!({"image": "broken/1.0:v1", "nodes": ["sim-000"]})),
    );
    let o = outcome_of(&cache_of(&last_for("broken/1.0:v1")), "broken/1.0:v1");
    assert_eq!(o["ok"], false, "{o}");
    assert!(o["detail"].as_str().unwrap().contains("hash mismatch"), "{o}");
    assert!(!cache.join("uenv/broken_1.0_v1.squashfs").exists());
    rt.block_on(running.shutdown());
}

/// `environment.tools_uenv` (book: "Application Profiling Integration"): a second image, pulled and
/// verified like the application's, mounted at the tools mount point beside it for the job's
/// processes alone. The job runs a tool from it by path while its environment stays the
/// application uenv's (the tools' bin is not on its PATH); the host sees neither mount; both images
/// stay pinned in the cache while the job runs; a tools image that fails its digest is a prologue
/// failure naming it.
#[test]
fn a_tools_uenv_mounts_beside_the_application_uenv() {
    if !can_mount_uenvs() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("lattice-agent-tools-uenv-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let (registry, cache) = (dir.join("registry"), dir.join("cache"));
    let (mnt, tools_mnt) = (dir.join("mnt"), dir.join("tools"));
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("hello"), "hello from the application\n").unwrap();
    publish_uenv(&app, &registry, "prgenv-gnu/24.11/v1", None);
    let prof = dir.join("prof");
    std::fs::create_dir_all(prof.join("bin")).unwrap();
    std::fs::write(prof.join("bin/nsys"), "#!/bin/sh\necho \"nsys profiled: $*\"\n").unwrap();
    std::fs::set_permissions(
        prof.join("bin/nsys"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    publish_uenv(&prof, &registry, "profiling/2024.1/latest", None);
    publish_uenv(&prof, &registry, "profiling/broken/latest", Some(b"other bytes"));
    // The site's uenv signing key: the tools image gets a signature under another key, the
    // application image its own.
    let site = lattice_engine::audit::SigningKey::from_bytes(&[11; 32]);
    let other = lattice_engine::audit::SigningKey::from_bytes(&[12; 32]);
    let sign = |rel: &str, key: &lattice_engine::audit::SigningKey| {
        use sha2::Digest;
        let digest: [u8; 32] =
            sha2::Sha256::digest(std::fs::read(registry.join(format!("{rel}.squashfs"))).unwrap()).into();
        let sig = lattice_engine::audit::sign_digest(key, &digest).sig;
        std::fs::write(registry.join(format!("{rel}.squashfs.sig")), sig).unwrap();
    };
    sign("prgenv-gnu/24.11/v1", &site);
    sign("profiling/2024.1/latest", &other);
    let mut agent = agent_command("sim-000", &base, &dir);
    agent
        .args(["--uenv-registry", &format!("file://{}", registry.display())])
        .arg("--image-cache")
        .arg(&cache)
        .arg("--uenv-mount")
        .arg(&mnt)
        .arg("--tools-mount")
        .arg(&tools_mnt)
        .args(["--uenv-signing-key", &lattice_engine::audit::public_hex(&site)]);
    let _agents = Agents(vec![agent.spawn().unwrap()]);
    let submit = |env: Value, entrypoint: &str| -> String {
        let body = json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
                          "environment": env, "entrypoint": entrypoint});
        let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let log_of = |id: &str| std::fs::read_to_string(dir.join(format!("logs-sim-000/{id}.log"))).unwrap_or_default();
    let a = submit(
        json!({"uenv": "prgenv-gnu/24.11:v1", "tools_uenv": "profiling/2024.1"}),
        &format!(
            "cat \"$UENV_MOUNT_POINT/hello\"; {}/bin/nsys ./train; command -v nsys || echo nsys-not-on-path; echo tools=$LATTICE_TOOLS_UENV; sleep 2",
            tools_mnt.display()
        ),
    );
    let t0 = Instant::now();
    while !log_of(&a).contains("tools=") {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the job never ran: {}",
            log_of(&a)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // While it runs: the host sees neither image, and both are in the cache, pinned.
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&tools_mnt).unwrap().count(), 0);
    for f in ["prgenv-gnu_24.11_v1.squashfs", "profiling_2024.1_latest.squashfs"] {
        assert!(cache.join("uenv").join(f).is_file(), "{f}");
    }
    let state = std::fs::read_to_string(dir.join("state-sim-000.json")).unwrap_or_default();
    let v = wait_for(&base, &a, |v| v["ended_ms"].is_u64(), Duration::from_secs(15));
    assert_eq!(v["end_reason"], "success", "{v} {}", log_of(&a));
    assert_eq!(v["environment"]["tools_uenv"], "profiling/2024.1", "{v}");
    let log = log_of(&a);
    assert!(log.contains("hello from the application"), "{log}");
    assert!(log.contains("nsys profiled: ./train"), "{log}");
    assert!(
        log.contains("nsys-not-on-path"),
        "the tools stay off the job's PATH: {log}"
    );
    assert!(log.contains("tools=profiling/2024.1"), "{log}");
    let records: Value = serde_json::from_str(&state).unwrap_or_else(|e| panic!("{e}: {state}"));
    assert_eq!(
        (&records[0]["image"], &records[0]["tools_image"]),
        (
            &json!("prgenv-gnu_24.11_v1.squashfs"),
            &json!("profiling_2024.1_latest.squashfs")
        ),
        "the record pins both: {state}"
    );
    // A tools image that fails its digest: a prologue failure naming it; the job never runs.
    let b = submit(json!({"tools_uenv": "profiling/broken"}), "echo should not run");
    let v = wait_for(&base, &b, |v| v["ended_ms"].is_u64(), Duration::from_secs(20));
    assert_eq!(v["end_reason"], "prologue_failure", "{v}");
    assert!(!log_of(&b).contains("should not run"));
    let (_, l) = call("GET", &format!("{base}/v1/allocations/{b}/logs?stream=stderr"), None);
    let err = l["nodes"]["sim-000"].as_str().unwrap_or_default();
    assert!(err.contains("hash mismatch (profiling/broken"), "{l}");
    // Refused at submission, nothing queued: a bad name, and tools beside a container image.
    for env in [
        json!({"tools_uenv": "../x"}),
        json!({"image": "busybox:1", "tools_uenv": "profiling/2024.1"}),
    ] {
        let body = json!({"tenant": "physics", "resources": {"nodes": 1}, "environment": env, "entrypoint": "true"});
        let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
        assert_eq!(
            (status, v["field"].as_str()),
            (400, Some("environment.tools_uenv")),
            "{v}"
        );
    }
    let (_, all) = call("GET", &format!("{base}/v1/allocations"), None);
    assert_eq!(all["allocations"].as_array().map(Vec::len), Some(2), "{all}");

    // sign_required: the site-signed application image mounts; …
    let c = submit(
        json!({"uenv": "prgenv-gnu/24.11:v1", "sign_required": true}),
        "cat \"$UENV_MOUNT_POINT/hello\"",
    );
    let v = wait_for(&base, &c, |v| v["ended_ms"].is_u64(), Duration::from_secs(15));
    assert_eq!(v["end_reason"], "success", "{v} {}", log_of(&c));
    assert!(log_of(&c).contains("hello from the application"));
    wait_ready(&base, &["sim-000"], Duration::from_secs(10));
    // … a sensitive allocation whose tools image is signed by another key fails its prologue before
    // anything runs, and the audit log says why (last: the node is then quarantined, having no
    // wipe command).
    let body = json!({"tenant": "physics", "user": "dr-x", "sensitive": true, "resources": {"nodes": 1},
                      "lifecycle": {"walltime": "1m"}, "entrypoint": "echo should not run",
                      "environment": {"uenv": "prgenv-gnu/24.11:v1", "tools_uenv": "profiling/2024.1", "sign_required": true}});
    let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
    assert_eq!(status, 201, "{v}");
    let d = v["id"].as_str().unwrap().to_string();
    let v = wait_for(&base, &d, |v| v["ended_ms"].is_u64(), Duration::from_secs(20));
    assert_eq!(v["end_reason"], "prologue_failure", "{v}");
    assert!(!log_of(&d).contains("should not run"));
    let (_, audit) = call(
        "GET",
        &format!("{base}/v1/audit/logs?allocation={d}&event=prologue_failure"),
        None,
    );
    let entries = audit["entries"].as_array().unwrap();
    assert!(!entries.is_empty(), "{audit}");
    let detail = entries[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("sim-000 reason=uenv signature: profiling/2024.1") && detail.contains("does not verify"),
        "{detail}"
    );
    assert_eq!(audit["chain_valid"], true);
    // Without a uenv, sign_required is refused at submission.
    let body = json!({"tenant": "physics", "resources": {"nodes": 1}, "environment": {"sign_required": true}, "entrypoint": "true"});
    let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(body));
    assert_eq!(
        (status, v["field"].as_str()),
        (400, Some("environment.sign_required")),
        "{v}"
    );
    rt.block_on(running.shutdown());
}

/// Each allocation gets a fresh scratch directory on its node (`LATTICE_SCRATCH`, also `TMPDIR`) that
/// is gone once it ends there, whatever it left in it.
#[test]
fn scratch_is_the_jobs_own_and_removed_when_it_ends() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-scratch-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let _agents = Agents(vec![agent_command("sim-000", &base, &dir).spawn().unwrap()]);
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
            "entrypoint": "mkdir -p \"$LATTICE_SCRATCH/out\" && echo kept > \"$TMPDIR/out/f\" && echo scratch=$LATTICE_SCRATCH && sleep 1"}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let scratch = dir.join("scratch-sim-000").join(&id);
    let t0 = Instant::now();
    while !scratch.join("out/f").is_file() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the job never wrote its scratch"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(10));
    assert_eq!(v["end_reason"], "success", "{v}");
    let log = std::fs::read_to_string(dir.join(format!("logs-sim-000/{id}.log"))).unwrap();
    assert!(log.contains(&format!("scratch={}", scratch.display())), "{log}");
    // Removed once the agent collected the exit (within a poll or two of the end).
    let t0 = Instant::now();
    while scratch.exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the scratch outlived its job");
        std::thread::sleep(Duration::from_millis(20));
    }
    rt.block_on(running.shutdown());
}

/// Audit mode (book: data access under a sensitive allocation's data paths, from the agent's eBPF
/// telemetry, batched): a sensitive claim's job reads its declared data mount and writes its output
/// directory; the quorum's audit log gets `data_access` entries naming each path with read or
/// write, from the real kernel's `openat` tracepoint — where the kernel allows eBPF (the agent says
/// so at start; elsewhere the test ends there).
#[test]
fn a_sensitive_jobs_data_access_is_audited_from_ebpf() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-data-audit-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    std::fs::create_dir_all(dir.join("s3/datasets/in")).unwrap();
    std::fs::write(dir.join("s3/datasets/in/subject-001.csv"), "id,value\n").unwrap();
    let log = dir.join("agent.log");
    let mut agent = agent_command("sim-000", &base, &dir);
    agent
        .arg("--data-root")
        .arg(format!("s3={}", dir.join("s3").display()))
        .args(["--wipe-command", "true"])
        .stderr(std::fs::File::create(&log).unwrap());
    let _agents = Agents(vec![agent.spawn().unwrap()]);
    wait_ready(&base, &["sim-000"], Duration::from_secs(20));
    let status = std::fs::read_to_string(&log).unwrap_or_default();
    if !status.contains("eBPF telemetry loaded") {
        eprintln!("eBPF unavailable here: {status}");
        rt.block_on(running.shutdown());
        return;
    }
    let target = dir.join("mnt/input");
    let (code, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(json!({"tenant": "physics", "project": "trial", "sensitive": true,
            "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
            "data": {"mounts": [{"source": "s3://datasets/in", "target": target, "access": "read-only"}]},
            "entrypoint": format!("cat {}/subject-001.csv > /dev/null; echo done > $LATTICE_OUTPUT_DIR/result.txt; sleep 1",
                target.display())})),
    );
    assert_eq!(code, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(20));
    assert_eq!(v["end_reason"], "success", "{v}");
    let read = format!("read {}/subject-001.csv ×1", target.display());
    let t0 = Instant::now();
    let details = loop {
        let (_, a) = call(
            "GET",
            &format!("{base}/v1/audit/logs?allocation={id}&event=data_access"),
            None,
        );
        let details: Vec<String> = a["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["detail"].as_str().unwrap().to_string())
            .collect();
        if details.iter().any(|d| d.contains(&read)) && details.iter().any(|d| d.contains("result.txt")) {
            break details;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{a}\nagent log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let all = details.join(" | ");
    assert!(all.starts_with("sim-000 "), "{all}");
    assert!(all.contains("write ") && all.contains("/result.txt ×1"), "{all}");
    assert!(!all.contains("/etc/"), "only paths under its data mounts: {all}");
    let (_, a) = call("GET", &format!("{base}/v1/audit/logs?allocation={id}"), None);
    assert_eq!(a["chain_valid"], true, "{a}");
    rt.block_on(running.shutdown());
}

/// Data mounts and the defaults: a declared read-only mount from the site's S3 root, the home
/// directory from its NFS root and the output and checkpoint directories — seen by the job alone (its
/// own mount namespace), the output kept after it ends; a source the node lacks is a prologue failure
/// with the reason on stderr.
#[test]
fn data_mounts_and_the_default_directories_are_the_jobs_own() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-data-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let user = format!("lattice-test-{}", std::process::id());
    std::fs::create_dir_all(dir.join("s3/datasets/in")).unwrap();
    std::fs::write(dir.join("s3/datasets/in/hello.txt"), "hello data\n").unwrap();
    std::fs::create_dir_all(dir.join(format!("vast/home/{user}"))).unwrap();
    std::fs::write(dir.join(format!("vast/home/{user}/note")), "home file\n").unwrap();
    let mut agent = agent_command("sim-000", &base, &dir);
    agent
        .arg("--data-root")
        .arg(format!("nfs={}", dir.join("vast").display()))
        .arg("--data-root")
        .arg(format!("s3={}", dir.join("s3").display()));
    let _agents = Agents(vec![agent.spawn().unwrap()]);
    let target = dir.join("mnt/input");
    let home_existed = std::path::Path::new("/home").join(&user).exists();
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(json!({"tenant": "physics", "project": "climate", "user": user,
            "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
            "checkpoint": {"strategy": "manual"},
            "data": {"mounts": [{"source": "s3://datasets/in", "target": target, "access": "read-only"}]},
            "entrypoint": format!("T={t}; cat $T/hello.txt; if touch $T/new 2>/dev/null; then echo writable; else echo read-only; fi; \
                cat /home/{user}/note; echo out=$LATTICE_OUTPUT_DIR; echo ck=$LATTICE_CHECKPOINT_DIR; \
                echo result > $LATTICE_OUTPUT_DIR/r.txt; sleep 2", t = target.display())})),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let log = dir.join(format!("logs-sim-000/{id}.log"));
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("ck=") {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?}",
            std::fs::read_to_string(&log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // While it runs the host sees nothing at the target: the mount is the job's alone.
    assert!(!target.join("hello.txt").exists(), "the mount leaked to the host");
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(10));
    assert_eq!(v["end_reason"], "success", "{v}");
    let text = std::fs::read_to_string(&log).unwrap();
    let out = dir.join(format!("s3/physics/climate/{id}"));
    assert!(text.contains("hello data\nread-only\nhome file\n"), "{text}");
    assert!(text.contains(&format!("out={}\n", out.display())), "{text}");
    assert!(
        text.contains(&format!("ck={}\n", out.join("checkpoints").display())),
        "{text}"
    );
    assert!(
        !dir.join("s3/datasets/in/new").exists(),
        "written through a read-only mount"
    );
    // The output directory is the user's: it outlives the allocation.
    assert_eq!(std::fs::read_to_string(out.join("r.txt")).unwrap(), "result\n");
    assert!(out.join("checkpoints").is_dir());

    // A source this node does not have: a prologue failure, the reason on the job's stderr.
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
            "data": {"mounts": [{"source": "nfs://projects/gone", "target": target}]},
            "entrypoint": "echo should not run"}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let b = v["id"].as_str().unwrap().to_string();
    let v = wait_for(&base, &b, |v| v["ended_ms"].is_u64(), Duration::from_secs(20));
    assert_eq!(v["end_reason"], "prologue_failure", "{v}");
    let (_, l) = call("GET", &format!("{base}/v1/allocations/{b}/logs?stream=stderr"), None);
    assert!(
        l["nodes"]["sim-000"]
            .as_str()
            .unwrap_or_default()
            .contains("data mount failed: nfs://projects/gone: "),
        "{l}"
    );
    if !home_existed {
        let _ = std::fs::remove_dir(std::path::Path::new("/home").join(&user));
    }
    rt.block_on(running.shutdown());
}

/// The launch `id` of allocation `alloc`, once it ended.
fn launch_ended(base: &str, alloc: &str, id: &str, within: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let (status, v) = call("GET", &format!("{base}/v1/allocations/{alloc}/tasks/{id}"), None);
        assert_eq!(status, 200, "{v}");
        if matches!(v["state"].as_str(), Some("completed" | "failed")) {
            return v;
        }
        assert!(t0.elapsed() < within, "launch {id} did not end: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_mpi_program_runs_over_two_agents_through_lattices_pmi() {
    // A real MPI: Debian's MPICH (its client speaks PMI-1's wire protocol; CI installs it).
    let dir = std::env::temp_dir().join(format!("lattice-agent-mpi-{}", std::process::id()));
    let bin = std::env::temp_dir().join(format!("lattice-agent-mpi-bin-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    let prog = bin.join("allreduce");
    let built = Command::new("mpicc")
        .arg("-o")
        .arg(&prog)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/allreduce.c"))
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        assert!(std::env::var_os("CI").is_none(), "CI must install mpich (mpicc)");
        eprintln!("skipped: needs mpicc (Debian's mpich)");
        return;
    }
    // `lattice` (the client a batch script calls) is built beside the agent by `cargo test --workspace`.
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_lattice-agent"))
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(
        bin_dir.join("lattice").is_file(),
        "the lattice client is built beside lattice-agent (cargo test --workspace)"
    );
    let (rt, running) = control_plane(&dir, 2, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let _agents = Agents(
        ["sim-000", "sim-001"]
            .iter()
            .map(|n| {
                agent_command(n, &base, &dir)
                    .arg("--slurm-env")
                    .env("PATH", &path)
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let submit = |entrypoint: String| {
        let (status, v) = call(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "physics", "resources": {"nodes": 2}, "lifecycle": {"walltime": "5m"},
                "entrypoint": entrypoint}),
            ),
        );
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    // 1. A batch script: `lattice launch` starts 4 ranks, 2 per node, then `srun -n 4` again. No SSH,
    // no mpiexec: the ranks find each other through the agents' PMI and its fence across the agents.
    let p = prog.display();
    let id = submit(format!(
        "lattice launch -n 4 --tasks-per-node 2 --label -- {p} && srun -n 4 {p}"
    ));
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(60));
    assert_eq!(v["end_reason"], "success", "{v}");
    let log = std::fs::read_to_string(dir.join(format!("logs-sim-000/{id}.log"))).unwrap();
    for r in 0..4 {
        assert!(
            log.contains(&format!("{r}: rank {r} of 4 sum 6\n")),
            "launch, rank {r}: {log}"
        );
        assert!(
            log.contains(&format!("\nrank {r} of 4 sum 6\n")) || log.starts_with(&format!("rank {r} of 4 sum 6\n")),
            "srun, rank {r}: {log}"
        );
    }
    // Both launches ran on both nodes, 2 ranks each, and every rank exited 0.
    let (_, ls) = call("GET", &format!("{base}/v1/allocations/{id}/tasks"), None);
    let ls = ls["launches"].as_array().unwrap().clone();
    assert_eq!(ls.len(), 2, "{ls:?}");
    for l in &ls {
        assert_eq!(l["state"], "completed", "{l}");
        assert_eq!(l["exit_codes"], json!([[0, 0], [1, 0], [2, 0], [3, 0]]));
        let nodes: Vec<(&str, u64)> = l["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["node"].as_str().unwrap(), n["num_ranks"].as_u64().unwrap()))
            .collect();
        assert_eq!(nodes, vec![("sim-000", 2), ("sim-001", 2)]);
    }
    // Per-rank stdout and stderr files on each node, stderr kept apart.
    let rank2 = std::fs::read_to_string(dir.join(format!("logs-sim-001/{id}.1.2.out"))).unwrap();
    assert_eq!(rank2, "rank 2 of 4 sum 6\n");

    // 1b. `mpirun` (MPICH's Hydra) inside an allocation: its proxies start on both nodes through the
    // agents (`lattice-mpi-launcher` instead of ssh), and its ranks find each other through Hydra.
    // Each rank says which node's agent started its proxy: with `-genvnone` it has the environment the
    // agent gave the proxy there, not the one mpiexec was started with.
    let id = submit(format!(
        "if [ \"$LATTICE_NODEID\" = 0 ]; then mpiexec -genvnone -n 4 -ppn 2 /bin/sh -c 'echo \"proxy on node $LATTICE_NODEID\"; exec {p}'; fi"
    ));
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(60));
    let log = std::fs::read_to_string(dir.join(format!("logs-sim-000/{id}.log"))).unwrap();
    assert_eq!(v["end_reason"], "success", "{v}\n{log}");
    for r in 0..4 {
        assert!(
            log.contains(&format!("rank {r} of 4 sum 6\n")),
            "mpirun, rank {r}: {log}"
        );
    }
    assert_eq!(log.matches("proxy on node 0\n").count(), 2, "{log}");
    assert_eq!(log.matches("proxy on node 1\n").count(), 2, "{log}");

    // 2. A rank that fails aborts the launch on every node, and says which.
    let hold = submit("sleep 120".into());
    wait_for(&base, &hold, |v| v["state"] == "running", Duration::from_secs(20));
    let t0 = Instant::now();
    let launch = |body: Value| {
        let (status, v) = call("POST", &format!("{base}/v1/allocations/{hold}/tasks"), Some(body));
        assert_eq!(status, 201, "{v}");
        v["launch_id"].as_str().unwrap().to_string()
    };
    let crash = launch(
        json!({"ntasks": 4, "entrypoint": format!("if [ $PMI_RANK = 2 ]; then echo crash-$PMI_RANK >&2; exit 5; fi; exec {p}")}),
    );
    let v = launch_ended(&base, &hold, &crash, Duration::from_secs(30));
    assert_eq!(v["state"], "failed");
    assert_eq!(v["reason"], "rank 2 exited with code 5", "{v}");
    // Its stderr, apart from its stdout: in the launch and through `lattice logs LAUNCH --stderr`.
    assert_eq!(
        (v["output"][2]["stderr"].as_str(), v["output"][2]["stdout"].as_str()),
        (Some("crash-2\n"), Some(""))
    );
    let out = Command::new(bin_dir.join("lattice"))
        .args(["logs", &crash, "--stderr", "--rank", "2", "--tail", "1"])
        .env("LATTICE_ENDPOINT", &base)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "crash-2\n", "{out:?}");
    // The others were stopped: they could never finish MPI_Init without rank 2.
    assert_eq!(v["exit_codes"].as_array().unwrap().len(), 4);
    assert!(v["exit_codes"].as_array().unwrap().iter().all(|c| c[1] != 0), "{v}");
    assert!(t0.elapsed() < Duration::from_secs(20));

    // 3. A fence that never completes: "PMI fence timeout", every rank stopped.
    let t0 = Instant::now();
    let stuck = launch(json!({"ntasks": 4, "fence_timeout": "1s",
        "entrypoint": format!("if [ $PMI_RANK = 3 ]; then exec sleep 60; fi; exec {p}")}));
    let v = launch_ended(&base, &hold, &stuck, Duration::from_secs(30));
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("failed"), Some("PMI fence timeout")),
        "{v}"
    );
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());

    // 4. Refusals change nothing: PMIx is not offered, a layout that does not fit, another's id.
    for (body, field) in [
        (json!({"entrypoint": "true", "pmi": "pmix"}), "pmi"),
        (
            json!({"entrypoint": "true", "ntasks": 9, "tasks_per_node": 4}),
            "ntasks",
        ),
        (json!({"entrypoint": ""}), "entrypoint"),
    ] {
        let (status, v) = call("POST", &format!("{base}/v1/allocations/{hold}/tasks"), Some(body));
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{v}");
    }
    let (_, ls) = call("GET", &format!("{base}/v1/allocations/{hold}/tasks"), None);
    assert_eq!(
        ls["launches"].as_array().unwrap().len(),
        2,
        "no launch was recorded by a refusal"
    );
    // An allocation that ended takes no launch.
    let (status, _) = call(
        "POST",
        &format!("{base}/v1/allocations/{id}/tasks"),
        Some(json!({"entrypoint": "true"})),
    );
    assert_eq!(status, 400);
    call("DELETE", &format!("{base}/v1/allocations/{hold}"), None);
    rt.block_on(running.shutdown());
}

/// What tmux shows of pane `t` on server `sock`.
fn screen(sock: &str) -> String {
    let out = Command::new("tmux")
        .args(["-L", sock, "capture-pane", "-p", "-t", "t"])
        .output()
        .expect("tmux capture-pane");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn keys(sock: &str, keys: &[&str]) {
    let ok = Command::new("tmux")
        .args(["-L", sock, "send-keys", "-t", "t"])
        .args(keys)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "tmux send-keys {keys:?}");
}

fn shows(sock: &str, want: &str, within: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let s = screen(sock);
        if s.contains(want) {
            return s;
        }
        assert!(t0.elapsed() < within, "{want:?} never showed:\n{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A tmux server `sock` with one 100×30 pane `t` running `cmd`.
fn tmux_start(sock: &str, cmd: &str) {
    let started = Command::new("tmux")
        .args(["-L", sock, "new-session", "-d", "-s", "t", "-x", "100", "-y", "30", cmd])
        .status()
        .unwrap();
    assert!(started.success(), "tmux new-session");
}

struct Tmux(String);

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.0, "kill-server"]).status();
    }
}

#[test]
fn attach_opens_a_terminal_in_the_allocation_in_a_real_terminal() {
    // A real terminal: tmux runs `lattice attach`, sends keys and reads the screen (CI installs tmux).
    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "CI must install tmux");
        eprintln!("skipped: needs tmux");
        return;
    }
    let lattice = std::path::Path::new(env!("CARGO_BIN_EXE_lattice-agent")).with_file_name("lattice");
    assert!(
        lattice.is_file(),
        "the lattice client is built beside lattice-agent (cargo test --workspace)"
    );
    let dir = std::env::temp_dir().join(format!("lattice-agent-attach-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 2, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let _agents = Agents(
        ["sim-000", "sim-001"]
            .iter()
            .map(|n| agent_command(n, &base, &dir).spawn().unwrap())
            .collect(),
    );
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "resources": {"nodes": 2}, "lifecycle": {"walltime": "5m"},
            "entrypoint": "sleep 300"}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    wait_for(&base, &id, |v| v["state"] == "running", Duration::from_secs(20));
    let sock = format!("lattice-attach-{}", std::process::id());
    let _tmux = Tmux(sock.clone());
    let cmd = format!(
        "LATTICE_ENDPOINT={base} {} attach {id} --node sim-001; echo \"status=$?\"; sleep 60",
        lattice.display()
    );
    tmux_start(&sock, &cmd);
    // The shell runs on sim-001, in the allocation's environment, at the terminal's size.
    keys(
        &sock,
        &[
            "echo \"in $LATTICE_ALLOC_ID node $LATTICE_NODEID:\" $(stty size)",
            "Enter",
        ],
    );
    shows(&sock, &format!("in {id} node 1: 30 100"), Duration::from_secs(20));
    // A resized terminal is resized there too.
    let resized = Command::new("tmux")
        .args(["-L", &sock, "resize-window", "-t", "t", "-x", "120", "-y", "40"])
        .status()
        .unwrap();
    assert!(resized.success());
    // (The resize travels on its own: ask again until it has arrived.)
    let t0 = Instant::now();
    loop {
        keys(&sock, &["echo \"size:\" $(stty size)", "Enter"]);
        std::thread::sleep(Duration::from_millis(300));
        if screen(&sock).contains("size: 40 120") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", screen(&sock));
    }
    // Ctrl-C interrupts what runs there, and the shell goes on.
    keys(&sock, &["echo go$((1+1)); sleep 100; echo slept", "Enter"]);
    shows(&sock, "\ngo2", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(200));
    keys(&sock, &["C-c"]);
    std::thread::sleep(Duration::from_millis(300));
    keys(&sock, &["echo after-$((6*7))", "Enter"]);
    let s = shows(&sock, "after-42", Duration::from_secs(10));
    assert!(!s.contains("\nslept"), "{s}");
    // Its exit status is `lattice attach`'s.
    keys(&sock, &["exit 3", "Enter"]);
    shows(&sock, "status=3", Duration::from_secs(10));
    // A command instead of a shell; and a node outside the allocation is refused (nothing opened).
    let out = Command::new(&lattice)
        .args(["attach", &id, "--command", "echo hi-$LATTICE_NODEID; exit 4"])
        .env("LATTICE_ENDPOINT", &base)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("hi-0"), "{out:?}");
    let out = Command::new(&lattice)
        .args(["attach", &id, "--node", "sim-009"])
        .env("LATTICE_ENDPOINT", &base)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("field `node`"), "{out:?}");
    // An allocation that is not running takes no terminal.
    call("DELETE", &format!("{base}/v1/allocations/{id}"), None);
    wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(20));
    let out = Command::new(&lattice)
        .args(["attach", &id])
        .env("LATTICE_ENDPOINT", &base)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"), "{out:?}");
    // `lattice session`: an allocation that starts with a terminal on its first node and ends with it.
    let sock = format!("lattice-session-{}", std::process::id());
    let _tmux2 = Tmux(sock.clone());
    let cmd = format!(
        "LATTICE_ENDPOINT={base} LATTICE_TENANT=physics {} session --nodes 2 --walltime 5m; echo \"session=$?\"; sleep 60",
        lattice.display()
    );
    tmux_start(&sock, &cmd);
    keys(
        &sock,
        &["echo \"session $LATTICE_ALLOC_ID on node $LATTICE_NODEID\"", "Enter"],
    );
    let s = shows(&sock, " on node 0", Duration::from_secs(30));
    let session = s
        .lines()
        .find_map(|l| l.strip_prefix("session ").and_then(|r| r.strip_suffix(" on node 0")))
        .expect("the session's id")
        .to_string();
    assert_eq!(
        call("GET", &format!("{base}/v1/allocations/{session}"), None).1["state"],
        "running"
    );
    keys(&sock, &["exit", "Enter"]);
    shows(&sock, "session=0", Duration::from_secs(10));
    let v = wait_for(&base, &session, |v| v["ended_ms"].is_u64(), Duration::from_secs(20));
    assert_eq!(v["state"], "cancelled", "leaving the terminal ends the session: {v}");
    rt.block_on(running.shutdown());
}

/// An OCI image layout `store/NAME` with tag `latest`: busybox (static), a marker file and an
/// environment variable in its configuration.
fn oci_image(store: &std::path::Path, name: &str) {
    let layout = store.join(name);
    let image = format!("{}:latest", layout.display());
    let run = |args: &[&str]| {
        let out = Command::new("umoci").args(args).output().expect("umoci runs");
        assert!(
            out.status.success(),
            "umoci {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["init", "--layout", layout.to_str().unwrap()]);
    run(&["new", "--image", &image]);
    let bundle = store.join(format!("{name}-build"));
    run(&["unpack", "--image", &image, bundle.to_str().unwrap()]);
    let root = bundle.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for app in ["sh", "echo", "cat", "test", "ls", "sleep"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(app)).unwrap();
    }
    std::fs::write(root.join("etc/lattice-image"), "busybox image built by the test\n").unwrap();
    run(&["repack", "--image", &image, bundle.to_str().unwrap()]);
    run(&["config", "--image", &image, "--config.env", "FROM_IMAGE=yes"]);
    std::fs::remove_dir_all(&bundle).unwrap();
}

#[test]
fn an_oci_job_runs_in_its_image_through_a_real_oci_runtime() {
    // Containers need root; the image is built with umoci from busybox-static and run by runc (CI
    // installs them).
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["umoci", "runc"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) && std::path::Path::new("/bin/busybox").is_file();
    if !(root && tools) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this as root with umoci, runc and busybox-static (root: {root}, tools: {tools})"
        );
        eprintln!("skipped: needs root, umoci, runc and busybox-static");
        return;
    }
    let dir = std::env::temp_dir().join(format!("lattice-agent-oci-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let store = dir.join("oci-images");
    oci_image(&store, "busybox");
    let cache = dir.join("cache");
    let _agents = Agents(vec![
        agent_command("sim-000", &base, &dir)
            .arg("--oci-images")
            .arg(&store)
            .arg("--image-cache")
            .arg(&cache)
            .spawn()
            .unwrap(),
    ]);
    let submit = |image: &str, entrypoint: &str| {
        let (status, v) = call(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
                "environment": {"image": image}, "entrypoint": entrypoint}),
            ),
        );
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let id = submit(
        "busybox",
        "cat /etc/lattice-image; echo \"image=$FROM_IMAGE alloc=$LATTICE_ALLOC_ID\"; \
         if test -e /usr; then echo host-visible; else echo host-hidden; fi; \
         echo kept > \"$LATTICE_SCRATCH/f\" && echo scratch-ok",
    );
    let v = wait_for(&base, &id, |v| v["ended_ms"].is_u64(), Duration::from_secs(60));
    let log = std::fs::read_to_string(dir.join(format!("logs-sim-000/{id}.log"))).unwrap_or_default();
    assert_eq!(v["end_reason"], "success", "{v}\n{log}");
    assert!(log.contains("busybox image built by the test"), "{log}");
    assert!(log.contains(&format!("image=yes alloc={id}")), "{log}");
    assert!(log.contains("host-hidden") && !log.contains("host-visible"), "{log}");
    assert!(log.contains("scratch-ok"), "{log}");
    // The container and its bundle are gone once the agent collected the end.
    let bundle = cache.join("oci").join(format!("lattice-{id}"));
    let t0 = Instant::now();
    while bundle.exists() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the bundle outlived its job");
        std::thread::sleep(Duration::from_millis(20));
    }
    let listed = Command::new("runc").arg("list").output().unwrap();
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&format!("lattice-{id}")));
    // An image the node does not have is a prologue failure with the reason, retried elsewhere.
    let missing = submit("pytorch:24.1", "true");
    let v = wait_for(&base, &missing, |v| v["ended_ms"].is_u64(), Duration::from_secs(60));
    assert_eq!(v["end_reason"], "prologue_failure", "{v}");
    rt.block_on(running.shutdown());
}

/// The body of `GET url` as text.
fn text_of(url: &str) -> String {
    ureq::get(url).call().unwrap().body_mut().read_to_string().unwrap()
}

/// `prometheus` on PATH; `None` (the test skips, saying so) where it is missing outside CI.
fn prometheus_binary() -> Option<std::path::PathBuf> {
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join("prometheus"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install `prometheus` (Debian package)"
        );
        eprintln!("skipped: `prometheus` is not installed (Debian package `prometheus`)");
    }
    found
}

/// The Server-Sent Events of `url` until an `end` event: (event, data) pairs.
fn sse_events(url: &str) -> Vec<(String, Value)> {
    use std::io::BufRead;
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let resp = agent.get(url).call().expect("the control plane answers");
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"),
        "{:?}",
        resp.headers()
    );
    let reader = std::io::BufReader::new(resp.into_body().into_reader());
    let mut out = Vec::new();
    let mut event = String::new();
    for line in reader.lines() {
        let line = line.unwrap();
        if let Some(e) = line.strip_prefix("event: ") {
            event = e.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            out.push((event.clone(), serde_json::from_str(d).unwrap()));
            if event == "end" {
                break;
            }
        }
    }
    out
}

#[test]
fn telemetry_goes_through_a_real_prometheus_and_comes_back_as_metrics_comparisons_and_diagnostics() {
    let Some(prometheus) = prometheus_binary() else { return };
    let dir = std::env::temp_dir().join(format!("lattice-agent-tsdb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Prometheus as the TSDB: the agents push to its remote-write receiver.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(dir.join("prometheus.yml"), "scrape_configs: []\n").unwrap();
    let tsdb = format!("http://127.0.0.1:{port}");
    let mut prom = Agents(vec![
        Command::new(&prometheus)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-remote-write-receiver")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    ]);
    let t0 = Instant::now();
    let ready = || ureq::get(&format!("{tsdb}/-/ready")).call().is_ok();
    while !ready() {
        assert!(t0.elapsed() < Duration::from_secs(30), "prometheus did not start");
        assert!(prom.0[0].try_wait().unwrap().is_none(), "prometheus exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (rt, running) = control_plane(
        &dir.join("cp"),
        1,
        &format!("services:\n  tsdb:\n    url: {tsdb}\n    timeout: 5s\n"),
    );
    let base = format!("http://{}", running.rest_addr);
    let _agent = Agents(vec![
        agent_command("sim-000", &base, &dir)
            .args(["--telemetry-mode", "debug", "--remote-write"])
            .arg(format!("{tsdb}/api/v1/write"))
            .spawn()
            .unwrap(),
    ]);
    // A busy job (a writer pushing bytes as fast as it can for 4 s) and an idle one.
    let submit = |cmd: &str| {
        let (status, v) = call(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "physics", "resources": {"nodes": 1}, "entrypoint": cmd,
                        "lifecycle": {"walltime": "1m"}}),
            ),
        );
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    let busy = submit("echo start; yes > /dev/null & p=$!; sleep 4; kill $p; echo one; echo two >&2; echo done");
    // `lattice logs --follow` (the same stream) at the same time: its stdout on ours, its stderr on ours.
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_lattice-agent"))
        .parent()
        .unwrap();
    let follow = Command::new(bin_dir.join("lattice"))
        .args(["logs", "--follow", &busy])
        .env("LATTICE_ENDPOINT", &base)
        .env("HOME", &dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the workspace builds `lattice` beside `lattice-agent`");
    // Its output pushed as Server-Sent Events, in order, then `end` with its state.
    let events = sse_events(&format!("{base}/v1/allocations/{busy}/logs/stream"));
    let text: String = events
        .iter()
        .filter(|(e, _)| e == "output")
        .map(|(_, d)| d["data"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "start\none\ndone\n", "{events:?}");
    let (last, end) = events.last().unwrap();
    assert_eq!((last.as_str(), end["state"].as_str()), ("end", Some("completed")));
    let offsets: Vec<(u64, u64)> = events
        .iter()
        .filter(|(e, _)| e == "output")
        .map(|(_, d)| (d["offset"].as_u64().unwrap(), d["next"].as_u64().unwrap()))
        .collect();
    assert!(offsets.windows(2).all(|w| w[0].1 == w[1].0), "contiguous: {offsets:?}");
    let followed = follow.wait_with_output().unwrap();
    assert!(
        followed.status.success(),
        "{}",
        String::from_utf8_lossy(&followed.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&followed.stdout), "start\none\ndone\n");
    assert_eq!(String::from_utf8_lossy(&followed.stderr), "two\n");
    let err = sse_events(&format!("{base}/v1/allocations/{busy}/logs/stream?stream=stderr"));
    assert_eq!(err[0].1["data"], "two\n");
    let (status, v) = call(
        "GET",
        &format!("{base}/v1/allocations/{busy}/logs/stream?stream=both"),
        None,
    );
    assert_eq!((status, v["field"].as_str()), (400, Some("stream")));

    let idle = submit("sleep 4");
    wait_for(&base, &idle, |v| v["state"] == "completed", Duration::from_secs(30));

    // The snapshot: what the agent measured, read back through PromQL (once remote-write landed).
    let t0 = Instant::now();
    let m = loop {
        let (status, m) = call("GET", &format!("{base}/v1/allocations/{busy}/metrics"), None);
        assert_eq!(status, 200, "{m}");
        if m["summary"]["io_write_bytes"].as_f64().is_some_and(|w| w > 0.0) {
            break m;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no metrics: {m}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(m["nodes"], json!(["sim-000"]), "{m}");
    assert!(
        m["summary"]["cpu_cores"].as_f64().unwrap() > 0.2,
        "`yes` keeps a core busy: {m}"
    );
    assert!(m["summary"]["io_write_bytes"].as_f64().unwrap() > 1e7, "{m}");
    let (_, per) = call(
        "GET",
        &format!("{base}/v1/allocations/{busy}/metrics?mode=per-node&metrics=cpu_cores"),
        None,
    );
    assert_eq!(per["per_node"][0]["node"], "sim-000", "{per}");
    assert!(per["per_node"][0]["cpu_cores"].as_f64().unwrap() > 0.2, "{per}");
    assert!(
        per["per_node"][0].get("io_write_bytes").is_none(),
        "only what was asked: {per}"
    );
    let (status, v) = call(
        "GET",
        &format!("{base}/v1/allocations/{busy}/metrics?metrics=nope"),
        None,
    );
    assert_eq!((status, v["field"].as_str()), (400, Some("metrics")), "{v}");
    let (status, v) = call(
        "GET",
        &format!("{base}/v1/allocations/{busy}/metrics?duration=soon"),
        None,
    );
    assert_eq!((status, v["field"].as_str()), (400, Some("duration")), "{v}");

    // The comparison, aligned to each start: the busy run's writes dwarf the idle one's.
    let (status, c) = call(
        "GET",
        &format!("{base}/v1/compare?ids={busy},{idle}&metrics=cpu_cores,io_write_bytes&step=1s"),
        None,
    );
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["align"], "relative");
    let series = |i: usize, m: &str| -> Vec<(f64, f64)> {
        c["allocations"][i]["series"][m]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let busy_w = series(0, "io_write_bytes");
    assert!(!busy_w.is_empty(), "{c}");
    assert!(
        busy_w.iter().all(|(t, _)| (0.0..=30.0).contains(t)),
        "relative times: {busy_w:?}"
    );
    let peak = |s: &[(f64, f64)]| s.iter().map(|p| p.1).fold(0.0, f64::max);
    assert!(
        peak(&busy_w) > 100.0 * peak(&series(1, "io_write_bytes")).max(1.0),
        "{c}"
    );
    let (status, v) = call("GET", &format!("{base}/v1/compare?ids={busy},a-999999"), None);
    assert_eq!(status, 404, "{v}");
    let (status, v) = call("GET", &format!("{base}/v1/compare?ids={busy}&align=wall"), None);
    assert_eq!((status, v["field"].as_str()), (400, Some("align")), "{v}");

    // Diagnostics: storage throughput measured; the network part knows its domain.
    let (status, d) = call("GET", &format!("{base}/v1/allocations/{busy}/diagnostics"), None);
    assert_eq!(status, 200, "{d}");
    assert!(d["storage"]["io_write_bytes_per_s"].as_f64().unwrap() > 1e7, "{d}");
    assert!(d["network"]["not_measured"].as_array().is_some(), "{d}");
    let (_, n) = call(
        "GET",
        &format!("{base}/v1/allocations/{busy}/diagnostics/network"),
        None,
    );
    assert!(n.get("network").is_some() && n.get("storage").is_none(), "{n}");
    let (status, v) = call("GET", &format!("{base}/v1/allocations/{busy}/diagnostics/disks"), None);
    assert_eq!((status, v["field"].as_str()), (404, Some("part")), "{v}");
    // The same through `lattice`: top ID, compare, diag --storage.
    let lattice = |args: &[&str]| {
        let o = Command::new(bin_dir.join("lattice"))
            .args(args)
            .env("LATTICE_ENDPOINT", &base)
            .env("HOME", &dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let top = lattice(&["top", &busy]);
    assert!(
        top.contains("on sim-000") && top.contains("cpu_cores") && top.contains("iB/s"),
        "{top}"
    );
    let top = lattice(&["top", &busy, "--per-node"]);
    assert!(top.contains("NODE") && top.contains("sim-000"), "{top}");
    let cmp = lattice(&["compare", &busy, &idle, "--metric", "io_write_bytes"]);
    assert!(
        cmp.lines()
            .any(|l| l.starts_with("io_write_bytes") && l.contains(&busy)),
        "{cmp}"
    );
    let diag = lattice(&["diag", &busy, "--storage"]);
    assert!(
        diag.contains("Storage:") && diag.contains("write") && !diag.contains("Network:"),
        "{diag}"
    );
    // The live metrics stream at debug resolution: `lattice watch ID --metrics` prints a line a
    // second while it runs and exits 0 when it completed.
    let live = submit("yes > /dev/null & p=$!; sleep 5; kill $p");
    let (status, v) = {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut r = agent
            .patch(&format!("{base}/v1/allocations/{live}"))
            .send_json(json!({"telemetry": {"mode": "debug"}}))
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    assert_eq!(status, 200, "{v}");
    let watched = lattice(&["watch", &live, "--metrics", "cpu_cores"]);
    let lines: Vec<&str> = watched.lines().filter(|l| l.contains("cpu_cores=")).collect();
    assert!(lines.len() >= 2, "{watched}");
    assert!(!watched.contains("io_write_bytes"), "only what was asked: {watched}");
    // Both starts were measured by the agent and reported: the seed's startup histogram.
    let metrics = text_of(&format!("{base}/metrics"));
    assert!(
        metrics.contains("lattice_agent_allocation_startup_seconds_count{node_id=\"sim-000\"} 3"),
        "{metrics}"
    );
    // And what its collection costs it.
    let overhead = metrics
        .lines()
        .find_map(|l| l.strip_prefix("lattice_agent_ebpf_overhead_percent{node_id=\"sim-000\"} "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("the agent's collection overhead");
    assert!((0.0..100.0).contains(&overhead), "{overhead}");
    drop(_agent);
    rt.block_on(running.shutdown());
}

#[test]
fn a_service_is_discoverable_while_it_runs_and_fails_when_its_liveness_probe_does() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-service-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "");
    let base = format!("http://{}", running.rest_addr);
    let _agent = Agents(vec![agent_command("sim-000", &base, &dir).spawn().unwrap()]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let service = |cmd: String, probe: Value| {
        json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "5m"},
               "entrypoint": cmd,
               "connectivity": {"expose": [{"name": "web", "port": port, "protocol": "http"}]},
               "liveness_probe": probe})
    };
    let probe = json!({"probe_type": "http", "port": port, "path": "/", "period_secs": 1,
                       "initial_delay_secs": 1, "failure_threshold": 2, "timeout_secs": 1});
    // Refused before anything is queued, naming the field.
    let mut bad = service("true".into(), probe.clone());
    bad["liveness_probe"]["probe_type"] = json!("udp");
    let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(bad));
    assert_eq!(
        (status, v["field"].as_str()),
        (400, Some("liveness_probe.probe_type")),
        "{v}"
    );
    let mut bad = service("true".into(), probe.clone());
    bad["connectivity"]["expose"][0]["port"] = json!(0);
    let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(bad));
    assert_eq!(
        (status, v["field"].as_str()),
        (400, Some("connectivity.expose[0].port")),
        "{v}"
    );
    assert_eq!(
        call("GET", &format!("{base}/v1/allocations"), None).1["allocations"],
        json!([])
    );

    // A web server that answers for 6 s, then stops answering (its process lives on).
    let cmd = format!("python3 -m http.server {port} --bind 127.0.0.1 & p=$!; sleep 6; kill $p; sleep 600");
    let (status, v) = call("POST", &format!("{base}/v1/allocations"), Some(service(cmd, probe)));
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    wait_for(&base, &id, |v| v["state"] == "running", Duration::from_secs(20));
    let (_, names) = call("GET", &format!("{base}/api/v1/services"), None);
    assert_eq!(names["services"], json!(["web"]), "{names}");
    let (_, web) = call("GET", &format!("{base}/api/v1/services/web"), None);
    let e = &web["endpoints"][0];
    assert_eq!(
        (
            e["allocation"].as_str(),
            e["node"].as_str(),
            e["port"].as_u64(),
            e["protocol"].as_str()
        ),
        (Some(id.as_str()), Some("sim-000"), Some(u64::from(port)), Some("http")),
        "{web}"
    );
    // The registry's address reaches the service.
    let url = format!("http://{}:{}/", e["host"].as_str().unwrap(), port);
    let t0 = Instant::now();
    while ureq::get(&url).call().is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the service never answered at {url}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Probes pass while it answers: still running 3 s in.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        call("GET", &format!("{base}/v1/allocations/{id}"), None).1["state"],
        "running"
    );
    // Then two failed probes in a row: the agent stops it and it fails, saying why on its stderr.
    let v = wait_for(&base, &id, |v| v["state"] == "failed", Duration::from_secs(30));
    assert!(
        v["ended_ms"].as_u64().unwrap() - v["started_ms"].as_u64().unwrap() < 60_000,
        "{v}"
    );
    let (_, logs) = call("GET", &format!("{base}/v1/allocations/{id}/logs?stream=stderr"), None);
    assert!(
        logs.to_string().contains("liveness probe failed 2 time(s) in a row"),
        "{logs}"
    );
    // Gone from the registry with it.
    assert_eq!(
        call("GET", &format!("{base}/api/v1/services"), None).1["services"],
        json!([])
    );
    let (status, v) = call("GET", &format!("{base}/api/v1/services/web"), None);
    assert_eq!((status, v["field"].as_str()), (404, Some("name")), "{v}");

    // The walltime/checkpoint race: asked to checkpoint, never done, killed at its walltime — walltime
    // wins and the race is counted.
    let (status, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "3s"},
                    "entrypoint": "trap 'echo hint' USR1; while :; do sleep 1; done",
                    "checkpoint": {"strategy": "manual", "mechanism": "signal"}}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let slow = v["id"].as_str().unwrap().to_string();
    wait_for(&base, &slow, |v| v["state"] == "running", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        call("POST", &format!("{base}/v1/allocations/{slow}/checkpoint"), None).0,
        202
    );
    let v = wait_for(&base, &slow, |v| v["ended_ms"].is_u64(), Duration::from_secs(40));
    assert_eq!(v["end_reason"], "walltime_exceeded", "{v}");
    let metrics = text_of(&format!("{base}/metrics"));
    assert!(
        metrics.contains("lattice_checkpoint_walltime_conflict_total 1"),
        "{metrics}"
    );
    drop(_agent);
    rt.block_on(running.shutdown());
}

/// A sensitive allocation takes one terminal session at a time, and only when it runs a signed
/// uenv (book: "Observability Constraints", "Session recorded, audit trail, signed uenv only"): a
/// claim without a signed uenv is not attached to (403, nothing opened); on one running a signed
/// uenv, two `lattice attach` started at once through a real agent — exactly one runs its command,
/// the other is refused (409, naming the open session) and opened nothing; once the first ended,
/// the next attach opens. Each session is recorded (what was typed and shown, asciicast), the
/// recording named by its `attach` and `attach_end` entries with its SHA-256; the audit chain (with
/// every signature) verifies.
#[test]
fn a_sensitive_allocation_takes_one_terminal_session_at_a_time() {
    if !can_mount_uenvs() {
        return;
    }
    let lattice = std::path::Path::new(env!("CARGO_BIN_EXE_lattice-agent")).with_file_name("lattice");
    assert!(lattice.is_file(), "the lattice client is built beside lattice-agent");
    let dir = std::env::temp_dir().join(format!("lattice-agent-one-session-{}", std::process::id()));
    let (rt, running) = control_plane(&dir, 1, "agents:\n  heartbeat_timeout: 5s\n  grace: 5s\n");
    let base = format!("http://{}", running.rest_addr);
    let (registry, app) = (dir.join("registry"), dir.join("app"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("README"), "validated stack\n").unwrap();
    publish_uenv(&app, &registry, "sensitive/validated/2024.1", None);
    let site = lattice_engine::audit::SigningKey::from_bytes(&[21; 32]);
    let image_digest = {
        use sha2::Digest;
        let image = registry.join("sensitive/validated/2024.1.squashfs");
        let digest: [u8; 32] = sha2::Sha256::digest(std::fs::read(&image).unwrap()).into();
        std::fs::write(
            registry.join("sensitive/validated/2024.1.squashfs.sig"),
            lattice_engine::audit::sign_digest(&site, &digest).sig,
        )
        .unwrap();
        digest.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let mut agent = agent_command("sim-000", &base, &dir);
    agent
        .args(["--uenv-registry", &registry.display().to_string()])
        .arg("--image-cache")
        .arg(dir.join("cache"))
        .arg("--uenv-mount")
        .arg(dir.join("mnt"))
        .args(["--uenv-signing-key", &lattice_engine::audit::public_hex(&site)])
        .args(["--wipe-command", "true"]);
    let _agents = Agents(vec![agent.spawn().unwrap()]);
    wait_ready(&base, &["sim-000"], Duration::from_secs(20));
    let claim = |environment: Value| {
        let (status, v) = call(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "physics", "sensitive": true, "resources": {"nodes": 1},
                        "lifecycle": {"walltime": "5m"}, "entrypoint": "sleep 300", "environment": environment}),
            ),
        );
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    // Without a signed uenv: no session.
    let unsigned = claim(json!({}));
    wait_for(&base, &unsigned, |v| v["state"] == "running", Duration::from_secs(20));
    let o = Command::new(&lattice)
        .args(["attach", &unsigned, "--command", "echo opened"])
        .env("LATTICE_ENDPOINT", &base)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        !o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("opened"),
        "{o:?}"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("signed uenv"), "{o:?}");
    let (_, a) = call(
        "GET",
        &format!("{base}/v1/audit/logs?allocation={unsigned}&event=attach"),
        None,
    );
    assert_eq!(a["entries"], json!([]), "nothing opened: {a}");
    call("DELETE", &format!("{base}/v1/allocations/{unsigned}"), None);
    wait_for(&base, &unsigned, |v| v["ended_ms"].is_u64(), Duration::from_secs(10));
    // Its node is wiped (the site's wipe command) and back before the next claim.
    let t0 = Instant::now();
    while call(
        "GET",
        &format!("{base}/v1/audit/logs?allocation={unsigned}&event=wipe"),
        None,
    )
    .1["entries"]
        .as_array()
        .is_none_or(|e| e.is_empty())
    {
        assert!(t0.elapsed() < Duration::from_secs(20), "the node's wipe");
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_ready(&base, &["sim-000"], Duration::from_secs(20));
    let id = claim(json!({"uenv": "sensitive/validated:2024.1", "sign_required": true}));
    wait_for(&base, &id, |v| v["state"] == "running", Duration::from_secs(20));
    // The image it runs, pulled for it, is in its audit trail with the digest it was verified against.
    let t0 = Instant::now();
    let pull = loop {
        let (_, a) = call(
            "GET",
            &format!("{base}/v1/audit/logs?allocation={id}&event=image_pull"),
            None,
        );
        if let Some(e) = a["entries"].as_array().and_then(|e| e.first()) {
            break e["detail"].as_str().unwrap().to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no image_pull entry: {a}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        pull,
        format!("sim-000 image=sensitive/validated:2024.1 sha256={image_digest} pulled"),
        "{pull}"
    );
    let attach = |command: &str| {
        Command::new(&lattice)
            .args(["attach", &id, "--command", command])
            .env("LATTICE_ENDPOINT", &base)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let both = [attach("sleep 3; echo first-done"), attach("sleep 3; echo first-done")];
    let outs: Vec<std::process::Output> = both.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let ran: Vec<&std::process::Output> = outs.iter().filter(|o| o.status.success()).collect();
    assert_eq!(ran.len(), 1, "exactly one session: {outs:?}");
    assert!(
        String::from_utf8_lossy(&ran[0].stdout).contains("first-done"),
        "{outs:?}"
    );
    let refused = outs.iter().find(|o| !o.status.success()).unwrap();
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("already has a terminal session open"),
        "{refused:?}"
    );
    // The first ended: the next opens.
    let o = attach("echo again").wait_with_output().unwrap();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("again"),
        "{o:?}"
    );
    // The session's end is written once its relay closes: after the client saw the exit.
    let ended = |a: &Value| {
        a["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["action"].as_str().unwrap().starts_with("attach_end"))
            .count()
    };
    let t0 = Instant::now();
    let a = loop {
        let (_, a) = call("GET", &format!("{base}/v1/audit/logs?allocation={id}"), None);
        if ended(&a) >= 2 || t0.elapsed() > Duration::from_secs(10) {
            break a;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let actions: Vec<&str> = a["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .filter(|a| a.starts_with("attach"))
        .collect();
    assert_eq!(
        actions,
        ["attach", "attach_end (exited)", "attach", "attach_end (exited)"],
        "{a}"
    );
    assert_eq!(a["chain_valid"], true, "{a}");
    // Each session's recording: named when it opened, and with its size and digest when it ended.
    let details: Vec<&str> = a["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"].as_str().unwrap().starts_with("attach"))
        .map(|e| e["detail"].as_str().unwrap())
        .collect();
    let name = |d: &str| {
        d.split_whitespace()
            .find_map(|w| w.strip_prefix("recording="))
            .unwrap()
            .to_string()
    };
    assert_eq!(name(details[0]), name(details[1]), "{details:?}");
    let end = details[3];
    let file = dir.join("q").join(name(end));
    let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        end.contains(&format!("sha256={digest}")) && end.contains(&format!("bytes={}", bytes.len())),
        "{end}"
    );
    assert!(
        String::from_utf8_lossy(&bytes).contains("again"),
        "the output is recorded"
    );
    rt.block_on(running.shutdown());
}
