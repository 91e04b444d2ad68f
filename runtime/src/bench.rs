//! `lattice-runtime bench`: the performance goals, measured (not tested) on this machine.
//!
//! - `raft`: three quorum members on loopback (real gRPC, real redb fsyncs); N proposals one after
//!   another give the commit latency distribution (goal p99 < 10 ms), then N proposals with 64 in
//!   flight give commits per second.
//! - `submit`: a single-member runtime with simulated agents; N submissions through gRPC and N
//!   through the REST API, from each of the given client counts (8, 64, 256 by default), give
//!   submissions per second and the acknowledgment latency p50/p99 (goal > 10,000/s with 64 clients,
//!   p99 < 50 ms); `submit3` does the same against the leader of a 3-member quorum, where every
//!   submission is mirrored to a majority before it is acknowledged; `--array K` submits task groups
//!   of K elements (counted per element).
//! - `htc`: the end-to-end high-throughput run — N `sleep 0` jobs through the leader of 3 members
//!   with simulated agents (`--nodes`, `--clients`): the submit, start and completion rates (goal
//!   > 5,000 jobs/s end to end on 100,000).
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
    bench_cluster_of(members, 64, "submit").await
}

/// [`bench_cluster`] with `nodes` simulated nodes, its data under `name`.
async fn bench_cluster_of(members: usize, nodes: usize, name: &str) -> anyhow::Result<Vec<crate::Running>> {
    let dir = scratch(&format!("{name}{members}"));
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
            "node_id: {id}\nrest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:{p}\ndata_dir: {d}/m{id}\nsimulated_nodes: {nodes}\ncycle: 1s\nauth:\n  rate_limit_per_minute: 100000000\n{members_block}",
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

/// What one run of the submission benchmark measured.
struct Rate {
    accepted: usize,
    per_s: f64,
    /// Acknowledgment latencies of the accepted submissions, ms, sorted.
    lat: Vec<f64>,
}

impl Rate {
    fn line(&self, what: &str, requests: usize, elements: u32) -> String {
        format!(
            "{what}: {}/{requests} accepted, submissions_per_s={:.0} elements_per_s={:.0} ack_p50_ms={:.2} ack_p99_ms={:.2} ack_max_ms={:.2}",
            self.accepted,
            self.per_s,
            self.per_s * f64::from(elements),
            pct(&self.lat, 50.0),
            pct(&self.lat, 99.0),
            self.lat.last().copied().unwrap_or(0.0)
        )
    }
}

/// `requests` submissions spread over `clients` concurrent clients, one request in flight each;
/// `one` makes a client's next submission and says whether it was accepted.
async fn drive<C, F>(requests: usize, clients: Vec<C>, one: F) -> anyhow::Result<Rate>
where
    C: Send + 'static,
    F: Fn(&mut C) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> + Send + Sync + 'static,
{
    let n = clients.len();
    let share = |c: usize| requests / n + usize::from(c < requests % n);
    let one = std::sync::Arc::new(one);
    let t = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (c, mut client) in clients.into_iter().enumerate() {
        let (k, one) = (share(c), one.clone());
        set.spawn(async move {
            let mut lat = Vec::with_capacity(k);
            for _ in 0..k {
                let t = Instant::now();
                if one(&mut client).await {
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            lat
        });
    }
    let mut lat = Vec::with_capacity(requests);
    while let Some(r) = set.join_next().await {
        lat.extend(r?);
    }
    let per_s = lat.len() as f64 / t.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok(Rate {
        accepted: lat.len(),
        per_s,
        lat,
    })
}

/// A bounded one-node allocation of tenant `bench` running `entrypoint`.
fn one_node(entrypoint: &str, walltime: &str) -> crate::pb::AllocationRequest {
    crate::pb::AllocationRequest {
        tenant: "bench".into(),
        entrypoint: entrypoint.into(),
        resources: Some(crate::pb::Resources {
            nodes: 1,
            ..Default::default()
        }),
        lifecycle: Some(crate::pb::Lifecycle {
            r#type: "bounded".into(),
            walltime: walltime.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

type AllocationClient = crate::pb::allocation_service_client::AllocationServiceClient<tonic::transport::Channel>;

/// `n` gRPC clients of the allocation service at `url`, each on its own HTTP/2 connection.
async fn connect(url: &str, n: usize) -> anyhow::Result<Vec<AllocationClient>> {
    let mut conns = Vec::new();
    for _ in 0..n {
        let ch = tonic::transport::Endpoint::from_shared(url.to_string())?
            .connect()
            .await?;
        conns.push(AllocationClient::new(ch));
    }
    Ok(conns)
}

/// Submissions per second and their acknowledgment latency (p50/p99) through gRPC and the REST
/// API, on the leader of `members` members, for each client count in `clients` (each client one
/// request in flight, on its own connection); `array` elements per submission (a task group, one
/// durable record for all its elements; 1: plain allocations). Every run starts a fresh quorum, so
/// none queues behind another's backlog.
pub async fn submit(requests: usize, members: usize, clients: &[usize], array: u32) -> anyhow::Result<String> {
    let array = array.max(1);
    let group = (array > 1).then(|| serde_json::json!({"range": {"start": 0, "end": array - 1}}));
    let mut body = serde_json::json!({
        "tenant": "bench", "entrypoint": "sleep 3600", "resources": {"nodes": 1}, "lifecycle": {"walltime": "2h"}
    });
    if let Some(g) = &group {
        body["task_group"] = g.clone();
    }
    let request = crate::pb::AllocationRequest {
        task_group: (array > 1).then_some(crate::pb::TaskGroup {
            start: 0,
            end: array - 1,
            concurrency: 0,
        }),
        ..one_node("sleep 3600", "2h")
    };
    let mut lines = Vec::new();
    for &n in clients {
        let n = n.max(1);
        // gRPC: each client its own HTTP/2 connection.
        let rts = bench_cluster(members).await?;
        let grpc_url = format!("http://{}", rts[0].grpc_addr);
        let conns = connect(&grpc_url, n).await?;
        let req = request.clone();
        let grpc = drive(requests, conns, move |c| {
            let req = req.clone();
            Box::pin(async move { c.submit(req).await.is_ok() })
        })
        .await?;
        for r in rts {
            r.shutdown().await;
        }
        lines.push(grpc.line(
            &format!("gRPC, leader of {members} member(s), {n} clients, {array} element(s) each"),
            requests,
            array,
        ));
        // REST: each client its own keep-alive connection.
        let rts = bench_cluster(members).await?;
        let url = format!("http://{}/v1/allocations", rts[0].rest_addr);
        let conns: Vec<(ureq::Agent, String, serde_json::Value)> = (0..n)
            .map(|_| {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                (agent, url.clone(), body.clone())
            })
            .collect();
        let rest = drive(requests, conns, |(agent, url, body)| {
            let (agent, url, body) = (agent.clone(), url.clone(), body.clone());
            Box::pin(async move {
                tokio::task::spawn_blocking(move || agent.post(&url).send_json(&body).is_ok_and(|r| r.status() == 201))
                    .await
                    .unwrap_or(false)
            })
        })
        .await?;
        for r in rts {
            r.shutdown().await;
        }
        lines.push(rest.line(
            &format!("REST, leader of {members} member(s), {n} clients, {array} element(s) each"),
            requests,
            array,
        ));
    }
    Ok(lines.join("\n"))
}

/// The end-to-end high-throughput run (Flux's schedbench): `jobs` `sleep 0` allocations of one
/// node submitted through gRPC by `clients` clients to the leader of 3 members with `nodes`
/// simulated nodes; each is acknowledged (on a majority's disks), scheduled, started (committed at
/// the quorum), run by its simulated agent and ended (its end on a majority, its node released at
/// the quorum). Reports how long until every submission was acknowledged, every job started and
/// every job ended, each as a rate from the first submission.
pub async fn htc(jobs: usize, nodes: usize, clients: usize) -> anyhow::Result<String> {
    let rts = bench_cluster_of(3, nodes, "htc").await?;
    let shared = rts[0].shared.clone();
    let grpc_url = format!("http://{}", rts[0].grpc_addr);
    let request = one_node("sleep 0", "1m");
    let conns = connect(&grpc_url, clients.max(1)).await?;
    let placed0 = shared.metrics.placements.get();
    let t0 = Instant::now();
    let mut submitting = Some(tokio::spawn(drive(jobs, conns, move |c| {
        let req = request.clone();
        Box::pin(async move { c.submit(req).await.is_ok() })
    })));
    // Watched every 50 ms: started (committed at the quorum) and still live (queued or running).
    let (mut started_at, mut ended_at) = (None, None);
    let mut submitted: Option<(Rate, f64)> = None;
    while ended_at.is_none() {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(1800),
            "the run did not finish in 30 min"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Some(h) = submitting.take_if(|h| h.is_finished()) {
            submitted = Some((h.await??, t0.elapsed().as_secs_f64()));
        }
        let placed = shared.metrics.placements.get() - placed0;
        let live = {
            let c = shared.control.lock().await;
            c.ctl.engine.queue().len() as i64 + shared.metrics.allocations_active.get()
        };
        if started_at.is_none() && placed as usize >= jobs {
            started_at = Some(t0.elapsed().as_secs_f64());
        }
        if let Some((rate, _)) = &submitted
            && live == 0
            && placed as usize >= rate.accepted
        {
            ended_at = Some(t0.elapsed().as_secs_f64());
            started_at.get_or_insert(t0.elapsed().as_secs_f64());
        }
    }
    let (rate, submit_s) = submitted.expect("set before the end");
    let (start_s, end_s) = (started_at.unwrap_or_default(), ended_at.unwrap_or_default());
    for r in rts {
        r.shutdown().await;
    }
    let n = rate.accepted as f64;
    Ok(format!(
        "HTC end to end ({jobs} `sleep 0` jobs, 3 members, {nodes} simulated nodes, {clients} gRPC clients): {} acknowledged in {submit_s:.1} s (submit_per_s={:.0}, ack_p50_ms={:.2} ack_p99_ms={:.2}); all started after {start_s:.1} s (start_per_s={:.0}); all ended after {end_s:.1} s (jobs_per_s={:.0})",
        rate.accepted,
        n / submit_s,
        pct(&rate.lat, 50.0),
        pct(&rate.lat, 99.0),
        n / start_s.max(1e-9),
        n / end_s.max(1e-9)
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
