//! How far this member has verified the quorum's held audit chain, so a query re-derives only what
//! was appended since (a 10-million-entry log is not re-hashed per query).

use lattice_adapters::QuorumState;

/// Where this member last verified the held audit chain to: the seq after the last entry it
/// checked and that entry's hash. A query re-derives only the entries after it (each hash covers
/// the one before, so an equal hash there means the same prefix); the chain is checked whole
/// when the prefix is not there any more (archived, or another state installed).
#[derive(Default)]
pub struct Verified(std::sync::Mutex<Option<(u64, String)>>);

impl Verified {
    /// Whether `st`'s held chain verifies (from its anchor), checking only what is new since the
    /// last call.
    pub fn check(&self, st: &QuorumState) -> bool {
        let mut at = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let base = st.audit_base.seq;
        let start = match at.as_ref() {
            Some((next, hash))
                if *next > base
                    && ((next - base) as usize) <= st.audit.len()
                    && st.audit[(next - base) as usize - 1].hash == *hash =>
            {
                (next - base) as usize
            }
            _ => 0,
        };
        let ok = if start == 0 {
            st.verify_audit().is_ok()
        } else {
            let prev = &st.audit[start - 1];
            lattice_adapters::audit_archive::check_manifest(&st.audit_archive, &st.audit_base).is_ok()
                && lattice_engine::audit::verify_from(&st.audit[start..], &lattice_engine::audit::Anchor::after(prev))
                    .is_ok()
        };
        *at = match (ok, st.audit.last()) {
            (true, Some(last)) => Some((last.seq + 1, last.hash.clone())),
            _ => None,
        };
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_adapters::QuorumCommand;

    fn entry(s: &mut QuorumState, at_ms: u64) {
        s.apply(&QuorumCommand::Audit {
            at_ms,
            user: "dr-x".into(),
            alloc: "a-1".into(),
            action: "api_call".into(),
            detail: "get".into(),
            signed: None,
        });
    }

    #[test]
    fn only_what_is_new_is_checked_and_a_changed_entry_is_still_found() {
        let mut s = QuorumState::default();
        for i in 0..5 {
            entry(&mut s, i);
        }
        let v = Verified::default();
        assert!(v.check(&s));
        entry(&mut s, 5);
        assert!(v.check(&s));
        // A new entry that does not chain fails, and so does every later check of it.
        entry(&mut s, 6);
        s.audit[6].detail = "changed".into();
        assert!(!v.check(&s));
        assert!(!v.check(&s));
        // Another state in its place (a different prefix): checked whole.
        let mut t = QuorumState::default();
        for i in 0..8 {
            entry(&mut t, 100 + i);
        }
        assert!(v.check(&t));
        t.audit[1].user = "mallory".into();
        let w = Verified::default();
        assert!(!w.check(&t));
    }
}
