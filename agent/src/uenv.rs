//! uenv: SquashFS software environments (book: "Software Plane", ADR on uenv).
//!
//! An allocation that names a uenv (`name/version:tag`) gets the image pulled into the node-local
//! cache (`CACHE/uenv/name_version_tag.squashfs`, the seed's layout) from the site's registry — a
//! directory or `file://` URL holding `name/version/tag.squashfs` and its SHA-256 in
//! `name/version/tag.squashfs.sha256` — verified against that digest ("uenv pull failed: hash
//! mismatch"), and mounted read-only at the uenv mount point (`/user-environment`) in a private mount
//! namespace of the allocation's process tree ([`crate::runner`]): its processes see it, no other
//! process on the node does, and the mount ends with them (also when the agent restarts meanwhile).
//!
//! A tools uenv (`environment.tools_uenv`: profilers, debuggers) is pulled the same way and mounted
//! read-only at the tools mount point (`/user-tools`) in the same namespace, beside the application's;
//! it changes none of the processes' variables (the application's environment stays as its uenv
//! makes it), only `LATTICE_TOOLS_UENV` names it.
//!
//! A view's environment comes from the image's `meta/env.json`, as uenv images carry it:
//! `{"views": {"NAME": {"env": {"values": {"list": {"PATH": [{"op": "prepend", "value": [..]}]},
//! "scalar": {"VAR": "value"}}}}}}` (`op`: prepend, append or set; list values join with `:`).

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where images come from, where they are cached, and where they are mounted.
#[derive(Clone, Debug)]
pub struct UenvConfig {
    /// The registry: a directory or a `file://` URL. Without one, only cached images run.
    pub registry: Option<String>,
    /// The node-local image cache (`/var/cache/lattice`).
    pub cache_dir: PathBuf,
    /// Where the image appears to the allocation's processes (`/user-environment`).
    pub mount_point: PathBuf,
    /// Where a tools uenv (`environment.tools_uenv`) appears beside it (`/user-tools`).
    pub tools_mount_point: PathBuf,
    /// The cache's size and watermarks.
    pub limits: crate::cache::Limits,
    /// The site's uenv signing key, its Ed25519 public half in hex: an allocation with
    /// `environment.sign_required` mounts only images whose signature (`TAG.squashfs.sig` beside the
    /// image) verifies with it.
    pub signing_key: Option<String>,
}

impl Default for UenvConfig {
    fn default() -> Self {
        UenvConfig {
            registry: None,
            cache_dir: PathBuf::from("/var/cache/lattice"),
            mount_point: PathBuf::from("/user-environment"),
            tools_mount_point: PathBuf::from("/user-tools"),
            limits: crate::cache::Limits::default(),
            signing_key: None,
        }
    }
}

/// Why a uenv could not be made ready (the allocation does not start; the message is its exit's tail).
#[derive(Debug, thiserror::Error)]
pub enum UenvError {
    #[error("uenv pull failed: {0:?} is not a uenv name (name/version:tag)")]
    BadName(String),
    #[error("uenv pull failed: {0} is not in the registry ({1})")]
    NotFound(String, String),
    #[error("uenv pull failed: hash mismatch ({uenv}: the registry says {expected}, the image is {actual})")]
    HashMismatch {
        uenv: String,
        expected: String,
        actual: String,
    },
    #[error("uenv pull failed: {0} is not cached and no registry is configured")]
    NoRegistry(String),
    #[error("uenv pull failed: {0}")]
    Io(String),
    #[error("uenv view {view:?} not found in {uenv}")]
    NoView { uenv: String, view: String },
    #[error("uenv {uenv}: meta/env.json: {message}")]
    BadMeta { uenv: String, message: String },
    #[error("uenv pull failed: {0}")]
    CacheFull(#[from] crate::cache::CacheFull),
    /// `sign_required` and the image is not signed, or not by the site's key (book: "Software
    /// Delivery": "image signature verified before mount").
    #[error("uenv signature: {0}")]
    Unsigned(String),
}

/// `name/version:tag` → the registry's relative path without extension (`name/version/tag`) and the
/// cache's file name (`name_version_tag.squashfs`). A missing tag is `latest`.
pub fn layout(uenv: &str) -> Result<(PathBuf, String), UenvError> {
    lattice_agent_protocol::uenv_layout(uenv).map_err(|e| UenvError::BadName(e.0))
}

fn registry_dir(registry: &str) -> PathBuf {
    PathBuf::from(registry.strip_prefix("file://").unwrap_or(registry))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache of uenv images under `cfg`'s cache directory (`DIR/uenv/`, its index `metadata.json`).
pub fn open_cache(cfg: &UenvConfig) -> crate::cache::ImageCache {
    crate::cache::ImageCache::open(&cfg.cache_dir.join("uenv"), cfg.limits)
}

/// With `sign_required`, whether `sig` (the image's signature file, hex) is the site key's
/// signature of the image's SHA-256 digest `digest` (hex), as `openssl pkeyutl -sign -rawin` makes
/// it over `openssl dgst -sha256 -binary`.
pub fn check_signed(cfg: &UenvConfig, uenv: &str, digest: &str, sig: Option<&str>) -> Result<(), UenvError> {
    let Some(key) = &cfg.signing_key else {
        return Err(UenvError::Unsigned(format!(
            "{uenv}: the allocation requires a signed image and this agent has no signing key (--uenv-signing-key)"
        )));
    };
    let Some(sig) = sig else {
        return Err(UenvError::Unsigned(format!(
            "{uenv} is not signed (no .sig beside the image)"
        )));
    };
    let bytes: [u8; 32] = hex::decode(digest.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| UenvError::Unsigned(format!("{uenv}: its digest {digest:?} is not a SHA-256")))?;
    let signed = lattice_engine::audit::Signed {
        key: key.clone(),
        sig: sig.split_whitespace().collect(),
    };
    lattice_engine::audit::check_digest(&signed, &bytes)
        .map_err(|e| UenvError::Unsigned(format!("{uenv}: {e} (the site's uenv signing key)")))
}

/// The image of `uenv` in the cache, pulled and verified first when it is not there (or its recorded
/// digest differs from the registry's), after making room for it (LRU, sparing `pinned` images).
/// Returns the cached image's path; the cache records the use (hit or miss) at `now_ms`.
pub fn pull(
    cfg: &UenvConfig,
    cache: &mut crate::cache::ImageCache,
    pinned: &std::collections::BTreeSet<String>,
    uenv: &str,
    now_ms: u64,
    sign_required: bool,
) -> Result<PathBuf, UenvError> {
    pull_used(cfg, cache, pinned, uenv, now_ms, sign_required).map(|(path, _)| path)
}

/// [`pull`], also saying what was used: the image's name, the digest it was verified against, and
/// whether it was pulled now (a sensitive allocation's audit trail records both).
pub fn pull_used(
    cfg: &UenvConfig,
    cache: &mut crate::cache::ImageCache,
    pinned: &std::collections::BTreeSet<String>,
    uenv: &str,
    now_ms: u64,
    sign_required: bool,
) -> Result<(PathBuf, crate::client::ImageUse), UenvError> {
    let used = |sha256: &str, pulled: bool| crate::client::ImageUse {
        image: uenv.to_string(),
        sha256: sha256.trim().to_string(),
        pulled,
    };
    let (rel, file) = layout(uenv)?;
    let dir = cache.dir().to_path_buf();
    let cached = dir.join(&file);
    let recorded = dir.join(format!("{file}.sha256"));
    let cached_sig = dir.join(format!("{file}.sig"));
    // A signed image is checked at every mount, against the digest it was verified with.
    let signed = |digest: &str, sig: Option<String>| -> Result<(), UenvError> {
        if sign_required {
            check_signed(cfg, uenv, digest, sig.as_deref())?;
        }
        Ok(())
    };
    let io = |e: std::io::Error| UenvError::Io(e.to_string());
    let Some(registry) = &cfg.registry else {
        // No registry: what was verified into the cache earlier runs.
        return if cached.is_file() && recorded.is_file() {
            let digest = std::fs::read_to_string(&recorded).map_err(io)?;
            signed(&digest, std::fs::read_to_string(&cached_sig).ok())?;
            cache.used_image(&file, true, now_ms);
            Ok((cached, used(&digest, false)))
        } else {
            Err(UenvError::NoRegistry(uenv.to_string()))
        };
    };
    let reg = registry_dir(registry);
    // `TAG.squashfs` and its neighbours, appended to the tag (a tag such as `2024.1` keeps its dot).
    let beside = |suffix: &str| reg.join(format!("{}.{suffix}", rel.display()));
    let source = beside("squashfs");
    let digest_file = beside("squashfs.sha256");
    let expected = match std::fs::read_to_string(&digest_file) {
        Ok(t) => t.split_whitespace().next().unwrap_or_default().to_ascii_lowercase(),
        Err(_) => return Err(UenvError::NotFound(uenv.to_string(), registry.clone())),
    };
    if !source.is_file() {
        return Err(UenvError::NotFound(uenv.to_string(), registry.clone()));
    }
    // The registry's signature (if any) is kept beside the cached image.
    let sig = std::fs::read_to_string(beside("squashfs.sig")).ok();
    let keep_sig = |sig: &Option<String>| -> Result<(), UenvError> {
        match sig {
            Some(s) => std::fs::write(&cached_sig, s).map_err(io),
            None => match std::fs::remove_file(&cached_sig) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            },
        }
    };
    // A hit: the cached image was verified against this digest when it was pulled.
    if cached.is_file() && std::fs::read_to_string(&recorded).is_ok_and(|r| r.trim() == expected) {
        signed(&expected, sig.clone())?;
        keep_sig(&sig)?;
        cache.used_image(&file, true, now_ms);
        return Ok((cached, used(&expected, false)));
    }
    // Not signed as required: refused before anything is copied.
    signed(&expected, sig.clone())?;
    let size = std::fs::metadata(&source).map_err(io)?.len();
    let mut pinned = pinned.clone();
    pinned.remove(&file); // a stale copy of this very image is replaced, not kept
    cache.make_room(size, &pinned)?;
    std::fs::create_dir_all(&dir).map_err(io)?;
    let partial = dir.join(format!("{file}.partial"));
    let mut input = std::fs::File::open(&source).map_err(io)?;
    let mut output = std::fs::File::create(&partial).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        output.write_all(&buf[..n]).map_err(io)?;
    }
    output.sync_all().map_err(io)?;
    drop(output);
    let actual = hex(&hasher.finalize());
    if actual != expected {
        let _ = std::fs::remove_file(&partial);
        return Err(UenvError::HashMismatch {
            uenv: uenv.to_string(),
            expected,
            actual,
        });
    }
    std::fs::rename(&partial, &cached).map_err(io)?;
    std::fs::write(&recorded, format!("{expected}\n")).map_err(io)?;
    keep_sig(&sig)?;
    cache.used_image(&file, false, now_ms);
    Ok((cached, used(&expected, true)))
}

/// The environment variables of `view` in `image` (its `meta/env.json`, read with `unsquashfs`),
/// applied over `base` (the variables the process would otherwise get: prepend/append extend them).
pub fn view_env(
    uenv: &str,
    image: &Path,
    view: &str,
    base: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, UenvError> {
    let out = Command::new("unsquashfs")
        .arg("-cat")
        .arg(image)
        .arg("meta/env.json")
        .output()
        .map_err(|e| UenvError::Io(format!("unsquashfs: {e}")))?;
    if !out.status.success() {
        return Err(UenvError::NoView {
            uenv: uenv.to_string(),
            view: view.to_string(),
        });
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| UenvError::BadMeta {
        uenv: uenv.to_string(),
        message: e.to_string(),
    })?;
    apply_view(uenv, &meta, view, base)
}

/// [`view_env`] on parsed `meta/env.json`.
pub fn apply_view(
    uenv: &str,
    meta: &serde_json::Value,
    view: &str,
    base: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, UenvError> {
    let bad = |message: String| UenvError::BadMeta {
        uenv: uenv.to_string(),
        message,
    };
    let Some(v) = meta.get("views").and_then(|v| v.get(view)) else {
        return Err(UenvError::NoView {
            uenv: uenv.to_string(),
            view: view.to_string(),
        });
    };
    let values = v.pointer("/env/values");
    let mut out: Vec<(String, String)> = Vec::new();
    if let Some(list) = values.and_then(|x| x.get("list")).and_then(|x| x.as_object()) {
        for (var, ops) in list {
            let mut parts: Vec<String> = base(var)
                .filter(|s| !s.is_empty())
                .map(|s| s.split(':').map(str::to_string).collect())
                .unwrap_or_default();
            for op in ops
                .as_array()
                .ok_or_else(|| bad(format!("list.{var}: expected an array")))?
            {
                let items: Vec<String> = op
                    .get("value")
                    .and_then(|x| x.as_array())
                    .ok_or_else(|| bad(format!("list.{var}: an op without a value array")))?
                    .iter()
                    .map(|x| x.as_str().map(str::to_string))
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad(format!("list.{var}: values must be strings")))?;
                match op.get("op").and_then(|x| x.as_str()) {
                    Some("prepend") => parts.splice(0..0, items),
                    Some("append") => parts.splice(parts.len().., items),
                    Some("set") => parts.splice(.., items),
                    other => return Err(bad(format!("list.{var}: op {other:?} (prepend, append or set)"))),
                };
            }
            out.push((var.clone(), parts.join(":")));
        }
    }
    if let Some(scalar) = values.and_then(|x| x.get("scalar")).and_then(|x| x.as_object()) {
        for (var, value) in scalar {
            let value = value
                .as_str()
                .ok_or_else(|| bad(format!("scalar.{var}: expected a string")))?;
            out.push((var.clone(), value.to_string()));
        }
    }
    Ok(out)
}

/// Everything a launch needs for its uenv: the cached image and the view's variables (plus
/// `LATTICE_UENV`, `LATTICE_UENV_VIEW` and `UENV_MOUNT_POINT`).
pub struct Prepared {
    pub image: PathBuf,
    pub env: Vec<(String, String)>,
    /// What was mounted ([`pull_used`]).
    pub used: crate::client::ImageUse,
}

pub fn prepare(
    cfg: &UenvConfig,
    cache: &mut crate::cache::ImageCache,
    pinned: &std::collections::BTreeSet<String>,
    uenv: &str,
    view: Option<&str>,
    sign_required: bool,
) -> Result<Prepared, UenvError> {
    let (image, used) = pull_used(cfg, cache, pinned, uenv, crate::runner::wall_ms(), sign_required)?;
    let mut env = vec![
        ("LATTICE_UENV".to_string(), uenv.to_string()),
        ("UENV_MOUNT_POINT".to_string(), cfg.mount_point.display().to_string()),
    ];
    if let Some(v) = view {
        env.push(("LATTICE_UENV_VIEW".to_string(), v.to_string()));
        env.extend(view_env(uenv, &image, v, |k| std::env::var(k).ok())?);
    }
    std::fs::create_dir_all(&cfg.mount_point)
        .map_err(|e| UenvError::Io(format!("{}: {e}", cfg.mount_point.display())))?;
    Ok(Prepared { image, env, used })
}

/// A tools uenv's cached image, pulled like the application's ([`pull`]), its mount point made.
pub fn prepare_tools(
    cfg: &UenvConfig,
    cache: &mut crate::cache::ImageCache,
    pinned: &std::collections::BTreeSet<String>,
    uenv: &str,
    sign_required: bool,
) -> Result<(PathBuf, crate::client::ImageUse), UenvError> {
    let pulled = pull_used(cfg, cache, pinned, uenv, crate::runner::wall_ms(), sign_required)?;
    std::fs::create_dir_all(&cfg.tools_mount_point)
        .map_err(|e| UenvError::Io(format!("{}: {e}", cfg.tools_mount_point.display())))?;
    Ok(pulled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_the_registry_and_the_cache() {
        let (rel, cache) = layout("prgenv-gnu/24.11:v1").unwrap();
        assert_eq!(rel, PathBuf::from("prgenv-gnu/24.11/v1"));
        assert_eq!(cache, "prgenv-gnu_24.11_v1.squashfs");
        assert_eq!(layout("tools").unwrap().1, "tools_latest.squashfs");
        for bad in ["../etc:x", "a//b", "a/b:", "a/.hidden", "a b", ""] {
            assert!(matches!(layout(bad), Err(UenvError::BadName(_))), "{bad}");
        }
    }

    #[test]
    fn views_prepend_append_set_and_scalars() {
        let meta = serde_json::json!({"views": {"default": {"env": {"values": {
            "list": {
                "PATH": [{"op": "prepend", "value": ["/user-environment/bin"]}],
                "MANPATH": [{"op": "append", "value": ["/m"]}],
                "LD_LIBRARY_PATH": [{"op": "set", "value": ["/l1", "/l2"]}]
            },
            "scalar": {"CC": "gcc"}
        }}}}});
        let base = |k: &str| match k {
            "PATH" => Some("/usr/bin:/bin".to_string()),
            "LD_LIBRARY_PATH" => Some("/old".to_string()),
            _ => None,
        };
        let mut env = apply_view("u/1:v", &meta, "default", base).unwrap();
        env.sort();
        assert_eq!(
            env,
            vec![
                ("CC".to_string(), "gcc".to_string()),
                ("LD_LIBRARY_PATH".to_string(), "/l1:/l2".to_string()),
                ("MANPATH".to_string(), "/m".to_string()),
                ("PATH".to_string(), "/user-environment/bin:/usr/bin:/bin".to_string()),
            ]
        );
        assert!(matches!(
            apply_view("u/1:v", &meta, "missing", |_| None),
            Err(UenvError::NoView { .. })
        ));
        let broken = serde_json::json!({"views": {"default": {"env": {"values": {"list": {"PATH": [{"op": "rotate", "value": []}]}}}}}});
        assert!(matches!(
            apply_view("u/1:v", &broken, "default", |_| None),
            Err(UenvError::BadMeta { .. })
        ));
    }

    #[test]
    fn pulls_verify_the_digest_and_hits_skip_the_copy() {
        let dir = std::env::temp_dir().join(format!("lattice-uenv-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let reg = dir.join("registry/app/1.0");
        std::fs::create_dir_all(&reg).unwrap();
        std::fs::write(reg.join("v1.squashfs"), b"image bytes").unwrap();
        let digest = hex(&Sha256::digest(b"image bytes"));
        std::fs::write(reg.join("v1.squashfs.sha256"), format!("{digest}  v1.squashfs\n")).unwrap();
        let cfg = UenvConfig {
            registry: Some(format!("file://{}", dir.join("registry").display())),
            cache_dir: dir.join("cache"),
            mount_point: dir.join("mnt"),
            tools_mount_point: dir.join("tools"),
            limits: crate::cache::Limits::default(),
            signing_key: None,
        };
        let mut cache = open_cache(&cfg);
        let none = std::collections::BTreeSet::new();
        let mut pull = |cfg: &UenvConfig, u: &str| pull(cfg, &mut cache, &none, u, 1, false);
        let image = pull(&cfg, "app/1.0:v1").unwrap();
        assert_eq!(std::fs::read(&image).unwrap(), b"image bytes");
        // A hit: the registry's image may change bytes, the verified copy is used.
        std::fs::write(reg.join("v1.squashfs"), b"tampered").unwrap();
        assert_eq!(
            std::fs::read(pull(&cfg, "app/1.0:v1").unwrap()).unwrap(),
            b"image bytes"
        );
        // A new digest forces a pull, which refuses the tampered bytes and caches nothing new.
        std::fs::write(
            reg.join("v1.squashfs.sha256"),
            format!("{}\n", hex(&Sha256::digest(b"other"))),
        )
        .unwrap();
        let e = pull(&cfg, "app/1.0:v1").unwrap_err();
        assert!(e.to_string().starts_with("uenv pull failed: hash mismatch"), "{e}");
        assert!(!cfg.cache_dir.join("uenv/app_1.0_v1.squashfs.partial").exists());
        assert!(matches!(pull(&cfg, "app/2.0:v1"), Err(UenvError::NotFound(..))));
        let offline = UenvConfig {
            registry: None,
            ..cfg.clone()
        };
        assert!(pull(&offline, "app/1.0:v1").is_ok());
        assert!(matches!(pull(&offline, "other/1:v1"), Err(UenvError::NoRegistry(_))));
        // One miss (the first pull), then hits: the cached copy, and again offline.
        assert_eq!((cache.stats.misses, cache.stats.hits), (1, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `sign_required`: an image is mounted only with the site key's signature of its digest beside
    /// it — refused unsigned, signed by another key, or without a key on the agent, before anything
    /// is copied; a signed one is pulled, and its cached signature checked again at every hit.
    #[test]
    fn signed_images_only_when_sign_required() {
        use lattice_engine::audit::{SigningKey, public_hex, sign_digest};
        let dir = std::env::temp_dir().join(format!("lattice-uenv-signed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let reg = dir.join("registry/sensitive/validated");
        std::fs::create_dir_all(&reg).unwrap();
        std::fs::write(reg.join("2024.1.squashfs"), b"validated stack").unwrap();
        let digest: [u8; 32] = Sha256::digest(b"validated stack").into();
        std::fs::write(reg.join("2024.1.squashfs.sha256"), format!("{}\n", hex(&digest))).unwrap();
        let site = SigningKey::from_bytes(&[7; 32]);
        let other = SigningKey::from_bytes(&[8; 32]);
        let cfg = UenvConfig {
            registry: Some(dir.join("registry").display().to_string()),
            cache_dir: dir.join("cache"),
            signing_key: Some(public_hex(&site)),
            ..UenvConfig::default()
        };
        let mut cache = open_cache(&cfg);
        let none = std::collections::BTreeSet::new();
        let mut pull =
            |cfg: &UenvConfig, signed: bool| pull(cfg, &mut cache, &none, "sensitive/validated:2024.1", 1, signed);
        let cached = cfg.cache_dir.join("uenv/sensitive_validated_2024.1.squashfs");
        let unsigned = pull(&cfg, true).unwrap_err();
        assert!(
            matches!(unsigned, UenvError::Unsigned(_)) && unsigned.to_string().contains("is not signed"),
            "{unsigned}"
        );
        assert!(!cached.exists(), "nothing copied");
        std::fs::write(reg.join("2024.1.squashfs.sig"), sign_digest(&other, &digest).sig).unwrap();
        let wrong = pull(&cfg, true).unwrap_err().to_string();
        assert!(wrong.contains("does not verify"), "{wrong}");
        let keyless = UenvConfig {
            signing_key: None,
            ..cfg.clone()
        };
        assert!(pull(&keyless, true).unwrap_err().to_string().contains("no signing key"));
        std::fs::write(reg.join("2024.1.squashfs.sig"), sign_digest(&site, &digest).sig).unwrap();
        assert_eq!(std::fs::read(pull(&cfg, true).unwrap()).unwrap(), b"validated stack");
        // A hit checks the kept signature again: offline with it altered, the image is refused.
        let offline = UenvConfig {
            registry: None,
            ..cfg.clone()
        };
        assert!(pull(&offline, true).is_ok());
        std::fs::write(
            cfg.cache_dir.join("uenv/sensitive_validated_2024.1.squashfs.sig"),
            sign_digest(&other, &digest).sig,
        )
        .unwrap();
        assert!(matches!(pull(&offline, true), Err(UenvError::Unsigned(_))));
        // Without sign_required the same image mounts as any other.
        assert!(pull(&offline, false).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
