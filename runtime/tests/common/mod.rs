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

/// A blocking REST call with a 5 s limit: GET, POST (with a body or none) or DELETE; (status, JSON body or the text
/// as a string; status 0 when no answer came).
#[allow(dead_code)]
pub fn call(method: &'static str, url: &str, body: Option<serde_json::Value>) -> (u16, serde_json::Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(5)))
        .build()
        .into();
    let r = match (method, body) {
        ("POST", Some(b)) => agent.post(url).send_json(b),
        ("POST", None) => agent.post(url).send_empty(),
        ("DELETE", _) => agent.delete(url).call(),
        _ => agent.get(url).call(),
    };
    match r {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
            )
        }
        Err(e) => (0, serde_json::Value::String(e.to_string())),
    }
}

/// Polls `ok` every 100 ms; fails the test naming `what` after `within`.
#[allow(dead_code)]
pub fn wait_until(what: &str, within: std::time::Duration, mut ok: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !ok() {
        assert!(t0.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A child process killed (SIGKILL) when dropped, however the test ends.
#[allow(dead_code)]
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `lattice-runtime` process on `config` (it bootstraps); its output goes to `log`.
#[allow(dead_code)]
pub fn runtime_process(config: &std::path::Path, log: &std::path::Path) -> Proc {
    runtime_process_with(config, log, true)
}

/// [`runtime_process`], bootstrapping the quorum or not.
#[allow(dead_code)]
pub fn runtime_process_with(config: &std::path::Path, log: &std::path::Path, bootstrap: bool) -> Proc {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    Proc(
        std::process::Command::new(env!("CARGO_BIN_EXE_lattice-runtime"))
            .arg("--config")
            .arg(config)
            .args(bootstrap.then_some("--bootstrap"))
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("lattice-runtime starts"),
    )
}

/// The `lattice-agent` binary: built beside `lattice-runtime` by `cargo test --workspace`.
#[allow(dead_code)]
pub fn agent_binary() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_BIN_EXE_lattice-runtime")).with_file_name("lattice-agent");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build --bin lattice-agent` (cargo test --workspace does)",
        p.display()
    );
    p
}

/// A `lattice-agent` process for `node` against `base`, polling fast, its files under `dir`, plus
/// `extra` arguments.
#[allow(dead_code)]
pub fn agent_process(base: &str, node: &str, dir: &std::path::Path, extra: &[&str]) -> Proc {
    let log = std::fs::File::create(dir.join(format!("agent-{node}.log"))).unwrap();
    Proc(
        std::process::Command::new(agent_binary())
            .args(["--node-id", node, "--quorum-endpoint", base])
            .args([
                "--poll",
                "100ms",
                "--heartbeat",
                "200ms",
                "--peer-listen",
                "127.0.0.1:0",
            ])
            .arg("--log-dir")
            .arg(dir.join(format!("logs-{node}")))
            .arg("--state-file")
            .arg(dir.join(format!("state-{node}.json")))
            .arg("--scratch-dir")
            .arg(dir.join(format!("scratch-{node}")))
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("lattice-agent starts"),
    )
}

/// Serves `app` (a stand-in for an external service) on a free loopback port from its own thread
/// and runtime, for tests whose runtime is a separate process: its base URL.
#[allow(dead_code)]
pub fn serve_on_thread(app: axum::Router) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    url
}
