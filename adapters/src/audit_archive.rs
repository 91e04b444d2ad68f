//! The audit log's cold tier as the quorum records it: which entries left the replicated state for
//! the S3 archive, in which object, with which checksum. The quorum keeps the hot window in memory
//! and, for everything older, a manifest of [`ArchivedSegment`]s — contiguous runs of the chain, each
//! one write-once object — and the [`Anchor`] its held log starts from, so the chain verifies
//! across both: each segment from the hash before it to its last entry's hash, and the held log
//! from the last segment's end.
//!
//! A member moves entries out in two steps: it writes the object, then proposes
//! `QuorumCommand::AuditArchived` naming it; only when that applies do the entries leave the state
//! (`QuorumState::archive_cut` and its apply, in [`crate::quorum_state`]), on every member at the
//! same log index. A proposal that no longer fits the log's start (another leader archived first)
//! is rejected and changes nothing.

use lattice_engine::audit::{Anchor, AuditEntry};
use serde::{Deserialize, Serialize};

/// One archived run of the chain: entries `first_seq..=last_seq`, JSON lines in object `key`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedSegment {
    pub key: String,
    pub first_seq: u64,
    pub last_seq: u64,
    pub first_at_ms: u64,
    pub last_at_ms: u64,
    /// The hash of the entry before `first_seq` (empty at the chain's start).
    pub prev: String,
    /// The hash of entry `last_seq`: where the next segment (or the held log) goes on.
    pub last_hash: String,
    /// SHA-256 of the object's bytes.
    pub sha256: String,
}

impl ArchivedSegment {
    /// The segment holding `entries` (a non-empty, contiguous run of the chain) as `bytes` at `key`.
    pub fn of(key: &str, entries: &[AuditEntry], bytes: &[u8]) -> Option<ArchivedSegment> {
        let (first, last) = (entries.first()?, entries.last()?);
        Some(ArchivedSegment {
            key: key.to_string(),
            first_seq: first.seq,
            last_seq: last.seq,
            first_at_ms: first.at_ms,
            last_at_ms: entries.iter().map(|e| e.at_ms).max().unwrap_or(last.at_ms),
            prev: first.prev.clone(),
            last_hash: last.hash.clone(),
            sha256: crate::snapshots::sha256_hex(bytes),
        })
    }

    /// Whether any of its entries may fall in `[since, until)` (by its time span).
    pub fn overlaps(&self, since: Option<u64>, until: Option<u64>) -> bool {
        since.is_none_or(|s| self.last_at_ms >= s) && until.is_none_or(|u| self.first_at_ms < u)
    }
}

/// The object's bytes for `entries`: one JSON entry per line.
pub fn encode(entries: &[AuditEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        out.extend(serde_json::to_vec(e).expect("an audit entry serializes"));
        out.push(b'\n');
    }
    out
}

/// Reads an archived object back and checks it against its manifest record: the checksum, every
/// entry's hash and signature, the chain from `prev` to `last_hash`. The error names the object
/// and the first thing that fails.
pub fn decode(seg: &ArchivedSegment, bytes: &[u8]) -> Result<Vec<AuditEntry>, String> {
    let sha = crate::snapshots::sha256_hex(bytes);
    if sha != seg.sha256 {
        return Err(format!(
            "{}: its SHA-256 is {sha}, the quorum recorded {} (the object was changed)",
            seg.key, seg.sha256
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8: {e}", seg.key))?;
    let entries = text
        .lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str::<AuditEntry>(l).map_err(|e| format!("{}: line {}: {e}", seg.key, i + 1)))
        .collect::<Result<Vec<_>, _>>()?;
    let anchor = Anchor {
        seq: seg.first_seq,
        prev: seg.prev.clone(),
    };
    lattice_engine::audit::verify_from(&entries, &anchor)
        .map_err(|seq| format!("{}: the chain breaks at entry {seq}", seg.key))?;
    match entries.last() {
        Some(l) if l.seq == seg.last_seq && l.hash == seg.last_hash => Ok(entries),
        _ => Err(format!(
            "{}: does not end at entry {} as the quorum recorded",
            seg.key, seg.last_seq
        )),
    }
}

/// Checks that `segments` (the manifest, in order) chain one to the next and to the held log's
/// anchor: `Err` names the first segment out of place.
pub fn check_manifest(segments: &[ArchivedSegment], base: &Anchor) -> Result<(), String> {
    let mut at = Anchor::default();
    for s in segments {
        if s.first_seq != at.seq || s.prev != at.prev || s.last_seq < s.first_seq {
            return Err(format!("{}: does not follow entry {} of the chain", s.key, at.seq));
        }
        at = Anchor {
            seq: s.last_seq + 1,
            prev: s.last_hash.clone(),
        };
    }
    if &at != base {
        return Err(format!(
            "the held log starts at entry {}, the archive ends before entry {}",
            base.seq, at.seq
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(n: u64) -> Vec<AuditEntry> {
        let mut l = Vec::new();
        for i in 0..n {
            lattice_engine::audit::append(&mut l, 1000 + i, "dr-x", "a-1", "claim", "n1");
        }
        l
    }

    #[test]
    fn segments_chain_to_each_other_and_to_the_held_log() {
        let l = log(7);
        let a = ArchivedSegment::of("k/0", &l[..3], &encode(&l[..3])).unwrap();
        let b = ArchivedSegment::of("k/1", &l[3..5], &encode(&l[3..5])).unwrap();
        assert_eq!(decode(&b, &encode(&l[3..5])).unwrap(), l[3..5].to_vec());
        assert_eq!(check_manifest(&[a.clone(), b.clone()], &Anchor::after(&l[4])), Ok(()));
        assert!(
            check_manifest(std::slice::from_ref(&b), &Anchor::after(&l[4]))
                .unwrap_err()
                .contains("k/1")
        );
        assert!(check_manifest(&[a, b], &Anchor::after(&l[5])).is_err());
        assert!(ArchivedSegment::of("k", &[], b"").is_none());
    }

    #[test]
    fn a_changed_object_is_named() {
        let l = log(5);
        let mut bytes = encode(&l);
        let seg = ArchivedSegment::of("k/0", &l, &bytes).unwrap();
        assert_eq!(decode(&seg, &bytes).unwrap().len(), 5);
        let text = String::from_utf8(bytes.clone()).unwrap().replace("dr-x", "dr-y");
        let err = decode(&seg, text.as_bytes()).unwrap_err();
        assert!(err.contains("k/0") && err.contains("SHA-256"), "{err}");
        // A forged record (its checksum made to match) still breaks the chain.
        let mut forged = seg.clone();
        forged.sha256 = crate::snapshots::sha256_hex(text.as_bytes());
        assert!(
            decode(&forged, text.as_bytes())
                .unwrap_err()
                .contains("breaks at entry 0")
        );
        bytes.truncate(bytes.len() / 2);
        assert!(decode(&seg, &bytes).is_err());
    }
}
