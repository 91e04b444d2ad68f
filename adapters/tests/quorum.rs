//! The quorum end to end on loopback: openraft's storage conformance suite on the redb store, and three
//! members over gRPC — commit, follower redirect, quota rejection at apply time, leader loss with
//! re-election, a 1+2 partition in which the minority commits nothing, and a full restart from disk.

use lattice_adapters::raft_net::fault;
use lattice_adapters::raft_store::{LogStore, StateMachine, TypeConfig, open};
use lattice_adapters::{Member, NodeId, ProposeError, QuorumCommand, QuorumResponse};
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "lattice-quorum-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, PathBuf> for Builder {
    async fn build(&self) -> Result<(PathBuf, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = scratch("suite");
        let db = open(&dir).expect("store opens");
        let sm =
            StateMachine::load(db.clone(), &dir).map_err(|e| StorageError::from(openraft::StorageIOError::read(&e)))?;
        Ok((dir, LogStore::new(db), sm))
    }
}

/// The durable store passes openraft's own storage test suite.
#[test]
fn store_passes_the_openraft_suite() {
    Suite::test_all(Builder).unwrap();
}

fn free_port() -> u16 {
    lattice_adapters::raft_net::loopback_port().unwrap()
}

fn assign(alloc: &str, tenant: &str, nodes: &[&str]) -> QuorumCommand {
    QuorumCommand::Assign {
        alloc: alloc.into(),
        tenant: tenant.into(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        sensitive: false,
        at_ms: 0,
        project: None,
        network: None,
    }
}

/// Three members with ids `base+1..=base+3` (tests run in parallel and fault injection is
/// process-wide, so each test uses its own ids).
struct Cluster {
    ids: Vec<NodeId>,
    dirs: BTreeMap<NodeId, PathBuf>,
    addrs: BTreeMap<NodeId, String>,
    members: BTreeMap<NodeId, Member>,
}

impl Cluster {
    async fn start(name: &str, base: NodeId) -> Cluster {
        let mut c = Cluster {
            ids: (base + 1..=base + 3).collect(),
            dirs: BTreeMap::new(),
            addrs: BTreeMap::new(),
            members: BTreeMap::new(),
        };
        for id in c.ids.clone() {
            c.dirs.insert(id, scratch(&format!("{name}-{id}")));
            c.addrs.insert(id, format!("127.0.0.1:{}", free_port()));
        }
        c.boot().await;
        assert!(
            c.members[&c.ids[0]].bootstrap(&c.addrs).await.unwrap(),
            "first start bootstraps"
        );
        c
    }

    async fn boot(&mut self) {
        for id in self.ids.clone() {
            let m = Member::start_serving(id, &self.dirs[&id], self.addrs[&id].parse().unwrap())
                .await
                .unwrap();
            self.members.insert(id, m);
        }
    }

    /// The leader among `among`, waiting up to `within`.
    async fn leader(&self, among: &[NodeId], within: Duration) -> NodeId {
        let t0 = Instant::now();
        loop {
            for id in among {
                if self.members[id].is_leader() {
                    return *id;
                }
            }
            assert!(t0.elapsed() < within, "no leader among {among:?} within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A linearizable read from whoever leads (a fresh leader confirms itself first), within `within`.
    async fn read(&self, among: &[NodeId], within: Duration) -> lattice_adapters::QuorumState {
        let t0 = Instant::now();
        loop {
            let leader = self.leader(among, within).await;
            if let Ok(s) = self.members[&leader].state_linearizable().await {
                return s;
            }
            assert!(t0.elapsed() < within, "no linearizable read within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn shutdown(&mut self) {
        for m in self.members.values() {
            m.shutdown().await;
        }
        self.members.clear();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_members_commit_redirect_reject_fail_over_and_restart() {
    let mut c = Cluster::start("main", 0).await;
    let ids = c.ids.clone();
    let leader = c.leader(&ids, Duration::from_secs(10)).await;
    let l = &c.members[&leader];
    let set = QuorumCommand::SetQuota {
        tenant: "physics".into(),
        max_nodes: Some(2),
        max_concurrent_allocations: None,
    };
    assert_eq!(l.propose(set).await.unwrap(), QuorumResponse::Applied);
    assert_eq!(
        l.propose(assign("a1", "physics", &["n1", "n2"])).await.unwrap(),
        QuorumResponse::Applied
    );
    // Hard quota: validated when applied, rejected with the seed's message.
    match l.propose(assign("a2", "physics", &["n3"])).await.unwrap() {
        QuorumResponse::Rejected { reason, message } => {
            assert_eq!(reason, "max_nodes");
            assert!(message.contains("physics"), "{message}");
        }
        r => panic!("quota must reject: {r:?}"),
    }
    // A follower points at the leader.
    let follower = *c.members.keys().find(|id| **id != leader).unwrap();
    let t0 = Instant::now();
    loop {
        match c.members[&follower].propose(assign("x", "bio", &["n9"])).await {
            Err(ProposeError::NotLeader {
                leader_id: Some(id),
                leader: Some(addr),
            }) => {
                assert_eq!((id, addr.as_str()), (leader, c.addrs[&leader].as_str()));
                break;
            }
            Err(ProposeError::NotLeader { .. }) if t0.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            r => panic!("a follower must redirect: {r:?}"),
        }
    }
    // Every member applies the same state.
    let want = l.state_linearizable().await.unwrap();
    for m in c.members.values() {
        let t0 = Instant::now();
        while m.state().await != want {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "member {} did not catch up",
                m.id
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // Kill the leader: a new one within 5 s, and nothing acknowledged is lost.
    let killed = Instant::now();
    c.members[&leader].shutdown().await;
    let rest: Vec<NodeId> = ids.iter().copied().filter(|id| *id != leader).collect();
    let next = c.leader(&rest, Duration::from_secs(5)).await;
    let elected_in = killed.elapsed();
    assert!(elected_in < Duration::from_secs(5), "{elected_in:?}");
    let n = &c.members[&next];
    assert_eq!(
        n.propose(assign("b1", "bio", &["n5"])).await.unwrap(),
        QuorumResponse::Applied
    );
    let s = n.state_linearizable().await.unwrap();
    assert_eq!(s.owners.get("n1").map(String::as_str), Some("a1"));
    assert_eq!(s.owners.get("n5").map(String::as_str), Some("b1"));

    // Full restart: every member stops, then all start again from their stores.
    let before = ids.iter().map(|id| c.members[id].current_term()).max().unwrap();
    c.shutdown().await;
    c.boot().await;
    assert!(
        !c.members[&ids[0]].bootstrap(&c.addrs).await.unwrap(),
        "a restarted member does not bootstrap again"
    );
    let s = c.read(&ids, Duration::from_secs(10)).await;
    assert_eq!(s.owners.get("n1").map(String::as_str), Some("a1"));
    assert_eq!(s.owners.get("n5").map(String::as_str), Some("b1"));
    assert_eq!(s.quotas.get("physics"), Some(&(Some(2), None)));
    assert_eq!(s.rejections, 1);
    // Nobody resumes leading in its old term: a leadership after the restart is a new term (the
    // layers above Raft know a leadership by its term).
    let leader = c.leader(&ids, Duration::from_secs(10)).await;
    assert!(
        c.members[&leader].leader_term().unwrap() > before,
        "a leader after a restart leads a new term (was {before})"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_minority_partition_commits_nothing() {
    let mut c = Cluster::start("partition", 10).await;
    let ids = c.ids.clone();
    let old = c.leader(&ids, Duration::from_secs(10)).await;
    let others: Vec<NodeId> = ids.iter().copied().filter(|id| *id != old).collect();
    // Isolate the leader: it is the minority (1) against the majority (2).
    fault::partition(&[&[old], &others]);
    let lonely = c.members[&old].clone();
    let stuck = tokio::time::timeout(Duration::from_secs(2), lonely.propose(assign("m", "t", &["n1"]))).await;
    assert!(
        !matches!(stuck, Ok(Ok(QuorumResponse::Applied))),
        "the minority must not commit: {stuck:?}"
    );
    // The majority elects a leader and commits.
    let t0 = Instant::now();
    let new = loop {
        if let Some(id) = others.iter().find(|id| c.members[id].is_leader()) {
            break *id;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the majority elects a leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        c.members[&new].propose(assign("maj", "t", &["n2"])).await.unwrap(),
        QuorumResponse::Applied
    );
    // Heal: the old leader rejoins and converges on the majority's state; its proposal never applied.
    fault::heal();
    let want = c.members[&new].state_linearizable().await.unwrap();
    assert!(want.owners.contains_key("n2") && !want.owners.contains_key("n1"));
    let t0 = Instant::now();
    while c.members[&old].state().await != want {
        assert!(t0.elapsed() < Duration::from_secs(10), "the old leader converges");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.shutdown().await;
}

/// Backup → verify → restore: a member restored from a backup starts with the backed-up state; an
/// altered backup fails verification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_verify_restore() {
    use lattice_adapters::raft_store::{Backup, restore};
    let dir = scratch("backup");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let m = Member::start_serving(1, &dir.join("a"), addr).await.unwrap();
    m.bootstrap(&[(1, addr.to_string())].into_iter().collect())
        .await
        .unwrap();
    let t0 = Instant::now();
    while !m.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    m.propose(assign("a1", "t", &["n1"])).await.unwrap();
    m.propose(QuorumCommand::Audit {
        at_ms: 1,
        user: "dr-x".into(),
        alloc: "c".into(),
        action: "claim".into(),
        detail: String::new(),
        signed: None,
    })
    .await
    .unwrap();
    let path = dir.join("backups/b1.json");
    let b = m.backup(&path).await.unwrap();
    assert_eq!(Backup::read_verified(&path).unwrap().sha256, b.sha256);
    // Later changes are not in the backup.
    m.propose(assign("a2", "t", &["n2"])).await.unwrap();
    m.shutdown().await;
    // Tampering is detected.
    let text = std::fs::read_to_string(&path).unwrap().replace("dr-x", "mallory");
    std::fs::write(dir.join("bad.json"), text).unwrap();
    assert!(
        Backup::read_verified(&dir.join("bad.json"))
            .unwrap_err()
            .contains("checksum")
    );
    // Restore into a fresh store: the member starts with exactly the backed-up state.
    restore(&dir.join("r"), &b).unwrap();
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let r = Member::start_serving(1, &dir.join("r"), addr2).await.unwrap();
    let s = r.state().await;
    assert_eq!(s.owners.get("n1").map(String::as_str), Some("a1"));
    assert!(!s.owners.contains_key("n2"));
    assert_eq!(s.audit.len(), 1);
    r.shutdown().await;
}

/// Group commit at the quorum: 300 concurrent proposals — one-node starts, pairs of them wanting the
/// same node, and a caller's own batch among them — each get their own command's answer: of each
/// pair exactly one holds the node, the batch's answers are its own commands', and the state holds
/// exactly what was answered applied. They took far fewer log entries than commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_proposals_share_entries_and_each_gets_its_own_answer() {
    let mut c = Cluster::start("group", 20).await;
    let leader = c.leader(&c.ids, Duration::from_secs(10)).await;
    let m = c.members[&leader].clone();
    let before = m.raft.metrics().borrow().last_log_index.unwrap_or(0);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..300u32 {
        let m = m.clone();
        set.spawn(async move {
            // a{i} and a{i+150} want the same node.
            let node = format!("n{}", i % 150);
            (i, m.propose(assign(&format!("a{i}"), "t", &[&node])).await)
        });
    }
    let batch = {
        let m = m.clone();
        tokio::spawn(async move {
            m.propose(QuorumCommand::Batch {
                commands: vec![
                    assign("b1", "t", &["x1"]),
                    assign("b2", "t", &["x1"]),
                    assign("b3", "t", &["x2"]),
                ],
            })
            .await
        })
    };
    let mut applied = BTreeMap::new();
    while let Some(r) = set.join_next().await {
        let (i, r) = r.unwrap();
        match r.unwrap() {
            QuorumResponse::Applied => {
                assert!(
                    applied.insert(i % 150, i).is_none(),
                    "two starts answered applied on n{}",
                    i % 150
                );
            }
            QuorumResponse::Rejected { reason, .. } => assert_eq!(reason, "node_conflict", "a{i}"),
            QuorumResponse::Batch(b) => panic!("a{i}: a single command answered with {b:?}"),
        }
    }
    assert_eq!(applied.len(), 150, "one start per node");
    let QuorumResponse::Batch(b) = batch.await.unwrap().unwrap() else {
        panic!("a batch is answered with its commands' answers")
    };
    assert_eq!(b.len(), 3);
    assert_eq!((&b[0], &b[2]), (&QuorumResponse::Applied, &QuorumResponse::Applied));
    assert!(matches!(&b[1], QuorumResponse::Rejected { .. }), "{b:?}");
    let state = m.state().await;
    for (node, i) in &applied {
        assert_eq!(state.assignments[&format!("a{i}")].nodes, vec![format!("n{node}")]);
    }
    assert_eq!(state.assignments.len(), 152, "the 150 applied starts and b1, b3");
    let entries = m.raft.metrics().borrow().last_log_index.unwrap_or(0) - before;
    assert!(entries < 100, "301 proposals took {entries} log entries");
    c.shutdown().await;
}
