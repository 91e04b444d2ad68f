//! The sensitive node lifecycle in production, with four real agents and a local fake OpenCHAMI
//! (SMD, BSS, PCS) whose "hardened" and "wipe" images set each node's SMD `SoftwareStatus` after a
//! reboot:
//! - a committed claim's nodes boot the hardened image (BSS, a PCS reboot, `Hardened` at SMD)
//!   before it starts, audited between claim and release; nodes still running it do not boot again;
//! - a released claim's nodes are wiped through OpenCHAMI (BSS pointed at the wipe image, a PCS
//!   reboot, then the previous boot parameters restored); a wiped node returns to the pool, one whose
//!   wipe fails or is never confirmed within `sensitive.wipe_timeout` is quarantined; every step is in
//!   the audit log, the quarantines with the wipe's start and the reason;
//! - a node of a running claim whose agent dies gets the sensitive grace (longer than the standard
//!   one) before it is Down, and the claim then fails: it is not requeued.

mod common;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::{agent_process, call, free_port, runtime_process, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: [&str; 4] = ["x1", "x2", "x3", "x4"];

#[derive(Default)]
struct Fake {
    components: Mutex<BTreeMap<String, Value>>,
    /// BSS: xname → boot parameters.
    boot: Mutex<BTreeMap<String, Value>>,
    /// Every BSS PUT and PCS transition, in order: ("bss", xname, kernel) / ("pcs", xname, operation).
    log: Mutex<Vec<(String, String, String)>>,
    /// Wipes started per node.
    wipes: Mutex<BTreeMap<String, u32>>,
}

type S = State<Arc<Fake>>;

async fn components(State(f): S) -> Json<Value> {
    Json(json!({"Components": f.components.lock().unwrap().values().cloned().collect::<Vec<_>>()}))
}

async fn component(State(f): S, Path(x): Path<String>) -> Json<Value> {
    Json(f.components.lock().unwrap()[&x].clone())
}

async fn patch(State(f): S, Path(x): Path<String>, Json(b): Json<Value>) -> Json<Value> {
    if let Some(c) = f.components.lock().unwrap().get_mut(&x) {
        for (k, v) in b.as_object().unwrap() {
            c[k] = v.clone();
        }
    }
    Json(json!({}))
}

async fn groups() -> Json<Value> {
    Json(json!([]))
}

async fn get_boot(State(f): S, Query(q): Query<BTreeMap<String, String>>) -> Json<Value> {
    let x = q.get("name").cloned().unwrap_or_default();
    Json(json!([f.boot.lock().unwrap()[&x]]))
}

async fn put_boot(State(f): S, Json(b): Json<Value>) -> Json<Value> {
    for h in b["hosts"].as_array().unwrap() {
        let x = h.as_str().unwrap().to_string();
        let p = json!({"hosts": [x], "kernel": b["kernel"], "initrd": b["initrd"], "params": b["params"]});
        f.log
            .lock()
            .unwrap()
            .push(("bss".into(), x.clone(), b["kernel"].as_str().unwrap().into()));
        f.boot.lock().unwrap().insert(x, p);
    }
    Json(json!({}))
}

/// A reboot: into the hardened image, the node reports `Hardened` after 200 ms; into the wipe
/// image, it "wipes" and reports after 300 ms — x2's first wipe fails, x3's image never reports.
async fn transition(State(f): S, Json(b): Json<Value>) -> Json<Value> {
    let x = b["location"][0]["xname"].as_str().unwrap().to_string();
    f.log
        .lock()
        .unwrap()
        .push(("pcs".into(), x.clone(), b["operation"].as_str().unwrap().into()));
    if f.boot.lock().unwrap()[&x]["kernel"] == "hardened-kernel" {
        let f = f.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            f.components.lock().unwrap().get_mut(&x).unwrap()["SoftwareStatus"] = json!("Hardened");
        });
        return Json(json!({"transitionID": "t-hardened"}));
    }
    let wiping = f.boot.lock().unwrap()[&x]["kernel"] == "wipe-kernel";
    if wiping && x != "x3" {
        let first = {
            let mut w = f.wipes.lock().unwrap();
            let n = w.entry(x.clone()).or_default();
            *n += 1;
            *n == 1
        };
        let f = f.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let status = if x == "x2" && first { "WipeFailed" } else { "Wiped" };
            f.components.lock().unwrap().get_mut(&x).unwrap()["SoftwareStatus"] = json!(status);
        });
    }
    Json(json!({"transitionID": format!("t-{}", f.log.lock().unwrap().len())}))
}

fn node_state(base: &str, n: &str) -> String {
    call("GET", &format!("{base}/v1/nodes/{n}"), None).1["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn alloc(base: &str, id: &str) -> Value {
    call("GET", &format!("{base}/v1/allocations/{id}"), None).1
}

/// The allocation's lifecycle entries (not the API calls about it: the test's own reads are audited).
fn audit(base: &str, id: &str) -> Vec<Value> {
    call("GET", &format!("{base}/v1/audit/logs?allocation={id}"), None).1["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| !matches!(e["action"].as_str(), Some("api_call" | "log_access" | "metrics_query")))
        .collect()
}

#[test]
fn openchami_wipes_quarantines_and_the_sensitive_grace_with_real_agents() {
    let dir = std::env::temp_dir().join(format!("lattice-sensitive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fake = Arc::new(Fake::default());
    for x in NODES {
        fake.components.lock().unwrap().insert(
            x.into(),
            json!({"ID": x, "Type": "Node", "State": "Ready", "Flag": "OK", "Enabled": true, "Role": "Compute"}),
        );
        fake.boot.lock().unwrap().insert(
            x.into(),
            json!({"hosts": [x], "kernel": "compute-kernel", "initrd": "compute-initrd", "params": ""}),
        );
    }
    let app = Router::new()
        .route("/hsm/v2/State/Components", get(components))
        .route("/hsm/v2/State/Components/{x}", get(component).patch(patch))
        .route("/hsm/v2/groups", get(groups))
        .route("/boot/v1/bootparameters", get(get_boot).put(put_boot))
        .route("/power-control/v1/transitions", post(transition))
        .with_state(fake.clone());
    let url = common::serve_on_thread(app);
    let inventory = dir.join("nodes.yaml");
    std::fs::write(
        &inventory,
        format!(
            "nodes:\n{}",
            NODES.iter().map(|n| format!("  - name: {n}\n")).collect::<String>()
        ),
    )
    .unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let config = dir.join("runtime.yaml");
    std::fs::write(
        &config,
        format!(
            "rest_listen: 127.0.0.1:{port}\ngrpc_listen: 127.0.0.1:{grpc}\ndata_dir: data\ninventory: nodes.yaml\ncycle: 100ms
agents:
  heartbeat_timeout: 1s
  grace: 1s
  sensitive_grace: 6s
sensitive:
  wipe_timeout: 4s
services:
  openchami:
    smd_url: {url}
    refresh: 1s
    timeout: 2s
    wipe: {{kernel: wipe-kernel, initrd: wipe-initrd, params: lattice.wipe=1, poll: 200ms}}
    hardened: {{kernel: hardened-kernel, initrd: hardened-initrd, params: selinux=1, poll: 200ms}}
",
            grpc = free_port()
        ),
    )
    .unwrap();
    let _rt = runtime_process(&config, &dir.join("runtime.log"));
    wait_until("the runtime to serve", Duration::from_secs(20), || {
        call("GET", &format!("{base}/v1/nodes"), None).0 == 200
    });
    let mut agents: BTreeMap<&str, common::Proc> =
        NODES.iter().map(|n| (*n, agent_process(&base, n, &dir, &[]))).collect();
    wait_until("4 ready nodes", Duration::from_secs(20), || {
        NODES.iter().all(|n| node_state(&base, n) == "ready")
    });
    let claim = |nodes: u32, cmd: &str| {
        let (code, v) = call(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(
                json!({"tenant": "hospital", "user": "dr-x", "sensitive": true, "resources": {"nodes": nodes},
                        "lifecycle": {"walltime": "10m"}, "entrypoint": cmd}),
            ),
        );
        assert_eq!(code, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };

    // A claim of all four nodes boots them into the hardened image, runs, ends: OpenCHAMI wipes each.
    let first = claim(4, "true");
    wait_until("the claim to end", Duration::from_secs(20), || {
        alloc(&base, &first)["ended_ms"].is_u64()
    });
    // x1 and x4 wiped and back; x2's wipe failed; x3's never confirmed (4 s): both quarantined.
    wait_until("every wipe's outcome", Duration::from_secs(20), || {
        ["x1", "x4"].iter().all(|n| node_state(&base, n) == "ready")
            && ["x2", "x3"].iter().all(|n| node_state(&base, n) == "down")
    });
    wait_until("the audit entries", Duration::from_secs(10), || {
        audit(&base, &first).len() >= 8
    });
    let entries = audit(&base, &first);
    let actions: Vec<&str> = entries.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions[..4], ["claim", "boot", "start", "release"], "{entries:?}");
    let detail = |action: &str, node: &str| {
        entries
            .iter()
            .find(|e| e["action"] == action && e["detail"].as_str().unwrap().starts_with(node))
            .map(|e| e["detail"].as_str().unwrap().to_string())
    };
    for n in ["x1", "x4"] {
        assert!(detail("wipe", n).is_some(), "{n}: {entries:?}");
    }
    let failed = detail("quarantine", "x2").expect("x2 quarantined");
    assert!(
        failed.contains("started_ms=") && failed.contains("WipeFailed"),
        "{failed}"
    );
    let silent = detail("quarantine", "x3").expect("x3 quarantined");
    assert!(silent.contains("no wipe confirmation within 4 s"), "{silent}");
    assert!(entries.iter().all(|e| e["user"] == "dr-x"), "{entries:?}");
    // Each node booted the hardened image for the claim, then the wipe image, then the hardened
    // one again (x3 too: restored once given up on).
    wait_until("x3's own image restored", Duration::from_secs(5), || {
        let log = fake.log.lock().unwrap();
        log.iter().filter(|(k, x, _)| k == "pcs" && x == "x3").count() == 3
    });
    let log = fake.log.lock().unwrap().clone();
    for n in NODES {
        let kernels: Vec<&str> = log
            .iter()
            .filter(|(k, x, _)| k == "bss" && x == n)
            .map(|(_, _, v)| v.as_str())
            .collect();
        assert_eq!(
            kernels,
            ["hardened-kernel", "wipe-kernel", "hardened-kernel"],
            "{n}: {log:?}"
        );
        let reboots = log.iter().filter(|(k, x, _)| k == "pcs" && x == n).count();
        assert_eq!(reboots, 3, "{n}: {log:?}");
    }
    // The agents were not asked to wipe (OpenCHAMI did): no agent-side wipe outcome was awaited.
    let (_, m) = call("GET", &format!("{base}/metrics"), None);
    assert!(
        m.as_str().unwrap().contains("lattice_sensitive_wipe_failure_total 2"),
        "{m}"
    );

    // A running claim on the two good nodes loses an agent: the node gets the sensitive grace (6 s,
    // not the standard 1 + 1 s), then is Down; the claim fails and is not requeued.
    let second = claim(2, "sleep 60");
    wait_until("the second claim to run", Duration::from_secs(20), || {
        alloc(&base, &second)["state"] == "running"
    });
    // Its nodes still run the hardened image: no boot this time.
    assert!(
        !audit(&base, &second).iter().any(|e| e["action"] == "boot"),
        "{:?}",
        audit(&base, &second)
    );
    assert_eq!(fake.log.lock().unwrap().len(), log.len(), "no BSS change, no reboot");
    let killed_at = Instant::now();
    drop(agents.remove("x4"));
    wait_until("x4 degraded", Duration::from_secs(5), || {
        node_state(&base, "x4") == "degraded"
    });
    std::thread::sleep(Duration::from_secs(3).saturating_sub(killed_at.elapsed()));
    assert_eq!(
        node_state(&base, "x4"),
        "degraded",
        "still within the sensitive grace at 3 s"
    );
    assert_eq!(alloc(&base, &second)["state"], "running");
    wait_until("x4 down after the sensitive grace", Duration::from_secs(15), || {
        node_state(&base, "x4") == "down"
    });
    assert!(
        killed_at.elapsed() >= Duration::from_secs(6),
        "not before the grace: {:?}",
        killed_at.elapsed()
    );
    let v = alloc(&base, &second);
    assert_eq!(v["state"], "failed", "a sensitive claim is not requeued: {v}");
    // Its nodes are released and wiped; x4 stays Down for an operator (its agent is gone).
    wait_until("the second claim's wipes", Duration::from_secs(15), || {
        audit(&base, &second).iter().filter(|e| e["action"] == "wipe").count() == 2
    });
    assert_eq!(node_state(&base, "x1"), "ready");
    assert_eq!(node_state(&base, "x4"), "down");

    // An operator retries x2's wipe (book: `lattice admin node wipe x2 --force`): refused without
    // `force` and for a node that is not quarantined, nothing wiped; then x2 is wiped again (the
    // image succeeds this time) and returns to the pool, the retry audited with who asked.
    let wipes_before = fake.wipes.lock().unwrap().clone();
    let (code, v) = call("POST", &format!("{base}/v1/nodes/x2/wipe"), Some(json!({})));
    assert_eq!((code, v["field"].as_str()), (400, Some("force")), "{v}");
    let (code, v) = call(
        "POST",
        &format!("{base}/v1/nodes/x1/wipe"),
        Some(json!({"force": true})),
    );
    assert_eq!(code, 409, "{v}");
    assert_eq!(*fake.wipes.lock().unwrap(), wipes_before, "nothing wiped by a refusal");
    let (code, v) = call(
        "POST",
        &format!("{base}/v1/nodes/x2/wipe"),
        Some(json!({"force": true})),
    );
    assert_eq!((code, v["claim"].as_str()), (202, Some(first.as_str())), "{v}");
    wait_until("x2 wiped again and back", Duration::from_secs(15), || {
        node_state(&base, "x2") == "ready"
    });
    assert_eq!(fake.wipes.lock().unwrap()["x2"], 2);
    wait_until("the retry's audit entries", Duration::from_secs(10), || {
        audit(&base, &first).iter().filter(|e| e["action"] == "wipe").count() == 3
    });
    let entries = audit(&base, &first);
    let retry = entries
        .iter()
        .position(|e| e["action"] == "wipe_retry")
        .unwrap_or_else(|| panic!("{entries:?}"));
    assert!(
        entries[retry]["detail"].as_str().unwrap().contains("retried by"),
        "{entries:?}"
    );
    assert!(
        entries[retry..]
            .iter()
            .any(|e| e["action"] == "wipe" && e["detail"].as_str().unwrap().starts_with("x2")),
        "{entries:?}"
    );
    assert_eq!(
        node_state(&base, "x3"),
        "down",
        "x3 stays quarantined until its own retry"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
