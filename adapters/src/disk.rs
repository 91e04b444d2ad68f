//! Where a member's databases live: a data directory ([`Disk::Dir`], production), or a simulated disk
//! ([`SimDisk`], deterministic simulation testing) that keeps what was written apart from what was
//! synced, so a simulated power loss drops exactly the writes the store never `fsync`ed.
//!
//! The model: every write lands in the file's *current* image (what reads see, the page cache); a
//! `sync_data` (redb calls it at every durable commit) makes the current image the *durable* one.
//! A process crash keeps the current image (the kernel still has the writes); a power loss reverts
//! each file to its durable image. A crashed incarnation writes nothing more (not even the clean
//! shutdown its dropped database attempts). Torn pages are not modelled: a write is all or nothing.

use redb::{Database, StorageBackend};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Where a member keeps its databases.
#[derive(Clone, Debug)]
pub enum Disk {
    /// Files in this directory (created if missing).
    Dir(PathBuf),
    /// Files on a simulated disk.
    Sim(SimDisk),
}

impl Disk {
    /// Opens (or creates) the database `name` (e.g. `quorum.redb`).
    pub fn database(&self, name: &str) -> std::io::Result<Database> {
        match self {
            Disk::Dir(dir) => {
                std::fs::create_dir_all(dir)?;
                Database::create(dir.join(name)).map_err(std::io::Error::other)
            }
            Disk::Sim(d) => {
                let backend = d.open(name)?;
                let mut b = Database::builder();
                // Small: a simulation runs several members (and many seeds) in one process.
                b.set_cache_size(8 << 20);
                b.create_with_backend(backend).map_err(std::io::Error::other)
            }
        }
    }

    /// Sets the database `name` aside (a damaged file: renamed `NAME.damaged-N` in a directory,
    /// forgotten on a simulated disk) so that the next [`Disk::database`] makes it anew.
    pub fn set_aside(&self, name: &str) -> std::io::Result<()> {
        match self {
            Disk::Dir(dir) => {
                let from = dir.join(name);
                if !from.exists() {
                    return Ok(());
                }
                let mut n = 0;
                while dir.join(format!("{name}.damaged-{n}")).exists() {
                    n += 1;
                }
                std::fs::rename(from, dir.join(format!("{name}.damaged-{n}")))
            }
            Disk::Sim(d) => {
                lock(&d.files).remove(name);
                Ok(())
            }
        }
    }

    /// How to name it in errors.
    pub fn describe(&self) -> String {
        match self {
            Disk::Dir(d) => d.display().to_string(),
            Disk::Sim(_) => "(simulated disk)".into(),
        }
    }
}

/// Bytes per page for tracking what changed since the last sync.
const PAGE: usize = 4096;

#[derive(Debug, Default)]
struct SimFile {
    /// What reads see.
    current: Vec<u8>,
    /// What survives a power loss.
    durable: Vec<u8>,
    /// Pages of `current` that differ from `durable`.
    dirty: BTreeSet<usize>,
    /// A database has it open (reopening it twice would be a harness bug).
    open: bool,
    /// Bumped at each crash: a backend of an older incarnation writes nothing any more.
    incarnation: u64,
    syncs: u64,
}

/// A simulated disk shared by the incarnations of one member: files by name.
#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    files: Arc<Mutex<BTreeMap<String, Arc<Mutex<SimFile>>>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn open(&self, name: &str) -> std::io::Result<SimBackend> {
        let f = lock(&self.files).entry(name.to_string()).or_default().clone();
        let mut g = lock(&f);
        if g.open {
            return Err(std::io::Error::other(format!(
                "{name}: already open (the previous incarnation still holds it)"
            )));
        }
        g.open = true;
        let incarnation = g.incarnation;
        drop(g);
        Ok(SimBackend(f, incarnation))
    }

    /// The member's process died: whatever its databases still write (their clean shutdown when
    /// the simulation drops them) goes nowhere, and the files can be opened again.
    pub fn crash(&self) {
        for f in lock(&self.files).values() {
            let mut g = lock(f);
            g.incarnation += 1;
            g.open = false;
        }
    }

    /// A power loss: every file goes back to what was last synced. Only valid while nothing has the
    /// disk open (the member is down, after [`SimDisk::crash`]).
    pub fn lose_unsynced(&self) -> usize {
        let mut lost = 0;
        for f in lock(&self.files).values() {
            let mut g = lock(f);
            lost += g.dirty.len();
            g.current = g.durable.clone();
            g.dirty.clear();
        }
        lost
    }

    /// Whether any file is still open (a crashed member's store must be closed before it restarts).
    pub fn in_use(&self) -> Vec<String> {
        lock(&self.files)
            .iter()
            .filter(|(_, f)| lock(f).open)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// How many syncs the files saw in all.
    pub fn syncs(&self) -> u64 {
        lock(&self.files).values().map(|f| lock(f).syncs).sum()
    }
}

/// One open file of a [`SimDisk`] (redb's storage backend), of one incarnation of its member.
#[derive(Debug)]
struct SimBackend(Arc<Mutex<SimFile>>, u64);

impl SimBackend {
    /// The file, unless this backend's process has crashed since it opened it.
    fn live(&self) -> Option<std::sync::MutexGuard<'_, SimFile>> {
        let g = lock(&self.0);
        (g.incarnation == self.1).then_some(g)
    }
}

fn range_error(offset: u64, len: usize, size: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("simulated disk: {len} bytes at {offset} beyond the file's {size}"),
    )
}

impl StorageBackend for SimBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(lock(&self.0).current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let g = lock(&self.0);
        let o = offset as usize;
        let src = g
            .current
            .get(o..o + out.len())
            .ok_or_else(|| range_error(offset, out.len(), g.current.len()))?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let Some(mut g) = self.live() else { return Ok(()) };
        let len = len as usize;
        let old = g.current.len();
        g.current.resize(len, 0);
        let (a, b) = (old.min(len), old.max(len));
        for p in a / PAGE..b.div_ceil(PAGE) {
            g.dirty.insert(p);
        }
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let Some(mut g) = self.live() else { return Ok(()) };
        let g = &mut *g;
        g.durable.resize(g.current.len(), 0);
        for p in std::mem::take(&mut g.dirty) {
            let a = p * PAGE;
            if a >= g.current.len() {
                continue;
            }
            let b = (a + PAGE).min(g.current.len());
            g.durable[a..b].copy_from_slice(&g.current[a..b]);
        }
        g.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let Some(mut g) = self.live() else { return Ok(()) };
        let o = offset as usize;
        let size = g.current.len();
        let dst = g
            .current
            .get_mut(o..o + data.len())
            .ok_or_else(|| range_error(offset, data.len(), size))?;
        dst.copy_from_slice(data);
        for p in o / PAGE..(o + data.len()).div_ceil(PAGE) {
            g.dirty.insert(p);
        }
        Ok(())
    }

    fn close(&self) -> Result<(), std::io::Error> {
        if let Some(mut g) = self.live() {
            g.open = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const T: TableDefinition<u64, u64> = TableDefinition::new("t");

    fn put(db: &Database, k: u64, durable: bool) {
        let mut tx = db.begin_write().unwrap();
        if !durable {
            tx.set_durability(redb::Durability::None).unwrap();
        }
        tx.open_table(T).unwrap().insert(k, k * 10).unwrap();
        tx.commit().unwrap();
    }

    fn keys(db: &Database) -> Vec<u64> {
        let tx = db.begin_read().unwrap();
        let Ok(t) = tx.open_table(T) else { return vec![] };
        use redb::ReadableTable;
        t.iter().unwrap().map(|r| r.unwrap().0.value()).collect()
    }

    #[test]
    fn a_crash_or_a_power_loss_keeps_exactly_the_durable_commits() {
        let disk = SimDisk::new();
        let d = Disk::Sim(disk.clone());
        {
            let db = d.database("x.redb").unwrap();
            put(&db, 1, true);
            put(&db, 2, false);
            // Opened twice at once: refused, naming the file.
            let e = d.database("x.redb").unwrap_err().to_string();
            assert!(e.contains("x.redb") && e.contains("already open"), "{e}");
            disk.crash();
        }
        assert!(disk.in_use().is_empty());
        // A process crash: redb recovers to its last durable commit (a `Durability::None` commit
        // is only kept by the next durable one), whatever the page cache still had.
        assert_eq!(keys(&d.database("x.redb").unwrap()), [1]);
        {
            let db = d.database("x.redb").unwrap();
            put(&db, 3, false);
            put(&db, 4, true);
            put(&db, 5, false);
            disk.crash();
        }
        disk.lose_unsynced();
        // A power loss: the last durable commit (4) is there with everything before it; 5 is gone.
        assert_eq!(keys(&d.database("x.redb").unwrap()), [1, 3, 4]);
        assert!(disk.syncs() > 0);
    }

    #[test]
    fn a_power_loss_reverts_unsynced_writes_and_a_dead_incarnation_writes_nothing() {
        let disk = SimDisk::new();
        let f = disk.open("f").unwrap();
        f.set_len(3 * PAGE as u64).unwrap();
        f.write(10, b"synced").unwrap();
        f.sync_data().unwrap();
        f.write(PAGE as u64 + 1, b"lost").unwrap();
        f.write(10, b"SYNCED").unwrap();
        disk.crash();
        // The dead incarnation's late writes go nowhere.
        f.write(20, b"zombie").unwrap();
        assert_eq!(disk.lose_unsynced(), 2);
        let g = disk.open("f").unwrap();
        let mut buf = [0u8; 6];
        g.read(10, &mut buf).unwrap();
        assert_eq!(&buf, b"synced");
        g.read(PAGE as u64 + 1, &mut buf[..4]).unwrap();
        assert_eq!(&buf[..4], [0; 4]);
        g.read(20, &mut buf).unwrap();
        assert_eq!(buf, [0; 6]);
        let e = g.read(3 * PAGE as u64, &mut buf).unwrap_err().to_string();
        assert!(e.contains("beyond"), "{e}");
    }
}
