//! The sensitive audit log the (fake) quorum keeps: append-only and hash-chained — every entry carries
//! the SHA-256 of the previous one, so any edit, insertion or removal breaks [`AuditLog::verify`].

use serde::Serialize;
use sha2::{Digest, Sha256};

/// One audit entry (claim, release, wipe, quarantine).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    pub seq: u64,
    /// Virtual time, milliseconds.
    pub time_ms: u64,
    pub event: String,
    /// The trace id of the claim.
    pub claim: String,
    /// The user identity behind the claim.
    pub user: String,
    pub nodes: Vec<u32>,
    pub prev_hash: String,
    pub hash: String,
}

/// The hash-chained log.
#[derive(Clone, Debug, Default)]
pub struct AuditLog {
    entries: Vec<AuditEntry>,
}

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn digest(seq: u64, time_ms: u64, event: &str, claim: &str, user: &str, nodes: &[u32], prev: &str) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    // Length-prefixed fields: no two different entries serialise to the same bytes.
    for part in [
        seq.to_string().as_str(),
        time_ms.to_string().as_str(),
        event,
        claim,
        user,
        &nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(","),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl AuditLog {
    pub fn append(&mut self, time_ms: u64, event: &str, claim: &str, user: &str, nodes: Vec<u32>) -> &AuditEntry {
        let seq = self.entries.len() as u64;
        let prev = self.entries.last().map_or(GENESIS.to_string(), |e| e.hash.clone());
        let hash = digest(seq, time_ms, event, claim, user, &nodes, &prev);
        self.entries.push(AuditEntry {
            seq,
            time_ms,
            event: event.to_string(),
            claim: claim.to_string(),
            user: user.to_string(),
            nodes,
            prev_hash: prev,
            hash,
        });
        self.entries.last().expect("just pushed")
    }

    pub fn entries(&self) -> &[AuditEntry] {
        &self.entries
    }

    /// Recomputes the chain: `Err(seq)` names the first entry that does not match.
    pub fn verify(entries: &[AuditEntry]) -> Result<(), u64> {
        let mut prev = GENESIS.to_string();
        for (i, e) in entries.iter().enumerate() {
            if e.seq != i as u64
                || e.prev_hash != prev
                || e.hash != digest(e.seq, e.time_ms, &e.event, &e.claim, &e.user, &e.nodes, &prev)
            {
                return Err(i as u64);
            }
            prev = e.hash.clone();
        }
        Ok(())
    }

    /// JSON lines, one entry per line.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            out.push_str(&serde_json::to_string(e).expect("entries serialise"));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_verifies_and_detects_tampering() {
        let mut log = AuditLog::default();
        log.append(0, "claim", "c1", "dr-x", vec![1, 2]);
        log.append(10, "release", "c1", "dr-x", vec![1, 2]);
        log.append(20, "wipe", "c1", "dr-x", vec![1, 2]);
        assert_eq!(AuditLog::verify(log.entries()), Ok(()));
        let mut edited = log.entries().to_vec();
        edited[1].user = "mallory".into();
        assert_eq!(AuditLog::verify(&edited), Err(1));
        let mut removed = log.entries().to_vec();
        removed.remove(1);
        assert!(AuditLog::verify(&removed).is_err());
        assert_eq!(log.entries()[1].prev_hash, log.entries()[0].hash);
    }
}
