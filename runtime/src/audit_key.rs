//! The site's audit signing key (book: "Audit Signing Key Persistence"): an Ed25519 key read from
//! `sensitive.audit_signing_key_path` (PKCS#8 PEM, as `openssl genpkey -algorithm ed25519` writes
//! it). The member that proposes an audit entry signs it with this key, and exports are signed with
//! it, so entries archived or exported can be verified after restarts with its public half. Without
//! a path a random key is made at start — for testing only: its entries verify, but nobody can
//! tell its key from another's. Under a deterministic simulation the key is derived from the
//! member's id, so runs repeat byte for byte.

use anyhow::{Context, Result};
use ed25519_dalek::SigningKey;
use std::path::Path;

/// The member's audit key: from `path`, else derived from `simulated` (a simulation's member id),
/// else random.
pub fn load(path: Option<&Path>, simulated: Option<u64>) -> Result<SigningKey> {
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    if let Some(p) = path {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("audit_signing_key_path: reading {}", p.display()))?;
        return SigningKey::from_pkcs8_pem(&text).map_err(|e| {
            anyhow::anyhow!(
                "audit_signing_key_path: {}: not an Ed25519 private key in PKCS#8 PEM ({e}); make one with `openssl genpkey -algorithm ed25519 -out {}`",
                p.display(),
                p.display()
            )
        });
    }
    let seed: [u8; 32] = match simulated {
        Some(id) => {
            use sha2::Digest;
            sha2::Sha256::digest(format!("lattice simulated audit key {id}").as_bytes()).into()
        }
        None => {
            use std::io::Read;
            let mut b = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut b))
                .context("reading /dev/urandom for a random audit key")?;
            tracing::warn!(
                "sensitive.audit_signing_key_path is not set: audit entries are signed with a random key (testing only)"
            );
            b
        }
    };
    Ok(SigningKey::from_bytes(&seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key `openssl genpkey -algorithm ed25519` wrote (RFC 8410's example) is read; anything else
    /// is refused naming the file and how to make one.
    #[test]
    fn a_pem_key_is_read_and_a_bad_file_named() {
        let dir = std::env::temp_dir().join(format!("lattice-audit-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = dir.join("audit.pem");
        std::fs::write(
            &pem,
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let k = load(Some(&pem), None).unwrap();
        assert_eq!(
            lattice_engine::audit::public_hex(&k),
            "19bf44096984cdfe8541bac167dc3b96c85086aa30b6b6cb0c5c38ad703166e1"
        );
        std::fs::write(&pem, "not a key").unwrap();
        let e = load(Some(&pem), None).unwrap_err().to_string();
        assert!(e.contains("audit.pem") && e.contains("openssl genpkey"), "{e}");
        assert_eq!(load(None, Some(2)).unwrap(), load(None, Some(2)).unwrap());
        assert_ne!(load(None, None).unwrap(), load(None, None).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
