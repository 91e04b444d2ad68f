//! The control plane end to end on loopback: a single-member quorum, simulated agents and the REST
//! API — submit → schedule → commit → run → complete, validation errors naming the field, cancel,
//! drain/undrain, hard quotas, weight hot-reload, `/metrics`, and the trace capture replaying in
//! `rm-replay`'s reader; PATCH (walltime extension), checkpoint, node disable/enable, the sensitive
//! audit log query and usage.

mod common;
use lattice_runtime::{RuntimeConfig, start};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

struct Api {
    base: String,
}

impl Api {
    async fn call(&self, method: &'static str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let mut resp = match (method, body) {
                ("GET", _) => agent.get(&url).call(),
                ("DELETE", _) => agent.delete(&url).call(),
                ("POST", Some(b)) => agent.post(&url).send_json(b),
                ("POST", None) => agent.post(&url).send_empty(),
                ("PUT", Some(b)) => agent.put(&url).send_json(b),
                ("PATCH", Some(b)) => agent.patch(&url).send_json(b),
                _ => unreachable!(),
            }
            .expect("request reaches the server");
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
        })
        .await
        .unwrap()
    }

    async fn get(&self, path: &str) -> Value {
        self.call("GET", path, None).await.1
    }

    async fn submit(&self, body: Value) -> String {
        let (status, v) = self.call("POST", "/v1/allocations", Some(body)).await;
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    /// Waits until the allocation reaches `state`.
    async fn wait_state(&self, id: &str, state: &str, within: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.get(&format!("/v1/allocations/{id}")).await;
            if v["state"] == state {
                return v;
            }
            assert!(t0.elapsed() < within, "{id} not {state} within {within:?}: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A single-member quorum on 4 simulated nodes in a fresh folder (`lattice-runtime-{tag}-{pid}`),
/// with `tenants` as its tenants file and, with `capture`, the trace capture in `capture.jsonl`;
/// returned once it leads, with the folder and its config text (to start it again).
async fn one_member(
    tag: &str,
    tenants: Option<&str>,
    capture: bool,
) -> (lattice_runtime::Running, Api, std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let mut text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {d}/q\nsimulated_nodes: 4\ncycle: 100ms\n"
    );
    if let Some(t) = tenants {
        std::fs::write(dir.join("tenants.yaml"), t).unwrap();
        text.push_str(&format!("tenants: {d}/tenants.yaml\n"));
    }
    if capture {
        text.push_str(&format!("scheduler:\n  trace_capture: {d}/capture.jsonl\n"));
    }
    let rt = start(RuntimeConfig::parse("t.yaml", &text).unwrap(), true)
        .await
        .unwrap();
    let api = Api {
        base: format!("http://{}", rt.rest_addr),
    };
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the single member leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (rt, api, dir, text)
}

fn job(tenant: &str, nodes: u32, secs: f64) -> Value {
    json!({
        "tenant": tenant,
        "user": "alice",
        "entrypoint": format!("sleep {secs}"),
        "resources": {"nodes": nodes},
        "lifecycle": {"type": "bounded", "walltime": "10m"},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allocations_run_through_the_api_quorum_and_engine() {
    let (rt, api, dir, _) = one_member("test", Some("physics:\n  max_nodes: 2\n"), true).await;

    // Submit → schedule → commit → run → complete.
    let a = api.submit(job("bio", 2, 0.3)).await;
    let running = api.wait_state(&a, "running", Duration::from_secs(5)).await;
    assert_eq!(running["nodes"].as_array().unwrap().len(), 2);
    let done = api.wait_state(&a, "completed", Duration::from_secs(5)).await;
    assert_eq!(done["end_reason"], "success");
    let list = api.get("/v1/allocations?tenant=bio").await;
    assert_eq!(list["allocations"].as_array().unwrap().len(), 1);
    assert_eq!(api.get("/v1/allocations?tenant=nobody").await["allocations"], json!([]));

    // Validation: 400 naming the field; unknown ids are 404.
    for (body, field) in [
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "10m"}, "preemption_class": 11}),
            "preemption_class",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "soon"}}),
            "lifecycle.walltime",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 0}, "lifecycle": {"walltime": "1m"}}),
            "resources.nodes",
        ),
        // A shape `nodes` does not take: refused saying what it takes, not as serde's untagged
        // mismatch; more than a node count holds: refused naming the limit, never truncated.
        (
            json!({"tenant": "bio", "resources": {"nodes": 1e3}, "lifecycle": {"walltime": "1m"}}),
            "resources.nodes",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": {"min": 1}}, "lifecycle": {"walltime": "1m"}}),
            "resources.nodes",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 4294967297u64}, "lifecycle": {"walltime": "1m"}}),
            "resources.nodes",
        ),
        // Durations whose milliseconds overflow, and walltimes past the 366-day bound.
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "99999999999999d"}}),
            "lifecycle.walltime",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "367d"}}),
            "lifecycle.walltime",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1h"}, "duration": "1e300"}),
            "duration",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"}, "colour": "red"}),
            "colour",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"}, "vcluster": "gpu"}),
            "vcluster",
        ),
        // Reactive: a metric and a positive target are required, the range must fit the cluster.
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"type": "reactive", "target": 10}}),
            "lifecycle.metric",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"type": "reactive", "metric": "queue_depth"}}),
            "lifecycle.target",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1},
                   "lifecycle": {"type": "reactive", "metric": "queue_depth", "target": 10, "scale_policy": {"min": 1, "max": 999}}}),
            "lifecycle.max_nodes",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1},
                   "lifecycle": {"type": "reactive", "metric": "queue_depth", "target": 10, "scale_policy": {"cooldown": "soon"}}}),
            "lifecycle.scale_policy.cooldown",
        ),
        // Software environments: a uenv name, a view only with a uenv, an OCI image reference, not both.
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "environment": {"uenv": "../etc/passwd"}}),
            "environment.uenv",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "environment": {"view": "default"}}),
            "environment.view",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "environment": {"uenv": "a/1:v1", "view": "no spaces"}}),
            "environment.view",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "environment": {"image": "../busybox:latest"}}),
            "environment.image",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "environment": {"uenv": "a/1:v1", "image": "busybox"}}),
            "environment",
        ),
        (
            json!({"tenant": "bio", "resources": {"nodes": 1}, "environment": {"uenv": "a/1:v1", "mount": "/x"}}),
            "mount",
        ),
    ] {
        let (status, v) = api.call("POST", "/v1/allocations", Some(body)).await;
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{v}");
        assert!(!v["error"].as_str().unwrap_or_default().contains("untagged"), "{v}");
    }
    // A refused request queued nothing.
    let list = api.get("/v1/allocations?tenant=bio").await;
    assert_eq!(list["allocations"].as_array().unwrap().len(), 1);
    assert_eq!(api.call("GET", "/v1/allocations/a-999999", None).await.0, 404);

    // Hard quota (physics max_nodes 2, enforced by the engine and validated by the quorum): two
    // 2-node allocations never run at the same time.
    let p1 = api.submit(job("physics", 2, 0.4)).await;
    let p2 = api.submit(job("physics", 2, 0.4)).await;
    let v1 = api.wait_state(&p1, "completed", Duration::from_secs(10)).await;
    let v2 = api.wait_state(&p2, "completed", Duration::from_secs(10)).await;
    let (s1, e1, s2, e2) = (
        v1["started_ms"].as_u64().unwrap(),
        v1["ended_ms"].as_u64().unwrap(),
        v2["started_ms"].as_u64().unwrap(),
        v2["ended_ms"].as_u64().unwrap(),
    );
    assert!(e1 <= s2 || e2 <= s1, "physics held 4 nodes at once: {v1} {v2}");

    // Cancel a running allocation: its nodes go back (the quorum releases them).
    let long = api.submit(job("bio", 4, 100.0)).await;
    api.wait_state(&long, "running", Duration::from_secs(5)).await;
    let (status, _) = api.call("DELETE", &format!("/v1/allocations/{long}"), None).await;
    assert_eq!(status, 200);
    api.wait_state(&long, "cancelled", Duration::from_secs(5)).await;
    let t0 = Instant::now();
    while api.get("/api/v1/raft/status").await["assignments"] != 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "nodes released at the quorum");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Drain: a 4-node allocation waits while a node is drained, and runs once it is undrained.
    let (status, v) = api.call("POST", "/v1/nodes/sim-001/drain", None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "drained");
    let wide = api.submit(job("bio", 4, 0.2)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(api.get(&format!("/v1/allocations/{wide}")).await["state"], "pending");
    assert_eq!(api.call("POST", "/v1/nodes/sim-001/undrain", None).await.0, 200);
    api.wait_state(&wide, "completed", Duration::from_secs(5)).await;
    assert_eq!(api.call("POST", "/v1/nodes/sim-999/drain", None).await.0, 404);

    // Weights hot-reload: validated, then used from the next cycle.
    let (status, v) = api
        .call(
            "PUT",
            "/v1/vclusters/default/weights",
            Some(json!({"priority": 1.0, "wait_tme": 0.5})),
        )
        .await;
    assert_eq!((status, v["field"].as_str()), (400, Some("wait_tme")));
    let (status, _) = api
        .call(
            "PUT",
            "/v1/vclusters/default/weights",
            Some(json!({"priority": 0.5, "wait_time": 0.5})),
        )
        .await;
    assert_eq!(status, 200);

    // vClusters: created and configured at the quorum; refusals name the key and change nothing.
    let (status, v) = api
        .call(
            "POST",
            "/v1/vclusters",
            Some(json!({"name": "interactive", "policy": "fcfs", "cycle_interval": "1s"})),
        )
        .await;
    assert_eq!(
        (status, &v["policy"], &v["cycle_interval"]),
        (201, &json!("fcfs"), &json!(1.0)),
        "{v}"
    );
    let (status, _) = api
        .call("POST", "/v1/vclusters", Some(json!({"name": "interactive"})))
        .await;
    assert_eq!(status, 409, "exists");
    let (status, v) = api
        .call(
            "PATCH",
            "/v1/vclusters/interactive",
            Some(json!({"lend_cap": 3, "cycle_interval": "5s"})),
        )
        .await;
    assert_eq!((status, v["field"].as_str()), (400, Some("lend_cap")), "{v}");
    let (status, _) = api
        .call("PATCH", "/v1/vclusters/nope", Some(json!({"lend_cap": 0.1})))
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        api.get("/v1/vclusters/interactive").await["cycle_interval"],
        1.0,
        "unchanged"
    );
    let (status, v) = api
        .call(
            "PATCH",
            "/v1/vclusters/interactive",
            Some(json!({"cycle_interval": 30})),
        )
        .await;
    assert_eq!(
        (status, &v["cycle_interval"], &v["policy"]),
        (200, &json!(30.0), &json!("fcfs")),
        "{v}"
    );
    let names = api.get("/v1/vclusters").await;
    assert!(
        names["vclusters"].as_array().unwrap().contains(&json!("interactive")),
        "{names}"
    );

    // Metrics with the seed's names.
    let (_, m) = api.call("GET", "/metrics", None).await;
    let m = m.as_str().unwrap().to_string();
    for name in [
        "lattice_scheduling_cycle_duration_seconds_count",
        "lattice_raft_commit_latency_seconds_bucket",
        "lattice_allocations_total{state=\"completed\"} 4",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics");
    }

    // The trace capture replays: every submission and completion, in rm-replay's JSONL format.
    rt.shutdown().await;
    let capture = std::fs::read_to_string(dir.join("capture.jsonl")).unwrap();
    let w = lattice_traces::parse_jsonl("capture.jsonl", &capture);
    assert_eq!(w.skipped_total(), 0, "{:?}", w.problems);
    assert_eq!(w.jobs.len(), 5);
    let completed = w.jobs.iter().filter(|j| j.runtime.is_some()).count();
    assert_eq!(completed, 4, "the cancelled one has no completion");
    // The inputs from outside the replay's world are there too, at their times: the cancel, the
    // drain, the undrain and the accepted weight change (in that order; the refused one is not).
    use lattice_traces::TraceEventKind as K;
    let changes: Vec<String> = w
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            K::Cancel { alloc } => Some(format!("cancel {alloc}")),
            K::Drain { node } => Some(format!("drain {node}")),
            K::Undrain { node } => Some(format!("undrain {node}")),
            K::Weights { vcluster, weights } => Some(format!(
                "weights {vcluster} {} {} {}",
                weights.priority, weights.wait_time, weights.fair_share
            )),
            _ => None,
        })
        .collect();
    let cancelled = w.jobs.iter().find(|j| j.runtime.is_none()).unwrap().id.clone();
    assert_eq!(
        changes,
        [
            format!("cancel {cancelled}"),
            "drain sim-001".into(),
            "undrain sim-001".into(),
            "weights default 0.5 0.5 0".into()
        ]
    );
    // And the vCluster's creation and change, replayable as they were made.
    let configs: Vec<(String, Value)> = w
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            K::VCluster { vcluster, config } if vcluster == "interactive" => {
                Some((config["policy"].as_str()?.to_string(), config["cycle_interval"].clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        configs,
        [("fcfs".to_string(), json!(1.0)), ("fcfs".to_string(), json!(30.0))]
    );
}

/// Three members on loopback: one leads and schedules; a follower answers writes with 421 naming
/// the leader; an allocation submitted to the leader runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_member_quorum_schedules_on_the_leader() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-3-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rts = common::start_quorum(&dir, 3, 4, "").await;
    let t0 = Instant::now();
    let leader = loop {
        if let Some(i) = rts.iter().position(|r| r.shared.member.is_leader()) {
            break i;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "a leader within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let follower = (leader + 1) % 3;
    let f = Api {
        base: format!("http://{}", rts[follower].rest_addr),
    };
    let t0 = Instant::now();
    loop {
        let (status, v) = f.call("POST", "/v1/allocations", Some(job("bio", 1, 0.1))).await;
        assert_eq!(status, 421, "{v}");
        if v["leader_id"] == json!(leader + 1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the follower learns the leader: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let l = Api {
        base: format!("http://{}", rts[leader].rest_addr),
    };
    let id = l.submit(job("bio", 2, 0.2)).await;
    l.wait_state(&id, "completed", Duration::from_secs(5)).await;
    // Every member applied the assignment and its release.
    let status = f.get("/api/v1/raft/status").await;
    assert_eq!(status["status"]["members"].as_object().unwrap().len(), 3, "{status}");
    for r in rts {
        r.shutdown().await;
    }
}

/// Backup, verify and restore through the API: the restore is staged and installed at restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_verify_and_restore_through_the_api() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-backup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\ncycle: 100ms\n",
        dir.display()
    );
    let boot = |first: bool| {
        let cfg = RuntimeConfig::parse("b.yaml", &text).unwrap();
        start(cfg, first)
    };
    let rt = boot(true).await.unwrap();
    let api = Api {
        base: format!("http://{}", rt.rest_addr),
    };
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        api.call("GET", "/api/v1/admin/backup/verify", None).await.0,
        404,
        "no backup yet"
    );
    let long = api.submit(job("bio", 1, 100.0)).await;
    api.wait_state(&long, "running", Duration::from_secs(5)).await;
    let (status, b) = api.call("POST", "/api/v1/admin/backup", None).await;
    assert_eq!((status, b["assignments"].as_u64()), (200, Some(1)), "{b}");
    let (status, v) = api.call("GET", "/api/v1/admin/backup/verify", None).await;
    assert_eq!((status, v["valid"].as_bool()), (200, Some(true)), "{v}");
    api.call("DELETE", &format!("/v1/allocations/{long}"), None).await;
    let t0 = Instant::now();
    while api.get("/api/v1/raft/status").await["assignments"] != 0 {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, v) = api
        .call(
            "POST",
            "/api/v1/admin/restore",
            Some(json!({"path": "/nonexistent.json"})),
        )
        .await;
    assert_eq!((status, v["field"].as_str()), (400, Some("path")));
    let (status, v) = api
        .call("POST", "/api/v1/admin/restore", Some(json!({"path": b["path"]})))
        .await;
    assert_eq!((status, v["restart_required"].as_bool()), (200, Some(true)), "{v}");
    rt.shutdown().await;
    // After the restart the quorum holds the backed-up assignment again.
    let rt = boot(false).await.unwrap();
    let api = Api {
        base: format!("http://{}", rt.rest_addr),
    };
    assert_eq!(api.get("/api/v1/raft/status").await["assignments"], 1);
    rt.shutdown().await;
}

/// DAGs: members run in dependency order; cycles and unknown refs are refused before anything is
/// queued; a failed upstream cancels `afterok` dependants; DELETE cancels the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dags_run_in_dependency_order() {
    let (rt, api, _, _) = one_member("dag", None, false).await;
    let member = |name: &str, secs: f64, deps: &[(&str, &str)]| {
        let mut j = job("bio", 1, secs);
        j["name"] = json!(name);
        j["depends_on"] = json!(
            deps.iter()
                .map(|(r, c)| json!({"ref": r, "condition": c}))
                .collect::<Vec<_>>()
        );
        j
    };
    // eval listed first: the order of the request does not matter, only the edges.
    let dag = json!({"allocations": [
        member("eval", 0.1, &[("train", "success")]),
        member("prep", 0.2, &[]),
        member("train", 0.2, &[("prep", "afterok")]),
    ]});
    let (status, v) = api.call("POST", "/v1/dags", Some(dag)).await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let ids = v["allocations"].clone();
    let t0 = Instant::now();
    loop {
        let d = api.get(&format!("/v1/dags/{id}")).await;
        if d["state"] == "completed" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{d}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut view = std::collections::BTreeMap::new();
    for name in ["prep", "train", "eval"] {
        view.insert(
            name,
            api.get(&format!("/v1/allocations/{}", ids[name].as_str().unwrap()))
                .await,
        );
    }
    let at = |name: &str, key: &str| view[name][key].as_u64().unwrap();
    assert!(at("prep", "ended_ms") <= at("train", "started_ms"));
    assert!(at("train", "ended_ms") <= at("eval", "started_ms"));
    // Each member says what it waits for; the graph gives the edges by member name.
    assert_eq!(
        view["train"]["depends_on"],
        json!([{"ref": ids["prep"], "condition": "success"}])
    );
    let g = api.get(&format!("/v1/dags/{id}/graph")).await;
    let mut edges: Vec<(String, String, String)> = g["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_str().unwrap().to_string();
            (f("from"), f("to"), f("condition"))
        })
        .collect();
    edges.sort();
    assert_eq!(
        edges,
        [
            ("prep".into(), "train".into(), "success".into()),
            ("train".into(), "eval".into(), "success".into())
        ],
        "{g}"
    );
    assert_eq!(g["allocations"].as_array().unwrap().len(), 3, "{g}");
    let (status, _) = api.call("GET", "/v1/dags/dag-999999/graph", None).await;
    assert_eq!(status, 404);

    // Refused before anything is queued.
    let before = api.get("/v1/allocations").await["allocations"]
        .as_array()
        .unwrap()
        .len();
    let cycle = json!({"allocations": [member("a", 0.1, &[("b", "success")]), member("b", 0.1, &[("a", "success")])]});
    let (status, v) = api.call("POST", "/v1/dags", Some(cycle)).await;
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("cycle"), "{v}");
    let unknown = json!({"allocations": [member("a", 0.1, &[("ghost", "success")])]});
    let (status, v) = api.call("POST", "/v1/dags", Some(unknown)).await;
    assert_eq!(
        (status, v["field"].as_str()),
        (400, Some("allocations[0].depends_on")),
        "{v}"
    );
    assert_eq!(
        api.get("/v1/allocations").await["allocations"]
            .as_array()
            .unwrap()
            .len(),
        before
    );

    // DELETE cancels the members that have not ended.
    let long = json!({"allocations": [member("x", 100.0, &[]), member("y", 0.1, &[("x", "success")])]});
    let (_, v) = api.call("POST", "/v1/dags", Some(long)).await;
    let id = v["id"].as_str().unwrap().to_string();
    let x = v["allocations"]["x"].as_str().unwrap().to_string();
    api.wait_state(&x, "running", Duration::from_secs(5)).await;
    let (status, v) = api.call("DELETE", &format!("/v1/dags/{id}"), None).await;
    assert_eq!((status, v["cancelled"].as_u64()), (200, Some(2)), "{v}");
    assert_eq!(api.get(&format!("/v1/dags/{id}")).await["state"], "cancelled");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn update_checkpoint_disable_audit_and_usage() {
    let (rt, api, _, _) = one_member("ops", None, false).await;

    // A 2 s run with a 1 s walltime would be killed; the extension lets it finish.
    let mut j = job("bio", 1, 2.0);
    j["lifecycle"]["walltime"] = json!("1s");
    let a = api.submit(j).await;
    api.wait_state(&a, "running", Duration::from_secs(5)).await;
    let path = format!("/v1/allocations/{a}");
    for (body, field) in [
        (json!({"walltime": "0"}), "walltime"),
        (json!({"walltime": "later"}), "walltime"),
        (json!({"walltime": "99999999999999d"}), "walltime"),
        (json!({"walltime": "400d"}), "walltime"),
        (json!({"telemetry": {"mode": "loud"}}), "telemetry.mode"),
        (json!({"priority": 3}), "priority"),
    ] {
        let (status, v) = api.call("PATCH", &path, Some(body.clone())).await;
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{body}: {v}");
    }
    let (status, v) = api
        .call(
            "PATCH",
            &path,
            Some(json!({"walltime": "5s", "tags": {"team": "b"}, "telemetry": {"mode": "debug"}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["walltime_s"].as_f64(), v["telemetry"].as_str()),
        (Some(5.0), Some("debug"))
    );
    assert_eq!(v["tags"]["team"], "b");
    let (status, v) = api.call("POST", &format!("{path}/checkpoint"), None).await;
    assert_eq!((status, v["checkpoints"].as_u64()), (202, Some(1)), "{v}");
    let done = api.wait_state(&a, "completed", Duration::from_secs(6)).await;
    assert_eq!(done["end_reason"], "success", "the extended walltime holds: {done}");
    assert_eq!(done["checkpoints"], 1);
    let (status, v) = api.call("POST", &format!("{path}/checkpoint"), None).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("state")), "{v}");
    let (status, _) = api.call("PATCH", &path, Some(json!({"walltime": "9s"}))).await;
    assert_eq!(status, 400, "an ended allocation does not change");

    // Disable the node under a running allocation: it is requeued and runs elsewhere; enable → ready.
    let b = api.submit(job("bio", 1, 30.0)).await;
    let run1 = api.wait_state(&b, "running", Duration::from_secs(5)).await;
    let node = run1["nodes"][0].as_str().unwrap().to_string();
    let (status, v) = api.call("POST", &format!("/v1/nodes/{node}/disable"), None).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("down")), "{v}");
    let t0 = Instant::now();
    loop {
        let v = api.get(&format!("/v1/allocations/{b}")).await;
        if v["state"] == "running" && v["nodes"][0] != node.as_str() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{b} not rescheduled off {node}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let owners = rt.shared.member.state().await.owners;
    assert!(
        !owners.contains_key(&node),
        "the disabled node was released at the quorum"
    );
    let (status, v) = api.call("POST", &format!("/v1/nodes/{node}/enable"), None).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("ready")), "{v}");
    let (status, _) = api.call("POST", "/v1/nodes/ghost/disable", None).await;
    assert_eq!(status, 404);
    api.call("DELETE", &format!("/v1/allocations/{b}"), None).await;

    // A sensitive claim: its claim and release are in the quorum's audit log.
    let mut s = job("bio", 1, 0.2);
    s["sensitive"] = json!(true);
    let c = api.submit(s).await;
    let held = api.wait_state(&c, "running", Duration::from_secs(5)).await;
    let claimed = held["nodes"][0].as_str().unwrap().to_string();
    api.wait_state(&c, "completed", Duration::from_secs(5)).await;
    let t0 = Instant::now();
    let log = loop {
        let v = api
            .get(&format!("/v1/audit/logs?allocation={c}&event=claim,release"))
            .await;
        if v["entries"].as_array().unwrap().len() == 2 {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let actions: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["claim", "release"]);
    assert_eq!(log["entries"][0]["user"], "alice");
    assert_eq!(log["chain_valid"], true);
    let by_node = api.get(&format!("/v1/audit/logs?node={claimed}")).await;
    assert_eq!(by_node["entries"].as_array().unwrap().len(), 2);
    let future = api.get("/v1/audit/logs?since=2099-01-01").await;
    assert_eq!(future["entries"], json!([]));
    let (status, v) = api.call("GET", "/v1/audit/logs?since=yesterday", None).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("since")), "{v}");

    // Usage: a 2 s run, a part of a 30 s one, a 0.2 s claim — all of tenant bio, none of "nobody".
    let u = api.get("/api/v1/tenants/bio/usage?days=1").await;
    assert!(u["allocations"].as_u64().unwrap() >= 3, "{u}");
    let hours = u["node_hours"].as_f64().unwrap();
    assert!(hours > 2.0 / 3600.0 && hours < 60.0 / 3600.0, "{u}");
    let none = api.get("/api/v1/usage?user=nobody").await;
    assert_eq!(
        (none["allocations"].as_u64(), none["node_hours"].as_f64()),
        (Some(0), Some(0.0))
    );
    let (status, v) = api.call("GET", "/api/v1/tenants/bio/usage?days=0", None).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("days")), "{v}");
    // Accounting: one record per allocation, adding up to the totals.
    let a = api.get("/v1/accounting?tenant=bio&days=1").await;
    let records = a["records"].as_array().unwrap();
    assert_eq!(records.len() as u64, a["total"]["allocations"].as_u64().unwrap(), "{a}");
    let sum: f64 = records.iter().map(|r| r["node_hours"].as_f64().unwrap()).sum();
    assert!((sum - a["total"]["node_hours"].as_f64().unwrap()).abs() < 1e-9, "{a}");
    assert!(
        records
            .iter()
            .all(|r| r["tenant"] == "bio" && r["nodes"].as_u64() >= Some(1)),
        "{a}"
    );
    assert_eq!(api.get("/v1/accounting?user=nobody").await["records"], json!([]));
    // Without a TSDB, metrics and comparisons say how to get one; diagnostics give what is known.
    let first = records[0]["id"].as_str().unwrap();
    let (status, v) = api.call("GET", &format!("/v1/allocations/{first}/metrics"), None).await;
    assert_eq!(status, 503, "{v}");
    assert!(v["error"].as_str().unwrap().contains("services.tsdb"), "{v}");
    let (status, v) = api.call("GET", &format!("/v1/compare?ids={first}"), None).await;
    assert_eq!(status, 503, "{v}");
    let (status, v) = api.call("GET", "/v1/compare?ids=", None).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("ids")), "{v}");
    let (status, d) = api
        .call("GET", &format!("/v1/allocations/{first}/diagnostics"), None)
        .await;
    assert_eq!(status, 200, "{d}");
    assert!(
        d["note"].as_str().unwrap().contains("TSDB") && d["storage"].is_object(),
        "{d}"
    );
    // Sessions: allocations whose work is a terminal; only those are sessions.
    let (status, v) = api
        .call(
            "POST",
            "/v1/sessions",
            Some(json!({"tenant": "bio", "lifecycle": {"walltime": "1h"}})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let sid = v["session_id"].as_str().unwrap().to_string();
    assert_eq!(v["allocation_id"], sid.as_str());
    let sv = api.get(&format!("/v1/sessions/{sid}")).await;
    assert_eq!(
        (
            sv["tags"]["session"].as_str(),
            sv["requested_nodes"].as_u64(),
            sv["walltime_s"].as_f64()
        ),
        (Some("true"), Some(1), Some(3600.0)),
        "{sv}"
    );
    let (status, v) = api.call("GET", &format!("/v1/sessions/{first}"), None).await;
    assert_eq!((status, v["field"].as_str()), (404, Some("id")), "not a session: {v}");
    let (status, v) = api.call("DELETE", &format!("/v1/sessions/{first}"), None).await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = api
        .call("POST", "/v1/sessions", Some(json!({"tenant": "bio", "nodes": 2})))
        .await;
    assert_eq!((status, v["field"].as_str()), (400, Some("nodes")), "{v}");
    let (status, v) = api.call("DELETE", &format!("/v1/sessions/{sid}"), None).await;
    assert_eq!(status, 200, "{v}");
    // Ended at once, or — when its start was at the quorum just then — once the quorum answered.
    let t0 = std::time::Instant::now();
    loop {
        let ended = api.get(&format!("/v1/sessions/{sid}")).await;
        if ended["ended_ms"].is_u64() {
            assert_eq!(ended["state"], "cancelled", "{ended}");
            break;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{ended}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Two concurrent claims of 3 of the 4 nodes: exactly one wins, the other is refused at once
    // with an OwnershipConflict naming the winner's nodes and user — and holds nothing, queues
    // nothing, is audited (book: "Concurrent Sensitive Claims").
    let t0 = Instant::now();
    while !(rt.shared.member.state().await.owners.is_empty()
        && api.get("/v1/nodes").await["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["state"] == "ready"))
    {
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", api.get("/v1/nodes").await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let api = std::sync::Arc::new(api);
    let claims: Vec<_> = ["carol", "dave"]
        .into_iter()
        .map(|user| {
            let api = api.clone();
            let mut c = job("bio", 3, 30.0);
            c["user"] = json!(user);
            c["sensitive"] = json!(true);
            tokio::spawn(async move { (user, api.call("POST", "/v1/allocations", Some(c)).await) })
        })
        .collect();
    let mut answers = Vec::new();
    for c in claims {
        answers.push(c.await.unwrap());
    }
    answers.sort_by_key(|(_, (status, _))| *status);
    let [(winner, (201, won)), (loser, (409, lost))] = &answers[..] else {
        panic!("one claim wins, one is refused: {answers:?}");
    };
    let won_id = won["id"].as_str().unwrap().to_string();
    let held = api.wait_state(&won_id, "running", Duration::from_secs(5)).await;
    let message = lost["error"].as_str().unwrap();
    assert!(message.starts_with("OwnershipConflict"), "{message}");
    for n in held["nodes"].as_array().unwrap() {
        assert!(message.contains(n.as_str().unwrap()), "{message} names {n}");
    }
    assert!(
        message.contains(&format!("claimed by user {winner} ({won_id})")),
        "{message}"
    );
    // The refused claim ended, holds no node at the quorum and is the only refusal in the log.
    let mine = api.get(&format!("/v1/allocations?user={loser}")).await;
    let mine = mine["allocations"].as_array().unwrap();
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(
        (mine[0]["state"].as_str(), mine[0]["end_reason"].as_str()),
        (Some("cancelled"), Some("claim_refused"))
    );
    let lost_id = mine[0]["id"].as_str().unwrap();
    let owners = rt.shared.member.state().await.owners;
    assert!(owners.values().all(|o| o != lost_id), "{owners:?}");
    let t0 = Instant::now();
    while api
        .get(&format!("/v1/audit/logs?allocation={lost_id}&event=claim_refused"))
        .await["entries"]
        .as_array()
        .unwrap()
        .len()
        != 1
    {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    api.call("DELETE", &format!("/v1/allocations/{won_id}"), None).await;
    // Auth discovery is public: with `mode: none` it says so.
    let disc = api.get("/api/v1/auth/discovery").await;
    assert_eq!(disc["mode"], "none", "{disc}");
    rt.shutdown().await;
}

/// Task groups over REST: `ID[i]` per index, at most `concurrency` running at once (measured from
/// the elements' own start and end times), `${INDEX}` in the entrypoint, a bad range refused with
/// nothing queued, the group's id cancelling what is left, and the capture holding the group once
/// so `rm-replay` reads it back as the same elements.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn task_groups_run_at_most_their_concurrency_at_once() {
    let (rt, api, dir, _) = one_member("tg", None, true).await;
    // Refused as a whole: nothing queued.
    let mut bad = job("bio", 1, 0.2);
    bad["task_group"] = json!({"range": {"start": 5, "end": 2}});
    let (status, v) = api.call("POST", "/v1/allocations", Some(bad)).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("task_group.range")), "{v}");
    let mut bad = job("bio", 1, 0.2);
    bad["task_group"] = json!({"range": {"start": 0, "end": 3}, "concurrency": 0});
    let (status, v) = api.call("POST", "/v1/allocations", Some(bad)).await;
    assert_eq!(
        (status, v["field"].as_str()),
        (400, Some("task_group.concurrency")),
        "{v}"
    );
    assert_eq!(api.get("/v1/allocations").await["allocations"], json!([]));

    // Six elements of 0.4 s on four free nodes, two at a time.
    let mut group = job("bio", 1, 0.4);
    group["entrypoint"] = json!("./sweep --config=${INDEX}");
    group["duration"] = json!("0.4s");
    group["task_group"] = json!({"range": {"start": 10, "end": 15}, "concurrency": 2});
    let (status, v) = api.call("POST", "/v1/allocations", Some(group)).await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let elements: Vec<String> = v["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    assert_eq!(elements, (10..=15).map(|i| format!("{id}[{i}]")).collect::<Vec<_>>());
    let mut spans = Vec::new();
    for (i, e) in elements.iter().enumerate() {
        let path = format!("/v1/allocations/{}", e.replace('[', "%5B").replace(']', "%5D"));
        let t0 = Instant::now();
        let v = loop {
            let v = api.get(&path).await;
            if v["state"] == "completed" {
                break v;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{e} did not complete: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(v["entrypoint"], format!("./sweep --config={}", 10 + i));
        assert_eq!(v["task_group"], json!({"group": id, "index": 10 + i, "concurrency": 2}));
        spans.push((v["started_ms"].as_u64().unwrap(), v["ended_ms"].as_u64().unwrap()));
    }
    // The most elements running at one instant (ends before starts at equal times).
    let mut edges: Vec<(u64, i32)> = spans.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0, 0);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    assert_eq!(most, 2, "two at a time on four free nodes: {spans:?}");

    // The group's id cancels every element still queued.
    let mut long = job("bio", 1, 60.0);
    long["task_group"] = json!({"range": {"start": 0, "end": 4}, "concurrency": 1});
    let (_, v) = api.call("POST", "/v1/allocations", Some(long)).await;
    let g2 = v["id"].as_str().unwrap().to_string();
    api.wait_state(&format!("{g2}%5B0%5D"), "running", Duration::from_secs(5))
        .await;
    let (status, _) = api.call("DELETE", &format!("/v1/allocations/{g2}"), None).await;
    assert_eq!(status, 200);
    for i in 0..=4 {
        let v = api.get(&format!("/v1/allocations/{g2}%5B{i}%5D")).await;
        assert_eq!(v["state"], "cancelled", "{v}");
    }

    // The capture holds each group once, with its range: rm-replay reads the same elements.
    let capture = std::fs::read_to_string(dir.join("capture.jsonl")).unwrap();
    let w = lattice_traces::parse_jsonl("capture.jsonl", &capture);
    assert_eq!(w.skipped_total(), 0, "{:?}", w.problems);
    let ids: Vec<&str> = w.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids.len(), 11, "{ids:?}");
    assert!(ids.contains(&format!("{id}[15]").as_str()), "{ids:?}");
    let tg = w.jobs[0].spec.task_group.unwrap();
    assert_eq!((tg.index, tg.concurrency), (10, Some(2)));
    rt.shutdown().await;
}

/// Tenant administration through the quorum (issue 22): create, update and delete over REST with
/// the quota fields validated; the engine uses a new hard quota from its next pass (a lowered one
/// leaves running work alone and holds new work back); every change in the administrative log; the
/// quorum's contract, not the tenants file, is what a restarted control plane uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_and_quotas_are_administered_through_the_quorum() {
    let (rt, api, _, text) = one_member("tenants", Some("physics:\n  max_nodes: 3\n"), false).await;
    // The tenants file seeds the quorum first.
    let t0 = Instant::now();
    while !api.get("/api/v1/admin/log").await.to_string().contains("tenant.seed") {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Refusals name the field and change nothing.
    for (body, field) in [
        (json!({"max_nodes": 2}), "name"),
        (json!({"name": "Chem!", "max_nodes": 2}), "name"),
        (json!({"name": "chem", "max_nodes": -1}), "max_nodes"),
        (json!({"name": "chem", "burst_allowance": 0.5}), "burst_allowance"),
        (json!({"name": "chem", "max_gpus": 2}), "max_gpus"),
    ] {
        let (status, v) = api.call("POST", "/api/v1/tenants", Some(body)).await;
        assert_eq!((status, v["field"].as_str()), (400, Some(field)), "{v}");
    }
    assert!(!api.get("/v1/tenants").await["tenants"].to_string().contains("chem"));
    let (status, v) = api
        .call(
            "POST",
            "/api/v1/tenants",
            Some(json!({"name": "chem", "max_nodes": 2, "gpu_hours_budget": 500.0})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        (
            v["quota"]["max_nodes"].as_u64(),
            v["quota"]["gpu_hours_budget"].as_f64()
        ),
        (Some(2), Some(500.0))
    );
    let (status, _) = api.call("POST", "/api/v1/tenants", Some(json!({"name": "chem"}))).await;
    assert_eq!(status, 409);

    // Weights make the pool scored: its passes evaluate the cost function (and time it).
    let (status, v) = api
        .call(
            "PUT",
            "/v1/vclusters/default/weights",
            Some(json!({"priority": 0.5, "wait_time": 0.5})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    // The new hard quota holds: two of three one-node jobs run, the third waits.
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(api.submit(job("chem", 1, 600.0)).await);
    }
    api.wait_state(&ids[0], "running", Duration::from_secs(10)).await;
    api.wait_state(&ids[1], "running", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        api.get(&format!("/v1/allocations/{}", ids[2])).await["state"],
        "pending"
    );
    // Lowered below what it holds: accepted with a warning; the running ones go on.
    let (status, v) = api
        .call("PUT", "/api/v1/tenants/chem", Some(json!({"max_nodes": 1})))
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["warning"].as_str().unwrap().contains("holds 2 nodes"), "{v}");
    assert_eq!(
        v["quota"]["gpu_hours_budget"].as_f64(),
        Some(500.0),
        "only the keys given change: {v}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in &ids[..2] {
        assert_eq!(api.get(&format!("/v1/allocations/{id}")).await["state"], "running");
    }
    // Raised: the waiting one starts at the next pass. `null` clears a key.
    let (status, v) = api
        .call(
            "PUT",
            "/api/v1/tenants/chem",
            Some(json!({"max_nodes": 3, "gpu_hours_budget": null})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["quota"]["gpu_hours_budget"].is_null() && v.get("warning").is_none(),
        "{v}"
    );
    api.wait_state(&ids[2], "running", Duration::from_secs(10)).await;
    let (status, v) = api
        .call("PUT", "/api/v1/tenants/nobody", Some(json!({"max_nodes": 1})))
        .await;
    assert_eq!(status, 404, "{v}");

    // Not deleted while it has work; deleted once it has none.
    let (status, v) = api.call("DELETE", "/api/v1/tenants/chem", None).await;
    assert_eq!(status, 409, "{v}");
    for id in &ids {
        api.call("DELETE", &format!("/v1/allocations/{id}"), None).await;
    }
    let t0 = Instant::now();
    loop {
        let (status, v) = api.call("DELETE", "/api/v1/tenants/chem", None).await;
        if status == 200 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{status} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(api.call("GET", "/api/v1/tenants/chem", None).await.0, 404);

    // The API's change to a tenant of the file outlives a restart with the same file.
    let (status, v) = api
        .call("PUT", "/api/v1/tenants/physics", Some(json!({"max_nodes": 1})))
        .await;
    assert_eq!(status, 200, "{v}");
    let log = api.get("/api/v1/admin/log").await;
    let actions: Vec<(&str, &str)> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["target"].as_str().unwrap()))
        .collect();
    // The profile seeds the quorum's vClusters, and the config file the site settings, as the
    // tenants file its tenants (concurrently with the requests here).
    assert!(actions.contains(&("vcluster.seed", "default")), "{log}");
    assert!(actions.contains(&("settings.seed", "site")), "{log}");
    let actions: Vec<(&str, &str)> = actions
        .into_iter()
        .filter(|a| a.0 != "vcluster.seed" && a.0 != "settings.seed")
        .collect();
    assert_eq!(
        actions,
        [
            ("tenant.seed", "physics"),
            ("tenant.create", "chem"),
            // The weights set above are committed at the quorum too.
            ("vcluster.weights", "default"),
            ("tenant.update", "chem"),
            ("tenant.update", "chem"),
            ("tenant.delete", "chem"),
            ("tenant.update", "physics"),
        ],
        "{log}"
    );
    let created = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "tenant.create");
    assert_eq!(created.unwrap()["user"], "dev");
    // The passes that placed chem's jobs timed their cost function.
    let exposition = api.get("/metrics").await;
    let count = exposition
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("lattice_scheduling_cost_function_duration_seconds_count{vcluster=\"default\"} "))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(count >= 1, "{exposition}");
    rt.shutdown().await;
    // Started again on the same data once the stopped member's last tasks let go of its files.
    let t0 = Instant::now();
    let rt = loop {
        match start(RuntimeConfig::parse("t.yaml", &text).unwrap(), false).await {
            Ok(rt) => break rt,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(20), "{e:#}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let api = Api {
        base: format!("http://{}", rt.rest_addr),
    };
    let t0 = Instant::now();
    loop {
        let (status, v) = api.call("GET", "/api/v1/tenants/physics", None).await;
        if status == 200 && v["quota"]["max_nodes"] == 1 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "{status} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rt.shutdown().await;
}

/// Projects as entities (issue 22): the tenants file seeds a project's contract at the quorum; a
/// project's hard max_nodes holds back only its own work (the waiting job says why), is raised and
/// lowered over REST (Raft-committed, logged), and a project with work is not deleted; refusals name
/// the field and create nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn projects_and_their_quotas_are_administered_through_the_quorum() {
    let (rt, api, _, _) = one_member(
        "projects",
        Some("physics:\n  max_nodes: 4\n  projects:\n    qcd:\n      max_nodes: 1\n"),
        false,
    )
    .await;
    let t0 = Instant::now();
    while !api.get("/api/v1/admin/log").await.to_string().contains("project.seed") {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Refusals name the field and create nothing.
    for (path, body, status, field) in [
        ("/api/v1/tenants/physics/projects", json!({"max_nodes": 2}), 400, "name"),
        ("/api/v1/tenants/physics/projects", json!({"name": "X!"}), 400, "name"),
        (
            "/api/v1/tenants/physics/projects",
            json!({"name": "x", "fair_share_target": 0.2}),
            400,
            "fair_share_target",
        ),
        (
            "/api/v1/tenants/physics/projects",
            json!({"name": "x", "max_nodes": -1}),
            400,
            "max_nodes",
        ),
        ("/api/v1/tenants/nobody/projects", json!({"name": "x"}), 404, "id"),
    ] {
        let (s, v) = api.call("POST", path, Some(body)).await;
        assert_eq!(s, status, "{v}");
        if s == 400 {
            assert_eq!(v["field"].as_str(), Some(field), "{v}");
        }
    }
    let listed = api.get("/api/v1/tenants/physics/projects").await;
    let names: Vec<&str> = listed["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["qcd"], "{listed}");
    assert!(!api.get("/api/v1/admin/log").await.to_string().contains("physics/x"));

    // qcd may hold 1 node: its second job waits, saying why, while astro's runs beside it.
    let in_project = |p: &str| {
        let mut j = job("physics", 1, 600.0);
        j["project"] = json!(p);
        j
    };
    let q1 = api.submit(in_project("qcd")).await;
    let q2 = api.submit(in_project("qcd")).await;
    let a1 = api.submit(in_project("astro")).await;
    api.wait_state(&q1, "running", Duration::from_secs(10)).await;
    api.wait_state(&a1, "running", Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v = api.get(&format!("/v1/allocations/{q2}")).await;
    assert_eq!(v["state"], "pending", "{v}");
    assert!(v.to_string().contains("quota headroom"), "{v}");
    let view = api.get("/api/v1/tenants/physics/projects/qcd").await;
    assert_eq!(
        (view["nodes_held"].as_u64(), view["pending"].as_u64()),
        (Some(1), Some(1)),
        "{view}"
    );

    // Raised: the waiting one starts at the next pass. Lowered below use: a warning; both go on.
    let (s, v) = api
        .call(
            "PUT",
            "/api/v1/tenants/physics/projects/qcd",
            Some(json!({"max_nodes": 2, "gpu_hours_budget": 10.0})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    api.wait_state(&q2, "running", Duration::from_secs(10)).await;
    let (s, v) = api
        .call(
            "PUT",
            "/api/v1/tenants/physics/projects/qcd",
            Some(json!({"max_nodes": 1})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["warning"].as_str().unwrap().contains("holds 2 nodes"), "{v}");
    assert_eq!(
        v["quota"]["gpu_hours_budget"].as_f64(),
        Some(10.0),
        "only the keys given change: {v}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in [&q1, &q2] {
        assert_eq!(api.get(&format!("/v1/allocations/{id}")).await["state"], "running");
    }
    let tenant = api.get("/v1/tenants/physics").await;
    assert_eq!(
        tenant["projects"].as_array().unwrap().len(),
        2,
        "qcd and astro: {tenant}"
    );

    // A project with work is not deleted; without, it is, and its contract is gone.
    let (s, v) = api.call("DELETE", "/api/v1/tenants/physics/projects/qcd", None).await;
    assert_eq!(s, 409, "{v}");
    assert!(
        api.get("/api/v1/admin/log")
            .await
            .to_string()
            .contains("project.update")
    );
    for id in [&q1, &q2] {
        api.call("DELETE", &format!("/v1/allocations/{id}"), None).await;
    }
    let t0 = Instant::now();
    loop {
        let (s, v) = api.call("DELETE", "/api/v1/tenants/physics/projects/qcd", None).await;
        if s == 200 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{s} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, _) = api
        .call(
            "PUT",
            "/api/v1/tenants/physics/projects/qcd",
            Some(json!({"max_nodes": 3})),
        )
        .await;
    assert_eq!(s, 404, "a deleted project is not updated");
    let log = api.get("/api/v1/admin/log").await;
    let actions: Vec<(&str, &str)> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["target"].as_str().unwrap()))
        .filter(|(a, _)| a.starts_with("project."))
        .collect();
    assert_eq!(
        actions,
        [
            ("project.seed", "physics/qcd"),
            ("project.update", "physics/qcd"),
            ("project.update", "physics/qcd"),
            ("project.delete", "physics/qcd"),
        ],
        "{log}"
    );
    rt.shutdown().await;
}

/// The book's filters: nodes by state and by the vCluster and tenant of what runs on them; DAGs by
/// their members' tenant and user and by state; the audit log by event type, data path and tenant
/// (also at the admin guide's `/api/v1/audit`, `from` and `scope=sensitive`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_dags_and_audit_entries_are_selected_by_the_books_filters() {
    let (rt, api, _, _) = one_member("filters", None, false).await;
    let names = |v: &Value, list: &str, key: &str| -> Vec<String> {
        let mut n: Vec<String> = v[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x[key].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    let (status, v) = api.call("POST", "/v1/vclusters", Some(json!({"name": "ml"}))).await;
    assert_eq!(status, 201, "{v}");
    // physics/alice on the default vCluster, bio/bob on `ml`: one node each.
    let a = api.submit(job("physics", 1, 60.0)).await;
    let mut b = job("bio", 1, 60.0);
    b["user"] = json!("bob");
    b["vcluster"] = json!("ml");
    let b = api.submit(b).await;
    let a_nodes = api.wait_state(&a, "running", Duration::from_secs(10)).await["nodes"].clone();
    let b_nodes = api.wait_state(&b, "running", Duration::from_secs(10)).await["nodes"].clone();
    let a_node = a_nodes[0].as_str().unwrap().to_string();
    let b_node = b_nodes[0].as_str().unwrap().to_string();

    let v = api.get("/v1/nodes?tenant=physics").await;
    assert_eq!(names(&v, "nodes", "name"), [a_node.as_str()], "{v}");
    assert_eq!(
        (v["nodes"][0]["vcluster"].as_str(), v["nodes"][0]["tenant"].as_str()),
        (Some("default"), Some("physics"))
    );
    let v = api.get("/v1/nodes?vcluster=ml").await;
    assert_eq!(names(&v, "nodes", "name"), [b_node.as_str()], "{v}");
    assert_eq!(
        api.get("/v1/nodes?vcluster=ml&tenant=physics").await["nodes"],
        json!([])
    );
    // Ownership is not a state: all four are ready; the free ones name no tenant.
    let ready = api.get("/v1/nodes?state=ready").await;
    assert_eq!(ready["nodes"].as_array().unwrap().len(), 4, "{ready}");
    let unowned = ready["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n.get("tenant").is_none())
        .count();
    assert_eq!(unowned, 2, "{ready}");
    api.call("POST", &format!("/v1/nodes/{b_node}/drain"), None).await;
    let v = api.get("/v1/nodes?state=draining").await;
    assert_eq!(names(&v, "nodes", "name"), [b_node.as_str()], "{v}");
    api.call("POST", &format!("/v1/nodes/{b_node}/undrain"), None).await;
    let (status, v) = api.call("GET", "/v1/nodes?colour=red", None).await;
    assert_eq!(status, 400, "an unknown filter is refused: {v}");

    // DAGs: alice's (done at once) and bob's (still running).
    let dag = |tenant: &str, user: &str, secs: f64| {
        let mut m = job(tenant, 1, secs);
        m["user"] = json!(user);
        m["name"] = json!("only");
        json!({"allocations": [m]})
    };
    let (status, v) = api.call("POST", "/v1/dags", Some(dag("physics", "alice", 0.0))).await;
    assert_eq!(status, 201, "{v}");
    let alice_dag = v["id"].as_str().unwrap().to_string();
    let (status, v) = api.call("POST", "/v1/dags", Some(dag("bio", "bob", 60.0))).await;
    assert_eq!(status, 201, "{v}");
    let bob_dag = v["id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    while api.get(&format!("/v1/dags/{alice_dag}")).await["state"] != "completed" {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(names(&api.get("/v1/dags").await, "dags", "id").len(), 2);
    let v = api.get("/v1/dags?tenant=bio").await;
    assert_eq!(names(&v, "dags", "id"), [bob_dag.as_str()], "{v}");
    assert_eq!(
        (v["dags"][0]["tenant"].as_str(), v["dags"][0]["user"].as_str()),
        (Some("bio"), Some("bob"))
    );
    assert_eq!(
        names(&api.get("/v1/dags?user=alice").await, "dags", "id"),
        [alice_dag.as_str()]
    );
    assert_eq!(
        names(&api.get("/v1/dags?state=completed").await, "dags", "id"),
        [alice_dag.as_str()]
    );
    assert_eq!(api.get("/v1/dags?user=alice&state=running").await["dags"], json!([]));

    // Audit: two sensitive claims, one reading data under s3://sensitive-data/subject-001/.
    api.call("DELETE", &format!("/v1/allocations/{b}"), None).await;
    api.call("DELETE", &format!("/v1/allocations/{a}"), None).await;
    let mut c = job("physics", 1, 0.2);
    c["sensitive"] = json!(true);
    c["data"] = json!({"mounts": [{"source": "s3://sensitive-data/subject-001/scan.h5", "target": "/in"}]});
    let c = api.submit(c).await;
    let mut d = job("bio", 1, 0.2);
    d["user"] = json!("bob");
    d["sensitive"] = json!(true);
    let d = api.submit(d).await;
    api.wait_state(&c, "completed", Duration::from_secs(10)).await;
    api.wait_state(&d, "completed", Duration::from_secs(10)).await;
    let t0 = Instant::now();
    while api.get("/v1/audit/logs?event=release").await["entries"]
        .as_array()
        .unwrap()
        .len()
        < 2
    {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let allocs = |v: &Value| -> Vec<(String, String)> {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["alloc"].as_str().unwrap().to_string(),
                    e["action"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let claims = allocs(&api.get("/v1/audit/logs?event=claim").await);
    assert_eq!(
        claims,
        [(c.clone(), "claim".to_string()), (d.clone(), "claim".to_string())]
    );
    let both = allocs(&api.get("/v1/audit/logs?event=claim,release").await);
    assert_eq!(both.len(), 4, "{both:?}");
    let under = allocs(
        &api.get("/v1/audit/logs?data_path=s3://sensitive-data/subject-001/&event=claim,release")
            .await,
    );
    assert_eq!(under, [(c.clone(), "claim".into()), (c.clone(), "release".into())]);
    // A path is matched by whole components: a sibling's prefix is not under it.
    assert_eq!(
        api.get("/v1/audit/logs?data_path=s3://sensitive-data/subject-00").await["entries"],
        json!([])
    );
    let bio = api
        .get("/api/v1/audit?tenant=bio&from=2020-01-01&scope=sensitive")
        .await;
    assert!(
        !allocs(&bio).is_empty() && allocs(&bio).iter().all(|(x, _)| *x == d),
        "{bio}"
    );
    assert_eq!(bio["chain_valid"], true);
    let (status, v) = api.call("GET", "/api/v1/audit?scope=everything", None).await;
    assert_eq!((status, v["field"].as_str()), (400, Some("scope")), "{v}");
    rt.shutdown().await;
}
