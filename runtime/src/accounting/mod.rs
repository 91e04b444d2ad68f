//! Accounting (book: "Accounting"): Lattice schedules, Waldur accounts. With `accounting.enabled`,
//! every member runs a pipeline that reports allocations' usage to Waldur asynchronously; scheduling
//! never waits for it.
//!
//! - **Events come from durable state, not from callbacks.** At each push interval the leader reads
//!   the allocations that ran (their starts, ends and checkpoints: the control plane's records, which
//!   survive restarts and fail-overs, see [`crate::mirror`]) and the quorum's audit log (sensitive
//!   claims and releases), and turns what happened since the quorum's accounting mark into events
//!   ([`events_of`], [`audit_events`]). Each event's idempotency key is derived from what it reports,
//!   so the same event always has the same key, whoever generates it.
//! - **The buffer**: new events go to a bounded in-memory queue (`buffer_size`), then to a disk log
//!   (`disk_buffer_path`, up to `disk_buffer_max_events`), then are dropped and counted
//!   ([`lattice_adapters::spool`]). Delivery is in order; a failed push stops the round and the rest
//!   waits for the next one (Waldur being down or slow costs nothing but the wait).
//! - **The mark**: once the buffer is empty, everything up to the last scan (less [`MARK_LAG`]) is
//!   delivered; the leader commits that through Raft (`AccountingMark`). A new leader — or this one
//!   after a restart, having lost its memory buffer — regenerates events from the mark, so nothing
//!   is lost; what was already delivered comes again under the same key, and Waldur records it once.
//! - **Reconcile**: `lattice admin accounting reconcile --since --until` regenerates a window's events
//!   (for events dropped when the buffer overflowed).
//!
//! This module holds the configuration, the pipeline's state ([`Accountant`]) and the events;
//! [`service`] runs it in a member and answers the API's accounting calls.

pub mod service;

use crate::error::ApiError;
use lattice_adapters::spool::{Placed, Spool};
use lattice_adapters::waldur::{AccountingEvent, Waldur};
use lattice_control::{AccountingRow, AllocationView};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The mark trails the last scan by this much: an audit entry is stamped by its proposer before it
/// commits, so one can appear a little after a scan with a time just before it.
pub const MARK_LAG_MS: u64 = 60_000;
/// Events sent per push round before the buffer is looked at again.
const BATCH: usize = 500;

/// `accounting:` in the runtime's config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountingConfig {
    /// The feature flag (default off: no accounting code runs).
    #[serde(default)]
    pub enabled: bool,
    /// `waldur` (the only provider).
    #[serde(default = "provider_default")]
    pub provider: String,
    pub waldur: Option<WaldurConfig>,
    #[serde(default = "push_interval_default")]
    pub push_interval_seconds: u64,
    /// Events held in memory.
    #[serde(default = "buffer_default")]
    pub buffer_size: usize,
    /// The disk buffer's folder (default `DATA_DIR/accounting-wal`).
    pub disk_buffer_path: Option<PathBuf>,
    #[serde(default = "disk_max_default")]
    pub disk_buffer_max_events: u64,
}

impl Default for AccountingConfig {
    fn default() -> Self {
        AccountingConfig {
            enabled: false,
            provider: provider_default(),
            waldur: None,
            push_interval_seconds: push_interval_default(),
            buffer_size: buffer_default(),
            disk_buffer_path: None,
            disk_buffer_max_events: disk_max_default(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaldurConfig {
    /// e.g. `https://waldur.example.com/api/`.
    pub api_url: String,
    /// Where the API token is: `file:///run/secrets/waldur-token` (e.g. a Vault Agent's rendered
    /// secret) or `env:WALDUR_TOKEN`. Read at start and before every push round (rotation).
    pub token_secret_ref: Option<String>,
    #[serde(default = "timeout_default")]
    pub timeout: String,
    /// Retries within one push (the next round retries anyway).
    #[serde(default = "retries_default")]
    pub retries: u32,
}

fn provider_default() -> String {
    "waldur".into()
}
fn push_interval_default() -> u64 {
    60
}
fn buffer_default() -> usize {
    10_000
}
fn disk_max_default() -> u64 {
    100_000
}
fn timeout_default() -> String {
    "10s".into()
}
fn retries_default() -> u32 {
    1
}

impl AccountingConfig {
    /// Checks what can be checked without I/O; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        if self.provider != "waldur" {
            return Err(format!(
                "accounting.provider: `{}`: only `waldur` is supported",
                self.provider
            ));
        }
        let w = self
            .waldur
            .as_ref()
            .ok_or("accounting.waldur: required when accounting.enabled (api_url, token_secret_ref)")?;
        if !(w.api_url.starts_with("http://") || w.api_url.starts_with("https://")) {
            return Err(format!("accounting.waldur.api_url: `{}`: an http(s) URL", w.api_url));
        }
        lattice_traces::parse_duration(&w.timeout).map_err(|m| format!("accounting.waldur.timeout: {m}"))?;
        if let Some(r) = &w.token_secret_ref {
            SecretRef::parse(r).map_err(|m| format!("accounting.waldur.token_secret_ref: {m}"))?;
        }
        if self.push_interval_seconds == 0 {
            return Err("accounting.push_interval_seconds: at least 1".into());
        }
        if self.buffer_size == 0 {
            return Err("accounting.buffer_size: at least 1".into());
        }
        Ok(())
    }
}

/// Where a secret is read from (book: "Secret Management": by reference, never by value).
#[derive(Clone, Debug, PartialEq)]
pub enum SecretRef {
    File(PathBuf),
    Env(String),
}

impl SecretRef {
    pub fn parse(r: &str) -> Result<SecretRef, String> {
        if let Some(p) = r.strip_prefix("file://").or_else(|| r.strip_prefix("file:")) {
            return Ok(SecretRef::File(PathBuf::from(p)));
        }
        if let Some(v) = r.strip_prefix("env://").or_else(|| r.strip_prefix("env:")) {
            return Ok(SecretRef::Env(v.to_string()));
        }
        if r.starts_with("vault://") {
            return Err(format!(
                "`{r}`: read Vault secrets through a Vault Agent sink and name its file (file:///run/secrets/…)"
            ));
        }
        Err(format!("`{r}`: file:///path or env:NAME"))
    }

    /// The secret's current value (trailing whitespace trimmed).
    pub fn read(&self) -> Result<String, String> {
        match self {
            SecretRef::File(p) => std::fs::read_to_string(p)
                .map(|s| s.trim_end().to_string())
                .map_err(|e| format!("{}: {e}", p.display())),
            SecretRef::Env(v) => std::env::var(v).map_err(|_| format!("environment variable {v} is not set")),
        }
    }
}

/// What `lattice admin accounting status` shows.
#[derive(Clone, Debug, Default, Serialize, schemars::JsonSchema)]
pub struct AccountingStatus {
    pub enabled: bool,
    pub provider: String,
    pub api_url: Option<String>,
    pub push_interval_seconds: u64,
    /// The last push round reached Waldur and it took every event sent.
    pub reachable: Option<bool>,
    pub last_success_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Events in the in-memory buffer.
    pub buffered: u64,
    /// Events in the disk buffer not yet delivered.
    pub on_disk: u64,
    pub dropped_total: u64,
    pub delivered_total: u64,
    /// Deliveries Waldur already had (the same idempotency key).
    pub duplicates_total: u64,
    /// Disk-buffer lines that could not be read back (skipped).
    pub unreadable_total: u64,
    /// Every event before this (ms since the epoch) is delivered (the quorum's mark).
    pub mark_ms: u64,
}

/// A member's pipeline: its buffer and what it knows of the last rounds.
pub struct Accountant {
    pub cfg: AccountingConfig,
    client: Waldur,
    token: Option<SecretRef>,
    spool: std::sync::Mutex<Spool<AccountingEvent>>,
    /// Keys this member generated since it became leader, with their times (pruned below the mark).
    emitted: std::sync::Mutex<(Option<u64>, BTreeMap<String, u64>)>,
    state: std::sync::Mutex<AccountingStatus>,
}

impl Accountant {
    /// The pipeline of `cfg` (enabled), its disk buffer under `data_dir` unless configured.
    pub fn new(cfg: &AccountingConfig, data_dir: &Path) -> anyhow::Result<Accountant> {
        cfg.validate().map_err(anyhow::Error::msg)?;
        let w = cfg.waldur.as_ref().expect("validated");
        let mut http = lattice_adapters::http::HttpConfig::new(&w.api_url);
        http.timeout =
            std::time::Duration::from_millis(lattice_traces::parse_duration(&w.timeout).map_or(10_000, |d| d.0));
        http.retries = w.retries;
        let token = w
            .token_secret_ref
            .as_deref()
            .map(SecretRef::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?;
        if let Some(t) = &token {
            t.read()
                .map_err(|m| anyhow::anyhow!("accounting.waldur.token_secret_ref: {m}"))?;
        }
        let dir = cfg
            .disk_buffer_path
            .clone()
            .unwrap_or_else(|| data_dir.join("accounting-wal"));
        let spool = Spool::open(Some(&dir), cfg.buffer_size, cfg.disk_buffer_max_events)
            .map_err(|e| anyhow::anyhow!("accounting.disk_buffer_path {}: {e}", dir.display()))?;
        Ok(Accountant {
            client: Waldur::new(http).map_err(|e| anyhow::anyhow!("accounting.waldur: {e}"))?,
            token,
            spool: std::sync::Mutex::new(spool),
            emitted: Default::default(),
            state: std::sync::Mutex::new(AccountingStatus {
                enabled: true,
                provider: cfg.provider.clone(),
                api_url: Some(w.api_url.clone()),
                push_interval_seconds: cfg.push_interval_seconds,
                ..Default::default()
            }),
            cfg: cfg.clone(),
        })
    }

    /// Queues `events` (in order); returns how many were dropped.
    fn enqueue(&self, events: Vec<AccountingEvent>) -> u64 {
        if events.is_empty() {
            return 0;
        }
        let mut s = self.spool.lock().unwrap();
        match s.push_all(events) {
            Ok(placed) => placed.iter().filter(|p| **p == Placed::Dropped).count() as u64,
            Err(e) => {
                tracing::error!("accounting: the disk buffer failed: {e}");
                0
            }
        }
    }

    /// The status, with the buffer's counts now.
    pub fn status(&self) -> AccountingStatus {
        let mut st = self.state.lock().unwrap().clone();
        let s = self.spool.lock().unwrap();
        st.buffered = s.in_memory() as u64;
        st.on_disk = s.on_disk();
        st.dropped_total = s.dropped();
        st.unreadable_total = s.unreadable();
        st
    }

    /// One push round: sends waiting events in order until the buffer is empty or one fails.
    /// Returns whether the buffer is empty.
    async fn push_round(&self) -> bool {
        let token = match self.token.as_ref().map(SecretRef::read).transpose() {
            Ok(t) => t,
            Err(m) => {
                self.failed(format!("token: {m}"));
                return false;
            }
        };
        loop {
            let batch = match self.spool.lock().unwrap().peek(BATCH) {
                Ok(b) => b,
                Err(e) => {
                    self.failed(format!("disk buffer: {e}"));
                    return false;
                }
            };
            if batch.is_empty() {
                return true;
            }
            for e in &batch {
                match self.client.push(e, token.as_deref()).await {
                    Ok(d) => {
                        if let Err(err) = self.spool.lock().unwrap().ack(1) {
                            self.failed(format!("disk buffer: {err}"));
                            return false;
                        }
                        let mut st = self.state.lock().unwrap();
                        st.delivered_total += 1;
                        st.duplicates_total += d.duplicate as u64;
                        st.reachable = Some(true);
                        st.last_error = None;
                        st.last_success_ms = Some(wall_ms());
                    }
                    Err(err) => {
                        self.failed(err.to_string());
                        return false;
                    }
                }
            }
        }
    }

    fn failed(&self, why: String) {
        tracing::warn!("accounting: {why} (events stay buffered)");
        let mut st = self.state.lock().unwrap();
        st.reachable = Some(false);
        st.last_error = Some(why);
    }
}

fn wall_ms() -> u64 {
    lattice_util::clock::epoch_ms()
}

/// The events `row` stands for (its start, its end once terminal, its last checkpoint).
pub fn events_of(row: &AccountingRow) -> Vec<AccountingEvent> {
    let v = &row.view;
    let Some(started) = v.started_ms else { return Vec::new() };
    let base = |event: &str, key: String, at_ms: u64, payload| AccountingEvent {
        key,
        event: event.into(),
        at_ms,
        tenant: v.tenant.clone(),
        project: v.project.clone(),
        user: v.user.clone(),
        allocation: Some(v.id.clone()),
        vcluster: Some(v.vcluster.clone()),
        payload,
    };
    let mut out = vec![base(
        "allocation.started",
        format!("{}/started/{started}", v.id),
        started,
        json!({
            "nodes": v.nodes.len(),
            "node_ids": v.nodes,
            "gpus": row.gpus,
            "gpu_type": row.gpu_type,
            "estimated_duration_s": v.walltime_s,
            "sensitive": row.sensitive,
        }),
    )];
    if v.checkpoints > 0
        && let Some(at) = v.last_checkpoint_ms
    {
        out.push(base(
            "allocation.checkpointed",
            format!("{}/checkpointed/{}", v.id, v.checkpoints),
            at,
            json!({
                "checkpoints": v.checkpoints,
                // Not measured by this control plane: the storage and time a checkpoint took.
                "checkpoint_storage_bytes": null,
                "checkpoint_duration_s": null,
            }),
        ));
    }
    if matches!(v.state.as_str(), "completed" | "failed" | "cancelled")
        && let Some(end) = v.ended_ms
    {
        let hours = end.saturating_sub(started) as f64 / 3_600_000.0;
        out.push(base(
            "allocation.completed",
            format!("{}/completed", v.id),
            end,
            json!({
                "state": v.state,
                "end_reason": v.end_reason,
                "exit_status": if v.state == "completed" { "success" } else { v.state.as_str() },
                "duration_s": end.saturating_sub(started) as f64 / 1000.0,
                "nodes": v.nodes.len(),
                "gpus": row.gpus,
                "node_hours": hours * v.nodes.len() as f64,
                "gpu_hours": hours * row.gpus as f64,
                // Not measured by this control plane.
                "storage_bytes_written": null,
                "energy_kwh": null,
            }),
        ));
    }
    out
}

/// The sensitive claims and releases in the audit log (from `since_ms`): `node.claimed`, and
/// `node.released` once the wipe's outcome is recorded. `who` names a claim's tenant and project.
pub fn audit_events(
    audit: &[lattice_engine::audit::AuditEntry],
    since_ms: u64,
    who: impl Fn(&str) -> Option<AllocationView>,
) -> Vec<AccountingEvent> {
    let mut out = Vec::new();
    for (i, e) in audit.iter().enumerate() {
        if e.at_ms < since_ms || !matches!(e.action.as_str(), "claim" | "release") {
            continue;
        }
        let view = who(&e.alloc);
        let nodes: Vec<&str> = e.detail.split(',').filter(|n| !n.is_empty()).collect();
        let payload = if e.action == "claim" {
            json!({"node_ids": nodes, "claimed_ms": e.at_ms})
        } else {
            let wipe = audit[i + 1..]
                .iter()
                .find(|w| w.alloc == e.alloc && matches!(w.action.as_str(), "wipe" | "quarantine"));
            let Some(w) = wipe else { continue };
            json!({
                "node_ids": nodes,
                "released_ms": e.at_ms,
                "wipe": if w.action == "wipe" { "confirmed" } else { "failed" },
                "wipe_ms": w.at_ms,
            })
        };
        out.push(AccountingEvent {
            key: format!("audit/{}", e.seq),
            event: if e.action == "claim" {
                "node.claimed"
            } else {
                "node.released"
            }
            .into(),
            at_ms: e.at_ms,
            tenant: view.as_ref().map_or_else(String::new, |v| v.tenant.clone()),
            project: view.as_ref().and_then(|v| v.project.clone()),
            user: Some(e.user.clone()),
            allocation: Some(e.alloc.clone()),
            vcluster: view.map(|v| v.vcluster),
            payload,
        });
    }
    out
}

/// `POST /api/v1/admin/accounting/reconcile`: a window, as dates (`2026-03-01`, midnight UTC) or
/// RFC 3339 times.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileIn {
    pub since: String,
    pub until: String,
}

/// What a reconcile queued.
#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct Reconciled {
    pub since_ms: u64,
    pub until_ms: u64,
    /// Events generated from the allocation records and the audit log in the window.
    pub queued: u64,
    /// Of those, dropped because the buffers were full.
    pub dropped: u64,
}

/// A date (`2026-03-01`, midnight UTC) or an RFC 3339 time, in ms since the epoch.
pub fn parse_when(field: &str, t: &str) -> Result<u64, ApiError> {
    let full = if t.len() == 10 {
        format!("{t}T00:00:00Z")
    } else {
        t.to_string()
    };
    humantime::parse_rfc3339_weak(&full)
        .ok()
        .and_then(|st| st.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .ok_or_else(|| ApiError::BadRequest {
            field: field.into(),
            message: format!("`{t}`: a date (2026-03-01) or an RFC 3339 time"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse() {
        assert_eq!(parse_when("since", "1970-01-02").unwrap(), 86_400_000);
        assert_eq!(parse_when("since", "1970-01-01T00:00:01Z").unwrap(), 1_000);
        assert!(
            matches!(parse_when("until", "yesterday"), Err(ApiError::BadRequest { field, .. }) if field == "until")
        );
    }

    #[test]
    fn secret_refs() {
        assert_eq!(SecretRef::parse("env:T"), Ok(SecretRef::Env("T".into())));
        assert_eq!(SecretRef::parse("file:///run/x"), Ok(SecretRef::File("/run/x".into())));
        let e = SecretRef::parse("vault://lattice/waldur-token").unwrap_err();
        assert!(e.contains("Vault Agent"), "{e}");
        assert!(SecretRef::parse("hunter2").is_err());
        assert!(SecretRef::Env("LATTICE_NO_SUCH_VAR_9".into()).read().is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let on = |y: &str| {
            let c: AccountingConfig = yaml_serde::from_str(y).unwrap();
            c.validate()
        };
        assert!(on("enabled: false").is_ok());
        assert!(on("enabled: true").unwrap_err().contains("accounting.waldur"));
        assert!(
            on("enabled: true\nprovider: sap\n")
                .unwrap_err()
                .contains("accounting.provider")
        );
        let bad = on("enabled: true\nwaldur: {api_url: ftp://x}\n").unwrap_err();
        assert!(bad.contains("api_url"), "{bad}");
        let ok = "enabled: true\nwaldur: {api_url: 'http://w/api/', token_secret_ref: 'env:W'}\n";
        assert!(on(ok).is_ok());
    }

    fn row(state: &str, ended: Option<u64>, checkpoints: u32) -> AccountingRow {
        let v: AllocationView = serde_json::from_value(json!({
            "id": "a-000007", "tenant": "physics", "vcluster": "hpc", "user": "ana", "project": "p1",
            "state": state, "nodes": ["n1", "n2"], "requested_nodes": 2, "walltime_s": 3600.0,
            "preemption_class": 0, "submitted_ms": 0, "started_ms": 1_000, "ended_ms": ended,
            "end_reason": null, "entrypoint": null, "tags": {}, "last_rejection": null, "telemetry": "prod",
            "checkpoints": checkpoints, "last_checkpoint_ms": if checkpoints > 0 { Some(2_000) } else { None },
        }))
        .unwrap();
        AccountingRow {
            view: v,
            gpus: 8,
            gpu_type: Some("GH200".into()),
            sensitive: false,
        }
    }

    #[test]
    fn events_and_their_keys() {
        let running = events_of(&row("running", None, 0));
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].key, "a-000007/started/1000");
        assert_eq!(running[0].payload["gpus"], 8);
        let done = events_of(&row("completed", Some(3_601_000), 2));
        let kinds: Vec<&str> = done.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(
            kinds,
            ["allocation.started", "allocation.checkpointed", "allocation.completed"]
        );
        let c = &done[2];
        assert_eq!((c.key.as_str(), c.at_ms), ("a-000007/completed", 3_601_000));
        assert_eq!(c.payload["node_hours"], 2.0);
        assert_eq!(c.payload["gpu_hours"], 8.0);
        assert_eq!(c.project.as_deref(), Some("p1"));
        // The same facts give the same keys (a reconcile or a new leader regenerates them).
        assert_eq!(done, events_of(&row("completed", Some(3_601_000), 2)));
    }

    #[test]
    fn releases_wait_for_the_wipe_outcome() {
        let mut log = Vec::new();
        use lattice_engine::audit::append;
        append(&mut log, 10, "dr-x", "c1", "claim", "n1,n2");
        append(&mut log, 20, "dr-x", "c1", "release", "n1,n2");
        let evs = audit_events(&log, 0, |_| None);
        assert_eq!(evs.len(), 1, "no release before its wipe is recorded");
        assert_eq!(evs[0].event, "node.claimed");
        append(&mut log, 30, "dr-x", "c1", "quarantine", "n2");
        let evs = audit_events(&log, 0, |_| None);
        assert_eq!(evs[1].event, "node.released");
        assert_eq!(evs[1].payload["wipe"], "failed");
        assert_eq!(evs[1].user.as_deref(), Some("dr-x"));
        assert!(
            audit_events(&log, 15, |_| None)
                .iter()
                .all(|e| e.event != "node.claimed")
        );
    }
}
