//! Federation (book: "Federation Architecture"), built only with the `federation` cargo feature and
//! run only with `federation.enabled`. Sovereignty first: the broker suggests, each site's own
//! scheduler decides, and a site without it is a whole site.
//!
//! - **Trust** ([`sign`]): requests between sites are signed with a key derived from a shared
//!   workspace's secret (exchanged out of band, named in `federation.workspaces`, never in the Raft
//!   log); answers are signed back. Peers (`lattice admin federation add-peer`) and revoked
//!   workspaces are Raft-committed, so every member refuses a revoked workspace at once.
//! - **Catalog**: each site serves its capabilities (nodes, free nodes, GPU types), energy price,
//!   datasets, uenvs and the asking site's tenants its policy accepts; every member fetches each
//!   peer's every `sync_interval`. A peer with no catalog for 2× the interval is *stale*
//!   (deprioritised), for `unreachable_after` (24 h) *unreachable* (excluded); a failed request or
//!   fetch makes it *degraded* until the next success.
//! - **Routing** ([`route`]): `--site=auto` or a named site, scored by data gravity, capacity,
//!   energy, the tenant's authorization and data sovereignty.
//! - **Forwarding** ([`broker`]): a request for a peer is signed and sent with retries (1 s, 2 s,
//!   4 s, at most 30 s, or the peer's `Retry-After`); after the retries the user gets the failure, or
//!   with `--site=auto` it is scheduled here. The peer checks its policy and submits it into its own
//!   quorum as `user@site` under the tenant its policy maps to; it answers 503 with `Retry-After: 5`
//!   while its quorum has no leader. Status, logs and cancel reach the peer through this site.
//! - **Ends** ([`api::report_ends`]): the peer's leader reports each origin site's ended
//!   allocations home; home commits each at its quorum once (`QuorumCommand::FederatedEnd`), for
//!   its user (`GET /api/v1/federation/ended`).

pub mod api;
pub mod broker;
pub mod grpc;
pub mod route;
pub mod sign;
pub mod state;
pub mod sync;

use crate::accounting::SecretRef;
use route::{Dataset, PeerStatus, Weights};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// `federation:` in the runtime's config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FederationConfig {
    /// Off by default: no federation code runs, no federation endpoint answers.
    #[serde(default)]
    pub enabled: bool,
    /// This site's name, as its peers know it.
    pub site: String,
    /// Shared workspaces: id → where its secret is (`file:///path` or `env:NAME`).
    #[serde(default)]
    pub workspaces: BTreeMap<String, String>,
    /// Who may submit here from each peer (the policy): peer → its tenants mapped to ours.
    #[serde(default)]
    pub accept: BTreeMap<String, AcceptPolicy>,
    /// The data this site holds (its dataset catalog).
    #[serde(default)]
    pub datasets: Vec<Dataset>,
    /// uenv images this site has (cross-site name resolution).
    #[serde(default)]
    pub uenvs: Vec<String>,
    /// The electricity price advertised when the profile has no price series.
    pub energy_price: Option<f64>,
    /// How often peers' catalogs are fetched (stale after twice this).
    #[serde(default = "sync_default")]
    pub sync_interval: String,
    /// No catalog for this long: the peer is unreachable and out of routing.
    #[serde(default = "unreachable_default")]
    pub unreachable_after: String,
    /// One request's timeout.
    #[serde(default = "timeout_default")]
    pub timeout: String,
    /// Retries of a forwarded request after the first attempt.
    #[serde(default = "retries_default")]
    pub retries: u32,
    /// The first retry's wait; doubled each retry, at most 30 s.
    #[serde(default = "backoff_default")]
    pub backoff: String,
    #[serde(default)]
    pub weights: Weights,
    /// A CA bundle for peers' TLS certificates (besides the system's roots).
    pub ca: Option<std::path::PathBuf>,
}

/// One peer's policy (the book's OPA check): which of its tenants run here, as which of ours.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptPolicy {
    /// Their tenant → ours.
    #[serde(default)]
    pub tenants: BTreeMap<String, String>,
    /// The most nodes one of its requests may ask for.
    pub max_nodes: Option<u32>,
}

fn sync_default() -> String {
    "15m".into()
}
fn unreachable_default() -> String {
    "24h".into()
}
fn timeout_default() -> String {
    "10s".into()
}
fn retries_default() -> u32 {
    3
}
fn backoff_default() -> String {
    "1s".into()
}

fn duration(field: &str, v: &str) -> Result<Duration, String> {
    humantime::parse_duration(v).map_err(|e| format!("federation.{field}: `{v}`: {e}"))
}

impl FederationConfig {
    /// Checks what can be checked at start (durations, secret references, names).
    pub fn validate(&self) -> Result<(), String> {
        if self.site.trim().is_empty() {
            return Err("federation.site: a site name is required".into());
        }
        for (f, v) in [
            ("sync_interval", &self.sync_interval),
            ("unreachable_after", &self.unreachable_after),
            ("timeout", &self.timeout),
            ("backoff", &self.backoff),
        ] {
            duration(f, v)?;
        }
        for (ws, r) in &self.workspaces {
            SecretRef::parse(r).map_err(|e| format!("federation.workspaces.{ws}: {e}"))?;
        }
        for d in &self.datasets {
            if d.name.is_empty() || !d.size_gb.is_finite() || d.size_gb < 0.0 {
                return Err(format!("federation.datasets: `{}`: a name and a size_gb ≥ 0", d.name));
            }
        }
        Ok(())
    }

    pub fn sync(&self) -> Duration {
        duration("sync_interval", &self.sync_interval).unwrap_or(Duration::from_secs(900))
    }
    pub fn unreachable(&self) -> Duration {
        duration("unreachable_after", &self.unreachable_after).unwrap_or(Duration::from_secs(86_400))
    }
    pub fn request_timeout(&self) -> Duration {
        duration("timeout", &self.timeout).unwrap_or(Duration::from_secs(10))
    }
    pub fn first_backoff(&self) -> Duration {
        duration("backoff", &self.backoff).unwrap_or(Duration::from_secs(1))
    }

    /// The key for `workspace`, read now (a rotated secret is picked up).
    pub fn key(&self, workspace: &str) -> Result<sign::WorkspaceKey, String> {
        let r = self
            .workspaces
            .get(workspace)
            .ok_or_else(|| format!("no key for workspace {workspace} in federation.workspaces"))?;
        let secret = SecretRef::parse(r)?.read()?;
        if secret.is_empty() {
            return Err(format!("federation.workspaces.{workspace}: the secret is empty"));
        }
        Ok(sign::WorkspaceKey::derive(workspace, secret.as_bytes()))
    }
}

/// What a site advertises to a peer (the federation catalog's entry for it).
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Catalog {
    pub site: String,
    pub generated_ms: u64,
    /// `healthy`, or `degraded` while its quorum has had no leader for over 10 s.
    pub status: String,
    pub nodes: u32,
    /// Nodes ready and free now.
    pub available_nodes: u32,
    /// Nodes by GPU type.
    pub gpu_types: BTreeMap<String, u32>,
    pub energy_price: Option<f64>,
    pub datasets: Vec<Dataset>,
    pub uenvs: Vec<String>,
    /// The asking site's tenants this site's policy accepts.
    pub tenants: Vec<String>,
}

/// What this member knows of one peer.
#[derive(Clone, Debug, Default)]
pub struct PeerView {
    pub catalog: Option<Catalog>,
    /// The last catalog received (ms since the epoch).
    pub synced_ms: Option<u64>,
    /// The last fetch or request attempt.
    pub attempted_ms: Option<u64>,
    /// The last request or fetch failed (and why).
    pub failing: Option<String>,
}

impl PeerView {
    /// Its status at `now_ms`, given when it was added.
    pub fn status(&self, cfg: &FederationConfig, added_ms: u64, now_ms: u64) -> PeerStatus {
        let since = now_ms.saturating_sub(self.synced_ms.unwrap_or(added_ms));
        if since > cfg.unreachable().as_millis() as u64 {
            PeerStatus::Unreachable
        } else if self.synced_ms.is_none() || since > 2 * cfg.sync().as_millis() as u64 {
            PeerStatus::Stale
        } else if self.failing.is_some() {
            PeerStatus::Degraded
        } else {
            PeerStatus::Healthy
        }
    }
}

/// A peer as `lattice admin federation status` shows it.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct PeerStatusView {
    pub name: String,
    pub endpoints: Vec<String>,
    pub workspace: String,
    pub revoked: bool,
    pub status: PeerStatus,
    pub synced_ms: Option<u64>,
    pub last_error: Option<String>,
    pub catalog: Option<Catalog>,
}

/// What `GET /api/v1/admin/federation` answers.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct FederationStatus {
    pub site: String,
    pub sync_interval: String,
    pub local: Catalog,
    pub peers: Vec<PeerStatusView>,
    pub revoked_workspaces: Vec<String>,
}

/// Wall-clock milliseconds since the epoch (signatures and staleness are about real time).
pub fn now_ms() -> u64 {
    lattice_control::wall_now().0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> FederationConfig {
        yaml_serde::from_str("enabled: true\nsite: a\nsync_interval: 1m\nunreachable_after: 1h\n").unwrap()
    }

    #[test]
    fn a_peer_goes_stale_after_two_intervals_and_unreachable_after_the_limit() {
        let c = cfg();
        let mut v = PeerView::default();
        assert_eq!(v.status(&c, 0, 1000), PeerStatus::Stale, "never synced");
        v.synced_ms = Some(0);
        assert_eq!(v.status(&c, 0, 100_000), PeerStatus::Healthy);
        v.failing = Some("refused".into());
        assert_eq!(v.status(&c, 0, 100_000), PeerStatus::Degraded);
        v.failing = None;
        assert_eq!(v.status(&c, 0, 121_000), PeerStatus::Stale);
        assert_eq!(v.status(&c, 0, 3_600_001), PeerStatus::Unreachable);
    }

    #[test]
    fn bad_config_names_the_field() {
        let mut c = cfg();
        c.sync_interval = "soon".into();
        assert!(c.validate().unwrap_err().contains("federation.sync_interval"));
        let mut c = cfg();
        c.workspaces.insert("hpc".into(), "vault://x".into());
        assert!(c.validate().unwrap_err().contains("federation.workspaces.hpc"));
        let c = cfg();
        assert!(c.key("hpc").unwrap_err().contains("no key for workspace hpc"));
    }
}
