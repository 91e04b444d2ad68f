//! The simulation's clients: each runs a seeded plan of submissions (with an idempotency key,
//! retried through leader changes, lost answers and refusals exactly as a careful client would)
//! and cancellations, over the gRPC API on the simulated network. What they were told is the
//! ground truth the safety checks hold the quorum to.

use crate::obs::{self, GRPC_PORT, QUOTA_TENANT, SharedObs, lock};
use lattice_runtime::grpc::pb;
use pb::allocation_service_client::AllocationServiceClient;
use rand_chacha::ChaCha8Rng;
use rand_core::Rng;
use std::collections::BTreeMap;
use std::time::Duration;

/// One thing a client does.
#[derive(Clone, Debug)]
pub enum Op {
    Submit {
        key: String,
        tenant: String,
        nodes: u32,
        run_ms: u64,
        /// A sensitive claim: placed at once or refused (`OwnershipConflict`), both final.
        sensitive: bool,
    },
    /// Cancels the allocation acknowledged for this key (if any).
    Cancel { key: String },
}

/// A claimant's plan (its own stream, so the other clients' plans stay as the seed made them):
/// sensitive claims of one node running 0.1–1 s, spread over the faulty phase.
pub fn claims_plan(rng: &mut ChaCha8Rng, steps: u64, client: &str) -> Vec<Timed> {
    let span_ms = (steps * obs::TICK.as_millis() as u64).max(1000);
    let mut ops: Vec<Timed> = (0..(steps / 200).clamp(2, 12))
        .map(|j| Timed {
            at_ms: rng.next_u64() % (span_ms * 9 / 10),
            op: Op::Submit {
                key: format!("{client}-claim{j}"),
                tenant: "physics".into(),
                nodes: 1,
                run_ms: 100 + rng.next_u64() % 900,
                sensitive: true,
            },
        })
        .collect();
    ops.sort_by_key(|t| t.at_ms);
    ops
}

/// An op and when (simulated ms) the client starts it.
#[derive(Clone, Debug)]
pub struct Timed {
    pub at_ms: u64,
    pub op: Op,
}

/// How long a client keeps retrying one op.
const GIVE_UP: Duration = Duration::from_secs(30);

/// Two clients' plans over the faulty phase of `steps` steps: submissions of 1–3 nodes running
/// 0.1–2 s (some for the tenant with a hard quota), and cancellations of earlier ones.
pub fn plan(rng: &mut ChaCha8Rng, steps: u64) -> Vec<Vec<Timed>> {
    let span_ms = (steps * obs::TICK.as_millis() as u64).max(1000);
    let per_client = (steps / 50).clamp(2, 200);
    (1..=2)
        .map(|c| {
            let mut ops: Vec<Timed> = Vec::new();
            let mut keys: Vec<String> = Vec::new();
            for j in 0..per_client {
                let at_ms = rng.next_u64() % (span_ms * 9 / 10);
                let op = if !keys.is_empty() && rng.next_u64().is_multiple_of(5) {
                    Op::Cancel {
                        key: keys[(rng.next_u64() % keys.len() as u64) as usize].clone(),
                    }
                } else {
                    let key = format!("c{c}-k{j}");
                    keys.push(key.clone());
                    Op::Submit {
                        key,
                        tenant: if rng.next_u64().is_multiple_of(4) {
                            QUOTA_TENANT.into()
                        } else {
                            "physics".into()
                        },
                        nodes: 1 + (rng.next_u64() % 3) as u32,
                        run_ms: 100 + rng.next_u64() % 1900,
                        sensitive: false,
                    }
                };
                ops.push(Timed { at_ms, op });
            }
            // In time order; a cancel planned before its submission waits for it (it is skipped
            // when that submission was never acknowledged).
            ops.sort_by_key(|t| t.at_ms);
            ops
        })
        .collect()
}

fn now_ms() -> u64 {
    turmoil::sim_elapsed().map_or(0, |d| d.as_millis() as u64)
}

/// A lazily connected client of member `m` (1-based) over the simulated network.
fn client_of(m: u64) -> AllocationServiceClient<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://m{m}:{GRPC_PORT}"))
        .expect("a valid endpoint")
        .connect_timeout(Duration::from_secs(1));
    AllocationServiceClient::new(lattice_adapters::raft_net::dial(endpoint, Some(&crate::net::dialer())))
}

/// The leader a "not the quorum leader (leader 2, …)" refusal names.
fn leader_named(msg: &str) -> Option<u64> {
    let rest = msg.split("(leader ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Runs `ops` as client `name` against a quorum of `n` members.
pub async fn run(name: String, ops: Vec<Timed>, n: u64, obs: SharedObs) -> turmoil::Result {
    let mut clients: Vec<AllocationServiceClient<tonic::transport::Channel>> = (1..=n).map(client_of).collect();
    let mut target: u64 = 1;
    for t in ops {
        let now = now_ms();
        if t.at_ms > now {
            tokio::time::sleep(Duration::from_millis(t.at_ms - now)).await;
        }
        let started = now_ms();
        let mut attempts = 0u32;
        loop {
            if now_ms() - started > GIVE_UP.as_millis() as u64 {
                lock(&obs).event(format!("{name} gave up {}", describe(&t.op)));
                break;
            }
            if attempts > 0 {
                tokio::time::sleep(Duration::from_millis(100 + 50 * u64::from(attempts.min(8)))).await;
            }
            attempts += 1;
            let c = &mut clients[(target - 1) as usize];
            let outcome = match &t.op {
                Op::Submit {
                    key,
                    tenant,
                    nodes,
                    run_ms,
                    sensitive,
                } => {
                    let req = pb::AllocationRequest {
                        tenant: tenant.clone(),
                        sensitive: *sensitive,
                        resources: Some(pb::Resources {
                            nodes: *nodes,
                            ..Default::default()
                        }),
                        lifecycle: Some(pb::Lifecycle {
                            r#type: "bounded".into(),
                            walltime: "1h".into(),
                            ..Default::default()
                        }),
                        // The runtime's simulated agents take the duration; agent hosts run
                        // the entrypoint.
                        duration: format!("{run_ms}ms"),
                        entrypoint: format!("sleep {:.3}", *run_ms as f64 / 1000.0),
                        idempotency_key: key.clone(),
                        ..Default::default()
                    };
                    match tokio::time::timeout(Duration::from_secs(3), c.submit(req)).await {
                        Ok(Ok(r)) => {
                            acknowledged(&obs, &name, key, &r.into_inner().id, target);
                            Outcome::Done
                        }
                        Ok(Err(s))
                            if *sensitive
                                && s.code() == tonic::Code::AlreadyExists
                                && s.message().starts_with("OwnershipConflict") =>
                        {
                            lock(&obs).event(format!("{name} claim {key} refused: {}", s.message()));
                            Outcome::Done
                        }
                        Ok(Err(s)) => Outcome::Refused(s),
                        Err(_) => Outcome::NoAnswer,
                    }
                }
                Op::Cancel { key } => {
                    let Some(id) = lock(&obs).key_ids.get(key).cloned() else {
                        break;
                    };
                    let req = pb::CancelRequest { id: id.clone() };
                    match tokio::time::timeout(Duration::from_secs(3), c.cancel(req)).await {
                        Ok(Ok(r)) => {
                            lock(&obs).event(format!("{name} cancel {id}: {}", r.into_inner().state));
                            Outcome::Done
                        }
                        Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                            lock(&obs).violation(format!(
                                "acknowledged {id} (key {key}) is unknown to the leader m{target} answering a cancel: {}",
                                s.message()
                            ));
                            Outcome::Done
                        }
                        Ok(Err(s)) => Outcome::Refused(s),
                        Err(_) => Outcome::NoAnswer,
                    }
                }
            };
            match outcome {
                Outcome::Done => break,
                Outcome::NoAnswer => target = target % n + 1,
                Outcome::Refused(s) => match s.code() {
                    tonic::Code::FailedPrecondition => {
                        target = leader_named(s.message())
                            .filter(|l| (1..=n).contains(l))
                            .unwrap_or(target % n + 1)
                    }
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
                        // The leader could not make it durable (or the connection broke): same
                        // member again, then the next.
                        if attempts.is_multiple_of(3) {
                            target = target % n + 1;
                        }
                    }
                    _ => {
                        lock(&obs).violation(format!(
                            "{name}: {} refused by m{target}: {:?} {}",
                            describe(&t.op),
                            s.code(),
                            s.message()
                        ));
                        break;
                    }
                },
            }
        }
    }
    lock(&obs).event(format!("{name} done"));
    Ok(())
}

enum Outcome {
    Done,
    NoAnswer,
    Refused(tonic::Status),
}

fn describe(op: &Op) -> String {
    match op {
        Op::Submit { key, .. } => format!("submit {key}"),
        Op::Cancel { key } => format!("cancel {key}"),
    }
}

/// Records an acknowledgement: an id is never acknowledged for two keys (ids are never reused), nor
/// a key for two ids (a retry never makes a second allocation).
fn acknowledged(obs: &SharedObs, client: &str, key: &str, id: &str, by: u64) {
    let mut o = lock(obs);
    if let Some(prev) = o.key_ids.get(key)
        && prev != id
    {
        let v = format!("key {key} acknowledged as {prev} and again as {id}");
        o.violation(v);
    }
    if let Some((k, _)) = o.acked.get(id)
        && k != key
    {
        let v = format!("id {id} reused: acknowledged for {k} and for {key}");
        o.violation(v);
    }
    let t = now_ms();
    o.acked.entry(id.to_string()).or_insert((key.to_string(), t));
    o.key_ids.entry(key.to_string()).or_insert(id.to_string());
    o.event(format!("{client} ack {key} {id} from m{by}"));
}

/// One member of a planned DAG.
#[derive(Clone, Debug)]
pub struct DagMember {
    pub name: String,
    pub nodes: u32,
    pub run_ms: u64,
    /// Names of earlier members it depends on (condition `success`).
    pub after: Vec<String>,
}

/// What the DAG client does.
#[derive(Clone, Debug)]
pub enum DagOp {
    /// Submits a DAG under an id of the client's choosing (its idempotency key).
    Submit { id: String, members: Vec<DagMember> },
    /// Cancels an earlier DAG (when it was acknowledged).
    Cancel { id: String },
}

/// A DAG op and when (simulated ms) the client starts it.
#[derive(Clone, Debug)]
pub struct TimedDag {
    pub at_ms: u64,
    pub op: DagOp,
}

/// The DAG client's plan over `steps` steps: DAGs of 2–4 members (each after none or one or two
/// earlier ones), 1–2 nodes for 0.1–1.5 s each, and now and then a cancellation of an earlier DAG.
pub fn dag_plan(rng: &mut ChaCha8Rng, steps: u64, client: &str) -> Vec<TimedDag> {
    let span_ms = (steps * obs::TICK.as_millis() as u64).max(1000);
    let count = (steps / 150).clamp(1, 60);
    let mut ops = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    for j in 0..count {
        let at_ms = rng.next_u64() % (span_ms * 9 / 10);
        if !ids.is_empty() && rng.next_u64().is_multiple_of(6) {
            let id = ids[(rng.next_u64() % ids.len() as u64) as usize].clone();
            ops.push(TimedDag {
                at_ms,
                op: DagOp::Cancel { id },
            });
            continue;
        }
        let n = 2 + (rng.next_u64() % 3) as usize;
        let names = ["prep", "train", "eval", "report"];
        let members = (0..n)
            .map(|i| {
                let mut after = Vec::new();
                if i > 0 {
                    after.push(names[(rng.next_u64() % i as u64) as usize].to_string());
                    if i > 1 && rng.next_u64().is_multiple_of(3) {
                        let other = names[(rng.next_u64() % i as u64) as usize].to_string();
                        if !after.contains(&other) {
                            after.push(other);
                        }
                    }
                }
                DagMember {
                    name: names[i].to_string(),
                    nodes: 1 + (rng.next_u64() % 2) as u32,
                    run_ms: 100 + rng.next_u64() % 1400,
                    after,
                }
            })
            .collect();
        let id = format!("{client}-d{j}");
        ids.push(id.clone());
        ops.push(TimedDag {
            at_ms,
            op: DagOp::Submit { id, members },
        });
    }
    ops.sort_by_key(|t| t.at_ms);
    ops
}

/// The REST body of a DAG submission.
fn dag_body(id: &str, members: &[DagMember]) -> serde_json::Value {
    let allocations: Vec<serde_json::Value> = members
        .iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "tenant": "physics",
                "resources": {"nodes": m.nodes},
                "lifecycle": {"type": "bounded", "walltime": "1h"},
                "duration": format!("{}ms", m.run_ms),
                "entrypoint": format!("sleep {:.3}", m.run_ms as f64 / 1000.0),
                "depends_on": m.after.iter().map(|a| serde_json::json!({"ref": a})).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({"id": id, "allocations": allocations})
}

/// Runs the DAG client's `ops` over the REST API (retrying as a careful client does: the same DAG id
/// after a lost answer, a 503 or a fail-over; the leader a 421 names).
pub async fn run_dags(name: String, ops: Vec<TimedDag>, n: u64, obs: SharedObs) -> turmoil::Result {
    let mut target: u64 = 1;
    for t in ops {
        let now = now_ms();
        if t.at_ms > now {
            tokio::time::sleep(Duration::from_millis(t.at_ms - now)).await;
        }
        let started = now_ms();
        let mut attempts = 0u32;
        loop {
            if now_ms() - started > GIVE_UP.as_millis() as u64 {
                lock(&obs).event(format!("{name} gave up {}", describe_dag(&t.op)));
                break;
            }
            if attempts > 0 {
                tokio::time::sleep(Duration::from_millis(100 + 50 * u64::from(attempts.min(8)))).await;
            }
            attempts += 1;
            let answer = match &t.op {
                DagOp::Submit { id, members } => {
                    crate::agents::request(target, "POST", "/v1/dags", &dag_body(id, members)).await
                }
                DagOp::Cancel { id } => {
                    if !lock(&obs).key_ids.keys().any(|k| k.starts_with(&format!("{id}/"))) {
                        break;
                    }
                    crate::agents::request(target, "DELETE", &format!("/v1/dags/{id}"), &serde_json::Value::Null).await
                }
            };
            match (answer, &t.op) {
                (Some((201, v)), DagOp::Submit { id, members }) => {
                    let ids = &v["allocations"];
                    let got: Vec<(String, String)> = members
                        .iter()
                        .filter_map(|m| Some((m.name.clone(), ids[&m.name].as_str()?.to_string())))
                        .collect();
                    if got.len() != members.len() || v["id"].as_str() != Some(id.as_str()) {
                        lock(&obs).violation(format!("{name}: DAG {id} acknowledged with {v}"));
                        break;
                    }
                    for (member, alloc) in &got {
                        acknowledged(&obs, &name, &format!("{id}/{member}"), alloc, target);
                    }
                    let by_name: BTreeMap<&str, &str> = got.iter().map(|(m, a)| (m.as_str(), a.as_str())).collect();
                    let mut o = lock(&obs);
                    for m in members.iter().filter(|m| !m.after.is_empty()) {
                        let parents = m
                            .after
                            .iter()
                            .filter_map(|p| by_name.get(p.as_str()))
                            .map(|p| p.to_string());
                        o.dag_deps
                            .insert(by_name[m.name.as_str()].to_string(), parents.collect());
                    }
                    break;
                }
                (Some((200, v)), DagOp::Cancel { id }) => {
                    lock(&obs).event(format!("{name} cancel DAG {id}: {v}"));
                    break;
                }
                (Some((404, v)), DagOp::Cancel { id }) => {
                    lock(&obs).violation(format!(
                        "acknowledged DAG {id} is unknown to the leader m{target} answering a cancel: {v}"
                    ));
                    break;
                }
                (Some((421, v)), _) => {
                    target = v["leader_id"]
                        .as_u64()
                        .filter(|l| (1..=n).contains(l))
                        .unwrap_or(target % n + 1)
                }
                (Some((502..=504, _)) | None, _) => {
                    if attempts.is_multiple_of(3) {
                        target = target % n + 1;
                    }
                }
                (Some((code, v)), op) => {
                    lock(&obs).violation(format!("{name}: {} refused by m{target}: {code} {v}", describe_dag(op)));
                    break;
                }
            }
        }
    }
    lock(&obs).event(format!("{name} done"));
    Ok(())
}

fn describe_dag(op: &DagOp) -> String {
    match op {
        DagOp::Submit { id, .. } => format!("submit DAG {id}"),
        DagOp::Cancel { id } => format!("cancel DAG {id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    #[test]
    fn refusals_name_the_leader_and_plans_are_seeded() {
        assert_eq!(leader_named("not the quorum leader (leader 2, m2:9000)"), Some(2));
        assert_eq!(leader_named("not the quorum leader (leader unknown, )"), None);
        let a = plan(&mut ChaCha8Rng::seed_from_u64(7), 2000);
        let b = plan(&mut ChaCha8Rng::seed_from_u64(7), 2000);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(a.len(), 2);
        assert!(a[0].len() >= 40 && a[0].windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }
}
