//! Helpers the runtime's integration tests share (each test file uses some of them).

use lattice_runtime::{Running, RuntimeConfig, start};

/// Starts `n` members on loopback (member 1 bootstraps), each with `nodes` simulated nodes, a 100 ms
/// cycle, its store under `dir/m{id}`, and `extra` YAML appended to its config.
#[allow(dead_code)]
pub async fn start_quorum(dir: &std::path::Path, n: usize, nodes: u32, extra: &str) -> Vec<Running> {
    let grpc: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let members: String = grpc
        .iter()
        .enumerate()
        .map(|(i, p)| format!("  {}: 127.0.0.1:{p}\n", i + 1))
        .collect();
    let mut rts = Vec::new();
    for (i, p) in grpc.iter().enumerate() {
        let text = format!(
            "node_id: {id}\nrest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:{p}\ndata_dir: {d}/m{id}\nsimulated_nodes: {nodes}\ncycle: 100ms\nmembers:\n{members}{extra}",
            id = i + 1,
            d = dir.display(),
        );
        rts.push(
            start(RuntimeConfig::parse("m.yaml", &text).unwrap(), i == 0)
                .await
                .unwrap(),
        );
    }
    rts
}

/// A loopback port free at the time of asking, outside the range outgoing connections take
/// (see [`lattice_adapters::raft_net::loopback_port`]).
#[allow(dead_code)]
pub fn free_port() -> u16 {
    lattice_adapters::raft_net::loopback_port().unwrap()
}

/// Starts one member from `yaml` (it bootstraps) and waits until it leads.
#[allow(dead_code)]
pub async fn start_leader(yaml: &str) -> Running {
    let rt = start(RuntimeConfig::parse("t.yaml", yaml).unwrap(), true)
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "no leader");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    rt
}

/// A blocking REST call off the async runtime: POST with a body, else GET (or DELETE when
/// `method` says so); (status, JSON body or the text as a string).
#[allow(dead_code)]
pub async fn http(method: &'static str, url: String, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut r = match (method, body) {
            (_, Some(b)) => agent.post(&url).send_json(b),
            ("DELETE", None) => agent.delete(&url).call(),
            _ => agent.get(&url).call(),
        }
        .unwrap();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (
            r.status().as_u16(),
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    })
    .await
    .unwrap()
}

/// Serves `app` (a stand-in for an external service) on a free loopback port: its base URL.
#[allow(dead_code)]
pub async fn serve_stand_in(app: axum::Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

/// A control plane (no server) on `nodes` plain nodes with `profiles/balanced.yaml`'s vClusters, for
/// tests that drive it directly on a virtual clock.
#[allow(dead_code)]
pub fn balanced_control(nodes: u32) -> lattice_runtime::control::Control {
    let inv = lattice_traces::homogeneous(nodes);
    let prof = lattice_traces::read_profile(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiles/balanced.yaml"
    )))
    .unwrap();
    let vcs = prof
        .vclusters
        .iter()
        .map(|(n, p)| (n.clone(), p.config(None)))
        .collect();
    lattice_runtime::control::Control::new(&inv, vcs, &Default::default(), None).unwrap()
}
