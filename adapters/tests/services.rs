//! The VAST and fabric-manager clients against a local HTTP server (loopback only) that implements
//! the documented subset, with injectable faults: transient 503s (retried with backoff), a 4xx (not
//! retried), a slow answer (timeout), a closed port (transport error).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use lattice_adapters::fabric::{FabricClient, VniError, VniPool};
use lattice_adapters::http::{HttpConfig, HttpError};
use lattice_adapters::vast::{Qos, VastClient};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Fake {
    /// Answer 503 to this many requests first.
    fail_next: AtomicU32,
    hits: AtomicU32,
    slow: std::sync::atomic::AtomicBool,
    exports: Mutex<BTreeMap<String, Value>>,
    services: Mutex<BTreeMap<String, Value>>,
    audit: Mutex<Vec<Value>>,
    next: AtomicU32,
}

type S = State<Arc<Fake>>;
type R = Result<Json<Value>, (StatusCode, String)>;

fn gate(f: &Fake) -> Result<(), (StatusCode, String)> {
    f.hits.fetch_add(1, Ordering::SeqCst);
    if f.fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err((StatusCode::SERVICE_UNAVAILABLE, "busy".into()));
    }
    Ok(())
}

fn id(f: &Fake, p: &str) -> String {
    format!("{p}-{}", f.next.fetch_add(1, Ordering::SeqCst) + 1)
}

async fn create_export(State(f): S, Json(b): Json<Value>) -> R {
    gate(&f)?;
    if b["qos"]["bandwidth_floor_gbps"].as_f64().is_none_or(|x| x < 0.0) {
        return Err((StatusCode::BAD_REQUEST, "qos.bandwidth_floor_gbps must be >= 0".into()));
    }
    let e = json!({"id": id(&f, "exp"), "path": b["path"], "tenant": b["tenant"], "qos": b["qos"]});
    f.exports
        .lock()
        .unwrap()
        .insert(e["id"].as_str().unwrap().into(), e.clone());
    f.audit
        .lock()
        .unwrap()
        .push(json!({"at": "t", "user": b["tenant"], "path": b["path"], "op": "export"}));
    Ok(Json(e))
}

async fn set_qos(State(f): S, Path(e): Path<String>, Json(b): Json<Value>) -> R {
    gate(&f)?;
    let mut ex = f.exports.lock().unwrap();
    let x = ex
        .get_mut(&e)
        .ok_or((StatusCode::NOT_FOUND, format!("no export {e}")))?;
    x["qos"]["bandwidth_floor_gbps"] = b["bandwidth_floor_gbps"].clone();
    Ok(Json(x.clone()))
}

async fn delete_export(State(f): S, Path(e): Path<String>) -> Result<StatusCode, (StatusCode, String)> {
    gate(&f)?;
    match f.exports.lock().unwrap().remove(&e) {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err((StatusCode::NOT_FOUND, format!("no export {e}"))),
    }
}

async fn catalog(State(f): S, Query(q): Query<BTreeMap<String, String>>) -> R {
    gate(&f)?;
    if f.slow.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let path = q.get("path").cloned().unwrap_or_default();
    let hot = path.starts_with("/hot");
    Ok(Json(
        json!({"path": path, "tier": if hot {"hot"} else {"warm"}, "bytes": 1u64 << 40,
                   "hot_fraction": if hot {1.0} else {0.25}}),
    ))
}

async fn snapshot(State(f): S, Json(b): Json<Value>) -> R {
    gate(&f)?;
    Ok(Json(
        json!({"id": id(&f, "snap"), "path": b["path"], "name": b["name"]}),
    ))
}

async fn prefetch(State(f): S, Json(b): Json<Value>) -> R {
    gate(&f)?;
    Ok(Json(json!({"id": id(&f, "pf"), "path": b["path"], "state": "queued"})))
}

async fn audit(State(f): S, Query(q): Query<BTreeMap<String, String>>) -> R {
    gate(&f)?;
    let path = q.get("path").cloned().unwrap_or_default();
    let r: Vec<Value> = f
        .audit
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == path.as_str())
        .cloned()
        .collect();
    Ok(Json(json!({"records": r})))
}

async fn create_service(State(f): S, Json(b): Json<Value>) -> R {
    gate(&f)?;
    let s = json!({"id": id(&f, "cxi"), "vni": b["vni"], "nodes": b["nodes"]});
    f.services
        .lock()
        .unwrap()
        .insert(s["id"].as_str().unwrap().into(), s.clone());
    Ok(Json(s))
}

async fn auth(State(f): S, Path(s): Path<String>) -> R {
    gate(&f)?;
    let sv = f.services.lock().unwrap();
    let x = sv.get(&s).ok_or((StatusCode::NOT_FOUND, format!("no service {s}")))?;
    Ok(Json(
        json!({"auth_key": format!("{:08x}", x["vni"].as_u64().unwrap() * 2654435761)}),
    ))
}

async fn revoke(State(f): S, Path(s): Path<String>) -> Result<StatusCode, (StatusCode, String)> {
    gate(&f)?;
    match f.services.lock().unwrap().remove(&s) {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err((StatusCode::NOT_FOUND, format!("no service {s}"))),
    }
}

async fn serve() -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let app = Router::new()
        .route("/exports", post(create_export))
        .route("/exports/{id}", axum::routing::delete(delete_export))
        .route("/exports/{id}/qos", patch(set_qos))
        .route("/catalog", get(catalog))
        .route("/snapshots", post(snapshot))
        .route("/dataspace/prefetch", post(prefetch))
        .route("/audit/logs", get(audit))
        .route("/fabric/cxi/services", post(create_service))
        .route("/fabric/cxi/services/{id}", axum::routing::delete(revoke))
        .route("/fabric/cxi/services/{id}/auth", get(auth))
        .with_state(fake.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (format!("http://{addr}"), fake)
}

fn cfg(base: &str) -> HttpConfig {
    HttpConfig {
        retries: 3,
        backoff: Duration::from_millis(20),
        timeout: Duration::from_millis(500),
        ..HttpConfig::new(base)
    }
}

#[tokio::test]
async fn vast_operations_retries_timeouts_and_errors() {
    let (base, fake) = serve().await;
    let vast = VastClient::new(cfg(&base)).unwrap();
    let qos = Qos {
        bandwidth_floor_gbps: 5.0,
        iops_limit: None,
    };
    let e = vast.create_export("/proj/a b", "physics", &qos).await.unwrap();
    assert_eq!((e.path.as_str(), e.qos.bandwidth_floor_gbps), ("/proj/a b", 5.0));
    let e2 = vast.set_bandwidth_floor(&e.id, 12.5).await.unwrap();
    assert_eq!(e2.qos.bandwidth_floor_gbps, 12.5);
    let hot = vast.locality("/hot/data").await.unwrap();
    let warm = vast.locality("/proj/a b").await.unwrap();
    assert_eq!((hot.tier.as_str(), warm.tier.as_str()), ("hot", "warm"));
    assert_eq!(warm.hot_fraction, 0.25);
    assert_eq!(vast.create_snapshot("/proj/a b", "run-1").await.unwrap().name, "run-1");
    assert_eq!(vast.prefetch("/proj/a b").await.unwrap().state, "queued");
    let audit = vast.audit("/proj/a b").await.unwrap();
    assert_eq!((audit.len(), audit[0].op.as_str()), (1, "export"));
    vast.delete_export(&e.id).await.unwrap();
    let gone = vast.delete_export(&e.id).await.unwrap_err();
    assert!(gone.is_not_found(), "{gone}");

    // Transient 503s are retried with backoff.
    fake.fail_next.store(2, Ordering::SeqCst);
    let before = fake.hits.load(Ordering::SeqCst);
    vast.create_snapshot("/p", "s").await.unwrap();
    assert_eq!(fake.hits.load(Ordering::SeqCst) - before, 3, "two 503s, then success");
    // ... but not forever.
    fake.fail_next.store(10, Ordering::SeqCst);
    let err = vast.prefetch("/p").await.unwrap_err();
    assert!(matches!(err, HttpError::Status { status: 503, .. }), "{err}");
    fake.fail_next.store(0, Ordering::SeqCst);
    // A 4xx is the caller's mistake: no retry, and the error names the URL and the body.
    let before = fake.hits.load(Ordering::SeqCst);
    let bad = Qos {
        bandwidth_floor_gbps: -1.0,
        iops_limit: None,
    };
    let err = vast.create_export("/p", "physics", &bad).await.unwrap_err();
    assert_eq!(fake.hits.load(Ordering::SeqCst) - before, 1);
    let msg = err.to_string();
    assert!(
        msg.contains("/exports") && msg.contains("400") && msg.contains("bandwidth_floor_gbps"),
        "{msg}"
    );

    // A slow service times out (each attempt), and says so.
    fake.slow.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let slow = VastClient::new(HttpConfig {
        retries: 1,
        ..cfg(&base)
    })
    .unwrap();
    let err = slow.locality("/x").await.unwrap_err();
    assert!(matches!(err, HttpError::Timeout { attempts: 2, .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(2));

    // Nobody listening: a transport error after the retries.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let none = VastClient::new(cfg(&format!("http://127.0.0.1:{port}"))).unwrap();
    let err = none.locality("/x").await.unwrap_err();
    assert!(matches!(err, HttpError::Transport { attempts: 4, .. }), "{err}");
}

#[tokio::test]
async fn fabric_services_and_the_vni_pool() {
    let (base, _fake) = serve().await;
    let fabric = FabricClient::new(cfg(&base)).unwrap();
    let mut pool = VniPool::new(1000, 1002).unwrap();
    let vni = pool.allocate().unwrap();
    let s = fabric
        .create_service("a-000001", vni, &["n1".to_string(), "n2".to_string()])
        .await
        .unwrap();
    assert_eq!((s.vni, s.nodes.len()), (1000, 2));
    let key = fabric.auth_key(&s.id).await.unwrap();
    assert!(!key.is_empty() && key.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    fabric.revoke(&s.id).await.unwrap();
    fabric.revoke(&s.id).await.unwrap();
    assert!(fabric.auth_key(&s.id).await.unwrap_err().is_not_found());

    // Sequential, exhaustion says so, freed VNIs come back.
    assert_eq!((pool.allocate(), pool.allocate()), (Ok(1001), Ok(1002)));
    assert_eq!(
        pool.allocate().unwrap_err().to_string(),
        "cannot create network domain — VNI pool exhausted (3/3 in use)"
    );
    assert!(pool.release(1001));
    assert_eq!(pool.allocate(), Ok(1001));
    assert_eq!(pool.in_use(), 3);
    assert!(matches!(VniPool::new(2, 10), Err(VniError::Reserved { .. })));
}
