//! What the node is: capabilities (CPU cores, memory, GPUs, features) and the conformance fingerprint
//! — SHA-256 over the sorted component list (GPU driver, NIC firmware, BIOS, kernel version and
//! command line, base image), so nodes that differ in any of them get different fingerprints (book:
//! "Conformance"). Components that cannot be read are recorded as `unknown`, never skipped, so two
//! nodes only match when they agree on what is readable too.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// What an agent reports at registration.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Capabilities {
    pub cpu_cores: u32,
    pub memory_gib: f64,
    pub gpu_count: u32,
    pub gpu_model: Option<String>,
    /// Memory of each GPU, GiB (the checkpoint broker's size estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_gib: Option<f64>,
    /// e.g. `nvme_scratch` when /local or /scratch is mounted.
    pub features: Vec<String>,
}

/// Where the components are read from (a root other than `/` in tests).
pub struct Sources<'a> {
    pub root: &'a Path,
}

impl Default for Sources<'_> {
    fn default() -> Self {
        Sources { root: Path::new("/") }
    }
}

impl Sources<'_> {
    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// The component list: name → value (`unknown` when unreadable).
    pub fn components(&self) -> BTreeMap<String, String> {
        let mut c = BTreeMap::new();
        let mut put = |k: &str, v: Option<String>| {
            c.insert(k.to_string(), v.unwrap_or_else(|| "unknown".into()));
        };
        put("kernel_version", self.read("proc/sys/kernel/osrelease"));
        put("kernel_cmdline", self.read("proc/cmdline"));
        put("bios_version", self.read("sys/class/dmi/id/bios_version"));
        put("gpu_driver", self.read("proc/driver/nvidia/version").map(first_line));
        put("nic_firmware", self.nic_firmware());
        put(
            "base_image",
            std::fs::read(self.root.join("etc/os-release"))
                .ok()
                .map(|b| hex(&Sha256::digest(b))),
        );
        c
    }

    /// The sorted firmware versions of the NICs that expose one (`/sys/class/net/*/device/firmware_version`).
    fn nic_firmware(&self) -> Option<String> {
        let dir = std::fs::read_dir(self.root.join("sys/class/net")).ok()?;
        let mut v: Vec<String> = dir
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                self.read(&format!("sys/class/net/{name}/device/firmware_version"))
                    .map(|f| format!("{name}={f}"))
            })
            .collect();
        v.sort();
        (!v.is_empty()).then(|| v.join(","))
    }

    pub fn capabilities(&self) -> Capabilities {
        let cpu_cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let memory_gib = self
            .read("proc/meminfo")
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
            .map_or(0.0, |kb| kb / (1024.0 * 1024.0));
        let mut features = Vec::new();
        for (dir, f) in [("local", "nvme_scratch"), ("scratch", "nvme_scratch")] {
            if self.root.join(dir).is_dir() && !features.iter().any(|x| x == f) {
                features.push(f.to_string());
            }
        }
        Capabilities {
            cpu_cores,
            memory_gib: (memory_gib * 10.0).round() / 10.0,
            gpu_count: 0,
            gpu_model: None,
            gpu_memory_gib: None,
            features,
        }
    }
}

fn first_line(s: String) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// SHA-256 of the sorted `name=value` lines.
pub fn fingerprint(components: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in components {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(kernel: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lattice-agent-disc-{}-{kernel}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for (p, v) in [
            ("proc/sys/kernel/osrelease", kernel),
            ("proc/cmdline", "quiet"),
            ("proc/meminfo", "MemTotal:       16777216 kB\n"),
            ("etc/os-release", "ID=sles\n"),
            ("sys/class/net/hsn0/device/firmware_version", "1.5.41"),
        ] {
            std::fs::create_dir_all(d.join(p).parent().unwrap()).unwrap();
            std::fs::write(d.join(p), v).unwrap();
        }
        std::fs::create_dir_all(d.join("local")).unwrap();
        d
    }

    #[test]
    fn the_fingerprint_follows_every_component_and_unknowns_are_kept() {
        let (a, b) = (root("6.4.0"), root("6.5.0"));
        let ca = Sources { root: &a }.components();
        let cb = Sources { root: &b }.components();
        assert_eq!(ca["kernel_version"], "6.4.0");
        assert_eq!(ca["nic_firmware"], "hsn0=1.5.41");
        assert_eq!(ca["bios_version"], "unknown");
        assert_eq!(ca.len(), 6);
        assert_ne!(fingerprint(&ca), fingerprint(&cb), "a kernel difference changes it");
        assert_eq!(
            fingerprint(&ca),
            fingerprint(&Sources { root: &a }.components()),
            "stable"
        );
        assert_eq!(fingerprint(&ca).len(), 64);
        let caps = Sources { root: &a }.capabilities();
        assert_eq!(caps.memory_gib, 16.0);
        assert_eq!(caps.features, ["nvme_scratch"]);
        assert_eq!(caps.gpu_count, 0);
    }
}
