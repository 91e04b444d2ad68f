//! Session recordings of sensitive allocations' terminals (book: "Sensitive (reservation) | Claiming
//! user only | Session recorded, audit trail, signed uenv only"): every byte typed and every byte
//! shown, timed, in an [asciicast v2](https://docs.asciinema.org/manual/asciicast/v2/) file under
//! `DATA_DIR/recordings/` (replayable with `asciinema play`). The session's `attach` audit entry
//! names the recording; its `attach_end` entry names it again with its size and SHA-256, so the
//! file an auditor is handed can be checked against the signed log.

use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One session's recording (cloned handles write to the same file).
#[derive(Clone)]
pub struct Recording {
    inner: Arc<Mutex<Inner>>,
    /// Its name under the data directory (`recordings/ALLOC-MS-N.cast`).
    pub name: String,
}

struct Inner {
    file: Option<std::io::BufWriter<std::fs::File>>,
    path: PathBuf,
    t0: std::time::Instant,
}

/// What an ended recording is: its name, size and SHA-256 (hex).
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "recording={} bytes={} sha256={}", self.name, self.bytes, self.sha256)
    }
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Recording {
    /// Starts the recording of `user`'s session on `alloc`'s `node` (`rows`×`cols`), at `now_ms`.
    pub fn start(
        data_dir: &Path,
        alloc: &str,
        (user, node): (&str, &str),
        (rows, cols): (u16, u16),
        now_ms: u64,
    ) -> std::io::Result<Recording> {
        let dir = data_dir.join("recordings");
        std::fs::create_dir_all(&dir)?;
        let safe: String = alloc
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
            .collect();
        // A new file, never one already there (two sessions in one millisecond get their own).
        let mut n = 0u32;
        let (file, name) = loop {
            let name = format!("recordings/{safe}-{now_ms}-{n}.cast");
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(data_dir.join(&name))
            {
                Ok(f) => break (f, name),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e),
            }
        };
        let mut w = std::io::BufWriter::new(file);
        let header = serde_json::json!({
            "version": 2,
            "width": cols,
            "height": rows,
            "timestamp": now_ms / 1000,
            "title": format!("{alloc} on {node} by {user}"),
        });
        writeln!(w, "{header}")?;
        Ok(Recording {
            inner: Arc::new(Mutex::new(Inner {
                file: Some(w),
                path: data_dir.join(&name),
                t0: std::time::Instant::now(),
            })),
            name,
        })
    }

    fn event(&self, kind: &str, bytes: &[u8]) {
        let mut g = lock(&self.inner);
        let t = g.t0.elapsed().as_secs_f64();
        if let Some(w) = g.file.as_mut() {
            let line = serde_json::json!([(t * 1e6).round() / 1e6, kind, String::from_utf8_lossy(bytes)]);
            if let Err(e) = writeln!(w, "{line}") {
                tracing::error!("session recording: {e}");
            }
        }
    }

    /// Bytes the user typed.
    pub fn input(&self, bytes: &[u8]) {
        self.event("i", bytes);
    }

    /// Bytes the terminal showed.
    pub fn output(&self, bytes: &[u8]) {
        self.event("o", bytes);
    }

    /// Ends the recording (on disk, synced): what the `attach_end` entry names. A second call (a
    /// clone's) finds it ended and answers the same.
    pub fn finish(&self) -> std::io::Result<Recorded> {
        let mut g = lock(&self.inner);
        if let Some(w) = g.file.take() {
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
        }
        let bytes = std::fs::read(&g.path)?;
        Ok(Recorded {
            name: self.name.clone(),
            bytes: bytes.len() as u64,
            sha256: Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_is_asciicast_with_input_and_output_and_its_digest() {
        let dir = std::env::temp_dir().join(format!("lattice-recording-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let r = Recording::start(&dir, "a-000007", ("dr-x", "x1"), (24, 80), 1_700_000_000_123).unwrap();
        let again = Recording::start(&dir, "a-000007", ("dr-x", "x1"), (24, 80), 1_700_000_000_123).unwrap();
        assert_ne!(r.name, again.name, "a session of its own");
        r.input(b"ls\r");
        r.output(b"data.h5\r\n");
        let done = r.finish().unwrap();
        assert_eq!(r.finish().unwrap(), done);
        let text = std::fs::read_to_string(dir.join(&done.name)).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(
            (lines[0]["version"].as_u64(), lines[0]["width"].as_u64()),
            (Some(2), Some(80))
        );
        assert_eq!((lines[1][1].as_str(), lines[1][2].as_str()), (Some("i"), Some("ls\r")));
        assert_eq!(
            (lines[2][1].as_str(), lines[2][2].as_str()),
            (Some("o"), Some("data.h5\r\n"))
        );
        assert_eq!(done.bytes, text.len() as u64);
        assert!(
            done.to_string()
                .starts_with("recording=recordings/a-000007-1700000000123-0.cast bytes=")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
