//! A bounded delivery queue that spills to disk: the accounting buffer of the book's "Failure
//! Handling" (Accounting). Events wait in memory (up to `mem_cap`); once memory is full, later
//! events are appended to a write-ahead log (`events.wal`, one JSON document per line) until it
//! holds `disk_max`; past that they are dropped and counted. Delivery is in order: while the log
//! holds events, new ones go behind them on disk, and the log is read back into memory only when
//! memory has drained.
//!
//! The log's cursor (`events.cursor`, the offset of the first undelivered byte) moves only when a
//! delivery is acknowledged ([`Spool::ack`]), so a process that dies between reading and delivering
//! delivers those events again when it reopens the log: delivery is at least once, and the receiver
//! tells repeats apart by each event's idempotency key. A torn last line (a crash mid-append) and an
//! unreadable one are skipped and counted ([`Spool::unreadable`]), never fatal. The log is emptied
//! once everything in it is delivered.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const WAL: &str = "events.wal";
const CURSOR: &str = "events.cursor";

/// Where [`Spool::push`] put an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    Memory,
    Disk,
    /// Memory and disk were full: the event is lost (and counted).
    Dropped,
}

pub struct Spool<T> {
    /// Waiting events, oldest first, each with the log offset just past it when it was read back
    /// from the log.
    mem: VecDeque<(T, Option<u64>)>,
    mem_cap: usize,
    /// The log's folder (`None`: no disk buffer; overflow is dropped).
    dir: Option<PathBuf>,
    /// The log's length in bytes.
    wal_len: u64,
    /// The next byte not yet read back into memory.
    read_off: u64,
    /// The cursor: everything before it was delivered.
    acked_off: u64,
    /// Unreadable lines at the end of the last read: the cursor passes them once memory drains.
    skip_to: u64,
    /// Events in the log not yet delivered (read back or not).
    on_disk: u64,
    /// Events in the log not yet read back.
    unloaded: u64,
    disk_max: u64,
    dropped: u64,
    unreadable: u64,
}

fn read_cursor(p: &Path) -> std::io::Result<u64> {
    match std::fs::read_to_string(p) {
        Ok(s) => Ok(s.trim().parse().unwrap_or(0)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

impl<T: Serialize + DeserializeOwned + Clone> Spool<T> {
    /// A spool with `mem_cap` events in memory and, with `dir`, up to `disk_max` more in its log
    /// there (created if absent; an existing log's undelivered events come first).
    pub fn open(dir: Option<&Path>, mem_cap: usize, disk_max: u64) -> std::io::Result<Spool<T>> {
        let mut s = Spool {
            mem: VecDeque::new(),
            mem_cap: mem_cap.max(1),
            dir: dir.map(Path::to_path_buf),
            wal_len: 0,
            read_off: 0,
            acked_off: 0,
            skip_to: 0,
            on_disk: 0,
            unloaded: 0,
            disk_max,
            dropped: 0,
            unreadable: 0,
        };
        let Some(dir) = dir else { return Ok(s) };
        std::fs::create_dir_all(dir)?;
        let wal = dir.join(WAL);
        let f = OpenOptions::new().create(true).append(true).read(true).open(&wal)?;
        let len = f.metadata()?.len();
        let cursor = read_cursor(&dir.join(CURSOR))?.min(len);
        // Count the complete lines after the cursor; a torn last line (no newline) is cut off.
        let mut r = BufReader::new(&f);
        r.seek(SeekFrom::Start(cursor))?;
        let (mut off, mut lines, mut buf) = (cursor, 0u64, Vec::new());
        loop {
            buf.clear();
            let n = r.read_until(b'\n', &mut buf)? as u64;
            if n == 0 || buf.last() != Some(&b'\n') {
                break;
            }
            off += n;
            lines += 1;
        }
        if off < len {
            f.set_len(off)?;
            s.unreadable += 1;
        }
        s.wal_len = off;
        s.read_off = cursor;
        s.acked_off = cursor;
        s.on_disk = lines;
        s.unloaded = lines;
        Ok(s)
    }

    /// Queues one event behind every waiting one.
    pub fn push(&mut self, ev: T) -> std::io::Result<Placed> {
        Ok(self.push_all(std::iter::once(ev))?[0])
    }

    /// Queues events in order (one `fsync` of the log for all of them).
    pub fn push_all(&mut self, evs: impl IntoIterator<Item = T>) -> std::io::Result<Vec<Placed>> {
        let mut placed = Vec::new();
        let mut lines = Vec::new();
        for ev in evs {
            if self.unloaded == 0 && lines.is_empty() && self.mem.len() < self.mem_cap {
                self.mem.push_back((ev, None));
                placed.push(Placed::Memory);
            } else if self.dir.is_some() && self.on_disk < self.disk_max {
                let mut line = serde_json::to_vec(&ev).map_err(std::io::Error::other)?;
                line.push(b'\n');
                lines.extend_from_slice(&line);
                self.on_disk += 1;
                self.unloaded += 1;
                placed.push(Placed::Disk);
            } else {
                self.dropped += 1;
                placed.push(Placed::Dropped);
            }
        }
        if !lines.is_empty() {
            let mut f = OpenOptions::new().append(true).open(self.wal_path())?;
            f.write_all(&lines)?;
            f.sync_data()?;
            self.wal_len += lines.len() as u64;
        }
        Ok(placed)
    }

    fn wal_path(&self) -> PathBuf {
        self.dir.as_deref().unwrap_or(Path::new(".")).join(WAL)
    }

    /// The oldest `n` waiting events (reading the log back once memory has drained), still queued.
    pub fn peek(&mut self, n: usize) -> std::io::Result<Vec<T>> {
        if self.mem.is_empty() && self.unloaded > 0 {
            self.load()?;
        }
        Ok(self.mem.iter().take(n).map(|(e, _)| e.clone()).collect())
    }

    /// Reads up to `mem_cap` events back from the log.
    fn load(&mut self) -> std::io::Result<()> {
        let f = File::open(self.wal_path())?;
        let mut r = BufReader::new(f);
        r.seek(SeekFrom::Start(self.read_off))?;
        let mut buf = Vec::new();
        while self.mem.len() < self.mem_cap && self.read_off < self.wal_len {
            buf.clear();
            let n = r.read_until(b'\n', &mut buf)? as u64;
            if n == 0 {
                break;
            }
            self.read_off += n;
            self.unloaded = self.unloaded.saturating_sub(1);
            match serde_json::from_slice::<T>(&buf) {
                Ok(ev) => self.mem.push_back((ev, Some(self.read_off))),
                Err(_) => {
                    // Not an event: skipped (counted); the cursor passes it with the next delivery.
                    self.unreadable += 1;
                    self.on_disk = self.on_disk.saturating_sub(1);
                    self.skip_to = self.read_off;
                }
            }
        }
        if self.mem.is_empty() {
            self.advance(self.skip_to)?;
        }
        Ok(())
    }

    /// The oldest `n` events were delivered: they leave the queue (and the log, durably).
    pub fn ack(&mut self, n: usize) -> std::io::Result<()> {
        let mut cursor = None;
        for _ in 0..n {
            let Some((_, off)) = self.mem.pop_front() else { break };
            if let Some(o) = off {
                self.on_disk = self.on_disk.saturating_sub(1);
                cursor = Some(o);
            }
        }
        let mut to = cursor.unwrap_or(self.acked_off);
        if self.mem.is_empty() {
            to = to.max(self.skip_to);
        }
        self.advance(to)
    }

    /// Moves the cursor to `to` (durably); empties the log once all of it is delivered.
    fn advance(&mut self, to: u64) -> std::io::Result<()> {
        let Some(dir) = self.dir.clone() else { return Ok(()) };
        if to <= self.acked_off {
            return Ok(());
        }
        self.acked_off = to;
        if self.mem.is_empty() && self.unloaded == 0 && to >= self.wal_len {
            // Everything in the log is delivered: start it again (cursor first, so a crash between
            // the two never replays a delivered log from 0 past a newer cursor).
            write_cursor(&dir, 0)?;
            OpenOptions::new().write(true).open(dir.join(WAL))?.set_len(0)?;
            (self.wal_len, self.read_off, self.acked_off, self.skip_to, self.on_disk) = (0, 0, 0, 0, 0);
            return Ok(());
        }
        write_cursor(&dir, to)
    }

    /// Events waiting in memory (read back from the log or not).
    pub fn in_memory(&self) -> usize {
        self.mem.len()
    }

    /// Events in the log not yet delivered.
    pub fn on_disk(&self) -> u64 {
        self.on_disk
    }

    /// Waiting events: in memory, plus those in the log not read back yet.
    pub fn waiting(&self) -> u64 {
        self.mem.len() as u64 + self.unloaded
    }

    /// Events dropped because memory and disk were full (since this spool was opened).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Log lines that could not be read back (a torn or corrupted line), skipped.
    pub fn unreadable(&self) -> u64 {
        self.unreadable
    }
}

fn write_cursor(dir: &Path, to: u64) -> std::io::Result<()> {
    let tmp = dir.join(format!("{CURSOR}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(to.to_string().as_bytes())?;
    f.sync_data()?;
    std::fs::rename(&tmp, dir.join(CURSOR))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lattice-spool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Takes everything, `batch` at a time, acknowledging each batch.
    fn drain(s: &mut Spool<u32>, batch: usize) -> Vec<u32> {
        let mut out = Vec::new();
        loop {
            let b = s.peek(batch).unwrap();
            if b.is_empty() {
                return out;
            }
            s.ack(b.len()).unwrap();
            out.extend(b);
        }
    }

    #[test]
    fn overflow_spills_to_disk_in_order_and_drops_past_both() {
        let d = dir("order");
        let mut s: Spool<u32> = Spool::open(Some(&d), 3, 4).unwrap();
        let placed = s.push_all(0..9).unwrap();
        use Placed::*;
        assert_eq!(
            placed,
            [Memory, Memory, Memory, Disk, Disk, Disk, Disk, Dropped, Dropped]
        );
        assert_eq!((s.in_memory(), s.on_disk(), s.dropped()), (3, 4, 2));
        // Memory drains first; a new event while the log holds some goes behind them.
        assert_eq!(s.peek(2).unwrap(), [0, 1]);
        s.ack(2).unwrap();
        assert_eq!(s.peek(5).unwrap(), [2]);
        s.ack(1).unwrap();
        // Memory drained: the log is read back.
        assert_eq!(s.peek(5).unwrap(), [3, 4, 5]);
        s.ack(1).unwrap();
        assert_eq!(s.on_disk(), 3);
        assert_eq!(s.push(9).unwrap(), Disk);
        assert_eq!(drain(&mut s, 2), [4, 5, 6, 9]);
        assert_eq!((s.waiting(), s.on_disk()), (0, 0));
        // The delivered log was emptied.
        assert_eq!(std::fs::metadata(d.join(WAL)).unwrap().len(), 0);
        assert_eq!(s.push(10).unwrap(), Memory);
    }

    #[test]
    fn a_reopened_log_delivers_what_was_not_acknowledged() {
        let d = dir("reopen");
        let mut s: Spool<u32> = Spool::open(Some(&d), 2, 100).unwrap();
        s.push_all(0..7).unwrap();
        assert_eq!(s.peek(10).unwrap(), [0, 1]);
        s.ack(2).unwrap();
        // 2 and 3 read back and one of them delivered, then the process dies.
        assert_eq!(s.peek(10).unwrap(), [2, 3]);
        s.ack(1).unwrap();
        drop(s);
        // The memory part (none left) is gone; the log replays from the cursor: 3 again, then the rest.
        let mut s: Spool<u32> = Spool::open(Some(&d), 2, 100).unwrap();
        assert_eq!(s.on_disk(), 4);
        assert_eq!(drain(&mut s, 3), [3, 4, 5, 6]);
    }

    #[test]
    fn torn_and_corrupt_lines_are_skipped_and_counted() {
        let d = dir("torn");
        let mut s: Spool<u32> = Spool::open(Some(&d), 1, 100).unwrap();
        s.push_all([1, 2, 3]).unwrap();
        drop(s);
        let mut f = OpenOptions::new().append(true).open(d.join(WAL)).unwrap();
        f.write_all(b"oops\n4\n5").unwrap(); // an unreadable line, a good one, a torn one
        drop(f);
        let mut s: Spool<u32> = Spool::open(Some(&d), 1, 100).unwrap();
        assert_eq!(drain(&mut s, 1), [2, 3, 4]);
        assert_eq!(s.unreadable(), 2);
        assert_eq!(s.waiting(), 0);
        let s: Spool<u32> = Spool::open(Some(&d), 1, 100).unwrap();
        assert_eq!(s.waiting(), 0, "the cursor passed the bad line");
    }

    #[test]
    fn without_a_disk_overflow_is_dropped() {
        let mut s: Spool<u32> = Spool::open(None, 2, 100).unwrap();
        assert_eq!(s.push_all(0..3).unwrap()[2], Placed::Dropped);
        assert_eq!(drain(&mut s, 5), [0, 1]);
        assert_eq!(s.dropped(), 1);
    }
}
