//! Accounting against a local fake Waldur that speaks the book's endpoints (`POST
//! /api/marketplace-orders/`, `GET /api/invoices/?customer=…&state=pending`, `POST
//! /api/invoices/{id}/items/`), checks the `Token` and keeps every order by its `Idempotency-Key`
//! (409 for a key it has). It fails (503), is slow (records, then answers after the client gave up:
//! the "did it arrive?" case) and comes back; nothing is lost, each event is recorded once.

mod common;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::{call, free_port, runtime_process as runtime, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Up,
    Down,
    Slow,
}

struct Fake {
    mode: Mutex<Mode>,
    token: Mutex<String>,
    /// Idempotency key → the order.
    orders: Mutex<BTreeMap<String, Value>>,
    /// Idempotency key → (invoice, item).
    items: Mutex<BTreeMap<String, (String, Value)>>,
    /// Orders answered 201 (recorded anew) and 409 (a key it had).
    created: AtomicU64,
    conflicts: AtomicU64,
    unauthorized: AtomicU64,
}

impl Fake {
    fn new(token: &str) -> Arc<Fake> {
        Arc::new(Fake {
            mode: Mutex::new(Mode::Down),
            token: Mutex::new(token.into()),
            orders: Default::default(),
            items: Default::default(),
            created: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            unauthorized: AtomicU64::new(0),
        })
    }

    fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }

    fn keys(&self) -> Vec<String> {
        self.orders.lock().unwrap().keys().cloned().collect()
    }
}

type S = State<Arc<Fake>>;
type R = Result<(StatusCode, Json<Value>), (StatusCode, String)>;

fn gate(f: &Fake, h: &HeaderMap) -> Result<Mode, (StatusCode, String)> {
    let want = format!("Token {}", f.token.lock().unwrap());
    if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
        f.unauthorized.fetch_add(1, Ordering::SeqCst);
        return Err((StatusCode::UNAUTHORIZED, "bad token".into()));
    }
    match *f.mode.lock().unwrap() {
        Mode::Down => Err((StatusCode::SERVICE_UNAVAILABLE, "maintenance".into())),
        m => Ok(m),
    }
}

fn key(h: &HeaderMap) -> Result<String, (StatusCode, String)> {
    h.get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or((StatusCode::BAD_REQUEST, "Idempotency-Key required".into()))
}

async fn slow(m: Mode) {
    if m == Mode::Slow {
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
}

async fn order(State(f): S, h: HeaderMap, Json(b): Json<Value>) -> R {
    let m = gate(&f, &h)?;
    let k = key(&h)?;
    let fresh = {
        let mut o = f.orders.lock().unwrap();
        !o.contains_key(&k) && o.insert(k.clone(), b).is_none()
    };
    if fresh {
        f.created.fetch_add(1, Ordering::SeqCst);
    }
    // Recorded before a slow answer: the client times out on an order that did arrive.
    slow(m).await;
    if fresh {
        Ok((StatusCode::CREATED, Json(json!({"uuid": k}))))
    } else {
        f.conflicts.fetch_add(1, Ordering::SeqCst);
        Err((StatusCode::CONFLICT, "an order with this Idempotency-Key exists".into()))
    }
}

async fn invoices(State(f): S, h: HeaderMap, Query(q): Query<BTreeMap<String, String>>) -> R {
    gate(&f, &h)?;
    assert_eq!(q.get("state").map(String::as_str), Some("pending"));
    let c = q.get("customer").cloned().unwrap_or_default();
    Ok((
        StatusCode::OK,
        Json(json!([{"uuid": format!("inv-{c}"), "state": "pending"}])),
    ))
}

async fn item(State(f): S, h: HeaderMap, Path(inv): Path<String>, Json(b): Json<Value>) -> R {
    gate(&f, &h)?;
    let k = key(&h)?;
    let mut items = f.items.lock().unwrap();
    if items.contains_key(&k) {
        return Err((StatusCode::CONFLICT, "exists".into()));
    }
    items.insert(k, (inv, b));
    Ok((StatusCode::CREATED, Json(json!({}))))
}

fn router(f: Arc<Fake>) -> Router {
    Router::new()
        .route("/api/marketplace-orders/", post(order))
        .route("/api/invoices/", get(invoices))
        .route("/api/invoices/{id}/items/", post(item))
        .with_state(f)
}

/// Serves the fake on its own thread (the runtime under test is a separate process).
fn serve(f: Arc<Fake>) -> String {
    common::serve_on_thread(router(f))
}

fn status(base: &str) -> Value {
    let (code, v) = call("GET", &format!("{base}/api/v1/admin/accounting"), None);
    assert_eq!(code, 200, "{v}");
    v
}

fn submit(base: &str, project: &str) -> String {
    let (code, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(json!({"tenant": "physics", "project": project, "entrypoint": "sleep 1",
                    "resources": {"nodes": 2}, "lifecycle": {"type": "bounded", "walltime": "10m"}})),
    );
    assert_eq!(code, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn ended(base: &str, id: &str) -> bool {
    call("GET", &format!("{base}/v1/allocations/{id}"), None).1["state"] == "completed"
}

/// Every allocation's start and end, as keys.
fn expected_keys(base: &str, ids: &[String]) -> Vec<String> {
    let mut keys = Vec::new();
    for id in ids {
        let v = call("GET", &format!("{base}/v1/allocations/{id}"), None).1;
        keys.push(format!("{id}/started/{}", v["started_ms"].as_u64().unwrap()));
        keys.push(format!("{id}/completed"));
    }
    keys.sort();
    keys
}

fn setup(name: &str, accounting: &str) -> (std::path::PathBuf, String, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("lattice-accounting-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let config = dir.join("runtime.yaml");
    std::fs::write(
        &config,
        format!(
            "node_id: 1\nrest_listen: 127.0.0.1:{port}\ngrpc_listen: 127.0.0.1:{}\ndata_dir: data\nsimulated_nodes: 8\ncycle: 100ms\n{accounting}",
            free_port()
        ),
    )
    .unwrap();
    (dir, format!("http://127.0.0.1:{port}"), config)
}

#[test]
fn waldur_down_slow_and_back_loses_nothing_and_records_each_event_once() {
    let fake = Fake::new("first");
    let waldur = serve(fake.clone());
    let (dir, base, config) = setup("outage", "");
    let token = dir.join("waldur-token");
    std::fs::write(&token, "first\n").unwrap();
    std::fs::write(
        &config,
        std::fs::read_to_string(&config).unwrap()
            + &format!(
                "accounting:\n  enabled: true\n  provider: waldur\n  push_interval_seconds: 1\n  buffer_size: 4\n  disk_buffer_max_events: 1000\n  waldur:\n    api_url: {waldur}/api/\n    token_secret_ref: file://{}\n    timeout: 400ms\n    retries: 0\n",
                token.display()
            ),
    )
    .unwrap();
    let log = dir.join("runtime.log");
    let rt = runtime(&config, &log);
    wait_until("the runtime to serve", Duration::from_secs(20), || {
        call("GET", &format!("{base}/v1/allocations"), None).0 == 200
    });

    // Waldur is down: 5 allocations run and end anyway; their 10 events wait, 4 in memory and the
    // rest in the disk buffer.
    let mut ids: Vec<String> = (0..5).map(|i| submit(&base, &format!("p{}", i % 2))).collect();
    wait_until("5 ended", Duration::from_secs(30), || {
        ids.iter().all(|id| ended(&base, id))
    });
    wait_until("10 events buffered", Duration::from_secs(10), || {
        let s = status(&base);
        s["buffered"].as_u64().unwrap() + s["on_disk"].as_u64().unwrap() == 10
    });
    let s = status(&base);
    assert_eq!(
        (s["buffered"].as_u64(), s["on_disk"].as_u64()),
        (Some(4), Some(6)),
        "{s}"
    );
    assert_eq!(s["reachable"], false, "{s}");
    assert!(s["last_error"].as_str().unwrap().contains("503"), "{s}");
    assert!(fake.keys().is_empty());
    let metrics = call("GET", &format!("{base}/metrics"), None).1;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("lattice_accounting_events_buffered 4"),
        "{metrics}"
    );

    // Killed: the memory buffer is gone, the disk buffer is not.
    drop(rt);
    assert!(
        std::fs::metadata(dir.join("data/accounting-wal/events.wal"))
            .unwrap()
            .len()
            > 0
    );
    // Waldur now answers too slowly (each order arrives, the answer comes after the client's
    // timeout); the restarted runtime keeps scheduling meanwhile.
    fake.set(Mode::Slow);
    let _rt = runtime(&config, &log);
    wait_until("the runtime to serve again", Duration::from_secs(20), || {
        call("GET", &format!("{base}/v1/allocations"), None).0 == 200
    });
    ids.push(submit(&base, "p0"));
    wait_until("the sixth ended during the outage", Duration::from_secs(30), || {
        ended(&base, &ids[5])
    });
    wait_until("a timed-out push", Duration::from_secs(10), || {
        status(&base)["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no answer"))
    });

    // Back, with a rotated token: the runtime reads the secret again before each round.
    *fake.token.lock().unwrap() = "second".into();
    std::fs::write(&token, "second\n").unwrap();
    fake.set(Mode::Up);
    wait_until("the buffer drained", Duration::from_secs(30), || {
        let s = status(&base);
        s["buffered"] == 0 && s["on_disk"] == 0 && fake.keys().len() >= 12
    });
    let want = expected_keys(&base, &ids);
    assert_eq!(
        fake.keys(),
        want,
        "every start and end, the memory buffer's lost ones too"
    );
    // Each recorded once: 12 orders created; what arrived before (a slow answer, the regenerated
    // ones) was refused by key and counted as delivered.
    assert_eq!(fake.created.load(Ordering::SeqCst), 12);
    assert!(
        fake.conflicts.load(Ordering::SeqCst) >= 1,
        "the order that arrived while slow came again"
    );
    let s = status(&base);
    assert!(s["duplicates_total"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["reachable"], true, "{s}");
    assert_eq!(s["dropped_total"], 0);
    // The orders carry the mapping: tenant → customer, project → project, vCluster → offering.
    let orders = fake.orders.lock().unwrap().clone();
    let done = &orders[&format!("{}/completed", ids[0])];
    assert_eq!(
        (done["customer"].as_str(), done["project"].as_str()),
        (Some("physics"), Some("p0"))
    );
    assert_eq!(done["attributes"]["event"], "allocation.completed");
    assert_eq!(done["attributes"]["nodes"], 2);
    assert!(done["attributes"]["node_hours"].as_f64().unwrap() > 0.0);
    // A billing line per finished allocation on the customer's pending invoice.
    let items = fake.items.lock().unwrap().clone();
    assert_eq!(items.len(), 6);
    assert!(
        items
            .values()
            .all(|(inv, i)| inv == "inv-physics" && i["unit"] == "node_hour")
    );

    // The mark moves once everything is delivered (a later leader starts from it).
    wait_until("the mark committed", Duration::from_secs(10), || {
        status(&base)["mark_ms"].as_u64().unwrap() > 0
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn overflow_drops_are_counted_and_a_reconcile_recovers_them() {
    let fake = Fake::new("t");
    let waldur = serve(fake.clone());
    // SAFETY: set before the runtime (and any thread reading it) starts; no other test reads it.
    unsafe { std::env::set_var("LATTICE_TEST_WALDUR_TOKEN", "t") };
    let (dir, base, config) = setup(
        "overflow",
        &format!(
            "accounting:\n  enabled: true\n  push_interval_seconds: 1\n  buffer_size: 2\n  disk_buffer_max_events: 2\n  waldur:\n    api_url: {waldur}\n    token_secret_ref: env:LATTICE_TEST_WALDUR_TOKEN\n    timeout: 400ms\n    retries: 0\n"
        ),
    );
    let _rt = runtime(&config, &dir.join("runtime.log"));
    wait_until("the runtime to serve", Duration::from_secs(20), || {
        call("GET", &format!("{base}/v1/allocations"), None).0 == 200
    });
    // 3 allocations, 6 events, room for 4 while Waldur is down: 2 dropped, and counted.
    let ids: Vec<String> = (0..3).map(|_| submit(&base, "p")).collect();
    wait_until("3 ended", Duration::from_secs(30), || {
        ids.iter().all(|id| ended(&base, id))
    });
    wait_until("2 dropped", Duration::from_secs(10), || {
        status(&base)["dropped_total"] == 2
    });
    let metrics = call("GET", &format!("{base}/metrics"), None).1;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("lattice_accounting_events_dropped_total 2"),
        "{metrics}"
    );
    fake.set(Mode::Up);
    wait_until("the buffers drained", Duration::from_secs(20), || {
        let s = status(&base);
        s["buffered"] == 0 && s["on_disk"] == 0
    });
    assert_eq!(fake.keys().len(), 4, "what was dropped is not in Waldur");

    // A bad window is refused, and queues nothing.
    let url = format!("{base}/api/v1/admin/accounting/reconcile");
    let (code, v) = call(
        "POST",
        &url,
        Some(json!({"since": "2026-13-01", "until": "2100-01-01"})),
    );
    assert_eq!((code, v["field"].as_str()), (400, Some("since")), "{v}");
    // The operator's reconcile regenerates a window's events from the records: the 2 missing ones
    // are recorded, the others are known by their keys. Two windows (the starts, then the ends), so
    // each fits the small buffers.
    let first_end = ids
        .iter()
        .map(|id| {
            call("GET", &format!("{base}/v1/allocations/{id}"), None).1["ended_ms"]
                .as_u64()
                .unwrap()
        })
        .min()
        .unwrap();
    let rfc3339 =
        |ms: u64| humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string();
    for (since, until) in [
        ("2020-01-01".to_string(), rfc3339(first_end)),
        (rfc3339(first_end), "2100-01-01".into()),
    ] {
        let (code, v) = call("POST", &url, Some(json!({"since": since, "until": until})));
        assert_eq!(code, 200, "{v}");
        assert_eq!((v["queued"].as_u64(), v["dropped"].as_u64()), (Some(3), Some(0)), "{v}");
        wait_until("the reconciled events delivered", Duration::from_secs(20), || {
            let s = status(&base);
            s["buffered"] == 0 && s["on_disk"] == 0
        });
    }
    assert_eq!(fake.keys(), expected_keys(&base, &ids));
    assert_eq!(fake.created.load(Ordering::SeqCst), 6);
    let _ = std::fs::remove_dir_all(&dir);
}
