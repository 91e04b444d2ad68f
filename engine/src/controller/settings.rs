//! The site settings decisions read, by key: the controller's heartbeat grace, drift, boot, wipe
//! and preemption-report timeouts (and the heartbeat timeout the runtime's agent watch reads), and
//! the network domains' grace periods (the default and a named domain's own). In
//! production they are quorum state (an operator changes them at the quorum, every leader applies
//! what it holds) and the trace capture records them; a replay applies a trace's `settings` event
//! the same way, through [`Controller::apply_settings`].

use super::Controller;
use crate::time::Duration;
use std::collections::BTreeMap;

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

/// How long an empty network domain keeps its VNI (where the site models network domains).
pub const NETWORK_GRACE: &str = "network.grace";

/// One named network domain's own grace period: this prefix, its tenant, `/`, its name
/// (`network.grace_by_domain.physics/dag-ml`; book: `lattice admin network set-grace`).
pub const GRACE_BY_DOMAIN: &str = "network.grace_by_domain.";

/// The tenant and domain a [`GRACE_BY_DOMAIN`] key names (a tenant name holds no `/`; the domain's
/// may).
pub fn grace_domain(key: &str) -> Option<(&str, &str)> {
    let (tenant, domain) = key.strip_prefix(GRACE_BY_DOMAIN)?.split_once('/')?;
    (!tenant.is_empty() && !domain.is_empty()).then_some((tenant, domain))
}

/// The key of `tenant`'s domain `domain`'s own grace period.
pub fn grace_key(tenant: &str, domain: &str) -> String {
    format!("{GRACE_BY_DOMAIN}{tenant}/{domain}")
}

/// Borrowed nodes' heartbeat grace is at most this (the book's 30 s), or the grace when shorter.
const BORROWED_GRACE_MAX: Duration = Duration(30_000);

/// Whether `key` names a setting (a node kind's name is not empty and has no dot).
pub fn is_setting(key: &str) -> bool {
    SETTING_KEYS.contains(&key)
        || key == NETWORK_GRACE
        || grace_domain(key).is_some()
        || key
            .strip_prefix(BOOT_BY_KIND)
            .is_some_and(|k| !k.is_empty() && !k.contains('.'))
}

impl Controller {
    /// The settings in force (a timeout that is off — no wipe or report deadline, no boot timeout —
    /// has no key).
    pub fn settings(&self) -> Settings {
        let ms = |d: Option<Duration>| d.map_or(0, |d| d.0);
        let mut s: Settings = [
            ("agents.heartbeat_timeout", self.heartbeat_timeout.0),
            ("agents.grace", self.grace.default.0),
            ("agents.sensitive_grace", self.grace.sensitive.0),
            ("agents.preemption_report_grace", ms(self.preemption_report_grace)),
            ("agents.drift_remediation_timeout", self.drift_timeout.standard.0),
            (
                "agents.sensitive_drift_remediation_timeout",
                self.drift_timeout.sensitive.0,
            ),
            ("agents.boot_timeout", ms(self.node_boot.default)),
            ("sensitive.wipe_timeout", ms(self.wipe_timeout)),
            ("sensitive.boot_timeout", self.hardened_boot_timeout.0),
        ]
        .into_iter()
        .filter(|(_, ms)| *ms > 0)
        .map(|(k, ms)| (k.to_string(), ms))
        .collect();
        for (kind, d) in &self.node_boot.by_kind {
            s.insert(format!("{BOOT_BY_KIND}{kind}"), d.0);
        }
        if let Some(n) = &self.network {
            s.insert(NETWORK_GRACE.into(), n.default_grace().0);
            for ((tenant, name), d) in n.domain_graces() {
                if let (Some(t), crate::network::DomainName::Named(name)) = (self.engine.tenant(*tenant), name) {
                    s.insert(grace_key(&t.name, name), d.0);
                }
            }
        }
        s
    }

    /// Decides with `s` from now on: each key given replaces the setting in force; the node kinds'
    /// boot timeouts and the domains' own grace periods are replaced as a whole (a domain's tenant
    /// the engine does not know yet is registered). Empty: nothing changes. Keys this version does
    /// not know are skipped, and so are the network's where the site models no network domains.
    pub fn apply_settings(&mut self, s: &Settings) {
        if s.is_empty() {
            return;
        }
        for (key, &ms) in s {
            let d = Duration(ms);
            match key.as_str() {
                "agents.heartbeat_timeout" => self.heartbeat_timeout = d,
                "agents.grace" => {
                    self.grace.default = d;
                    self.grace.borrowed = d.min(BORROWED_GRACE_MAX);
                }
                "agents.sensitive_grace" => self.grace.sensitive = d,
                "agents.preemption_report_grace" => self.preemption_report_grace = Some(d),
                "agents.drift_remediation_timeout" => self.drift_timeout.standard = d,
                "agents.sensitive_drift_remediation_timeout" => self.drift_timeout.sensitive = d,
                "agents.boot_timeout" => self.node_boot.default = Some(d),
                "sensitive.wipe_timeout" => self.wipe_timeout = Some(d),
                NETWORK_GRACE => {
                    if let Some(n) = self.network.as_mut() {
                        n.set_default_grace(d);
                    }
                }
                "sensitive.boot_timeout" => {
                    self.hardened_boot_timeout = d;
                    // Only where claims boot a hardened image at all.
                    if self.hardened_boot.is_some() {
                        self.hardened_boot = Some(d);
                    }
                }
                _ => {}
            }
        }
        self.node_boot.by_kind = s
            .iter()
            .filter_map(|(k, &ms)| Some((k.strip_prefix(BOOT_BY_KIND)?.to_string(), Duration(ms))))
            .collect();
        if self.network.is_some() {
            let by = s
                .iter()
                .filter_map(|(k, &ms)| {
                    let (tenant, name) = grace_domain(k)?;
                    let t = self.engine.add_tenant(tenant);
                    Some(((t, crate::network::DomainName::Named(name.to_string())), Duration(ms)))
                })
                .collect();
            if let Some(n) = self.network.as_mut() {
                n.set_domain_graces(by);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_applied_are_the_settings_in_force() {
        let config = crate::engine::EngineConfig::new(crate::policy::Policy::EASY);
        let engine = crate::engine::Engine::new(config, Vec::new()).unwrap();
        let mut c = Controller::new(engine);
        c.hardened_boot = Some(Duration::from_mins(10));
        let s: Settings = [
            ("agents.grace", 90_000),
            ("agents.sensitive_grace", 120_000),
            ("agents.heartbeat_timeout", 20_000),
            ("agents.preemption_report_grace", 45_000),
            ("agents.drift_remediation_timeout", 3_600_000),
            ("agents.sensitive_drift_remediation_timeout", 1_800_000),
            ("agents.boot_timeout", 900_000),
            ("agents.boot_timeout_by_kind.H200", 1_200_000),
            ("sensitive.wipe_timeout", 2_400_000),
            ("sensitive.boot_timeout", 300_000),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        c.apply_settings(&s);
        assert_eq!(c.settings(), s);
        assert_eq!(
            c.grace.borrowed,
            Duration::from_secs(30),
            "borrowed nodes: at most 30 s"
        );
        assert_eq!(c.hardened_boot, Some(Duration::from_mins(5)));
        // A kind left out is removed; the others stay.
        let mut fewer = s.clone();
        fewer.remove("agents.boot_timeout_by_kind.H200");
        c.apply_settings(&fewer);
        assert!(c.node_boot.by_kind.is_empty());
        assert_eq!(c.settings(), fewer);
        assert!(is_setting("agents.boot_timeout_by_kind.cpu") && !is_setting("agents.boot_timeout_by_kind."));
    }

    /// The network's grace periods are settings where the site models domains: the default and a
    /// named domain's own, by tenant name (registered when new), replaced as a whole.
    #[test]
    fn the_domains_grace_periods_are_settings() {
        let config = crate::engine::EngineConfig::new(crate::policy::Policy::EASY);
        let engine = crate::engine::Engine::new(config, Vec::new()).unwrap();
        let mut c = Controller::new(engine);
        let dag = grace_key("physics", "dag/ml");
        let s: Settings = [(NETWORK_GRACE.to_string(), 120_000), (dag.clone(), 900_000)].into();
        c.apply_settings(&s);
        assert!(
            !c.settings().contains_key(NETWORK_GRACE),
            "no network modelled: skipped"
        );
        let pool = crate::network::VniPool::new(1000, 1003).unwrap();
        c.network = Some(crate::network::NetworkDomains::new(pool, Duration::from_mins(5)));
        c.apply_settings(&s);
        let held: Settings = c
            .settings()
            .into_iter()
            .filter(|(k, _)| k.starts_with("network."))
            .collect();
        assert_eq!(held, s);
        let n = c.network.as_ref().unwrap();
        assert_eq!(n.default_grace(), Duration::from_mins(2));
        let physics = (0..4)
            .map(crate::ids::TenantId)
            .find(|t| c.engine.tenant(*t).is_some_and(|t| t.name == "physics"))
            .expect("the tenant is registered");
        let key = (physics, crate::network::DomainName::Named("dag/ml".into()));
        assert_eq!(n.grace_of(&key), Duration::from_mins(15));
        // Left out: back to the default.
        c.apply_settings(&[(NETWORK_GRACE.to_string(), 120_000)].into());
        assert_eq!(c.network.as_ref().unwrap().grace_of(&key), Duration::from_mins(2));
        assert_eq!(grace_domain(&dag), Some(("physics", "dag/ml")));
        for bad in [
            "network.grace_by_domain.",
            "network.grace_by_domain.t/",
            "network.grace_by_domain./d",
            "network.grace_by_domain.td",
        ] {
            assert!(!is_setting(bad), "{bad}");
        }
    }
}
