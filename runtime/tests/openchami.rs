//! OpenCHAMI against a local fake SMD speaking its REST shapes (`/hsm/v2/State/Components`,
//! `/hsm/v2/groups`, `PATCH /hsm/v2/State/Components/{xname}`): the runtime's nodes come from SMD
//! (groups give capabilities and dragonfly groups), follow SMD's states, and a real agent whose
//! conformance fingerprint is off its group's baseline is drained and flagged in SMD until it
//! conforms again.

mod common;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use common::{agent_process, call, free_port, runtime_process, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Smd {
    /// xname → component.
    components: Mutex<BTreeMap<String, Value>>,
    groups: Mutex<Vec<Value>>,
    /// Every PATCH: (xname, body).
    patches: Mutex<Vec<(String, Value)>>,
}

type S = State<Arc<Smd>>;

async fn components(State(s): S) -> Json<Value> {
    let c: Vec<Value> = s.components.lock().unwrap().values().cloned().collect();
    Json(json!({ "Components": c }))
}

async fn groups(State(s): S) -> Json<Value> {
    Json(Value::Array(s.groups.lock().unwrap().clone()))
}

async fn patch(State(s): S, Path(x): Path<String>, Json(b): Json<Value>) -> Json<Value> {
    if let Some(c) = s.components.lock().unwrap().get_mut(&x) {
        for (k, v) in b.as_object().unwrap() {
            c[k] = v.clone();
        }
    }
    s.patches.lock().unwrap().push((x, b));
    Json(json!({}))
}

fn node(x: &str, state: &str) -> Value {
    json!({"ID": x, "Type": "Node", "State": state, "Flag": "OK", "Enabled": true, "Role": "Compute", "NID": 1})
}

fn nodes(base: &str) -> BTreeMap<String, Value> {
    let (code, v) = call("GET", &format!("{base}/v1/nodes"), None);
    assert_eq!(code, 200, "{v}");
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap().to_string(), n.clone()))
        .collect()
}

fn state(base: &str, x: &str) -> String {
    nodes(base)[x]["state"].as_str().unwrap().to_string()
}

#[test]
fn nodes_come_from_smd_follow_it_and_drift_drains_and_flags() {
    let dir = std::env::temp_dir().join(format!("lattice-openchami-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // This machine's fingerprint is the compute group's baseline.
    let host = lattice_agent::discovery::Sources {
        root: std::path::Path::new("/"),
    };
    let baseline = lattice_agent::discovery::fingerprint(&host.components());
    let smd = Arc::new(Smd::default());
    {
        let mut c = smd.components.lock().unwrap();
        for (x, st) in [
            ("x1000c0s0b0n0", "Ready"),
            ("x1000c0s0b0n1", "Ready"),
            ("x1000c0s1b0n0", "Ready"),
            ("x1000c0s1b0n1", "Off"),
        ] {
            c.insert(x.into(), node(x, st));
        }
        // Not a compute node: not the scheduler's.
        c.insert(
            "x1000c0s9b0".into(),
            json!({"ID": "x1000c0s9b0", "Type": "NodeBMC", "State": "Ready", "Flag": "OK"}),
        );
        let all = ["x1000c0s0b0n0", "x1000c0s0b0n1", "x1000c0s1b0n0", "x1000c0s1b0n1"];
        *smd.groups.lock().unwrap() = vec![
            json!({"label": "compute", "members": {"ids": all}}),
            json!({"label": "gpu-h100", "members": {"ids": ["x1000c0s0b0n0", "x1000c0s0b0n1"]}}),
            json!({"label": "dragonfly-1", "members": {"ids": ["x1000c0s1b0n0", "x1000c0s1b0n1"]}}),
        ];
    }
    let app = Router::new()
        .route("/hsm/v2/State/Components", get(components))
        .route("/hsm/v2/State/Components/{x}", axum::routing::patch(patch))
        .route("/hsm/v2/groups", get(groups))
        .with_state(smd.clone());
    let smd_url = common::serve_on_thread(app);

    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let config = dir.join("runtime.yaml");
    std::fs::write(
        &config,
        format!(
            "rest_listen: 127.0.0.1:{port}\ngrpc_listen: 127.0.0.1:{grpc}\ndata_dir: data\nsimulate_agents: false\ncycle: 100ms
scheduler:
  trace_capture: capture.jsonl
services:
  openchami:
    smd_url: {smd_url}
    refresh: 1s
    timeout: 2s
    groups:
      compute: {{cpu_cores: 64, memory_gb: 256, conformance: base, baseline: {baseline}}}
      gpu-h100: {{gpu_type: H100, gpu_count: 4, features: [nvme_scratch]}}
",
            grpc = free_port()
        ),
    )
    .unwrap();
    let _rt = runtime_process(&config, &dir.join("runtime.log"));
    wait_until("the runtime to serve", Duration::from_secs(20), || {
        call("GET", &format!("{base}/v1/nodes"), None).0 == 200
    });

    // The inventory is SMD's compute nodes, with their groups' capabilities and dragonfly groups.
    let n = nodes(&base);
    assert_eq!(
        n.keys().map(String::as_str).collect::<Vec<_>>(),
        ["x1000c0s0b0n0", "x1000c0s0b0n1", "x1000c0s1b0n0", "x1000c0s1b0n1"]
    );
    assert_eq!(
        (
            n["x1000c0s0b0n0"]["gpu_type"].as_str(),
            n["x1000c0s0b0n0"]["gpu_count"].as_u64()
        ),
        (Some("H100"), Some(4))
    );
    assert_eq!(n["x1000c0s1b0n0"]["gpu_count"], 0);
    assert_eq!(
        (
            n["x1000c0s0b0n1"]["group"].as_u64(),
            n["x1000c0s1b0n0"]["group"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(n["x1000c0s1b0n1"]["state"], "down", "SMD says it is off");

    // Three real agents; the third reads a host whose kernel differs from the baseline's.
    let odd = dir.join("odd-root");
    std::fs::create_dir_all(odd.join("proc/sys/kernel")).unwrap();
    std::fs::write(odd.join("proc/sys/kernel/osrelease"), "6.1.0-drifted\n").unwrap();
    let _a0 = agent_process(&base, "x1000c0s0b0n0", &dir, &[]);
    let _a1 = agent_process(&base, "x1000c0s0b0n1", &dir, &[]);
    let drifted = agent_process(&base, "x1000c0s1b0n0", &dir, &["--host-root", odd.to_str().unwrap()]);
    wait_until("the agents to register", Duration::from_secs(20), || {
        let n = nodes(&base);
        ["x1000c0s0b0n0", "x1000c0s0b0n1", "x1000c0s1b0n0"]
            .iter()
            .all(|x| n[*x]["fingerprint"].is_string())
    });
    let n = nodes(&base);
    assert_eq!(n["x1000c0s0b0n0"]["state"], "ready");
    assert_eq!(n["x1000c0s0b0n0"]["drifted"], false);
    assert_eq!(n["x1000c0s1b0n0"]["drifted"], true);
    assert_eq!(n["x1000c0s1b0n0"]["state"], "drained", "no new work on a drifted node");
    // SMD is asked to remediate it, with both fingerprints.
    wait_until("the drift flagged in SMD", Duration::from_secs(10), || {
        smd.components.lock().unwrap()["x1000c0s1b0n0"]["Flag"] == "Warning"
    });
    let msg = smd.components.lock().unwrap()["x1000c0s1b0n0"]["FlagMsg"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains(&format!("expected={baseline}")) && msg.contains("actual="),
        "{msg}"
    );

    // A 3-node job cannot run: one node is off, one drifted.
    let (code, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "entrypoint": "sleep 1", "resources": {"nodes": 3},
                    "lifecycle": {"walltime": "10m"}}),
        ),
    );
    assert_eq!(code, 201, "{v}");
    let job = v["id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(500));
    let job_state = |b: &str| call("GET", &format!("{b}/v1/allocations/{job}"), None).1["state"].clone();
    assert_eq!(job_state(&base), "pending");

    // Remediated (the node rebooted into the right image): its agent reports the baseline again.
    drop(drifted);
    let _fixed = agent_process(&base, "x1000c0s1b0n0", &dir, &[]);
    wait_until("the node back after remediation", Duration::from_secs(20), || {
        state(&base, "x1000c0s1b0n0") != "drained" && nodes(&base)["x1000c0s1b0n0"]["drifted"] == false
    });
    wait_until("the flag cleared in SMD", Duration::from_secs(10), || {
        smd.components.lock().unwrap()["x1000c0s1b0n0"]["Flag"] == "OK"
    });
    wait_until("the 3-node job to run and end", Duration::from_secs(30), || {
        job_state(&base) == "completed"
    });

    // SMD's states are followed: a node it halts goes down; when it is ready again, so is the node;
    // the one it powers on comes up.
    smd.components.lock().unwrap().get_mut("x1000c0s0b0n1").unwrap()["State"] = json!("Halt");
    wait_until("the halted node down", Duration::from_secs(10), || {
        state(&base, "x1000c0s0b0n1") == "down"
    });
    smd.components.lock().unwrap().get_mut("x1000c0s0b0n1").unwrap()["State"] = json!("Ready");
    smd.components.lock().unwrap().get_mut("x1000c0s1b0n1").unwrap()["State"] = json!("Ready");
    wait_until("both back", Duration::from_secs(10), || {
        state(&base, "x1000c0s0b0n1") != "down" && state(&base, "x1000c0s1b0n1") != "down"
    });

    // A 3-node H100 job cannot be placed: the site has two H100 nodes.
    let gpu_job = json!({"tenant": "physics", "entrypoint": "sleep 1",
        "resources": {"nodes": 3, "constraints": {"gpu_type": "H100", "gpu_count": 4}},
        "lifecycle": {"walltime": "10m"}});
    let (code, v) = call("POST", &format!("{base}/v1/allocations"), Some(gpu_job.clone()));
    assert!(code == 400 || code == 422, "{code} {v}");
    // SMD gains a third H100 blade, in dragonfly group 2: it joins while the runtime runs, with its
    // groups' capabilities, booting until its agent registers; the trace capture writes it.
    let x = "x1000c0s2b0n0";
    smd.components.lock().unwrap().insert(x.into(), node(x, "Ready"));
    {
        let mut groups = smd.groups.lock().unwrap();
        for g in groups.iter_mut() {
            if g["label"] == "compute" || g["label"] == "gpu-h100" {
                g["members"]["ids"].as_array_mut().unwrap().push(json!(x));
            }
        }
        groups.push(json!({"label": "dragonfly-2", "members": {"ids": [x]}}));
    }
    wait_until("the new node to join", Duration::from_secs(10), || {
        nodes(&base).contains_key(x)
    });
    let n = nodes(&base)[x].clone();
    assert_eq!(
        (n["gpu_type"].as_str(), n["gpu_count"].as_u64(), n["group"].as_u64()),
        (Some("H100"), Some(4), Some(2)),
        "{n}"
    );
    assert_eq!(n["state"], "booting", "not schedulable before its agent reports");
    let (code, v) = call("POST", &format!("{base}/v1/allocations"), Some(gpu_job));
    assert_eq!(code, 201, "{v}");
    let gpu = v["id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        call("GET", &format!("{base}/v1/allocations/{gpu}"), None).1["state"],
        "pending",
        "two H100 nodes ready, the third booting"
    );
    let _a3 = agent_process(&base, x, &dir, &[]);
    wait_until(
        "the H100 job to run on the new node and end",
        Duration::from_secs(30),
        || call("GET", &format!("{base}/v1/allocations/{gpu}"), None).1["state"] == "completed",
    );
    let v = call("GET", &format!("{base}/v1/allocations/{gpu}"), None).1;
    assert!(v["nodes"].as_array().unwrap().contains(&json!(x)), "{v}");
    assert_eq!(
        nodes(&base)[x]["drifted"],
        false,
        "its group's baseline is its fingerprint"
    );
    let capture = std::fs::read_to_string(dir.join("capture.jsonl")).unwrap();
    let w = lattice_traces::parse_jsonl("capture.jsonl", &capture);
    let joined: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            lattice_traces::TraceEventKind::NodeAdded(n) => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(joined.len(), 1, "{capture}");
    assert_eq!(
        (
            joined[0].spec.name.as_str(),
            joined[0].spec.capabilities.gpu_count,
            joined[0].spec.group.0
        ),
        (x, 4, 2)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node SMD gained that only the leader has learnt (its refresh read SMD; the other members'
/// refreshes, an hour apart, have not yet): the leader runs a job there that no other node can run,
/// and is stopped. The next leader finds the node among the quorum's assignments, reads SMD at once
/// and re-attaches the job on it: not lost (unplaceable without the node) and not started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_leader_learns_a_joined_node_the_quorum_names() {
    let dir = std::env::temp_dir().join(format!("lattice-openchami-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let smd = Arc::new(Smd::default());
    {
        let mut c = smd.components.lock().unwrap();
        for x in ["x1000c0s0b0n0", "x1000c0s0b0n1"] {
            c.insert(x.into(), node(x, "Ready"));
        }
    }
    let app = Router::new()
        .route("/hsm/v2/State/Components", get(components))
        .route("/hsm/v2/groups", get(groups))
        .with_state(smd.clone());
    let smd_url = common::serve_stand_in(app).await;
    let extra = format!(
        "simulate_agents: true\nservices:\n  openchami:\n    smd_url: {smd_url}\n    refresh: 1h\n    groups:\n      bigmem: {{memory_gb: 2048, features: [bigmem]}}\n"
    );
    let mut rts: Vec<Option<lattice_runtime::Running>> = common::start_quorum(&dir, 3, 2, &extra)
        .await
        .into_iter()
        .map(Some)
        .collect();
    let rest: Vec<String> = rts.iter().map(|r| r.as_ref().unwrap().rest_addr.to_string()).collect();
    let leader_index = |rts: &[Option<lattice_runtime::Running>]| {
        rts.iter()
            .position(|r| r.as_ref().is_some_and(|r| r.shared.member.is_leader()))
    };
    let t0 = std::time::Instant::now();
    let first = loop {
        if let Some(i) = leader_index(&rts) {
            break i;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "a first leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // SMD gains a big-memory node; the leader learns it (as its refresh would).
    let x = "x1000c0s1b0n0";
    smd.components.lock().unwrap().insert(x.into(), node(x, "Ready"));
    smd.groups
        .lock()
        .unwrap()
        .push(json!({"label": "bigmem", "members": {"ids": [x]}}));
    let leader = rts[first].as_ref().unwrap().shared.clone();
    {
        let mut c = leader.control.lock().await;
        lattice_runtime::openchami::sync::join_named(&leader, &mut c, &[x.to_string()].into()).await;
        assert!(c.node_index(x).is_some(), "the leader has the node");
    }
    let base = format!("http://{}", rest[first]);
    let job = json!({"tenant": "bio", "entrypoint": "sleep 600",
        "resources": {"nodes": 1, "constraints": {"features": ["bigmem"]}}, "lifecycle": {"walltime": "1h"}});
    let (code, v) = common::http("POST", format!("{base}/v1/allocations"), Some(job)).await;
    assert_eq!(code, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let t0 = std::time::Instant::now();
    let started = loop {
        let (_, v) = common::http("GET", format!("{base}/v1/allocations/{id}"), None).await;
        if v["state"] == "running" {
            assert_eq!(v["nodes"], json!([x]));
            break v["started_ms"].as_u64().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the job to start: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for (i, r) in rts.iter().enumerate().filter(|(i, _)| *i != first) {
        let c = r.as_ref().unwrap().shared.control.lock().await;
        assert!(c.node_index(x).is_none(), "member {i} has not read SMD since");
    }

    let stopped_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    rts[first].take().unwrap().shutdown().await;
    let t0 = std::time::Instant::now();
    let next = loop {
        if let Some(i) = leader_index(&rts) {
            break i;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "a new leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let base = format!("http://{}", rest[next]);
    let t0 = std::time::Instant::now();
    let v = loop {
        let (code, v) = common::http("GET", format!("{base}/v1/allocations/{id}"), None).await;
        if code == 200 {
            break v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the new leader serves: {code} {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(v["state"], "running", "re-attached, not run again: {v}");
    assert_eq!(v["nodes"], json!([x]));
    // Its start as the quorum recorded it (the proposal's time: within a few ms of the view's).
    let again = v["started_ms"].as_u64().unwrap();
    assert!(
        again.abs_diff(started) < 1000 && again < stopped_ms,
        "the same run: {started} → {again}"
    );
    let (_, n) = common::http("GET", format!("{base}/v1/nodes"), None).await;
    let joined = n["nodes"].as_array().unwrap().iter().find(|n| n["name"] == x).cloned();
    assert_eq!(joined.map(|n| n["owner"].clone()), Some(json!(id)), "{n}");
    for r in rts.into_iter().flatten() {
        r.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The control plane's entry point for joining nodes: a rack by `prefix` and `count` joins (each node
/// captured as `node_added`, with real agents `booting`); an entry that does not parse, names a
/// node already here or a vCluster the site lacks adds nothing and captures nothing.
#[test]
fn joining_nodes_through_the_control_plane() {
    let dir = std::env::temp_dir().join(format!("lattice-openchami-join-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let capture = dir.join("capture.jsonl");
    let mut c = common::balanced_control(4);
    c.real_agents = true;
    c.capture_to(&capture).unwrap();
    for (entry, error) in [
        (json!({"prefix": "r", "count": 0}), "count"),
        (json!({"gpus": 4, "name": "r"}), "gpus"),
        (json!({"name": "n00001"}), "already in the inventory"),
        (json!({"name": "r9", "vcluster": "nowhere"}), "nowhere"),
    ] {
        let e = c.add_nodes(&entry, None, true).unwrap_err();
        assert!(e.contains(error), "{entry}: {e}");
    }
    assert_eq!(c.node_names().len(), 4, "nothing added");
    assert_eq!(
        std::fs::read_to_string(&capture).unwrap_or_default(),
        "",
        "nothing captured"
    );
    let added = c
        .add_nodes(&json!({"prefix": "r", "count": 2, "gpu_count": 4}), None, true)
        .unwrap();
    assert_eq!(added, ["r0000", "r0001"]);
    assert_eq!(c.node_state_of("r0001").as_deref(), Some("booting"));
    let w = lattice_traces::parse_jsonl("capture.jsonl", &std::fs::read_to_string(&capture).unwrap());
    let names: Vec<&str> = w
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            lattice_traces::TraceEventKind::NodeAdded(n) => Some(n.spec.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["r0000", "r0001"]);
    let _ = std::fs::remove_dir_all(&dir);
}
