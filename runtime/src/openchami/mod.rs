//! OpenCHAMI (`services.openchami`): the node inventory from SMD instead of the config's list, kept
//! in step with SMD, and drifted nodes flagged there for remediation (book: "Bootstrap Sequence",
//! "Node Conformance").
//!
//! - **Inventory.** At start, SMD's node components (sorted by xname) become the nodes; the SMD
//!   groups a node belongs to give its capabilities (`groups:` maps a group label to GPUs, cores,
//!   memory, features, power, conformance group, home vCluster and conformance baseline), and a
//!   `dragonfly-N` group its dragonfly group. The inventory read is kept in `DATA_DIR` so a member
//!   restarting while SMD is down starts from the last one (with a warning).
//! - **Refresh.** Every `refresh`, SMD's component states are read again: a node SMD reports off,
//!   halted, disabled or flagged `Alert` is taken out of service (its allocation requeued or failed
//!   as for a hardware failure); one SMD reports usable again is back. A compute node SMD gained
//!   joins (every member learns it; the leader schedules on it from its next pass, and a leader
//!   elected later starts with it — one whose refresh has not seen it yet reads SMD at once when the
//!   quorum gives it to an allocation): its groups give its entry as at the start, it is `Booting`
//!   until its agent registers (with real agents), and the trace capture writes it as `node_added`.
//! - **Drift.** A drifted node is flagged `Warning` with `conformance_drift: expected=…, actual=…`
//!   (`PATCH /hsm/v2/State/Components/{xname}`); the flag is cleared (`OK`) when it conforms again.
//!
//! This module holds the configuration, the inventory and the types the running member keeps;
//! [`sync`] keeps the nodes in step with SMD and [`boot`] drives one node's boots and wipes.

pub mod boot;
pub mod sync;

use lattice_adapters::openchami::{Component, Group, OpenChami};
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The inventory kept in the data folder (SMD unreachable at the next start).
pub(crate) const CACHE: &str = "openchami-inventory.json";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenChamiConfig {
    /// SMD's base URL (`…/hsm/v2/…` is appended).
    pub smd_url: String,
    /// BSS's base URL (default: `smd_url`, one gateway).
    pub bss_url: Option<String>,
    /// PCS's base URL (default: `smd_url`).
    pub pcs_url: Option<String>,
    /// Bearer token; read from this environment variable.
    pub token_env: Option<String>,
    #[serde(default = "timeout_default")]
    pub timeout: String,
    #[serde(default = "retries_default")]
    pub retries: u32,
    /// How often SMD's component states are read again.
    #[serde(default = "refresh_default")]
    pub refresh: String,
    /// SMD group label → what its member nodes are.
    #[serde(default)]
    pub groups: BTreeMap<String, GroupSpec>,
    /// Groups named `<prefix>N` put their members in dragonfly group N.
    #[serde(default = "dragonfly_default")]
    pub dragonfly_prefix: String,
    /// The secure-wipe image: with it, OpenCHAMI wipes released sensitive nodes (instead of the
    /// agents' `--wipe-command`).
    pub wipe: Option<BootImage>,
    /// The hardened image (book: "OS Image": minimal kernel, SELinux enforcing, no SSH, auditd):
    /// with it, a committed sensitive claim's nodes boot it before the claim starts (those already
    /// running it do not boot again); its boot sets the node's SMD `SoftwareStatus` to `Hardened`
    /// (or `BootFailed`).
    pub hardened: Option<BootImage>,
}

/// An image OpenCHAMI boots a node into through BSS for a step of the sensitive lifecycle: the
/// wipe (book: "Sensitive Release Sequence": GPU memory clear, NVMe secure erase, RAM scrub; it sets
/// SMD's `SoftwareStatus` to `Wiped` or `WipeFailed` when done) or the hardened OS (`Hardened` or
/// `BootFailed`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootImage {
    pub kernel: String,
    #[serde(default)]
    pub initrd: String,
    #[serde(default)]
    pub params: String,
    /// How often SMD is asked for the outcome.
    #[serde(default = "poll_default")]
    pub poll: String,
}

fn poll_default() -> String {
    "5s".into()
}

/// What an SMD group says of its members (fields a node's groups do not set keep their defaults;
/// a later group, by label, overrides an earlier one).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    pub gpu_type: Option<String>,
    pub gpu_count: Option<u32>,
    pub cpu_cores: Option<u32>,
    pub memory_gb: Option<u32>,
    #[serde(default)]
    pub features: Vec<String>,
    pub power_kw: Option<f64>,
    /// The conformance group (any name; equal names = one group).
    pub conformance: Option<String>,
    /// Home vCluster.
    pub vcluster: Option<String>,
    /// The conformance fingerprint (SHA-256, hex) the agents of these nodes must report.
    pub baseline: Option<String>,
}

fn timeout_default() -> String {
    "10s".into()
}
fn retries_default() -> u32 {
    3
}
fn refresh_default() -> String {
    "5m".into()
}
fn dragonfly_default() -> String {
    "dragonfly-".into()
}

impl OpenChamiConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (k, u) in [
            ("smd_url", Some(&self.smd_url)),
            ("bss_url", self.bss_url.as_ref()),
            ("pcs_url", self.pcs_url.as_ref()),
        ] {
            if let Some(u) = u
                && !(u.starts_with("http://") || u.starts_with("https://"))
            {
                return Err(format!("{k}: `{u}`: an http(s) URL"));
            }
        }
        lattice_traces::parse_duration(&self.timeout).map_err(|m| format!("timeout: {m}"))?;
        lattice_traces::parse_duration(&self.refresh).map_err(|m| format!("refresh: {m}"))?;
        for (key, image) in [("wipe", &self.wipe), ("hardened", &self.hardened)] {
            if let Some(w) = image {
                lattice_traces::parse_duration(&w.poll).map_err(|m| format!("{key}.poll: {m}"))?;
                if w.kernel.is_empty() {
                    return Err(format!("{key}.kernel: the {key} image's kernel"));
                }
            }
        }
        for (label, g) in &self.groups {
            if let Some(b) = &g.baseline
                && (b.len() != 64 || !b.bytes().all(|c| c.is_ascii_hexdigit()))
            {
                return Err(format!("groups.{label}.baseline: a SHA-256 in hex (64 characters)"));
            }
        }
        Ok(())
    }

    pub fn client(&self) -> Result<OpenChami, String> {
        let http = |url: &str| {
            let mut h = lattice_adapters::http::HttpConfig::new(url);
            h.timeout =
                std::time::Duration::from_millis(lattice_traces::parse_duration(&self.timeout).map_or(10_000, |d| d.0));
            h.retries = self.retries;
            h.token = self.token_env.as_ref().and_then(|v| std::env::var(v).ok());
            h
        };
        OpenChami::new(
            http(&self.smd_url),
            http(self.bss_url.as_deref().unwrap_or(&self.smd_url)),
            http(self.pcs_url.as_deref().unwrap_or(&self.smd_url)),
        )
        .map_err(|e| e.to_string())
    }

    pub fn refresh_period(&self) -> std::time::Duration {
        std::time::Duration::from_millis(lattice_traces::parse_duration(&self.refresh).map_or(300_000, |d| d.0))
    }
}

/// What the inventory is built from: SMD's node components and groups.
#[derive(Clone, Debug, serde::Serialize, Deserialize)]
pub struct Smd {
    pub components: Vec<Component>,
    pub groups: Vec<Group>,
}

/// The runtime's inventory from SMD, and each node's conformance baseline (if its groups name one).
pub fn inventory(
    cfg: &OpenChamiConfig,
    smd: &Smd,
) -> Result<(lattice_traces::Inventory, BTreeMap<String, String>), String> {
    let mut baselines = BTreeMap::new();
    let mut nodes = Vec::new();
    for e in entries(cfg, smd, &BTreeSet::new()) {
        if let Some(b) = e.baseline {
            baselines.insert(e.name, b);
        }
        nodes.push(e.entry);
    }
    if nodes.is_empty() {
        return Err("SMD lists no compute nodes".into());
    }
    // JSON is YAML: the inventory file's own reader checks it.
    let text = json!({ "nodes": nodes }).to_string();
    let inv = lattice_traces::parse_inventory("SMD", &text).map_err(|e| e.to_string())?;
    Ok((inv, baselines))
}

/// One SMD compute node as an inventory entry.
#[derive(Clone, Debug)]
pub struct NodeEntry {
    pub name: String,
    /// The inventory file's node entry (what `node_added` trace events carry).
    pub entry: serde_json::Value,
    /// Its conformance baseline, if its groups name one (lower case).
    pub baseline: Option<String>,
    /// SMD reports it usable (else it starts Down).
    pub usable: bool,
    /// This member's control plane refused it ([`join`]).
    pub refused: bool,
}

/// SMD's compute nodes not in `known`, by xname, as inventory entries (see the module's doc).
pub fn entries(cfg: &OpenChamiConfig, smd: &Smd, known: &BTreeSet<String>) -> Vec<NodeEntry> {
    let mut nodes: Vec<&Component> = smd
        .components
        .iter()
        .filter(|c| c.kind.is_empty() || c.kind == "Node")
        .filter(|c| c.role.as_deref().is_none_or(|r| r == "Compute"))
        .filter(|c| !known.contains(&c.id))
        .collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    let mut member_of: BTreeMap<&str, Vec<&Group>> = BTreeMap::new();
    let mut groups: Vec<&Group> = smd.groups.iter().collect();
    groups.sort_by(|a, b| a.label.cmp(&b.label));
    for g in groups {
        for id in &g.members.ids {
            member_of.entry(id.as_str()).or_default().push(g);
        }
    }
    let mut entries = Vec::new();
    for c in nodes {
        let mut spec = GroupSpec::default();
        let mut dragonfly = 0u32;
        for g in member_of.get(c.id.as_str()).into_iter().flatten() {
            if let Some(n) = g.label.strip_prefix(&cfg.dragonfly_prefix).and_then(|n| n.parse().ok()) {
                dragonfly = n;
            }
            let Some(s) = cfg.groups.get(&g.label) else { continue };
            let s = s.clone();
            spec.gpu_type = s.gpu_type.or(spec.gpu_type);
            spec.gpu_count = s.gpu_count.or(spec.gpu_count);
            spec.cpu_cores = s.cpu_cores.or(spec.cpu_cores);
            spec.memory_gb = s.memory_gb.or(spec.memory_gb);
            spec.power_kw = s.power_kw.or(spec.power_kw);
            spec.conformance = s.conformance.or(spec.conformance);
            spec.vcluster = s.vcluster.or(spec.vcluster);
            spec.baseline = s.baseline.or(spec.baseline);
            spec.features.extend(s.features);
        }
        spec.features.sort();
        spec.features.dedup();
        let baseline = spec.baseline.as_ref().map(|b| b.to_ascii_lowercase());
        let mut e = json!({
            "name": c.id,
            "gpu_count": spec.gpu_count.unwrap_or(0),
            "cpu_cores": spec.cpu_cores.unwrap_or(0),
            "memory_gb": spec.memory_gb.unwrap_or(0),
            "features": spec.features,
            "group": dragonfly,
            "conformance": spec.conformance.unwrap_or_default(),
            "power_kw": spec.power_kw.unwrap_or(0.0),
            "state": if c.usable() { "ready" } else { "down" },
        });
        if let Some(t) = spec.gpu_type {
            e["gpu_type"] = json!(t);
        }
        if let Some(v) = spec.vcluster {
            e["vcluster"] = json!(v);
        }
        entries.push(NodeEntry {
            name: c.id.clone(),
            entry: e,
            baseline,
            usable: c.usable(),
            refused: false,
        });
    }
    entries
}

/// Reads SMD; on failure, the copy kept at the last successful read (with a warning).
pub async fn read_smd(cfg: &OpenChamiConfig, data_dir: &Path) -> anyhow::Result<Smd> {
    let client = cfg.client().map_err(anyhow::Error::msg)?;
    let fetched = async {
        Ok::<_, lattice_adapters::http::HttpError>(Smd {
            components: client.nodes().await?,
            groups: client.groups().await?,
        })
    }
    .await;
    let cache = data_dir.join(CACHE);
    match fetched {
        Ok(smd) => {
            std::fs::create_dir_all(data_dir)?;
            std::fs::write(&cache, serde_json::to_vec_pretty(&smd)?)?;
            Ok(smd)
        }
        Err(e) => match std::fs::read(&cache) {
            Ok(b) => {
                tracing::warn!(
                    "OpenCHAMI SMD unreachable ({e}): starting from the inventory read last ({})",
                    cache.display()
                );
                Ok(serde_json::from_slice(&b)?)
            }
            Err(_) => anyhow::bail!(
                "services.openchami: the node inventory: {e} (and no earlier copy in {})",
                cache.display()
            ),
        },
    }
}
