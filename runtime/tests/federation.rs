//! Federation between two real runtimes on loopback (built with `--features federation`): site A's
//! users submit to site B by name or by the broker's routing, follow the allocation from A, and
//! the trust layer refuses what it must (a wrong key, a replay, a revoked workspace, B's policy).
//! B killed: A's retries give up and say so, `--site=auto` runs the work at home. A site whose
//! quorum has no leader answers 503 with `Retry-After: 5`.
#![cfg(feature = "federation")]

mod common;
use common::{Proc, call, free_port, runtime_process, wait_until};
use lattice_runtime::federation::sign::{self, Signed, WorkspaceKey};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECRET: &str = "out-of-band shared workspace secret";

struct Site {
    base: String,
    _proc: Proc,
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lattice-federation-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A single-member site with 8 simulated nodes and `federation` YAML (indented under the key).
fn site(d: &Path, name: &str, federation: &str, members: Option<&str>) -> Site {
    std::fs::write(d.join("workspace.key"), format!("{SECRET}\n")).unwrap();
    let (rest, grpc) = (free_port(), free_port());
    let members = members.map(|m| format!("members:\n{m}")).unwrap_or_default();
    let config = d.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "node_id: 1\nrest_listen: 127.0.0.1:{rest}\ngrpc_listen: 127.0.0.1:{grpc}\n{}data_dir: data-{name}\n\
             simulated_nodes: 8\ncycle: 100ms\nfederation:\n  enabled: true\n  site: {name}\n  workspaces:\n    \
             hpc-general: file://{}\n  sync_interval: 1s\n  retries: 2\n  backoff: 100ms\n  timeout: 2s\n{federation}",
            members.replace("{grpc}", &grpc.to_string()),
            d.join("workspace.key").display()
        ),
    )
    .unwrap();
    let proc = runtime_process(&config, &d.join(format!("{name}.log")));
    Site {
        base: format!("http://127.0.0.1:{rest}"),
        _proc: proc,
    }
}

fn serving(base: &str) {
    wait_until("the runtime to serve", Duration::from_secs(30), || {
        call("GET", &format!("{base}/v1/allocations"), None).0 == 200
    });
}

fn ok(code: u16, v: &Value, want: u16) {
    assert_eq!(code, want, "{v}");
}

fn local_ids(base: &str) -> Vec<String> {
    let (code, v) = call("GET", &format!("{base}/v1/allocations"), None);
    ok(code, &v, 200);
    v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect()
}

fn job(tenant: &str, nodes: u32) -> Value {
    json!({"tenant": tenant, "user": "alice", "entrypoint": "sleep 1", "resources": {"nodes": nodes},
           "lifecycle": {"type": "bounded", "walltime": "10m"}})
}

fn submit(base: &str, site: &str, request: Value) -> (u16, Value) {
    call(
        "POST",
        &format!("{base}/api/v1/federation/allocations"),
        Some(json!({"site": site, "request": request})),
    )
}

/// A sample's value: the line of metric `name` carrying every `labels` pair (in any order).
fn metric(base: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let text = call("GET", &format!("{base}/metrics"), None).1;
    text.as_str()?
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A request signed like a peer's (or not: `key` is whichever secret the caller holds).
fn signed(base: &str, method: &str, path: &str, body: &[u8], secret: &str, nonce: &str) -> (u16, Value) {
    let key = WorkspaceKey::derive("hpc-general", secret.as_bytes());
    let t = lattice_runtime::federation::now_ms();
    let sig = key.sign(&Signed {
        method,
        path,
        time_ms: t,
        nonce,
        body,
        site: "site-a",
        workspace: "hpc-general",
    });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let r = agent
        .post(&format!("{base}{path}"))
        .header(sign::SITE, "site-a")
        .header(sign::WORKSPACE, "hpc-general")
        .header(sign::TIME, &t.to_string())
        .header(sign::NONCE, nonce)
        .header(sign::SIGNATURE, &sig)
        .header("content-type", "application/json")
        .send(body);
    match r {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            let retry = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let mut v: Value =
                serde_json::from_str(&resp.body_mut().read_to_string().unwrap_or_default()).unwrap_or(Value::Null);
            if let (Some(r), Some(o)) = (retry, v.as_object_mut()) {
                o.insert("retry_after".into(), r.into());
            }
            (status, v)
        }
        Err(e) => (0, json!(e.to_string())),
    }
}

#[test]
fn a_job_submitted_at_a_runs_at_b_and_is_followed_from_a() {
    let d = dir("two-sites");
    let a = site(&d, "site-a", "  energy_price: 0.30\n", None);
    let b = site(
        &d,
        "site-b",
        "  energy_price: 0.10\n  uenvs: [prgenv-gnu/24.11:v1]\n  datasets:\n    - {name: s3://climate/era5, size_gb: 2000}\n  \
         accept:\n    site-a:\n      tenants: {physics: physics-remote}\n      max_nodes: 4\n",
        None,
    );
    serving(&a.base);
    serving(&b.base);
    let doc = call("GET", &format!("{}/openapi.json", a.base), None).1;
    for p in [
        "/api/v1/federation/allocations",
        "/api/v1/admin/federation",
        "/federation/v1/catalog",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} documented");
    }

    // Without a peer, a site routes nothing away.
    let (code, v) = submit(&a.base, "site-b", job("physics", 2));
    ok(code, &v, 409);
    assert!(
        v["error"].as_str().unwrap().contains("no federation peer site-b"),
        "{v}"
    );
    assert!(local_ids(&a.base).is_empty());

    // Each site adds the other (its key exchanged out of band: the same file here).
    for (at, name, peer) in [(&a, "site-b", &b), (&b, "site-a", &a)] {
        let (code, v) = call(
            "POST",
            &format!("{}/api/v1/admin/federation/peers", at.base),
            Some(json!({"name": name, "endpoint": peer.base, "workspace": "hpc-general"})),
        );
        ok(code, &v, 200);
    }
    // A workspace without a key here is refused (nothing committed).
    let (code, v) = call(
        "POST",
        &format!("{}/api/v1/admin/federation/peers", a.base),
        Some(json!({"name": "site-c", "endpoint": "http://127.0.0.1:1", "workspace": "other"})),
    );
    ok(code, &v, 400);
    assert_eq!(v["field"], "workspace");

    // A fetches B's catalog: 8 nodes, its price, its data, physics accepted.
    wait_until("B's catalog at A", Duration::from_secs(20), || {
        let v = call("GET", &format!("{}/api/v1/admin/federation", a.base), None).1;
        v["peers"][0]["status"] == "healthy" && v["peers"][0]["catalog"]["nodes"] == 8
    });
    let st = call("GET", &format!("{}/api/v1/admin/federation", a.base), None).1;
    assert_eq!(st["peers"].as_array().unwrap().len(), 1, "{st}");
    let cat = &st["peers"][0]["catalog"];
    assert_eq!(cat["energy_price"], 0.1);
    assert_eq!(cat["tenants"], json!(["physics"]));
    assert_eq!(cat["datasets"][0]["name"], "s3://climate/era5");

    // `--site=site-b`: it runs at B, as alice@site-a under the tenant B's policy maps physics to.
    let (code, v) = submit(&a.base, "site-b", job("physics", 2));
    ok(code, &v, 201);
    assert_eq!(v["site"], "site-b");
    let id = v["id"].as_str().unwrap().to_string();
    assert!(local_ids(&a.base).is_empty(), "nothing queued at A");
    let at_b = call("GET", &format!("{}/v1/allocations/{id}", b.base), None).1;
    assert_eq!(at_b["tenant"], "physics-remote", "{at_b}");
    assert_eq!(at_b["user"], "alice@site-a");
    assert_eq!(at_b["tags"]["federation.origin"], "site-a");

    // Status at A: through the broker, until B ran it.
    wait_until(
        "the allocation to complete at B, seen from A",
        Duration::from_secs(30),
        || {
            let (code, v) = call(
                "GET",
                &format!("{}/api/v1/federation/allocations/site-b/{id}", a.base),
                None,
            );
            code == 200 && v["state"] == "completed" && v["site"] == "site-b"
        },
    );
    // B reports the end to A (book: "On completion: Site B reports results, Site A's user
    // notified"): A records it at its quorum for alice.
    wait_until("B's report of the end at A", Duration::from_secs(20), || {
        let v = call("GET", &format!("{}/api/v1/federation/ended", a.base), None).1;
        v["ended"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["id"] == id.as_str()))
    });
    let v = call("GET", &format!("{}/api/v1/federation/ended", a.base), None).1;
    let end = v["ended"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (&end["site"], &end["user"], &end["tenant"], &end["state"]),
        (
            &json!("site-b"),
            &json!("alice"),
            &json!("physics"),
            &json!("completed")
        ),
        "{end}"
    );
    assert!(end["ended_ms"].as_u64().unwrap() > 0);
    // A report is kept once per site and id: a repeat (as a peer's next leader sends) changes
    // nothing; a state that is not an end is refused.
    let report = |state: &str| {
        serde_json::to_vec(
            &json!({"allocations": [{"id": "a-000042", "user": "bob", "tenant": "physics",
            "state": state, "ended_ms": 5}]}),
        )
        .unwrap()
    };
    let path = "/federation/v1/ended";
    let (code, v) = signed(&b.base, "POST", path, &report("running"), SECRET, "e-1");
    ok(code, &v, 400);
    let (code, v) = signed(&b.base, "POST", path, &report("completed"), SECRET, "e-2");
    ok(code, &v, 200);
    assert_eq!(v["recorded"], 1);
    let (code, v) = signed(&b.base, "POST", path, &report("failed"), SECRET, "e-3");
    ok(code, &v, 200);
    assert_eq!(v["recorded"], 0);
    let v = call("GET", &format!("{}/api/v1/federation/ended", b.base), None).1;
    let ends = v["ended"].as_array().unwrap();
    assert_eq!(ends.len(), 1, "{v}");
    assert_eq!(
        (&ends[0]["site"], &ends[0]["state"]),
        (&json!("site-a"), &json!("completed"))
    );
    let (code, v) = call(
        "GET",
        &format!("{}/api/v1/federation/allocations/site-b/{id}/logs", a.base),
        None,
    );
    ok(code, &v, 200);
    assert_eq!(v["id"], id.as_str());
    let (code, v) = call("GET", &format!("{}/api/v1/federation/allocations", a.base), None);
    ok(code, &v, 200);
    let listed: Vec<&str> = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec![id.as_str()]);

    // `--site=auto` with input data B holds (and cheaper power there): B.
    let mut with_data = job("physics", 1);
    with_data["data"] = json!({"mounts": [{"source": "s3://climate/era5/2020", "target": "/data"}]});
    with_data["environment"] = json!({"uenv": "prgenv-gnu/24.11:v1"});
    let (code, v) = submit(&a.base, "auto", with_data.clone());
    ok(code, &v, 201);
    assert_eq!(v["site"], "site-b", "{v}");
    let b_scores = v["routing"]["scores"].as_array().unwrap();
    assert!(
        b_scores
            .iter()
            .any(|s| s["site"] == "site-b" && s["data_gravity"] == 1.0),
        "{v}"
    );
    // ... but a tenant B does not accept stays home.
    let mut chem = with_data.clone();
    chem["tenant"] = json!("chemistry");
    let (code, v) = submit(&a.base, "auto", chem);
    ok(code, &v, 201);
    assert_eq!(v["site"], "site-a", "{v}");
    assert_eq!(local_ids(&a.base), vec![v["id"].as_str().unwrap().to_string()]);

    // B's policy: at most 4 nodes from A. Refused, nothing queued at B.
    let before_b = local_ids(&b.base);
    let (code, v) = submit(&a.base, "site-b", job("physics", 6));
    ok(code, &v, 403);
    assert!(v["error"].as_str().unwrap().contains("at most 4"), "{v}");
    assert_eq!(local_ids(&b.base), before_b);

    // The trust layer at B: a wrong key, then a replayed nonce; neither queues anything.
    let body = serde_json::to_vec(&json!({"user": "mallory", "request": job("physics", 1)})).unwrap();
    let path = "/federation/v1/allocations";
    let (code, v) = signed(&b.base, "POST", path, &body, "a guessed secret", "n-1");
    ok(code, &v, 401);
    let (code, v) = signed(&b.base, "POST", path, &body, SECRET, "n-2");
    ok(code, &v, 201);
    let (code, v) = signed(&b.base, "POST", path, &body, SECRET, "n-2");
    ok(code, &v, 401);
    assert!(v["error"].as_str().unwrap().contains("replayed"), "{v}");
    assert_eq!(
        local_ids(&b.base).len(),
        before_b.len() + 1,
        "only the genuine request queued"
    );

    // Metrics at A.
    let (peer_b, accepted) = (r#"peer="site-b""#, r#"result="accepted""#);
    let m = |name: &str, labels: &[&str]| metric(&a.base, name, labels);
    let proposals = "lattice_federation_proposals_total";
    assert_eq!(m(proposals, &[peer_b, accepted]), Some(2.0));
    assert_eq!(m(proposals, &[peer_b, r#"result="rejected""#]), Some(1.0));
    assert_eq!(m("lattice_federation_peer_status", &[peer_b]), Some(1.0));
    assert_eq!(m("lattice_federation_peer_stale", &[peer_b]), Some(0.0));
    let dataset = r#"dataset="s3://climate/era5/2020""#;
    assert_eq!(
        m("lattice_federation_data_gravity_score", &[peer_b, dataset]),
        Some(1.0)
    );
    assert!(m("lattice_federation_proposal_latency_seconds_count", &[peer_b]).unwrap() >= 3.0);
    // B counted what A proposed (and the genuine signed request).
    assert_eq!(metric(&b.base, proposals, &[r#"peer="site-a""#, accepted]), Some(3.0));

    // B revokes the workspace: instant defederation. A's request is refused at once (not retried,
    // nothing queued at B).
    let (code, v) = call(
        "POST",
        &format!("{}/api/v1/admin/federation/workspaces/hpc-general/revoke", b.base),
        None,
    );
    ok(code, &v, 200);
    let before_b = local_ids(&b.base);
    let (code, v) = submit(&a.base, "site-b", job("physics", 1));
    ok(code, &v, 403);
    assert!(v["error"].as_str().unwrap().contains("revoked"), "{v}");
    assert_eq!(local_ids(&b.base), before_b);

    // B gone: A retries (1 + 2 retries), then says so; nothing queued at A.
    drop(b);
    let before_a = local_ids(&a.base);
    let (code, v) = submit(&a.base, "site-b", job("physics", 1));
    ok(code, &v, 503);
    assert!(v["error"].as_str().unwrap().contains("after 3 attempt(s)"), "{v}");
    assert_eq!(local_ids(&a.base), before_a);
    assert_eq!(m(proposals, &[peer_b, r#"result="timeout""#]), Some(1.0));
    let st = call("GET", &format!("{}/api/v1/admin/federation", a.base), None).1;
    // Degraded by the failure (or already stale: no catalog for two 1 s intervals).
    assert!(
        ["degraded", "stale"].contains(&st["peers"][0]["status"].as_str().unwrap()),
        "{st}"
    );
    assert!(st["peers"][0]["last_error"].is_string(), "{st}");
    // `--site=auto` falls back to this site.
    let (code, v) = submit(&a.base, "auto", with_data);
    ok(code, &v, 201);
    assert_eq!(v["site"], "site-a", "{v}");
    assert!(
        v["routing"]["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("instead")),
        "{v}"
    );
    assert_eq!(local_ids(&a.base).len(), before_a.len() + 1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_site_without_a_leader_answers_503_with_retry_after() {
    let d = dir("election");
    // Two members configured, one running: no majority, no leader.
    let absent = free_port();
    let c = site(
        &d,
        "site-c",
        "",
        Some(&format!("  1: 127.0.0.1:{{grpc}}\n  2: 127.0.0.1:{absent}\n")),
    );
    wait_until("the member to serve", Duration::from_secs(20), || {
        call("GET", &format!("{}/healthz", c.base), None).0 == 200
    });
    let body = serde_json::to_vec(&json!({"user": "alice", "request": job("physics", 1)})).unwrap();
    let (code, v) = signed(&c.base, "POST", "/federation/v1/allocations", &body, SECRET, "n-1");
    ok(code, &v, 503);
    assert_eq!(v["retry_after"], "5", "{v}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The federation block for an in-process site (the workspace key file under `d`).
fn federation_yaml(d: &Path, name: &str, more: &str) -> String {
    std::fs::write(d.join("workspace.key"), format!("{SECRET}\n")).unwrap();
    format!(
        "federation:\n  enabled: true\n  site: {name}\n  workspaces:\n    hpc-general: file://{}\n  \
         sync_interval: 1s\n  retries: 1\n  backoff: 100ms\n  timeout: 2s\n{more}",
        d.join("workspace.key").display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_election_lasts_over_10_s_is_degraded_and_takes_nothing() {
    let d = dir("long-election");
    let b_yaml = federation_yaml(
        &d,
        "site-b",
        "  accept:\n    site-a:\n      tenants: {physics: physics}\n",
    );
    let mut b = common::start_quorum(&d, 3, 4, &b_yaml).await;
    let a_yaml = format!(
        "node_id: 1\nrest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:{}\ndata_dir: {}/a\nsimulated_nodes: 4\ncycle: 100ms\n{}",
        free_port(),
        d.display(),
        federation_yaml(&d, "site-a", "")
    );
    let a = common::start_leader(&a_yaml).await;
    let a_base = format!("http://{}", a.rest_addr);
    let b_leader = loop {
        if let Some(i) = b.iter().position(|m| m.shared.member.is_leader()) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let endpoints: Vec<String> = b.iter().map(|m| format!("http://{}", m.rest_addr)).collect();
    let (code, v) = common::http(
        "POST",
        format!("{a_base}/api/v1/admin/federation/peers"),
        Some(json!({"name": "site-b", "endpoints": endpoints, "workspace": "hpc-general"})),
    )
    .await;
    ok(code, &v, 200);
    let b_base = format!("http://{}", b[b_leader].rest_addr);
    let (code, v) = common::http(
        "POST",
        format!("{b_base}/api/v1/admin/federation/peers"),
        Some(json!({"name": "site-a", "endpoint": a_base, "workspace": "hpc-general"})),
    )
    .await;
    ok(code, &v, 200);
    let status = |a_base: String| async move {
        common::http("GET", format!("{a_base}/api/v1/admin/federation"), None)
            .await
            .1["peers"][0]
            .clone()
    };
    let t0 = std::time::Instant::now();
    while status(a_base.clone()).await["status"] != "healthy" {
        assert!(t0.elapsed() < Duration::from_secs(20), "B healthy at A");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // B's leader and one follower stop: the last member cannot elect anyone.
    let survivor = (b_leader + 1) % 3;
    let mut stopped = Vec::new();
    for i in (0..3).rev().filter(|i| *i != survivor) {
        stopped.push(b.remove(i));
    }
    for m in stopped {
        m.shutdown().await;
    }
    // Its catalog, still served, says degraded once the election has lasted 10 s; A marks B degraded.
    let t0 = std::time::Instant::now();
    loop {
        let p = status(a_base.clone()).await;
        if p["catalog"]["status"] == "degraded" && p["status"] == "degraded" {
            assert!(t0.elapsed() >= Duration::from_secs(5), "not at once (after 10 s): {p}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(25), "B degraded at A: {p}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A submission gets the survivor's 503 (Retry-After: 5) until A's retries are spent: nothing queued.
    let (code, v) = common::http(
        "POST",
        format!("{a_base}/api/v1/federation/allocations"),
        Some(json!({"site": "site-b", "request": job("physics", 1)})),
    )
    .await;
    ok(code, &v, 503);
    assert!(v["error"].as_str().unwrap().contains("electing a leader"), "{v}");
    assert!(b[0].shared.control.lock().await.list().is_empty());
    for m in b {
        m.shutdown().await;
    }
    a.shutdown().await;
    let _ = std::fs::remove_dir_all(&d);
}
