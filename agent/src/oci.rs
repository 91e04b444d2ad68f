//! OCI images (book: "Sarus Runtime", the `environment.image` of a submission): an allocation's
//! processes run in a container of its image, through a real OCI runtime behind the
//! [`ContainerRuntime`] port. The seed's Sarus is not packaged for Debian; [`OciEngine`] drives any
//! OCI runtime CLI that takes a bundle — `runc` (the default), `crun` — with images from a node-local
//! store of OCI image layouts (`--oci-images DIR`: `DIR/NAME` is a layout, its tags the versions; no
//! registry access), unpacked with `umoci`. A site with Sarus implements the same port.
//!
//! The container gets the image's root filesystem, environment and working directory; the entrypoint
//! runs as `/bin/sh -c` in it with the allocation's variables on top; the node's network (HPC jobs
//! talk to each other and to the fabric) and the allocation's scratch directory (bind-mounted at the
//! same path). Its bundle is removed and the container deleted when the process ends — also for one
//! a restarted agent took over.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OciError {
    #[error("image {0:?}: expected NAME[:TAG] (letters, digits, . _ -)")]
    BadReference(String),
    #[error("image {image}: no OCI image store configured on this node (--oci-images)")]
    NoStore { image: String },
    #[error("image {image}: not in the node's image store ({path})")]
    Missing { image: String, path: String },
    #[error("image {image}: unpacking failed: {message}")]
    Unpack { image: String, message: String },
    #[error("image {image}: its configuration: {message}")]
    Config { image: String, message: String },
}

/// `NAME[:TAG]` → (name, tag), `latest` by default. Plain characters only: the name is a directory of
/// the store, never a path.
pub fn parse_ref(image: &str) -> Result<(String, String), OciError> {
    lattice_agent_protocol::parse_image_ref(image).map_err(|e| OciError::BadReference(e.0))
}

/// A container prepared for one allocation on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The container's name for the runtime (`lattice-ID`).
    pub container: String,
    /// What the allocation's wrapper runs (`sh -c`) instead of the entrypoint.
    pub command: String,
}

/// How an allocation's processes run in a container.
pub trait ContainerRuntime: Send + Sync {
    /// Unpacks `image` for allocation `id` and writes its container's configuration: `entrypoint` with
    /// `env`, the node's network, `binds` (a node directory at a path inside).
    fn prepare(
        &self,
        id: &str,
        image: &str,
        entrypoint: &str,
        env: &[(String, String)],
        binds: &[crate::data::Bind],
    ) -> Result<Prepared, OciError>;
    /// Deletes the container and its bundle (also a half-prepared one).
    fn cleanup(&self, container: &str);
}

/// An OCI runtime CLI (`runc`, `crun`) with images from a store of OCI layouts, unpacked by `umoci`.
#[derive(Clone, Debug)]
pub struct OciEngine {
    /// The image store: `DIR/NAME` are OCI image layouts.
    pub images: Option<PathBuf>,
    /// Where bundles are unpacked (`DIR/lattice-ID/`).
    pub bundles: PathBuf,
    /// The OCI runtime's program.
    pub runtime: String,
}

/// The container's name for allocation `id` (a task group element's brackets become `_`).
fn container_of(id: &str) -> Option<String> {
    let s: String = id
        .chars()
        .map(|c| if matches!(c, '[' | ']') { '_' } else { c })
        .collect();
    let plain = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    plain.then(|| format!("lattice-{s}"))
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl OciEngine {
    fn bundle(&self, container: &str) -> PathBuf {
        self.bundles.join(container)
    }
}

impl ContainerRuntime for OciEngine {
    fn prepare(
        &self,
        id: &str,
        image: &str,
        entrypoint: &str,
        env: &[(String, String)],
        binds: &[crate::data::Bind],
    ) -> Result<Prepared, OciError> {
        let (name, tag) = parse_ref(image)?;
        let store = self.images.as_ref().ok_or_else(|| OciError::NoStore {
            image: image.to_string(),
        })?;
        let layout = store.join(&name);
        if !layout.join("index.json").is_file() {
            return Err(OciError::Missing {
                image: image.to_string(),
                path: layout.display().to_string(),
            });
        }
        let container = container_of(id).ok_or_else(|| OciError::Config {
            image: image.to_string(),
            message: format!("allocation id {id:?} is not a plain name"),
        })?;
        self.cleanup(&container);
        let bundle = self.bundle(&container);
        let unpack_err = |message: String| OciError::Unpack {
            image: image.to_string(),
            message,
        };
        std::fs::create_dir_all(&self.bundles).map_err(|e| unpack_err(e.to_string()))?;
        let out = Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{tag}", layout.display()))
            .arg(&bundle)
            .output()
            .map_err(|e| unpack_err(format!("umoci: {e}")))?;
        if !out.status.success() {
            self.cleanup(&container);
            return Err(unpack_err(String::from_utf8_lossy(&out.stderr).trim().to_string()));
        }
        let cfg_err = |message: String| OciError::Config {
            image: image.to_string(),
            message,
        };
        let path = bundle.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| cfg_err(e.to_string()))?;
        let mut cfg: serde_json::Value = serde_json::from_str(&text).map_err(|e| cfg_err(e.to_string()))?;
        configure(&mut cfg, entrypoint, env, binds, &container);
        std::fs::write(&path, serde_json::to_vec_pretty(&cfg).unwrap_or_default())
            .map_err(|e| cfg_err(e.to_string()))?;
        // `run` stays in the foreground (stdio inherited: the allocation's log) and forwards signals
        // to the container: the walltime's SIGTERM reaches the job.
        let command = format!(
            "exec {} run --bundle {} {}",
            quote(&self.runtime),
            quote(&bundle.display().to_string()),
            quote(&container)
        );
        Ok(Prepared { container, command })
    }

    fn cleanup(&self, container: &str) {
        if container_of(container.trim_start_matches("lattice-")).as_deref() != Some(container) {
            return;
        }
        let _ = Command::new(&self.runtime)
            .args(["delete", "--force", container])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(self.bundle(container));
    }
}

/// The container's configuration: the entrypoint in `sh -c` with the image's environment and `env`
/// on top, no terminal, the host's network, `binds` (read-only where they say so).
pub fn configure(
    cfg: &mut serde_json::Value,
    entrypoint: &str,
    env: &[(String, String)],
    binds: &[crate::data::Bind],
    hostname: &str,
) {
    use serde_json::{Value, json};
    let mut vars: Vec<(String, String)> = cfg["process"]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str()?.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    for (k, v) in env {
        // The image's PATH stays: the host's would name programs the image does not have.
        if k == "PATH" {
            continue;
        }
        vars.retain(|(x, _)| x != k);
        vars.push((k.clone(), v.clone()));
    }
    if !vars.iter().any(|(k, _)| k == "PATH") {
        vars.push((
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ));
    }
    cfg["process"]["env"] = json!(vars.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>());
    cfg["process"]["args"] = json!(["/bin/sh", "-c", entrypoint]);
    cfg["process"]["terminal"] = json!(false);
    cfg["hostname"] = json!(hostname);
    if let Some(ns) = cfg["linux"]["namespaces"].as_array_mut() {
        ns.retain(|n| n["type"] != "network");
    }
    // The host's resolver inside, for the node's network.
    let mut mounts: Vec<Value> = cfg["mounts"].as_array().cloned().unwrap_or_default();
    for b in binds {
        let mode = if b.read_only { "ro" } else { "rw" };
        mounts.push(json!({"destination": b.at.display().to_string(), "type": "bind",
            "source": b.from.display().to_string(), "options": ["rbind", mode]}));
    }
    if Path::new("/etc/resolv.conf").is_file() {
        mounts.push(json!({"destination": "/etc/resolv.conf", "type": "bind",
            "source": "/etc/resolv.conf", "options": ["rbind", "ro"]}));
    }
    cfg["mounts"] = json!(mounts);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_are_plain_names_with_a_tag() {
        assert_eq!(parse_ref("busybox").unwrap(), ("busybox".into(), "latest".into()));
        assert_eq!(
            parse_ref("pytorch:24.1-py3").unwrap(),
            ("pytorch".into(), "24.1-py3".into())
        );
        for bad in ["", ":x", "a:", "../x", "a/b", "..", "a:b:c", "a b"] {
            assert!(parse_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_configuration_runs_the_entrypoint_on_the_hosts_network_with_binds() {
        let mut cfg = json!({
            "process": {"args": ["sh"], "env": ["PATH=/bin", "HOME=/root"], "terminal": true},
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]
        });
        let env = vec![
            ("PATH".to_string(), "/host/bin".to_string()),
            ("HOME".to_string(), "/home/u".to_string()),
            ("LATTICE_ALLOC_ID".to_string(), "a-1".to_string()),
        ];
        configure(
            &mut cfg,
            "echo hi",
            &env,
            &[
                crate::data::Bind {
                    from: "/scratch/local/a-1".into(),
                    at: "/scratch/local/a-1".into(),
                    read_only: false,
                },
                crate::data::Bind {
                    from: "/mnt/s3/datasets/imagenet".into(),
                    at: "/data/input".into(),
                    read_only: true,
                },
            ],
            "lattice-a-1",
        );
        assert_eq!(cfg["process"]["args"], json!(["/bin/sh", "-c", "echo hi"]));
        assert_eq!(cfg["process"]["terminal"], json!(false));
        assert_eq!(
            cfg["process"]["env"],
            json!(["PATH=/bin", "HOME=/home/u", "LATTICE_ALLOC_ID=a-1"])
        );
        assert_eq!(cfg["linux"]["namespaces"], json!([{"type": "pid"}, {"type": "mount"}]));
        let mounts = cfg["mounts"].as_array().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m["destination"] == "/scratch/local/a-1" && m["type"] == "bind")
        );
        assert!(mounts.iter().any(|m| m["destination"] == "/data/input"
            && m["source"] == "/mnt/s3/datasets/imagenet"
            && m["options"] == json!(["rbind", "ro"])));
        assert_eq!(cfg["hostname"], "lattice-a-1");
    }

    #[test]
    fn a_missing_store_or_image_is_a_clear_error_and_ids_stay_names() {
        let e = OciEngine {
            images: None,
            bundles: std::env::temp_dir(),
            runtime: "runc".into(),
        };
        assert!(matches!(
            e.prepare("a-1", "busybox", "true", &[], &[]),
            Err(OciError::NoStore { .. })
        ));
        let e = OciEngine {
            images: Some(std::env::temp_dir().join("no-such-store")),
            ..e
        };
        let err = e.prepare("a-1", "busybox:1", "true", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("not in the node's image store"), "{err}");
        assert_eq!(container_of("a-000001[3]"), Some("lattice-a-000001_3_".into()));
        assert_eq!(container_of("../x"), None);
        assert_eq!(container_of("a-000001"), Some("lattice-a-000001".into()));
    }
}
