//! The runtime's configuration file (YAML). Paths are relative to the file's folder.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// This member's quorum id.
    #[serde(default = "one")]
    pub node_id: u64,
    /// REST API, `/healthz` and `/metrics`.
    #[serde(default = "rest_default")]
    pub rest_listen: String,
    /// The URL clients reach this member's REST API at: a member that is not the leader names the
    /// leader's in its 421 answers, and clients go there. Default: the bound address (this host's
    /// name when bound to every interface), `https` with `tls`.
    #[serde(default)]
    pub rest_url: Option<String>,
    /// gRPC: the quorum's Raft service (peers reach this member here).
    #[serde(default = "grpc_default")]
    pub grpc_listen: String,
    /// Where the quorum keeps its durable log, vote and snapshots.
    #[serde(default = "data_default")]
    pub data_dir: PathBuf,
    /// Raft log entries between snapshots of the quorum's state (default 1000). The log is kept back
    /// past the previous snapshot, so a member whose latest snapshot is damaged starts from the
    /// previous one.
    #[serde(default)]
    pub raft_snapshot_every: Option<u64>,
    /// Every quorum member (this one included): id → gRPC address. Empty = a single member.
    #[serde(default)]
    pub members: BTreeMap<u64, String>,
    /// Node inventory YAML (or the Alibaba node list CSV).
    pub inventory: Option<PathBuf>,
    /// Simulated nodes `sim-000..` added when no inventory is given (dev and tests).
    #[serde(default)]
    pub simulated_nodes: u32,
    /// Simulated agents run every started allocation in-process (default: on when nodes are simulated).
    pub simulate_agents: Option<bool>,
    /// Weight profile: per-vCluster weights and scheduler config (`profiles/*.yaml`).
    pub profile: Option<PathBuf>,
    /// Tenant contracts: hard quotas (enforced by the quorum) and soft ones.
    pub tenants: Option<PathBuf>,
    /// How often the scheduling loop wakes when nothing else wakes it.
    #[serde(default = "cycle_default")]
    pub cycle: String,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// API authentication: `mode: none` (dev) or `jwt` (RS256 JWKS file and/or HS256 dev secret).
    #[serde(default)]
    pub auth: crate::auth::AuthConfig,
    /// TLS on REST and gRPC (the public API and Raft between members); absent = plaintext (dev).
    pub tls: Option<crate::tls::TlsConfig>,
    #[serde(default)]
    pub agents: AgentsConfig,
    /// The log store the agents flush output chunks to (`--log-store` on the agents; a directory, or
    /// an S3 bucket mounted on agents and members): `GET /v1/allocations/{id}/logs` reads it.
    pub log_store: Option<PathBuf>,
    /// `network:` — the Slingshot VNI pool and the network domains' grace period.
    #[serde(default)]
    pub network: lattice_control::network::NetworkConfig,
    /// `services:` — external services the control plane calls.
    #[serde(default)]
    pub services: ServicesConfig,
    /// `sensitive:` — the sensitive node lifecycle.
    #[serde(default)]
    pub sensitive: SensitiveConfig,
    /// `accounting:` — usage pushed to Waldur (off by default).
    #[serde(default)]
    pub accounting: crate::accounting::AccountingConfig,
    /// `federation:` — the broker between sites (needs the `federation` cargo feature).
    #[cfg(feature = "federation")]
    pub federation: Option<crate::federation::FederationConfig>,
    /// Without the `federation` feature: refused at start when enabled (never silently ignored).
    #[cfg(not(feature = "federation"))]
    pub federation: Option<yaml_serde::Value>,
}

/// `services:` in the config.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicesConfig {
    /// The Slingshot fabric manager: a CXI service per allocation on a VNI (created before its tasks
    /// start, revoked when it ends).
    pub fabric: Option<ServiceConfig>,
    /// VAST: each data mount's tier and size are looked up at submission (catalog/locality), and a
    /// staging allocation's mounts are prefetched to the hot tier (failures retried up to 3 times).
    pub vast: Option<ServiceConfig>,
    /// The TSDB the agents push telemetry to (`--remote-write` on the agents): its Prometheus query
    /// API (`/api/v1/query`) serves per-allocation metrics, comparisons and diagnostics.
    pub tsdb: Option<ServiceConfig>,
    /// OpenCHAMI: the node inventory from SMD (when no `inventory` is given), kept in step with it;
    /// drifted nodes flagged there.
    pub openchami: Option<crate::openchami::OpenChamiConfig>,
    /// The checkpoint store as the members mount it: probed (a file written, synced, read back and
    /// removed); `failures` failed probes in a row are a checkpoint-storage outage for the engine
    /// (and `lattice_checkpoint_storage_unavailable`), one good probe ends it.
    pub checkpoint_store: Option<crate::storage_probe::ProbeConfig>,
    /// The S3-compatible cold tier: audit entries past the hot window and every backup, as
    /// write-once objects ([`crate::archive`]).
    pub archive: Option<crate::archive::ArchiveConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub url: String,
    /// Bearer token; read from this environment variable (never written in the file).
    pub token_env: Option<String>,
    #[serde(default = "service_timeout_default")]
    pub timeout: String,
    #[serde(default = "service_retries_default")]
    pub retries: u32,
    /// VAST only: its write bandwidth in GB/s (staging may use 30 % of it; the engine's default 100).
    pub write_gbps: Option<f64>,
}

fn service_timeout_default() -> String {
    "10s".into()
}
fn service_retries_default() -> u32 {
    3
}

impl ServiceConfig {
    /// The HTTP client settings (timeouts, retries with backoff) for `lattice_adapters::http`.
    pub fn http(&self) -> Result<lattice_adapters::http::HttpConfig, String> {
        let mut h = lattice_adapters::http::HttpConfig::new(&self.url);
        let t = lattice_traces::parse_duration(&self.timeout).map_err(|m| format!("timeout: {m}"))?;
        h.timeout = std::time::Duration::from_millis(t.0);
        h.retries = self.retries;
        h.token = self.token_env.as_ref().and_then(|v| std::env::var(v).ok());
        Ok(h)
    }
}

/// `sensitive:` (book: "Wipe Failure Handling").
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensitiveConfig {
    /// A released node's secure wipe not confirmed within this fails: the node is quarantined.
    #[serde(default = "wipe_timeout_default")]
    pub wipe_timeout: String,
    /// A claim's node not booted into the hardened image within this (`services.openchami.hardened`)
    /// fails: the node is out (Failed) and the claim fails (the book's boot timeout).
    #[serde(default = "boot_timeout_default")]
    pub boot_timeout: String,
    /// The Ed25519 key (PKCS#8 PEM) that signs audit entries and exports (book: "Audit Signing Key
    /// Persistence"); every member gets the same file. Unset: a random key (testing only).
    #[serde(default)]
    pub audit_signing_key_path: Option<PathBuf>,
}

fn boot_timeout_default() -> String {
    "10m".into()
}

fn wipe_timeout_default() -> String {
    "30m".into()
}

impl Default for SensitiveConfig {
    fn default() -> Self {
        SensitiveConfig {
            wipe_timeout: wipe_timeout_default(),
            boot_timeout: boot_timeout_default(),
            audit_signing_key_path: None,
        }
    }
}

impl SensitiveConfig {
    pub fn wipe_timeout_ms(&self) -> u64 {
        lattice_traces::parse_duration(&self.wipe_timeout).map_or(30 * 60_000, |d| d.0)
    }

    pub fn boot_timeout(&self) -> lattice_engine::Duration {
        lattice_traces::parse_duration(&self.boot_timeout).unwrap_or(lattice_engine::Duration::from_mins(10))
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// `scheduler.trace_capture`: append every submission and completion to this JSONL file, in the
    /// format `rm-replay` reads.
    pub trace_capture: Option<PathBuf>,
}

/// `agents:` — how the control plane watches its node agents (book: heartbeat protocol).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsConfig {
    /// No heartbeat for this long: the node is Degraded (HeartbeatMiss). Default 30 s (3 beats).
    #[serde(default = "hb_timeout")]
    pub heartbeat_timeout: String,
    /// Degraded for this long more: Down (GraceTimeout) and its allocation requeued or failed per its
    /// requeue policy. Default 60 s (the seed's grace period).
    #[serde(default = "hb_grace")]
    pub grace: String,
    /// Nodes that ran sensitive allocations; the seed's default is 5 minutes.
    #[serde(default = "hb_sensitive_grace")]
    pub sensitive_grace: String,
    /// Simulated agents only: how long the secure wipe of a released sensitive claim's nodes takes
    /// (default 10 s; a real wipe takes the seed's 10-30 minutes).
    #[serde(default = "simulated_wipe")]
    pub simulated_wipe: String,
    /// A preemption its agents never report on: this long after the order's own limit (checkpoint
    /// deadline and SIGTERM grace, or the stop's grace), the victim is taken as stopped without a
    /// checkpoint and its nodes are released. Default 60 s.
    #[serde(default = "preemption_report_grace")]
    pub preemption_report_grace: String,
    /// A node still drifted from its conformance baseline this long after the drift goes Down
    /// (its work requeued; an operator brings it back). Default 24 h (book: "Drift Response").
    #[serde(default = "drift_remediation_timeout")]
    pub drift_remediation_timeout: String,
    /// The same for a sensitive node. Default 4 h.
    #[serde(default = "sensitive_drift_remediation_timeout")]
    pub sensitive_drift_remediation_timeout: String,
    /// A node whose agent is not healthy this long after it started booting is Failed. Default 10 min.
    #[serde(default = "node_boot_timeout_default")]
    pub boot_timeout: String,
    /// The boot timeout of a node kind (its GPU model, `cpu` for nodes without GPUs), over
    /// `boot_timeout`.
    #[serde(default)]
    pub boot_timeout_by_kind: BTreeMap<String, String>,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            heartbeat_timeout: hb_timeout(),
            grace: hb_grace(),
            sensitive_grace: hb_sensitive_grace(),
            simulated_wipe: simulated_wipe(),
            preemption_report_grace: preemption_report_grace(),
            drift_remediation_timeout: drift_remediation_timeout(),
            sensitive_drift_remediation_timeout: sensitive_drift_remediation_timeout(),
            boot_timeout: node_boot_timeout_default(),
            boot_timeout_by_kind: BTreeMap::new(),
        }
    }
}

fn node_boot_timeout_default() -> String {
    "10m".into()
}

fn drift_remediation_timeout() -> String {
    "24h".into()
}
fn sensitive_drift_remediation_timeout() -> String {
    "4h".into()
}

fn hb_sensitive_grace() -> String {
    "5m".into()
}
fn simulated_wipe() -> String {
    "10s".into()
}
fn preemption_report_grace() -> String {
    "60s".into()
}

fn hb_timeout() -> String {
    "30s".into()
}
fn hb_grace() -> String {
    "60s".into()
}

impl AgentsConfig {
    /// The controller's node boot timeouts (a duration that does not parse: the runtime does not start).
    pub fn boot_timeouts(&self) -> Result<lattice_engine::BootTimeouts, String> {
        let d = |what: &str, s: &str| lattice_traces::parse_duration(s).map_err(|m| format!("agents.{what}: {m}"));
        Ok(lattice_engine::BootTimeouts {
            default: Some(d("boot_timeout", &self.boot_timeout)?),
            by_kind: self
                .boot_timeout_by_kind
                .iter()
                .map(|(k, v)| Ok((k.clone(), d(&format!("boot_timeout_by_kind.{k}"), v)?)))
                .collect::<Result<_, String>>()?,
        })
    }

    /// The controller's heartbeat grace per node kind (borrowed nodes: 30 s, or less when the grace
    /// is shorter).
    pub fn grace(&self) -> lattice_engine::HeartbeatGrace {
        let ms = |s: &str, d: u64| lattice_traces::parse_duration(s).map_or(d, |x| x.0);
        let default = lattice_engine::Duration(ms(&self.grace, 60_000));
        lattice_engine::HeartbeatGrace {
            sensitive: lattice_engine::Duration(ms(&self.sensitive_grace, 300_000)),
            borrowed: lattice_engine::Duration(default.0.min(30_000)),
            default,
        }
    }

    /// The controller's drift remediation timeouts.
    pub fn drift_timeout(&self) -> lattice_engine::DriftTimeout {
        let ms = |s: &str, d: u64| lattice_traces::parse_duration(s).map_or(d, |x| x.0);
        lattice_engine::DriftTimeout {
            standard: lattice_engine::Duration(ms(&self.drift_remediation_timeout, 86_400_000)),
            sensitive: lattice_engine::Duration(ms(&self.sensitive_drift_remediation_timeout, 14_400_000)),
        }
    }

    /// The simulated wipe's duration.
    pub fn wipe_time(&self) -> std::time::Duration {
        std::time::Duration::from_millis(lattice_traces::parse_duration(&self.simulated_wipe).map_or(10_000, |x| x.0))
    }

    /// (timeout, grace) in ms.
    pub fn durations(&self) -> (u64, u64) {
        let ms = |s: &str, d: u64| lattice_traces::parse_duration(s).map_or(d, |x| x.0);
        (ms(&self.heartbeat_timeout, 30_000), ms(&self.grace, 60_000))
    }

    /// `preemption_report_grace` in ms.
    pub fn preemption_slack_ms(&self) -> u64 {
        lattice_traces::parse_duration(&self.preemption_report_grace).map_or(60_000, |x| x.0)
    }
}

fn one() -> u64 {
    1
}
fn rest_default() -> String {
    "127.0.0.1:8080".into()
}
fn grpc_default() -> String {
    "127.0.0.1:50051".into()
}
fn data_default() -> PathBuf {
    PathBuf::from("lattice-data")
}
fn cycle_default() -> String {
    "1s".into()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
}

impl RuntimeConfig {
    /// Reads and validates a config file; relative paths become relative to its folder.
    pub fn read(path: &Path) -> Result<RuntimeConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
            file: file.clone(),
            message: e.to_string(),
        })?;
        let mut c = RuntimeConfig::parse(&file, &text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut c.data_dir);
        for p in [
            &mut c.inventory,
            &mut c.profile,
            &mut c.tenants,
            &mut c.scheduler.trace_capture,
            &mut c.auth.jwks_file,
            &mut c.log_store,
            &mut c.accounting.disk_buffer_path,
        ]
        .into_iter()
        .flatten()
        {
            fix(p);
        }
        #[cfg(feature = "federation")]
        if let Some(p) = c.federation.as_mut().and_then(|f| f.ca.as_mut()) {
            fix(p);
        }
        if let Some(t) = &mut c.tls {
            fix(&mut t.cert);
            fix(&mut t.key);
            fix(&mut t.ca);
        }
        Ok(c)
    }

    pub fn parse(file: &str, text: &str) -> Result<RuntimeConfig, ConfigError> {
        let err = |message: String| ConfigError::Invalid {
            file: file.to_string(),
            message,
        };
        let c: RuntimeConfig = yaml_serde::from_str(text).map_err(|e| err(e.to_string()))?;
        lattice_traces::parse_duration(&c.cycle).map_err(|m| err(format!("cycle: {m}")))?;
        lattice_traces::parse_duration(&c.agents.heartbeat_timeout)
            .map_err(|m| err(format!("agents.heartbeat_timeout: {m}")))?;
        lattice_traces::parse_duration(&c.agents.grace).map_err(|m| err(format!("agents.grace: {m}")))?;
        lattice_traces::parse_duration(&c.agents.sensitive_grace)
            .map_err(|m| err(format!("agents.sensitive_grace: {m}")))?;
        lattice_traces::parse_duration(&c.agents.drift_remediation_timeout)
            .map_err(|m| err(format!("agents.drift_remediation_timeout: {m}")))?;
        lattice_traces::parse_duration(&c.agents.sensitive_drift_remediation_timeout)
            .map_err(|m| err(format!("agents.sensitive_drift_remediation_timeout: {m}")))?;
        lattice_traces::parse_duration(&c.agents.preemption_report_grace)
            .map_err(|m| err(format!("agents.preemption_report_grace: {m}")))?;
        lattice_traces::parse_duration(&c.agents.simulated_wipe)
            .map_err(|m| err(format!("agents.simulated_wipe: {m}")))?;
        if c.raft_snapshot_every == Some(0) {
            return Err(err("raft_snapshot_every: at least 1 entry between snapshots".into()));
        }
        lattice_traces::parse_duration(&c.network.grace).map_err(|m| err(format!("network.grace: {m}")))?;
        lattice_adapters::fabric::VniPool::new(c.network.vni_pool_start, c.network.vni_pool_end)
            .map_err(|e| err(format!("network: {e}")))?;
        if let Some(f) = &c.services.fabric {
            f.http().map_err(|m| err(format!("services.fabric.{m}")))?;
        }
        if let Some(v) = &c.services.vast {
            v.http().map_err(|m| err(format!("services.vast.{m}")))?;
            if v.write_gbps.is_some_and(|g| !(g.is_finite() && g > 0.0)) {
                return Err(err("services.vast.write_gbps: a bandwidth in GB/s above 0".into()));
            }
        }
        c.accounting.validate().map_err(err)?;
        lattice_traces::parse_duration(&c.sensitive.wipe_timeout)
            .map_err(|m| err(format!("sensitive.wipe_timeout: {m}")))?;
        lattice_traces::parse_duration(&c.sensitive.boot_timeout)
            .map_err(|m| err(format!("sensitive.boot_timeout: {m}")))?;
        if let Some(o) = &c.services.openchami {
            o.validate().map_err(|m| err(format!("services.openchami.{m}")))?;
        }
        #[cfg(feature = "federation")]
        if let Some(f) = c.federation.as_ref().filter(|f| f.enabled) {
            f.validate().map_err(err)?;
        }
        #[cfg(not(feature = "federation"))]
        if c.federation
            .as_ref()
            .and_then(|f| f.get("enabled"))
            .and_then(|e| e.as_bool())
            == Some(true)
        {
            return Err(err(
                "federation.enabled: this build has no federation (build lattice-runtime with `--features federation`)"
                    .into(),
            ));
        }
        if c.inventory.is_none() && c.simulated_nodes == 0 && c.services.openchami.is_none() {
            return Err(err("no nodes: give `inventory` or `simulated_nodes`".into()));
        }
        if !c.members.is_empty() && !c.members.contains_key(&c.node_id) {
            return Err(err(format!("members: this node ({}) is not among them", c.node_id)));
        }
        Ok(c)
    }

    /// The quorum's members: the configured ones, or this member alone.
    pub fn quorum_members(&self) -> BTreeMap<u64, String> {
        if self.members.is_empty() {
            [(self.node_id, self.grpc_listen.clone())].into_iter().collect()
        } else {
            self.members.clone()
        }
    }

    pub fn cycle(&self) -> std::time::Duration {
        let d = lattice_traces::parse_duration(&self.cycle).unwrap_or(lattice_engine::Duration::from_secs(1));
        std::time::Duration::from_millis(d.0.max(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let p = RuntimeConfig::parse(
            "production.yaml",
            &std::fs::read_to_string(dir.join("production.yaml")).unwrap(),
        )
        .unwrap();
        assert_eq!((p.members.len(), p.simulate_agents), (3, Some(false)));
        // One member with real agents on node-001..node-004.
        let d = RuntimeConfig::read(&dir.join("dev-agents.yaml")).unwrap();
        assert_eq!((d.quorum_members().len(), d.simulate_agents), (1, Some(false)));
        let inv = lattice_traces::read_inventory(d.inventory.as_ref().unwrap()).unwrap();
        let names: Vec<&str> = inv.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["node-001", "node-002", "node-003", "node-004"]);
        for i in 1..=3 {
            let c = RuntimeConfig::read(&dir.join(format!("local-3/member-{i}.yaml"))).unwrap();
            assert_eq!(c.quorum_members().len(), 3);
            assert_eq!(c.quorum_members()[&i], c.grpc_listen);
        }
    }

    #[test]
    fn minimal_config_is_valid_and_errors_name_the_field() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/minimal.yaml");
        let c = RuntimeConfig::read(&path).unwrap();
        assert_eq!(
            (c.rest_listen.as_str(), c.grpc_listen.as_str()),
            ("127.0.0.1:8080", "127.0.0.1:50051")
        );
        assert_eq!(c.quorum_members().len(), 1);
        let e = RuntimeConfig::parse("x.yaml", "simulated_nodes: 2\ncolour: red\n").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        let e = RuntimeConfig::parse("x.yaml", "simulated_nodes: 2\ncycle: soon\n").unwrap_err();
        assert!(e.to_string().contains("cycle"), "{e}");
        let e = RuntimeConfig::parse("x.yaml", "node_id: 4\nsimulated_nodes: 2\nmembers: {1: a, 2: b}\n").unwrap_err();
        assert!(e.to_string().contains("members"), "{e}");
    }
}
