//! The rules both sides apply to names a request carries: the control plane refuses a request that
//! breaks one (400 naming the field), the agent refuses to act on one (a corrupted or forged order).

use std::path::{Component, Path, PathBuf};

/// A uenv name that is not `name/version[:tag]` of plain segments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a uenv name (name/version:tag)")]
pub struct BadUenvName(pub String);

/// `name/version:tag` → the registry's relative path without extension (`name/version/tag`) and the
/// cache's file name (`name_version_tag.squashfs`). A missing tag is `latest`.
pub fn uenv_layout(uenv: &str) -> Result<(PathBuf, String), BadUenvName> {
    let (path, tag) = uenv.split_once(':').unwrap_or((uenv, "latest"));
    let segments: Vec<&str> = path.split('/').collect();
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'))
    };
    if !segments.iter().all(|s| ok(s)) || !ok(tag) {
        return Err(BadUenvName(uenv.to_string()));
    }
    let mut rel: PathBuf = segments.iter().collect();
    rel.push(tag);
    let cache = format!("{}_{tag}.squashfs", segments.join("_"));
    Ok((rel, cache))
}

/// An OCI image reference that is not `NAME[:TAG]` of plain characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("image {0:?}: expected NAME[:TAG] (letters, digits, . _ -)")]
pub struct BadImageRef(pub String);

/// `NAME[:TAG]` → (name, tag), `latest` by default. Plain characters only: the name is a directory of
/// the node's image store, never a path.
pub fn parse_image_ref(image: &str) -> Result<(String, String), BadImageRef> {
    let (name, tag) = image.split_once(':').unwrap_or((image, "latest"));
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if plain(name) && plain(tag) {
        Ok((name.to_string(), tag.to_string()))
    } else {
        Err(BadImageRef(image.to_string()))
    }
}

/// Whether `target` may be mounted over: absolute, normal (no `.`/`..`), not `/` and not in the
/// kernel's or the system's own trees.
pub fn valid_target(target: &str) -> Result<(), String> {
    let p = Path::new(target);
    if !p.is_absolute() {
        return Err("an absolute path".into());
    }
    // (Not `components()` alone: it drops `.` segments silently.)
    if target.split('/').skip(1).any(|s| s == "." || s == "..")
        || p.components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err("no `.` or `..` segments".into());
    }
    let first = p
        .components()
        .nth(1)
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    match first.as_deref() {
        None => Err("not `/` itself".into()),
        Some("proc" | "sys" | "dev" | "run" | "etc" | "bin" | "sbin" | "lib" | "lib64" | "usr" | "boot") => {
            Err("not in a system directory (/proc, /sys, /dev, /run, /etc, /usr, ...)".into())
        }
        Some(_) => Ok(()),
    }
}
