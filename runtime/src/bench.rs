//! `lattice-runtime bench`: the performance goals, measured (not tested) on this machine.
//!
//! - `raft`: three quorum members on loopback (real gRPC, real redb fsyncs); N proposals one after
//!   another give the commit latency distribution (goal p99 < 10 ms), then N proposals with 64 in
//!   flight give commits per second.
//! - `submit`: a single-member runtime with simulated agents; N submissions through the REST API from
//!   8 concurrent clients give submissions per second (goal > 5,000/s).
//! - `heartbeats`: N agents (default 10,000) heartbeating every 10 s over gRPC for 20 s: the process's
//!   CPU share of one core (goal < 5 %; the in-process clients are included).

use lattice_adapters::{Member, QuorumCommand};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lattice-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn audit(i: usize) -> QuorumCommand {
    QuorumCommand::Audit {
        at_ms: i as u64,
        user: "bench".into(),
        alloc: format!("a{i}"),
        action: "attach".into(),
        detail: String::new(),
    }
}

/// Raft commit latency (sequential) and throughput (64 in flight) on 3 local members.
pub async fn raft(proposals: usize) -> anyhow::Result<String> {
    let mut members = Vec::new();
    let mut addrs = BTreeMap::new();
    let mut listeners = Vec::new();
    for id in 1..=3u64 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.insert(id, l.local_addr()?.to_string());
        listeners.push((id, l));
    }
    for (id, l) in listeners {
        members.push(Member::start_on(id, &scratch(&format!("raft-{id}")), l).await?);
    }
    members[0].bootstrap(&addrs).await?;
    let t0 = Instant::now();
    let leader = loop {
        if let Some(m) = members.iter().find(|m| m.is_leader()) {
            break m.clone();
        }
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(10), "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Warm up.
    for i in 0..50 {
        leader.propose(audit(i)).await?;
    }
    let mut lat = Vec::with_capacity(proposals);
    for i in 0..proposals {
        let t = Instant::now();
        leader.propose(audit(i)).await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    let mean = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..64 {
        let (m, next) = (leader.clone(), next.clone());
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= proposals {
                    return;
                }
                let _ = m.propose(audit(i)).await;
            }
        });
    }
    while set.join_next().await.is_some() {}
    let per_s = proposals as f64 / t.elapsed().as_secs_f64();
    for m in &members {
        m.shutdown().await;
    }
    Ok(format!(
        "raft commits (3 members, loopback): sequential {proposals}: p50_ms={:.2} p99_ms={:.2} mean_ms={mean:.2} max_ms={:.2}; 64 in flight: commits_per_s={per_s:.0}",
        pct(&lat, 50.0),
        pct(&lat, 99.0),
        lat.last().copied().unwrap_or(0.0)
    ))
}

/// Submissions per second through the REST API (8 concurrent clients).
pub async fn submit(requests: usize) -> anyhow::Result<String> {
    let dir = scratch("submit");
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 64\ncycle: 1s\nauth:\n  rate_limit_per_minute: 100000000\n",
        dir.display()
    );
    let cfg = crate::RuntimeConfig::parse("bench.yaml", &text)?;
    let rt = crate::start(cfg, true).await?;
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(10), "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let url = format!("http://{}/v1/allocations", rt.rest_addr);
    let body = serde_json::json!({
        "tenant": "bench", "entrypoint": "sleep 3600", "resources": {"nodes": 1}, "lifecycle": {"walltime": "2h"}
    });
    let clients = 8;
    let t = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (url, body) = (url.clone(), body.clone());
            let n = requests / clients + usize::from(c < requests % clients);
            tokio::task::spawn_blocking(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                let mut ok = 0usize;
                for _ in 0..n {
                    if agent.post(&url).send_json(&body).is_ok_and(|r| r.status() == 201) {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for h in handles {
        ok += h.await?;
    }
    let per_s = ok as f64 / t.elapsed().as_secs_f64();
    rt.shutdown().await;
    Ok(format!(
        "REST submissions ({clients} clients, {requests} requests, {ok} accepted): submissions_per_s={per_s:.0}"
    ))
}

/// CPU seconds (user + system) this process has used (Linux `/proc/self/stat`).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// `agents` simulated agents registered over gRPC, each heartbeating every 10 s (spread evenly) for
/// `seconds`: the CPU the process spends, as a share of one core. The in-process clients are counted
/// too, so the server's own share is at most this.
pub async fn heartbeats(agents: usize, seconds: u64) -> anyhow::Result<String> {
    let dir = scratch("heartbeats");
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: {agents}\ncycle: 1s\nauth:\n  rate_limit_per_minute: 100000000\n",
        dir.display()
    );
    let rt = crate::start(crate::RuntimeConfig::parse("bench.yaml", &text)?, true).await?;
    let url = format!("http://{}", rt.grpc_addr);
    let mut client = crate::grpc::pb::node_service_client::NodeServiceClient::connect(url).await?;
    let names: Vec<String> = (0..agents).map(|i| format!("sim-{i:03}")).collect();
    for n in &names {
        client.register(crate::grpc::pb::NodeRequest { id: n.clone() }).await?;
    }
    let per_s = agents as f64 / 10.0;
    let total = (per_s * seconds as f64) as usize;
    let interval = Duration::from_secs_f64(1.0 / per_s);
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut seq = vec![0u64; agents];
    let mut failed = 0usize;
    for k in 0..total {
        ticker.tick().await;
        let i = k % agents;
        seq[i] += 1;
        let r = client
            .heartbeat(crate::grpc::pb::HeartbeatRequest {
                id: names[i].clone(),
                seq: seq[i],
            })
            .await;
        failed += usize::from(r.is_err());
    }
    let (cpu, wall) = (cpu_seconds() - cpu0, t0.elapsed().as_secs_f64());
    rt.shutdown().await;
    Ok(format!(
        "heartbeats ({agents} agents every 10 s for {seconds} s: {total} over gRPC, {failed} failed): cpu_s={cpu:.2} wall_s={wall:.1} core_share_pct={:.2} (clients included)",
        100.0 * cpu / wall
    ))
}
