//! `lattice admin vcluster show|create|set-config|set-weights` and `lattice admin config get|set`
//! (vCluster keys, and the site settings `agents.*`/`sensitive.*`):
//! a vCluster's scheduler configuration and weights, committed at the quorum (every leader
//! schedules with what it holds). The keys are the weight profile's (`policy`, `backfill_depth`,
//! `cycle_interval`, ...) and `weights`.

use super::{Client, Output, print_value};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use serde_json::{Map, Value, json};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum VclusterCmd {
    /// A vCluster's scheduler configuration and the weights in force (the quorum's, as the leader
    /// schedules with them).
    Show { vcluster: String },
    /// Create a vCluster (backfill with depth 10 and the default weights unless given): `create
    /// hpc-batch --policy backfill --backfill-depth 20 --cycle-interval 15s --weights
    /// priority=0.2,...`, or a profile YAML's entry with `--profile FILE`.
    Create {
        /// Its name (or `--name`).
        vcluster: Option<String>,
        #[arg(long = "name")]
        name: Option<String>,
        #[command(flatten)]
        config: ConfigFlags,
    },
    /// Change a vCluster's configuration (only the keys given): `set-config hpc-batch
    /// --cycle-interval 15s`.
    SetConfig {
        vcluster: Option<String>,
        #[arg(long = "name")]
        name: Option<String>,
        #[command(flatten)]
        config: ConfigFlags,
    },
    /// Replace a vCluster's weights (`--weights priority=0.3,wait_time=0.2,...` or a profile YAML's
    /// entry with `--profile FILE`); they take effect at its next cycle.
    SetWeights {
        vcluster: Option<String>,
        #[arg(long = "name")]
        name: Option<String>,
        #[arg(long)]
        weights: Option<String>,
        #[arg(long)]
        profile: Option<PathBuf>,
    },
}

/// Configuration keys as flags (those given are sent).
#[derive(clap::Args, Default)]
pub struct ConfigFlags {
    /// fcfs, easy, conservative, backfill, bin-pack or reservation.
    #[arg(long)]
    policy: Option<String>,
    #[arg(long)]
    backfill_depth: Option<u32>,
    /// `15s`, `1m`, ...
    #[arg(long)]
    cycle_interval: Option<String>,
    #[arg(long)]
    reference_wait: Option<String>,
    #[arg(long)]
    slo_wait_target: Option<String>,
    #[arg(long)]
    gpu_hours_budget: Option<f64>,
    #[arg(long)]
    preemption: Option<bool>,
    #[arg(long)]
    lend_cap: Option<f64>,
    /// `priority=0.2,wait_time=0.25,...` (the others 0).
    #[arg(long)]
    weights: Option<String>,
    /// A weight profile YAML: its entry for the vCluster (or its only entry), weights and config.
    #[arg(long)]
    profile: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// `get vclusters.NAME` (the whole configuration) or `get vclusters.NAME.KEY`; `get agents`
    /// (the site settings under it, in seconds) or `get agents.boot_timeout`.
    Get { key: String },
    /// `set vclusters.NAME.KEY=VALUE` (a number, `true`/`false`, `null`, a duration or a name;
    /// `weights.NAME` for one weight); `set agents.boot_timeout=15m` (seconds or a duration;
    /// `agents.boot_timeout_by_kind.KIND=unset` removes a node kind's timeout).
    Set { assignment: String },
}

/// `NAME=VALUE,...` as a JSON object of numbers.
fn parse_weights(w: &str) -> Result<Map<String, Value>> {
    w.split(',')
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("`{kv}`: expected NAME=VALUE"))?;
            let v: f64 = v.trim().parse().with_context(|| format!("`{kv}`: not a number"))?;
            Ok((k.trim().to_string(), json!(v)))
        })
        .collect()
}

/// A profile file's entry for `vcluster` (or its only one) as configuration keys.
fn profile_entry(path: &std::path::Path, vcluster: &str) -> Result<Map<String, Value>> {
    let prof = lattice_traces::read_profile(path)?;
    let entry = prof
        .vclusters
        .get(vcluster)
        .or_else(|| prof.vclusters.values().next().filter(|_| prof.vclusters.len() == 1))
        .with_context(|| format!("{}: no entry for vCluster `{vcluster}`", path.display()))?;
    Ok(lattice_traces::config_json(&entry.config(None)))
}

impl ConfigFlags {
    fn body(self, vcluster: &str) -> Result<Map<String, Value>> {
        let mut m = match &self.profile {
            Some(p) => profile_entry(p, vcluster)?,
            None => Map::new(),
        };
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("policy", self.policy.map(Value::from));
        put("backfill_depth", self.backfill_depth.map(Value::from));
        put("cycle_interval", self.cycle_interval.map(Value::from));
        put("reference_wait", self.reference_wait.map(Value::from));
        put("slo_wait_target", self.slo_wait_target.map(Value::from));
        put("gpu_hours_budget", self.gpu_hours_budget.map(Value::from));
        put("preemption", self.preemption.map(Value::from));
        put("lend_cap", self.lend_cap.map(Value::from));
        if let Some(w) = &self.weights {
            m.insert("weights".into(), Value::Object(parse_weights(w)?));
        }
        Ok(m)
    }
}

fn name_of(positional: Option<String>, flag: Option<String>) -> Result<String> {
    match (positional, flag) {
        (Some(n), None) | (None, Some(n)) => Ok(n),
        (Some(a), Some(b)) if a == b => Ok(a),
        (Some(_), Some(_)) => bail!("give the vCluster's name once"),
        (None, None) => bail!("which vCluster? (NAME or --name NAME)"),
    }
}

/// `lattice admin vcluster ...`.
pub fn vcluster(client: &Client, output: Output, cmd: VclusterCmd) -> Result<()> {
    match cmd {
        VclusterCmd::Show { vcluster } => show(client, output, &vcluster),
        VclusterCmd::Create { vcluster, name, config } => {
            let name = name_of(vcluster, name)?;
            let mut body = config.body(&name)?;
            body.insert("name".into(), Value::from(name.clone()));
            let v = client.call("POST", "/v1/vclusters", Some(&Value::Object(body)))?;
            print_value(&v, output, |v| format!("vCluster {name} created\n{}", describe(v)))
        }
        VclusterCmd::SetConfig { vcluster, name, config } => {
            let name = name_of(vcluster, name)?;
            let body = config.body(&name)?;
            if body.is_empty() {
                bail!("nothing to change: give --cycle-interval, --policy, ... or --profile");
            }
            let v = client.call("PATCH", &format!("/v1/vclusters/{name}"), Some(&Value::Object(body)))?;
            print_value(&v, output, |v| {
                format!("{name}: applies from its next cycle\n{}", describe(v))
            })
        }
        VclusterCmd::SetWeights {
            vcluster,
            name,
            weights,
            profile,
        } => {
            let name = name_of(vcluster, name)?;
            let body = match (weights, profile) {
                (Some(w), None) => parse_weights(&w)?,
                (None, Some(p)) => match profile_entry(&p, &name)?.remove("weights") {
                    Some(Value::Object(w)) => w,
                    _ => bail!("{}: the entry has no weights", p.display()),
                },
                _ => bail!("give exactly one of --weights NAME=VALUE,... and --profile FILE"),
            };
            let v = client.call(
                "PUT",
                &format!("/v1/vclusters/{name}/weights"),
                Some(&Value::Object(body)),
            )?;
            print_value(&v, output, |_| {
                format!("weights of {name} set; they apply from its next cycle\n")
            })
        }
    }
}

/// The configuration as the view shows it, one key a line.
fn describe(v: &Value) -> String {
    let mut out = String::new();
    for k in lattice_traces::vcluster_config::config_keys().filter(|k| *k != "weights") {
        out.push_str(&format!("  {k:<17} {}\n", v[k]));
    }
    match v["weights"].as_object() {
        Some(w) => {
            out.push_str("  weights:\n");
            for (k, x) in w {
                out.push_str(&format!("    {k:<15} {x}\n"));
            }
        }
        None => out.push_str("  no weights: the queue is in arrival order\n"),
    }
    out
}

fn show(client: &Client, output: Output, vcluster: &str) -> Result<()> {
    let v = client.call("GET", &format!("/v1/vclusters/{vcluster}"), None)?;
    print_value(&v, output, |v| format!("{vcluster}:\n{}", describe(v)))
}

/// `vclusters.NAME[.KEY[.SUBKEY]]` → (NAME, the key path).
fn split_key(key: &str) -> Result<(&str, Vec<&str>)> {
    let rest = key.strip_prefix("vclusters.").with_context(|| {
        format!("`{key}`: the settings decisions read are per vCluster (`vclusters.NAME.KEY`) or the site's (`agents.KEY`, `sensitive.KEY`); the others are in the runtime's config file")
    })?;
    // A vCluster's name may hold dots: the key is what follows the last known key's dot.
    let keys: Vec<&str> = lattice_traces::vcluster_config::config_keys().collect();
    for (i, _) in rest.match_indices('.') {
        let (name, path) = (&rest[..i], &rest[i + 1..]);
        let parts: Vec<&str> = path.split('.').collect();
        if keys.contains(&parts[0]) {
            return Ok((name, parts));
        }
    }
    Ok((rest, Vec::new()))
}

/// A value as typed on the command line: JSON when it parses as JSON, else a string.
pub(super) fn value_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::from(text))
}

/// Whether `key` is a site setting's (or a prefix of them): `agents.…`, `sensitive.…`.
fn site_key(key: &str) -> bool {
    ["agents", "sensitive", "network"]
        .iter()
        .any(|p| key == *p || key.starts_with(&format!("{p}.")))
}

/// `lattice admin config get|set` of the site settings (`/v1/config`): a key or a prefix of keys
/// (`agents`), in seconds.
fn site_config(client: &Client, output: Output, cmd: ConfigCmd) -> Result<()> {
    match cmd {
        ConfigCmd::Get { key } => {
            let all = client.call("GET", "/v1/config", None)?;
            let picked: serde_json::Map<String, Value> = all
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| *k == &key || k.starts_with(&format!("{key}.")))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if picked.is_empty() {
                let known: Vec<&String> = all.as_object().into_iter().flatten().map(|(k, _)| k).collect();
                bail!(
                    "`{key}`: no such setting; the site's are {}",
                    known.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                );
            }
            print_value(&Value::Object(picked.clone()), output, |_| {
                picked.iter().map(|(k, v)| format!("{k} = {v}s\n")).collect()
            })
        }
        ConfigCmd::Set { assignment } => {
            let (key, text) = assignment
                .split_once('=')
                .with_context(|| format!("`{assignment}`: expected KEY=VALUE"))?;
            let value = if text == "unset" { Value::Null } else { value_of(text) };
            let v = client.call("PATCH", "/v1/config", Some(&json!({ key: value })))?;
            print_value(&v, output, |_| format!("{key} = {text}; in force at the quorum\n"))
        }
    }
}

/// `lattice admin config get|set`.
pub fn config(client: &Client, output: Output, cmd: ConfigCmd) -> Result<()> {
    let key = match &cmd {
        ConfigCmd::Get { key } => key.as_str(),
        ConfigCmd::Set { assignment } => assignment.split('=').next().unwrap_or_default(),
    };
    if site_key(key) {
        return site_config(client, output, cmd);
    }
    match cmd {
        ConfigCmd::Get { key } => {
            let (name, path) = split_key(&key)?;
            let mut v = client.call("GET", &format!("/v1/vclusters/{name}"), None)?;
            for p in &path {
                v = v.get(*p).cloned().with_context(|| format!("`{key}`: no such key"))?;
            }
            print_value(&v, output, |v| match v {
                Value::Object(_) => serde_json::to_string_pretty(v).unwrap_or_default() + "\n",
                v => format!("{v}\n"),
            })
        }
        ConfigCmd::Set { assignment } => {
            let (key, text) = assignment
                .split_once('=')
                .with_context(|| format!("`{assignment}`: expected KEY=VALUE"))?;
            let (name, path) = split_key(key)?;
            let body = match path.as_slice() {
                [k] => json!({ *k: value_of(text) }),
                ["weights", w] => {
                    // One weight: the others stay as they are.
                    let now = client.call("GET", &format!("/v1/vclusters/{name}"), None)?;
                    let mut weights = now["weights"].as_object().cloned().unwrap_or_default();
                    weights.insert(w.to_string(), value_of(text));
                    json!({ "weights": weights })
                }
                _ => bail!("`{key}`: expected vclusters.NAME.KEY (or vclusters.NAME.weights.NAME)"),
            };
            let v = client.call("PATCH", &format!("/v1/vclusters/{name}"), Some(&body))?;
            print_value(&v, output, |_| format!("{key} = {text}; applies from the next cycle\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_a_vcluster_and_its_setting() {
        assert_eq!(split_key("vclusters.hpc-batch").unwrap(), ("hpc-batch", vec![]));
        assert_eq!(
            split_key("vclusters.hpc.batch.cycle_interval").unwrap(),
            ("hpc.batch", vec!["cycle_interval"])
        );
        assert_eq!(
            split_key("vclusters.ml.weights.priority").unwrap(),
            ("ml", vec!["weights", "priority"])
        );
        let e = split_key("accounting.enabled").unwrap_err().to_string();
        assert!(e.contains("config file"), "{e}");
        assert!(site_key("agents") && site_key("agents.boot_timeout") && site_key("sensitive.wipe_timeout"));
        assert!(!site_key("agentsx") && !site_key("vclusters.agents"));
        assert_eq!(value_of("15s"), json!("15s"));
        assert_eq!(value_of("20"), json!(20));
        assert_eq!(value_of("false"), json!(false));
    }

    #[test]
    fn flags_become_the_keys_given() {
        let flags = ConfigFlags {
            cycle_interval: Some("15s".into()),
            weights: Some("priority=0.5,fair_share=0.5".into()),
            ..ConfigFlags::default()
        };
        let body = flags.body("x").unwrap();
        assert_eq!(
            Value::Object(body),
            json!({"cycle_interval": "15s", "weights": {"priority": 0.5, "fair_share": 0.5}})
        );
    }
}
