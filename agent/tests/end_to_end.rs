//! A control plane and two real `lattice-agent` processes on loopback: a 2-node job runs as real
//! processes with the seed's environment on both nodes and completes; a job that outlives its
//! walltime is terminated; a failing command fails the allocation; a cancelled job's processes are
//! stopped and its nodes run the next job; each agent registered its conformance fingerprint; and
//! a restarted agent takes over its running job from the state file; and when an agent dies under a
//! running job its node goes Down and the job is requeued elsewhere.

use serde_json::{Value, json};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn call(method: &'static str, url: &str, body: Option<Value>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut resp = match (method, body) {
        ("POST", Some(b)) => agent.post(url).send_json(b),
        ("POST", None) => agent.post(url).send_empty(),
        ("DELETE", _) => agent.delete(url).call(),
        _ => agent.get(url).call(),
    }
    .expect("the control plane answers");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

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

#[test]
fn two_agents_run_real_jobs() {
    let dir = std::env::temp_dir().join(format!("lattice-agent-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = lattice_runtime::RuntimeConfig::parse(
        "t.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\nsimulate_agents: false\ncycle: 100ms\nagents:\n  heartbeat_timeout: 1s\n  grace: 1s\n",
            dir.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let running = rt.block_on(lattice_runtime::start(cfg, true)).unwrap();
    let base = format!("http://{}", running.rest_addr);
    let t0 = Instant::now();
    while !running.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(50));
    }
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
        Command::new(env!("CARGO_BIN_EXE_lattice-agent"))
            .args(["--node-id", n, "--quorum-endpoint", &base, "--poll", "100ms"])
            .args(["--telemetry-mode", "debug", "--metrics-push", &push_url])
            .args(["--heartbeat", "200ms", "--grace", "300ms", "--log-dir"])
            .arg(dir.join(format!("logs-{n}")))
            .arg("--state-file")
            .arg(dir.join(format!("state-{n}.json")))
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
