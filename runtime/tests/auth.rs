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
               "idp_url": "https://idp.example.org/realms/hpc", "client_id": "lattice", "redirect_uri": null})
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

/// A stand-in for an OpenID provider's two public documents: its discovery document and its key set
/// (which the test swaps to rotate keys), counting key-set fetches.
struct StandInIdp {
    base: String,
    jwks: std::sync::Arc<std::sync::Mutex<String>>,
    fetches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn stand_in_idp(jwks_file: &str) -> StandInIdp {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let jwks = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::read_to_string(fixtures().join(jwks_file)).unwrap(),
    ));
    let fetches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (b, j, f) = (base.clone(), jwks.clone(), fetches.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // The rest of the request head.
            let mut h = String::new();
            while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let body = if line.starts_with("GET /.well-known/openid-configuration ") {
                json!({"issuer": b, "jwks_uri": format!("{b}/jwks")}).to_string()
            } else if line.starts_with("GET /jwks ") {
                f.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                j.lock().unwrap().clone()
            } else {
                let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                continue;
            };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    StandInIdp { base, jwks, fetches }
}

/// A standard token as an IdP issues it: no `tenant` or `roles` claim — a subject id, a username,
/// groups and scopes.
fn standard_token(key_file: &str, kid: &str, claims: Value) -> String {
    let pem = std::fs::read(fixtures().join(key_file)).unwrap();
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some(kid.into());
    encode(&h, &claims, &EncodingKey::from_rsa_pem(&pem).unwrap()).unwrap()
}

/// Standard OIDC: the keys come from the issuer's discovery document, a token without any custom
/// claim is mapped by the site's rules to a user of a tenant and a role, and a token signed with a
/// rotated key is accepted once the IdP publishes it (the old key then refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standard_oidc_tokens_discovered_keys_and_rotation() {
    let idp = stand_in_idp("test-jwks.json");
    let dir = std::env::temp_dir().join(format!("lattice-oidc-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 4\ncycle: 100ms\n\
         auth:\n  mode: jwt\n  issuer: {}\n  audience: lattice\n  jwks_refresh_min_s: 1\n  claims:\n    \
         user_claim: preferred_username\n    tenant_claim: groups\n    tenant_prefix: /tenants/\n    \
         role_rules:\n      - {{claim: groups, value: /hpc-ops, role: Operator}}\n",
        dir.display(),
        idp.base
    );
    let rt = start(RuntimeConfig::parse("a.yaml", &text).unwrap(), true)
        .await
        .unwrap();
    assert_eq!(
        idp.fetches.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "keys fetched at start"
    );
    let base = format!("http://{}", rt.rest_addr);
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exp = jsonwebtoken::get_current_timestamp() + 600;
    let claims = |user: &str, groups: &[&str], scope: &str| {
        json!({"iss": idp.base, "aud": "lattice", "sub": format!("uuid-of-{user}"), "preferred_username": user,
               "groups": groups, "scope": scope, "exp": exp})
    };
    let alice = standard_token(
        "test-rs256.pem",
        "test-key",
        claims("alice", &["/staff", "/tenants/physics"], "openid profile"),
    );
    let olga = standard_token("test-rs256.pem", "test-key", claims("olga", &["/hpc-ops"], "openid"));

    // Alice is a User of tenant physics: she submits there (and is named the submitter), not elsewhere.
    let (status, v, _) = call(&base, Some(&alice), "POST", "/v1/allocations", Some(job("physics"))).await;
    assert_eq!(status, 201, "{v}");
    let a = v["id"].as_str().unwrap().to_string();
    let (status, v, _) = call(&base, Some(&alice), "GET", &format!("/v1/allocations/{a}"), None).await;
    assert_eq!(
        (status, v["user"].as_str(), v["tenant"].as_str()),
        (200, Some("alice"), Some("physics"))
    );
    let (status, v, _) = call(&base, Some(&alice), "POST", "/v1/allocations", Some(job("bio"))).await;
    assert_eq!((status, v["field"].as_str()), (403, Some("tenant")), "{v}");
    // Olga is an operator by the site's group rule; Alice is not.
    assert_eq!(
        call(&base, Some(&alice), "POST", "/v1/nodes/sim-001/drain", None)
            .await
            .0,
        403
    );
    assert_eq!(
        call(&base, Some(&olga), "POST", "/v1/nodes/sim-001/drain", None)
            .await
            .0,
        200
    );
    // The wrong issuer or audience is refused.
    let mut other = claims("alice", &["/tenants/physics"], "openid");
    other["iss"] = json!("https://elsewhere.example.org");
    let forged = standard_token("test-rs256.pem", "test-key", other);
    assert_eq!(call(&base, Some(&forged), "GET", "/v1/allocations", None).await.0, 401);

    // The IdP rotates its keys: a token signed with the new key names a key id not yet known, the
    // keys are fetched again and it is accepted; the retired key's tokens are refused.
    // A configured audience must be present: a token the IdP issued another client (no `aud`) is
    // refused.
    let mut other = claims("alice", &["/tenants/physics"], "openid");
    other.as_object_mut().unwrap().remove("aud");
    let elsewhere = standard_token("test-rs256.pem", "test-key", other);
    assert_eq!(
        call(&base, Some(&elsewhere), "GET", "/v1/allocations", None).await.0,
        401
    );

    // Refetches are at most one per `jwks_refresh_min_s` (here 1 s) since the last.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let fetched = idp.fetches.load(std::sync::atomic::Ordering::SeqCst);
    *idp.jwks.lock().unwrap() = std::fs::read_to_string(fixtures().join("test-jwks-rotated.json")).unwrap();
    let rotated = standard_token(
        "test-rs256-rotated.pem",
        "rotated-key",
        claims("alice", &["/tenants/physics"], "openid"),
    );
    let (status, v, _) = call(&base, Some(&rotated), "GET", &format!("/v1/allocations/{a}"), None).await;
    assert_eq!((status, v["user"].as_str()), (200, Some("alice")), "{v}");
    assert_eq!(idp.fetches.load(std::sync::atomic::Ordering::SeqCst), fetched + 1);
    assert_eq!(call(&base, Some(&alice), "GET", "/v1/allocations", None).await.0, 401);
    // Unknown key ids within the interval fetch nothing more (no refetch storm from forged tokens).
    for kid in ["random-1", "random-2"] {
        let forged = standard_token("test-rs256.pem", kid, claims("alice", &["/tenants/physics"], "openid"));
        assert_eq!(call(&base, Some(&forged), "GET", "/v1/allocations", None).await.0, 401);
    }
    assert_eq!(idp.fetches.load(std::sync::atomic::Ordering::SeqCst), fetched + 1);
    // A known key id fetches nothing.
    let fetched = idp.fetches.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(call(&base, Some(&rotated), "GET", "/v1/allocations", None).await.0, 200);
    assert_eq!(idp.fetches.load(std::sync::atomic::Ordering::SeqCst), fetched);

    // A long-lived stream ends when the token it was opened with expires, saying so.
    let mut soon = claims("alice", &["/tenants/physics"], "openid");
    soon["exp"] = json!(jsonwebtoken::get_current_timestamp() + 3);
    let soon = standard_token("test-rs256-rotated.pem", "rotated-key", soon);
    let url = format!("{base}/v1/allocations/{a}/logs/stream");
    let opened = Instant::now();
    let (status, body) = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let mut r = agent
            .get(&url)
            .header("Authorization", format!("Bearer {soon}"))
            .call()
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("event: error") && body.contains("token expired"),
        "{body}"
    );
    assert!(
        opened.elapsed() < Duration::from_secs(20),
        "ended by the token's expiry, not the client's timeout"
    );
    rt.shutdown().await;
}
