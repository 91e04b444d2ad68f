//! Task launches within running allocations (book: "MPI Process Management"; `lattice launch`,
//! `POST /v1/allocations/{id}/tasks`): the rank layout over the allocation's nodes, each node's part
//! handed to its agent once (with every other node's agent address and the launch's secret), and
//! the nodes' ends collected into the launch's outcome. Like a Slurm job step, a launch is the
//! leader's working state, not replicated: a leadership change or a restart of an agent that runs
//! part of it ends it as failed, with the reason.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What a client asks for (`lattice launch`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    /// The command each rank runs (`/bin/sh -c`).
    pub entrypoint: String,
    /// How many ranks in all (default: tasks_per_node on every node, or one per node).
    #[serde(default)]
    pub ntasks: Option<u32>,
    /// Ranks per node (default: as few as hold `ntasks`).
    #[serde(default)]
    pub tasks_per_node: Option<u32>,
    /// Extra environment for every rank.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The process-management interface: `pmi2` (default; PMI-1 clients are served too) or `pmix`.
    #[serde(default)]
    pub pmi: Option<String>,
    /// How long a fence may take (default: the agents' own, 60 s).
    #[serde(default)]
    pub fence_timeout: Option<String>,
}

/// What a user's terminal asks for (`lattice attach`): the query of
/// `GET /v1/allocations/{id}/attach` and the gRPC `AttachStart`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalRequest {
    /// The node (default: the allocation's first).
    #[serde(default)]
    pub node: Option<String>,
    /// What to run instead of a login shell (`sh -c`).
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub rows: Option<u16>,
    #[serde(default)]
    pub cols: Option<u16>,
    #[serde(default)]
    pub term: Option<String>,
}

/// The most ranks one launch may have, and on one node.
pub const MAX_RANKS: u32 = 1 << 20;
pub const MAX_PER_NODE: u32 = 4096;

/// Ranks per node, in the allocation's node order (blocks: node 0 gets ranks `0..k`, ...). Nodes
/// after the last rank get none.
pub fn layout(nodes: usize, ntasks: Option<u32>, tasks_per_node: Option<u32>) -> Result<Vec<u32>, (String, String)> {
    let bad = |f: &str, m: String| Err((f.to_string(), m));
    if nodes == 0 {
        return bad("id", "the allocation holds no nodes".into());
    }
    if tasks_per_node == Some(0) || tasks_per_node.is_some_and(|k| k > MAX_PER_NODE) {
        return bad("tasks_per_node", format!("between 1 and {MAX_PER_NODE}"));
    }
    if ntasks == Some(0) || ntasks.is_some_and(|n| n > MAX_RANKS) {
        return bad("ntasks", format!("between 1 and {MAX_RANKS}"));
    }
    let n = nodes as u64;
    let (total, per) = match (ntasks, tasks_per_node) {
        (None, None) => (n, 1),
        (None, Some(k)) => (n * k as u64, k as u64),
        (Some(t), None) => (t as u64, (t as u64).div_ceil(n)),
        (Some(t), Some(k)) => {
            if t as u64 > n * k as u64 {
                return bad("ntasks", format!("{t} ranks do not fit {nodes} nodes at {k} per node"));
            }
            (t as u64, k as u64)
        }
    };
    if per > MAX_PER_NODE as u64 {
        return bad(
            "ntasks",
            format!("more than {MAX_PER_NODE} ranks per node on {nodes} nodes"),
        );
    }
    let mut left = total;
    Ok((0..nodes)
        .map(|_| {
            let here = left.min(per);
            left -= here;
            here as u32
        })
        .collect())
}

/// One node's end of a launch as its agent reports it, and one node's part of a launch for its
/// agent (wire types, declared once with the agent: `lattice-agent-protocol`).
pub use lattice_agent_protocol::{RankEnd as RankEndIn, TaskEnd as TaskEndIn, TaskLaunch as TaskWork, TaskPeer};

/// A launch as the leader keeps it.
#[derive(Clone, Debug)]
struct Launch {
    id: String,
    alloc: String,
    entrypoint: String,
    env: Vec<(String, String)>,
    world_size: u32,
    peers: Vec<TaskPeer>,
    token: String,
    fence_timeout_s: Option<f64>,
    handed: BTreeSet<String>,
    ends: BTreeMap<String, TaskEndIn>,
    /// The control plane's own reason it ended (its allocation ended, an agent restarted).
    failed: Option<String>,
    created_ms: u64,
    ended_ms: Option<u64>,
}

impl Launch {
    fn done(&self) -> bool {
        self.failed.is_some() || self.ends.len() == self.peers.len()
    }
}

/// A launch as clients see it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct LaunchView {
    pub launch_id: String,
    pub allocation: String,
    /// `pending` (no agent has it yet), `running`, `completed` (every rank exited 0) or `failed`.
    pub state: String,
    pub entrypoint: String,
    pub ntasks: u32,
    pub nodes: Vec<LaunchNodeView>,
    /// Every rank that ended: its exit code (128 + signal when a signal ended it).
    pub exit_codes: Vec<(u32, i32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Each rank's newest stdout and stderr (64 KiB of each at most), kept apart.
    pub output: Vec<RankEndIn>,
    pub created_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct LaunchNodeView {
    pub node: String,
    pub first_rank: u32,
    pub num_ranks: u32,
    /// `pending`, `running` or `ended`.
    pub state: String,
}

/// Launches kept per allocation once ended (the oldest go first).
pub const KEEP_ENDED: usize = 64;

/// The leader's task launches.
#[derive(Clone, Debug, Default)]
pub struct Launches {
    by_alloc: BTreeMap<String, Vec<Launch>>,
    seq: BTreeMap<String, u32>,
}

/// What a new launch needs besides the request.
pub struct NewLaunch<'a> {
    pub alloc: &'a str,
    /// The allocation's nodes, in order, with their agents' service addresses.
    pub nodes: Vec<(String, Option<String>)>,
    pub token: String,
    pub now_ms: u64,
}

impl Launches {
    /// Lays out and records a launch; its view.
    pub fn create(&mut self, req: &TaskRequest, at: NewLaunch<'_>) -> Result<LaunchView, (String, String)> {
        if req.entrypoint.trim().is_empty() {
            return Err(("entrypoint".into(), "a command to run".into()));
        }
        match req.pmi.as_deref() {
            None | Some("pmi2") | Some("pmi1") | Some("none") => {}
            Some("pmix") => {
                return Err((
                    "pmi".into(),
                    "pmix: no node offers the PMIx sidecar (the agents' `pmix` feature); use pmi2".into(),
                ));
            }
            Some(other) => return Err(("pmi".into(), format!("{other}: expected pmi2 or pmix"))),
        }
        for k in req.env.keys() {
            if k.is_empty() || k.contains(['=', '\0']) {
                return Err(("env".into(), format!("{k:?}: not a variable name")));
            }
        }
        let fence_timeout_s = match &req.fence_timeout {
            None => None,
            Some(t) => Some(
                lattice_traces::parse_walltime(t)
                    .map_err(|m| ("fence_timeout".to_string(), m))?
                    .as_secs_f64(),
            ),
        };
        let per = layout(at.nodes.len(), req.ntasks, req.tasks_per_node)?;
        let mut peers = Vec::new();
        let mut first = 0;
        for ((node, address), n) in at.nodes.iter().zip(&per) {
            if *n == 0 {
                continue;
            }
            peers.push(TaskPeer {
                node: node.clone(),
                address: address.clone(),
                first_rank: first,
                num_ranks: *n,
            });
            first += n;
        }
        if peers.len() > 1
            && let Some(p) = peers.iter().find(|p| p.address.is_none())
        {
            return Err((
                "ntasks".into(),
                format!(
                    "node {}'s agent has no service address (its --peer-listen), so ranks cannot span nodes",
                    p.node
                ),
            ));
        }
        let seq = self.seq.entry(at.alloc.to_string()).or_insert(0);
        *seq += 1;
        let launch = Launch {
            id: format!("{}.{}", at.alloc, seq),
            alloc: at.alloc.to_string(),
            entrypoint: req.entrypoint.clone(),
            env: req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            world_size: first,
            peers,
            token: at.token,
            fence_timeout_s,
            handed: BTreeSet::new(),
            ends: BTreeMap::new(),
            failed: None,
            created_ms: at.now_ms,
            ended_ms: None,
        };
        let view = view(&launch);
        let list = self.by_alloc.entry(at.alloc.to_string()).or_default();
        list.push(launch);
        // Forget the oldest ended ones past the limit.
        while list.iter().filter(|l| l.done()).count() > KEEP_ENDED {
            if let Some(i) = list.iter().position(Launch::done) {
                list.remove(i);
            }
        }
        Ok(view)
    }

    /// What `node` should start now: each launch's part there, once, for allocations running on it
    /// (`here`; also where the node's own part of the entrypoint already ended, as with a batch
    /// script that runs on every node).
    pub fn hand_out(&mut self, node: &str, here: impl Fn(&str) -> bool) -> Vec<TaskWork> {
        let mut out = Vec::new();
        for (alloc, list) in self.by_alloc.iter_mut() {
            if !here(alloc) {
                continue;
            }
            for l in list.iter_mut().filter(|l| !l.done()) {
                let Some(i) = l.peers.iter().position(|p| p.node == node) else {
                    continue;
                };
                if !l.handed.insert(node.to_string()) {
                    continue;
                }
                out.push(TaskWork {
                    launch_id: l.id.clone(),
                    alloc: l.alloc.clone(),
                    entrypoint: l.entrypoint.clone(),
                    env: l.env.clone(),
                    world_size: l.world_size,
                    node_index: i as u32,
                    peers: l.peers.clone(),
                    token: l.token.clone(),
                    fence_timeout_s: l.fence_timeout_s,
                });
            }
        }
        out
    }

    /// Whether launch `id` is known and has not ended.
    pub fn is_live(&self, id: &str) -> bool {
        let alloc = id.rsplit_once('.').map_or(id, |(a, _)| a);
        self.by_alloc
            .get(alloc)
            .is_some_and(|l| l.iter().any(|l| l.id == id && !l.done()))
    }

    /// `node`'s agent reports its end of a launch (unknown launches and nodes are ignored).
    pub fn ended(&mut self, node: &str, end: TaskEndIn, now_ms: u64) {
        let Some(l) = self
            .by_alloc
            .get_mut(&end.alloc)
            .and_then(|list| list.iter_mut().find(|l| l.id == end.launch_id))
        else {
            return;
        };
        if l.done() || !l.peers.iter().any(|p| p.node == node) {
            return;
        }
        l.ends.insert(node.to_string(), end);
        if l.done() {
            l.ended_ms = Some(now_ms);
        }
    }

    /// `node`'s agent runs these launches (`running`, after its ends were taken): one handed to it
    /// that it neither runs nor reported ended is lost (the agent restarted, or never got it).
    pub fn reconcile(&mut self, node: &str, running: &[String], now_ms: u64) {
        for l in self.by_alloc.values_mut().flatten() {
            if !l.done() && l.handed.contains(node) && !l.ends.contains_key(node) && !running.contains(&l.id) {
                l.failed = Some(format!(
                    "the agent of node {node} no longer runs its part of the launch (it restarted)"
                ));
                l.ended_ms = Some(now_ms);
            }
        }
    }

    /// Launches of allocations that no longer run end as failed.
    pub fn sweep(&mut self, still_running: impl Fn(&str) -> bool, now_ms: u64) {
        for (alloc, list) in self.by_alloc.iter_mut() {
            if still_running(alloc) {
                continue;
            }
            for l in list.iter_mut().filter(|l| !l.done()) {
                l.failed = Some(format!("allocation {alloc} ended during the launch"));
                l.ended_ms = Some(now_ms);
            }
        }
    }

    /// The launches of `alloc`, oldest first.
    pub fn list(&self, alloc: &str) -> Vec<LaunchView> {
        self.by_alloc
            .get(alloc)
            .map_or_else(Vec::new, |l| l.iter().map(view).collect())
    }

    pub fn get(&self, alloc: &str, launch: &str) -> Option<LaunchView> {
        self.by_alloc.get(alloc)?.iter().find(|l| l.id == launch).map(view)
    }
}

fn view(l: &Launch) -> LaunchView {
    let mut exit_codes: Vec<(u32, i32)> = l
        .ends
        .values()
        .flat_map(|e| e.ranks.iter().map(|r| (r.rank, r.code)))
        .collect();
    exit_codes.sort_unstable();
    let mut output: Vec<RankEndIn> = l.ends.values().flat_map(|e| e.ranks.iter().cloned()).collect();
    output.sort_by_key(|r| r.rank);
    // The first reason in rank order of the nodes (the head's first), else the control plane's.
    let reason = l
        .peers
        .iter()
        .find_map(|p| l.ends.get(&p.node).and_then(|e| e.reason.clone()))
        .or_else(|| l.failed.clone())
        .or_else(|| {
            exit_codes
                .iter()
                .find(|(_, c)| *c != 0)
                .map(|(r, c)| format!("rank {r} exited with code {c}"))
        });
    let state = if l.done() {
        if reason.is_none() { "completed" } else { "failed" }
    } else if l.handed.is_empty() {
        "pending"
    } else {
        "running"
    };
    LaunchView {
        launch_id: l.id.clone(),
        allocation: l.alloc.clone(),
        state: state.into(),
        entrypoint: l.entrypoint.clone(),
        ntasks: l.world_size,
        nodes: l
            .peers
            .iter()
            .map(|p| LaunchNodeView {
                node: p.node.clone(),
                first_rank: p.first_rank,
                num_ranks: p.num_ranks,
                state: if l.ends.contains_key(&p.node) {
                    "ended"
                } else if l.handed.contains(&p.node) {
                    "running"
                } else {
                    "pending"
                }
                .into(),
            })
            .collect(),
        exit_codes,
        reason,
        output,
        created_ms: l.created_ms,
        ended_ms: l.ended_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_laid_out_in_blocks() {
        assert_eq!(layout(2, None, None).unwrap(), vec![1, 1]);
        assert_eq!(layout(2, Some(4), None).unwrap(), vec![2, 2]);
        assert_eq!(layout(3, Some(4), None).unwrap(), vec![2, 2, 0]);
        assert_eq!(layout(4, Some(5), Some(4)).unwrap(), vec![4, 1, 0, 0]);
        assert_eq!(layout(2, None, Some(3)).unwrap(), vec![3, 3]);
        assert_eq!(layout(2, Some(7), Some(3)).unwrap_err().0, "ntasks");
        assert_eq!(layout(2, Some(0), None).unwrap_err().0, "ntasks");
        assert_eq!(layout(2, None, Some(0)).unwrap_err().0, "tasks_per_node");
        assert_eq!(layout(1, Some(MAX_PER_NODE + 1), None).unwrap_err().0, "ntasks");
    }

    fn at<'a>(nodes: &[&str]) -> NewLaunch<'a> {
        NewLaunch {
            alloc: "a-000001",
            nodes: nodes
                .iter()
                .map(|n| (n.to_string(), Some(format!("{n}:7010"))))
                .collect(),
            token: "t".into(),
            now_ms: 5,
        }
    }

    fn end(node_ranks: &[(u32, i32)], reason: Option<&str>) -> TaskEndIn {
        TaskEndIn {
            launch_id: "a-000001.1".into(),
            alloc: "a-000001".into(),
            ranks: node_ranks
                .iter()
                .map(|(rank, code)| RankEndIn {
                    rank: *rank,
                    code: *code,
                    stdout: format!("out {rank}"),
                    stderr: String::new(),
                })
                .collect(),
            reason: reason.map(String::from),
        }
    }

    #[test]
    fn a_launch_is_handed_once_per_node_and_ends_when_every_node_reported() {
        let mut ls = Launches::default();
        let req = TaskRequest {
            entrypoint: "./mpi".into(),
            ntasks: Some(4),
            ..TaskRequest::default()
        };
        let v = ls.create(&req, at(&["n0", "n1"])).unwrap();
        assert_eq!(
            (v.launch_id.as_str(), v.state.as_str(), v.ntasks),
            ("a-000001.1", "pending", 4)
        );
        // Not to a node whose agent does not run the allocation yet.
        assert!(ls.hand_out("n0", |_| false).is_empty());
        let w = ls.hand_out("n0", |a| a == "a-000001");
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].node_index, w[0].world_size, w[0].peers[1].first_rank), (0, 4, 2));
        assert!(ls.hand_out("n0", |a| a == "a-000001").is_empty(), "once");
        assert_eq!(ls.hand_out("n1", |a| a == "a-000001")[0].node_index, 1);
        assert_eq!(ls.get("a-000001", "a-000001.1").unwrap().state, "running");
        assert!(ls.is_live("a-000001.1") && !ls.is_live("a-000001.7") && !ls.is_live("x"));
        ls.ended("n1", end(&[(2, 0), (3, 0)], None), 9);
        // A node outside the launch cannot end it.
        ls.ended("n7", end(&[(0, 0), (1, 0)], None), 9);
        assert_eq!(ls.get("a-000001", "a-000001.1").unwrap().state, "running");
        ls.ended("n0", end(&[(0, 0), (1, 0)], None), 10);
        let v = ls.get("a-000001", "a-000001.1").unwrap();
        assert_eq!(v.state, "completed");
        assert_eq!(v.exit_codes, vec![(0, 0), (1, 0), (2, 0), (3, 0)]);
        assert_eq!(v.output[3].stdout, "out 3");
        assert_eq!(v.ended_ms, Some(10));
        assert!(!ls.is_live("a-000001.1"), "its agents are told to stop what is left");
    }

    #[test]
    fn failures_carry_their_reason() {
        let mut ls = Launches::default();
        let req = TaskRequest {
            entrypoint: "./mpi".into(),
            ..TaskRequest::default()
        };
        ls.create(&req, at(&["n0", "n1"])).unwrap();
        ls.hand_out("n0", |a| a == "a-000001");
        ls.hand_out("n1", |a| a == "a-000001");
        ls.ended("n1", end(&[(1, 143)], Some("PMI fence timeout")), 3);
        ls.ended("n0", end(&[(0, 1)], None), 4);
        let v = ls.get("a-000001", "a-000001.1").unwrap();
        assert_eq!(
            (v.state.as_str(), v.reason.as_deref()),
            ("failed", Some("PMI fence timeout"))
        );
        // A non-zero rank without a reason is a failure too.
        let id = ls.create(&req, at(&["n0"])).unwrap().launch_id;
        assert_eq!(id, "a-000001.2");
        ls.hand_out("n0", |a| a == "a-000001");
        let mut e = end(&[(0, 3)], None);
        e.launch_id = id.clone();
        ls.ended("n0", e, 5);
        assert_eq!(
            ls.get("a-000001", &id).unwrap().reason.as_deref(),
            Some("rank 0 exited with code 3")
        );
        // The allocation ends under a running launch; an agent restarts under another.
        let a = ls.create(&req, at(&["n0", "n1"])).unwrap().launch_id;
        ls.hand_out("n0", |a| a == "a-000001");
        ls.reconcile("n0", std::slice::from_ref(&a), 6);
        ls.reconcile("n1", &[], 6);
        assert_eq!(
            ls.get("a-000001", &a).unwrap().state,
            "running",
            "n0 runs it; n1 never had it"
        );
        ls.reconcile("n0", &[], 6);
        assert!(ls.get("a-000001", &a).unwrap().reason.unwrap().contains("restarted"));
        let b = ls.create(&req, at(&["n0", "n1"])).unwrap().launch_id;
        ls.sweep(|_| true, 7);
        assert_eq!(ls.get("a-000001", &b).unwrap().state, "pending");
        ls.sweep(|_| false, 7);
        assert_eq!(ls.get("a-000001", &b).unwrap().state, "failed");
    }

    #[test]
    fn refusals_name_the_field() {
        let mut ls = Launches::default();
        let ok = TaskRequest {
            entrypoint: "x".into(),
            ..TaskRequest::default()
        };
        let refuse = |ls: &mut Launches, r: TaskRequest, nodes: NewLaunch<'_>| ls.create(&r, nodes).unwrap_err().0;
        assert_eq!(
            refuse(
                &mut ls,
                TaskRequest {
                    entrypoint: " ".into(),
                    ..ok.clone()
                },
                at(&["n0"])
            ),
            "entrypoint"
        );
        assert_eq!(
            refuse(
                &mut ls,
                TaskRequest {
                    pmi: Some("pmix".into()),
                    ..ok.clone()
                },
                at(&["n0"])
            ),
            "pmi"
        );
        assert_eq!(
            refuse(
                &mut ls,
                TaskRequest {
                    pmi: Some("slurm".into()),
                    ..ok.clone()
                },
                at(&["n0"])
            ),
            "pmi"
        );
        let env = BTreeMap::from([("A=B".to_string(), "1".to_string())]);
        assert_eq!(refuse(&mut ls, TaskRequest { env, ..ok.clone() }, at(&["n0"])), "env");
        assert_eq!(
            refuse(
                &mut ls,
                TaskRequest {
                    fence_timeout: Some("soon".into()),
                    ..ok.clone()
                },
                at(&["n0"])
            ),
            "fence_timeout"
        );
        let mut no_addr = at(&["n0", "n1"]);
        no_addr.nodes[1].1 = None;
        assert_eq!(refuse(&mut ls, ok.clone(), no_addr), "ntasks");
        // Nothing was recorded by the refusals.
        assert!(ls.list("a-000001").is_empty());
        // One node needs no address.
        let mut one = at(&["n0"]);
        one.nodes[0].1 = None;
        assert!(ls.create(&ok, one).is_ok());
    }
}
