//! Helpers the runtime's integration tests share.

use lattice_runtime::{Running, RuntimeConfig, start};

/// Starts `n` members on loopback (member 1 bootstraps), each with `nodes` simulated nodes, a 100 ms
/// cycle, its store under `dir/m{id}`, and `extra` YAML appended to its config.
pub async fn start_quorum(dir: &std::path::Path, n: usize, nodes: u32, extra: &str) -> Vec<Running> {
    let grpc: Vec<u16> = (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
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
