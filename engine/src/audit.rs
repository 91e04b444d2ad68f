//! The sensitive audit log's hash chain — one format for both worlds: the quorum's replicated state
//! (`lattice-adapters`) and the simulator's fake quorum append the same [`AuditEntry`] and verify it
//! the same way. Each entry carries the SHA-256 of the previous one (`prev`, empty for the first),
//! so an edit, insertion or removal anywhere breaks [`verify`].

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One audit entry (claim, release, wipe, quarantine); `hash` = SHA-256(prev ‖ the entry's fields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub seq: u64,
    /// When (ms: since the epoch in production, since the replay's start in a simulation).
    pub at_ms: u64,
    /// The user identity behind the claim.
    pub user: String,
    /// The claim's allocation id.
    pub alloc: String,
    /// claim | release | wipe | quarantine.
    pub action: String,
    /// The nodes concerned, comma-separated names.
    pub detail: String,
    pub prev: String,
    pub hash: String,
}

impl AuditEntry {
    /// The entry's hash: SHA-256 of `prev`, `seq` and `at_ms` (little-endian) and the
    /// length-prefixed text fields, so no two different entries hash the same bytes.
    pub fn digest(prev: &str, seq: u64, at_ms: u64, user: &str, alloc: &str, action: &str, detail: &str) -> String {
        let mut h = Sha256::new();
        h.update(prev.as_bytes());
        h.update(seq.to_le_bytes());
        h.update(at_ms.to_le_bytes());
        for part in [user, alloc, action, detail] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Appends an entry to `log`, chained to the last one.
pub fn append<'a>(
    log: &'a mut Vec<AuditEntry>,
    at_ms: u64,
    user: &str,
    alloc: &str,
    action: &str,
    detail: &str,
) -> &'a AuditEntry {
    let prev = log.last().map(|e| e.hash.clone()).unwrap_or_default();
    let seq = log.len() as u64;
    let hash = AuditEntry::digest(&prev, seq, at_ms, user, alloc, action, detail);
    log.push(AuditEntry {
        seq,
        at_ms,
        user: user.to_string(),
        alloc: alloc.to_string(),
        action: action.to_string(),
        detail: detail.to_string(),
        prev,
        hash,
    });
    log.last().expect("just pushed")
}

/// Re-derives every hash: `Err(seq)` names the first entry that does not chain.
pub fn verify(log: &[AuditEntry]) -> Result<(), u64> {
    let mut prev = String::new();
    for (i, e) in log.iter().enumerate() {
        let want = AuditEntry::digest(&prev, e.seq, e.at_ms, &e.user, &e.alloc, &e.action, &e.detail);
        if e.seq != i as u64 || e.prev != prev || e.hash != want {
            return Err(i as u64);
        }
        prev = e.hash.clone();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_verifies_and_detects_tampering() {
        let mut log = Vec::new();
        append(&mut log, 0, "dr-x", "c1", "claim", "n1,n2");
        append(&mut log, 10, "dr-x", "c1", "release", "n1,n2");
        append(&mut log, 20, "dr-x", "c1", "wipe", "n1,n2");
        assert_eq!(verify(&log), Ok(()));
        assert_eq!(log[1].prev, log[0].hash);
        let mut edited = log.clone();
        edited[1].user = "mallory".into();
        assert_eq!(verify(&edited), Err(1));
        let mut removed = log.clone();
        removed.remove(1);
        assert!(verify(&removed).is_err());
        let mut swapped = log.clone();
        swapped.swap(1, 2);
        assert!(verify(&swapped).is_err());
    }

    /// Entries written before this module existed (the quorum's format) still verify: the digest
    /// is unchanged.
    #[test]
    fn the_digest_is_the_quorum_format() {
        let h = AuditEntry::digest("", 0, 1, "u", "a", "claim", "n1");
        assert_eq!(h.len(), 64);
        let mut log = Vec::new();
        append(&mut log, 1, "u", "a", "claim", "n1");
        assert_eq!(log[0].hash, h);
    }
}
