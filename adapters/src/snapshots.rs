//! The state machine's snapshots: the latest two, each in a file of its own beside the log
//! (`snapshot-a.redb`, `snapshot-b.redb`, written in turn), each checked by a SHA-256 of its data
//! that the log's database records with the snapshot's metadata (`snapshots`, latest first).
//!
//! A member whose latest snapshot fails its checksum — the file altered, truncated, unreadable —
//! starts from the previous one and openraft re-applies the committed log after it: the log is
//! kept back to the previous snapshot (`max_in_snapshot_log_to_keep` is a whole snapshot interval
//! and more, see [`crate::raft_config`]). When no snapshot it has verifies and covers the log, the
//! caller fetches a verified one from a peer ([`Snapshots::adopt`]) before the member starts.
//!
//! A snapshot is written to its file (a durable redb commit) before the record naming it and its
//! checksum is: a crash in between leaves the record naming the older snapshots, of which the one
//! just overwritten no longer verifies and the other still does.

// openraft's storage traits return its `StorageError` by value; the helpers here share that type.
#![allow(clippy::result_large_err)]

use crate::disk::Disk;
use openraft::{BasicNode, LogId, SnapshotMeta, StorageError, StorageIOError};
use redb::{Database, ReadableDatabase, TableDefinition};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// The member ids openraft's types carry (`raft_store::NodeId`).
type NodeId = u64;
type SE = StorageError<NodeId>;

const SLOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
const SLOT_NAMES: [&str; 2] = ["snapshot-a.redb", "snapshot-b.redb"];

/// A snapshot: its metadata and the serialised state machine.
#[derive(Clone, Serialize, Deserialize)]
pub struct StoredSnapshot {
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    pub data: Vec<u8>,
}

/// What the log's database records of a snapshot file: which one, what it holds, its checksum.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Pointer {
    slot: usize,
    meta: SnapshotMeta<NodeId, BasicNode>,
    sha256: String,
}

/// The hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// The member's snapshot files.
pub struct Snapshots {
    disk: Disk,
    /// The log's database, which records the pointers.
    db: Arc<Database>,
    slots: [Mutex<Option<Arc<Database>>>; 2],
    /// Slots whose snapshot failed to read or verify: made anew before they are written again.
    damaged: Mutex<[bool; 2]>,
    /// What start-up found wrong (a snapshot that failed its checksum, or could not be read).
    pub problems: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Snapshots {
    pub fn new(disk: Disk, db: Arc<Database>) -> Snapshots {
        Snapshots {
            disk,
            db,
            slots: [Mutex::new(None), Mutex::new(None)],
            damaged: Mutex::new([false; 2]),
            problems: Mutex::new(Vec::new()),
        }
    }

    fn pointers(&self) -> Result<Vec<Pointer>, SE> {
        Ok(crate::store_meta::meta_get::<Vec<Pointer>>(&self.db, "snapshots")?.unwrap_or_default())
    }

    /// The slot's database, opened once; `None` when it cannot be opened (a damaged file).
    fn slot(&self, i: usize) -> Option<Arc<Database>> {
        let mut g = lock(&self.slots[i]);
        if g.is_none() {
            let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.disk.database(SLOT_NAMES[i])))
                .unwrap_or_else(|_| Err(std::io::Error::other("damaged (its store failed opening it)")));
            match opened {
                Ok(db) => *g = Some(Arc::new(db)),
                Err(e) => {
                    lock(&self.problems).push(format!("{}: cannot be opened: {e}", SLOT_NAMES[i]));
                    return None;
                }
            }
        }
        g.clone()
    }

    /// Sets the slot's file aside (damaged) and makes it anew.
    fn renew_slot(&self, i: usize) -> Result<Arc<Database>, String> {
        *lock(&self.slots[i]) = None;
        self.disk.set_aside(SLOT_NAMES[i]).map_err(|e| e.to_string())?;
        let db = Arc::new(self.disk.database(SLOT_NAMES[i]).map_err(|e| e.to_string())?);
        *lock(&self.slots[i]) = Some(db.clone());
        Ok(db)
    }

    /// Writes `bytes` as slot `i`'s snapshot (a durable commit); a damaged file's panic is an error.
    fn write_slot(db: &Database, bytes: &[u8]) -> Result<(), String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Snapshots::write_slot_unguarded(db, bytes)
        }))
        .unwrap_or_else(|_| Err("damaged (its store failed writing it)".into()))
    }

    fn write_slot_unguarded(db: &Database, bytes: &[u8]) -> Result<(), String> {
        let tx = db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut t = tx.open_table(SLOT).map_err(|e| e.to_string())?;
            t.insert("snapshot", bytes).map_err(|e| e.to_string())?;
        }
        tx.commit().map_err(|e| e.to_string())
    }

    /// Reads the snapshot `p` names and checks it against its checksum (a failure marks the slot
    /// damaged).
    fn read(&self, p: &Pointer) -> Result<StoredSnapshot, String> {
        // redb panics on some damaged pages: a damaged file must not take the member down.
        let read =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.read_unmarked(p))).unwrap_or_else(|_| {
                Err(format!(
                    "{}: damaged (its store failed reading it)",
                    SLOT_NAMES[p.slot.min(1)]
                ))
            });
        if read.is_err() {
            lock(&self.damaged)[p.slot.min(1)] = true;
        }
        read
    }

    fn read_unmarked(&self, p: &Pointer) -> Result<StoredSnapshot, String> {
        let name = SLOT_NAMES[p.slot.min(1)];
        let db = self
            .slot(p.slot.min(1))
            .ok_or_else(|| format!("{name}: cannot be opened"))?;
        let read = || -> Result<Option<Vec<u8>>, String> {
            let tx = db.begin_read().map_err(|e| e.to_string())?;
            let t = tx.open_table(SLOT).map_err(|e| e.to_string())?;
            Ok(t.get("snapshot")
                .map_err(|e| e.to_string())?
                .map(|v| v.value().to_vec()))
        };
        let bytes = read()
            .map_err(|e| format!("{name}: unreadable: {e}"))?
            .ok_or_else(|| format!("{name}: holds no snapshot"))?;
        let s: StoredSnapshot = serde_json::from_slice(&bytes).map_err(|e| format!("{name}: not a snapshot: {e}"))?;
        let sum = sha256_hex(&s.data);
        if sum != p.sha256 || s.meta.snapshot_id != p.meta.snapshot_id {
            return Err(format!(
                "{name}: snapshot {} fails its checksum (sha256 {sum}, recorded {})",
                p.meta.snapshot_id, p.sha256
            ));
        }
        Ok(s)
    }

    /// Writes a new latest snapshot (into the file not holding the latest one), then records it.
    pub fn save(&self, snap: &StoredSnapshot) -> Result<(), SE> {
        let old = self.pointers()?;
        let slot = old.first().map_or(0, |p| 1 - p.slot.min(1));
        let bytes = serde_json::to_vec(snap).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        // A slot whose file is damaged (it does not open, or a write to it fails) is made anew.
        if std::mem::take(&mut lock(&self.damaged)[slot]) {
            self.renew_slot(slot)
                .map_err(|e| StorageIOError::write_snapshot(Some(snap.meta.signature()), &std::io::Error::other(e)))?;
        }
        let written = match self.slot(slot) {
            Some(db) => Snapshots::write_slot(&db, &bytes),
            None => Err("cannot be opened".into()),
        };
        if let Err(first) = written {
            lock(&self.problems).push(format!("{}: {first}; set aside and written anew", SLOT_NAMES[slot]));
            self.renew_slot(slot)
                .and_then(|db| Snapshots::write_slot(&db, &bytes))
                .map_err(|e| StorageIOError::write_snapshot(Some(snap.meta.signature()), &std::io::Error::other(e)))?;
        }
        let mut pointers = vec![Pointer {
            slot,
            meta: snap.meta.clone(),
            sha256: sha256_hex(&snap.data),
        }];
        pointers.extend(old.into_iter().filter(|p| p.slot != slot).take(1));
        crate::store_meta::meta_put(&self.db, "snapshots", &pointers)?;
        crate::store_meta::meta_delete(&self.db, "snapshot")
    }

    /// The latest snapshot that verifies (what openraft replicates to a lagging member).
    pub fn latest(&self) -> Result<Option<StoredSnapshot>, SE> {
        for p in self.pointers()? {
            if let Ok(s) = self.read(&p) {
                return Ok(Some(s));
            }
        }
        // A store written before snapshots had files of their own keeps it in the log's database.
        crate::store_meta::meta_get::<StoredSnapshot>(&self.db, "snapshot")
    }

    /// The snapshot a member starts from: the latest that verifies and reaches the log (its last
    /// entry at or after the log's last purged one, so the log re-applies from there). What failed
    /// on the way is kept in [`Snapshots::problems`]. `Err` when snapshots were taken but none
    /// qualifies (the member cannot rebuild its state alone).
    pub fn for_start(&self, last_purged: Option<LogId<NodeId>>) -> Result<Option<StoredSnapshot>, String> {
        let pointers = self.pointers().map_err(|e| e.to_string())?;
        if pointers.is_empty() {
            return crate::store_meta::meta_get::<StoredSnapshot>(&self.db, "snapshot").map_err(|e| e.to_string());
        }
        let mut why = Vec::new();
        for p in &pointers {
            match self.read(p) {
                Ok(s) if s.meta.last_log_id >= last_purged => {
                    lock(&self.problems).extend(why);
                    return Ok(Some(s));
                }
                Ok(s) => why.push(format!(
                    "snapshot {} ends before the log's first kept entry (purged up to {:?})",
                    s.meta.snapshot_id,
                    last_purged.map(|l| l.index)
                )),
                Err(e) => why.push(e),
            }
        }
        lock(&self.problems).extend(why.iter().cloned());
        if last_purged.is_none() {
            // The whole log is still there: it rebuilds the state from its first entry.
            return Ok(None);
        }
        Err(why.join("; "))
    }

    /// Takes `snap` (a peer's, verified by the caller) as this member's latest snapshot.
    /// The slot it is written to is made anew first: this member's own snapshots failed.
    pub fn adopt(&self, snap: &StoredSnapshot) -> Result<(), SE> {
        *lock(&self.damaged) = [true; 2];
        self.save(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(index: u64) -> StoredSnapshot {
        StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index)),
                last_membership: Default::default(),
                snapshot_id: format!("1-{index}"),
            },
            data: format!("{{\"state at\": {index}}}").into_bytes(),
        }
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lattice-snapshots-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The member's store as it restarts: the log's database and its snapshot files, reopened.
    fn reopen(dir: &std::path::Path) -> Snapshots {
        let disk = Disk::Dir(dir.to_path_buf());
        let db = disk.database("quorum.redb").unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(crate::store_meta::META).unwrap();
        tx.commit().unwrap();
        Snapshots::new(disk, Arc::new(db))
    }

    fn damage(file: &std::path::Path) {
        let mut bytes = std::fs::read(file).unwrap();
        let n = bytes.len();
        bytes[n / 4..3 * n / 4].fill(0x5a);
        std::fs::write(file, bytes).unwrap();
    }

    fn id(s: &Option<StoredSnapshot>) -> Option<String> {
        s.as_ref().map(|s| s.meta.snapshot_id.clone())
    }

    /// The latest snapshot damaged: the previous one is taken, if the log reaches back to it.
    #[test]
    fn a_damaged_latest_snapshot_falls_back_to_the_previous_one() {
        let dir = scratch("fallback");
        {
            let s = reopen(&dir);
            for i in [10, 20, 30] {
                s.save(&snap(i)).unwrap();
            }
            assert_eq!(id(&s.latest().unwrap()), Some("1-30".into()));
        }
        // 30 went to slot a (10 to a, 20 to b, 30 to a again).
        damage(&dir.join("snapshot-a.redb"));
        let s = reopen(&dir);
        let purged = |i| Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), i));
        assert_eq!(id(&s.for_start(purged(15)).unwrap()), Some("1-20".into()));
        assert!(!s.problems.lock().unwrap().is_empty());
        // The log purged past the previous snapshot: neither will do.
        let err = s.for_start(purged(25)).err().unwrap();
        assert!(err.contains("snapshot-a.redb") && err.contains("1-20"), "{err}");
        // A new snapshot goes to the damaged file, made anew, and is the latest again.
        s.save(&snap(40)).unwrap();
        drop(s);
        let s = reopen(&dir);
        assert_eq!(id(&s.for_start(purged(25)).unwrap()), Some("1-40".into()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Both damaged: with the whole log there the state re-applies from its start; else the caller
    /// needs a peer's, which [`Snapshots::adopt`] takes.
    #[test]
    fn with_both_damaged_only_the_whole_log_or_a_peer_will_do() {
        let dir = scratch("both");
        {
            let s = reopen(&dir);
            s.save(&snap(10)).unwrap();
            s.save(&snap(20)).unwrap();
        }
        damage(&dir.join("snapshot-a.redb"));
        damage(&dir.join("snapshot-b.redb"));
        let s = reopen(&dir);
        assert_eq!(id(&s.for_start(None).unwrap()), None);
        let purged = Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), 5));
        assert!(s.for_start(purged).is_err());
        s.adopt(&snap(25)).unwrap();
        drop(s);
        let s = reopen(&dir);
        assert_eq!(id(&s.for_start(purged).unwrap()), Some("1-25".into()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A checksum that does not match is caught even where the file itself reads well.
    #[test]
    fn a_snapshot_whose_checksum_differs_is_not_taken() {
        let dir = scratch("sum");
        let s = reopen(&dir);
        s.save(&snap(10)).unwrap();
        s.save(&snap(20)).unwrap();
        // Rewrite slot b (holding 20) with other data under the same id.
        let mut other = snap(20);
        other.data = b"{\"state at\": 999}".to_vec();
        Snapshots::write_slot(&s.slot(1).unwrap(), &serde_json::to_vec(&other).unwrap()).unwrap();
        assert_eq!(id(&s.for_start(None).unwrap()), Some("1-10".into()));
        let p = s.problems.lock().unwrap().join("; ");
        assert!(p.contains("fails its checksum"), "{p}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
