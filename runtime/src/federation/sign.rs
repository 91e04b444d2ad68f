//! The trust layer (book: "Trust Model: Sovra Integration"): every request between two sites is
//! signed with a key derived from the shared workspace both sites hold (its root key never leaves
//! either site), and every answer is signed back over the request's nonce, so each side knows the
//! other holds the workspace key. A signature is HMAC-SHA256 over the method, path, time, nonce, the
//! body's SHA-256, the sending site and the workspace; requests older than [`MAX_SKEW_MS`] or with a
//! nonce seen before are refused (no replay). Revoking the workspace at the quorum refuses all of them.

use ring::{digest, hmac};
use std::collections::{BTreeMap, VecDeque};

/// Headers a signed request carries.
pub const SITE: &str = "x-lattice-site";
pub const WORKSPACE: &str = "x-lattice-workspace";
pub const TIME: &str = "x-lattice-time";
pub const NONCE: &str = "x-lattice-nonce";
pub const SIGNATURE: &str = "x-lattice-signature";

/// How far a request's time may be from the receiver's clock.
pub const MAX_SKEW_MS: u64 = 300_000;

/// A key derived from a workspace's shared secret for federation requests (the secret itself signs
/// nothing).
pub struct WorkspaceKey(hmac::Key);

impl std::fmt::Debug for WorkspaceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkspaceKey(…)")
    }
}

impl WorkspaceKey {
    pub fn derive(workspace: &str, secret: &[u8]) -> WorkspaceKey {
        let root = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let derived = hmac::sign(&root, format!("lattice-federation-v1:{workspace}").as_bytes());
        WorkspaceKey(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }

    /// The signature of one request (hex).
    pub fn sign(&self, m: &Signed<'_>) -> String {
        hex(hmac::sign(&self.0, &m.message()).as_ref())
    }

    /// Whether `signature` (hex) signs `m`, compared in constant time.
    pub fn verify(&self, m: &Signed<'_>, signature: &str) -> bool {
        match unhex(signature) {
            Some(tag) => hmac::verify(&self.0, &m.message(), &tag).is_ok(),
            None => false,
        }
    }
}

/// What a signature covers. An answer is signed with `method` = `ANSWER`, `path` = its status code
/// and the request's nonce, so it cannot be replayed for another request.
pub struct Signed<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub time_ms: u64,
    pub nonce: &'a str,
    pub body: &'a [u8],
    pub site: &'a str,
    pub workspace: &'a str,
}

impl Signed<'_> {
    fn message(&self) -> Vec<u8> {
        let body = hex(digest::digest(&digest::SHA256, self.body).as_ref());
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.method, self.path, self.time_ms, self.nonce, body, self.site, self.workspace
        )
        .into_bytes()
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Nonces seen within the skew window (a replayed request is refused).
#[derive(Default)]
pub struct Nonces {
    seen: BTreeMap<String, u64>,
    order: VecDeque<(u64, String)>,
}

impl Nonces {
    /// Records `nonce` at `now_ms`; `false` when it was seen within the window.
    pub fn fresh(&mut self, nonce: &str, now_ms: u64) -> bool {
        while let Some((t, _)) = self.order.front() {
            if now_ms.saturating_sub(*t) <= 2 * MAX_SKEW_MS {
                break;
            }
            if let Some((_, n)) = self.order.pop_front() {
                self.seen.remove(&n);
            }
        }
        if self.seen.contains_key(nonce) {
            return false;
        }
        self.seen.insert(nonce.to_string(), now_ms);
        self.order.push_back((now_ms, nonce.to_string()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<'a>(body: &'a [u8], site: &'a str) -> Signed<'a> {
        Signed {
            method: "POST",
            path: "/federation/v1/allocations",
            time_ms: 1_700_000_000_000,
            nonce: "abc",
            body,
            site,
            workspace: "hpc-general",
        }
    }

    #[test]
    fn a_signature_covers_every_part() {
        let k = WorkspaceKey::derive("hpc-general", b"shared secret");
        let s = k.sign(&msg(b"{}", "site-a"));
        assert!(k.verify(&msg(b"{}", "site-a"), &s));
        assert!(!k.verify(&msg(b"{ }", "site-a"), &s), "another body");
        assert!(!k.verify(&msg(b"{}", "site-b"), &s), "another site");
        let other = WorkspaceKey::derive("hpc-general", b"another secret");
        assert!(!other.verify(&msg(b"{}", "site-a"), &s), "another key");
        let other_ws = WorkspaceKey::derive("sensitive-ch", b"shared secret");
        assert!(!other_ws.verify(&msg(b"{}", "site-a"), &s), "another workspace");
        assert!(!k.verify(&msg(b"{}", "site-a"), "zz"), "not hex");
    }

    #[test]
    fn a_nonce_is_good_once_within_the_window() {
        let mut n = Nonces::default();
        assert!(n.fresh("a", 0));
        assert!(!n.fresh("a", 1000));
        assert!(n.fresh("b", 1000));
        // Forgotten once far outside the window (its request would be refused by time anyway).
        assert!(n.fresh("a", 3 * MAX_SKEW_MS));
    }
}
