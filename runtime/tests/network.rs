//! Network domains on the runtime (book: "Network Domains"): allocations of a tenant naming the same
//! domain share a VNI, a multi-node allocation without one gets its own, a new domain that finds the
//! pool exhausted stays Pending (`vni_pool_exhausted`) and starts once an empty domain's grace period
//! frees a VNI; each allocation on a VNI gets a CXI service from the fabric manager (a local stand-in
//! here), revoked when it ends.

mod common;

use axum::extract::{Path, State};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use common::http;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Fabric {
    created: Mutex<Vec<Value>>,
    revoked: Mutex<Vec<String>>,
}

async fn create(State(f): State<Arc<Fabric>>, Json(b): Json<Value>) -> Json<Value> {
    let mut c = f.created.lock().unwrap();
    let s = json!({"id": format!("cxi-{}", c.len() + 1), "vni": b["vni"], "nodes": b["nodes"], "name": b["name"]});
    c.push(s.clone());
    Json(s)
}

async fn auth(Path(id): Path<String>) -> Json<Value> {
    Json(json!({"auth_key": format!("key-{id}")}))
}

async fn revoke(State(f): State<Arc<Fabric>>, Path(id): Path<String>) -> Json<Value> {
    f.revoked.lock().unwrap().push(id);
    Json(json!({}))
}

/// The fabric manager's stand-in: what it created and revoked, and its URL.
async fn fabric_manager() -> (Arc<Fabric>, String) {
    let fabric = Arc::new(Fabric::default());
    let app = Router::new()
        .route("/fabric/cxi/services", post(create))
        .route("/fabric/cxi/services/{id}", delete(revoke))
        .route("/fabric/cxi/services/{id}/auth", get(auth))
        .with_state(fabric.clone());
    let url = common::serve_stand_in(app).await;
    (fabric, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_share_vnis_exhaustion_waits_and_cxi_services_follow_allocations() {
    let (fabric, fabric_url) = fabric_manager().await;

    let dir = std::env::temp_dir().join(format!("lattice-runtime-network-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 6\ncycle: 100ms\nnetwork:\n  vni_pool_start: 1000\n  vni_pool_end: 1001\n  grace: 1s\nservices:\n  fabric:\n    url: {fabric_url}\n    timeout: 2s\n",
        dir.display()
    );
    let rt = common::start_leader(&text).await;
    let base = format!("http://{}", rt.rest_addr);
    let submit = |nodes: u32, domain: Option<&str>, secs: &str| {
        let mut b = json!({"tenant": "physics", "resources": {"nodes": nodes}, "duration": secs,
                           "lifecycle": {"walltime": "1m"}});
        if let Some(d) = domain {
            b["connectivity"] = json!({"network_domain": d});
        }
        let url = format!("{base}/v1/allocations");
        async move {
            let (s, v) = http("POST", url, Some(b)).await;
            assert_eq!(s, 201, "{v}");
            v["id"].as_str().unwrap().to_string()
        }
    };
    let get = |id: String| {
        let url = format!("{base}/v1/allocations/{id}");
        async move { http("GET", url, None).await.1 }
    };
    let a = submit(2, Some("ml"), "2s").await;
    let b = submit(1, Some("ml"), "2s").await;
    let c = submit(2, None, "2s").await;
    let single = submit(1, None, "1s").await;
    let t0 = Instant::now();
    loop {
        let (va, vb, vc) = (get(a.clone()).await, get(b.clone()).await, get(c.clone()).await);
        if [&va, &vb, &vc].iter().all(|v| v["state"] == "running") {
            assert_eq!(va["vni"], vb["vni"], "one domain, one VNI: {va} {vb}");
            assert_ne!(va["vni"], vc["vni"], "{vc}");
            assert!(vc["vni"].is_u64(), "a multi-node job gets a domain of its own: {vc}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{va} {vb} {vc}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        get(single.clone()).await["vni"].is_null(),
        "a single-node job needs no VNI"
    );
    // The pool (2 VNIs) is used up: a new domain waits, Pending with the reason.
    let d = submit(1, Some("other"), "1s").await;
    let t0 = Instant::now();
    loop {
        let v = get(d.clone()).await;
        if v["last_rejection"]
            .as_str()
            .is_some_and(|r| r.contains("vni_pool_exhausted"))
        {
            assert_eq!(v["state"], "pending", "{v}");
            assert!(v["last_rejection"].as_str().unwrap().contains("(2/2 in use)"), "{v}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, domains) = http("GET", format!("{base}/v1/network/domains"), None).await;
    assert_eq!(domains["vni_pool"], json!({"total": 2, "in_use": 2}), "{domains}");
    let ml = domains["domains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "ml")
        .unwrap()
        .clone();
    assert_eq!(ml["allocations"], json!([a, b]), "{domains}");
    // When a, b and c end, their domains drain for the grace period (1 s), then d gets a VNI and runs.
    let t0 = Instant::now();
    let v = loop {
        let v = get(d.clone()).await;
        if v["ended_ms"].is_u64() {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(v["end_reason"], "success", "{v}");
    // Every allocation on a VNI had a CXI service on its nodes, revoked at its end.
    let created = fabric.created.lock().unwrap().clone();
    let names: Vec<&str> = created.iter().map(|s| s["name"].as_str().unwrap()).collect();
    for x in [&a, &b, &c, &d] {
        assert!(names.contains(&x.as_str()), "{x}: {created:?}");
    }
    assert!(!names.contains(&single.as_str()));
    let svc_a = created.iter().find(|s| s["name"] == a.as_str()).unwrap();
    assert_eq!(svc_a["nodes"].as_array().unwrap().len(), 2);
    let t0 = Instant::now();
    while fabric.revoked.lock().unwrap().len() < 4 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{:?}",
            fabric.revoked.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rt.shutdown().await;
}

/// A leader change changes no running allocation's network: the VNI and the CXI service are
/// recorded with its start, and a new leader keeps both (it creates no second service, and revokes
/// the recorded one at the end), though its fresh pool would hand out another VNI first. Nor a
/// domain's own grace period (`lattice admin network set-grace`): set at the first leader, the new
/// one keeps the emptied domain's VNI for it while domains on the default grace go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_allocation_keeps_its_vni_and_cxi_service_across_a_fail_over() {
    let (fabric, fabric_url) = fabric_manager().await;
    let dir = std::env::temp_dir().join(format!("lattice-runtime-vni-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let extra = format!(
        "network:\n  vni_pool_start: 1000\n  vni_pool_end: 1009\n  grace: 1s\nservices:\n  fabric:\n    url: {fabric_url}\n    timeout: 2s\n"
    );
    let mut rts: Vec<Option<lattice_runtime::Running>> = common::start_quorum(&dir, 3, 4, &extra)
        .await
        .into_iter()
        .map(Some)
        .collect();
    let leader = |rts: &[Option<lattice_runtime::Running>]| {
        rts.iter()
            .position(|r| r.as_ref().is_some_and(|r| r.shared.member.is_leader()))
    };
    let t0 = Instant::now();
    let first = loop {
        if let Some(i) = leader(&rts) {
            break i;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "a first leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let rest: Vec<String> = rts.iter().map(|r| r.as_ref().unwrap().rest_addr.to_string()).collect();
    let submit = |base: String, nodes: u32, domain: Option<&str>, secs: &str| {
        let mut b = json!({"tenant": "physics", "resources": {"nodes": nodes}, "duration": secs,
                           "lifecycle": {"walltime": "5m"}});
        if let Some(d) = domain {
            b["connectivity"] = json!({"network_domain": d});
        }
        async move {
            let (s, v) = http("POST", format!("{base}/v1/allocations"), Some(b)).await;
            assert_eq!(s, 201, "{v}");
            v["id"].as_str().unwrap().to_string()
        }
    };
    let wait_for = |base: String, id: String, what: fn(&Value) -> bool| async move {
        let t0 = Instant::now();
        loop {
            let (s, v) = http("GET", format!("{base}/v1/allocations/{id}"), None).await;
            if s == 200 && what(&v) {
                return v;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{id}: {s} {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let base = format!("http://{}", rest[first]);
    // A short one takes the pool's first VNI, the long one the second; the short one ends.
    let short = submit(base.clone(), 2, None, "1s").await;
    let v = wait_for(base.clone(), short.clone(), |v| v["state"] == "running").await;
    assert_eq!(v["vni"], 1000, "{v}");
    let long = submit(base.clone(), 2, Some("ml"), "60s").await;
    let v = wait_for(base.clone(), long.clone(), |v| v["state"] == "running").await;
    assert_eq!(v["vni"], 1001, "{v}");
    wait_for(base.clone(), short.clone(), |v| v["ended_ms"].is_u64()).await;
    // Its CXI service exists and is recorded at the quorum with its VNI.
    let shared = rts[first].as_ref().unwrap().shared.clone();
    let t0 = Instant::now();
    let held = loop {
        let a = shared.member.read(|q| q.assignments.get(&long).cloned()).await.unwrap();
        if a.cxi_service.is_some() {
            break a;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{a:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        held.network.as_ref().map(|g| (g.domain.as_str(), g.vni)),
        Some(("ml", 1001))
    );
    let service = held.cxi_service.clone().unwrap();
    // physics's `ml` keeps its VNI for an hour once empty (the site's default here is 1 s).
    let key = "network.grace_by_domain.physics/ml";
    let (s, v) = http("PATCH", format!("{base}/v1/config"), Some(json!({ key: "1h" }))).await;
    assert_eq!((s, &v[key]), (200, &json!(3600.0)), "{v}");

    let killed = rts[first].take().unwrap();
    let killed_at = Instant::now();
    killed.shutdown().await;
    let next = loop {
        if let Some(i) = leader(&rts) {
            break i;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(10), "a new leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let base = format!("http://{}", rest[next]);
    let v = wait_for(base.clone(), long.clone(), |v| v["state"] == "running").await;
    assert_eq!(v["vni"], 1001, "the new leader keeps its VNI: {v}");
    let (_, domains) = http("GET", format!("{base}/v1/network/domains"), None).await;
    let ml: Vec<&Value> = domains["domains"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["name"] == "ml")
        .collect();
    assert_eq!(ml.len(), 1, "{domains}");
    assert_eq!(
        (ml[0]["vni"].as_u64(), &ml[0]["allocations"]),
        (Some(1001), &json!([long]))
    );
    // A new domain now does not get 1001 (in use), and the long one's service is not created again.
    let other = submit(base.clone(), 2, Some("other"), "1s").await;
    let v = wait_for(base.clone(), other.clone(), |v| {
        v["state"] == "running" || v["ended_ms"].is_u64()
    })
    .await;
    assert_ne!(v["vni"], 1001, "{v}");
    let created: Vec<Value> = fabric.created.lock().unwrap().clone();
    let for_long = created.iter().filter(|s| s["name"] == long.as_str()).count();
    assert_eq!(for_long, 1, "one CXI service for it: {created:?}");
    // Ending it revokes the service the old leader created.
    let (s, v) = http("DELETE", format!("{base}/v1/allocations/{long}"), None).await;
    assert!(s == 200 || s == 202, "{s} {v}");
    let t0 = Instant::now();
    while !fabric.revoked.lock().unwrap().contains(&service) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{service} not revoked: {:?}",
            fabric.revoked.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // `ml` is empty now. A domain on the default grace, emptied after it, goes first; `ml` stays,
    // draining, on its VNI.
    let late = submit(base.clone(), 2, Some("late"), "1s").await;
    wait_for(base.clone(), late.clone(), |v| v["ended_ms"].is_u64()).await;
    let t0 = Instant::now();
    let domains = loop {
        let (_, domains) = http("GET", format!("{base}/v1/network/domains"), None).await;
        let names: Vec<&str> = domains["domains"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|d| d["name"].as_str())
            .collect();
        if !names.contains(&"late") && !names.contains(&"other") {
            break domains;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{domains}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ml = domains["domains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "ml")
        .unwrap_or_else(|| panic!("ml released on the default grace: {domains}"));
    assert_eq!(
        (&ml["vni"], &ml["draining"], &ml["grace_s"]),
        (&json!(1001), &json!(true), &json!(3600.0)),
        "{domains}"
    );
    for r in rts.into_iter().flatten() {
        r.shutdown().await;
    }
}
