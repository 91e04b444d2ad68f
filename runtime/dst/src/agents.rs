//! The simulation's node agents (`lattice-dst --agents N`): one simulated host per node,
//! running `lattice-agent`'s own protocol code ([`lattice_agent::protocol::Session`]: registration,
//! heartbeats with a sequence buffered while the control plane is unreachable and replayed in order,
//! polls for work, exit reports kept until taken, the lease and when it runs out, moving on to the
//! next member when one does not answer or is not the leader) over REST on the simulated network.
//! Only the I/O is the simulation's: requests go over turmoil's TCP, and processes are simulated — a
//! launch's `sleep S` entrypoint runs for S simulated seconds.
//!
//! What the real agent keeps on disk is kept in the harness ([`crate::obs::Obs`]): the processes (they
//! outlive their agent, as a job outlives `systemctl restart lattice-agent`), the lease, and the
//! exits not yet taken. So a crashed agent's successor takes them over as the real one does from its
//! state files. Fencing runs beside the loop, like the real agent's fence thread, by the protocol's
//! rule ([`lattice_agent::protocol::lease_over`]); a simulated process stops at once (no stop grace).

pub use crate::obs::Proc;
use crate::obs::{self, SharedObs, lock};
use lattice_agent::client::{ExitKind, Reports};
use lattice_agent::protocol::{self, Beaten, Exit, Failure, Request, Session};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How often an agent heartbeats and polls (the real agent's test settings).
pub const HEARTBEAT: Duration = Duration::from_millis(200);
pub const POLL: Duration = Duration::from_millis(100);

/// The node an agent host runs (the runtime's simulated inventory names).
pub fn node_name(i: usize) -> String {
    format!("sim-{i:03}")
}

pub fn host_name(i: usize) -> String {
    format!("a{i}")
}

fn now_ms() -> u64 {
    turmoil::sim_elapsed().map_or(0, |d| d.as_millis() as u64)
}

/// One REST call to `member` (HTTP/1.1, a connection per call, as the real agent's client may):
/// (status, JSON body), or `None` when the member could not be reached or did not answer in time.
async fn call(member: u64, path: &str, body: &serde_json::Value) -> Option<(u16, serde_json::Value)> {
    request(member, "POST", path, body).await
}

pub async fn request(
    member: u64,
    method: &str,
    path: &str,
    body: &serde_json::Value,
) -> Option<(u16, serde_json::Value)> {
    let io = async {
        let mut s = turmoil::net::TcpStream::connect((obs::host_name(member).as_str(), obs::REST_PORT))
            .await
            .ok()?;
        let body = body.to_string();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: m{member}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out);
        let status: u16 = text.split(' ').nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null)))
    };
    tokio::time::timeout(Duration::from_secs(2), io).await.ok().flatten()
}

/// The simulated node's conformance fingerprint (every node alike) and capabilities.
const FINGERPRINT: &str = "5151515151515151515151515151515151515151515151515151515151515151";

/// One protocol request to member `member`: the answer's JSON, or the failure it means.
async fn send(member: u64, r: &Request) -> Result<serde_json::Value, Failure> {
    match call(member, &r.path, &r.body).await {
        Some((s, v)) if (200..300).contains(&s) => Ok(v),
        Some((s, v)) => Err(Failure::of(Some(s), &v.to_string())),
        None => Err(Failure::of(None, "")),
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The agent of node `i`: runs until its host is crashed (then restarted by the harness). `fence`:
/// false only for the injected bug `agent-no-fence`.
pub async fn run(i: usize, members: u64, fence: bool, obs: SharedObs) -> turmoil::Result {
    let node = node_name(i);
    let mut s = Session::new(&node, members as usize, i);
    let member = |s: &Session| s.target() as u64 + 1;
    // What a previous agent of this node left on disk: its lease and its unreported exits.
    {
        let o = lock(&obs);
        if let Some((sent, lease)) = o.leases[i] {
            s.renewed(Duration::from_millis(sent), Duration::from_millis(lease));
        }
        for e in o.exits[i].iter().cloned() {
            s.ended(e);
        }
    }
    if fence {
        let (obs, node) = (obs.clone(), node.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let now = now_ms();
                let mut o = lock(&obs);
                let Some((sent, lease)) = o.leases[i] else { continue };
                let quiet = Duration::from_millis(now.saturating_sub(sent));
                if !protocol::lease_over(quiet, Duration::from_millis(lease), HEARTBEAT, Duration::ZERO) {
                    continue;
                }
                let fenced: Vec<String> = o.procs[i]
                    .iter()
                    .filter(|(_, p)| !p.fenced)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in fenced {
                    o.event(format!(
                        "{node} fenced {id}: no accepted heartbeat for {} ms",
                        ms(quiet)
                    ));
                    if let Some(p) = o.procs[i].get_mut(&id) {
                        p.fenced = true;
                    }
                }
            }
        });
    }
    // A restarted agent takes over what its node still runs.
    let taken = lock(&obs).procs[i].len();
    if taken > 0 {
        lock(&obs).event(format!("{node} agent took over {taken} process(es)"));
    }
    let caps = lattice_agent::discovery::Capabilities {
        cpu_cores: 64,
        memory_gib: 256.0,
        ..Default::default()
    };
    loop {
        tokio::time::sleep(POLL).await;
        let now = now_ms();
        if s.must_register() {
            let to = member(&s);
            s.registered(
                send(to, &protocol::register(&node, &caps, FINGERPRINT))
                    .await
                    .map(|_| ()),
            );
            if !s.must_register() {
                lock(&obs).event(format!("{node} registered with m{to}"));
            }
            continue;
        }
        if let Some(beat) = s.heartbeat_due(Duration::from_millis(now), HEARTBEAT) {
            let to = member(&s);
            let answer = send(to, &beat).await.map(|v| protocol::beat(&v));
            let wall = obs::EPOCH_MS + now;
            if let Beaten::Accepted { .. } = s.heartbeat_answered(answer, wall) {
                let seq = s.seq();
                // The lease is kept on disk (the real agent's lease file), so a restarted agent
                // still fences on time.
                if let Some((sent, lease)) = s.lease() {
                    lock(&obs).leases[i] = Some((ms(sent), ms(lease)));
                }
                // Now and then the network delivers a heartbeat again (a duplicate or a late copy):
                // the control plane must refuse it, never take a sequence out of order.
                if seq.is_multiple_of(7) {
                    let again = protocol::heartbeat(&node, seq - (seq / 7) % 2, &[]);
                    if let Ok(v) = send(to, &again).await {
                        lock(&obs).violation(format!(
                            "{node}: heartbeat {} accepted again after seq {seq}: {v}",
                            again.body
                        ));
                    }
                }
            }
        }
        // Processes that ran their time or were fenced: collected, their exits kept until taken.
        {
            let mut o = lock(&obs);
            let ended: Vec<String> = o.procs[i]
                .iter()
                .filter(|(_, p)| p.fenced || p.ends_ms <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ended {
                let p = o.procs[i].remove(&id).expect("listed");
                let (kind, code) = if p.fenced {
                    (ExitKind::Fenced, 143)
                } else {
                    (ExitKind::Exited, 0)
                };
                s.ended(Exit {
                    id,
                    kind,
                    code,
                    tail: String::new(),
                    err_tail: String::new(),
                });
            }
            o.exits[i] = s.unreported().to_vec();
        }
        for e in s.unreported().to_vec() {
            let answer = send(member(&s), &protocol::exit(&node, &e)).await.map(|_| ());
            s.exit_answered(&e.id, answer);
            lock(&obs).exits[i] = s.unreported().to_vec();
        }
        let running: Vec<String> = lock(&obs).procs[i].keys().cloned().collect();
        let to = member(&s);
        let answer = send(to, &protocol::work(&node, &running, &[], &Reports::default()))
            .await
            .and_then(|v| protocol::parse_work(v).map_err(|_| Failure::Elsewhere));
        let mut o = lock(&obs);
        let Some(w) = s.work_answered(answer, |id| o.procs[i].contains_key(id)) else {
            continue;
        };
        let now = now_ms();
        for id in &w.kill {
            if o.procs[i].remove(id).is_some() {
                o.event(format!("{node} stopped {id}"));
            }
        }
        for l in w.launch {
            let secs: f64 = l
                .entrypoint
                .strip_prefix("sleep ")
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(1.0);
            o.event(format!("{node} started {} (from m{to})", l.id));
            o.procs[i].insert(
                l.id,
                Proc {
                    nodes: l.nodes,
                    started_ms: now,
                    ends_ms: now + (secs * 1000.0) as u64,
                    fenced: false,
                },
            );
        }
    }
}

/// The site's remediation, as an operator (or OpenCHAMI's automation) does it: a node Down for 5 s
/// — its agent cut off or dead past its lease, its work requeued — is enabled again (Down → Ready),
/// so the site does not shrink for good with every agent fault. With `drains` (a seed for its own
/// stream of choices) it also drains a node now and then for 1–4 s, and lifts every drain once the
/// faults have healed; what it was told is in [`crate::obs::Obs::drained`].
pub async fn operator(
    members: u64,
    nodes: usize,
    drains: Option<u64>,
    weights: Option<u64>,
    obs: SharedObs,
) -> turmoil::Result {
    use rand_core::{Rng, SeedableRng};
    let mut target = 1u64;
    let mut down_since: BTreeMap<String, u64> = BTreeMap::new();
    let mut rng = drains.map(rand_chacha::ChaCha8Rng::seed_from_u64);
    let mut weights_rng = weights.map(rand_chacha::ChaCha8Rng::seed_from_u64);
    // Drained nodes (acknowledged or not) → when to lift the drain (ms).
    let mut lift_at: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(rng) = rng.as_mut() {
            let healed = lock(&obs).healed;
            let now = now_ms();
            let due: Vec<String> = lift_at
                .iter()
                .filter(|(_, t)| healed || **t <= now)
                .map(|(n, _)| n.clone())
                .collect();
            for node in due {
                match node_order(target, &node, "undrain", &obs).await {
                    Order::Taken | Order::Refused => {
                        lift_at.remove(&node);
                    }
                    Order::Elsewhere(leader) => target = leader.unwrap_or(target % members + 1),
                }
            }
            if !healed && nodes > 0 && rng.next_u64().is_multiple_of(2) {
                let node = node_name((rng.next_u64() % nodes as u64) as usize);
                let until = now + 1_000 + rng.next_u64() % 3_000;
                if let std::collections::btree_map::Entry::Vacant(slot) = lift_at.entry(node.clone()) {
                    match node_order(target, &node, "drain", &obs).await {
                        Order::Taken => {
                            slot.insert(until);
                        }
                        // Refused (the node's state does not allow it): nothing to lift.
                        Order::Refused => {}
                        // No answer: it may have been drained; lift it in time either way.
                        Order::Elsewhere(leader) => {
                            slot.insert(until);
                            target = leader.unwrap_or(target % members + 1);
                        }
                    }
                }
            }
        }
        // Now and then, new weights for vCluster `default` (a tenth of priority, the rest wait
        // time), or a new reference wait in its configuration.
        if let Some(rng) = weights_rng.as_mut()
            && !lock(&obs).healed
            && rng.next_u64().is_multiple_of(4)
        {
            let tenths = 1 + (rng.next_u64() % 9) as u32;
            let setting = match rng.next_u64() % 6 {
                0 | 1 => Setting::ReferenceWait,
                2 => Setting::FairShare,
                _ => Setting::Weights,
            };
            if let Order::Elsewhere(leader) = set(target, setting, tenths, &obs).await {
                target = leader.unwrap_or(target % members + 1);
            }
        }
        let Some((200, v)) = request(target, "GET", "/v1/nodes", &serde_json::Value::Null).await else {
            target = target % members + 1;
            continue;
        };
        let now = now_ms();
        for n in v["nodes"].as_array().into_iter().flatten() {
            let (Some(id), Some(state)) = (n["name"].as_str(), n["state"].as_str()) else {
                continue;
            };
            if state != "down" {
                down_since.remove(id);
                continue;
            }
            let since = *down_since.entry(id.to_string()).or_insert(now);
            if now - since >= 5_000
                && let Some((200, _)) = call(target, &format!("/v1/nodes/{id}/enable"), &serde_json::json!({})).await
            {
                lock(&obs).event(format!("operator enabled {id} (down {} ms)", now - since));
                down_since.remove(id);
            }
        }
    }
}

/// How an operator's order went.
enum Order {
    Taken,
    /// Refused for good (the node's state does not allow it).
    Refused,
    /// No answer, or not the leader (the one it names, when it does).
    Elsewhere(Option<u64>),
}

/// A drain or undrain of `node` at `member`. While it is in flight the node's drain is uncertain
/// (either outcome is allowed); a taken drain must hold at every later leader until it is lifted.
async fn node_order(member: u64, node: &str, what: &str, obs: &SharedObs) -> Order {
    lock(obs).drained.insert(node.to_string(), false);
    let answer = call(member, &format!("/v1/nodes/{node}/{what}"), &serde_json::json!({})).await;
    let mut o = lock(obs);
    let drain = what == "drain";
    match answer {
        Some((200, v)) => {
            o.event(format!(
                "operator {what} {node}: {}",
                v["state"].as_str().unwrap_or("?")
            ));
            if drain {
                o.drained.insert(node.to_string(), true);
            } else {
                o.drained.remove(node);
            }
            Order::Taken
        }
        Some((400, v)) => {
            o.event(format!(
                "operator {what} {node} refused: {}",
                v["error"].as_str().unwrap_or("?")
            ));
            // Refused: nothing changed (an undrain refused: the node is not drained).
            o.drained.remove(node);
            Order::Refused
        }
        Some((421, v)) => Order::Elsewhere(v["leader_id"].as_u64()),
        _ => Order::Elsewhere(None),
    }
}

/// A setting the operator changes now and then: vCluster `default`'s weights (`priority` in
/// tenths, `wait_time` the rest) or its configuration's `reference_wait` (in hours), or tenant
/// `physics`'s contract (`fair_share_target` in tenths).
#[derive(Clone, Copy)]
pub enum Setting {
    Weights,
    ReferenceWait,
    FairShare,
}

impl Setting {
    /// Where its acknowledged value and those that may be in force are kept.
    pub fn slot(self, o: &mut crate::obs::Obs) -> &mut Option<(u32, Vec<u32>)> {
        match self {
            Setting::Weights => &mut o.weights,
            Setting::ReferenceWait => &mut o.reference_wait,
            Setting::FairShare => &mut o.fair_share,
        }
    }

    /// The request that sets it to `v`.
    fn request(self, v: u32) -> (&'static str, &'static str, serde_json::Value) {
        match self {
            Setting::Weights => (
                "PUT",
                "/v1/vclusters/default/weights",
                serde_json::json!({
                    "priority": f64::from(v) / 10.0,
                    "wait_time": f64::from(10 - v) / 10.0,
                }),
            ),
            Setting::ReferenceWait => (
                "PATCH",
                "/v1/vclusters/default",
                serde_json::json!({ "reference_wait": v * 3600 }),
            ),
            Setting::FairShare => (
                "PUT",
                "/api/v1/tenants/physics",
                serde_json::json!({ "fair_share_target": f64::from(v) / 10.0 }),
            ),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Setting::Weights => "weights default: priority (tenths)",
            Setting::ReferenceWait => "config default: reference_wait (h)",
            Setting::FairShare => "tenant physics: fair_share_target (tenths)",
        }
    }
}

/// Sets `setting` of vCluster `default` to `v` at `member`. While in flight (or unanswered: the
/// change may still commit) the value may be in force; once taken, it must be, or one of those.
async fn set(member: u64, setting: Setting, v: u32, obs: &SharedObs) -> Order {
    if let Some((_, since)) = setting.slot(&mut lock(obs)).as_mut() {
        since.push(v);
    }
    let (method, path, body) = setting.request(v);
    let answer = request(member, method, path, &body).await;
    let mut o = lock(obs);
    // This attempt's entry among those that may be in force (unanswered ones stay: their change
    // may still commit, after later ones).
    let forget = |o: &mut crate::obs::Obs| {
        if let Some((_, maybe)) = setting.slot(o).as_mut()
            && let Some(i) = maybe.iter().position(|t| *t == v)
        {
            maybe.remove(i);
        }
    };
    match answer {
        Some((200, _)) => {
            o.event(format!("operator {} {v}", setting.name()));
            forget(&mut o);
            let slot = setting.slot(&mut o);
            let maybe = slot.take().map(|(_, m)| m).unwrap_or_default();
            *slot = Some((v, maybe));
            Order::Taken
        }
        Some((421, l)) => {
            forget(&mut o);
            Order::Elsewhere(l["leader_id"].as_u64())
        }
        Some((status, e)) if status < 500 => {
            o.violation(format!("{} refused by m{member}: {status} {e}", setting.name()));
            Order::Refused
        }
        _ => Order::Elsewhere(None),
    }
}

/// Safety of the agents' work, checked after every step: a node runs at most one allocation, and an
/// allocation runs from one start at a time (all its processes belong to launches naming the same
/// nodes) — what fencing guarantees when a cut-off node's allocation is requeued elsewhere.
pub fn check(procs: &[BTreeMap<String, Proc>]) -> Vec<String> {
    let mut out = Vec::new();
    let mut starts: BTreeMap<&str, Vec<(usize, &Vec<String>)>> = BTreeMap::new();
    for (i, p) in procs.iter().enumerate() {
        let live: Vec<&String> = p.iter().filter(|(_, p)| !p.fenced).map(|(id, _)| id).collect();
        if live.len() > 1 {
            out.push(format!(
                "{} runs {} allocations at once: {live:?}",
                node_name(i),
                live.len()
            ));
        }
        for (id, proc) in p.iter().filter(|(_, p)| !p.fenced) {
            // An agent runs only what the quorum gave its own node.
            if !proc.nodes.iter().any(|n| *n == node_name(i)) {
                out.push(format!(
                    "{} runs {id}, launched for {:?} only",
                    node_name(i),
                    proc.nodes
                ));
            }
            starts.entry(id).or_default().push((i, &proc.nodes));
        }
    }
    for (id, runs) in starts {
        if let Some((a, b)) = runs.iter().zip(runs.iter().skip(1)).find(|(a, b)| a.1 != b.1) {
            out.push(format!(
                "{id} runs twice at once: on {} (started on {:?}) and on {} (started on {:?})",
                node_name(a.0),
                a.1,
                node_name(b.0),
                b.1
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_starts_of_one_allocation_or_two_allocations_on_a_node_are_violations() {
        let p = |nodes: &[&str]| Proc {
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            started_ms: 0,
            ends_ms: 10,
            fenced: false,
        };
        let mut procs = vec![BTreeMap::new(), BTreeMap::new(), BTreeMap::new()];
        procs[0].insert("a-1".to_string(), p(&[&node_name(0), &node_name(1)]));
        procs[1].insert("a-1".to_string(), p(&[&node_name(0), &node_name(1)]));
        assert!(check(&procs).is_empty(), "one start on two nodes");
        procs[2].insert("a-1".to_string(), p(&["sim-002"]));
        assert!(
            check(&procs)[0].contains("a-1 runs twice at once"),
            "{:?}",
            check(&procs)
        );
        procs[2].clear();
        procs[1].insert("a-2".to_string(), p(&["sim-001"]));
        assert!(
            check(&procs)[0].contains("sim-001 runs 2 allocations"),
            "{:?}",
            check(&procs)
        );
        procs[1].remove("a-2");
        procs[2].insert("a-3".to_string(), p(&["sim-000"]));
        assert_eq!(
            check(&procs),
            vec!["sim-002 runs a-3, launched for [\"sim-000\"] only".to_string()]
        );
    }
}
