//! Queue mirroring and the durable record of acknowledged allocations. The seed keeps queues out of
//! Raft (eventually consistent), yet an acknowledged submission must survive the leader's death and
//! any restart. Every member keeps a copy of the leader's queue — each allocation's request, its
//! submission time, its DAG, the exits its agents reported and, once it ended, its final record —
//! in memory and on disk (`DATA_DIR/allocations.redb`, [`lattice_adapters::alloc_store`]). The leader
//! writes each submission to its own disk and mirrors it to the other members over the gRPC port
//! (`QueueMirror.Apply`; each writes it to disk before answering), and acknowledges it only once a
//! majority of the members (itself included) holds it durably.
//!
//! A member that becomes leader — after a fail-over, or when a restarted quorum elects it — first
//! merges the other members' copies into its own (`QueueMirror.Fetch`), then adopts the result on a
//! fresh engine: ended allocations stay visible as their final records; every other one is queued
//! again under the id its submitter was given, with its original submission time; one the quorum
//! still records as holding nodes is re-attached to them with its original start (its agents kept
//! running it), not run again. Ids are never reused: the copy carries the highest id handed out.
//!
//! This module is the copy itself; [`net`] records changes in it and carries them between members.

pub mod net;

use lattice_adapters::alloc_store::{AllocStore, Change, Pending, Writer};
use lattice_control::{AllocationView, SubmitRequest, id_number};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Ended allocations whose final record is kept (at least the newest this many; older ones are
/// forgotten).
pub const ENDED_KEPT: usize = 10_000;

/// One allocation in a member's copy.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    pub req: SubmitRequest,
    /// When it was first submitted (ms since the epoch).
    #[serde(default)]
    pub submitted_ms: u64,
    /// Exit codes its agents reported by node, while it runs on several nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exits: BTreeMap<String, i32>,
    /// The run `exits` belong to (its nodes' assignment time at the quorum): a requeued
    /// allocation's next run starts with none.
    #[serde(default)]
    pub exits_run: u64,
    /// Its final record, once it ended (completed, failed, cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<AllocationView>,
    /// The term of the leader that last mirrored this record whole (queued it, or mirrored it again
    /// for a retry or with its end). Two copies holding different allocations under one number came
    /// from two leaders; the one a newer term mirrored is the real one: a leader reads a majority's
    /// copies before it hands out numbers or mirrors anything, and older leaders are fenced, so a
    /// record acknowledged under some term is seen by every later leader — which either keeps it
    /// (and stamps it with its own term when it mirrors it again) or never reuses its number.
    #[serde(default)]
    pub term: u64,
    /// The term it was first queued in: with `submitted_ms`, what tells two allocations under one
    /// number apart (0 in records written before it was kept: then `term`).
    #[serde(default)]
    pub origin: u64,
    /// The newest term that mirrored this record while it had not ended (queued it, or mirrored it
    /// again for a retry): which leader chose to keep it. Mirroring its end does not count — a
    /// leader also records the end of an attempt it cancels as never acknowledged. Of two attempts
    /// under one idempotency key, the one kept by the newer term is the one that can have been
    /// acknowledged (0 in records written before it was kept: then the origin term).
    #[serde(default)]
    pub kept: u64,
    /// The term that recorded its end (with [`Entry::ended`]; 0 in records written before it was
    /// kept: then `term`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ended_term: u64,
}

fn is_zero(t: &u64) -> bool {
    *t == 0
}

impl Entry {
    /// Whether `other` is this same allocation (perhaps further along, or updated), not another
    /// leader's under the same number.
    fn same_allocation(&self, other: &Entry) -> bool {
        self.origin_term() == other.origin_term() && self.submitted_ms == other.submitted_ms
    }

    fn origin_term(&self) -> u64 {
        if self.origin == 0 { self.term } else { self.origin }
    }

    /// [`Entry::kept`], or the origin term for older records.
    pub fn kept_term(&self) -> u64 {
        self.kept.max(self.origin_term())
    }

    /// [`Entry::ended_term`], or the record's term for older records.
    fn end_term(&self) -> u64 {
        if self.ended_term == 0 {
            self.term
        } else {
            self.ended_term
        }
    }
}

/// Mirror rounds — group commit across the members: the operations that arrive while a round is
/// out go to each other member together in the next one (one RPC per member, one transaction on its
/// disk), each answered when a majority holds its round.
#[derive(Default)]
pub struct Rounds {
    state: std::sync::Mutex<RoundState>,
}

#[derive(Default)]
struct RoundState {
    queue: std::collections::VecDeque<Queued>,
    /// A task is sending rounds (it stops when the queue is empty).
    sending: bool,
}

struct Queued {
    op: Vec<u8>,
    term: u64,
    within: Duration,
    done: tokio::sync::oneshot::Sender<bool>,
}

/// One mirrored change.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MirrorOp {
    /// Queued under these ids (one submission, or a DAG's members in dependency order), with the
    /// DAG's grouping when it is one.
    Submit {
        items: Vec<(String, SubmitRequest)>,
        #[serde(default)]
        submitted_ms: u64,
        #[serde(default)]
        dag: Option<(String, Vec<(String, String)>)>,
    },
    /// These ended: their final records. `forget`: records to drop. (Read for compatibility; no
    /// longer sent — ends are mirrored as whole [`MirrorOp::Entries`], which a copy holding another
    /// allocation under the same number can tell apart, and a leader that does not know an
    /// allocation is no reason to drop its record.)
    Ended {
        views: Vec<AllocationView>,
        #[serde(default)]
        forget: Vec<String>,
    },
    /// `PATCH`: a new walltime and/or tags (an empty value removes the tag).
    Update {
        id: String,
        walltime: Option<String>,
        tags: BTreeMap<String, String>,
    },
    /// An agent reported a process's exit on one node of a running allocation, in the run assigned
    /// at `run` (ms; 0 when unknown).
    Exit {
        id: String,
        node: String,
        code: i32,
        #[serde(default)]
        run: u64,
    },
    /// Whole entries as the leader holds them (a submission mirrored again for a client's retry or
    /// in the background, or with its end), stamped with the mirroring leader's term and taken like
    /// a merge; with the records of the DAGs they belong to (a DAG mirrored again).
    Entries {
        entries: Vec<Entry>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        dags: Vec<(String, Vec<(String, String)>)>,
    },
}

/// A member's whole copy, as `QueueMirror.Fetch` sends it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    pub entries: BTreeMap<u64, Entry>,
    pub max_id: u64,
    pub dags: BTreeMap<String, Vec<(String, String)>>,
}

impl Snapshot {
    /// Members of a keyed DAG attempt that were never acknowledged. A DAG is mirrored whole, in one
    /// op, before it is acknowledged: every member under one origin term and submission time. When
    /// the DAG's record names entries of different submissions, some of its numbers were handed out
    /// again by a leader that never saw the attempt — which no leader does to a submission on a
    /// majority's copies — so the attempt was never acknowledged, whichever submission is the older.
    /// Its own members (keyed `dag:ID:`) that have not ended are returned: a take-over cancels them
    /// instead of running them — with dependencies that now name other allocations — beside the
    /// client's retry (found by DST: seeds 59, 189 and 101 with the runtime's own simulated agents,
    /// where a later leader took some numbers; seed 190 of isolate-leader without agents, where an
    /// earlier leader's submissions under the same numbers won the merge).
    pub fn stranded_dag_members(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for (dag, members) in &self.dags {
            let prefix = format!("dag:{dag}:");
            // Members trimmed from the copy (ended long ago) say nothing either way.
            let here: Vec<&Entry> = members
                .iter()
                .filter_map(|(_, id)| self.entries.get(&id_number(id)?))
                .collect();
            let Some(first) = here.first() else {
                continue;
            };
            let whole = here
                .iter()
                .all(|e| (e.origin_term(), e.submitted_ms) == (first.origin_term(), first.submitted_ms));
            if whole {
                continue;
            }
            out.extend(
                here.iter()
                    .filter(|e| {
                        e.ended.is_none() && e.req.idempotency_key.as_deref().is_some_and(|k| k.starts_with(&prefix))
                    })
                    .map(|e| e.id.clone()),
            );
        }
        out
    }
}

/// A member's copy of the leader's queue, with its durable store.
#[derive(Default)]
pub struct Mirror {
    pub entries: BTreeMap<u64, Entry>,
    /// The highest allocation number ever mirrored here (ids continue above it).
    pub max_id: u64,
    /// DAG id → (member name, allocation id).
    pub dags: BTreeMap<String, Vec<(String, String)>>,
    /// How many entries hold a final record (kept counted: trimming scans only past the slack).
    ended: usize,
    /// The newest leader term this member promised (answering a new leader's fetch): operations of
    /// older terms are refused from then on. Kept on disk.
    pub fence: u64,
    writer: Option<Writer>,
}

/// Final records beyond [`ENDED_KEPT`] are trimmed in batches of this many (one scan per batch).
const ENDED_SLACK: usize = 1_000;

const MAX_ID: &str = "max_id";
const FENCE: &str = "fence";
const DAG_PREFIX: &str = "dag/";

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("mirror records serialize")
}

impl Mirror {
    /// Opens the copy kept in `dir` (created empty the first time); what it holds is loaded.
    pub fn open(dir: &std::path::Path) -> anyhow::Result<Mirror> {
        Mirror::open_on(&lattice_adapters::disk::Disk::Dir(dir.to_path_buf()))
    }

    /// [`Mirror::open`] on `disk`; on a simulated disk every change is committed in the caller (the
    /// simulation runs on one thread), else by the group-commit writer's thread.
    pub fn open_on(disk: &lattice_adapters::disk::Disk) -> anyhow::Result<Mirror> {
        let dir = disk.describe();
        let store = AllocStore::open_on(disk)?;
        let c = store.load()?;
        let mut m = Mirror::default();
        for (n, bytes) in c.records {
            let e: Entry = serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{dir}/allocations.redb: record {n}: {e}"))?;
            m.entries.insert(n, e);
        }
        for (k, v) in c.named {
            if k == MAX_ID {
                m.max_id =
                    serde_json::from_slice(&v).map_err(|e| anyhow::anyhow!("{dir}/allocations.redb: {MAX_ID}: {e}"))?;
            } else if k == FENCE {
                m.fence =
                    serde_json::from_slice(&v).map_err(|e| anyhow::anyhow!("{dir}/allocations.redb: {FENCE}: {e}"))?;
            } else if let Some(dag) = k.strip_prefix(DAG_PREFIX) {
                let members =
                    serde_json::from_slice(&v).map_err(|e| anyhow::anyhow!("{dir}/allocations.redb: {k}: {e}"))?;
                m.dags.insert(dag.to_string(), members);
            }
        }
        m.max_id = m.max_id.max(m.entries.keys().next_back().copied().unwrap_or(0));
        m.ended = m.entries.values().filter(|e| e.ended.is_some()).count();
        m.writer = Some(match disk {
            lattice_adapters::disk::Disk::Dir(_) => Writer::start(store),
            lattice_adapters::disk::Disk::Sim(_) => Writer::inline(store),
        });
        Ok(m)
    }

    /// Applies `op` to this copy; the answer resolves once it is on disk (at once without a store).
    pub fn apply(&mut self, op: MirrorOp) -> Durable {
        let changes = self.changes(op, 0);
        self.write(changes)
    }

    fn write(&self, changes: Vec<Change>) -> Durable {
        Durable(match (&self.writer, changes.is_empty()) {
            (Some(w), false) => Written::Pending(w.queue(changes)),
            _ => Written::Done,
        })
    }

    /// Applies `op` made by the leader of `term`, unless this member has seen a newer term
    /// (`current_term`, its Raft vote's) or promised a newer leader ([`Mirror::promise`]): then
    /// nothing changes and the answer is a refusal. A deposed leader can therefore never get an
    /// operation acknowledged by a majority after a new leader has read that majority's copies.
    pub fn apply_fenced(&mut self, op: MirrorOp, term: u64, current_term: u64) -> Durable {
        let floor = self.fence.max(current_term).max(1);
        if term < floor {
            return Durable(Written::Refused(format!(
                "stale leader term {term} (this member has seen term {floor})"
            )));
        }
        // Having taken an operation of `term`, this copy refuses older leaders' from now on (a
        // deposed leader that has not heard of its successor must not, say, forget here what the
        // successor acknowledged).
        let mut changes = self.changes(op, term);
        if term > self.fence {
            self.fence = term;
            changes.push(Change::Named(FENCE.into(), json(&term)));
        }
        self.write(changes)
    }

    /// Promises the new leader of `term` to refuse operations of older terms from now on (durable
    /// before the new leader reads this copy).
    pub fn promise(&mut self, term: u64) -> Durable {
        if term <= self.fence {
            return Durable(Written::Done);
        }
        self.fence = term;
        self.write(vec![Change::Named(FENCE.into(), json(&term))])
    }

    /// Takes another copy's entry `n` where it is news here: this copy lacks it; it is another
    /// allocation under the same number mirrored by a newer term (see [`Entry::term`]); or it is the
    /// same allocation mirrored by a newer term or further along (ended, or more exits reported) —
    /// then the record of the newer term with the furthest progress of either.
    fn take(&mut self, n: u64, e: Entry) -> Option<Change> {
        let merged = match self.entries.get(&n) {
            None => e,
            Some(mine) if !mine.same_allocation(&e) => {
                if e.term <= mine.term {
                    return None;
                }
                e
            }
            Some(mine) => {
                let (mut base, other) = if e.term > mine.term {
                    (e, mine.clone())
                } else {
                    (mine.clone(), e)
                };
                base.kept = base.kept_term().max(other.kept_term());
                if base.ended.is_some() && other.ended.is_some() && other.end_term() > base.end_term() {
                    // Two ends of one allocation (a deposed leader's, and the one a newer term
                    // recorded): the newer term's. The record's own term may be newer than its end's
                    // (an end taken into a record a newer term mirrored again), so the end's term
                    // decides (found by DST: seed 89 of isolate-leader,clock-jump without agents).
                    base.ended = other.ended;
                    base.ended_term = other.ended_term;
                } else if base.ended.is_none() {
                    if other.ended.is_some() {
                        base.ended_term = other.end_term();
                        base.ended = other.ended;
                        base.exits.clear();
                    } else if (other.exits_run, other.exits.len()) > (base.exits_run, base.exits.len()) {
                        base.exits = other.exits;
                        base.exits_run = other.exits_run;
                    }
                }
                if json(&base) == json(mine) {
                    return None;
                }
                base
            }
        };
        let was_ended = self.entries.get(&n).is_some_and(|m| m.ended.is_some());
        self.ended = self.ended + usize::from(merged.ended.is_some()) - usize::from(was_ended);
        let change = Change::Put(n, json(&merged));
        self.entries.insert(n, merged);
        Some(change)
    }

    fn changes(&mut self, op: MirrorOp, term: u64) -> Vec<Change> {
        let mut out = Vec::new();
        match op {
            MirrorOp::Entries { entries, dags } => {
                for mut e in entries {
                    if let Some(n) = id_number(&e.id) {
                        self.max_id = self.max_id.max(n);
                        e.origin = e.origin_term();
                        e.term = e.term.max(term);
                        if e.ended.is_none() {
                            e.kept = e.kept_term().max(term);
                            e.ended_term = 0;
                        } else {
                            e.kept = e.kept_term();
                            if e.ended_term == 0 {
                                // A new end: this term records it.
                                e.ended_term = term;
                            }
                        }
                        out.extend(self.take(n, e));
                    }
                }
                out.push(Change::Named(MAX_ID.into(), json(&self.max_id)));
                // The leader's grouping of its members (the newest leader's is the one it serves).
                for (id, members) in dags {
                    out.push(Change::Named(format!("{DAG_PREFIX}{id}"), json(&members)));
                    self.dags.insert(id, members);
                }
                self.trim(&mut out);
            }
            MirrorOp::Submit {
                items,
                submitted_ms,
                dag,
            } => {
                for (id, req) in items {
                    if let Some(n) = id_number(&id) {
                        self.max_id = self.max_id.max(n);
                        let e = Entry {
                            id,
                            req,
                            submitted_ms,
                            exits: BTreeMap::new(),
                            exits_run: 0,
                            ended: None,
                            term,
                            origin: term,
                            kept: term,
                            ended_term: 0,
                        };
                        out.push(Change::Put(n, json(&e)));
                        self.entries.insert(n, e);
                    }
                }
                out.push(Change::Named(MAX_ID.into(), json(&self.max_id)));
                if let Some((id, members)) = dag {
                    out.push(Change::Named(format!("{DAG_PREFIX}{id}"), json(&members)));
                    self.dags.insert(id, members);
                }
            }
            MirrorOp::Ended { views, forget } => {
                for v in views {
                    if let Some(n) = id_number(&v.id)
                        && let Some(e) = self.entries.get_mut(&n)
                    {
                        self.ended += usize::from(e.ended.is_none());
                        e.exits.clear();
                        e.ended = Some(v);
                        e.ended_term = term;
                        out.push(Change::Put(n, json(e)));
                    }
                }
                for id in forget {
                    if let Some(n) = id_number(&id)
                        && let Some(e) = self.entries.remove(&n)
                    {
                        self.ended -= usize::from(e.ended.is_some());
                        out.push(Change::Delete(n));
                    }
                }
                self.trim(&mut out);
            }
            MirrorOp::Update { id, walltime, tags } => {
                if let Some(n) = id_number(&id)
                    && let Some(e) = self.entries.get_mut(&n)
                {
                    if let Some(w) = walltime {
                        let lc = e.req.lifecycle.get_or_insert_with(Default::default);
                        lc.walltime = Some(w);
                    }
                    for (k, v) in tags {
                        if v.is_empty() {
                            e.req.tags.remove(&k);
                        } else {
                            e.req.tags.insert(k, v);
                        }
                    }
                    out.push(Change::Put(n, json(e)));
                }
            }
            MirrorOp::Exit { id, node, code, run } => {
                if let Some(n) = id_number(&id)
                    && let Some(e) = self.entries.get_mut(&n)
                    && e.ended.is_none()
                {
                    if e.exits_run != run {
                        e.exits.clear();
                        e.exits_run = run;
                    }
                    e.exits.insert(node, code);
                    out.push(Change::Put(n, json(e)));
                }
            }
        }
        out
    }

    /// Keeps the newest [`ENDED_KEPT`] final records (trimmed once the slack is used up).
    fn trim(&mut self, out: &mut Vec<Change>) {
        if self.ended > ENDED_KEPT + ENDED_SLACK {
            let oldest: Vec<u64> = self
                .entries
                .iter()
                .filter(|(_, e)| e.ended.is_some())
                .map(|(n, _)| *n)
                .take(self.ended - ENDED_KEPT)
                .collect();
            for n in oldest {
                self.entries.remove(&n);
                self.ended -= 1;
                out.push(Change::Delete(n));
            }
        }
    }

    /// This copy's records of `views`' allocations with those final records: what a leader
    /// mirrors (as [`MirrorOp::Entries`]) when they end.
    pub fn ended_entries(&self, views: Vec<AllocationView>) -> Vec<Entry> {
        views
            .into_iter()
            .filter_map(|v| {
                let e = self.entries.get(&id_number(&v.id)?)?;
                Some(Entry {
                    exits: BTreeMap::new(),
                    ended: Some(v),
                    // Stamped with the recording leader's term when applied.
                    ended_term: 0,
                    ..e.clone()
                })
            })
            .collect()
    }

    /// The ids of allocations not yet ended here.
    pub fn active(&self) -> impl Iterator<Item = &String> + '_ {
        self.entries.values().filter(|e| e.ended.is_none()).map(|e| &e.id)
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            entries: self.entries.clone(),
            max_id: self.max_id,
            dags: self.dags.clone(),
        }
    }

    /// How well a DAG record fits this copy's entries: `None` when a member's entry is missing or
    /// is another allocation (its key is not the DAG's); else the newest term its members were
    /// queued in.
    fn dag_fit(&self, dag: &str, members: &[(String, String)]) -> Option<u64> {
        let prefix = format!("dag:{dag}:");
        let mut newest = 0;
        for (_, id) in members {
            let e = self.entries.get(&id_number(id)?)?;
            if e.id != *id || e.req.idempotency_key.as_ref().is_some_and(|k| !k.starts_with(&prefix)) {
                return None;
            }
            newest = newest.max(e.origin_term());
        }
        Some(newest)
    }

    /// Merges another member's copy into this one: entries this copy lacks, and final records of
    /// allocations this copy still thinks active; the highest id; DAG groupings. Persisted like any op.
    pub fn merge(&mut self, other: Snapshot) -> Durable {
        let mut out = Vec::new();
        for (n, e) in other.entries {
            out.extend(self.take(n, e));
        }
        if other.max_id > self.max_id {
            self.max_id = other.max_id;
            out.push(Change::Named(MAX_ID.into(), json(&self.max_id)));
        }
        for (id, members) in other.dags {
            // Two copies can hold different records under one DAG id (an attempt no majority held,
            // and its retry under a later leader): the one whose members are still its own here
            // wins, the newer one when both are.
            let take = match self.dags.get(&id) {
                None => true,
                Some(mine) if *mine == members => false,
                Some(mine) => self.dag_fit(&id, &members) > self.dag_fit(&id, mine),
            };
            if take {
                out.push(Change::Named(format!("{DAG_PREFIX}{id}"), json(&members)));
                self.dags.insert(id, members);
            }
        }
        self.write(out)
    }
}

/// A change applied to a member's copy; [`Durable::wait`] resolves once it is on disk (or says why
/// it was refused).
#[must_use = "a mirrored change is acknowledged only once it is durable"]
pub struct Durable(Written);

enum Written {
    Done,
    Pending(Pending),
    Refused(String),
}

impl Durable {
    pub async fn wait(self) -> Result<(), String> {
        match self.0 {
            Written::Pending(p) => p.durable().await,
            Written::Done => Ok(()),
            Written::Refused(why) => Err(why),
        }
    }
}

/// Peer channels, created lazily (TLS with the member's certificate when configured).
#[derive(Default)]
pub struct Peers {
    channels: BTreeMap<u64, (String, tonic::transport::Channel)>,
}

impl Peers {
    fn channel(
        &mut self,
        id: u64,
        addr: &str,
        tls: Option<&lattice_adapters::raft_net::PeerTls>,
        dial: Option<&lattice_adapters::raft_net::Dialer>,
    ) -> Option<tonic::transport::Channel> {
        if let Some((a, c)) = self.channels.get(&id)
            && a == addr
        {
            return Some(c.clone());
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let mut e = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}")).ok()?;
        if let Some(t) = tls {
            e = e.tls_config(t.client_config(host.trim_matches(['[', ']']))).ok()?;
        }
        let c = lattice_adapters::raft_net::dial(e.connect_timeout(Duration::from_secs(1)).tcp_nodelay(true), dial);
        self.channels.insert(id, (addr.to_string(), c.clone()));
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(walltime: &str) -> SubmitRequest {
        serde_json::from_value(serde_json::json!({
            "tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": walltime}
        }))
        .unwrap()
    }

    fn submit(ids: &[&str]) -> MirrorOp {
        MirrorOp::Submit {
            items: ids.iter().map(|i| (i.to_string(), req("1h"))).collect(),
            submitted_ms: 7,
            dag: None,
        }
    }

    fn ended(id: &str) -> AllocationView {
        AllocationView {
            id: id.into(),
            tenant: "physics".into(),
            vcluster: "default".into(),
            user: None,
            project: None,
            state: "completed".into(),
            nodes: vec![],
            requested_nodes: 1,
            walltime_s: Some(3600.0),
            preemption_class: 0,
            submitted_ms: 7,
            started_ms: Some(8),
            ended_ms: Some(9),
            end_reason: Some("success".into()),
            entrypoint: None,
            environment: None,
            tags: BTreeMap::new(),
            last_rejection: None,
            data_readiness: None,
            vni: None,
            telemetry: "prod".into(),
            checkpoints: 0,
            last_checkpoint_ms: None,
            preempted: 0,
            preemption: None,
            task_group: None,
            waiting: None,
            depends_on: vec![],
            constraints: None,
            requeue: "on_node_failure".into(),
            max_requeues: 3,
            mutex: None,
            storage_gbps: None,
        }
    }

    /// A DAG attempt no majority held (members 1 and 2, term 2) and its retry under a later leader
    /// that handed number 2 to another allocation (term 3) and queued the DAG as 5 and 6: merging
    /// the copies either way keeps the retry's record, whose members are still its own.
    #[test]
    fn of_two_records_under_one_dag_id_the_one_whose_members_hold_wins() {
        let keyed = |k: &str| SubmitRequest {
            idempotency_key: Some(k.into()),
            ..req("1h")
        };
        let dag = |ids: &[&str]| -> (String, Vec<(String, String)>) {
            let names = ["prep", "solve"];
            (
                "d".into(),
                ids.iter()
                    .zip(names)
                    .map(|(i, n)| (n.to_string(), i.to_string()))
                    .collect(),
            )
        };
        let mut first = Mirror::default();
        let _ = first.apply_fenced(
            MirrorOp::Submit {
                items: vec![
                    ("a-000001".into(), keyed("dag:d:0")),
                    ("a-000002".into(), keyed("dag:d:1")),
                ],
                submitted_ms: 7,
                dag: Some(dag(&["a-000001", "a-000002"])),
            },
            2,
            2,
        );
        let mut retry = Mirror::default();
        let _ = retry.apply_fenced(
            MirrorOp::Submit {
                items: vec![("a-000002".into(), keyed("other"))],
                submitted_ms: 8,
                dag: None,
            },
            3,
            3,
        );
        let _ = retry.apply_fenced(
            MirrorOp::Submit {
                items: vec![
                    ("a-000005".into(), keyed("dag:d:0")),
                    ("a-000006".into(), keyed("dag:d:1")),
                ],
                submitted_ms: 9,
                dag: Some(dag(&["a-000005", "a-000006"])),
            },
            3,
            3,
        );
        let mut m = Mirror::default();
        let _ = m.merge(first.snapshot());
        let _ = m.merge(retry.snapshot());
        assert_eq!(m.dags["d"], dag(&["a-000005", "a-000006"]).1, "the stale record lost");
        let mut other = Mirror::default();
        let _ = other.merge(retry.snapshot());
        let _ = other.merge(first.snapshot());
        assert_eq!(
            other.dags["d"],
            dag(&["a-000005", "a-000006"]).1,
            "and kept, merged the other way"
        );
        assert_eq!(other.entries[&2].req.idempotency_key.as_deref(), Some("other"));
    }

    #[test]
    fn a_copy_that_missed_changes_catches_up_by_merging() {
        // The leader's copy saw everything; a member that was down saw only the first submission.
        let mut leader = Mirror::default();
        let _ = leader.apply(submit(&["a-000001", "a-000002"]));
        let _ = leader.apply(MirrorOp::Update {
            id: "a-000002".into(),
            walltime: Some("2h".into()),
            tags: [("name".to_string(), "x".to_string())].into(),
        });
        let _ = leader.apply(MirrorOp::Exit {
            id: "a-000002".into(),
            node: "n1".into(),
            code: 0,
            run: 5,
        });
        let _ = leader.apply(MirrorOp::Ended {
            views: vec![ended("a-000001")],
            forget: vec![],
        });
        let _ = leader.apply(MirrorOp::Submit {
            items: vec![("a-000003".into(), req("1h"))],
            submitted_ms: 9,
            dag: Some(("dag-0001".into(), vec![("prep".into(), "a-000003".into())])),
        });
        let mut late = Mirror::default();
        let _ = late.apply(submit(&["a-000001"]));
        let _ = late.merge(leader.snapshot());
        assert_eq!(late.max_id, 3);
        assert_eq!(late.active().cloned().collect::<Vec<_>>(), ["a-000002", "a-000003"]);
        assert_eq!(
            late.entries[&1].ended.as_ref().map(|v| v.state.as_str()),
            Some("completed")
        );
        let two = &late.entries[&2];
        assert_eq!(two.req.lifecycle.as_ref().unwrap().walltime.as_deref(), Some("2h"));
        assert_eq!(two.req.tags["name"], "x");
        assert_eq!(two.exits["n1"], 0);
        assert_eq!(late.dags["dag-0001"], [("prep".to_string(), "a-000003".to_string())]);
        // A final record is never overwritten by an older, active copy.
        let mut stale = Mirror::default();
        let _ = stale.apply(submit(&["a-000001"]));
        let _ = late.merge(stale.snapshot());
        assert!(late.entries[&1].ended.is_some());
    }

    #[test]
    fn a_deposed_leaders_operations_are_refused_once_a_newer_term_was_seen_or_promised() {
        let block = |d: Durable| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(d.wait())
        };
        let mut m = Mirror::default();
        assert!(block(m.apply_fenced(submit(&["a-000001"]), 2, 2)).is_ok());
        // Taking term 2's operation raised the fence: term 1's is refused, and nothing changed.
        let e = block(m.apply_fenced(submit(&["a-000002"]), 1, 1)).unwrap_err();
        assert!(e.contains("stale leader term 1") && e.contains("term 2"), "{e}");
        assert!(!m.entries.contains_key(&2));
        // A member that has voted in term 3 refuses term 2 too.
        assert!(block(m.apply_fenced(submit(&["a-000002"]), 2, 3)).is_err());
        // Promising term 5 to a new leader that reads this copy: term 4 is refused from then on.
        assert!(block(m.promise(5)).is_ok());
        assert_eq!(m.fence, 5);
        assert!(block(m.apply_fenced(submit(&["a-000003"]), 4, 4)).is_err());
        assert!(block(m.apply_fenced(submit(&["a-000003"]), 5, 5)).is_ok());
        // Term 0 (a member that does not lead) is never accepted.
        assert!(block(Mirror::default().apply_fenced(submit(&["a-000009"]), 0, 0)).is_err());
    }

    #[test]
    fn a_merge_takes_the_newer_terms_allocation_under_a_reused_number_but_keeps_an_end() {
        // A deposed leader (term 1) queued a-000004 for one request; the real leader (term 2)
        // handed out the same number to another.
        let mut stale = Mirror::default();
        let _ = stale.apply_fenced(submit(&["a-000004"]), 1, 1);
        let mut real = Mirror::default();
        let _ = real.apply_fenced(
            MirrorOp::Submit {
                items: vec![("a-000004".into(), req("2h"))],
                submitted_ms: 8,
                dag: None,
            },
            2,
            2,
        );
        let mut merged = Mirror::default();
        let _ = merged.merge(stale.snapshot());
        let _ = merged.merge(real.snapshot());
        assert_eq!(merged.entries[&4].term, 2);
        assert_eq!(
            merged.entries[&4].req.lifecycle.as_ref().unwrap().walltime.as_deref(),
            Some("2h")
        );
        // The other order gives the same.
        let mut other = Mirror::default();
        let _ = other.merge(real.snapshot());
        let _ = other.merge(stale.snapshot());
        assert_eq!(other.entries[&4].term, 2);
        // The same allocation mirrored again in a later term keeps the end another copy holds.
        let mut ended = Mirror::default();
        let _ = ended.apply_fenced(submit(&["a-000005"]), 1, 1);
        let _ = ended.apply(MirrorOp::Ended {
            views: vec![super::tests::ended("a-000005")],
            forget: vec![],
        });
        let mut again = Mirror::default();
        let _ = again.apply_fenced(
            MirrorOp::Entries {
                entries: vec![Entry {
                    ended: None,
                    term: 3,
                    ..ended.entries[&5].clone()
                }],
                dags: Vec::new(),
            },
            3,
            3,
        );
        let _ = again.merge(ended.snapshot());
        assert!(again.entries[&5].ended.is_some());
    }

    #[test]
    fn a_record_mirrored_again_by_a_newer_leader_beats_another_leaders_allocation_under_its_number() {
        // Term 5 (a leader cut off from the others) queued a-000027 for request A, never
        // acknowledged; term 7 (unaware of it) queued another allocation, B, under the same number,
        // also never acknowledged; term 8 adopted A (from term 5's copy) and mirrored it again for
        // its client's retry — acknowledged. A copy still holding B must give way to A, and a later
        // merge of B's copy must not bring B back (B's term is newer than A's first one).
        let op = |walltime: &str, ms: u64| MirrorOp::Submit {
            items: vec![("a-000027".into(), req(walltime))],
            submitted_ms: ms,
            dag: None,
        };
        let mut a_copy = Mirror::default();
        let _ = a_copy.apply_fenced(op("1h", 100), 5, 5);
        let mut b_copy = Mirror::default();
        let _ = b_copy.apply_fenced(op("2h", 200), 7, 7);
        let b_snapshot = b_copy.snapshot();
        let retry = MirrorOp::Entries {
            dags: Vec::new(),
            entries: vec![a_copy.entries[&27].clone()],
        };
        let _ = a_copy.apply_fenced(retry.clone(), 8, 8);
        let _ = b_copy.apply_fenced(retry, 8, 8);
        for m in [&a_copy, &b_copy] {
            assert_eq!(m.entries[&27].submitted_ms, 100, "A is the record");
            assert_eq!((m.entries[&27].term, m.entries[&27].origin), (8, 5));
        }
        let _ = a_copy.merge(b_snapshot);
        assert_eq!(a_copy.entries[&27].submitted_ms, 100, "B does not come back");
        // A's end, mirrored whole by the leader, replaces what a copy holds under the number
        // instead of being written onto B's request.
        let mut stale = Mirror::default();
        let _ = stale.apply_fenced(op("2h", 200), 7, 7);
        let mut end = ended("a-000027");
        end.submitted_ms = 100;
        let entries = a_copy.ended_entries(vec![end]);
        let _ = stale.apply_fenced(
            MirrorOp::Entries {
                entries,
                dags: Vec::new(),
            },
            9,
            9,
        );
        let e = &stale.entries[&27];
        assert_eq!((e.submitted_ms, e.origin, e.term), (100, 5, 9));
        assert_eq!(e.ended.as_ref().unwrap().state, "completed");
        assert_eq!(e.req.lifecycle.as_ref().unwrap().walltime.as_deref(), Some("1h"));
    }

    #[test]
    fn exits_belong_to_one_run_a_requeued_allocations_next_run_starts_with_none() {
        let mut m = Mirror::default();
        let _ = m.apply(submit(&["a-000003"]));
        let exit = |node: &str, run: u64| MirrorOp::Exit {
            id: "a-000003".into(),
            node: node.into(),
            code: 0,
            run,
        };
        let _ = m.apply(exit("n1", 100));
        let _ = m.apply(exit("n2", 100));
        assert_eq!(m.entries[&3].exits.len(), 2);
        // Requeued and started again at 200: n1's exit of the first run does not count.
        let _ = m.apply(exit("n3", 200));
        let e = &m.entries[&3];
        assert_eq!(
            (e.exits_run, e.exits.keys().collect::<Vec<_>>()),
            (200, vec![&"n3".to_string()])
        );
        // A merge keeps the newer run's exits over more of an older run's.
        let mut old = Mirror::default();
        let _ = old.apply(submit(&["a-000003"]));
        let _ = old.apply(exit("n1", 100));
        let _ = old.apply(exit("n2", 100));
        let mut snap = m.snapshot();
        snap.entries.get_mut(&3).unwrap().submitted_ms = old.entries[&3].submitted_ms;
        let _ = old.merge(snap);
        assert_eq!(old.entries[&3].exits_run, 200);
    }

    #[test]
    fn the_newest_final_records_are_kept() {
        let mut m = Mirror::default();
        let n = ENDED_KEPT + ENDED_SLACK + 1;
        let ids: Vec<String> = (1..=n as u64).map(|i| format!("a-{i:06}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let _ = m.apply(submit(&refs));
        let _ = m.apply(submit(&["a-999999"]));
        let _ = m.apply(MirrorOp::Ended {
            views: ids.iter().map(|i| ended(i)).collect(),
            forget: vec![],
        });
        let kept: Vec<u64> = m.entries.keys().copied().collect();
        assert_eq!(kept.len(), ENDED_KEPT + 1, "the newest ended ones and the active one");
        assert_eq!(kept[0], (n - ENDED_KEPT + 1) as u64);
        assert!(m.entries.contains_key(&999_999));
        // Ids still continue above the highest ever handed out.
        assert_eq!(m.max_id, 999_999);
    }

    fn cancelled(id: &str) -> AllocationView {
        AllocationView {
            state: "cancelled".into(),
            end_reason: Some("cancelled".into()),
            ..ended(id)
        }
    }

    /// Seed 89 of `isolate-leader,clock-jump` without agents: a leader cut off in term 1 saw its
    /// allocation complete (on its own copy only); term 3 mirrored the allocation again as live — to
    /// that copy too, which keeps the end it knows — then cancelled it on a majority. Merging the
    /// majority's copy into the old leader's gives the term-3 cancel, not the term-1 completion,
    /// whichever way round.
    #[test]
    fn of_two_ends_the_newer_terms_wins_even_taken_into_a_newer_record() {
        let mut old = Mirror::default();
        let _ = old.apply_fenced(submit(&["a-000002"]), 1, 1);
        let done = old.ended_entries(vec![ended("a-000002")]);
        let _ = old.apply_fenced(
            MirrorOp::Entries {
                entries: done,
                dags: vec![],
            },
            1,
            1,
        );
        assert_eq!(old.entries[&2].ended_term, 1);
        // Term 3 mirrors it again as live: the old copy keeps the end it holds (an end is never
        // lost), stamped as term 1's.
        let live = Entry {
            ended: None,
            ended_term: 0,
            ..old.entries[&2].clone()
        };
        let mut majority = Mirror::default();
        let again = MirrorOp::Entries {
            entries: vec![live],
            dags: vec![],
        };
        let _ = majority.apply_fenced(again.clone(), 3, 3);
        let _ = old.apply_fenced(again, 3, 3);
        assert_eq!(old.entries[&2].ended.as_ref().unwrap().state, "completed");
        assert_eq!((old.entries[&2].term, old.entries[&2].ended_term), (3, 1));
        // Term 3 cancels it on the majority.
        let cancel = majority.ended_entries(vec![cancelled("a-000002")]);
        let _ = majority.apply_fenced(
            MirrorOp::Entries {
                entries: cancel,
                dags: vec![],
            },
            3,
            3,
        );
        assert_eq!(majority.entries[&2].ended_term, 3);
        let mut a = Mirror::default();
        let _ = a.merge(old.snapshot());
        let _ = a.merge(majority.snapshot());
        assert_eq!(a.entries[&2].ended.as_ref().unwrap().state, "cancelled");
        let mut b = Mirror::default();
        let _ = b.merge(majority.snapshot());
        let _ = b.merge(old.snapshot());
        assert_eq!(b.entries[&2].ended.as_ref().unwrap().state, "cancelled");
    }

    /// Seed 59 of `isolate-leader` without agents: recording an attempt's end (here, a leader
    /// cancelling it as never acknowledged) does not make it the one a term kept; mirroring it
    /// again as live does.
    #[test]
    fn only_mirroring_a_live_record_keeps_it() {
        let mut m = Mirror::default();
        let _ = m.apply_fenced(submit(&["a-000018"]), 1, 1);
        assert_eq!(m.entries[&18].kept_term(), 1);
        let end = m.ended_entries(vec![cancelled("a-000018")]);
        let _ = m.apply_fenced(
            MirrorOp::Entries {
                entries: end,
                dags: vec![],
            },
            3,
            3,
        );
        assert_eq!((m.entries[&18].term, m.entries[&18].kept_term()), (3, 1));
        let mut n = Mirror::default();
        let _ = n.apply_fenced(submit(&["a-000023"]), 2, 2);
        let live = n.entries[&23].clone();
        let _ = n.apply_fenced(
            MirrorOp::Entries {
                entries: vec![live],
                dags: vec![],
            },
            4,
            4,
        );
        assert_eq!(n.entries[&23].kept_term(), 4);
    }

    /// Seed 190 of `isolate-leader` without agents: a DAG attempt (term 2, members 5-8) that an
    /// older leader's allocations under numbers 5 and 6 beat in the merge. The attempt was never
    /// acknowledged whole, so its own members still queued (7, 8) are stranded — though they are the
    /// newest entries the record names — and nothing of the other allocations is.
    #[test]
    fn a_dag_record_naming_other_submissions_strands_its_own_members() {
        let keyed = |k: &str| SubmitRequest {
            idempotency_key: Some(k.into()),
            ..req("1h")
        };
        let mut m = Mirror::default();
        let _ = m.apply_fenced(
            MirrorOp::Submit {
                items: vec![
                    ("a-000005".into(), keyed("c2-k35")),
                    ("a-000006".into(), keyed("c1-k29")),
                ],
                submitted_ms: 5,
                dag: None,
            },
            1,
            1,
        );
        let mut other = Mirror::default();
        let names = ["prep", "train", "eval", "report"];
        let ids = ["a-000005", "a-000006", "a-000007", "a-000008"];
        let _ = other.apply_fenced(
            MirrorOp::Submit {
                items: ids
                    .iter()
                    .enumerate()
                    .map(|(i, id)| (id.to_string(), keyed(&format!("dag:d9:{i}"))))
                    .collect(),
                submitted_ms: 9,
                dag: Some((
                    "d9".into(),
                    names
                        .iter()
                        .zip(ids)
                        .map(|(n, i)| (n.to_string(), i.to_string()))
                        .collect(),
                )),
            },
            2,
            2,
        );
        // The older leader's 5 and 6 were mirrored again (kept) in term 3.
        let again: Vec<Entry> = m.entries.values().cloned().collect();
        let _ = m.apply_fenced(
            MirrorOp::Entries {
                entries: again,
                dags: vec![],
            },
            3,
            3,
        );
        let _ = m.merge(other.snapshot());
        assert_eq!(m.entries[&5].req.idempotency_key.as_deref(), Some("c2-k35"));
        let stranded: Vec<String> = m.snapshot().stranded_dag_members().into_iter().collect();
        assert_eq!(stranded, vec!["a-000007".to_string(), "a-000008".to_string()]);
        // The whole attempt alone strands nothing.
        assert!(other.snapshot().stranded_dag_members().is_empty());
    }
}
