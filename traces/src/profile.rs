//! Weight profiles and per-vCluster scheduler config (book: "Performance Tuning Guide").
//!
//! ```yaml
//! hpc-batch:
//!   priority: 0.15        # w1 .. w9, all nine required, none negative
//!   wait_time: 0.20
//!   fair_share: 0.20
//!   topology: 0.15
//!   data_readiness: 0.10
//!   backlog: 0.05
//!   energy: 0.00
//!   checkpoint: 0.05
//!   conformance: 0.10
//!   policy: easy          # optional: fcfs | easy | conservative | backfill
//!   backfill_depth: 10    # optional (policy backfill)
//!   cycle_interval: 15s   # optional scheduler config
//!   reference_wait: 1h
//!   slo_wait_target: 4h
//! ```

use crate::duration::parse_duration;
use crate::error::TraceError;
use lattice_engine::{CostWeights, Depth, Duration, Policy};
use std::collections::BTreeMap;
use std::path::Path;

/// Config keys a vCluster entry may carry besides the nine weights.
pub const CONFIG_KEYS: [&str; 8] = [
    "policy",
    "backfill_depth",
    "cycle_interval",
    "reference_wait",
    "slo_wait_target",
    "gpu_hours_budget",
    "preemption",
    "lend_cap",
];

/// One vCluster's weights and scheduler config.
#[derive(Clone, Debug, PartialEq)]
pub struct VClusterProfile {
    pub weights: CostWeights,
    pub policy: Option<Policy>,
    pub cycle_interval: Option<Duration>,
    pub reference_wait: Option<Duration>,
    pub slo_wait_target: Option<Duration>,
    pub gpu_hours_budget: Option<f64>,
    /// May this vCluster preempt lower classes (default true)?
    pub preemption: Option<bool>,
    /// Fraction of its home nodes it lends while idle (default 0.5).
    pub lend_cap: Option<f64>,
}

impl VClusterProfile {
    /// The engine's vCluster configuration for this profile entry — the one mapping both drivers use
    /// (`rm-replay` and `lattice-runtime`), so a profile schedules the same way in simulation and in
    /// production. `default_policy` (e.g. `--policy`) overrides the entry's; without either, backfill
    /// with depth 10.
    pub fn config(&self, default_policy: Option<Policy>) -> lattice_engine::VClusterConfig {
        let mut c = lattice_engine::VClusterConfig::new(default_policy.or(self.policy).unwrap_or(Policy::Backfill {
            depth: Depth::Limited(10),
        }));
        c.weights = Some(self.weights);
        if let Some(i) = self.cycle_interval {
            c.cycle_interval = i;
        }
        if let Some(r) = self.reference_wait {
            c.reference_wait = r;
        }
        c.slo_wait_target = self.slo_wait_target;
        c.gpu_hours_budget = self.gpu_hours_budget;
        if let Some(b) = self.preemption {
            c.preemption = b;
        }
        if let Some(l) = self.lend_cap {
            c.lend_cap = l;
        }
        c
    }
}

/// A profile file: vCluster name → profile, in name order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WeightProfile {
    pub source: String,
    pub vclusters: BTreeMap<String, VClusterProfile>,
}

pub fn read_profile(path: &Path) -> Result<WeightProfile, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|e| TraceError::io(path, e))?;
    parse_profile(&path.display().to_string(), &text)
}

pub fn parse_profile(file: &str, text: &str) -> Result<WeightProfile, TraceError> {
    let err = |message: String| TraceError::Config {
        file: file.to_string(),
        message,
    };
    let doc: BTreeMap<String, BTreeMap<String, yaml_serde::Value>> =
        yaml_serde::from_str(text).map_err(|e| err(format!("expected `vcluster: {{key: value, ...}}`: {e}")))?;
    if doc.is_empty() {
        return Err(err("the profile defines no vCluster".into()));
    }
    let mut out = WeightProfile {
        source: file.to_string(),
        vclusters: BTreeMap::new(),
    };
    for (vc, entries) in doc {
        for key in entries.keys() {
            if !CostWeights::NAMES.contains(&key.as_str()) && !CONFIG_KEYS.contains(&key.as_str()) {
                return Err(err(format!(
                    "{vc}.{key}: unknown key (weights: {}; config: {})",
                    CostWeights::NAMES.join(", "),
                    CONFIG_KEYS.join(", ")
                )));
            }
        }
        let mut w = [0.0f64; 9];
        for (i, name) in CostWeights::NAMES.iter().enumerate() {
            let v = entries
                .get(*name)
                .ok_or_else(|| err(format!("{vc}.{name}: missing weight")))?;
            let x = v
                .as_f64()
                .ok_or_else(|| err(format!("{vc}.{name}: weight must be a number, got {v:?}")))?;
            if !x.is_finite() || x < 0.0 {
                return Err(err(format!("{vc}.{name}: weight must be >= 0, got {x}")));
            }
            w[i] = x;
        }
        let weights = CostWeights::from_array(w);
        let text_of = |key: &str| -> Result<Option<String>, TraceError> {
            match entries.get(key) {
                None => Ok(None),
                Some(yaml_serde::Value::String(s)) => Ok(Some(s.clone())),
                Some(yaml_serde::Value::Number(n)) => Ok(Some(n.to_string())),
                Some(v) => Err(err(format!("{vc}.{key}: expected a string, got {v:?}"))),
            }
        };
        let dur = |key: &str| -> Result<Option<Duration>, TraceError> {
            text_of(key)?
                .map(|s| parse_duration(&s).map_err(|m| err(format!("{vc}.{key}: {m}"))))
                .transpose()
        };
        let depth = match entries.get("backfill_depth") {
            None => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                err(format!(
                    "{vc}.backfill_depth: expected a non-negative integer, got {v:?}"
                ))
            })? as u32),
        };
        let policy = match text_of("policy")? {
            None => depth.map(|d| Policy::Backfill {
                depth: Depth::Limited(d),
            }),
            Some(p) => Some(parse_policy(&p, depth).map_err(|m| err(format!("{vc}.policy: {m}")))?),
        };
        let gpu_hours_budget = match entries.get("gpu_hours_budget") {
            None => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| err(format!("{vc}.gpu_hours_budget: expected a number >= 0, got {v:?}")))?,
            ),
        };
        let preemption = match entries.get("preemption") {
            None => None,
            Some(yaml_serde::Value::Bool(b)) => Some(*b),
            Some(v) => return Err(err(format!("{vc}.preemption: expected true or false, got {v:?}"))),
        };
        let lend_cap = match entries.get("lend_cap") {
            None => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|x| (0.0..=1.0).contains(x))
                    .ok_or_else(|| err(format!("{vc}.lend_cap: expected a fraction in [0, 1], got {v:?}")))?,
            ),
        };
        let profile = VClusterProfile {
            preemption,
            lend_cap,
            gpu_hours_budget,
            weights,
            policy,
            cycle_interval: dur("cycle_interval")?,
            reference_wait: dur("reference_wait")?,
            slo_wait_target: dur("slo_wait_target")?,
        };
        out.vclusters.insert(vc, profile);
    }
    Ok(out)
}

/// The profile `text` with new weights for the vClusters in `weights` (every other key, and every other
/// vCluster, kept as it was; comments are not). The result parses back to the same config with the new
/// weights — `rm-replay sweep --emit-profile` writes it so it can be deployed as is.
pub fn profile_with_weights(
    file: &str,
    text: &str,
    weights: &BTreeMap<String, CostWeights>,
) -> Result<String, TraceError> {
    let err = |message: String| TraceError::Config {
        file: file.to_string(),
        message,
    };
    let mut doc: BTreeMap<String, BTreeMap<String, yaml_serde::Value>> =
        yaml_serde::from_str(text).map_err(|e| err(format!("expected `vcluster: {{key: value, ...}}`: {e}")))?;
    for (vc, w) in weights {
        let entries = doc
            .get_mut(vc)
            .ok_or_else(|| err(format!("the profile has no vCluster `{vc}`")))?;
        for (name, x) in CostWeights::NAMES.iter().zip(w.as_array()) {
            // Rounded so the file reads like a hand-written one (and stays exact on a round trip).
            let x = (x * 1e6).round() / 1e6;
            entries.insert(name.to_string(), yaml_serde::Value::from(x));
        }
    }
    let out = yaml_serde::to_string(&doc).map_err(|e| err(format!("writing YAML: {e}")))?;
    parse_profile(file, &out)?;
    Ok(out)
}

/// `fcfs`/`fifo`, `easy`, `conservative`, `backfill` (with `depth`, default 10 — the tuning guide's
/// "moderate"), `bin-pack` or `reservation`.
pub fn parse_policy(name: &str, depth: Option<u32>) -> Result<Policy, String> {
    match name {
        "fcfs" | "fifo" => Ok(Policy::Fcfs),
        "bin-pack" => Ok(Policy::BinPack),
        "reservation" => Ok(Policy::Reservation),
        "easy" => Ok(Policy::EASY),
        "conservative" => Ok(Policy::CONSERVATIVE),
        "backfill" => Ok(Policy::Backfill {
            depth: Depth::Limited(depth.unwrap_or(10)),
        }),
        o => Err(format!(
            "`{o}` is not one of fcfs, fifo, easy, conservative, backfill, bin-pack, reservation"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "hpc-batch:\n  priority: 0.15\n  wait_time: 0.20\n  fair_share: 0.20\n  topology: 0.15\n  data_readiness: 0.10\n  backlog: 0.05\n  energy: 0.00\n  checkpoint: 0.05\n  conformance: 0.10\n";

    #[test]
    fn rewriting_weights_keeps_the_config() {
        let text = format!("{OK}  policy: backfill\n  backfill_depth: 7\n  cycle_interval: 15s\n");
        let before = parse_profile("p.yaml", &text).unwrap();
        let mut w = before.vclusters["hpc-batch"].weights;
        w.fair_share = 0.35;
        let out = profile_with_weights("p.yaml", &text, &[("hpc-batch".to_string(), w)].into()).unwrap();
        let after = parse_profile("p.yaml", &out).unwrap();
        let (a, b) = (&before.vclusters["hpc-batch"], &after.vclusters["hpc-batch"]);
        assert_eq!(b.weights, w);
        assert_eq!((a.policy, a.cycle_interval), (b.policy, b.cycle_interval));
        let e = profile_with_weights("p.yaml", &text, &[("ml".to_string(), w)].into()).unwrap_err();
        assert!(e.to_string().contains("no vCluster `ml`"), "{e}");
    }

    #[test]
    fn parses_weights_and_config() {
        let p = parse_profile(
            "p.yaml",
            &format!("{OK}  policy: backfill\n  backfill_depth: 10\n  cycle_interval: 15s\n"),
        )
        .unwrap();
        let v = &p.vclusters["hpc-batch"];
        assert_eq!(v.weights.wait_time, 0.20);
        assert_eq!(
            v.policy,
            Some(Policy::Backfill {
                depth: Depth::Limited(10)
            })
        );
        assert_eq!(v.cycle_interval, Some(Duration::from_secs(15)));
    }

    #[test]
    fn every_config_key_parses() {
        let p = parse_profile(
            "p.yaml",
            &format!(
                "{OK}  policy: bin-pack\n  backfill_depth: 3\n  cycle_interval: 5s\n  reference_wait: 2h\n  slo_wait_target: 4h\n  gpu_hours_budget: 1000\n  preemption: false\n  lend_cap: 0.25\n"
            ),
        )
        .unwrap();
        let v = &p.vclusters["hpc-batch"];
        assert_eq!(v.policy, Some(Policy::BinPack));
        assert_eq!(v.gpu_hours_budget, Some(1000.0));
        assert_eq!((v.preemption, v.lend_cap), (Some(false), Some(0.25)));
        assert_eq!(v.slo_wait_target, Some(Duration::from_hours(4)));
        let e = parse_profile("p.yaml", &format!("{OK}  lend_cap: 2\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hpc-batch.lend_cap"), "{e}");
    }

    #[test]
    fn errors_name_file_vcluster_and_key() {
        let e = parse_profile("p.yaml", &format!("{OK}  colour: 1\n"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml: hpc-batch.colour: unknown key"), "{e}");
        let e = parse_profile("p.yaml", &OK.replace("energy: 0.00", "energy: -0.1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hpc-batch.energy: weight must be >= 0"), "{e}");
        let e = parse_profile("p.yaml", &OK.replace("  energy: 0.00\n", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hpc-batch.energy: missing weight"), "{e}");
        let e = parse_profile("p.yaml", &format!("{OK}  policy: lottery\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hpc-batch.policy"), "{e}");
    }

    #[test]
    fn bundled_profiles_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
        let mut n = 0;
        for name in [
            "hpc-batch",
            "ml-training",
            "service",
            "sensitive",
            "interactive",
            "balanced",
        ] {
            let p = read_profile(&dir.join(format!("{name}.yaml"))).unwrap();
            assert!(p.vclusters.contains_key(name), "{name}.yaml defines vCluster {name}");
            n += 1;
        }
        assert_eq!(n, 6);
        let b = read_profile(&dir.join("balanced.yaml")).unwrap();
        assert_eq!(b.vclusters["balanced"].weights, CostWeights::default());
    }
}
