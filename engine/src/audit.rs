//! The sensitive audit log's hash chain — one format for both worlds: the quorum's replicated state
//! (`lattice-adapters`) and the simulator's fake quorum append the same [`AuditEntry`] and verify it
//! the same way. Each entry carries the SHA-256 of the previous one (`prev`, empty for the first),
//! so an edit, insertion or removal anywhere breaks [`verify`].
//!
//! Entries are also signed (book: "Audit Signing Key Persistence"): the member that proposes an entry
//! signs its content ([`AuditEntry::content`]: when, who, which allocation, what, the detail) with the
//! site's Ed25519 audit key ([`sign`]), and the entry carries the key's public half and the
//! signature, both inside the hash chain. Signing happens before the quorum orders the entry, so
//! every member applies the same bytes; [`verify`] checks each signature with the key the entry
//! names, and [`signed_by`] that every entry is signed by a key the verifier trusts. Entries written
//! without a key (a log from before signing) hash as they always did.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The audit key's type (the runtime reads it from its PEM file; tests make one from bytes).
pub use ed25519_dalek::SigningKey;

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
    /// The audit key's public half (hex) that signed it; empty when unsigned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Its Ed25519 signature over [`AuditEntry::content`] (hex); empty when unsigned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sig: String,
    pub prev: String,
    pub hash: String,
}

impl AuditEntry {
    /// The entry's hash: SHA-256 of `prev`, `seq` and `at_ms` (little-endian) and the
    /// length-prefixed text fields, so no two different entries hash the same bytes.
    pub fn digest(prev: &str, seq: u64, at_ms: u64, user: &str, alloc: &str, action: &str, detail: &str) -> String {
        hex(&Self::digest_of(prev, seq, at_ms, &[user, alloc, action, detail]))
    }

    fn digest_of(prev: &str, seq: u64, at_ms: u64, parts: &[&str]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(prev.as_bytes());
        h.update(seq.to_le_bytes());
        h.update(at_ms.to_le_bytes());
        for part in parts {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().into()
    }

    /// Its hash as [`append`] computed it: a signed entry's key and signature are hashed after its
    /// fields; an unsigned one hashes as before signing existed.
    pub fn own_digest(&self) -> String {
        let (u, a, c, d) = (
            self.user.as_str(),
            self.alloc.as_str(),
            self.action.as_str(),
            self.detail.as_str(),
        );
        let parts: &[&str] = if self.sig.is_empty() {
            &[u, a, c, d]
        } else {
            &[u, a, c, d, &self.key, &self.sig]
        };
        hex(&Self::digest_of(&self.prev, self.seq, self.at_ms, parts))
    }

    /// What the audit key signs: SHA-256 of `at_ms` and the length-prefixed user, allocation, action
    /// and detail (the entry before the quorum gives it its place in the chain).
    pub fn content(at_ms: u64, user: &str, alloc: &str, action: &str, detail: &str) -> [u8; 32] {
        Self::digest_of("", 0, at_ms, &[user, alloc, action, detail])
    }
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// An entry's signature and the public half of the key that made it, hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    pub key: String,
    pub sig: String,
}

/// The public half of `key`, hex (how entries and bundles name it).
pub fn public_hex(key: &ed25519_dalek::SigningKey) -> String {
    hex(key.verifying_key().as_bytes())
}

/// Signs an entry's content (or any 32-byte digest) with `key`.
pub fn sign_digest(key: &ed25519_dalek::SigningKey, digest: &[u8; 32]) -> Signed {
    use ed25519_dalek::Signer;
    Signed {
        key: public_hex(key),
        sig: hex(&key.sign(digest).to_bytes()),
    }
}

/// Signs the entry a member is about to propose.
pub fn sign(
    key: &ed25519_dalek::SigningKey,
    at_ms: u64,
    user: &str,
    alloc: &str,
    action: &str,
    detail: &str,
) -> Signed {
    sign_digest(key, &AuditEntry::content(at_ms, user, alloc, action, detail))
}

/// Whether `s` is a valid signature of `digest` by the key it names.
pub fn check_digest(s: &Signed, digest: &[u8; 32]) -> Result<(), String> {
    use ed25519_dalek::Verifier;
    let key: [u8; 32] = hex::decode(&s.key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| format!("key {:?} is not an Ed25519 public key", s.key))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&key).map_err(|e| format!("key {}: {e}", s.key))?;
    let sig: [u8; 64] = hex::decode(&s.sig)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| "the signature is not 64 bytes of hex".to_string())?;
    key.verify(digest, &ed25519_dalek::Signature::from_bytes(&sig))
        .map_err(|_| format!("the signature does not verify with key {}", s.key))
}

/// Whether the entry's own signature (if it has one) verifies with the key it names.
pub fn check_signature(e: &AuditEntry) -> Result<(), String> {
    if e.sig.is_empty() && e.key.is_empty() {
        return Ok(());
    }
    let s = Signed {
        key: e.key.clone(),
        sig: e.sig.clone(),
    };
    check_digest(
        &s,
        &AuditEntry::content(e.at_ms, &e.user, &e.alloc, &e.action, &e.detail),
    )
}

/// Appends an unsigned entry to `log`, chained to the last one.
pub fn append<'a>(
    log: &'a mut Vec<AuditEntry>,
    at_ms: u64,
    user: &str,
    alloc: &str,
    action: &str,
    detail: &str,
) -> &'a AuditEntry {
    append_signed(log, at_ms, user, alloc, action, detail, None)
}

/// Where a log held in memory starts: the seq of its first entry and the hash of the entry before
/// it (empty at the chain's start). Entries before it live elsewhere (the quorum's S3 archive), so
/// the chain held still verifies on its own, from here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    pub seq: u64,
    pub prev: String,
}

impl Anchor {
    /// The default anchor: the chain's start (what a log without archive has).
    pub fn is_start(&self) -> bool {
        self.seq == 0 && self.prev.is_empty()
    }

    /// The anchor just after `e` (where the log goes on once everything up to `e` is elsewhere).
    pub fn after(e: &AuditEntry) -> Anchor {
        Anchor {
            seq: e.seq + 1,
            prev: e.hash.clone(),
        }
    }
}

/// Appends an entry with its signature (made by the proposing member, [`sign`]) to `log`, chained
/// to the last one.
pub fn append_signed<'a>(
    log: &'a mut Vec<AuditEntry>,
    at_ms: u64,
    user: &str,
    alloc: &str,
    action: &str,
    detail: &str,
    signed: Option<&Signed>,
) -> &'a AuditEntry {
    append_after(log, &Anchor::default(), at_ms, user, alloc, action, detail, signed)
}

/// [`append_signed`] to a log that starts at `anchor`.
#[allow(clippy::too_many_arguments)]
pub fn append_after<'a>(
    log: &'a mut Vec<AuditEntry>,
    anchor: &Anchor,
    at_ms: u64,
    user: &str,
    alloc: &str,
    action: &str,
    detail: &str,
    signed: Option<&Signed>,
) -> &'a AuditEntry {
    let mut e = AuditEntry {
        seq: anchor.seq + log.len() as u64,
        at_ms,
        user: user.to_string(),
        alloc: alloc.to_string(),
        action: action.to_string(),
        detail: detail.to_string(),
        key: signed.map(|s| s.key.clone()).unwrap_or_default(),
        sig: signed.map(|s| s.sig.clone()).unwrap_or_default(),
        prev: log.last().map_or_else(|| anchor.prev.clone(), |e| e.hash.clone()),
        hash: String::new(),
    };
    e.hash = e.own_digest();
    log.push(e);
    log.last().expect("just pushed")
}

/// Re-derives every hash and checks every signature: `Err(seq)` names the first entry that does
/// not chain or whose signature does not verify with the key it names.
pub fn verify(log: &[AuditEntry]) -> Result<(), u64> {
    verify_from(log, &Anchor::default())
}

/// [`verify`] for a log (or a piece of one) that starts at `anchor`; `Err` names the entry's seq.
pub fn verify_from(log: &[AuditEntry], anchor: &Anchor) -> Result<(), u64> {
    let mut prev = anchor.prev.as_str();
    for (i, e) in log.iter().enumerate() {
        let seq = anchor.seq + i as u64;
        if e.seq != seq || e.prev != prev || e.hash != e.own_digest() || check_signature(e).is_err() {
            return Err(seq);
        }
        prev = &e.hash;
    }
    Ok(())
}

/// The first entry (its seq) not signed by one of the `trusted` public keys (hex), if any: with a
/// site key configured, every entry from then on must carry it.
pub fn signed_by<'a>(log: impl IntoIterator<Item = &'a AuditEntry>, trusted: &[String]) -> Result<(), u64> {
    match log
        .into_iter()
        .find(|e| !trusted.contains(&e.key) || check_signature(e).is_err())
    {
        Some(e) => Err(e.seq),
        None => Ok(()),
    }
}

/// The format name of an export bundle.
pub const BUNDLE_FORMAT: &str = "lattice-audit-bundle/1";

/// An export of audit entries for an auditor (book: `lattice audit export`): the entries a query
/// selected, each with its hash and signature, and the exporting member's signature over the
/// export (its time, who asked, the query, whether the whole chain verified, and every entry's
/// hash, in order), so an entry removed from, added to or changed in the file is found offline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bundle {
    pub format: String,
    pub exported_at_ms: u64,
    pub exported_by: String,
    /// The query's filters, as a query string.
    pub query: String,
    /// Whether the quorum's whole chain verified when exported.
    pub chain_valid: bool,
    pub entries: Vec<AuditEntry>,
    /// The exporting member's audit key (public, hex) and its signature over [`bundle_digest`].
    pub key: String,
    pub sig: String,
}

/// What a bundle's signature covers.
pub fn bundle_digest(
    format: &str,
    at_ms: u64,
    by: &str,
    query: &str,
    chain_valid: bool,
    entries: &[AuditEntry],
) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [format, by, query] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.update(at_ms.to_le_bytes());
    h.update([u8::from(chain_valid)]);
    h.update((entries.len() as u64).to_le_bytes());
    for e in entries {
        h.update(e.hash.as_bytes());
    }
    h.finalize().into()
}

/// Signs an export of `entries`.
pub fn make_bundle(
    key: &ed25519_dalek::SigningKey,
    at_ms: u64,
    by: &str,
    query: &str,
    chain_valid: bool,
    entries: Vec<AuditEntry>,
) -> Bundle {
    let s = sign_digest(
        key,
        &bundle_digest(BUNDLE_FORMAT, at_ms, by, query, chain_valid, &entries),
    );
    Bundle {
        format: BUNDLE_FORMAT.into(),
        exported_at_ms: at_ms,
        exported_by: by.into(),
        query: query.into(),
        chain_valid,
        entries,
        key: s.key,
        sig: s.sig,
    }
}

/// Why a bundle does not verify: the first entry that fails (its seq), or the bundle itself.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BundleError {
    #[error("entry {seq}: {why}")]
    Entry { seq: u64, why: String },
    #[error("the bundle: {0}")]
    Bundle(String),
}

/// Checks a bundle offline: every entry's hash against its content, its signature, its key among
/// `trusted` (when given), the links between consecutive entries, and the bundle's own signature
/// (by a trusted key too). The number of entries when all hold.
pub fn verify_bundle(b: &Bundle, trusted: Option<&[String]>) -> Result<usize, BundleError> {
    if b.format != BUNDLE_FORMAT {
        return Err(BundleError::Bundle(format!(
            "format {:?}, expected {BUNDLE_FORMAT}",
            b.format
        )));
    }
    let untrusted = |key: &str| trusted.is_some_and(|t| !t.iter().any(|k| k == key));
    for (i, e) in b.entries.iter().enumerate() {
        let fail = |why: String| Err(BundleError::Entry { seq: e.seq, why });
        if e.hash != e.own_digest() {
            return fail("its hash does not match its content (changed after it was written)".into());
        }
        if e.sig.is_empty() {
            return fail("it is not signed".into());
        }
        if let Err(why) = check_signature(e) {
            return fail(why);
        }
        if untrusted(&e.key) {
            return fail(format!("signed by key {}, which is not trusted", e.key));
        }
        if let Some(before) = i.checked_sub(1).map(|j| &b.entries[j]) {
            if e.seq <= before.seq {
                return fail(format!("out of order (after entry {})", before.seq));
            }
            if e.seq == before.seq + 1 && e.prev != before.hash {
                return fail(format!("it does not chain to entry {}", before.seq));
            }
        }
    }
    let digest = bundle_digest(
        &b.format,
        b.exported_at_ms,
        &b.exported_by,
        &b.query,
        b.chain_valid,
        &b.entries,
    );
    let s = Signed {
        key: b.key.clone(),
        sig: b.sig.clone(),
    };
    check_digest(&s, &digest).map_err(|why| {
        BundleError::Bundle(format!(
            "{why} (an entry was added, removed or reordered, or the export's fields changed)"
        ))
    })?;
    if untrusted(&b.key) {
        return Err(BundleError::Bundle(format!(
            "signed by key {}, which is not trusted",
            b.key
        )));
    }
    Ok(b.entries.len())
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

    /// Signed entries: the signature verifies with the key the entry names and is inside the chain
    /// (stripping or replacing it breaks the chain; a forged one does not verify); [`signed_by`]
    /// names the first entry not signed by a trusted key.
    #[test]
    fn signatures_verify_and_are_chained() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let other = ed25519_dalek::SigningKey::from_bytes(&[8; 32]);
        let mut log = Vec::new();
        for (i, action) in ["claim", "release", "wipe"].into_iter().enumerate() {
            let at = 10 * i as u64;
            let s = sign(&key, at, "dr-x", "c1", action, "n1");
            append_signed(&mut log, at, "dr-x", "c1", action, "n1", Some(&s));
        }
        assert_eq!(verify(&log), Ok(()));
        let trusted = [public_hex(&key)];
        assert_eq!(signed_by(&log, &trusted), Ok(()));
        assert_eq!(signed_by(&log, &[public_hex(&other)]), Err(0));
        // The content changed and re-hashed: the signature no longer verifies.
        let mut edited = log.clone();
        edited[1].detail = "n9".into();
        edited[1].hash = edited[1].own_digest();
        assert_eq!(verify(&edited), Err(1));
        // Stripped of its signature: the chain breaks there.
        let mut stripped = log.clone();
        stripped[2].sig.clear();
        stripped[2].key.clear();
        assert_eq!(verify(&stripped), Err(2));
        // Signed again by another key and re-hashed: the chain holds (the later hashes were
        // recomputed) but the key is not the trusted one.
        let mut resigned = Vec::new();
        for e in &log {
            let k = if e.seq == 1 { &other } else { &key };
            let s = sign(k, e.at_ms, &e.user, &e.alloc, &e.action, &e.detail);
            append_signed(
                &mut resigned,
                e.at_ms,
                &e.user,
                &e.alloc,
                &e.action,
                &e.detail,
                Some(&s),
            );
        }
        assert_eq!(verify(&resigned), Ok(()));
        assert_eq!(signed_by(&resigned, &trusted), Err(1));
        // Unsigned entries (before signing existed) still verify, and are not signed by anyone.
        let mut old = Vec::new();
        append(&mut old, 1, "u", "a", "claim", "n1");
        assert_eq!(verify(&old), Ok(()));
        assert_eq!(signed_by(&old, &trusted), Err(0));
    }

    /// An export verifies offline; any change to it is found and named: an entry's content (by its
    /// seq), a removed entry (the bundle's signature), an untrusted key.
    #[test]
    fn bundles_verify_offline_and_name_what_fails() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let mut log = Vec::new();
        for (i, action) in ["claim", "attach", "release", "wipe"].into_iter().enumerate() {
            let at = 10 * i as u64;
            let s = sign(&key, at, "dr-x", "c1", action, "n1");
            append_signed(&mut log, at, "dr-x", "c1", action, "n1", Some(&s));
        }
        let picked: Vec<AuditEntry> = log.iter().filter(|e| e.action != "attach").cloned().collect();
        let b = make_bundle(&key, 99, "auditor", "user=dr-x", true, picked);
        let trusted = [public_hex(&key)];
        assert_eq!(verify_bundle(&b, Some(&trusted)), Ok(3));
        assert_eq!(verify_bundle(&b, None), Ok(3));
        let mut t = b.clone();
        t.entries[1].detail = "n2".into();
        assert!(matches!(
            verify_bundle(&t, None),
            Err(BundleError::Entry { seq: 2, .. })
        ));
        let mut t = b.clone();
        t.entries.remove(1);
        assert!(matches!(verify_bundle(&t, None), Err(BundleError::Bundle(_))));
        let mut t = b.clone();
        t.query = "user=someone-else".into();
        assert!(matches!(verify_bundle(&t, None), Err(BundleError::Bundle(_))));
        let other = [public_hex(&ed25519_dalek::SigningKey::from_bytes(&[8; 32]))];
        assert!(matches!(
            verify_bundle(&b, Some(&other)),
            Err(BundleError::Entry { seq: 0, .. })
        ));
        // Consecutive entries must chain.
        let all = make_bundle(&key, 99, "auditor", "", true, log.clone());
        assert_eq!(verify_bundle(&all, None), Ok(4));
        let mut t = all.clone();
        t.entries[2].prev = "00".into();
        t.entries[2].hash = t.entries[2].own_digest();
        let err = verify_bundle(&t, None).unwrap_err();
        assert_eq!(err.to_string(), "entry 2: it does not chain to entry 1");
    }

    /// Entries written before this module existed (the quorum's format) still verify: the digest
    /// is unchanged.
    #[test]
    fn a_log_held_from_an_anchor_verifies_on_its_own() {
        let mut whole = Vec::new();
        for i in 0..6u64 {
            append(&mut whole, i, "u", "a", "claim", "n1");
        }
        let anchor = Anchor::after(&whole[2]);
        let mut tail = whole[3..].to_vec();
        assert_eq!(verify_from(&tail, &anchor), Ok(()));
        // Appending to the held tail continues the same chain the whole log would.
        append_after(&mut tail, &anchor, 6, "u", "a", "release", "n1", None);
        append(&mut whole, 6, "u", "a", "release", "n1");
        assert_eq!(tail.last(), whole.last());
        // The tail does not verify from the start, nor from another anchor.
        assert_eq!(verify(&tail), Err(0));
        assert_eq!(verify_from(&tail, &Anchor::after(&whole[1])), Err(2));
        tail[1].detail = "n2".into();
        assert_eq!(verify_from(&tail, &anchor), Err(4));
    }

    #[test]
    fn the_digest_is_the_quorum_format() {
        let h = AuditEntry::digest("", 0, 1, "u", "a", "claim", "n1");
        assert_eq!(h.len(), 64);
        let mut log = Vec::new();
        append(&mut log, 1, "u", "a", "claim", "n1");
        assert_eq!(log[0].hash, h);
    }
}
