//! Site settings that decisions read: the controller's heartbeat grace, drift, boot, wipe and
//! preemption-report timeouts. They are quorum state (`QuorumCommand::PutSettings`): a member's
//! config file seeds them, `PATCH /v1/config` (`lattice admin config set agents.KEY=VALUE`) changes
//! them, and every leader schedules with what the quorum holds — so a fail-over to a member whose
//! file says otherwise changes nothing. Values are milliseconds; the API shows seconds and takes
//! seconds or a duration (`"10m"`), as vCluster configurations do.

use super::*;
use serde_json::{Map, Value};

/// The settings by key, in ms.
pub type Settings = BTreeMap<String, u64>;

/// The keys every site has.
pub const SETTING_KEYS: [&str; 9] = [
    "agents.heartbeat_timeout",
    "agents.grace",
    "agents.sensitive_grace",
    "agents.preemption_report_grace",
    "agents.drift_remediation_timeout",
    "agents.sensitive_drift_remediation_timeout",
    "agents.boot_timeout",
    "sensitive.wipe_timeout",
    "sensitive.boot_timeout",
];

/// One node kind's boot timeout: this prefix and the kind (its GPU model, `cpu` without GPUs).
pub const BOOT_BY_KIND: &str = "agents.boot_timeout_by_kind.";

/// Borrowed nodes' heartbeat grace is at most this (the book's 30 s), or the grace when shorter.
const BORROWED_GRACE_MAX_MS: u64 = 30_000;

/// Whether `key` names a setting (a node kind's name is not empty and has no dot).
pub fn is_setting(key: &str) -> bool {
    SETTING_KEYS.contains(&key)
        || key
            .strip_prefix(BOOT_BY_KIND)
            .is_some_and(|k| !k.is_empty() && !k.contains('.'))
}

/// An operator's changes (`{"agents.boot_timeout": "15m", "agents.boot_timeout_by_kind.H200": null}`)
/// as the quorum command's map: each key checked, each value a positive duration; `null` removes a
/// node kind's timeout (the others always have a value). The first bad key is refused, naming it.
pub fn parse_changes(changes: &Map<String, Value>) -> Result<BTreeMap<String, Option<u64>>, FieldError> {
    if changes.is_empty() {
        return Err(bad("settings", "no setting given"));
    }
    let mut out = BTreeMap::new();
    for (key, v) in changes {
        if !is_setting(key) {
            return Err(bad(
                key,
                format!(
                    "not a setting; the settings are {} and {BOOT_BY_KIND}KIND",
                    SETTING_KEYS.join(", ")
                ),
            ));
        }
        let ms = match v {
            Value::Null if key.starts_with(BOOT_BY_KIND) => None,
            Value::Null => {
                return Err(bad(
                    key,
                    "always has a value (only a node kind's timeout can be removed)",
                ));
            }
            Value::Number(n) => Some(
                lattice_traces::secs_to_duration(n.as_f64().unwrap_or(f64::NAN), &n.to_string())
                    .map_err(|m| bad(key, m))?
                    .0,
            ),
            Value::String(s) => Some(lattice_traces::parse_duration(s).map_err(|m| bad(key, m))?.0),
            other => {
                return Err(bad(
                    key,
                    format!("expected seconds or a duration such as \"10m\", got {other}"),
                ));
            }
        };
        if ms == Some(0) {
            return Err(bad(key, "must be positive"));
        }
        out.insert(key.clone(), ms);
    }
    Ok(out)
}

/// The settings as the API shows them: seconds by key.
pub fn settings_json(s: &Settings) -> Map<String, Value> {
    s.iter()
        .map(|(k, ms)| (k.clone(), serde_json::json!(*ms as f64 / 1000.0)))
        .collect()
}

impl Control {
    /// The settings in force.
    pub fn settings(&self) -> Settings {
        let c = &self.ctl;
        let mut s: Settings = [
            ("agents.heartbeat_timeout", self.heartbeat_timeout_ms),
            ("agents.grace", c.grace.default.0),
            ("agents.sensitive_grace", c.grace.sensitive.0),
            (
                "agents.preemption_report_grace",
                c.preemption_report_grace.map_or(0, |d| d.0),
            ),
            ("agents.drift_remediation_timeout", c.drift_timeout.standard.0),
            (
                "agents.sensitive_drift_remediation_timeout",
                c.drift_timeout.sensitive.0,
            ),
            ("agents.boot_timeout", c.node_boot.default.map_or(0, |d| d.0)),
            ("sensitive.wipe_timeout", c.wipe_timeout.map_or(0, |d| d.0)),
            ("sensitive.boot_timeout", self.hardened_boot_ms),
        ]
        .into_iter()
        .filter(|(_, ms)| *ms > 0)
        .map(|(k, ms)| (k.to_string(), ms))
        .collect();
        for (kind, d) in &c.node_boot.by_kind {
            s.insert(format!("{BOOT_BY_KIND}{kind}"), d.0);
        }
        s
    }

    /// Schedules with `s` (what the quorum holds): each key given replaces the setting in force;
    /// the node kinds' boot timeouts are replaced as a whole. Empty: nothing changes (a quorum not
    /// seeded yet). Keys this version does not know are skipped.
    pub fn apply_settings(&mut self, s: &Settings) {
        if s.is_empty() {
            return;
        }
        let d = lattice_engine::Duration;
        for (key, &ms) in s {
            let c = &mut self.ctl;
            match key.as_str() {
                "agents.heartbeat_timeout" => self.heartbeat_timeout_ms = ms,
                "agents.grace" => {
                    c.grace.default = d(ms);
                    c.grace.borrowed = d(ms.min(BORROWED_GRACE_MAX_MS));
                }
                "agents.sensitive_grace" => c.grace.sensitive = d(ms),
                "agents.preemption_report_grace" => c.preemption_report_grace = Some(d(ms)),
                "agents.drift_remediation_timeout" => c.drift_timeout.standard = d(ms),
                "agents.sensitive_drift_remediation_timeout" => c.drift_timeout.sensitive = d(ms),
                "agents.boot_timeout" => c.node_boot.default = Some(d(ms)),
                "sensitive.wipe_timeout" => c.wipe_timeout = Some(d(ms)),
                "sensitive.boot_timeout" => {
                    self.hardened_boot_ms = ms;
                    // Only where claims boot a hardened image at all.
                    if c.hardened_boot.is_some() {
                        c.hardened_boot = Some(d(ms));
                    }
                }
                _ => {}
            }
        }
        self.ctl.node_boot.by_kind = s
            .iter()
            .filter_map(|(k, &ms)| Some((k.strip_prefix(BOOT_BY_KIND)?.to_string(), d(ms))))
            .collect();
    }
}

/// The keys whose values differ between `mine` (a member's config file) and `held` (the quorum),
/// with both values in seconds: what a member warns about when it applies the quorum's.
pub fn differences(mine: &Settings, held: &Settings) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = mine.keys().chain(held.keys()).collect();
    let secs = |v: Option<&u64>| v.map_or("unset".to_string(), |ms| format!("{}s", *ms as f64 / 1000.0));
    keys.into_iter()
        .filter(|k| mine.get(*k) != held.get(*k))
        .map(|k| format!("{k}: config file {}, quorum {}", secs(mine.get(k)), secs(held.get(k))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changes_are_checked_key_by_key() {
        let ok = parse_changes(
            json!({"agents.boot_timeout": "15m", "agents.grace": 90, "agents.boot_timeout_by_kind.H200": null})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(ok["agents.boot_timeout"], Some(900_000));
        assert_eq!(ok["agents.grace"], Some(90_000));
        assert_eq!(ok["agents.boot_timeout_by_kind.H200"], None);
        for (body, field) in [
            (json!({"agents.nope": "1m"}), "agents.nope"),
            (
                json!({"agents.boot_timeout_by_kind.": "1m"}),
                "agents.boot_timeout_by_kind.",
            ),
            (json!({"agents.grace": null}), "agents.grace"),
            (json!({"agents.grace": "0s"}), "agents.grace"),
            (json!({"agents.grace": "soon"}), "agents.grace"),
            (json!({"agents.grace": true}), "agents.grace"),
            (json!({}), "settings"),
        ] {
            let e = parse_changes(body.as_object().unwrap()).unwrap_err();
            assert_eq!(e.field, field, "{body}: {}", e.message);
        }
    }

    #[test]
    fn differences_name_each_key_with_both_values() {
        let mine = Settings::from([("a".into(), 1000), ("b".into(), 2000)]);
        let held = Settings::from([("a".into(), 1000), ("b".into(), 3000), ("c".into(), 500)]);
        assert_eq!(
            differences(&mine, &held),
            ["b: config file 2s, quorum 3s", "c: config file unset, quorum 0.5s"]
        );
    }
}
