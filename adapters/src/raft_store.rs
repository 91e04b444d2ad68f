//! Durable Raft storage on [redb](https://docs.rs/redb): the log, the vote, the committed index and
//! the latest snapshot live in one embedded database file per member (`DATA_DIR/quorum.redb`).
//!
//! Why redb: it is a maintained, pure-Rust, ACID embedded store whose commits are durable by default
//! (copy-on-write B-trees with a checksummed commit; `fsync` before `commit` returns), so "the vote is
//! on disk before `save_vote` returns" and "the log is on disk before the append callback fires" hold
//! without hand-written fsync/rename logic, and a crash mid-write leaves the previous commit intact. A
//! hand-rolled log would have to get segment truncation, torn writes and directory fsyncs right itself.
//!
//! The state machine ([`QuorumState`]) is kept in memory and made durable through snapshots: every
//! snapshot is written to the database, and on start the member loads the latest snapshot and openraft
//! re-applies the committed log after it (the committed index is persisted too). Snapshots are taken
//! every [`SNAPSHOT_EVERY`] entries and let openraft purge (compact) the log before them.

// openraft's storage traits return its `StorageError` by value; the helpers here share that type.
#![allow(clippy::result_large_err)]

use crate::quorum_state::{QuorumCommand, QuorumResponse, QuorumState};
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, LogState, RaftLogReader, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::RwLock;

pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The quorum's Raft types: commands are [`QuorumCommand`]s, responses [`QuorumResponse`]s.
    pub TypeConfig:
        D = QuorumCommand,
        R = QuorumResponse,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
type SE = StorageError<NodeId>;

/// Entries between snapshots (the log is compacted behind each).
pub const SNAPSHOT_EVERY: u64 = 1000;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
use crate::store_meta::{META, meta_get, meta_put};

/// Opens (or creates) the member's database in `dir`.
pub fn open(dir: &Path) -> Result<Arc<Database>, std::io::Error> {
    open_on(&crate::disk::Disk::Dir(dir.to_path_buf()))
}

/// Opens (or creates) the member's database on `disk`.
pub fn open_on(disk: &crate::disk::Disk) -> Result<Arc<Database>, std::io::Error> {
    let db = disk.database("quorum.redb")?;
    // Create the tables so readers never see them missing.
    let tx = db.begin_write().map_err(std::io::Error::other)?;
    tx.open_table(LOG).map_err(std::io::Error::other)?;
    tx.open_table(META).map_err(std::io::Error::other)?;
    tx.commit().map_err(std::io::Error::other)?;
    Ok(Arc::new(db))
}

/// The log store (log, vote, committed index, last purged id).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub fn new(db: Arc<Database>) -> LogStore {
        LogStore { db }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SE> {
        let tx = self.db.begin_read().map_err(|e| StorageIOError::read_logs(&e))?;
        let t = tx.open_table(LOG).map_err(|e| StorageIOError::read_logs(&e))?;
        let (lo, hi) = (range.start_bound().cloned(), range.end_bound().cloned());
        let iter = t.range::<u64>((lo, hi)).map_err(|e| StorageIOError::read_logs(&e))?;
        let mut out = Vec::new();
        for item in iter {
            let (_, v) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            out.push(serde_json::from_slice(v.value()).map_err(|e| StorageIOError::read_logs(&e))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SE> {
        let last_purged: Option<LogId<NodeId>> = meta_get(&self.db, "last_purged")?;
        let tx = self.db.begin_read().map_err(|e| StorageIOError::read_logs(&e))?;
        let t = tx.open_table(LOG).map_err(|e| StorageIOError::read_logs(&e))?;
        let last = match t.last().map_err(|e| StorageIOError::read_logs(&e))? {
            Some((_, v)) => {
                let e: Entry<TypeConfig> =
                    serde_json::from_slice(v.value()).map_err(|e| StorageIOError::read_logs(&e))?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SE> {
        meta_put(&self.db, "vote", vote)
    }

    /// Read once, at start-up. A member that led before it stopped comes back as a candidate of its
    /// old term, not as its leader (openraft would restore the leadership at once, in the same term
    /// and without a new entry): everything above Raft — the queue mirror's fences and records, the
    /// take-over — knows a leadership by its term, so a restarted leader must win a new one (found
    /// by DST: a record mirrored by two incarnations of one term's leader, one of them stale).
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SE> {
        let vote: Option<Vote<NodeId>> = meta_get(&self.db, "vote")?;
        Ok(vote.map(|v| {
            if v.is_committed() {
                Vote::new(v.leader_id().term, v.leader_id().node_id)
            } else {
                v
            }
        }))
    }

    /// The committed index is a hint openraft can re-learn from the leader, so it is written without
    /// its own fsync (redb `Durability::None`): it reaches the disk with the next durable commit (an
    /// append or a vote), which halves the fsyncs per commit.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SE> {
        let bytes = serde_json::to_vec(&committed).map_err(|e| StorageIOError::write(&e))?;
        let mut tx = self.db.begin_write().map_err(|e| StorageIOError::write(&e))?;
        tx.set_durability(redb::Durability::None)
            .map_err(|e| StorageIOError::write(&e))?;
        {
            let mut t = tx.open_table(META).map_err(|e| StorageIOError::write(&e))?;
            t.insert("committed", bytes.as_slice())
                .map_err(|e| StorageIOError::write(&e))?;
        }
        tx.commit().map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SE> {
        Ok(meta_get::<Option<LogId<NodeId>>>(&self.db, "committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SE>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let tx = self.db.begin_write().map_err(|e| StorageIOError::write_logs(&e))?;
        {
            let mut t = tx.open_table(LOG).map_err(|e| StorageIOError::write_logs(&e))?;
            for e in entries {
                let bytes = serde_json::to_vec(&e).map_err(|e| StorageIOError::write_logs(&e))?;
                t.insert(e.log_id.index, bytes.as_slice())
                    .map_err(|e| StorageIOError::write_logs(&e))?;
            }
        }
        // Durable on return (redb's default durability fsyncs the commit).
        tx.commit().map_err(|e| StorageIOError::write_logs(&e))?;
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SE> {
        let tx = self.db.begin_write().map_err(|e| StorageIOError::write_logs(&e))?;
        {
            let mut t = tx.open_table(LOG).map_err(|e| StorageIOError::write_logs(&e))?;
            t.retain_in(log_id.index.., |_, _| false)
                .map_err(|e| StorageIOError::write_logs(&e))?;
        }
        tx.commit().map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SE> {
        meta_put(&self.db, "last_purged", &Some(log_id))?;
        let tx = self.db.begin_write().map_err(|e| StorageIOError::write_logs(&e))?;
        {
            let mut t = tx.open_table(LOG).map_err(|e| StorageIOError::write_logs(&e))?;
            t.retain_in(..=log_id.index, |_, _| false)
                .map_err(|e| StorageIOError::write_logs(&e))?;
        }
        tx.commit().map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

/// Why a member's state could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Store(String),
    /// Snapshots were taken but none verifies and reaches the log: the state must come from a
    /// peer's snapshot (or a backup).
    #[error("no usable snapshot: {0}")]
    NoSnapshot(String),
}

/// The state machine and what it has applied.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SmData {
    pub last_applied: Option<LogId<NodeId>>,
    pub last_membership: StoredMembership<NodeId, BasicNode>,
    pub state: QuorumState,
}

use crate::snapshots::{Snapshots, StoredSnapshot};

/// Snapshots built and installed by every state machine of this process (the deterministic
/// simulation reports them, so a run shows the snapshot path was exercised).
pub static SNAPSHOTS_BUILT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// See [`SNAPSHOTS_BUILT`]: snapshots a lagging member installed from its leader.
pub static SNAPSHOTS_INSTALLED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The state machine: [`QuorumState`] in memory, snapshots in the database.
#[derive(Clone)]
pub struct StateMachine {
    pub(crate) db: Arc<Database>,
    /// The snapshot files (the latest two, checksummed).
    pub snaps: Arc<Snapshots>,
    pub data: Arc<RwLock<SmData>>,
    /// The latest snapshot's size (bytes), and how long the ones built since they were last taken
    /// took (seconds, at most 256): `lattice_raft_snapshot_*`.
    pub snapshots: Arc<std::sync::Mutex<SnapshotStats>>,
}

/// See [`StateMachine::snapshots`].
#[derive(Clone, Debug, Default)]
pub struct SnapshotStats {
    pub bytes: u64,
    pub build_s: Vec<f64>,
}

impl StateMachine {
    /// Loads the latest snapshot that verifies and reaches the log as the starting state (see
    /// [`crate::snapshots`]); the member's data directory is `dir`.
    pub fn load(db: Arc<Database>, dir: &Path) -> Result<StateMachine, LoadError> {
        StateMachine::load_on(db, &crate::disk::Disk::Dir(dir.to_path_buf()))
    }

    /// [`StateMachine::load`] on `disk`.
    pub fn load_on(db: Arc<Database>, disk: &crate::disk::Disk) -> Result<StateMachine, LoadError> {
        let snaps = Arc::new(Snapshots::new(disk.clone(), db.clone()));
        let last_purged: Option<LogId<NodeId>> =
            meta_get(&db, "last_purged").map_err(|e| LoadError::Store(e.to_string()))?;
        let stored = snaps.for_start(last_purged).map_err(LoadError::NoSnapshot)?;
        let bytes = stored.as_ref().map_or(0, |s| s.data.len() as u64);
        let data = match stored {
            Some(s) => serde_json::from_slice(&s.data)
                .map_err(|e| LoadError::Store(format!("snapshot {}: {e}", s.meta.snapshot_id)))?,
            None => SmData::default(),
        };
        Ok(StateMachine {
            db,
            snaps,
            data: Arc::new(RwLock::new(data)),
            snapshots: Arc::new(std::sync::Mutex::new(SnapshotStats {
                bytes,
                build_s: Vec::new(),
            })),
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SE> {
        let t0 = std::time::Instant::now();
        let sm = self.data.read().await.clone();
        SNAPSHOTS_BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let data = serde_json::to_vec(&sm).map_err(|e| StorageIOError::read_state_machine(&e))?;
        let meta = SnapshotMeta {
            last_log_id: sm.last_applied,
            last_membership: sm.last_membership.clone(),
            snapshot_id: match sm.last_applied {
                Some(l) => format!("{}-{}", l.leader_id.term, l.index),
                None => "empty".into(),
            },
        };
        self.snaps.save(&StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        })?;
        {
            let mut st = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
            st.bytes = data.len() as u64;
            if st.build_s.len() < 256 {
                st.build_s.push(t0.elapsed().as_secs_f64());
            }
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), SE> {
        let g = self.data.read().await;
        Ok((g.last_applied, g.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<QuorumResponse>, SE>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut g = self.data.write().await;
        let mut out = Vec::new();
        for e in entries {
            g.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => out.push(QuorumResponse::Applied),
                EntryPayload::Normal(cmd) => {
                    let r = g.state.apply(&cmd);
                    out.push(r);
                }
                EntryPayload::Membership(m) => {
                    g.last_membership = StoredMembership::new(Some(e.log_id), m);
                    out.push(QuorumResponse::Applied);
                }
            }
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SE> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SE> {
        let data = snapshot.into_inner();
        let sm: SmData =
            serde_json::from_slice(&data).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner()).bytes = data.len() as u64;
        self.snaps.save(&StoredSnapshot {
            meta: meta.clone(),
            data,
        })?;
        *self.data.write().await = sm;
        SNAPSHOTS_INSTALLED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SE> {
        Ok(self.snaps.latest()?.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}

/// A backup of the quorum's state: the applied state machine and where it stands in the log, with a
/// checksum over both (`verify` re-derives it and re-checks the audit chain).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Backup {
    pub format: String,
    pub created_ms: u64,
    pub node_id: NodeId,
    pub sha256: String,
    pub data: SmData,
}

pub const BACKUP_FORMAT: &str = "lattice-quorum-backup/1";

fn checksum(data: &SmData) -> Result<String, std::io::Error> {
    use sha2::{Digest, Sha256};
    let bytes = serde_json::to_vec(data).map_err(std::io::Error::other)?;
    Ok(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}

impl Backup {
    pub fn of(node_id: NodeId, data: SmData, created_ms: u64) -> Result<Backup, std::io::Error> {
        Ok(Backup {
            format: BACKUP_FORMAT.into(),
            created_ms,
            node_id,
            sha256: checksum(&data)?,
            data,
        })
    }

    /// Reads a backup file and checks its format, checksum and audit chain.
    pub fn read_verified(path: &Path) -> Result<Backup, String> {
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let b: Backup =
            serde_json::from_slice(&text).map_err(|e| format!("{}: not a quorum backup: {e}", path.display()))?;
        if b.format != BACKUP_FORMAT {
            return Err(format!(
                "{}: format `{}`, expected `{BACKUP_FORMAT}`",
                path.display(),
                b.format
            ));
        }
        let want = checksum(&b.data).map_err(|e| e.to_string())?;
        if want != b.sha256 {
            return Err(format!(
                "{}: checksum mismatch (the backup was altered or truncated)",
                path.display()
            ));
        }
        if let Err(seq) = b.data.state.verify_audit() {
            return Err(format!("{}: the audit chain breaks at entry {seq}", path.display()));
        }
        Ok(b)
    }
}

/// Offline restore (before the member starts): the backup becomes the member's snapshot and its log is
/// emptied behind it, so the member starts from the backed-up state. The vote is kept.
pub fn restore(dir: &Path, backup: &Backup) -> Result<(), String> {
    let db = open(dir).map_err(|e| e.to_string())?;
    let meta = SnapshotMeta {
        last_log_id: backup.data.last_applied,
        last_membership: backup.data.last_membership.clone(),
        snapshot_id: format!("restore-{}", backup.created_ms),
    };
    let data = serde_json::to_vec(&backup.data).map_err(|e| e.to_string())?;
    Snapshots::new(crate::disk::Disk::Dir(dir.to_path_buf()), db.clone())
        .save(&StoredSnapshot { meta, data })
        .map_err(|e| e.to_string())?;
    meta_put(&db, "last_purged", &backup.data.last_applied).map_err(|e| e.to_string())?;
    meta_put(&db, "committed", &backup.data.last_applied).map_err(|e| e.to_string())?;
    let tx = db.begin_write().map_err(|e| e.to_string())?;
    {
        let mut t = tx.open_table(LOG).map_err(|e| e.to_string())?;
        t.retain(|_, _| false).map_err(|e| e.to_string())?;
    }
    tx.commit().map_err(|e| e.to_string())?;
    Ok(())
}
