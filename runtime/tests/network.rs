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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_share_vnis_exhaustion_waits_and_cxi_services_follow_allocations() {
    let fabric = Arc::new(Fabric::default());
    let app = Router::new()
        .route("/fabric/cxi/services", post(create))
        .route("/fabric/cxi/services/{id}", delete(revoke))
        .route("/fabric/cxi/services/{id}/auth", get(auth))
        .with_state(fabric.clone());
    let fabric_url = common::serve_stand_in(app).await;

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
