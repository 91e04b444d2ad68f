//! TLS and mTLS on loopback with the test-only material in `tests/fixtures/tls` (`make-tls.sh`):
//! a 3-member quorum whose Raft traffic, REST and gRPC all run over mTLS schedules a job submitted
//! with a client certificate; no certificate, an untrusted one, or plaintext is refused on both ports;
//! and TLS without client certificates serves any client that trusts the site CA.

mod common;
use lattice_runtime::grpc::pb;
use lattice_runtime::{RuntimeConfig, start};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

fn pem(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

/// A REST client trusting the test CA, presenting `client` (`"client"`, `"rogue-client"`) if given.
fn agent(client: Option<&str>) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let ca = Certificate::from_pem(&pem("ca.pem")).unwrap();
    let cert = client.map(|c| {
        let chain = [Certificate::from_pem(&pem(&format!("{c}.pem"))).unwrap()];
        ClientCert::new_with_certs(&chain, PrivateKey::from_pem(&pem(&format!("{c}.key"))).unwrap())
    });
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::new_with_certs(&[ca]))
        .client_cert(cert)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .build()
        .into()
}

/// `Ok((status, body))`, or the transport error (a refused handshake).
async fn call(
    agent: ureq::Agent,
    method: &'static str,
    url: String,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    tokio::task::spawn_blocking(move || {
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
    })
    .await
    .unwrap()
}

fn tls_block(mtls: bool) -> String {
    format!(
        "tls:\n  cert: {}\n  key: {}\n  ca: {}\n  mtls: {mtls}\n",
        fixture("member.pem").display(),
        fixture("member.key").display(),
        fixture("ca.pem").display()
    )
}

async fn grpc_channel(addr: std::net::SocketAddr, identity: Option<&str>) -> Result<tonic::transport::Channel, String> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem("ca.pem")))
        .domain_name("127.0.0.1");
    if let Some(c) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(
            pem(&format!("{c}.pem")),
            pem(&format!("{c}.key")),
        ));
    }
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_three_member_quorum_over_mtls_schedules_and_refuses_clients_without_certificates() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-mtls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rts = common::start_quorum(&dir, 3, 4, &tls_block(true)).await;
    // Raft runs over mTLS: an election and replication need the members' certificates.
    let t0 = Instant::now();
    let leader = loop {
        if let Some(i) = rts.iter().position(|r| r.shared.member.is_leader()) {
            break i;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "a leader within 10 s over mTLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let base = format!("https://{}", rts[leader].rest_addr);
    let job = json!({"tenant": "bio", "entrypoint": "sleep 0.2", "resources": {"nodes": 2},
                     "lifecycle": {"walltime": "1m"}});
    let (status, v) = call(
        agent(Some("client")),
        "POST",
        format!("{base}/v1/allocations"),
        Some(job.clone()),
    )
    .await
    .unwrap();
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    loop {
        let (_, v) = call(
            agent(Some("client")),
            "GET",
            format!("{base}/v1/allocations/{id}"),
            None,
        )
        .await
        .unwrap();
        if v["state"] == "completed" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Every member applied the assignment (replicated over mTLS).
    for r in &rts {
        let t0 = Instant::now();
        while r.shared.member.state().await.commits < 1 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "member {} applied the commit",
                r.shared.member.id
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // REST refuses a client without a certificate, with an untrusted one, and plaintext.
    for who in [None, Some("rogue-client")] {
        let r = call(agent(who), "POST", format!("{base}/v1/allocations"), Some(job.clone())).await;
        assert!(r.is_err(), "{who:?} was served: {r:?}");
    }
    let plain = call(
        agent(None),
        "GET",
        format!("http://{}/healthz", rts[leader].rest_addr),
        None,
    )
    .await;
    assert!(!matches!(plain, Ok((200, _))), "plaintext served: {plain:?}");

    // gRPC: the same.
    let addr = rts[leader].grpc_addr;
    let ch = grpc_channel(addr, Some("client")).await.unwrap();
    let mut nodes = pb::node_service_client::NodeServiceClient::new(ch);
    let all = nodes.list(pb::ListNodesRequest::default()).await.unwrap().into_inner();
    assert_eq!(all.nodes.len(), 4);
    for who in [None, Some("rogue-client")] {
        let refused = match grpc_channel(addr, who).await {
            Err(_) => true,
            Ok(ch) => pb::node_service_client::NodeServiceClient::new(ch)
                .list(pb::ListNodesRequest::default())
                .await
                .is_err(),
        };
        assert!(refused, "gRPC served {who:?}");
    }
    for r in rts {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_client_certificates_serves_clients_that_trust_the_ca() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\ncycle: 100ms\n{}",
        dir.display(),
        tls_block(false)
    );
    let rt = start(RuntimeConfig::parse("t.yaml", &text).unwrap(), true)
        .await
        .unwrap();
    let (status, v) = call(agent(None), "GET", format!("https://{}/healthz", rt.rest_addr), None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{v}");
    let ch = grpc_channel(rt.grpc_addr, None).await.unwrap();
    let mut nodes = pb::node_service_client::NodeServiceClient::new(ch);
    assert_eq!(
        nodes
            .list(pb::ListNodesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .nodes
            .len(),
        2
    );
    // A bad certificate path fails the start naming the field and the file.
    let bad = text
        .replace("member.pem", "missing.pem")
        .replace(&format!("{}/q", dir.display()), &format!("{}/q2", dir.display()));
    let e = start(RuntimeConfig::parse("t.yaml", &bad).unwrap(), true)
        .await
        .err()
        .unwrap();
    assert!(
        format!("{e:#}").contains("tls.cert") && format!("{e:#}").contains("missing.pem"),
        "{e:#}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_agents_are_identified_by_their_certificate_cn() {
    let dir = std::env::temp_dir().join(format!("lattice-runtime-agent-cn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // JWT auth on, yet an agent needs no token: its bootstrap certificate is its identity (mTLS first).
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\nsimulate_agents: false\ncycle: 100ms\nauth:\n  mode: jwt\n  hs256_secret: not-used-by-agents\n{}",
        dir.display(),
        tls_block(true)
    );
    let rt = common::start_leader(&text).await;
    let base = format!("https://{}", rt.rest_addr);
    let post = |who: &'static str, path: &str, body: Value| {
        call(agent(Some(who)), "POST", format!("{base}{path}"), Some(body))
    };
    let (s, v) = post("agent-sim-000", "/v1/nodes/sim-000/register", json!({}))
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    let (s, v) = post("agent-sim-000", "/v1/nodes/sim-000/heartbeat", json!({"seq": 1}))
        .await
        .unwrap();
    assert_eq!((s, v["state"].as_str()), (200, Some("ready")), "{v}");
    let (s, _) = post("agent-sim-000", "/v1/nodes/sim-000/work", json!({"running": []}))
        .await
        .unwrap();
    assert_eq!(s, 200);
    // sim-000's certificate cannot speak for sim-001, nor a user's certificate for any node.
    let (s, v) = post("agent-sim-000", "/v1/nodes/sim-001/register", json!({}))
        .await
        .unwrap();
    assert_eq!((s, v["field"].as_str()), (403, Some("node")), "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("names sim-000, not node sim-001"),
        "{v}"
    );
    let (s, _) = post(
        "agent-sim-000",
        "/v1/allocations/a-000001/exit",
        json!({"node": "sim-001", "kind": "exited"}),
    )
    .await
    .unwrap();
    assert_eq!(s, 403);
    let (s, _) = post("client", "/v1/nodes/sim-001/heartbeat", json!({"seq": 1}))
        .await
        .unwrap();
    assert_eq!(s, 403);
    // The certificate is not a token for the rest of the API.
    let (s, _) = call(
        agent(Some("agent-sim-000")),
        "GET",
        format!("{base}/v1/allocations"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(s, 401);
    // gRPC: the same identity and the same check.
    let ch = grpc_channel(rt.grpc_addr, Some("agent-sim-001")).await.unwrap();
    let mut nodes = pb::node_service_client::NodeServiceClient::new(ch);
    nodes
        .register(pb::NodeRequest {
            id: "sim-001".into(),
            urgent: false,
        })
        .await
        .unwrap();
    let e = nodes
        .register(pb::NodeRequest {
            id: "sim-000".into(),
            urgent: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{}", e.message());
    rt.shutdown().await;
}
