//! Administration: the queue and weights, backups, the audit log, usage and accounting, tenants and
//! projects.

use super::common::*;
use crate::auth::Principal;
use crate::context::Shared;
use crate::error::{ApiError, forbidden};
use lattice_control::{AllocationView, Usage};
use std::collections::BTreeMap;

/// A vCluster's pending allocations the caller may see, in queue order.
/// A vCluster's scheduler configuration and the weights in force (the leader's, which it took from
/// the quorum).
pub async fn vcluster(s: &Shared, vcluster: &str) -> Result<serde_json::Value, ApiError> {
    readable(s).await?;
    s.control
        .lock()
        .await
        .vcluster_view(vcluster)
        .ok_or_else(|| ApiError::NotFound {
            field: "vcluster".into(),
            message: format!("vCluster \"{vcluster}\" not found"),
        })
}

pub async fn queue(s: &Shared, p: &Principal, vcluster: &str) -> Result<Vec<AllocationView>, ApiError> {
    readable(s).await?;
    let c = s.control.lock().await;
    if !c.vcluster_names().iter().any(|v| v == vcluster) {
        return Err(ApiError::NotFound {
            field: "vcluster".into(),
            message: format!("vCluster \"{vcluster}\" not found"),
        });
    }
    Ok(c.ctl
        .engine
        .queue()
        .into_iter()
        .filter_map(|i| c.view(i))
        .filter(|a| a.vcluster == vcluster && p.can_see(&a.tenant, a.user.as_deref()))
        .collect())
}

/// The nine cost weights by name (the profile's and `lattice admin vcluster set-weights`' keys).
pub const WEIGHT_NAMES: [&str; 9] = lattice_engine::CostWeights::NAMES;

/// Hot-reloads a vCluster's weights (missing ones 0); its next pass uses them.
pub async fn set_weights(s: &Shared, p: &Principal, vcluster: &str, w: &BTreeMap<String, f64>) -> Result<(), ApiError> {
    if !p.is_admin() {
        return Err(forbidden("setting weights needs SystemAdmin"));
    }
    if let Some(k) = w.keys().find(|k| !WEIGHT_NAMES.contains(&k.as_str())) {
        return Err(ApiError::BadRequest {
            // The weight's name is the field; a nameless key is named by the body's field.
            field: if k.is_empty() { "weights".into() } else { k.clone() },
            message: format!("unknown weight `{k}` (known: {})", WEIGHT_NAMES.join(", ")),
        });
    }
    if let Some((k, v)) = w.iter().find(|(_, v)| !v.is_finite() || **v < 0.0) {
        return Err(ApiError::BadRequest {
            field: k.clone(),
            message: format!("{v}: weights are >= 0"),
        });
    }
    let get = |k: &str| w.get(k).copied().unwrap_or(0.0);
    let weights = lattice_engine::CostWeights {
        priority: get("priority"),
        wait_time: get("wait_time"),
        fair_share: get("fair_share"),
        topology: get("topology"),
        data_readiness: get("data_readiness"),
        backlog: get("backlog"),
        energy: get("energy"),
        checkpoint: get("checkpoint"),
        conformance: get("conformance"),
    };
    writable(s).await?;
    let at_ms = {
        let c = s.control.lock().await;
        if !c.vcluster_names().iter().any(|v| v == vcluster) {
            return Err(ApiError::NotFound {
                field: "vcluster".into(),
                message: format!("vCluster \"{vcluster}\" not found"),
            });
        }
        c.now().0
    };
    // At the quorum first: every leader schedules with them from the commit on (a new one reads
    // them when it takes over), and a member that is not the leader changes nothing.
    let cmd = lattice_adapters::QuorumCommand::SetWeights {
        vcluster: vcluster.to_string(),
        weights,
        at_ms,
        by: p.user.clone(),
    };
    let weights = if s.bugs.weights_leader_local {
        weights
    } else {
        committed(s, cmd, vcluster).await?;
        // What the quorum holds now: a change committed after this one (its request still on its
        // way here) wins, in the order of the log, not of the handlers.
        let w = s.member.read(|q| q.weights.get(vcluster).copied()).await;
        w.unwrap_or(weights)
    };
    let r = s.control.lock().await.set_weights(vcluster, weights);
    r.map_err(|e| {
        if e.field == "vcluster" {
            ApiError::NotFound {
                field: e.field,
                message: e.message,
            }
        } else {
            bad_request(e)
        }
    })?;
    s.wake.notify_one();
    Ok(())
}

/// Creates a vCluster (`create`: it must not exist; it starts from backfill with depth 10 and the
/// default weights) or changes an existing one's configuration (the keys given; the others stay).
/// Committed at the quorum first, then applied as the quorum holds it; its view afterwards.
pub async fn put_vcluster(
    s: &Shared,
    p: &Principal,
    name: &str,
    changes: &serde_json::Map<String, serde_json::Value>,
    create: bool,
) -> Result<serde_json::Value, ApiError> {
    if !p.is_admin() {
        return Err(forbidden("configuring vClusters needs SystemAdmin"));
    }
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if !valid {
        return Err(ApiError::BadRequest {
            field: "name".into(),
            message: format!("`{name}`: 1-63 characters of letters, digits, `-`, `_` and `.`"),
        });
    }
    writable(s).await?;
    let (config, at_ms) = {
        let c = s.control.lock().await;
        let base = match (c.vcluster_config(name), create) {
            (Some(_), true) => {
                return Err(ApiError::Conflict {
                    message: format!("vCluster {name} exists"),
                });
            }
            (Some(cfg), false) => cfg,
            (None, true) => {
                let mut cfg = lattice_engine::VClusterConfig::new(lattice_engine::Policy::Backfill {
                    depth: lattice_engine::Depth::Limited(10),
                });
                cfg.weights = Some(lattice_engine::CostWeights::default());
                cfg
            }
            (None, false) => {
                return Err(ApiError::NotFound {
                    field: "vcluster".into(),
                    message: format!("vCluster \"{name}\" not found"),
                });
            }
        };
        let config = lattice_traces::apply_config(&base, changes).map_err(|e| ApiError::BadRequest {
            field: e.field,
            message: e.message,
        })?;
        (config, c.now().0)
    };
    let write = if create {
        lattice_adapters::TenantWrite::Create
    } else {
        // One the profile defines that the quorum is not seeded with yet (the seeding is under way
        // at start): seeded with the configuration in force first.
        if s.member.read(|q| !q.vclusters.contains_key(name)).await {
            let base = s.control.lock().await.vcluster_config(name);
            if let Some(config) = base {
                let seed = lattice_adapters::QuorumCommand::PutVCluster {
                    name: name.to_string(),
                    config,
                    write: lattice_adapters::TenantWrite::Seed,
                    at_ms,
                    by: "profile".into(),
                };
                committed(s, seed, name).await?;
            }
        }
        lattice_adapters::TenantWrite::Update
    };
    let cmd = lattice_adapters::QuorumCommand::PutVCluster {
        name: name.to_string(),
        config,
        write,
        at_ms,
        by: p.user.clone(),
    };
    committed(s, cmd, name).await?;
    // What the quorum holds now (a change committed after this one wins, in log order).
    let held = s.member.read(|q| q.vclusters.get(name).copied()).await;
    let mut c = s.control.lock().await;
    c.put_vcluster(name, held.unwrap_or(config)).map_err(bad_request)?;
    let view = c.vcluster_view(name).unwrap_or_default();
    drop(c);
    s.wake.notify_one();
    Ok(view)
}

/// The site settings decisions read, in force (`GET /v1/config`): seconds by key.
pub async fn settings(s: &Shared) -> Result<serde_json::Value, ApiError> {
    readable(s).await?;
    let in_force = s.control.lock().await.settings();
    Ok(serde_json::Value::Object(lattice_control::settings::settings_json(
        &in_force,
    )))
}

/// Changes site settings (`PATCH /v1/config`: the keys given; `null` removes a node kind's boot
/// timeout): checked whole, committed at the quorum, then applied as the quorum holds them; the
/// settings in force afterwards.
pub async fn put_settings(
    s: &Shared,
    p: &Principal,
    changes: &serde_json::Map<String, serde_json::Value>,
) -> Result<serde_json::Value, ApiError> {
    if !p.is_admin() {
        return Err(forbidden("changing site settings needs SystemAdmin"));
    }
    let settings = lattice_control::settings::parse_changes(changes).map_err(bad_request)?;
    writable(s).await?;
    let at_ms = s.control.lock().await.now().0;
    if s.member.read(|q| q.settings.is_empty()).await {
        // Not seeded yet (the seeding is under way at start): the settings in force first, so the
        // quorum holds every key.
        let in_force = s.control.lock().await.settings();
        let seed = lattice_adapters::QuorumCommand::PutSettings {
            settings: in_force.into_iter().map(|(k, ms)| (k, Some(ms))).collect(),
            write: lattice_adapters::TenantWrite::Seed,
            at_ms,
            by: "config".into(),
        };
        committed(s, seed, "settings").await?;
    }
    let cmd = lattice_adapters::QuorumCommand::PutSettings {
        settings,
        write: lattice_adapters::TenantWrite::Update,
        at_ms,
        by: p.user.clone(),
    };
    committed(s, cmd, "settings").await?;
    // What the quorum holds now (a change committed after this one wins, in log order).
    let held = s.member.read(|q| q.settings.clone()).await;
    let mut c = s.control.lock().await;
    c.apply_settings(&held);
    let view = lattice_control::settings::settings_json(&c.settings());
    drop(c);
    s.wake.notify_one();
    Ok(serde_json::Value::Object(view))
}

/// A backup written by this member: where, at which log index, its checksum.
pub struct BackupMade {
    pub path: std::path::PathBuf,
    pub backup: lattice_adapters::raft_store::Backup,
    /// With `services.archive`: the object it was archived as, or why it was not (the local file
    /// stands either way).
    pub archived: Option<Result<String, String>>,
}

/// Writes a backup of the applied quorum state under `DATA_DIR/backups` (`name`, or a timestamped one).
pub async fn backup(s: &Shared, p: &Principal, name: Option<&str>) -> Result<BackupMade, ApiError> {
    if !p.is_admin() {
        return Err(forbidden("backups need SystemAdmin"));
    }
    let file = match name.filter(|n| !n.is_empty()) {
        Some(n) if n.contains('/') || n.contains("..") => {
            return Err(ApiError::BadRequest {
                field: "name".into(),
                message: format!("`{n}`: a plain file name (written under the backup directory)"),
            });
        }
        Some(n) => format!("{}.json", n.trim_end_matches(".json")),
        None => format!("backup-{:013}.json", lattice_control::wall_now().0),
    };
    let path = s.data_dir.join("backups").join(file);
    match s.member.backup(&path).await {
        Ok(backup) => {
            let archived = match &s.archive {
                Some(a) => Some(a.archive_backup(&path).await),
                None => None,
            };
            Ok(BackupMade { path, backup, archived })
        }
        Err(e) => Err(ApiError::BadRequest {
            field: "name".into(),
            message: e,
        }),
    }
}

/// `GET /api/v1/tenants/{id}/usage?days=N` and `GET /api/v1/usage?user=U&days=N`.
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    pub tenant: Option<String>,
    pub user: Option<String>,
    /// The window: the last `days` (default 90), or from `since` (`YYYY-MM-DD` or ms since the epoch)
    /// to `until` (default now).
    pub days: Option<u32>,
    pub since: Option<String>,
    pub until: Option<String>,
}

/// Usage over the last `days` (default 90, the book's budget period): a tenant's for its TenantAdmin,
/// a user's for that user, anything for SystemAdmin, Operator and ReadOnly.
pub async fn usage(s: &Shared, p: &Principal, q: &UsageQuery) -> Result<Usage, ApiError> {
    let w = usage_window(s, p, q).await?;
    let c = s.control.lock().await;
    Ok(c.usage(w.tenant.as_deref(), w.user.as_deref(), w.since, w.until))
}

/// `GET /v1/accounting` (`lattice history`, sacct's equivalent): each allocation's usage record in
/// the window, and the totals — under [`usage`]'s permissions.
pub async fn accounting(
    s: &Shared,
    p: &Principal,
    q: &UsageQuery,
) -> Result<(Usage, Vec<lattice_control::UsageRecord>), ApiError> {
    let w = usage_window(s, p, q).await?;
    let c = s.control.lock().await;
    let (t, u) = (w.tenant.as_deref(), w.user.as_deref());
    Ok((c.usage(t, u, w.since, w.until), c.usage_records(t, u, w.since, w.until)))
}

pub(super) struct Window {
    tenant: Option<String>,
    user: Option<String>,
    since: lattice_engine::Time,
    until: lattice_engine::Time,
}

/// The filters and window of a usage query, once the caller may see them.
pub(super) async fn usage_window(s: &Shared, p: &Principal, q: &UsageQuery) -> Result<Window, ApiError> {
    let days = q.days.unwrap_or(90);
    if days == 0 || days > 3660 {
        return Err(ApiError::BadRequest {
            field: "days".into(),
            message: format!("{days}: between 1 and 3660"),
        });
    }
    let tenant = q.tenant.as_deref().filter(|t| !t.is_empty());
    let user = q.user.as_deref().filter(|u| !u.is_empty());
    use crate::auth::Role;
    let wide = p.is_admin() || p.has(Role::Operator) || p.has(Role::ReadOnly);
    // Neither named: the caller's own usage (a wide caller's: everyone's).
    let user = user.or_else(|| (tenant.is_none() && !wide).then_some(p.user.as_str()));
    let own_tenant = tenant.is_some() && tenant == p.tenant.as_deref() && p.has(Role::TenantAdmin);
    let own_user = user == Some(p.user.as_str()) && tenant.is_none_or(|t| Some(t) == p.tenant.as_deref());
    if !(wide || own_tenant || own_user) {
        return Err(forbidden("usage of other tenants or users"));
    }
    let instant = |f: &str, v: &Option<String>| {
        v.as_deref()
            .filter(|v| !v.is_empty())
            .map(|v| parse_instant(f, v).map(lattice_engine::Time))
            .transpose()
    };
    let (from, to) = (instant("since", &q.since)?, instant("until", &q.until)?);
    let until = match to {
        Some(t) => t,
        None => s.control.lock().await.now(),
    };
    let since = from.unwrap_or(lattice_engine::Time(until.0.saturating_sub(days as u64 * 86_400_000)));
    if since >= until {
        return Err(ApiError::BadRequest {
            field: "since".into(),
            message: "the window is empty: `since` must come before `until`".into(),
        });
    }
    Ok(Window {
        tenant: tenant.map(str::to_string),
        user: user.map(str::to_string),
        since,
        until,
    })
}

/// A tenant's quota fields in a request (`POST /api/v1/tenants`, `PUT /api/v1/tenants/{id}`): the
/// seed's keys; on an update only the keys given change, `null` clears one.
pub const TENANT_KEYS: [&str; 8] = [
    "max_nodes",
    "max_concurrent_allocations",
    "gpu_hours_budget",
    "node_hours_budget",
    "fair_share_target",
    "burst_allowance",
    "deserved_nodes",
    "over_quota_weight",
];

/// `quota` with the request's fields applied; a bad field is named.
pub fn tenant_fields(
    mut quota: lattice_engine::TenantQuota,
    body: &serde_json::Map<String, serde_json::Value>,
    skip: &[&str],
) -> Result<lattice_engine::TenantQuota, ApiError> {
    let bad = |k: &str, m: String| ApiError::BadRequest {
        field: k.to_string(),
        message: m,
    };
    for (k, v) in body {
        if skip.contains(&k.as_str()) {
            continue;
        }
        if !TENANT_KEYS.contains(&k.as_str()) {
            return Err(bad(
                k,
                format!("unknown field `{k}` (known: {})", TENANT_KEYS.join(", ")),
            ));
        }
        let count = |v: &serde_json::Value| -> Result<Option<u32>, ApiError> {
            match v {
                serde_json::Value::Null => Ok(None),
                v => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n <= 1_000_000)
                    .map(Some)
                    .ok_or_else(|| bad(k, format!("{v}: a whole number from 0 to 1000000"))),
            }
        };
        let real = |v: &serde_json::Value, lo: f64, hi: f64| -> Result<Option<f64>, ApiError> {
            match v {
                serde_json::Value::Null => Ok(None),
                v => v
                    .as_f64()
                    .filter(|x| x.is_finite() && *x >= lo && *x <= hi)
                    .map(Some)
                    .ok_or_else(|| bad(k, format!("{v}: a number from {lo} to {hi}"))),
            }
        };
        match k.as_str() {
            "max_nodes" => quota.max_nodes = count(v)?,
            "max_concurrent_allocations" => quota.max_concurrent_allocations = count(v)?,
            "gpu_hours_budget" => quota.gpu_hours_budget = real(v, 0.0, 1e12)?,
            "node_hours_budget" => quota.node_hours_budget = real(v, 0.0, 1e12)?,
            "fair_share_target" => quota.fair_share_target = real(v, 0.0, 1.0)?,
            "burst_allowance" => quota.burst_allowance = real(v, 1.0, 100.0)?,
            "deserved_nodes" => quota.deserved_nodes = real(v, 0.0, 1e6)?,
            _ => quota.over_quota_weight = real(v, 0.0, 1e6)?,
        }
    }
    Ok(quota)
}

/// A project's quota fields in a request: the tenant keys that apply to a project.
pub const PROJECT_KEYS: [&str; 4] = [
    "max_nodes",
    "max_concurrent_allocations",
    "gpu_hours_budget",
    "node_hours_budget",
];

/// `quota` with the request's fields applied (as [`tenant_fields`], over [`PROJECT_KEYS`]).
pub fn project_fields(
    quota: lattice_engine::ProjectQuota,
    body: &serde_json::Map<String, serde_json::Value>,
    skip: &[&str],
) -> Result<lattice_engine::ProjectQuota, ApiError> {
    if let Some(k) = body
        .keys()
        .find(|k| !skip.contains(&k.as_str()) && !PROJECT_KEYS.contains(&k.as_str()))
    {
        return Err(ApiError::BadRequest {
            field: k.clone(),
            message: format!("unknown field `{k}` for a project (known: {})", PROJECT_KEYS.join(", ")),
        });
    }
    let as_tenant = lattice_engine::TenantQuota {
        max_nodes: quota.max_nodes,
        max_concurrent_allocations: quota.max_concurrent_allocations,
        gpu_hours_budget: quota.gpu_hours_budget,
        node_hours_budget: quota.node_hours_budget,
        ..Default::default()
    };
    let t = tenant_fields(as_tenant, body, skip)?;
    Ok(lattice_engine::ProjectQuota {
        max_nodes: t.max_nodes,
        max_concurrent_allocations: t.max_concurrent_allocations,
        gpu_hours_budget: t.gpu_hours_budget,
        node_hours_budget: t.node_hours_budget,
    })
}

/// A valid tenant (or project) name: lowercase letters, digits, `-` and `_`, 1 to 63 characters.
pub(super) fn valid_tenant_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// SystemAdmin only, on the leader; a new tenant's or project's name is valid.
pub(super) async fn may_write_contract(
    s: &Shared,
    p: &Principal,
    what: &str,
    name: &str,
    create: bool,
) -> Result<(), ApiError> {
    if !p.is_admin() {
        return Err(forbidden(&format!("{what} administration (SystemAdmin)")));
    }
    writable(s).await?;
    if create && !valid_tenant_name(name) {
        return Err(ApiError::BadRequest {
            field: "name".into(),
            message: format!("`{name}`: lowercase letters, digits, - and _, at most 63"),
        });
    }
    Ok(())
}

/// The warning of a write whose new `max_nodes` is below what the view says `who` holds.
pub(super) fn over_limit(who: &str, view: &serde_json::Value, max_nodes: Option<u32>) -> Option<String> {
    let held = view["nodes_held"].as_u64().unwrap_or(0);
    max_nodes.filter(|m| held > u64::from(*m)).map(|m| {
        format!(
            "{who} holds {held} nodes, above its new limit of {m}: its running allocations go on; new ones wait until it is under"
        )
    })
}

/// What a tenant write did: the tenant's view, and a warning when its new `max_nodes` is below what
/// it holds.
pub struct TenantWritten {
    pub view: serde_json::Value,
    pub warning: Option<String>,
}

/// Creates (`create`) or updates a tenant through the quorum (SystemAdmin): committed first, then the
/// engine uses it from its next pass. Hard quotas below current use are accepted: running work goes
/// on, new work for the tenant waits until it is under (the book's update flow).
pub async fn put_tenant(
    s: &Shared,
    p: &Principal,
    name: &str,
    body: &serde_json::Map<String, serde_json::Value>,
    create: bool,
) -> Result<TenantWritten, ApiError> {
    may_write_contract(s, p, "tenant", name, create).await?;
    let current = s.member.read(|q| q.tenants.get(name).copied()).await;
    let base = match (create, current) {
        (true, _) => lattice_engine::TenantQuota::default(),
        (false, Some(q)) => q,
        // Known from the tenants file of a member that has not seeded the quorum yet, or only from
        // its allocations: updating it registers it.
        (false, None) => {
            if !s.control.lock().await.tenant_names().iter().any(|t| t == name) {
                return Err(not_found("tenant", name));
            }
            lattice_engine::TenantQuota::default()
        }
    };
    let quota = tenant_fields(base, body, &["name"])?;
    let write = match (create, current) {
        (true, _) => lattice_adapters::TenantWrite::Create,
        (false, Some(_)) => lattice_adapters::TenantWrite::Update,
        (false, None) => lattice_adapters::TenantWrite::Seed,
    };
    let at_ms = s.control.lock().await.now().0;
    let cmd = lattice_adapters::QuorumCommand::PutTenant {
        name: name.to_string(),
        quota,
        write,
        at_ms,
        by: p.user.clone(),
    };
    committed(s, cmd, name).await?;
    let mut c = s.control.lock().await;
    c.set_tenant(name, quota);
    let view = c.tenant_view(name).unwrap_or_default();
    let warning = over_limit(&format!("tenant {name}"), &view, quota.max_nodes);
    Ok(TenantWritten { view, warning })
}

/// Creates (`create`) or updates a tenant's project through the quorum (SystemAdmin), as a tenant
/// ([`put_tenant`]): its hard limits apply with the tenant's from the next pass, and a limit below
/// the project's current use lets running work go on.
pub async fn put_project(
    s: &Shared,
    p: &Principal,
    tenant: &str,
    name: &str,
    body: &serde_json::Map<String, serde_json::Value>,
    create: bool,
) -> Result<TenantWritten, ApiError> {
    may_write_contract(s, p, "project", name, create).await?;
    let (known, current) = s
        .member
        .read(|q| (q.tenants.contains_key(tenant), q.project_quota(tenant, name)))
        .await;
    if !known {
        return Err(not_found("tenant", tenant));
    }
    let base = match (create, current) {
        (false, None) => return Err(not_found("project", &format!("{tenant}/{name}"))),
        (true, _) => lattice_engine::ProjectQuota::default(),
        (false, Some(q)) => q,
    };
    let quota = project_fields(base, body, &["name"])?;
    let at_ms = s.control.lock().await.now().0;
    let cmd = lattice_adapters::QuorumCommand::PutProject {
        tenant: tenant.to_string(),
        name: name.to_string(),
        quota,
        write: if create {
            lattice_adapters::TenantWrite::Create
        } else {
            lattice_adapters::TenantWrite::Update
        },
        at_ms,
        by: p.user.clone(),
    };
    committed(s, cmd, &format!("{tenant}/{name}")).await?;
    let mut c = s.control.lock().await;
    c.set_project(tenant, name, quota);
    let view = c.project_view(tenant, name).unwrap_or_default();
    let warning = over_limit(&format!("project {tenant}/{name}"), &view, quota.max_nodes);
    Ok(TenantWritten { view, warning })
}

/// Deletes a tenant's project with nothing queued or running (SystemAdmin), through the quorum.
pub async fn delete_project(s: &Shared, p: &Principal, tenant: &str, name: &str) -> Result<(), ApiError> {
    if !p.is_admin() {
        return Err(forbidden("project administration (SystemAdmin)"));
    }
    writable(s).await?;
    let what = format!("{tenant}/{name}");
    if s.member.read(|q| q.project_quota(tenant, name).is_none()).await {
        return Err(not_found("project", &what));
    }
    let live = s.control.lock().await.project_live_allocations(tenant, name);
    if live > 0 {
        return Err(ApiError::Conflict {
            message: format!("project {what} has {live} allocation(s) queued or running; delete it once they end"),
        });
    }
    let at_ms = s.control.lock().await.now().0;
    let cmd = lattice_adapters::QuorumCommand::DeleteProject {
        tenant: tenant.to_string(),
        name: name.to_string(),
        at_ms,
        by: p.user.clone(),
    };
    committed(s, cmd, &what).await?;
    s.control.lock().await.remove_project(tenant, name);
    Ok(())
}

/// Deletes a tenant with nothing queued or running (SystemAdmin), through the quorum.
pub async fn delete_tenant(s: &Shared, p: &Principal, name: &str) -> Result<(), ApiError> {
    if !p.is_admin() {
        return Err(forbidden("tenant administration (SystemAdmin)"));
    }
    writable(s).await?;
    if s.member.read(|q| !q.tenants.contains_key(name)).await {
        return Err(not_found("tenant", name));
    }
    let live = s.control.lock().await.tenant_live_allocations(name);
    if live > 0 {
        return Err(ApiError::Conflict {
            message: format!("tenant {name} has {live} allocation(s) queued or running; delete it once they end"),
        });
    }
    let at_ms = s.control.lock().await.now().0;
    let cmd = lattice_adapters::QuorumCommand::DeleteTenant {
        name: name.to_string(),
        at_ms,
        by: p.user.clone(),
    };
    committed(s, cmd, name).await?;
    s.control.lock().await.remove_tenant(name);
    Ok(())
}
