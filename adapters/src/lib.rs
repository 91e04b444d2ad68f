//! `lattice-adapters` — the real implementations of the engine's ports. Here now: the **quorum** —
//! openraft 0.9 with a durable log and state machine on redb ([`raft_store`]), Raft over gRPC
//! ([`raft_net`], tonic, vendored `protoc`), and the replicated state itself ([`quorum_state`]: node
//! ownership with hard-quota validation at apply time, and the hash-chained sensitive audit log).
//! [`Member`] starts one quorum member. The external services' REST clients: VAST storage
//! ([`vast`]) and the Slingshot fabric manager with the VNI pool ([`fabric`]), sharing timeouts,
//! retries with backoff and typed errors ([`http`]); the TSDB's Prometheus query API ([`tsdb`]). Re-exported from `lattice-node-adapters` (which the node agent builds on without
//! the quorum): the agents' own gRPC service ([`peer`]), the checkpoint callback's client
//! ([`checkpoint`]) and the log store ([`logstore`]). The control plane's durable record of acknowledged allocations, with
//! group commit ([`alloc_store`]). (GPU discovery lives in `lattice-agent`.)

pub mod alloc_store;
pub mod audit_archive;
pub mod disk;
pub mod fabric;
pub mod http;
pub mod openchami;
pub mod quorum_state;
pub mod raft_net;
pub mod raft_store;
pub mod s3;
pub mod snapshots;
pub mod spool;
mod store_meta;
pub mod tsdb;
pub mod vast;
pub mod waldur;

/// The node side's adapters (the agents' gRPC service, the checkpoint callback, the log store), for
/// the control plane.
pub use lattice_node_adapters::{checkpoint, logstore, peer};

/// openraft, for its `Config` (a simulation sets its own timings).
pub use openraft;
pub use quorum_state::{
    AdminEntry, AuditEntry, FederatedEnd, FederationPeer, NetworkGrant, NodeAdmin, QuorumCommand, QuorumResponse,
    QuorumState, TenantWrite,
};
pub use raft_store::{NodeId, Raft, TypeConfig};

use openraft::{BasicNode, ServerState};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Why a proposal did not commit.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProposeError {
    /// This member is not the leader; the leader's Raft address when known.
    #[error("not the quorum leader (leader: {})", leader.as_deref().unwrap_or("unknown"))]
    NotLeader {
        leader_id: Option<NodeId>,
        leader: Option<String>,
    },
    #[error("quorum: {0}")]
    Raft(String),
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("opening the quorum store in {dir}: {source}")]
    Store { dir: String, source: std::io::Error },
    #[error("binding the quorum's gRPC address {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("quorum: {0}")]
    Raft(String),
}

/// How long a write waits for its answer. openraft 0.9 can leave a deposed leader's write unanswered
/// forever when a snapshot from its successor reaches past the end of its log (the entries are
/// purged, their callers never told; openraft issue 1761, fixed in 0.10): found by DST, where the
/// deposed leader's scheduling loop hung on such a write and never scheduled again.
pub const PROPOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// A running quorum member: its Raft handle and a view of its applied state.
#[derive(Clone)]
pub struct Member {
    pub id: NodeId,
    pub raft: Raft,
    sm: raft_store::StateMachine,
    /// Stops the member's Raft gRPC server (when it serves one).
    server: Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
    /// Proposals waiting for the next log entry ([`Member::propose`]).
    proposals: Arc<std::sync::Mutex<Proposals>>,
}

/// Group commit at the quorum: the commands proposed while an entry is being committed go together
/// in the next one (a [`QuorumCommand::Batch`]: one append, one fsync, one replication), each
/// caller answered with its own command's response.
#[derive(Default)]
struct Proposals {
    queue: Vec<(
        QuorumCommand,
        tokio::sync::oneshot::Sender<Result<QuorumResponse, ProposeError>>,
    )>,
    /// A task is committing entries (it stops when the queue is empty).
    sending: bool,
}

/// Commands in one log entry at most (a caller's own batch counts whole).
const ENTRY_COMMANDS: usize = 1024;

/// How a member reaches its peers and with which Raft timings (all default: TCP, plaintext,
/// [`raft_config`]).
#[derive(Clone, Default)]
pub struct MemberOptions {
    pub tls: Option<raft_net::PeerTls>,
    pub dial: Option<raft_net::Dialer>,
    pub config: Option<openraft::Config>,
    /// The other members' Raft addresses: where a member whose own snapshots all fail their
    /// checksums fetches a verified one (see [`crate::snapshots`]).
    pub peers: Vec<String>,
}

/// Raft timings for members on one site network (heartbeat 100 ms, election 400-800 ms), a snapshot
/// every [`raft_store::SNAPSHOT_EVERY`] entries.
pub fn raft_config() -> openraft::Config {
    openraft::Config {
        cluster_name: "lattice".into(),
        heartbeat_interval: 100,
        election_timeout_min: 400,
        election_timeout_max: 800,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(raft_store::SNAPSHOT_EVERY),
        // The log reaches back past the previous snapshot: a member whose latest snapshot fails
        // its checksum starts from the previous one and re-applies the log after it.
        max_in_snapshot_log_to_keep: raft_store::SNAPSHOT_EVERY + raft_store::SNAPSHOT_EVERY / 10 + 1,
        ..Default::default()
    }
}

/// A member none of whose snapshots verifies and reaches its log takes a peer's latest instead: one
/// whose checksum, state and audit chain verify and which reaches at least as far as this member's
/// log was purged (committed entries are the same on every member, so the log after it re-applies
/// on top). The log and the vote are kept.
async fn recover_from_peers(
    db: &Arc<redb::Database>,
    disk: &disk::Disk,
    options: &MemberOptions,
    why: &str,
) -> Result<(), StartError> {
    let last_purged: Option<openraft::LogId<NodeId>> =
        store_meta::meta_get(db, "last_purged").map_err(|e| StartError::Raft(e.to_string()))?;
    let mut tried = vec![format!("own snapshots: {why}")];
    for addr in &options.peers {
        match raft_net::fetch_snapshot(addr, options.tls.as_ref(), options.dial.as_ref()).await {
            Ok(Some(snap)) => {
                let checked = serde_json::from_slice::<raft_store::SmData>(&snap.data)
                    .map_err(|e| format!("{addr}: its snapshot does not parse: {e}"))
                    .and_then(|sm| {
                        sm.state
                            .verify_audit()
                            .map_err(|seq| format!("{addr}: its snapshot's audit chain breaks at entry {seq}"))
                    })
                    .and_then(|()| {
                        (snap.meta.last_log_id >= last_purged)
                            .then_some(())
                            .ok_or_else(|| format!("{addr}: its snapshot ends before this member's log begins"))
                    });
                match checked {
                    Ok(()) => {
                        snapshots::Snapshots::new(disk.clone(), db.clone())
                            .adopt(&snap)
                            .map_err(|e| StartError::Raft(e.to_string()))?;
                        tracing::warn!(
                            "quorum store: {why}; took snapshot {} from peer {addr}",
                            snap.meta.snapshot_id
                        );
                        return Ok(());
                    }
                    Err(e) => tried.push(e),
                }
            }
            Ok(None) => tried.push(format!("{addr}: has no snapshot")),
            Err(e) => tried.push(e),
        }
    }
    Err(StartError::Raft(format!(
        "no usable snapshot, and none from a peer ({}); restore a backup (lattice-runtime --restore) \
         or start the member afresh",
        tried.join("; ")
    )))
}

impl Member {
    /// The Raft gRPC service this member serves to its peers.
    pub fn raft_service(&self) -> raft_net::pb::raft_service_server::RaftServiceServer<raft_net::RaftService> {
        raft_net::server(self.raft.clone(), self.sm.snaps.clone())
    }

    /// Opens the member's store in `dir` (restoring its state from disk) and starts Raft. The Raft
    /// gRPC service is served by the caller ([`raft_net::server`]) on the member's address.
    pub async fn start(id: NodeId, dir: &Path) -> Result<Member, StartError> {
        Member::start_with_tls(id, dir, None).await
    }

    /// [`Member::start`], reaching peers over (m)TLS when `tls` is given.
    pub async fn start_with_tls(id: NodeId, dir: &Path, tls: Option<raft_net::PeerTls>) -> Result<Member, StartError> {
        let options = MemberOptions {
            tls,
            ..Default::default()
        };
        Member::start_with(id, &disk::Disk::Dir(dir.to_path_buf()), options).await
    }

    /// Starts a member with its store on `disk` and the given transport and timings.
    pub async fn start_with(id: NodeId, disk: &disk::Disk, options: MemberOptions) -> Result<Member, StartError> {
        let db = raft_store::open_on(disk).map_err(|source| StartError::Store {
            dir: disk.describe(),
            source,
        })?;
        let sm = match raft_store::StateMachine::load_on(db.clone(), disk) {
            Err(raft_store::LoadError::NoSnapshot(why)) => {
                recover_from_peers(&db, disk, &options, &why).await?;
                raft_store::StateMachine::load_on(db.clone(), disk)
            }
            loaded => loaded,
        }
        .map_err(|e| StartError::Raft(e.to_string()))?;
        for problem in sm.snaps.problems.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            tracing::warn!("quorum store: {problem}; started from an earlier snapshot and the log");
        }
        let config = options
            .config
            .unwrap_or_else(raft_config)
            .validate()
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let raft = Raft::new(
            id,
            Arc::new(config),
            raft_net::Network {
                from: id,
                tls: options.tls.map(Arc::new),
                dial: options.dial,
            },
            raft_store::LogStore::new(db),
            sm.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        Ok(Member {
            id,
            raft,
            sm,
            server: Arc::new(std::sync::Mutex::new(None)),
            proposals: Default::default(),
        })
    }

    /// Starts a member and serves its Raft service on `addr` (spawned on the current runtime).
    pub async fn start_serving(id: NodeId, dir: &Path, addr: SocketAddr) -> Result<Member, StartError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        Member::start_on(id, dir, listener).await
    }

    /// Starts a member serving its Raft service on an already bound listener.
    pub async fn start_on(id: NodeId, dir: &Path, listener: tokio::net::TcpListener) -> Result<Member, StartError> {
        let m = Member::start(id, dir).await?;
        let svc = m.raft_service();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(raft_net::nodelay(listener), async {
                    let _ = stopped.await;
                }),
        );
        *m.server.lock().unwrap_or_else(|p| p.into_inner()) = Some(stop);
        Ok(m)
    }

    /// `--bootstrap`: forms the quorum from `members` (id → Raft address). Only on first start: a member
    /// that already has state refuses (that is not an error).
    pub async fn bootstrap(&self, members: &BTreeMap<NodeId, String>) -> Result<bool, ProposeError> {
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => Ok(true),
            Err(openraft::error::RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(false),
            Err(e) => Err(ProposeError::Raft(e.to_string())),
        }
    }

    /// Proposes a command and waits until it is committed and applied; the state machine's response.
    /// Commands proposed while an entry is being committed share the next entry (group commit).
    /// No answer within [`PROPOSE_WITHIN`] is an error whose outcome is unknown (the entry may still
    /// commit), as a lost answer is: callers already treat every error so.
    pub async fn propose(&self, cmd: QuorumCommand) -> Result<QuorumResponse, ProposeError> {
        let (done, answer) = tokio::sync::oneshot::channel();
        let start = {
            let mut p = self.proposals.lock().unwrap_or_else(|e| e.into_inner());
            p.queue.push((cmd, done));
            !std::mem::replace(&mut p.sending, true)
        };
        if start {
            tokio::spawn(self.clone().commit_proposals());
        }
        answer
            .await
            .unwrap_or_else(|_| Err(ProposeError::Raft("the proposal was dropped".into())))
    }

    /// Commits the queued proposals, an entry at a time, until none is left: one command alone, or
    /// several as a [`QuorumCommand::Batch`] (a caller's own batch flattened into it).
    async fn commit_proposals(self) {
        loop {
            let waiting = {
                let mut p = self.proposals.lock().unwrap_or_else(|e| e.into_inner());
                if p.queue.is_empty() {
                    p.sending = false;
                    return;
                }
                let mut n = 0;
                let mut commands = 0;
                for (c, _) in &p.queue {
                    let k = match c {
                        QuorumCommand::Batch { commands } => commands.len(),
                        _ => 1,
                    };
                    if n > 0 && commands + k > ENTRY_COMMANDS {
                        break;
                    }
                    commands += k;
                    n += 1;
                }
                p.queue.drain(..n).collect::<Vec<_>>()
            };
            if waiting.len() == 1 {
                let (cmd, done) = waiting.into_iter().next().expect("one");
                let _ = done.send(self.propose_entry(cmd).await);
                continue;
            }
            // Each caller's span of the flattened batch: (first, length, its own command a batch).
            let mut commands = Vec::new();
            let mut spans = Vec::with_capacity(waiting.len());
            let mut dones = Vec::with_capacity(waiting.len());
            for (cmd, done) in waiting {
                let first = commands.len();
                let batch = matches!(cmd, QuorumCommand::Batch { .. });
                match cmd {
                    QuorumCommand::Batch { commands: cs } => commands.extend(cs),
                    c => commands.push(c),
                }
                spans.push((first, commands.len() - first, batch));
                dones.push(done);
            }
            let total = commands.len();
            match self.propose_entry(QuorumCommand::Batch { commands }).await {
                Ok(QuorumResponse::Batch(rs)) if rs.len() == total => {
                    for ((first, len, batch), done) in spans.into_iter().zip(dones) {
                        let r = if batch {
                            QuorumResponse::Batch(rs[first..first + len].to_vec())
                        } else {
                            rs[first].clone()
                        };
                        let _ = done.send(Ok(r));
                    }
                }
                Ok(other) => {
                    let e = ProposeError::Raft(format!("a batch of {total} commands was answered with {other:?}"));
                    for done in dones {
                        let _ = done.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for done in dones {
                        let _ = done.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// One log entry, committed and applied.
    async fn propose_entry(&self, cmd: QuorumCommand) -> Result<QuorumResponse, ProposeError> {
        let Ok(written) = tokio::time::timeout(PROPOSE_WITHIN, self.raft.client_write(cmd)).await else {
            return Err(ProposeError::Raft(format!(
                "no answer within {} s; the outcome is unknown",
                PROPOSE_WITHIN.as_secs()
            )));
        };
        match written {
            Ok(r) => Ok(r.data),
            Err(e) => match e.forward_to_leader() {
                Some(f) => Err(ProposeError::NotLeader {
                    leader_id: f.leader_id,
                    leader: f.leader_node.as_ref().map(|n| n.addr.clone()),
                }),
                None => Err(ProposeError::Raft(e.to_string())),
            },
        }
    }

    /// A copy of the applied state (local; possibly behind the leader on a follower).
    pub async fn state(&self) -> QuorumState {
        self.sm.data.read().await.state.clone()
    }

    /// A read of the applied state without copying it all (local, like [`Member::state`]).
    pub async fn read<T>(&self, f: impl FnOnce(&QuorumState) -> T) -> T {
        f(&self.sm.data.read().await.state)
    }

    /// The applied state after confirming leadership with a quorum (linearizable).
    pub async fn state_linearizable(&self) -> Result<QuorumState, ProposeError> {
        self.confirm_leader().await?;
        Ok(self.state().await)
    }

    /// Confirms with a majority that this member still leads (a deposed leader that has not heard
    /// of its successor learns it here).
    pub async fn confirm_leader(&self) -> Result<(), ProposeError> {
        self.raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(|e| match e.forward_to_leader() {
                Some(f) => ProposeError::NotLeader {
                    leader_id: f.leader_id,
                    leader: f.leader_node.as_ref().map(|n| n.addr.clone()),
                },
                None => ProposeError::Raft(e.to_string()),
            })
    }

    /// The term in which this member leads, if it does (state and term read together).
    pub fn leader_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        (m.state == ServerState::Leader).then_some(m.current_term)
    }

    /// The newest Raft term this member has seen (its vote's).
    pub fn current_term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// [`Member::read`] without waiting: `None` while the state machine is being written.
    pub fn try_read<T>(&self, f: impl FnOnce(&QuorumState) -> T) -> Option<T> {
        self.sm.data.try_read().ok().map(|d| f(&d.state))
    }

    pub fn is_leader(&self) -> bool {
        // Borrowed, not cloned: every API write asks.
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Entries in this member's Raft log (after the last purge), its latest snapshot's size in bytes,
    /// and how long the snapshots built since the last call took (seconds).
    pub fn log_stats(&self) -> (u64, u64, Vec<f64>) {
        let (last, purged) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (
                m.last_log_index.map_or(0, |i| i + 1),
                m.purged.map_or(0, |l| l.index + 1),
            )
        };
        let mut st = self.sm.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        (last.saturating_sub(purged), st.bytes, std::mem::take(&mut st.build_s))
    }

    pub fn status(&self) -> RaftStatus {
        let m = self.raft.metrics().borrow().clone();
        RaftStatus {
            id: self.id,
            state: format!("{:?}", m.state),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            members: m
                .membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
        }
    }

    /// Adds a member: learner first (catches up), then voter.
    pub async fn add_member(&self, id: NodeId, addr: &str) -> Result<(), ProposeError> {
        let raft_err = |e: String| ProposeError::Raft(e);
        self.raft
            .add_learner(id, BasicNode { addr: addr.to_string() }, true)
            .await
            .map_err(|e| raft_err(e.to_string()))?;
        let mut voters: std::collections::BTreeSet<NodeId> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        voters.insert(id);
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| raft_err(e.to_string()))?;
        Ok(())
    }

    /// Removes a member from the voters (and the cluster).
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ProposeError> {
        let mut voters: std::collections::BTreeSet<NodeId> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        voters.remove(&id);
        self.raft
            .change_membership(voters, false)
            .await
            .map_err(|e| ProposeError::Raft(e.to_string()))?;
        Ok(())
    }

    /// A backup of the applied state, written to `path` (a consistent copy: taken under the state
    /// machine's lock, with the log position it corresponds to).
    pub async fn backup(&self, path: &Path) -> Result<raft_store::Backup, String> {
        let data = self.sm.data.read().await.clone();
        let now = lattice_util::clock::epoch_ms();
        let b = raft_store::Backup::of(self.id, data, now).map_err(|e| e.to_string())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        let bytes = serde_json::to_vec(&b).map_err(|e| e.to_string())?;
        // Write then rename: a crash never leaves a half-written backup under the final name.
        let tmp = path.with_extension("partial");
        std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(b)
    }

    /// Stops Raft and the member's gRPC server (the store stays on disk). Raft's workers let go of the
    /// store shortly after; [`Member::store_handles`] counts who still holds it.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        if let Some(stop) = self.server.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
    }

    /// Open handles on the member's database (this `Member` and its clones hold one each; so do
    /// the log store and the Raft service, through the snapshot files); the files can be reopened
    /// once only this one is left (1).
    pub fn store_handles(&self) -> usize {
        // The snapshot files hold one handle on the database themselves, for as long as they live.
        (Arc::strong_count(&self.sm.db) - 1).max(Arc::strong_count(&self.sm.snaps))
    }
}

/// `raft status`: this member's view.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RaftStatus {
    pub id: NodeId,
    pub state: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: Option<u64>,
    pub last_applied: Option<u64>,
    pub members: BTreeMap<NodeId, String>,
}
