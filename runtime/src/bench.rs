//! `lattice-runtime bench`: the performance goals, measured (not tested) on this machine.
//!
//! - `raft`: three quorum members on loopback (real gRPC, real redb fsyncs); N proposals one after
//!   another give the commit latency distribution (goal p99 < 10 ms), then N proposals with 64 in
//!   flight give commits per second.
//! - `submit`: a single-member runtime with simulated agents; N submissions through the REST API and
//!   N through gRPC, each from 8 concurrent clients, give submissions per second (goal > 5,000/s);
//!   `submit3` does the same against the leader of a 3-member quorum, where every submission is
//!   mirrored to a majority before it is acknowledged.
//! - `heartbeats`: N agents (default 10,000) heartbeating every 10 s for 20 s, each on its own gRPC
//!   `HeartbeatStream`, run by a
//!   child process (`bench heartbeat-agents`): the server process's own CPU share of one core (goal
//!   < 5 %).
//! - `audit`: a held audit log of N entries (e.g. 10,000,000: 90 days of 1,000 users' sensitive
//!   allocations, 100 entries each) queried as `GET /v1/audit/logs` selects and verifies it — one
//!   allocation, a user's day, a user's 30 days (goals < 1 s, < 2 s, < 10 s) — the first query
//!   verifying the whole chain, later ones only what is new; and the rate at which signed entries
//!   verify (what a member's start pays for its held log).

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
        signed: None,
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

/// Runtimes for the submission benchmark: one member, or three (the first bootstrapping) with the
/// leader first in the returned list.
async fn bench_cluster(members: usize) -> anyhow::Result<Vec<crate::Running>> {
    let dir = scratch(&format!("submit{members}"));
    let ports: Vec<u16> = (0..members)
        .map(|_| lattice_adapters::raft_net::loopback_port())
        .collect::<Result<_, _>>()?;
    let list: String = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("  {}: 127.0.0.1:{p}\n", i + 1))
        .collect();
    let mut rts = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let members_block = if members > 1 {
            format!("members:\n{list}")
        } else {
            String::new()
        };
        let text = format!(
            "node_id: {id}\nrest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:{p}\ndata_dir: {d}/m{id}\nsimulated_nodes: 64\ncycle: 1s\nauth:\n  rate_limit_per_minute: 100000000\n{members_block}",
            id = i + 1,
            d = dir.display()
        );
        rts.push(crate::start(crate::RuntimeConfig::parse("bench.yaml", &text)?, i == 0).await?);
    }
    let t0 = Instant::now();
    loop {
        if let Some(i) = rts.iter().position(|r| r.shared.member.is_leader()) {
            rts.swap(0, i);
            return Ok(rts);
        }
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(10), "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Submissions per second through the REST API and through gRPC (8 concurrent clients each), on
/// the leader of `members` members.
pub async fn submit(requests: usize, members: usize) -> anyhow::Result<String> {
    // A fresh quorum per transport: the second must not queue behind the first's backlog.
    let rts = bench_cluster(members).await?;
    let url = format!("http://{}/v1/allocations", rts[0].rest_addr);
    let body = serde_json::json!({
        "tenant": "bench", "entrypoint": "sleep 3600", "resources": {"nodes": 1}, "lifecycle": {"walltime": "2h"}
    });
    let clients = 8;
    let share = |c: usize| requests / clients + usize::from(c < requests % clients);
    let t = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (url, body, n) = (url.clone(), body.clone(), share(c));
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
    let rest_per_s = ok as f64 / t.elapsed().as_secs_f64();
    for r in rts {
        r.shutdown().await;
    }
    let rts = bench_cluster(members).await?;

    // gRPC: 8 clients, each on its own HTTP/2 connection, one request in flight each.
    let grpc_url = format!("http://{}", rts[0].grpc_addr);
    let request = crate::pb::AllocationRequest {
        tenant: "bench".into(),
        entrypoint: "sleep 3600".into(),
        resources: Some(crate::pb::Resources {
            nodes: 1,
            ..Default::default()
        }),
        lifecycle: Some(crate::pb::Lifecycle {
            r#type: "bounded".into(),
            walltime: "2h".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(crate::pb::allocation_service_client::AllocationServiceClient::connect(grpc_url.clone()).await?);
    }
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (c, mut client) in conns.into_iter().enumerate() {
        let (request, n) = (request.clone(), share(c));
        set.spawn(async move {
            let mut ok = 0usize;
            for _ in 0..n {
                ok += usize::from(client.submit(request.clone()).await.is_ok());
            }
            ok
        });
    }
    let mut grpc_ok = 0;
    while let Some(r) = set.join_next().await {
        grpc_ok += r?;
    }
    let grpc_per_s = grpc_ok as f64 / t.elapsed().as_secs_f64();
    for r in rts {
        r.shutdown().await;
    }
    Ok(format!(
        "submissions to the leader of {members} member(s) ({clients} clients each): REST {ok}/{requests} accepted, submissions_per_s={rest_per_s:.0}; gRPC {grpc_ok}/{requests} accepted, submissions_per_s={grpc_per_s:.0}"
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

/// `agents` simulated agents heartbeating every 10 s (spread evenly) for `seconds`, run by a child
/// process (`lattice-runtime bench heartbeat-agents`) so the figure is the server's own: the CPU this
/// process spends while they heartbeat, as a share of one core.
pub async fn heartbeats(agents: usize, seconds: u64) -> anyhow::Result<String> {
    use tokio::io::AsyncBufReadExt;
    let dir = scratch("heartbeats");
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: {agents}\ncycle: 1s\nauth:\n  rate_limit_per_minute: 100000000\n",
        dir.display()
    );
    let rt = crate::start(crate::RuntimeConfig::parse("bench.yaml", &text)?, true).await?;
    // Agents register with the leader (a member that becomes leader starts a fresh control plane).
    let t0 = Instant::now();
    while !crate::leadership::sync_leadership(&rt.shared).await {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(10), "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "bench",
            "heartbeat-agents",
            "--n",
            &agents.to_string(),
            "--seconds",
            &seconds.to_string(),
            "--target",
            &rt.grpc_addr.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    // The agents register first; the window starts once they all have.
    let mut report = String::new();
    while let Some(l) = lines.next_line().await? {
        if l == "registered" {
            break;
        }
    }
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    while let Some(l) = lines.next_line().await? {
        report = l;
    }
    let (cpu, wall) = (cpu_seconds() - cpu0, t0.elapsed().as_secs_f64());
    let status = child.wait().await?;
    rt.shutdown().await;
    anyhow::ensure!(status.success(), "the agents' process failed: {status}");
    Ok(format!(
        "heartbeats ({agents} agents every 10 s for {seconds} s, from another process: {report}): server cpu_s={cpu:.2} wall_s={wall:.1} core_share_pct={:.2}",
        100.0 * cpu / wall
    ))
}

/// The agents' side of [`heartbeats`]: registers `agents` nodes at `target` (gRPC), prints
/// `registered`, then each agent heartbeats every 10 s (evenly spread) for `seconds` on its own
/// long-lived `HeartbeatStream`, and prints what the server accepted.
pub async fn heartbeat_agents(target: &str, agents: usize, seconds: u64) -> anyhow::Result<String> {
    use crate::pb;
    let mut client = pb::node_service_client::NodeServiceClient::connect(format!("http://{target}")).await?;
    let names: Vec<String> = (0..agents).map(|i| format!("sim-{i:03}")).collect();
    for n in &names {
        client
            .register(pb::NodeRequest {
                id: n.clone(),
                urgent: false,
            })
            .await?;
    }
    let mut senders = Vec::with_capacity(agents);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..agents {
        let (tx, rx) = tokio::sync::mpsc::channel::<pb::HeartbeatRequest>(4);
        senders.push(tx);
        let mut c = client.clone();
        calls.spawn(async move {
            c.heartbeat_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map(|r| r.into_inner().accepted)
        });
    }
    println!("registered");
    let per_s = agents as f64 / 10.0;
    let total = (per_s * seconds as f64) as usize;
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / per_s));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut seq = vec![0u64; agents];
    for k in 0..total {
        ticker.tick().await;
        let i = k % agents;
        seq[i] += 1;
        let _ = senders[i]
            .send(pb::HeartbeatRequest {
                id: names[i].clone(),
                seq: seq[i],
                buffered: Vec::new(),
            })
            .await;
    }
    drop(senders);
    let (mut accepted, mut failed) = (0, 0);
    while let Some(r) = calls.join_next().await {
        match r? {
            Ok(n) => accepted += n,
            Err(_) => failed += 1,
        }
    }
    Ok(format!(
        "{total} heartbeats on {agents} gRPC streams, {accepted} accepted, {failed} streams failed"
    ))
}

/// The audit query goals on a generated held log of `n` entries (see the module's doc).
pub fn audit_queries(n: usize) -> anyhow::Result<String> {
    use crate::audit_verified::Verified;
    use crate::ops::{Selection, select_held};
    const DAY: u64 = 86_400_000;
    const START: u64 = 1_767_225_600_000; // 2026-01-01
    const USERS: usize = 1000;
    const PER_ALLOC: usize = 100;
    let actions = [
        "claim",
        "start",
        "api_call",
        "log_access",
        "metrics_query",
        "release",
        "wipe",
    ];
    let t = Instant::now();
    let mut st = lattice_adapters::QuorumState::default();
    st.audit.reserve(n);
    for i in 0..n {
        let alloc = i / PER_ALLOC;
        let at = START + (i as u64) * (90 * DAY) / (n.max(1) as u64);
        let action = actions[(i % PER_ALLOC).min(actions.len() - 1)];
        lattice_engine::audit::append_after(
            &mut st.audit,
            &st.audit_base,
            at,
            &format!("u{:04}", alloc % USERS),
            &format!("a-{alloc:07}"),
            action,
            &format!("x1000c0s{}b0n{}", alloc % 64, alloc % 4),
            None,
        );
    }
    let built = t.elapsed().as_secs_f64();
    let verified = Verified::default();
    let t = Instant::now();
    anyhow::ensure!(verified.check(&st), "the generated chain verifies");
    let first_verify = t.elapsed().as_secs_f64();
    let mid_alloc = format!("a-{:07}", n / PER_ALLOC / 2);
    let user = "u0042";
    let day45 = START + 45 * DAY;
    let query = |sel: &Selection| -> (f64, usize) {
        let mut times = Vec::new();
        let mut found = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let (held, _) = select_held(&st, sel);
            let ok = verified.check(&st);
            times.push(t.elapsed().as_secs_f64());
            found = held.len();
            assert!(ok);
        }
        times.sort_by(f64::total_cmp);
        (times[times.len() / 2], found)
    };
    let base = Selection {
        caller: "auditor",
        all: true,
        reviewer: false,
        user: None,
        allocation: None,
        node: None,
        since: None,
        until: None,
        events: None,
    };
    let (one_alloc, n1) = query(&Selection {
        allocation: Some(&mid_alloc),
        ..base
    });
    let base = Selection {
        caller: "auditor",
        all: true,
        reviewer: false,
        user: Some(user),
        allocation: None,
        node: None,
        since: Some(day45),
        until: Some(day45 + DAY),
        events: None,
    };
    let (user_day, n2) = query(&base);
    let (user_30, n3) = query(&Selection {
        until: Some(day45 + 30 * DAY),
        ..base
    });
    // Signed entries: how fast a whole held log verifies (a member's start, a first query).
    let key = lattice_engine::audit::SigningKey::from_bytes(&[7; 32]);
    let mut signed = Vec::new();
    for i in 0..20_000u64 {
        let s = lattice_engine::audit::sign(&key, i, "u0001", "a-1", "api_call", "get");
        lattice_engine::audit::append_signed(&mut signed, i, "u0001", "a-1", "api_call", "get", Some(&s));
    }
    let t = Instant::now();
    anyhow::ensure!(lattice_engine::audit::verify(&signed).is_ok(), "signed entries verify");
    let signed_rate = signed.len() as f64 / t.elapsed().as_secs_f64();
    Ok(format!(
        "audit: {n} entries held (generated in {built:.1} s); whole chain verified in {first_verify:.2} s (first query), \
         later queries verify only new entries; one allocation: {:.1} ms ({n1} entries; goal < 1 s); \
         a user's day: {:.1} ms ({n2}; goal < 2 s); a user's 30 days: {:.1} ms ({n3}; goal < 10 s); \
         signed entries verify at {signed_rate:.0}/s ({:.0} s for {n} signed)",
        one_alloc * 1000.0,
        user_day * 1000.0,
        user_30 * 1000.0,
        n as f64 / signed_rate,
    ))
}
