//! An allocation's data on this node (book: "Allocation Data Lifecycle", "Sane Defaults"): the data
//! mounts it declares and the ones every allocation gets, resolved to directories of this node.
//!
//! A site mounts its storage on the nodes once — VAST's NFS export, an S3 bucket through a FUSE or
//! native client — and names those roots with `--data-root nfs=/mnt/vast --data-root s3=/mnt/s3`.
//! A mount `nfs://home/alice` → `/home/alice` is then a bind mount of `/mnt/vast/home/alice` at
//! `/home/alice`, made in the allocation's private mount namespace (only its processes see it, and it
//! goes with them: nothing to unmount, also after an agent restart). `access: read-only` makes it
//! read-only. The defaults (`data.defaults`, on unless `false`):
//! - the home directory `nfs://home/{user}` at `/home/{user}`, when this node has an `nfs` root and
//!   the directory exists there;
//! - the output directory `s3://{tenant}/{project}/{alloc}/`, created (it outlives the allocation:
//!   user-managed) and named by `LATTICE_OUTPUT_DIR`;
//! - with a checkpoint strategy, its `checkpoints/` under it, named by `LATTICE_CHECKPOINT_DIR`.
//!
//! A declared mount this node cannot provide (no root for its scheme, a source that is not there) is
//! a prologue failure naming it: the control plane retries the allocation on other nodes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One mount an allocation declares (`data.mounts[i]` with a `target`), and the rule for its
/// target (wire types, checked by the control plane too: `lattice-agent-protocol`).
pub use lattice_agent_protocol::{DataMount, valid_target};
use lattice_util::fs::segment;

/// A bind mount to make in the allocation's mount namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    pub from: PathBuf,
    pub at: PathBuf,
    pub read_only: bool,
}

/// What the allocation's data needs on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub binds: Vec<Bind>,
    /// `LATTICE_OUTPUT_DIR`, `LATTICE_CHECKPOINT_DIR`.
    pub env: Vec<(String, String)>,
}

/// Who the allocation is and what it asked for.
#[derive(Clone, Debug, Default)]
pub struct Request<'a> {
    pub alloc: &'a str,
    pub tenant: &'a str,
    pub project: Option<&'a str>,
    pub user: Option<&'a str>,
    pub mounts: &'a [DataMount],
    pub defaults: bool,
    pub checkpoints: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DataError {
    #[error("data mount failed: {mount}: no --data-root for `{scheme}` on this node")]
    NoRoot { mount: String, scheme: String },
    #[error("data mount failed: {mount}: {message}")]
    Source { mount: String, message: String },
    #[error("data mount failed: {target}: {message}")]
    Target { target: String, message: String },
    #[error("output directory {path}: {message}")]
    Output { path: String, message: String },
}

/// `--data-root SCHEME=DIR`.
pub fn parse_root(s: &str) -> Result<(String, PathBuf), String> {
    let (scheme, dir) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected SCHEME=DIR (nfs=/mnt/vast)"))?;
    if scheme.is_empty() || !scheme.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err(format!(
            "`{scheme}`: a scheme is lowercase letters and digits (nfs, s3)"
        ));
    }
    let dir = PathBuf::from(dir);
    if !dir.is_absolute() {
        return Err(format!("`{}`: an absolute directory", dir.display()));
    }
    Ok((scheme.to_string(), dir))
}

/// `SCHEME://PATH` as the directory it is on this node: `PATH` under the scheme's root. `..`, empty
/// and `.` segments are refused (a source never leaves its root).
pub fn resolve(roots: &BTreeMap<String, PathBuf>, source: &str) -> Result<PathBuf, DataError> {
    let bad = |message: &str| DataError::Source {
        mount: source.to_string(),
        message: message.to_string(),
    };
    let (scheme, rest) = source
        .split_once("://")
        .ok_or_else(|| bad("expected SCHEME://PATH (nfs://home/alice, s3://bucket/key)"))?;
    let root = roots.get(scheme).ok_or_else(|| DataError::NoRoot {
        mount: source.to_string(),
        scheme: scheme.to_string(),
    })?;
    let mut out = root.clone();
    for seg in rest.split('/').filter(|s| !s.is_empty()) {
        if seg == "." || seg == ".." || seg.contains('\0') {
            return Err(bad("a path segment is `.` or `..`"));
        }
        out.push(seg);
    }
    Ok(out)
}

/// `text` with the seed's placeholders filled in: `{user}`, `{tenant}`, `{project}`,
/// `{allocation_id}` (each as one safe path segment).
pub fn expand(text: &str, req: &Request) -> String {
    text.replace("{user}", &segment(req.user.unwrap_or("_")))
        .replace("{tenant}", &segment(req.tenant))
        .replace("{project}", &segment(req.project.unwrap_or("default")))
        .replace("{allocation_id}", &segment(req.alloc))
}

/// The plan for `req` on a node with `roots`; creates the output (and checkpoint) directory.
pub fn plan(roots: &BTreeMap<String, PathBuf>, req: &Request) -> Result<Plan, DataError> {
    let mut plan = Plan::default();
    for m in req.mounts {
        let (source, target) = (expand(&m.source, req), expand(&m.target, req));
        valid_target(&target).map_err(|message| DataError::Target {
            target: target.clone(),
            message,
        })?;
        let from = resolve(roots, &source)?;
        if !from.exists() {
            return Err(DataError::Source {
                mount: source,
                message: format!("{} does not exist on this node", from.display()),
            });
        }
        plan.binds.push(Bind {
            from,
            at: PathBuf::from(&target),
            read_only: m.read_only,
        });
    }
    if !req.defaults {
        return Ok(plan);
    }
    if let Some(user) = req.user {
        let at = PathBuf::from("/home").join(segment(user));
        let declared = plan.binds.iter().any(|b| b.at == at);
        if !declared
            && let Ok(from) = resolve(roots, &format!("nfs://home/{}", segment(user)))
            && from.is_dir()
        {
            plan.binds.push(Bind {
                from,
                at,
                read_only: false,
            });
        }
    }
    let output = format!(
        "s3://{}/{}/{}/",
        segment(req.tenant),
        segment(req.project.unwrap_or("default")),
        segment(req.alloc)
    );
    if let Ok(dir) = resolve(roots, &output) {
        let create = |d: &Path| {
            std::fs::create_dir_all(d).map_err(|e| DataError::Output {
                path: d.display().to_string(),
                message: e.to_string(),
            })
        };
        create(&dir)?;
        plan.env.push(("LATTICE_OUTPUT_DIR".into(), dir.display().to_string()));
        if req.checkpoints {
            let c = dir.join("checkpoints");
            create(&c)?;
            plan.env
                .push(("LATTICE_CHECKPOINT_DIR".into(), c.display().to_string()));
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(dir: &Path) -> BTreeMap<String, PathBuf> {
        BTreeMap::from([("nfs".into(), dir.join("vast")), ("s3".into(), dir.join("s3"))])
    }

    #[test]
    fn sources_resolve_under_their_schemes_root_and_never_leave_it() {
        let r = roots(Path::new("/site"));
        assert_eq!(
            resolve(&r, "nfs://home/alice").unwrap(),
            Path::new("/site/vast/home/alice")
        );
        assert_eq!(
            resolve(&r, "s3://datasets//imagenet/").unwrap(),
            Path::new("/site/s3/datasets/imagenet")
        );
        assert!(matches!(
            resolve(&r, "nfs://home/../../etc"),
            Err(DataError::Source { .. })
        ));
        assert!(matches!(resolve(&r, "/home/alice"), Err(DataError::Source { .. })));
        let e = resolve(&r, "gs://x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "data mount failed: gs://x: no --data-root for `gs` on this node"
        );
        assert_eq!(
            parse_root("nfs=/mnt/vast").unwrap(),
            ("nfs".into(), PathBuf::from("/mnt/vast"))
        );
        assert!(parse_root("nfs").is_err() && parse_root("nfs=rel").is_err() && parse_root("N=/x").is_err());
    }

    #[test]
    fn targets_are_absolute_normal_and_outside_system_trees() {
        for ok in ["/data/input", "/home/alice", "/scratch/x", "/opt/x"] {
            assert_eq!(valid_target(ok), Ok(()), "{ok}");
        }
        for bad in [
            "data",
            "/",
            "/data/../etc",
            "/./x",
            "/proc/1",
            "/etc",
            "/usr/lib",
            "/dev/shm",
        ] {
            assert!(valid_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn declared_mounts_and_the_defaults_home_output_and_checkpoints() {
        let dir = std::env::temp_dir().join(format!("lattice-data-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("vast/home/alice")).unwrap();
        std::fs::create_dir_all(dir.join("s3/datasets/imagenet")).unwrap();
        let r = roots(&dir);
        let mounts = [
            DataMount {
                source: "s3://datasets/imagenet".into(),
                target: "/data/input".into(),
                read_only: true,
            },
            // The seed's own example, placeholders filled in.
            DataMount {
                source: "nfs://home/{user}".into(),
                target: "/home/{user}".into(),
                read_only: false,
            },
        ];
        let req = Request {
            alloc: "a-000007",
            tenant: "ml",
            project: Some("vision"),
            user: Some("alice"),
            mounts: &mounts,
            defaults: true,
            checkpoints: true,
        };
        let p = plan(&r, &req).unwrap();
        assert_eq!(
            p.binds,
            [
                Bind {
                    from: dir.join("s3/datasets/imagenet"),
                    at: "/data/input".into(),
                    read_only: true
                },
                Bind {
                    from: dir.join("vast/home/alice"),
                    at: "/home/alice".into(),
                    read_only: false
                },
            ]
        );
        let out = dir.join("s3/ml/vision/a-000007");
        assert_eq!(
            p.env,
            [
                ("LATTICE_OUTPUT_DIR".to_string(), out.display().to_string()),
                (
                    "LATTICE_CHECKPOINT_DIR".to_string(),
                    out.join("checkpoints").display().to_string()
                ),
            ]
        );
        assert!(out.join("checkpoints").is_dir());
        // Without defaults: only what it declared. No home directory there: no home mount.
        let p = plan(
            &r,
            &Request {
                defaults: false,
                mounts: &mounts[..1],
                ..req.clone()
            },
        )
        .unwrap();
        assert_eq!(p.binds.len(), 1);
        assert!(p.env.is_empty());
        let p = plan(
            &r,
            &Request {
                user: Some("bob"),
                mounts: &[],
                ..req.clone()
            },
        )
        .unwrap();
        assert!(p.binds.is_empty());
        // The defaults' home is not mounted twice when declared.
        let p = plan(
            &r,
            &Request {
                mounts: &mounts[1..],
                ..req.clone()
            },
        )
        .unwrap();
        assert_eq!(p.binds.len(), 1);
        // A source missing here, or a bad target: a prologue failure naming it.
        let missing = [DataMount {
            source: "nfs://projects/gone".into(),
            target: "/data".into(),
            read_only: false,
        }];
        let e = plan(
            &r,
            &Request {
                mounts: &missing,
                ..req.clone()
            },
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with("data mount failed: nfs://projects/gone: "),
            "{e}"
        );
        let bad = [DataMount {
            target: "/etc/passwd".into(),
            ..mounts[0].clone()
        }];
        assert!(matches!(
            plan(&r, &Request { mounts: &bad, ..req }),
            Err(DataError::Target { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
