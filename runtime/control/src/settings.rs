//! Site settings that decisions read: the controller's heartbeat grace, drift, boot, wipe and
//! preemption-report timeouts. They are quorum state (`QuorumCommand::PutSettings`): a member's
//! config file seeds them, `PATCH /v1/config` (`lattice admin config set agents.KEY=VALUE`) changes
//! them, and every leader schedules with what the quorum holds — so a fail-over to a member whose
//! file says otherwise changes nothing. Values are milliseconds; the API shows seconds and takes
//! seconds or a duration (`"10m"`), as vCluster configurations do.

use super::*;
use serde_json::{Map, Value};

pub use lattice_engine::controller::settings::{BOOT_BY_KIND, SETTING_KEYS, Settings, is_setting};

/// An operator's changes (`{"agents.boot_timeout": "15m", "agents.boot_timeout_by_kind.H200": null}`)
/// as the quorum command's map: each key checked, each value a positive duration; `null` removes a
/// node kind's timeout (the others always have a value). The first bad key is refused, naming it.
pub fn parse_changes(changes: &Map<String, Value>) -> Result<BTreeMap<String, Option<u64>>, FieldError> {
    if changes.is_empty() {
        return Err(bad("settings", "no setting given"));
    }
    lattice_traces::vcluster_config::settings_of(changes).map_err(|e| bad(&e.field, e.message))
}

pub use lattice_traces::vcluster_config::settings_json;

impl Control {
    /// The settings in force.
    pub fn settings(&self) -> Settings {
        self.ctl.settings()
    }

    /// Decides with `s` (what the quorum holds) from now on: each key given replaces the setting
    /// in force, the node kinds' boot timeouts as a whole ([`lattice_engine::Controller::apply_settings`]).
    /// Empty (a quorum not seeded yet): nothing changes. The capture records the settings in
    /// force, as a replay applies them.
    pub fn apply_settings(&mut self, s: &Settings) {
        if s.is_empty() {
            return;
        }
        self.ctl.apply_settings(s);
        if self.capture.is_some() {
            let ts = self.now().0 as f64 / 1000.0;
            let line = serde_json::json!({"ts": ts, "type": "settings", "settings": settings_json(&self.settings())});
            self.capture_line(line);
        }
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
