//! Chaos (the seed's "leader election under load"): a 3-member quorum on loopback, a client
//! submitting 50 allocations while the leader is killed. A new leader is elected within 5 s, no
//! acknowledged submission is lost (the queue is mirrored to a majority before the acknowledgement),
//! and every acknowledged allocation eventually completes under the new leader, with its id.

mod common;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn call(method: &'static str, url: String, body: Option<Value>) -> Result<(u16, Value), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut resp = match (method, body) {
        ("POST", Some(b)) => agent.post(&url).send_json(b),
        _ => agent.get(&url).call(),
    }
    .map_err(|e| e.to_string())?;
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    Ok((
        resp.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// The REST address of the member that says it leads, if any.
fn leader_of(rest: &[String]) -> Option<String> {
    rest.iter()
        .find(
            |r| matches!(call("GET", format!("http://{r}/healthz"), None), Ok((200, v)) if v["raft_state"] == "Leader"),
        )
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_while_submitting_loses_no_acknowledged_allocation() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut rts: Vec<Option<lattice_runtime::Running>> = common::start_quorum(&dir, 3, 8, "")
        .await
        .into_iter()
        .map(Some)
        .collect();
    let rest: Vec<String> = rts.iter().map(|r| r.as_ref().unwrap().rest_addr.to_string()).collect();
    let t0 = Instant::now();
    let first = loop {
        if let Some(i) = rts.iter().position(|r| r.as_ref().unwrap().shared.member.is_leader()) {
            break i;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "a first leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // The client: 50 submissions, each retried (against whoever leads) until acknowledged.
    let acked = Arc::new(AtomicUsize::new(0));
    let client = {
        let rest = rest.clone();
        let acked = acked.clone();
        tokio::task::spawn_blocking(move || {
            let mut ids = Vec::new();
            let mut refused = 0;
            for i in 0..50 {
                let job = json!({"tenant": "bio", "entrypoint": "sleep 0.3", "resources": {"nodes": 1},
                                 "lifecycle": {"walltime": "1m"}, "tags": {"n": i.to_string()}});
                let t = Instant::now();
                loop {
                    assert!(
                        t.elapsed() < Duration::from_secs(30),
                        "submission {i} never acknowledged"
                    );
                    let Some(l) = leader_of(&rest) else {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    };
                    match call("POST", format!("http://{l}/v1/allocations"), Some(job.clone())) {
                        Ok((201, v)) => {
                            ids.push(v["id"].as_str().unwrap().to_string());
                            acked.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        // Not acknowledged (dying leader, follower, no majority): try again.
                        _ => {
                            refused += 1;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            }
            (ids, refused)
        })
    };

    // Kill the leader mid-stream.
    while acked.load(Ordering::SeqCst) < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed = rts[first].take().unwrap();
    let killed_at = Instant::now();
    killed.shutdown().await;
    let new_leader = loop {
        if let Some(i) = rts
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.shared.member.is_leader()))
        {
            break i;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(5), "a new leader within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let election = killed_at.elapsed();
    let (ids, refused) = client.await.unwrap();
    assert_eq!(ids.len(), 50);
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), 50, "ids are never reused across the fail-over: {ids:?}");

    // Every acknowledged allocation completes under the new leader, under its id.
    let base = format!("http://{}", rest[new_leader]);
    let t0 = Instant::now();
    for id in &ids {
        loop {
            let (status, v) = {
                let url = format!("{base}/v1/allocations/{id}");
                tokio::task::spawn_blocking(move || call("GET", url, None))
                    .await
                    .unwrap()
                    .unwrap()
            };
            if v["state"] == "completed" {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{id} lost or stuck after the fail-over: {status} {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    eprintln!(
        "new leader after {election:?}; {refused} submission attempts refused during the fail-over; all 50 acknowledged allocations completed"
    );
    for r in rts.into_iter().flatten() {
        r.shutdown().await;
    }
}

/// An operator's drain and a vCluster's weights are quorum state: the leader that took them is
/// killed, and the new leader still keeps the node drained (nothing is placed there) until it is
/// undrained, and schedules with the weights. A drain or undrain the node's state refuses records
/// nothing; weights sent to a follower change nothing there and answer so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_and_weights_outlive_the_leader_that_took_them() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-drain-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut rts: Vec<Option<lattice_runtime::Running>> = common::start_quorum(&dir, 3, 3, "")
        .await
        .into_iter()
        .map(Some)
        .collect();
    let rest: Vec<String> = rts.iter().map(|r| r.as_ref().unwrap().rest_addr.to_string()).collect();
    let t0 = Instant::now();
    let first = loop {
        if let Some(i) = rts.iter().position(|r| r.as_ref().unwrap().shared.member.is_leader()) {
            break i;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "a first leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let base = format!("http://{}", rest[first]);
    // Undraining a node that is not drained is refused, and records nothing at the quorum.
    let (status, v) = common::http("POST", format!("{base}/v1/nodes/sim-001/undrain"), Some(json!({}))).await;
    assert_eq!(status, 400, "{v}");
    let shared = rts[first].as_ref().unwrap().shared.clone();
    assert!(
        shared.member.read(|q| q.node_admin.is_empty()).await,
        "nothing recorded"
    );
    let (status, v) = common::http("POST", format!("{base}/v1/nodes/sim-001/drain"), Some(json!({}))).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("drained")), "{v}");
    // Weights sent to a follower: refused (naming the leader), nothing recorded, nothing changed there.
    let follower = (first + 1) % 3;
    let weights = json!({"priority": 0.7, "wait_time": 0.2, "fair_share": 0.1});
    let before = rts[follower]
        .as_ref()
        .unwrap()
        .shared
        .control
        .lock()
        .await
        .vcluster_view("default");
    let (status, v) = common::http(
        "PUT",
        format!("http://{}/v1/vclusters/default/weights", rest[follower]),
        Some(weights.clone()),
    )
    .await;
    assert_eq!(status, 421, "{v}");
    assert!(shared.member.read(|q| q.weights.is_empty()).await, "nothing recorded");
    let after = rts[follower]
        .as_ref()
        .unwrap()
        .shared
        .control
        .lock()
        .await
        .vcluster_view("default");
    assert_eq!(before, after, "the follower's scheduler is unchanged");
    // The leader commits them, and schedules with them.
    let (status, v) = common::http("PUT", format!("{base}/v1/vclusters/default/weights"), Some(weights)).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = common::http("GET", format!("{base}/v1/vclusters/default"), None).await;
    assert_eq!((status, v["weights"]["priority"].as_f64()), (200, Some(0.7)), "{v}");
    // A vCluster created, and the default's configuration changed: at the quorum too.
    let ml = json!({"name": "ml", "policy": "bin-pack", "cycle_interval": "15s", "lend_cap": 0.25});
    let (status, v) = common::http("POST", format!("{base}/v1/vclusters"), Some(ml)).await;
    assert_eq!(status, 201, "{v}");
    let change = json!({"reference_wait": "2h", "slo_wait_target": "4h"});
    let (status, v) = common::http("PATCH", format!("{base}/v1/vclusters/default"), Some(change)).await;
    assert_eq!(status, 200, "{v}");
    let (_, before_ml) = common::http("GET", format!("{base}/v1/vclusters/ml"), None).await;
    let (_, before_default) = common::http("GET", format!("{base}/v1/vclusters/default"), None).await;
    // Site settings: refused by a follower and for a bad key (nothing changes anywhere), committed
    // by the leader.
    let settings = json!({"agents.boot_timeout": "15m", "agents.boot_timeout_by_kind.H200": "20m",
                          "sensitive.wipe_timeout": 2400});
    let (_, seeded) = common::http("GET", format!("{base}/v1/config"), None).await;
    assert_eq!(seeded["agents.boot_timeout"], 600.0, "the config file's: {seeded}");
    let (status, v) = common::http(
        "PATCH",
        format!("http://{}/v1/config", rest[follower]),
        Some(settings.clone()),
    )
    .await;
    assert_eq!(status, 421, "{v}");
    let mut bad = settings.clone();
    bad["agents.boot_timeout_by_kind"] = json!("1m");
    let (status, v) = common::http("PATCH", format!("{base}/v1/config"), Some(bad)).await;
    assert_eq!(
        (status, v["field"].as_str()),
        (400, Some("agents.boot_timeout_by_kind")),
        "{v}"
    );
    let held = shared.member.read(|q| q.settings.clone()).await;
    assert!(
        held.is_empty() || held.get("agents.boot_timeout") == Some(&600_000),
        "nothing recorded: {held:?}"
    );
    let (_, unchanged) = common::http("GET", format!("{base}/v1/config"), None).await;
    assert_eq!(unchanged, seeded);
    let (status, v) = common::http("PATCH", format!("{base}/v1/config"), Some(settings)).await;
    assert_eq!(
        (status, v["agents.boot_timeout_by_kind.H200"].as_f64()),
        (200, Some(1200.0)),
        "{v}"
    );
    let (_, before_settings) = common::http("GET", format!("{base}/v1/config"), None).await;

    let killed = rts[first].take().unwrap();
    let killed_at = Instant::now();
    killed.shutdown().await;
    let next = loop {
        if let Some(i) = rts
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.shared.member.is_leader()))
        {
            break i;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(10), "a new leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let base = format!("http://{}", rest[next]);
    // The new leader serves once it has taken over; the node is still drained there.
    let t0 = Instant::now();
    loop {
        let (status, v) = common::http("GET", format!("{base}/v1/nodes/sim-001"), None).await;
        if status == 200 {
            assert_eq!(v["state"], "drained", "the drain outlived its leader: {v}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the new leader serves: {status} {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The weights came along: the new leader schedules with the committed ones.
    let (status, v) = common::http("GET", format!("{base}/v1/vclusters/default"), None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (
            v["weights"]["priority"].as_f64(),
            v["weights"]["wait_time"].as_f64(),
            v["weights"]["fair_share"].as_f64(),
            v["weights"]["energy"].as_f64()
        ),
        (Some(0.7), Some(0.2), Some(0.1), Some(0.0)),
        "{v}"
    );
    // So did the configurations, exactly.
    let (_, after_ml) = common::http("GET", format!("{base}/v1/vclusters/ml"), None).await;
    let (_, after_default) = common::http("GET", format!("{base}/v1/vclusters/default"), None).await;
    assert_eq!(after_ml, before_ml);
    assert_eq!(after_default, before_default);
    assert_eq!(
        (&after_ml["policy"], &after_ml["cycle_interval"]),
        (&json!("bin-pack"), &json!(15.0))
    );
    assert_eq!(after_default["reference_wait"], 7200.0);
    // And the site settings: the new leader's controller times boots and wipes with them.
    let (_, after_settings) = common::http("GET", format!("{base}/v1/config"), None).await;
    assert_eq!(after_settings, before_settings);
    assert_eq!(
        (
            after_settings["agents.boot_timeout"].as_f64(),
            after_settings["sensitive.wipe_timeout"].as_f64()
        ),
        (Some(900.0), Some(2400.0))
    );
    {
        let c = rts[next].as_ref().unwrap().shared.control.lock().await;
        assert_eq!(c.ctl.node_boot.default, Some(lattice_engine::Duration::from_mins(15)));
        assert_eq!(
            c.ctl.node_boot.by_kind.get("H200"),
            Some(&lattice_engine::Duration::from_mins(20))
        );
        assert_eq!(c.ctl.wipe_timeout, Some(lattice_engine::Duration::from_mins(40)));
    }
    // Three one-node allocations on the two nodes left: none is placed on the drained node.
    let mut ids = Vec::new();
    for _ in 0..3 {
        let job = json!({"tenant": "bio", "entrypoint": "sleep 0.5", "resources": {"nodes": 1},
                         "lifecycle": {"walltime": "1m"}});
        let (status, v) = common::http("POST", format!("{base}/v1/allocations"), Some(job)).await;
        assert_eq!(status, 201, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let t0 = Instant::now();
    for id in &ids {
        loop {
            let (_, v) = common::http("GET", format!("{base}/v1/allocations/{id}"), None).await;
            let nodes: Vec<&str> = v["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .collect();
            assert!(!nodes.contains(&"sim-001"), "{id} placed on the drained node: {v}");
            if v["state"] == "completed" {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "{id} did not complete: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The remaining follower serves reads: it forwards them to the new leader (naming it), a
    // stream too, and answers what the leader does.
    let other = (0..3).find(|&i| i != first && i != next).unwrap();
    for path in [
        format!("/v1/allocations/{}", ids[0]),
        "/v1/allocations".to_string(),
        "/v1/vclusters/ml".to_string(),
        format!("/v1/allocations/{}/logs/stream?stream=stdout", ids[0]),
    ] {
        let (status, served_by, body) = forwarded_get(format!("http://{}{path}", rest[other])).await;
        assert_eq!(status, 200, "{path} via a follower: {body}");
        assert_eq!(
            served_by.as_deref(),
            Some(base.as_str()),
            "{path} was served by the leader"
        );
        let (_, at_leader, direct) = forwarded_get(format!("{base}{path}")).await;
        assert_eq!(at_leader, None, "the leader serves {path} itself");
        assert_eq!(body, direct, "{path}: the follower relays the leader's answer");
    }
    // Writes are not forwarded: a follower names the leader's URL, which clients follow.
    let (status, v) = common::http(
        "POST",
        format!("http://{}/v1/nodes/sim-001/undrain", rest[other]),
        Some(json!({})),
    )
    .await;
    assert_eq!((status, v["leader_url"].as_str()), (421, Some(base.as_str())), "{v}");
    let (status, v) = common::http("POST", format!("{base}/v1/nodes/sim-001/undrain"), Some(json!({}))).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("ready")), "{v}");
    let shared = rts[next].as_ref().unwrap().shared.clone();
    assert!(
        shared.member.read(|q| q.node_admin.is_empty()).await,
        "the undrain lifted the order"
    );
    for r in rts.into_iter().flatten() {
        r.shutdown().await;
    }
}

/// A GET: (status, the `x-lattice-served-by` header, the body's text).
async fn forwarded_get(url: String) -> (u16, Option<String>, String) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let mut r = agent.get(&url).call().unwrap();
        let served_by = r
            .headers()
            .get("x-lattice-served-by")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (r.status().as_u16(), served_by, text)
    })
    .await
    .unwrap()
}

/// What an agent discovers where the inventory leaves GPUs, cores and memory unset is recorded at
/// the quorum at its registration: the node is scheduled with it there, and the member that starts
/// again on the same data (a new leader's case: a fresh control plane) schedules it alike before
/// the agent registers again. A node whose inventory sets them keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_capabilities_are_recorded_at_the_quorum() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-discovered-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let inv = dir.join("inventory.yaml");
    std::fs::write(
        &inv,
        "nodes:\n  - name: open-1\n  - name: set-1\n    gpu_count: 0\n    cpu_cores: 8\n    memory_gb: 64\n",
    )
    .unwrap();
    let yaml = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\ninventory: {}\ncycle: 100ms\n",
        dir.display(),
        inv.display()
    );
    let node = |base: String, name: &'static str| async move {
        let (status, v) = common::http("GET", format!("{base}/v1/nodes/{name}"), None).await;
        assert_eq!(status, 200, "{v}");
        v
    };
    let rt = common::start_leader(&yaml).await;
    let base = format!("http://{}", rt.rest_addr);
    let h200 = json!({"capabilities": {"cpu_cores": 16, "memory_gib": 125.9, "gpu_count": 1,
                                       "gpu_model": "NVIDIA H200", "features": []}});
    for n in ["open-1", "set-1"] {
        let (status, v) = common::http("POST", format!("{base}/v1/nodes/{n}/register"), Some(h200.clone())).await;
        assert_eq!(status, 200, "{v}");
    }
    let v = node(base.clone(), "open-1").await;
    assert_eq!(
        (v["gpu_count"].as_u64(), v["gpu_type"].as_str()),
        (Some(1), Some("H200")),
        "{v}"
    );
    assert_eq!(
        (v["cpu_cores"].as_u64(), v["memory_gb"].as_u64()),
        (Some(16), Some(128)),
        "{v}"
    );
    let recorded = rt.shared.member.read(|q| q.discovered.clone()).await;
    assert_eq!(
        recorded.keys().collect::<Vec<_>>(),
        ["open-1"],
        "set-1's inventory sets everything"
    );
    let v = node(base.clone(), "set-1").await;
    assert_eq!(v["gpu_count"].as_u64(), Some(0), "{v}");
    rt.shutdown().await;

    let rt = common::start_leader(&yaml).await;
    let base = format!("http://{}", rt.rest_addr);
    let t0 = Instant::now();
    loop {
        let (status, v) = common::http("GET", format!("{base}/v1/nodes/open-1"), None).await;
        if status == 200 {
            assert_eq!(
                (v["gpu_count"].as_u64(), v["gpu_type"].as_str()),
                (Some(1), Some("H200")),
                "{v}"
            );
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{status} {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
