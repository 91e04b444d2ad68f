//! The safety checks run after every step, and the liveness condition after the faults heal.
//!
//! Safety, on every live member's applied quorum state: no node owned by two allocations, owners
//! and assignments agree, hard quotas never exceeded, the sensitive audit chain verifies (hashes and
//! signatures), no entry once seen ever changes, and each sensitive allocation's trail is in order
//! ([`audit_gap`]). On the serving leader (the newest term's, once it has adopted the
//! queue): every acknowledged allocation is known, an ended allocation never changes state again,
//! and no idempotency key has two live allocations. The clients check that ids are never reused
//! and a key is never acknowledged twice ([`crate::client`]).

use crate::obs::{self, Obs, SharedObs, lock};
use lattice_runtime::server::Shared;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The live members, 1-based, with their shared state.
fn live(o: &Obs) -> Vec<(u64, Arc<Shared>)> {
    o.members
        .iter()
        .enumerate()
        .filter_map(|(i, w)| Some((i as u64 + 1, w.as_ref()?.upgrade()?)))
        .collect()
}

/// The leader of the newest term among the live members (1-based).
pub fn leader(obs: &SharedObs) -> Option<u64> {
    serving(&lock(obs)).map(|(m, _, _)| m)
}

/// The leader of the newest term any live member has seen: (member, term, state). A deposed leader
/// that has not heard of the newer term yet is not it.
fn serving(o: &Obs) -> Option<(u64, u64, Arc<Shared>)> {
    let members = live(o);
    let newest = members.iter().map(|(_, s)| s.member.current_term()).max()?;
    members
        .into_iter()
        .filter_map(|(m, s)| Some((m, s.member.leader_term()?, s)))
        .find(|(_, t, _)| *t >= newest)
}

/// Weights and configuration the operator was told were taken (or ones it sent and never heard of)
/// are those the serving leader `m` (of `term`) schedules vCluster `default` with.
fn settings_violations(o: &Obs, c: &lattice_control::Control, m: u64, term: u64) -> Vec<String> {
    let view = c.vcluster_view("default").unwrap_or_default();
    let weights = view["weights"]["priority"].as_f64().map(|p| (p * 10.0).round() as u32);
    let wait = view["reference_wait"].as_f64().map(|s| (s / 3600.0).round() as u32);
    let share = c
        .tenant_view("physics")
        .and_then(|t| t["quota"]["fair_share_target"].as_f64());
    let share = share.map(|s| (s * 10.0).round() as u32);
    let mut out = Vec::new();
    for (what, seen, in_force) in [
        ("weights (priority, tenths)", &o.weights, weights),
        ("reference_wait (h)", &o.reference_wait, wait),
        ("tenant physics's fair_share_target (tenths)", &o.fair_share, share),
    ] {
        let Some((acked, since)) = seen else { continue };
        if !in_force.is_some_and(|p| p == *acked || since.contains(&p)) {
            out.push(format!(
                "the leader schedules with {what} {in_force:?} at m{m} (term {term}), not the acknowledged {acked} (nor one never answered: {since:?}); in force: {view}"
            ));
        }
    }
    out
}

fn terminal(state: &str) -> bool {
    matches!(state, "completed" | "failed" | "cancelled")
}

#[derive(Default)]
pub struct Checker {
    /// The longest audit chain seen (entry hashes).
    audit: Vec<String>,
    /// Each member's chain when last verified: its length and newest hash.
    audit_seen: BTreeMap<u64, (usize, Option<String>)>,
    /// Last state seen for each acknowledged allocation at the serving leader, and that leader (member, term).
    states: BTreeMap<String, (String, (u64, u64))>,
    /// Final states that a majority of the members' copies hold: never to change again.
    finals: BTreeMap<String, String>,
    leader: Option<(u64, u64)>,
    /// What the acknowledged allocations were last checked against: the serving leader (member,
    /// term — one incarnation leads a term), how often its control plane's lock had been taken, and
    /// how many allocations were acknowledged and final. While it is the same, nothing they are
    /// checked on changed.
    acked_seen: Option<(u64, u64, u64, usize, usize)>,
    /// The VNI each running allocation's run (by its start) was seen on: a leader change keeps it.
    vnis: BTreeMap<String, (u64, u32, (u64, u64))>,
    /// The members' audit keys (public, hex): every entry is signed with one of them.
    audit_keys: Vec<String>,
}

/// The states the API names: the engine's, and a preempted allocation's (`suspending` while its
/// agents stop it, then `suspended` or `preempted` while it waits again).
const KNOWN_STATES: [&str; 9] = [
    "pending",
    "staging",
    "running",
    "completed",
    "failed",
    "cancelled",
    "suspended",
    "suspending",
    "preempted",
];

impl Checker {
    pub fn new(members: u64) -> Checker {
        let audit_keys = (1..=members)
            .map(|id| {
                let key = lattice_runtime::audit_key::load(None, Some(id)).expect("a derived key");
                lattice_engine::audit::public_hex(&key)
            })
            .collect();
        Checker {
            audit_keys,
            ..Checker::default()
        }
    }

    /// A run keeps its network domain's VNI whoever leads: `run` (its start, its VNI) as the
    /// leader `at` (member, term) shows it.
    fn vni_kept(&mut self, id: &str, run: Option<(u64, Option<u32>)>, at: (u64, u64)) -> Option<String> {
        let (started, Some(vni)) = run? else { return None };
        match self.vnis.get(id) {
            Some((s0, vni0, was)) if *s0 == started && *vni0 != vni => Some(format!(
                "{id}'s run since {started} ms is on VNI {vni} at m{} (term {}), on VNI {vni0} at m{} (term {})",
                at.0, at.1, was.0, was.1
            )),
            _ => {
                self.vnis.insert(id.to_string(), (started, vni, at));
                None
            }
        }
    }

    pub fn after_step(&mut self, obs: &SharedObs, _clients_done: bool) {
        let mut o = lock(obs);
        // The agents' work: one allocation per node, one start per allocation at a time.
        for v in crate::agents::check(&o.procs) {
            if !o.violations.contains(&v) {
                o.violation(v);
            }
        }
        for (m, s) in live(&o) {
            let seen = self.audit_seen.get(&m).cloned();
            let Some(found) = s.member.try_read(|q| {
                let mut v = Vec::new();
                let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
                let mut per_tenant: BTreeMap<&str, u64> = BTreeMap::new();
                for (alloc, a) in &q.assignments {
                    *per_tenant.entry(a.tenant.as_str()).or_default() += a.nodes.len() as u64;
                    for n in &a.nodes {
                        if let Some(other) = owner.insert(n, alloc) {
                            v.push(format!("m{m}: node {n} owned by {other} and {alloc}"));
                        }
                        if q.owners.get(n) != Some(alloc) {
                            v.push(format!(
                                "m{m}: {alloc} holds {n} but the owners map says {:?}",
                                q.owners.get(n)
                            ));
                        }
                    }
                }
                for (tenant, (max_nodes, _)) in &q.quotas {
                    let used = per_tenant.get(tenant.as_str()).copied().unwrap_or(0);
                    if let Some(max) = max_nodes
                        && used > u64::from(*max)
                    {
                        v.push(format!(
                            "m{m}: tenant {tenant} holds {used} nodes over its hard quota {max}"
                        ));
                    }
                }
                // The chain is verified and compared whole whenever its length or newest hash
                // changed at this member (each entry's hash covers the one before it).
                let now = (q.audit.len(), q.audit.last().map(|e| e.hash.clone()));
                if seen.as_ref() == Some(&now) {
                    return (v, None);
                }
                v.extend(
                    audit_problems(q, &self.audit_keys)
                        .into_iter()
                        .map(|p| format!("m{m}: {p}")),
                );
                (
                    v,
                    Some((now, q.audit.iter().map(|e| e.hash.clone()).collect::<Vec<_>>())),
                )
            }) else {
                continue;
            };
            let (violations, chain) = found;
            for v in violations {
                o.violation(v);
            }
            let Some((now, chain)) = chain else { continue };
            self.audit_seen.insert(m, now);
            let common = chain.len().min(self.audit.len());
            if let Some(i) = (0..common).find(|&i| chain[i] != self.audit[i]) {
                o.violation(format!("m{m}: audit entry {i} changed after it was seen"));
            }
            if chain.len() > self.audit.len() {
                self.audit = chain;
            }
        }
        let Some((m, term, s)) = serving(&o) else {
            return;
        };
        if self.leader != Some((m, term)) {
            self.leader = Some((m, term));
            o.event(format!("leader m{m} term {term}"));
        }
        // Only once it has adopted the queue (it refuses requests until then).
        let Ok(leading) = s.leading.try_lock() else { return };
        if *leading != Some(term) {
            return;
        }
        let unchanged = self.acked_seen == Some((m, term, s.control.taken(), o.acked.len(), self.finals.len()));
        let Ok(c) = s.control.try_lock() else { return };
        let mut events = Vec::new();
        let mut violations = Vec::new();
        for (id, (key, at)) in o.acked.iter().filter(|_| !unchanged) {
            let Some(v) = c.brief(id) else {
                violations.push(format!(
                    "acknowledged {id} (key {key}, at {at} ms) is unknown to the leader m{m} (term {term})"
                ));
                continue;
            };
            if let Some(f) = self.finals.get(id)
                && *f != v.state
            {
                violations.push(format!(
                    "{id} ended {f} (on a majority's disks) and is now {} at m{m} (term {term})",
                    v.state
                ));
            }
            // Every DST allocation sleeps a few seconds under an hour's walltime: one ended at its
            // walltime was timed on clocks that disagree (a member whose wall clock jumped).
            if let Some(r) = v.end_reason
                && r.contains("walltime")
            {
                violations.push(format!(
                    "{id} ended {r} at m{m} (term {term}), though it runs seconds of its 1 h walltime"
                ));
            }
            // The allocation state machine (`AllocState::can_transition_to`, seen through the
            // API's names), as one leader serves it: every step is sampled, so any path through the
            // machine may lie between two samples, but an end is final — and a state is one the
            // machine has, with what it implies (nodes while running, an end time once ended).
            if !KNOWN_STATES.contains(&v.state) {
                violations.push(format!(
                    "{id} is in an unknown state {:?} at m{m} (term {term})",
                    v.state
                ));
            }
            if terminal(v.state) != v.ended_ms.is_some() {
                violations.push(format!(
                    "{id} is {} at m{m} (term {term}) with ended_ms {:?}",
                    v.state, v.ended_ms
                ));
            }
            if v.state == "running" && !v.holds_nodes {
                violations.push(format!("{id} is running at m{m} (term {term}) on no nodes"));
            }
            if v.state == "running" {
                violations.extend(self.vni_kept(id, v.run, (m, term)));
            }
            let changed = |state: &str| {
                if terminal(v.state) {
                    format!("{id} ended {state}")
                } else {
                    format!("{id} {state}")
                }
            };
            match self.states.get_mut(id) {
                Some((was, at)) => {
                    if *at == (m, term) && terminal(was) && was != v.state {
                        violations.push(format!(
                            "{id} went from {was} to {} at m{m} within term {term}: an end is final",
                            v.state
                        ));
                    }
                    if was != v.state {
                        events.push(changed(v.state));
                        *was = v.state.to_string();
                    }
                    *at = (m, term);
                }
                None => {
                    events.push(changed(v.state));
                    self.states.insert(id.clone(), (v.state.to_string(), (m, term)));
                }
            }
        }
        self.acked_seen = Some((m, term, s.control.taken(), o.acked.len(), self.finals.len()));
        // A DAG member runs only after the members it depends on completed.
        for (child, parents) in &o.dag_deps {
            let Some(v) = c.brief(child) else { continue };
            if !matches!(v.state, "running" | "staging") {
                continue;
            }
            for p in parents {
                let ps = c.brief(p).map_or("unknown", |v| v.state);
                if ps != "completed" {
                    violations.push(format!(
                        "{child} is {} at m{m} (term {term}) while {p}, which it runs after, is {ps}",
                        v.state
                    ));
                }
            }
        }
        violations.extend(settings_violations(&o, &c, m, term));
        // A drain the operator was told was taken holds at every later leader until it is lifted.
        for (node, sure) in &o.drained {
            if *sure && c.node_state_of(node).as_deref() == Some("ready") {
                violations.push(format!(
                    "node {node} was drained (acknowledged) but is ready for work at m{m} (term {term})"
                ));
            }
        }
        if let Ok(mirror) = s.mirror.try_lock() {
            // Two allocations of one key that the leader did not cancel (a submission that could
            // not be acknowledged is cancelled, and a retry queues anew).
            let mut live_by_key: BTreeMap<(&str, &str), Vec<(&str, String)>> = BTreeMap::new();
            for e in mirror.entries.values() {
                let cancelled = c
                    .brief(&e.id)
                    .map_or(e.ended.as_ref().map(|v| v.state.as_str()), |v| Some(v.state))
                    .is_some_and(|s| s == "cancelled");
                if let (Some(k), false) = (&e.req.idempotency_key, cancelled) {
                    let base = lattice_control::group_element(&e.id).map_or(e.id.as_str(), |(b, _)| b);
                    let ids = live_by_key.entry((e.req.tenant.as_str(), k.as_str())).or_default();
                    if !ids.iter().any(|(b, _)| *b == base) {
                        let state = c
                            .brief(&e.id)
                            .map_or("unknown here".to_string(), |v| v.state.to_string());
                        ids.push((base, state));
                    }
                }
            }
            for ((tenant, key), ids) in live_by_key {
                if ids.len() > 1 {
                    violations.push(format!(
                        "idempotency key {key} of {tenant} has {} allocations at m{m}: {}",
                        ids.len(),
                        ids.iter()
                            .map(|(id, st)| format!("{id} ({st})"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
        drop(c);
        // Ends a majority holds are final.
        let majority = o.members.len() / 2 + 1;
        let mut held: BTreeMap<String, (String, usize)> = BTreeMap::new();
        for (_, m) in live(&o) {
            let Ok(mirror) = m.mirror.try_lock() else { continue };
            for id in o.acked.keys().filter(|id| !self.finals.contains_key(*id)) {
                let n = lattice_control::id_number(id).unwrap_or(0);
                if let Some(v) = mirror.entries.get(&n).and_then(|e| e.ended.as_ref()) {
                    let e = held.entry(id.clone()).or_insert((v.state.clone(), 0));
                    if e.0 == v.state {
                        e.1 += 1;
                    }
                }
            }
        }
        for (id, (state, copies)) in held {
            if copies >= majority {
                self.finals.entry(id).or_insert(state);
            }
        }
        for e in events {
            o.event(e);
        }
        for v in violations {
            o.violation(v);
        }
    }

    /// Whether every acknowledged allocation has ended, as the serving leader last showed it.
    pub fn all_ended(&self, obs: &SharedObs) -> bool {
        let o = lock(obs);
        o.acked
            .keys()
            .all(|id| self.states.get(id).is_some_and(|(s, _)| terminal(s)))
    }

    /// Why liveness does not hold.
    pub fn liveness_failure(&self, obs: &SharedObs) -> String {
        let o = lock(obs);
        let Some((m, term, _)) = serving(&o) else {
            return format!(
                "liveness: no leader within {} s of the faults healing",
                obs::LIVENESS_BOUND.as_secs()
            );
        };
        let s = serving(&o).map(|(_, _, s)| s);
        let acks = s.as_ref().and_then(|s| s.control.try_lock().ok());
        let waiting: Vec<String> = o
            .acked
            .keys()
            .filter(|id| !self.states.get(*id).is_some_and(|(s, _)| terminal(s)))
            .map(|id| {
                let ack = match acks.as_ref().map(|c| c.ack_state(id)) {
                    Some(Some(true)) => ", being acknowledged",
                    Some(Some(false)) => ", not yet acknowledged",
                    _ => "",
                };
                let why = acks
                    .as_ref()
                    .and_then(|c| c.view_named(id))
                    .map(|v| {
                        format!(
                            ", {} needs {} node(s){}",
                            v.tenant,
                            v.requested_nodes,
                            v.last_rejection
                                .map_or(String::new(), |r| format!(", last rejected: {r}"))
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "{id} ({}{ack}{why})",
                    self.states.get(id).map_or("never seen", |(s, _)| s.as_str())
                )
            })
            .collect();
        drop(acks);
        let held: Vec<String> = s
            .and_then(|s| {
                s.control.try_lock().ok().map(|c| {
                    s.member
                        .try_read(|q| {
                            q.assignments
                                .iter()
                                .map(|(a, x)| {
                                    let st = c.view_named(a).map_or("unknown".into(), |v| v.state);
                                    format!("{a} ({st}) on {}", x.nodes.join(","))
                                })
                                .collect::<Vec<_>>()
                        })
                        .unwrap_or_default()
                })
            })
            .unwrap_or_default();
        let nodes: Vec<String> = serving(&o)
            .and_then(|(_, _, s)| {
                s.control.try_lock().ok().map(|c| {
                    let mut v: Vec<String> = c
                        .node_names()
                        .iter()
                        .map(|n| format!("{n} {}", c.node_state_of(n).unwrap_or_default()))
                        .collect();
                    let e = &c.ctl.engine;
                    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
                    for a in e.allocations() {
                        *states.entry(a.state.as_str()).or_default() += 1;
                    }
                    let committed: Vec<String> = (0..8u32)
                        .filter_map(|t| {
                            let id = lattice_engine::TenantId(t);
                            Some(format!("{} {:?}", e.tenant(id)?.name, e.tenant_committed(id)))
                        })
                        .collect();
                    // What a pass would do now (on a copy).
                    let mut probe = e.clone();
                    let stats = probe.schedule(c.now());
                    let mut proposed = Vec::new();
                    while let Some(p) = probe.poll_proposal() {
                        proposed.push(format!("{:?} on {:?}", p.alloc, p.nodes));
                    }
                    v.push(format!(
                        "engine: {} free, allocations by state {states:?}, committed (nodes, allocations) {}; a pass now: {stats:?}, proposes {proposed:?}; nodes {:?}",
                        e.free_nodes(),
                        committed.join(", "),
                        e.nodes().iter().map(|n| (n.state, n.owner.map(|o| o.alloc))).collect::<Vec<_>>()
                    ));
                    v
                })
            })
            .unwrap_or_default();
        format!(
            "liveness: {} acknowledged allocation(s) not ended within {} s of the faults healing (leader m{m}, term {term}): {}; nodes held: {}; node states: {}",
            waiting.len(),
            obs::LIVENESS_BOUND.as_secs(),
            waiting.iter().take(8).cloned().collect::<Vec<_>>().join(", "),
            held.join("; "),
            nodes.join(", ")
        )
    }
}

/// What is wrong with a member's audit log: its chain (hashes, signatures), an entry not signed by
/// a member's key, a trail out of order ([`audit_gap`]).
fn audit_problems(q: &lattice_adapters::QuorumState, keys: &[String]) -> Vec<String> {
    let mut v = Vec::new();
    if let Err(i) = q.verify_audit() {
        v.push(format!(
            "the audit chain breaks at entry {i} (its hash or its signature)"
        ));
    }
    if let Err(i) = lattice_engine::audit::signed_by(&q.audit, keys) {
        v.push(format!("audit entry {i} is not signed with a member's audit key"));
    }
    v.extend(audit_gap(&q.audit));
    v
}

/// The first entry of a sensitive allocation's audit trail that an entry it needs does not precede
/// (book: claim, release with wipe confirmation): its release or its start without its claim, a
/// node's wipe or quarantine without its release. A lifecycle event the log dropped shows here.
pub fn audit_gap(log: &[lattice_engine::audit::AuditEntry]) -> Option<String> {
    let mut seen: std::collections::BTreeMap<&str, (bool, bool)> = std::collections::BTreeMap::new();
    for e in log {
        let (claimed, released) = seen.entry(e.alloc.as_str()).or_default();
        let needs = match e.action.as_str() {
            "claim" => {
                *claimed = true;
                None
            }
            "release" => {
                let n = (!*claimed).then_some("claim");
                *released = true;
                n
            }
            "start" | "boot" => (!*claimed).then_some("claim"),
            "wipe" | "quarantine" => (!*released).then_some("release"),
            _ => None,
        };
        if let Some(n) = needs {
            return Some(format!(
                "audit entry {} ({} of {}) has no {n} before it in the audit log",
                e.seq, e.action, e.alloc
            ));
        }
    }
    None
}
