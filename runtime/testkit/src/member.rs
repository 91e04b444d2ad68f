//! Members started in-process.

use lattice_runtime::{Running, RuntimeConfig, start};
use std::time::{Duration, Instant};

/// Starts `n` members on loopback (member 1 bootstraps), each with `nodes` simulated nodes, a 100 ms
/// cycle, its store under `dir/m{id}`, and `extra` YAML appended to its config.
pub async fn start_quorum(dir: &std::path::Path, n: usize, nodes: u32, extra: &str) -> Vec<Running> {
    let grpc: Vec<u16> = (0..n).map(|_| crate::http::free_port()).collect();
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

/// Starts one member from `yaml` (it bootstraps) and waits until it leads.
pub async fn start_leader(yaml: &str) -> Running {
    let rt = start(RuntimeConfig::parse("t.yaml", yaml).unwrap(), true)
        .await
        .unwrap();
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rt
}

/// A single-member control plane for blocking tests, on its own tokio runtime: `nodes` nodes, a
/// 100 ms cycle, its store under `dir/q` (`dir` made if missing), `extra` YAML appended; returned once
/// it leads. Keep the runtime alive as long as the member.
pub fn control_plane(dir: &std::path::Path, nodes: u32, extra: &str) -> (tokio::runtime::Runtime, Running) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = RuntimeConfig::parse(
        "t.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: {nodes}\ncycle: 100ms\n{extra}",
            dir.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let running = rt.block_on(start(cfg, true)).unwrap();
    let t0 = Instant::now();
    while !running.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no leader");
        std::thread::sleep(Duration::from_millis(50));
    }
    (rt, running)
}
