//! The sensitive audit log the fake quorum keeps: the same hash-chained entries as the real quorum's
//! ([`lattice_engine::audit`]): claim, release, wipe and quarantine, with the claim's user and the
//! nodes by name; any edit, insertion or removal breaks [`AuditLog::verify`].

pub use lattice_engine::audit::AuditEntry;

/// The hash-chained log.
#[derive(Clone, Debug, Default)]
pub struct AuditLog {
    entries: Vec<AuditEntry>,
}

impl AuditLog {
    /// Appends `action` on claim `alloc` by `user` for `nodes` (comma-separated names) at `at_ms`.
    pub fn append(&mut self, at_ms: u64, action: &str, alloc: &str, user: &str, nodes: &str) -> &AuditEntry {
        lattice_engine::audit::append(&mut self.entries, at_ms, user, alloc, action, nodes)
    }

    pub fn entries(&self) -> &[AuditEntry] {
        &self.entries
    }

    /// Recomputes the chain: `Err(seq)` names the first entry that does not match.
    pub fn verify(entries: &[AuditEntry]) -> Result<(), u64> {
        lattice_engine::audit::verify(entries)
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
