//! A vCluster's scheduler configuration as keys: the weight profile's config keys plus `weights`.
//! The one mapping the API (`POST /v1/vclusters`, `PATCH /v1/vclusters/{id}`), the view
//! (`GET /v1/vclusters/{id}`) and a trace's `vcluster` event use, so a configuration shown can be
//! sent back as is, and a captured change replays as it was made.
//!
//! Durations are seconds (a number) or a duration string (`15s`, `1h`); the view writes seconds.

use crate::duration::{parse_duration, secs_to_duration};
use crate::profile::{CONFIG_KEYS, parse_policy};
use lattice_engine::{CostWeights, Depth, Duration, Policy, VClusterConfig};
use serde_json::{Map, Value, json};

/// A refused key: which one (`weights.priority` for a weight), and why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigKeyError {
    pub field: String,
    pub message: String,
}

fn refuse(field: &str, message: impl Into<String>) -> ConfigKeyError {
    ConfigKeyError {
        field: field.to_string(),
        message: message.into(),
    }
}

/// The keys a configuration carries, in the order the view writes them.
pub fn config_keys() -> impl Iterator<Item = &'static str> {
    CONFIG_KEYS.iter().copied().chain(["weights"])
}

/// The policy's name as [`parse_policy`] reads it, and its backfill depth when it has one of its own.
fn policy_name(p: Policy) -> (&'static str, Option<u32>) {
    match p {
        Policy::Fcfs => ("fcfs", None),
        Policy::Backfill {
            depth: Depth::Limited(1),
        } => ("easy", None),
        Policy::Backfill {
            depth: Depth::Unlimited,
        } => ("conservative", None),
        Policy::Backfill {
            depth: Depth::Limited(d),
        } => ("backfill", Some(d)),
        Policy::PyssEasy => ("easy(compat=pyss)", None),
        Policy::BinPack => ("bin-pack", None),
        Policy::Reservation => ("reservation", None),
    }
}

/// The configuration as keys (every key; unset optional ones are `null`).
pub fn config_json(c: &VClusterConfig) -> Map<String, Value> {
    let (policy, depth) = policy_name(c.policy);
    let mut m = Map::new();
    m.insert("policy".into(), json!(policy));
    m.insert("backfill_depth".into(), json!(depth));
    m.insert("cycle_interval".into(), json!(c.cycle_interval.as_secs_f64()));
    m.insert("reference_wait".into(), json!(c.reference_wait.as_secs_f64()));
    m.insert(
        "slo_wait_target".into(),
        json!(c.slo_wait_target.map(|d| d.as_secs_f64())),
    );
    m.insert("gpu_hours_budget".into(), json!(c.gpu_hours_budget));
    m.insert("preemption".into(), json!(c.preemption));
    m.insert("lend_cap".into(), json!(c.lend_cap));
    m.insert("weights".into(), json!(c.weights));
    m
}

fn duration_of(field: &str, v: &Value) -> Result<Duration, ConfigKeyError> {
    match v {
        Value::Number(n) => {
            let secs = n.as_f64().unwrap_or(f64::NAN);
            secs_to_duration(secs, &n.to_string()).map_err(|m| refuse(field, m))
        }
        Value::String(s) => parse_duration(s).map_err(|m| refuse(field, m)),
        other => Err(refuse(
            field,
            format!("expected seconds or a duration such as \"15s\", got {other}"),
        )),
    }
}

/// The site settings as keys (`agents.grace`, ...; [`lattice_engine::controller::settings::SETTING_KEYS`]) in seconds or
/// duration strings — a trace's `settings` event and the API's `PATCH /v1/config` — into ms; `null`
/// is `None` (removes a node kind's boot timeout; refused for the others). The first bad key is
/// refused, naming it.
pub fn settings_of(m: &Map<String, Value>) -> Result<std::collections::BTreeMap<String, Option<u64>>, ConfigKeyError> {
    let mut out = std::collections::BTreeMap::new();
    for (key, v) in m {
        if !lattice_engine::controller::settings::is_setting(key) {
            return Err(refuse(
                key,
                format!(
                    "not a setting; the settings are {}, {}, {}KIND and {}TENANT/DOMAIN",
                    lattice_engine::controller::settings::SETTING_KEYS.join(", "),
                    lattice_engine::controller::settings::NETWORK_GRACE,
                    lattice_engine::controller::settings::BOOT_BY_KIND,
                    lattice_engine::controller::settings::GRACE_BY_DOMAIN,
                ),
            ));
        }
        let ms = match v {
            Value::Null
                if key.starts_with(lattice_engine::controller::settings::BOOT_BY_KIND)
                    || lattice_engine::controller::settings::grace_domain(key).is_some() =>
            {
                None
            }
            Value::Null => {
                return Err(refuse(
                    key,
                    "always has a value (only a node kind's boot timeout and a domain's own grace can be removed)",
                ));
            }
            v => Some(duration_of(key, v)?.0),
        };
        if ms == Some(0) {
            return Err(refuse(key, "must be positive"));
        }
        out.insert(key.clone(), ms);
    }
    Ok(out)
}

/// Settings as the API shows them and a trace's `settings` event carries them: seconds by key.
pub fn settings_json(s: &lattice_engine::controller::settings::Settings) -> Map<String, Value> {
    s.iter()
        .map(|(k, ms)| (k.clone(), json!(*ms as f64 / 1000.0)))
        .collect()
}

fn weights_of(v: &Value) -> Result<Option<CostWeights>, ConfigKeyError> {
    let m = match v {
        Value::Null => return Ok(None),
        Value::Object(m) => m,
        other => {
            return Err(refuse(
                "weights",
                format!("expected {{\"priority\": 0.2, ...}} or null, got {other}"),
            ));
        }
    };
    if let Some(k) = m.keys().find(|k| !CostWeights::NAMES.contains(&k.as_str())) {
        return Err(refuse(
            &format!("weights.{k}"),
            format!("unknown weight (known: {})", CostWeights::NAMES.join(", ")),
        ));
    }
    let mut w = [0.0f64; 9];
    for (i, name) in CostWeights::NAMES.iter().enumerate() {
        if let Some(x) = m.get(*name) {
            let field = format!("weights.{name}");
            let x = x
                .as_f64()
                .ok_or_else(|| refuse(&field, format!("expected a number >= 0, got {x}")))?;
            if !x.is_finite() || x < 0.0 {
                return Err(refuse(&field, format!("{x}: weights are >= 0")));
            }
            w[i] = x;
        }
    }
    Ok(Some(CostWeights::from_array(w)))
}

/// `c` with `changes` applied (key → value; `null` clears `slo_wait_target`, `gpu_hours_budget`
/// and `weights`). Checked whole before anything changes: an error names the first bad key, and
/// `c` is untouched.
pub fn apply_config(c: &VClusterConfig, changes: &Map<String, Value>) -> Result<VClusterConfig, ConfigKeyError> {
    if let Some(k) = changes.keys().find(|k| !config_keys().any(|x| x == k.as_str())) {
        return Err(refuse(
            k,
            format!(
                "unknown key (config: {}; weights: weights.{{{}}})",
                CONFIG_KEYS.join(", "),
                CostWeights::NAMES.join(", ")
            ),
        ));
    }
    let mut out = *c;
    let depth = match changes.get("backfill_depth") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().and_then(|d| u32::try_from(d).ok()).ok_or_else(|| {
            refuse(
                "backfill_depth",
                format!("expected an integer in 0..=4294967295, got {v}"),
            )
        })?),
    };
    match changes.get("policy") {
        None | Some(Value::Null) => {
            if let Some(d) = depth {
                match out.policy {
                    Policy::Backfill { .. } => {
                        out.policy = Policy::Backfill {
                            depth: Depth::Limited(d),
                        }
                    }
                    p => {
                        return Err(refuse(
                            "backfill_depth",
                            format!("applies to backfilling policies, and this vCluster's is {p}"),
                        ));
                    }
                }
            }
        }
        Some(Value::String(p)) => {
            out.policy = parse_policy(p, depth).map_err(|m| refuse("policy", m))?;
            if depth.is_some() && !matches!(out.policy, Policy::Backfill { .. }) {
                return Err(refuse("backfill_depth", format!("applies to policy backfill, not {p}")));
            }
        }
        Some(v) => return Err(refuse("policy", format!("expected a policy name, got {v}"))),
    }
    if let Some(v) = changes.get("cycle_interval") {
        out.cycle_interval = duration_of("cycle_interval", v)?;
    }
    if let Some(v) = changes.get("reference_wait") {
        out.reference_wait = duration_of("reference_wait", v)?;
    }
    if let Some(v) = changes.get("slo_wait_target") {
        out.slo_wait_target = match v {
            Value::Null => None,
            v => Some(duration_of("slo_wait_target", v)?),
        };
    }
    if let Some(v) = changes.get("gpu_hours_budget") {
        out.gpu_hours_budget = match v {
            Value::Null => None,
            v => Some(
                v.as_f64()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| refuse("gpu_hours_budget", format!("expected a number >= 0 or null, got {v}")))?,
            ),
        };
    }
    if let Some(v) = changes.get("preemption") {
        out.preemption = v
            .as_bool()
            .ok_or_else(|| refuse("preemption", format!("expected true or false, got {v}")))?;
    }
    if let Some(v) = changes.get("lend_cap") {
        out.lend_cap = v
            .as_f64()
            .filter(|x| (0.0..=1.0).contains(x))
            .ok_or_else(|| refuse("lend_cap", format!("expected a fraction in [0, 1], got {v}")))?;
    }
    if let Some(v) = changes.get("weights") {
        out.weights = weights_of(v)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn base() -> VClusterConfig {
        VClusterConfig::new(Policy::Backfill {
            depth: Depth::Limited(10),
        })
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn changes_apply_key_by_key_and_a_bad_one_changes_nothing() {
        let c = apply_config(
            &base(),
            &obj(
                json!({"cycle_interval": "15s", "backfill_depth": 20, "slo_wait_target": 14400,
                         "weights": {"priority": 0.5, "fair_share": 0.5}}),
            ),
        )
        .unwrap();
        assert_eq!(c.cycle_interval, Duration::from_secs(15));
        assert_eq!(
            c.policy,
            Policy::Backfill {
                depth: Depth::Limited(20)
            }
        );
        assert_eq!(c.slo_wait_target, Some(Duration::from_hours(4)));
        assert_eq!(c.weights.map(|w| (w.priority, w.wait_time)), Some((0.5, 0.0)));
        let cleared = apply_config(&c, &obj(json!({"slo_wait_target": null, "weights": null}))).unwrap();
        assert_eq!((cleared.slo_wait_target, cleared.weights), (None, None));
        for (bad, field) in [
            (json!({"cycle_interval": "soon"}), "cycle_interval"),
            (json!({"cycle": "15s"}), "cycle"),
            (json!({"policy": "lottery"}), "policy"),
            (json!({"policy": "fcfs", "backfill_depth": 3}), "backfill_depth"),
            (json!({"lend_cap": 2}), "lend_cap"),
            (json!({"weights": {"luck": 1}}), "weights.luck"),
            (json!({"weights": {"energy": -1}}), "weights.energy"),
            (json!({"preemption": "yes"}), "preemption"),
            (json!({"backfill_depth": 5_000_000_000u64}), "backfill_depth"),
        ] {
            let e = apply_config(&c, &obj(bad.clone())).unwrap_err();
            assert_eq!(e.field, field, "{bad}: {e}");
        }
        let e = apply_config(
            &apply_config(&c, &obj(json!({"policy": "fcfs"}))).unwrap(),
            &obj(json!({"backfill_depth": 3})),
        )
        .unwrap_err();
        assert!(e.message.contains("fcfs"), "{e}");
    }

    fn policies() -> impl Strategy<Value = Policy> {
        prop_oneof![
            Just(Policy::Fcfs),
            Just(Policy::BinPack),
            Just(Policy::Reservation),
            Just(Policy::EASY),
            Just(Policy::CONSERVATIVE),
            (0u32..1000).prop_map(|d| Policy::Backfill {
                depth: Depth::Limited(d)
            }),
        ]
    }

    proptest! {
        /// What the view shows, sent back, is the same configuration (a trace's `vcluster` event
        /// replays the change that was made).
        #[test]
        fn the_view_sent_back_is_the_same_configuration(
            policy in policies(),
            cycle_ms in 0u64..3_600_000,
            wait_ms in 0u64..86_400_000,
            slo in proptest::option::of(0u64..86_400_000),
            budget in proptest::option::of(0.0f64..1e6),
            preemption: bool,
            lend_cap in 0.0f64..=1.0,
            weights in proptest::option::of(proptest::array::uniform9(0.0f64..10.0)),
        ) {
            let c = VClusterConfig {
                policy,
                weights: weights.map(CostWeights::from_array),
                cycle_interval: Duration(cycle_ms),
                reference_wait: Duration(wait_ms),
                slo_wait_target: slo.map(Duration),
                gpu_hours_budget: budget,
                preemption,
                lend_cap,
            };
            let shown = config_json(&c);
            let back = apply_config(&base(), &shown).unwrap();
            prop_assert_eq!(back, c);
        }
    }
}
