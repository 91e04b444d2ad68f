//! The durable log store (book: "Logs", dual-path architecture: the S3 path). Node agents flush each
//! allocation's output periodically as zstd-compressed chunks, laid out as the seed's bucket —
//! `ROOT/{tenant}/{project}/{alloc}/logs/{stdout|stderr}/{node}/chunk_NNNNNN.log.zst` — with a
//! `metadata.json` per stream and node listing every chunk's byte offset, length and flush time (range
//! queries by offset or time read only the chunks they need). `ROOT` is a directory: local, or an S3
//! bucket mounted on the nodes and the control plane. stdout and stderr are kept apart (the seed's
//! layout; the agent writes a task's two streams to two files). Writes are atomic (temporary file,
//! then rename), so a reader never sees half a chunk, and a restarted agent continues after the last
//! chunk.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One flushed chunk.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Chunk {
    pub name: String,
    /// Offset of its first byte in the allocation's output on this node.
    pub offset: u64,
    /// Uncompressed length.
    pub bytes: u64,
    /// When it was flushed (ms since the epoch).
    pub flushed_ms: u64,
}

/// One of a process's two output streams (a wire type: `lattice-agent-protocol`).
pub use lattice_agent_protocol::Stream;
use lattice_util::fs::segment;

/// Whose output one stored stream is: an allocation's, on one node, one stream.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    pub tenant: &'a str,
    pub project: Option<&'a str>,
    pub alloc: &'a str,
    pub node: &'a str,
    pub stream: Stream,
}

/// `metadata.json` of one node's output (one stream).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Metadata {
    pub alloc: String,
    pub node: String,
    pub chunks: Vec<Chunk>,
}

impl Metadata {
    /// Bytes stored so far (the next chunk's offset).
    pub fn stored(&self) -> u64 {
        self.chunks.last().map_or(0, |c| c.offset + c.bytes)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    #[error("log store {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("log store {path}: {message}")]
    Corrupt { path: PathBuf, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogStoreError + '_ {
    move |source| LogStoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The store under `root`.
#[derive(Clone, Debug)]
pub struct LogStore {
    pub root: PathBuf,
    /// Largest uncompressed chunk (a flush of more writes several).
    pub chunk_bytes: usize,
}

impl LogStore {
    pub fn new(root: impl Into<PathBuf>) -> LogStore {
        LogStore {
            root: root.into(),
            chunk_bytes: 4 << 20,
        }
    }

    /// The allocation's `logs/` prefix.
    pub fn alloc_dir(&self, tenant: &str, project: Option<&str>, alloc: &str) -> PathBuf {
        self.root
            .join(segment(tenant))
            .join(segment(project.unwrap_or("default")))
            .join(segment(alloc))
            .join("logs")
    }

    fn node_dir(&self, src: &Source) -> PathBuf {
        self.alloc_dir(src.tenant, src.project, src.alloc)
            .join(src.stream.as_str())
            .join(segment(src.node))
    }

    /// A node's metadata for one stream (empty when nothing was flushed yet).
    pub fn metadata(&self, src: &Source) -> Result<Metadata, LogStoreError> {
        read_metadata(&self.node_dir(src))
    }

    /// Flushes what `log` holds beyond what is stored (at most [`LogStore::chunk_bytes`] per chunk);
    /// returns the bytes written. Called periodically and once more when the process ends.
    pub fn flush(&self, src: &Source, log: &Path, now_ms: u64) -> Result<u64, LogStoreError> {
        use std::io::{Read, Seek, SeekFrom};
        let dir = self.node_dir(src);
        let mut meta = read_metadata(&dir)?;
        meta.alloc = src.alloc.to_string();
        meta.node = src.node.to_string();
        // Only a regular file is read (the path may come from a corrupted agent state file: a FIFO
        // would block the open, a device would never end).
        match std::fs::metadata(log) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(io(log)(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a regular file",
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io(log)(e)),
        }
        let mut f = match std::fs::File::open(log) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io(log)(e)),
        };
        let len = f.metadata().map_err(io(log))?.len();
        let mut written = 0;
        while meta.stored() < len {
            let offset = meta.stored();
            let n = (len - offset).min(self.chunk_bytes as u64);
            let mut buf = vec![0u8; n as usize];
            f.seek(SeekFrom::Start(offset)).map_err(io(log))?;
            f.read_exact(&mut buf).map_err(io(log))?;
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            let name = format!("chunk_{:06}.log.zst", meta.chunks.len());
            let packed = zstd::encode_all(&buf[..], 3).map_err(io(log))?;
            atomic_write(&dir.join(&name), &packed)?;
            meta.chunks.push(Chunk {
                name,
                offset,
                bytes: n,
                flushed_ms: now_ms,
            });
            atomic_write(
                &dir.join("metadata.json"),
                &serde_json::to_vec_pretty(&meta).unwrap_or_default(),
            )?;
            written += n;
        }
        Ok(written)
    }

    /// Nodes with stored output (either stream) for the allocation.
    pub fn nodes(&self, tenant: &str, project: Option<&str>, alloc: &str) -> Vec<String> {
        let mut out: Vec<String> = Stream::BOTH
            .iter()
            .flat_map(|s| {
                let dir = self.alloc_dir(tenant, project, alloc).join(s.as_str());
                std::fs::read_dir(dir)
                    .map(|d| {
                        d.flatten()
                            .filter(|e| e.path().join("metadata.json").exists())
                            .filter_map(|e| e.file_name().to_str().map(str::to_string))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Up to `limit` bytes of a node's stored output from `offset`, decompressing only the chunks that
    /// overlap; with `since_ms`/`until_ms`, only chunks flushed in that window.
    pub fn read(&self, src: &Source, q: &Range) -> Result<Vec<u8>, LogStoreError> {
        let dir = self.node_dir(src);
        let meta = read_metadata(&dir)?;
        let end = q.offset.saturating_add(q.limit);
        let mut out = Vec::new();
        for c in &meta.chunks {
            if c.offset + c.bytes <= q.offset || c.offset >= end {
                continue;
            }
            if q.since_ms.is_some_and(|s| c.flushed_ms < s) || q.until_ms.is_some_and(|u| c.flushed_ms > u) {
                continue;
            }
            let path = dir.join(&c.name);
            let packed = std::fs::read(&path).map_err(io(&path))?;
            let raw = zstd::decode_all(&packed[..]).map_err(|e| LogStoreError::Corrupt {
                path: path.clone(),
                message: format!("zstd: {e}"),
            })?;
            if raw.len() as u64 != c.bytes {
                return Err(LogStoreError::Corrupt {
                    path,
                    message: format!("{} bytes, metadata says {}", raw.len(), c.bytes),
                });
            }
            let from = q.offset.saturating_sub(c.offset) as usize;
            let to = (end.min(c.offset + c.bytes) - c.offset) as usize;
            out.extend_from_slice(&raw[from..to]);
        }
        Ok(out)
    }
}

/// A historical query: byte range and optional flush-time window.
#[derive(Clone, Debug)]
pub struct Range {
    pub offset: u64,
    pub limit: u64,
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
}

impl Default for Range {
    fn default() -> Self {
        Range {
            offset: 0,
            limit: u64::MAX,
            since_ms: None,
            until_ms: None,
        }
    }
}

fn read_metadata(dir: &Path) -> Result<Metadata, LogStoreError> {
    let path = dir.join("metadata.json");
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| LogStoreError::Corrupt {
            path,
            message: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Metadata::default()),
        Err(e) => Err(io(&path)(e)),
    }
}

fn atomic_write(path: &Path, bytes: &[u8]) -> Result<(), LogStoreError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_in_chunks_and_reads_ranges_back() {
        let dir = std::env::temp_dir().join(format!("lattice-logstore-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("a.log");
        let mut store = LogStore::new(dir.join("bucket"));
        store.chunk_bytes = 1000;
        let text: String = (0..300).map(|i| format!("line {i:04}\n")).collect(); // 3,000 bytes
        std::fs::write(&log, &text[..2500]).unwrap();
        let src = Source {
            tenant: "physics",
            project: Some("climate"),
            alloc: "a-000001",
            node: "n1",
            stream: Stream::Stdout,
        };
        let errs = Source {
            stream: Stream::Stderr,
            ..src
        };
        assert_eq!(store.flush(&src, &log, 10).unwrap(), 2500);
        assert_eq!(store.flush(&src, &log, 20).unwrap(), 0, "nothing new");
        std::fs::write(&log, &text).unwrap();
        assert_eq!(store.flush(&src, &log, 30).unwrap(), 500);
        let m = store.metadata(&src).unwrap();
        let sizes: Vec<(u64, u64)> = m.chunks.iter().map(|c| (c.offset, c.bytes)).collect();
        assert_eq!(sizes, [(0, 1000), (1000, 1000), (2000, 500), (2500, 500)]);
        let chunk = dir.join("bucket/physics/climate/a-000001/logs/stdout/n1/chunk_000003.log.zst");
        assert!(chunk.exists());
        assert!(std::fs::metadata(&chunk).unwrap().len() < 500, "compressed");
        assert_eq!(store.nodes("physics", Some("climate"), "a-000001"), ["n1"]);
        let all = store.read(&src, &Range::default()).unwrap();
        assert_eq!(all, text.as_bytes());
        // The other stream is its own: empty until flushed, then only its bytes.
        assert!(store.read(&errs, &Range::default()).unwrap().is_empty());
        let err_log = dir.join("a.err");
        std::fs::write(&err_log, "oops\n").unwrap();
        assert_eq!(store.flush(&errs, &err_log, 30).unwrap(), 5);
        assert_eq!(store.read(&errs, &Range::default()).unwrap(), b"oops\n");
        assert_eq!(store.read(&src, &Range::default()).unwrap(), text.as_bytes());
        let on_n2 = Source { node: "n2", ..errs };
        store.flush(&on_n2, &err_log, 31).unwrap();
        assert_eq!(store.nodes("physics", Some("climate"), "a-000001"), ["n1", "n2"]);
        let mid = Range {
            offset: 995,
            limit: 20,
            ..Range::default()
        };
        assert_eq!(store.read(&src, &mid).unwrap(), &text.as_bytes()[995..1015]);
        let late = Range {
            since_ms: Some(25),
            ..Range::default()
        };
        assert_eq!(store.read(&src, &late).unwrap(), &text.as_bytes()[2500..]);
        // A damaged chunk is an error naming it, not wrong output.
        std::fs::write(&chunk, b"garbage").unwrap();
        let e = store.read(&src, &Range::default()).unwrap_err();
        assert!(e.to_string().contains("chunk_000003.log.zst"), "{e}");
        // Ids cannot climb out of the store.
        assert!(store.alloc_dir("../etc", None, "..").starts_with(dir.join("bucket")));
        let p = store.alloc_dir("../etc", None, "..");
        assert!(p.components().all(|c| c != std::path::Component::ParentDir), "{p:?}");
    }
}
