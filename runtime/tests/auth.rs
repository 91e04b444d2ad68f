//! API authentication and authorization: no token → 401; RS256 tokens checked against a JWKS file and
//! HS256 dev tokens; the seed's roles with tenant scoping (a user sees only their own allocations,
//! other tenants' are 404); node operations and admin endpoints by role; 429 with Retry-After.

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use lattice_runtime::{RuntimeConfig, start};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const SECRET: &str = "dev-secret-for-tests";

fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn claims(sub: &str, tenant: Option<&str>, roles: &[&str]) -> Value {
    json!({"sub": sub, "tenant": tenant, "roles": roles, "exp": jsonwebtoken::get_current_timestamp() + 600})
}

fn hs256(sub: &str, tenant: Option<&str>, roles: &[&str]) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &claims(sub, tenant, roles),
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

fn rs256(sub: &str, tenant: Option<&str>, roles: &[&str]) -> String {
    let pem = std::fs::read(fixtures().join("test-rs256.pem")).unwrap();
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("test-key".into());
    encode(
        &h,
        &claims(sub, tenant, roles),
        &EncodingKey::from_rsa_pem(&pem).unwrap(),
    )
    .unwrap()
}

async fn call(
    base: &str,
    token: Option<&str>,
    method: &'static str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value, Option<String>) {
    let url = format!("{base}{path}");
    let token = token.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let auth = token.map(|t| format!("Bearer {t}"));
        macro_rules! with_auth {
            ($req:expr) => {{
                let r = $req;
                match &auth {
                    Some(a) => r.header("Authorization", a),
                    None => r,
                }
            }};
        }
        let mut resp = match (method, body) {
            ("GET", _) => with_auth!(agent.get(&url)).call(),
            ("DELETE", _) => with_auth!(agent.delete(&url)).call(),
            ("POST", Some(b)) => with_auth!(agent.post(&url)).send_json(b),
            ("POST", None) => with_auth!(agent.post(&url)).send_empty(),
            _ => unreachable!(),
        }
        .unwrap();
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get("retry-after")
            .or_else(|| resp.headers().get("www-authenticate"))
            .map(|v| v.to_str().unwrap_or_default().to_string());
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            retry,
        )
    })
    .await
    .unwrap()
}

fn job(tenant: &str) -> Value {
    json!({"tenant": tenant, "entrypoint": "sleep 100", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1h"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_roles_tenant_scoping_and_rate_limits() {
    let dir = std::env::temp_dir().join(format!("lattice-auth-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 4\ncycle: 100ms\nauth:\n  mode: jwt\n  jwks_file: {}\n  hs256_secret: {SECRET}\n  rate_limit_per_minute: 40\n  idp_url: https://idp.example.org/realms/hpc\n  client_id: lattice\n",
        dir.display(),
        fixtures().join("test-jwks.json").display()
    );
    let rt = start(RuntimeConfig::parse("a.yaml", &text).unwrap(), true)
        .await
        .unwrap();
    let base = format!("http://{}", rt.rest_addr);
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let alice = hs256("alice", Some("physics"), &["User"]);
    let bob = hs256("bob", Some("physics"), &["User"]);
    let carol = rs256("carol", Some("physics"), &["TenantAdmin"]);
    let dave = hs256("dave", Some("bio"), &["User"]);
    let op = rs256("olga", None, &["Operator"]);
    let admin = rs256("root", None, &["SystemAdmin"]);

    // Unauthenticated: 401 with a Bearer challenge; /healthz stays open.
    let (status, _, challenge) = call(&base, None, "GET", "/v1/allocations", None).await;
    assert_eq!((status, challenge.as_deref()), (401, Some("Bearer")));
    let forged = encode(
        &Header::new(Algorithm::HS256),
        &claims("mallory", None, &["SystemAdmin"]),
        &EncodingKey::from_secret(b"guess"),
    )
    .unwrap();
    assert_eq!(call(&base, Some(&forged), "GET", "/v1/allocations", None).await.0, 401);
    assert_eq!(call(&base, None, "GET", "/healthz", None).await.0, 200);
    // Tenant administration is SystemAdmin's: a tenant admin's attempt changes nothing.
    let (status, _, _) = call(
        &base,
        Some(&carol),
        "POST",
        "/api/v1/tenants",
        Some(json!({"name": "rogue"})),
    )
    .await;
    assert_eq!(status, 403);
    let (_, list, _) = call(&base, Some(&admin), "GET", "/v1/tenants", None).await;
    assert!(!list.to_string().contains("rogue"), "{list}");
    let (status, v, _) = call(
        &base,
        Some(&admin),
        "POST",
        "/api/v1/tenants",
        Some(json!({"name": "chem", "max_nodes": 1})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    // Auth discovery is public, for `lattice login` to find the IdP.
    let (status, d, _) = call(&base, None, "GET", "/api/v1/auth/discovery", None).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        d,
        json!({"mode": "jwt", "issuer": null,
               "idp_url": "https://idp.example.org/realms/hpc", "client_id": "lattice"})
    );

    // Submitting: own tenant only; the submitter is the token's subject.
    let (status, v, _) = call(&base, Some(&alice), "POST", "/v1/allocations", Some(job("physics"))).await;
    assert_eq!(status, 201, "{v}");
    let a = v["id"].as_str().unwrap().to_string();
    let (status, v, _) = call(&base, Some(&alice), "POST", "/v1/allocations", Some(job("bio"))).await;
    assert_eq!((status, v["field"].as_str()), (403, Some("tenant")), "{v}");

    // Reading: the owner and the tenant admin see it; another user of the tenant and other tenants
    // get 404; lists are scoped the same way.
    let path = format!("/v1/allocations/{a}");
    let (status, v, _) = call(&base, Some(&alice), "GET", &path, None).await;
    assert_eq!((status, v["user"].as_str()), (200, Some("alice")));
    assert_eq!(call(&base, Some(&carol), "GET", &path, None).await.0, 200);
    assert_eq!(call(&base, Some(&bob), "GET", &path, None).await.0, 404);
    assert_eq!(call(&base, Some(&dave), "GET", &path, None).await.0, 404);
    let (_, v, _) = call(&base, Some(&bob), "GET", "/v1/allocations", None).await;
    assert_eq!(v["allocations"], json!([]));
    let (_, v, _) = call(&base, Some(&op), "GET", "/v1/allocations", None).await;
    assert_eq!(
        v["allocations"].as_array().unwrap().len(),
        1,
        "operators see everything"
    );

    // Node operations and admin endpoints by role.
    assert_eq!(
        call(&base, Some(&alice), "POST", "/v1/nodes/sim-001/drain", None)
            .await
            .0,
        403
    );
    assert_eq!(
        call(&base, Some(&op), "POST", "/v1/nodes/sim-001/drain", None).await.0,
        200
    );
    assert_eq!(
        call(&base, Some(&op), "POST", "/api/v1/admin/backup", None).await.0,
        403
    );
    assert_eq!(
        call(&base, Some(&admin), "POST", "/api/v1/admin/backup", None).await.0,
        200
    );

    // Terminals and task launches: only the owner (and admins). Another user of the tenant does not
    // even see it (404); an operator sees it but may not open a terminal in it nor launch in it (403).
    let attach = format!("/v1/allocations/{a}/attach");
    assert_eq!(call(&base, Some(&bob), "GET", &attach, None).await.0, 404);
    let (status, v, _) = call(&base, Some(&op), "GET", &attach, None).await;
    assert_eq!(status, 403, "{v}");
    let tasks = format!("/v1/allocations/{a}/tasks");
    let (status, _, _) = call(
        &base,
        Some(&op),
        "POST",
        &tasks,
        Some(json!({"entrypoint": "hostname"})),
    )
    .await;
    assert_eq!(status, 403);
    let (_, v, _) = call(&base, Some(&alice), "GET", &tasks, None).await;
    assert_eq!(v["launches"], json!([]), "no launch was made by a refusal");
    // Image cache orders: operators only.
    let warm = json!({"image": "prgenv-gnu/24.11:v1"});
    assert_eq!(
        call(&base, Some(&alice), "POST", "/v1/cache/warm", Some(warm.clone()))
            .await
            .0,
        403
    );
    let (_, v, _) = call(&base, Some(&op), "GET", "/v1/cache", None).await;
    assert_eq!(v["nodes"], json!({}), "nothing was ordered by the refusal");
    assert_eq!(
        call(&base, Some(&op), "POST", "/v1/cache/warm", Some(warm)).await.0,
        202
    );

    // Cancelling: not another user's (404 when it is invisible), but the tenant admin may.
    assert_eq!(call(&base, Some(&bob), "DELETE", &path, None).await.0, 404);
    assert_eq!(call(&base, Some(&carol), "DELETE", &path, None).await.0, 200);

    // Rate limit: the 41st request of a minute gets 429 with Retry-After (other users unaffected). If a
    // minute boundary falls inside the flood, its count restarts once: the limit still hits by 81.
    let flood = hs256("flood", Some("bio"), &["ReadOnly"]);
    let mut limited = None;
    for i in 0..90 {
        let (status, _, retry) = call(&base, Some(&flood), "GET", "/v1/nodes", None).await;
        if status == 429 {
            limited = Some((i, retry));
            break;
        }
    }
    let (i, retry) = limited.expect("the flood is limited");
    assert!((40..=80).contains(&i), "limited after {i} requests");
    let secs: u64 = retry.unwrap().parse().unwrap();
    assert!((1..=60).contains(&secs));
    assert_eq!(call(&base, Some(&dave), "GET", "/v1/nodes", None).await.0, 200);
    // The node-agent protocol is not rate limited: an agent token past its API limit still
    // registers, heartbeats and polls for work.
    let agent = hs256("agent-sim-001", None, &["Operator"]);
    for _ in 0..45 {
        call(&base, Some(&agent), "GET", "/v1/nodes", None).await;
    }
    assert_eq!(call(&base, Some(&agent), "GET", "/v1/nodes", None).await.0, 429);
    let reg = call(
        &base,
        Some(&agent),
        "POST",
        "/v1/nodes/sim-001/register",
        Some(json!({})),
    )
    .await;
    assert_eq!(reg.0, 200);
    for seq in 1..=50u64 {
        let hb = call(
            &base,
            Some(&agent),
            "POST",
            "/v1/nodes/sim-001/heartbeat",
            Some(json!({"seq": seq})),
        )
        .await;
        assert_eq!(hb.0, 200, "heartbeat {seq}");
    }
    // After a partition the agent replays what it buffered, in order; the node records the partition.
    // An unordered batch, or a current sequence at or below the last accepted one, is refused whole
    // (replay detection); buffered beats the server already took (their answer was lost) are skipped.
    let beat = |body: Value| call(&base, Some(&agent), "POST", "/v1/nodes/sim-001/heartbeat", Some(body));
    let unordered = json!({"seq": 56, "buffered": [{"seq": 52, "at_ms": 1000}, {"seq": 51, "at_ms": 2000}]});
    let r = beat(unordered).await;
    assert_eq!((r.0, r.1["field"].as_str()), (400, Some("buffered[1].seq")), "{}", r.1);
    let r = beat(json!({"seq": 54, "buffered": [{"seq": 51, "at_ms": 1000}, {"seq": 54, "at_ms": 2000}]})).await;
    assert_eq!((r.0, r.1["field"].as_str()), (400, Some("seq")), "{}", r.1);
    let r = beat(json!({"seq": 50, "buffered": []})).await;
    assert_eq!(
        (r.0, r.1["field"].as_str()),
        (400, Some("seq")),
        "a replayed request: {}",
        r.1
    );
    let batch = [(49, 500), (50, 900), (51, 1000), (52, 2000), (53, 3000)];
    let buffered: Vec<Value> = batch.iter().map(|(s, t)| json!({"seq": s, "at_ms": t})).collect();
    let r = beat(json!({"seq": 54, "buffered": buffered})).await;
    assert_eq!((r.0, r.1["buffered"].as_u64()), (200, Some(5)), "{}", r.1);
    let n = call(&base, Some(&admin), "GET", "/v1/nodes/sim-001", None).await;
    assert_eq!(
        n.1["last_partition"],
        json!({"from_ms": 1000, "to_ms": 3000, "heartbeats": 3}),
        "49 and 50 had been taken before: {}",
        n.1
    );
    assert_eq!(
        beat(json!({"seq": 53})).await.0,
        400,
        "54 was accepted: 53 is a replay now"
    );
    let work = call(
        &base,
        Some(&agent),
        "POST",
        "/v1/nodes/sim-001/work",
        Some(json!({"running": []})),
    )
    .await;
    assert_eq!(work.0, 200);
    rt.shutdown().await;
}
