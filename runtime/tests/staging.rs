//! Data staging through VAST (book: "Data Staging & Cache Lifecycle"): at submission the control plane
//! looks up each data mount's tier and size in VAST's catalog; an allocation whose data is not yet on
//! the hot tier waits in Staging (f5 = data readiness below 1) while VAST is asked to prefetch it, and
//! starts once staged; a prefetch VAST refuses is a staging failure, asked again up to 3 times. A
//! local stand-in plays VAST.

mod common;

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::http;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Vast {
    prefetches: Mutex<Vec<String>>,
}

async fn catalog(Query(q): Query<BTreeMap<String, String>>) -> Json<Value> {
    let path = q.get("path").cloned().unwrap_or_default();
    // 90 GB on the warm tier (the bandwidth below stages it in about 3 s: long enough that the first
    // look after the acknowledgment — which waits for the submission's fsync, slow under I/O load —
    // still finds it staging).
    Json(json!({"path": path, "tier": "warm", "bytes": 90_000_000_000u64, "hot_fraction": 0.0}))
}

async fn prefetch(
    State(v): State<Arc<Vast>>,
    Json(b): Json<Value>,
) -> Result<Json<Value>, (axum::http::StatusCode, String)> {
    let path = b["path"].as_str().unwrap_or_default().to_string();
    v.prefetches.lock().unwrap().push(path.clone());
    if path.starts_with("/broken") {
        return Err((axum::http::StatusCode::BAD_REQUEST, "no such dataset".into()));
    }
    Ok(Json(json!({"id": "pf-1", "path": path, "state": "running"})))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_is_looked_up_prefetched_and_staged_before_the_job_starts() {
    let vast = Arc::new(Vast::default());
    let app = Router::new()
        .route("/catalog", get(catalog))
        .route("/dataspace/prefetch", post(prefetch))
        .with_state(vast.clone());
    let url = common::serve_stand_in(app).await;
    let dir = std::env::temp_dir().join(format!("lattice-runtime-staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // 100 GB/s of VAST write bandwidth, 30 % of it for staging: 90 GB take 3 s.
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 4\ncycle: 100ms\nservices:\n  vast:\n    url: {url}\n    timeout: 2s\n    retries: 0\n    write_gbps: 100\n",
        dir.display()
    );
    let rt = common::start_leader(&text).await;
    let base = format!("http://{}", rt.rest_addr);
    let submit = |source: &str| {
        let b = json!({"tenant": "physics", "resources": {"nodes": 1}, "duration": "1s",
                       "lifecycle": {"walltime": "1m"}, "data": {"mounts": [{"source": source, "tier_hint": "hot"}]}});
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
    let t_submit = Instant::now();
    let a = submit("/datasets/imagenet").await;
    let v = get(a.clone()).await;
    assert_eq!(v["state"], "staging", "{v}");
    assert!(v["data_readiness"].as_f64().unwrap() < 0.8, "{v}");
    let t0 = Instant::now();
    let v = loop {
        let v = get(a.clone()).await;
        if v["state"] == "running" || v["ended_ms"].is_u64() {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let waited = t_submit.elapsed();
    // Started once at least 80 % was staged (2.4 s of the 3 s), not before.
    assert!(waited >= Duration::from_millis(2300), "started after {waited:?}: {v}");
    assert!(v["data_readiness"].as_f64().unwrap() >= 0.8, "{v}");
    assert!(
        vast.prefetches
            .lock()
            .unwrap()
            .contains(&"/datasets/imagenet".to_string())
    );

    // A dataset VAST cannot prefetch: a staging failure, asked again up to 3 times, then it waits.
    let b = submit("/broken/set").await;
    let t0 = Instant::now();
    loop {
        let n = vast
            .prefetches
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.starts_with("/broken"))
            .count();
        if n == 4 {
            break;
        }
        assert!(n < 4 && t0.elapsed() < Duration::from_secs(10), "{n} prefetches");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = vast
        .prefetches
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.starts_with("/broken"))
        .count();
    assert_eq!(n, 4, "no more retries after the limit");
    // Submissions without VAST data need nothing of it; bad tiers are refused naming the field.
    let (s, v) = http(
        "POST",
        format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
                    "data": {"mounts": [{"source": "/x", "size_gb": 1.0, "tier": "warm", "tier_hint": "lukewarm"}]}}),
        ),
    )
    .await;
    assert_eq!((s, v["field"].as_str()), (400, Some("data.mounts[0].tier_hint")), "{v}");
    // Mount targets, sources and access modes are checked before anything is queued.
    let before = http("GET", format!("{base}/v1/allocations"), None).await.1;
    for (mount, field) in [
        (
            json!({"source": "nfs://home/alice", "target": "/etc"}),
            "data.mounts[0].target",
        ),
        (
            json!({"source": "nfs://home/alice", "target": "data/in"}),
            "data.mounts[0].target",
        ),
        (
            json!({"source": "nfs://home/alice", "target": "/data/../proc"}),
            "data.mounts[0].target",
        ),
        (
            json!({"source": "/home/alice", "target": "/data/in"}),
            "data.mounts[0].source",
        ),
        (
            json!({"source": "s3://d/x", "target": "/data/in", "access": "rw"}),
            "data.mounts[0].access",
        ),
    ] {
        let (s, v) = http(
            "POST",
            format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"},
                        "data": {"mounts": [mount]}}),
            ),
        )
        .await;
        assert_eq!((s, v["field"].as_str()), (400, Some(field)), "{mount}: {v}");
    }
    let after = http("GET", format!("{base}/v1/allocations"), None).await.1;
    assert_eq!(before, after, "nothing queued by a refused submission");
    let _ = b;
    rt.shutdown().await;
}
