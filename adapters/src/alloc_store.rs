//! The control plane's durable record of the allocations it acknowledged (`DATA_DIR/allocations.redb`),
//! the equivalent of Slurm's StateSaveLocation. Queues stay out of Raft (the seed's ADR), but a
//! submission is only acknowledged once it is on disk here (and, with several members, in a majority
//! of the members' copies), so it survives any restart of one member or of the whole quorum.
//!
//! The store is deliberately dumb: numbered records of opaque bytes (the runtime's JSON) plus a few
//! named values, changed in batches. [`Writer`] batches concurrent callers into one durable redb
//! transaction (group commit: one `fsync` for everything queued while the previous commit ran), so a
//! burst of submissions costs a few fsyncs, not one each.

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::BTreeMap;
use std::path::Path;

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("allocations");
const NAMED: TableDefinition<&str, &[u8]> = TableDefinition::new("named");

/// One change of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Writes (or replaces) record `n`.
    Put(u64, Vec<u8>),
    /// Removes record `n` (absent is fine).
    Delete(u64),
    /// Writes (or replaces) a named value.
    Named(String, Vec<u8>),
}

/// What a store holds: the records by number and the named values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Contents {
    pub records: BTreeMap<u64, Vec<u8>>,
    pub named: BTreeMap<String, Vec<u8>>,
}

/// The database file in a member's data directory.
pub struct AllocStore {
    db: Database,
}

fn io(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("allocation store: {e}"))
}

impl AllocStore {
    /// Opens (or creates) `dir/allocations.redb`.
    pub fn open(dir: &Path) -> std::io::Result<AllocStore> {
        AllocStore::open_on(&crate::disk::Disk::Dir(dir.to_path_buf()))
    }

    /// Opens (or creates) `allocations.redb` on `disk`.
    pub fn open_on(disk: &crate::disk::Disk) -> std::io::Result<AllocStore> {
        let db = disk.database("allocations.redb")?;
        let tx = db.begin_write().map_err(io)?;
        tx.open_table(RECORDS).map_err(io)?;
        tx.open_table(NAMED).map_err(io)?;
        tx.commit().map_err(io)?;
        Ok(AllocStore { db })
    }

    /// Applies `changes` in one transaction, durable (fsynced) when this returns.
    pub fn commit(&self, changes: &[Change]) -> std::io::Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let tx = self.db.begin_write().map_err(io)?;
        {
            let mut records = tx.open_table(RECORDS).map_err(io)?;
            let mut named = tx.open_table(NAMED).map_err(io)?;
            for c in changes {
                match c {
                    Change::Put(n, v) => {
                        records.insert(*n, v.as_slice()).map_err(io)?;
                    }
                    Change::Delete(n) => {
                        records.remove(*n).map_err(io)?;
                    }
                    Change::Named(k, v) => {
                        named.insert(k.as_str(), v.as_slice()).map_err(io)?;
                    }
                }
            }
        }
        tx.commit().map_err(io)
    }

    /// Everything the store holds.
    pub fn load(&self) -> std::io::Result<Contents> {
        let tx = self.db.begin_read().map_err(io)?;
        let mut out = Contents::default();
        for row in tx.open_table(RECORDS).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.records.insert(k.value(), v.value().to_vec());
        }
        for row in tx.open_table(NAMED).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            out.named.insert(k.value().to_string(), v.value().to_vec());
        }
        Ok(out)
    }
}

type Reply = tokio::sync::oneshot::Sender<Result<(), String>>;

/// Group commit over an [`AllocStore`]: a thread of its own applies every batch queued while the
/// previous commit ran in one transaction. Batches are applied in the order they were queued.
/// [`Writer::inline`] commits each batch in the caller instead (no thread: a deterministic
/// simulation runs every member on one thread). Dropping the writer waits for its thread to
/// finish what is queued and close the store, so the store can be opened again at once.
pub struct Writer {
    to: WriterTo,
}

enum WriterTo {
    Thread {
        tx: Option<std::sync::mpsc::Sender<(Vec<Change>, Reply)>>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
    Inline(AllocStore),
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let WriterTo::Thread { tx, thread } = &mut self.to {
            drop(tx.take());
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// A queued batch; resolves once it is durable (or the store failed).
pub struct Pending(tokio::sync::oneshot::Receiver<Result<(), String>>);

impl Pending {
    /// Waits until the batch is on disk.
    pub async fn durable(self) -> Result<(), String> {
        self.0
            .await
            .unwrap_or_else(|_| Err("allocation store: the writer stopped".into()))
    }
}

impl Writer {
    /// Starts the writer thread; it ends (closing the store) when the `Writer` is dropped.
    pub fn start(store: AllocStore) -> Writer {
        let (tx, rx) = std::sync::mpsc::channel::<(Vec<Change>, Reply)>();
        let thread = std::thread::Builder::new()
            .name("alloc-store".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut batch = vec![first];
                    while let Ok(more) = rx.try_recv() {
                        batch.push(more);
                        if batch.len() >= 1024 {
                            break;
                        }
                    }
                    let changes: Vec<Change> = batch.iter().flat_map(|(c, _)| c.iter().cloned()).collect();
                    let r = store.commit(&changes).map_err(|e| e.to_string());
                    for (_, reply) in batch {
                        let _ = reply.send(r.clone());
                    }
                }
            })
            .expect("spawning the allocation store's writer");
        Writer {
            to: WriterTo::Thread {
                tx: Some(tx),
                thread: Some(thread),
            },
        }
    }

    /// A writer that commits each batch when it is queued, in the caller.
    pub fn inline(store: AllocStore) -> Writer {
        Writer {
            to: WriterTo::Inline(store),
        }
    }

    /// Queues `changes` (call in the order they must apply); await the result for durability.
    pub fn queue(&self, changes: Vec<Change>) -> Pending {
        let (reply, rx) = tokio::sync::oneshot::channel();
        match &self.to {
            WriterTo::Thread { tx, .. } => {
                let sent = match tx {
                    Some(tx) => tx.send((changes, reply)).map_err(|e| (e.0).1),
                    None => Err(reply),
                };
                if let Err(reply) = sent {
                    let _ = reply.send(Err("allocation store: the writer stopped".into()));
                }
            }
            WriterTo::Inline(store) => {
                let _ = reply.send(store.commit(&changes).map_err(|e| e.to_string()));
            }
        }
        Pending(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_survive_reopening_and_apply_in_order() {
        let dir = std::env::temp_dir().join(format!("lattice-alloc-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let s = AllocStore::open(&dir).unwrap();
            s.commit(&[
                Change::Put(1, b"a".to_vec()),
                Change::Put(2, b"b".to_vec()),
                Change::Named("max".into(), b"2".to_vec()),
            ])
            .unwrap();
            s.commit(&[Change::Delete(1), Change::Put(2, b"B".to_vec())]).unwrap();
        }
        let s = AllocStore::open(&dir).unwrap();
        let c = s.load().unwrap();
        assert_eq!(c.records, BTreeMap::from([(2, b"B".to_vec())]));
        assert_eq!(c.named["max"], b"2");
        // Through the group-commit writer, from many tasks at once: every batch lands.
        let w = Writer::start(s);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let pending: Vec<Pending> = (10..60).map(|n| w.queue(vec![Change::Put(n, vec![n as u8])])).collect();
            for p in pending {
                p.durable().await.unwrap();
            }
        });
        drop(w);
        // Dropping the writer closes the store: the file reopens at once with all 51 records.
        let mut s = AllocStore::open(&dir).unwrap();
        assert_eq!(s.load().unwrap().records.len(), 51);
        // What is queued when the writer is dropped is written before the store closes.
        for round in 0..20u64 {
            let w = Writer::start(s);
            let _unawaited = w.queue(vec![Change::Put(100 + round, vec![1])]);
            drop(w);
            s = AllocStore::open(&dir).unwrap();
        }
        assert_eq!(s.load().unwrap().records.len(), 71);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
