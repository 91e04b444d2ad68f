//! Node inventory YAML: a list of node entries, each optionally repeated `count` times.
//!
//! ```yaml
//! nodes:
//!   - prefix: gh          # names gh0000..gh0063 (or `name:` for a single node)
//!     count: 64
//!     gpu_type: GH200
//!     gpu_count: 4
//!     cpu_cores: 72
//!     memory_gb: 512
//!     features: [nvme_scratch]
//!     group: 0            # dragonfly group
//!     conformance: fw-2026-03   # any string; equal strings = one conformance group
//!     vcluster: ml-training     # home vCluster (optional)
//!     state: ready              # initial state (default ready)
//! ```

use crate::duration::parse_duration;
use crate::error::TraceError;
use lattice_engine::{
    ConformanceFingerprint, GroupId, NodeCapabilities, NodeSpec, NodeState, Registry, Time, UnsetCapabilities,
    VClusterId,
};
use serde::Deserialize;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryIn {
    /// Site power budget for busy nodes, kW.
    power_budget_kw: Option<f64>,
    /// Storage bandwidth running allocations may use together, GB/s.
    storage_bandwidth_gbps: Option<f64>,
    /// Hard, system-wide: nodes sensitive allocations may hold.
    sensitive_pool_size: Option<u32>,
    /// Electricity price series (a step function).
    #[serde(default)]
    energy_prices: Vec<PriceIn>,
    nodes: Vec<EntryIn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceIn {
    at: String,
    price: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryIn {
    name: Option<String>,
    prefix: Option<String>,
    #[serde(default = "one")]
    count: u32,
    gpu_type: Option<String>,
    gpu_count: Option<u32>,
    cpu_cores: Option<u32>,
    memory_gb: Option<u32>,
    #[serde(default)]
    features: Vec<String>,
    #[serde(default)]
    group: u32,
    #[serde(default)]
    conformance: String,
    vcluster: Option<String>,
    #[serde(default = "ready")]
    state: NodeState,
    /// Power draw when busy, kW.
    #[serde(default)]
    power_kw: f64,
    /// Unified CPU-GPU memory (GH200, MI300A).
    #[serde(default)]
    unified_memory: bool,
}

fn one() -> u32 {
    1
}
fn ready() -> NodeState {
    NodeState::Ready
}

/// A parsed inventory: node specs in id order, the vCluster names they reference, and site facts.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub nodes: Vec<NodeSpec>,
    pub vclusters: Registry,
    pub power_budget_w: Option<u64>,
    pub storage_bandwidth_gbps: Option<f64>,
    pub sensitive_pool_size: Option<u32>,
    /// `(from, price)` sorted by time.
    pub energy_prices: Vec<(Time, f64)>,
    /// Nodes whose entry leaves GPUs (`gpu_count` and `gpu_type`), `cpu_cores` or `memory_gb` unset:
    /// what their agents discover fills them in production (absent: all set).
    pub unset: std::collections::BTreeMap<String, UnsetCapabilities>,
}

impl EntryIn {
    fn unset(&self) -> UnsetCapabilities {
        UnsetCapabilities {
            gpus: self.gpu_count.is_none() && self.gpu_type.is_none(),
            cpu_cores: self.cpu_cores.is_none(),
            memory_gb: self.memory_gb.is_none(),
        }
    }
}

/// Reads an inventory: YAML, or (`.csv`) the Alibaba GPU-cluster node list.
pub fn read_inventory(path: &Path) -> Result<Inventory, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::io(path, e))?;
    if path.extension().is_some_and(|e| e == "csv") {
        return parse_alibaba_nodes(&path.display().to_string(), &text);
    }
    parse_inventory(&path.display().to_string(), &text)
}

/// Nodes per dragonfly group assigned to the Alibaba node list, which records no topology.
pub const ALIBABA_GROUP_SIZE: u32 = 32;

/// The Alibaba GPU-cluster node list (`sn,cpu_milli,memory_mib,gpu,model`, cluster-trace-gpu-v2023;
/// Weng et al., ATC'23). The trace records no topology or firmware: nodes are put in groups of
/// [`ALIBABA_GROUP_SIZE`] in file order, and the GPU model stands in for the conformance fingerprint.
pub fn parse_alibaba_nodes(file: &str, text: &str) -> Result<Inventory, TraceError> {
    let err = |line: usize, message: String| TraceError::Config {
        file: file.to_string(),
        message: format!("line {line}: {message}"),
    };
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|l| l.1.trim()).unwrap_or_default();
    if header != "sn,cpu_milli,memory_mib,gpu,model" {
        return Err(err(
            1,
            format!("expected header `sn,cpu_milli,memory_mib,gpu,model`, found `{header}`"),
        ));
    }
    let mut out = Inventory::default();
    for (i, line) in lines {
        let ln = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 5 {
            return Err(err(ln, format!("expected 5 fields, found {}", f.len())));
        }
        let num = |idx: usize, name: &str| -> Result<u64, TraceError> {
            f[idx]
                .parse::<u64>()
                .map_err(|_| err(ln, format!("field `{name}`: `{}` is not a number", f[idx])))
        };
        let (cpu_milli, mem_mib, gpus) = (num(1, "cpu_milli")?, num(2, "memory_mib")?, num(3, "gpu")?);
        let model = (!f[4].is_empty()).then(|| f[4].to_string());
        out.nodes.push(NodeSpec {
            name: f[0].to_string(),
            capabilities: NodeCapabilities {
                gpu_type: model.clone(),
                gpu_count: gpus as u32,
                cpu_cores: (cpu_milli / 1000) as u32,
                memory_gb: (mem_mib / 1024) as u32,
                features: Default::default(),
                power_w: 0,
                unified_memory: false,
            },
            group: GroupId(out.nodes.len() as u32 / ALIBABA_GROUP_SIZE),
            conformance: ConformanceFingerprint(fnv1a(model.as_deref().unwrap_or("cpu").as_bytes())),
            home_vcluster: None,
            state: NodeState::Ready,
        });
    }
    if out.nodes.is_empty() {
        return Err(err(1, "no nodes".into()));
    }
    Ok(out)
}

pub fn parse_inventory(file: &str, text: &str) -> Result<Inventory, TraceError> {
    let err = |message: String| TraceError::Config {
        file: file.to_string(),
        message,
    };
    let inv: InventoryIn = yaml_serde::from_str(text).map_err(|e| err(e.to_string()))?;
    let mut out = Inventory::default();
    if let Some(kw) = inv.power_budget_kw {
        if !(kw.is_finite() && kw > 0.0) {
            return Err(err(format!("power_budget_kw: must be > 0, got {kw}")));
        }
        out.power_budget_w = Some((kw * 1000.0).round() as u64);
    }
    if let Some(b) = inv.storage_bandwidth_gbps {
        if !(b.is_finite() && b > 0.0) {
            return Err(err(format!("storage_bandwidth_gbps: must be > 0, got {b}")));
        }
        out.storage_bandwidth_gbps = Some(b);
    }
    out.sensitive_pool_size = inv.sensitive_pool_size;
    for (i, p) in inv.energy_prices.iter().enumerate() {
        let at = parse_duration(&p.at).map_err(|m| err(format!("energy_prices[{i}].at: {m}")))?;
        if !p.price.is_finite() {
            return Err(err(format!("energy_prices[{i}].price: not a number")));
        }
        out.energy_prices.push((Time(at.as_millis()), p.price));
    }
    if !out.energy_prices.is_sorted_by_key(|p| p.0) {
        return Err(err("energy_prices: entries must be in time order".into()));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, e) in inv.nodes.into_iter().enumerate() {
        let at = format!("nodes[{i}]");
        let home = e.vcluster.as_deref().map(|v| VClusterId(out.vclusters.intern(v)));
        for mut spec in expand(&e, Some(out.nodes.len())).map_err(|m| err(format!("{at}{m}")))? {
            if !names.insert(spec.name.clone()) {
                return Err(err(format!("{at}: duplicate node name `{}`", spec.name)));
            }
            spec.home_vcluster = home;
            if e.unset().any() {
                out.unset.insert(spec.name.clone(), e.unset());
            }
            out.nodes.push(spec);
        }
    }
    if out.nodes.is_empty() {
        return Err(err("the inventory has no nodes".into()));
    }
    Ok(out)
}

/// The nodes an entry names (`home_vcluster` unset); `first` numbers unnamed ones (`None`: they
/// must have a name). Errors start with the field (`.count: ...`, `: give ...`).
fn expand(e: &EntryIn, first: Option<usize>) -> Result<Vec<NodeSpec>, String> {
    if e.count == 0 {
        return Err(".count: must be at least 1".into());
    }
    let caps = NodeCapabilities {
        gpu_type: e.gpu_type.clone(),
        gpu_count: e.gpu_count.unwrap_or(0),
        cpu_cores: e.cpu_cores.unwrap_or(0),
        memory_gb: e.memory_gb.unwrap_or(0),
        features: e.features.iter().cloned().collect(),
        power_w: if e.power_kw.is_finite() && e.power_kw >= 0.0 {
            (e.power_kw * 1000.0).round() as u32
        } else {
            return Err(format!(".power_kw: must be >= 0, got {}", e.power_kw));
        },
        unified_memory: e.unified_memory,
    };
    (0..e.count)
        .map(|k| {
            let name = match (&e.name, &e.prefix, first) {
                (Some(n), None, _) if e.count == 1 => n.clone(),
                (Some(_), None, _) => return Err(": `name` names one node; use `prefix` with count".into()),
                (None, Some(p), _) => format!("{p}{k:04}"),
                (None, None, Some(f)) => format!("node{:05}", f + k as usize),
                (None, None, None) => return Err(": give the node a `name` (or `prefix` with `count`)".into()),
                (Some(_), Some(_), _) => return Err(": give `name` or `prefix`, not both".into()),
            };
            Ok(NodeSpec {
                name,
                capabilities: caps.clone(),
                group: GroupId(e.group),
                conformance: ConformanceFingerprint(fnv1a(e.conformance.as_bytes())),
                home_vcluster: None,
                state: e.state,
            })
        })
        .collect()
}

/// One node of an inventory entry that joins a running site.
#[derive(Clone, Debug, PartialEq)]
pub struct JoiningNode {
    /// `home_vcluster` unset: `vcluster` names it (the caller resolves it).
    pub spec: NodeSpec,
    pub vcluster: Option<String>,
    /// The node's own entry (`name` set; no `prefix` or `count`), as a trace capture writes it.
    pub entry: serde_json::Value,
    /// What the entry leaves for the node's agent to discover.
    pub unset: UnsetCapabilities,
}

/// A node entry as the inventory file writes one (a `node_added` trace event's `node`, a node SMD
/// gained): the nodes it names — one by `name`, or `count` by `prefix`. Errors name the field.
pub fn parse_node_entry(value: &serde_json::Value) -> Result<Vec<JoiningNode>, String> {
    let e: EntryIn = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let nodes = expand(&e, None).map_err(|m| m.trim_start_matches([':', ' ', '.']).to_string())?;
    Ok(nodes
        .into_iter()
        .map(|spec| {
            let mut entry = value.clone();
            if let Some(o) = entry.as_object_mut() {
                o.remove("prefix");
                o.remove("count");
                o.insert("name".into(), spec.name.clone().into());
            }
            JoiningNode {
                spec,
                vcluster: e.vcluster.clone(),
                entry,
                unset: e.unset(),
            }
        })
        .collect())
}

/// `n` identical ready CPU nodes (SWF replays without an inventory).
pub fn homogeneous(n: u32) -> Inventory {
    Inventory {
        nodes: (0..n).map(|i| NodeSpec::plain(format!("n{i:05}"))).collect(),
        ..Inventory::default()
    }
}

/// FNV-1a: a stable (platform- and run-independent) hash for conformance strings.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The one site builder both worlds use: an engine over the inventory's nodes with the site's power
/// budget, storage bandwidth, energy prices (plus `extra_prices`, e.g. a trace's price events) and
/// sensitive pool, and the inventory's vClusters registered first, in inventory order (node homes
/// refer to their ids). `rm-replay` and `lattice-runtime` then add the workload's or the profile's
/// other vClusters, so a site schedules the same in both.
pub fn site_engine(
    inventory: &Inventory,
    policy: lattice_engine::Policy,
    fair_share: lattice_engine::FairShareConfig,
    sensitive_pool_size: Option<u32>,
    extra_prices: &[(Time, f64)],
) -> Result<lattice_engine::Engine, lattice_engine::EngineError> {
    let mut energy_prices = inventory.energy_prices.clone();
    energy_prices.extend_from_slice(extra_prices);
    energy_prices.sort_by_key(|p| p.0);
    let config = lattice_engine::EngineConfig {
        power_budget_w: inventory.power_budget_w,
        storage_bandwidth_gbps: inventory.storage_bandwidth_gbps,
        energy_prices,
        fair_share,
        sensitive_pool_size,
        ..lattice_engine::EngineConfig::new(policy)
    };
    let mut engine = lattice_engine::Engine::new(config, inventory.nodes.clone())?;
    if let Some(bw) = inventory.storage_bandwidth_gbps {
        engine.set_vast_bandwidth(bw);
    }
    for n in inventory.vclusters.names() {
        engine.add_vcluster(n);
    }
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_entries() {
        let y = "nodes:\n  - prefix: gh\n    count: 3\n    gpu_type: GH200\n    gpu_count: 4\n    features: [nvme_scratch]\n    group: 1\n    conformance: a\n    vcluster: ml\n  - name: login\n    state: drained\n";
        let inv = parse_inventory("inv.yaml", y).unwrap();
        assert_eq!(inv.nodes.len(), 4);
        assert_eq!(inv.nodes[2].name, "gh0002");
        assert_eq!(inv.nodes[0].capabilities.gpu_count, 4);
        assert_eq!(inv.nodes[0].group, GroupId(1));
        assert_eq!(inv.nodes[0].home_vcluster, Some(VClusterId(0)));
        assert_eq!(inv.nodes[0].conformance, inv.nodes[1].conformance);
        assert_ne!(inv.nodes[0].conformance, inv.nodes[3].conformance);
        assert_eq!(inv.nodes[3].state, NodeState::Drained);
    }

    #[test]
    fn alibaba_node_list_imports() {
        let p =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/openb_node_list_all_node.csv");
        let inv = read_inventory(&p).unwrap();
        assert_eq!(inv.nodes.len(), 1523);
        let gpus: u32 = inv.nodes.iter().map(|n| n.capabilities.gpu_count).sum();
        assert_eq!(gpus, 6212, "the SOURCES.md total");
        let cpus: u32 = inv.nodes.iter().map(|n| n.capabilities.cpu_cores).sum();
        assert!((125_000..=125_514).contains(&cpus), "{cpus}");
        assert_eq!(inv.nodes[0].capabilities.gpu_type, None);
        assert_eq!(inv.nodes[40].group, GroupId(1));
        let e = parse_alibaba_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\na,1,x,0,\n").unwrap_err();
        assert!(e.to_string().contains("n.csv: line 2: field `memory_mib`"), "{e}");
    }

    #[test]
    fn errors_name_file_and_key() {
        let e = parse_inventory("inv.yaml", "nodes:\n  - prefix: a\n    gpus: 4\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("inv.yaml:") && e.contains("gpus"), "{e}");
        let e = parse_inventory("inv.yaml", "nodes:\n  - name: a\n  - name: a\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("duplicate node name `a`"), "{e}");
        let e = parse_inventory("inv.yaml", "nodes: []\n").unwrap_err().to_string();
        assert!(e.contains("no nodes"), "{e}");
    }
}
