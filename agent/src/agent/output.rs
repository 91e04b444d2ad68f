//! Allocations' output: flushed to the log store, read for the live tail of followed allocations, and
//! the newest part of it kept with an exit report.

use super::config::AgentConfig;
use crate::runner;
use lattice_node_adapters::logstore::Stream;

/// Live tail: the most output sent with one poll, per allocation.
pub const TAIL_BYTES_PER_POLL: u64 = 256 * 1024;
/// Live tail: how much of the past a new follower gets first.
pub const TAIL_REPLAY: u64 = 64 * 1024;

/// Flushes a process's stdout and stderr to the log store (errors are reported, never fatal: the log
/// files stay).
pub(super) fn flush_log(cfg: &AgentConfig, rec: &runner::Record) {
    let Some(store) = &cfg.log_store else { return };
    for stream in Stream::BOTH {
        let src = lattice_node_adapters::logstore::Source {
            tenant: &rec.tenant,
            project: rec.project.as_deref(),
            alloc: &rec.id,
            node: &cfg.node,
            stream,
        };
        if let Err(e) = store.flush(&src, &stream_log(rec, stream), runner::wall_ms()) {
            eprintln!("lattice-agent {}: log store: {e}", cfg.node);
        }
    }
}

/// The file a process's `stream` goes to.
fn stream_log(rec: &runner::Record, stream: Stream) -> std::path::PathBuf {
    match stream {
        Stream::Stdout => rec.log.clone(),
        Stream::Stderr => rec.err_log(),
    }
}

/// The output of `stream` after `from` (a new follower: the newest [`TAIL_REPLAY`] bytes), at most
/// [`TAIL_BYTES_PER_POLL`].
pub(super) fn new_output(
    (id, stream): (&str, Stream),
    rec: &runner::Record,
    from: Option<u64>,
) -> Option<crate::client::Output> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(stream_log(rec, stream)).ok()?;
    let len = f.metadata().ok()?.len();
    let offset = from.unwrap_or(len.saturating_sub(TAIL_REPLAY)).min(len);
    let n = (len - offset).min(TAIL_BYTES_PER_POLL);
    let mut buf = vec![0u8; n as usize];
    f.seek(SeekFrom::Start(offset)).ok()?;
    f.read_exact(&mut buf).ok()?;
    Some(crate::client::Output {
        id: id.to_string(),
        stream,
        offset,
        next: offset + n,
        data: String::from_utf8_lossy(&buf).into_owned(),
    })
}

/// The newest 64 KiB of an output, as text (invalid UTF-8 replaced).
pub(super) fn tail_of(out: &[u8]) -> String {
    let from = out.len().saturating_sub(64 * 1024);
    String::from_utf8_lossy(&out[from..]).into_owned()
}
