//! Health, metrics and administration: tenants and projects, vClusters and weights, usage,
//! accounting, the audit log, backups, restores and quorum members.

use super::common::*;
use crate::context::Shared;
use crate::ops;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(super) async fn healthz(State(s): S) -> Json<Value> {
    let st = s.member.status();
    Json(json!({"status": "ok", "raft_state": st.state, "leader": st.leader, "term": st.term}))
}

pub(super) async fn metrics(State(s): S) -> Response {
    use crate::metrics::set_all;
    let m = &s.metrics;
    {
        let mut c = s.control.lock().await;
        m.add(&c.take_tally());
        let mut allocs: BTreeMap<String, f64> = BTreeMap::new();
        let mut tenants: BTreeMap<(String, String), f64> = BTreeMap::new();
        let mut queued: BTreeMap<String, f64> = c.vcluster_names().into_iter().map(|v| (v, 0.0)).collect();
        let mut used: BTreeMap<String, f64> = BTreeMap::new();
        for a in c.list() {
            *allocs.entry(a.state.clone()).or_default() += 1.0;
            if a.ended_ms.is_none() {
                *tenants.entry((a.tenant.clone(), a.state.clone())).or_default() += 1.0;
            }
            match a.state.as_str() {
                "pending" | "staging" => *queued.entry(a.vcluster.clone()).or_default() += 1.0,
                "running" => *used.entry(a.tenant.clone()).or_default() += a.nodes.len() as f64,
                _ => {}
            }
        }
        m.allocations_active
            .set(allocs.get("running").copied().unwrap_or(0.0) as i64);
        set_all(&m.allocations, allocs.iter().map(|(k, v)| (vec![k.as_str()], *v)));
        set_all(
            &m.tenant_allocations,
            tenants.iter().map(|((t, st), v)| (vec![t.as_str(), st.as_str()], *v)),
        );
        set_all(&m.queue_depth, queued.iter().map(|(k, v)| (vec![k.as_str()], *v)));
        let mut nodes: BTreeMap<String, f64> = BTreeMap::new();
        for n in c.nodes() {
            *nodes.entry(n.state).or_default() += 1.0;
        }
        set_all(&m.nodes, nodes.iter().map(|(k, v)| (vec![k.as_str()], *v)));
        let heard = c.last_heard();
        let names: Vec<String> = heard.iter().map(|(n, _)| n.clone()).collect();
        m.known(&c.vcluster_names(), &names, &s.member.id.to_string());
        set_all(
            &m.last_heartbeat,
            heard.iter().map(|(n, at)| (vec![n.as_str()], *at as f64 / 1000.0)),
        );
        let quotas = c.node_quotas();
        set_all(
            &m.quota_max,
            quotas.iter().map(|(t, q)| (vec![t.as_str()], f64::from(*q))),
        );
        set_all(
            &m.quota_used,
            quotas
                .iter()
                .map(|(t, _)| (vec![t.as_str()], used.get(t).copied().unwrap_or(0.0))),
        );
        let (_, (vni_total, vni_used)) = c.network_views();
        m.vni_total.set(vni_total as i64);
        m.vni_available.set(vni_total.saturating_sub(vni_used) as i64);
        m.checkpoint_storage_unavailable
            .set(i64::from(!c.checkpoint_storage_available()));
        m.node_capability_mismatch.set(c.capability_mismatches() as i64);
    }
    let member = s.member.id.to_string();
    let member = member.as_str();
    let st = s.member.status();
    m.raft_term.set(st.term as i64);
    m.raft_leader
        .with_label_values(&[member])
        .set(i64::from(s.member.is_leader()));
    let (entries, snapshot_bytes, built) = s.member.log_stats();
    m.raft_log_entries.with_label_values(&[member]).set(entries as i64);
    m.raft_snapshot_size
        .with_label_values(&[member])
        .set(snapshot_bytes as f64);
    for b in built {
        m.snapshot_duration.with_label_values(&[member]).observe(b);
    }
    if let Some((used, total)) = crate::metrics::disk_usage(&s.data_dir) {
        m.raft_disk_used.with_label_values(&[member]).set(used);
        m.raft_disk_total.with_label_values(&[member]).set(total);
    }
    if let Some(a) = &s.accounting {
        let st = a.status();
        m.accounting_buffered.set(st.buffered as i64);
        m.accounting_on_disk.set(st.on_disk as i64);
        m.accounting_dropped
            .inc_by(st.dropped_total.saturating_sub(m.accounting_dropped.get()));
        m.accounting_delivered
            .inc_by(st.delivered_total.saturating_sub(m.accounting_delivered.get()));
    }
    if let Some(entries) = s.member.try_read(|q| q.audit_total()) {
        let seen = m.audit_entries.get();
        m.audit_entries.inc_by(entries.saturating_sub(seen));
    }
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
        .into_response()
}

/// `GET /api/v1/auth/discovery` (public).
pub(super) async fn auth_discovery(State(s): S) -> Json<Value> {
    Json(s.auth.discovery())
}

/// `GET /v1/audit/export`: a signed bundle of the entries the query selects.
pub(super) async fn audit_export(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::AuditQuery>) -> Response {
    match ops::audit_export(&s, &p, &q).await {
        Ok(b) => Json(b).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn audit_logs(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::AuditQuery>) -> Response {
    match ops::audit(&s, &p, &q).await {
        Ok((entries, valid)) => Json(json!({"entries": entries, "chain_valid": valid})).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DaysIn {
    /// The last N days (default 90)…
    days: Option<u32>,
    /// …or from this instant (`YYYY-MM-DD` or ms since the epoch)…
    since: Option<String>,
    /// …to this one (default: now).
    until: Option<String>,
}

pub(super) async fn tenant_usage(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<DaysIn>,
) -> Response {
    let q = ops::UsageQuery {
        tenant: Some(id),
        user: None,
        days: q.days,
        since: q.since,
        until: q.until,
    };
    match ops::usage(&s, &p, &q).await {
        Ok(u) => Json(u).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn usage(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::UsageQuery>) -> Response {
    match ops::usage(&s, &p, &q).await {
        Ok(u) => Json(u).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn accounting(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::UsageQuery>) -> Response {
    match ops::accounting(&s, &p, &q).await {
        Ok((total, records)) => Json(json!({"total": total, "records": records})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn tenants(State(s): S) -> Json<Value> {
    Json(json!({ "tenants": s.control.lock().await.tenant_names() }))
}

/// `GET /v1/tenants/{id}`: for its own members, operators, read-only callers and administrators.
pub(super) async fn tenant(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    answer(ops::tenant_document(&s, &p, &id).await)
}

/// A tenant's quotas in a request (documentation of the accepted keys; the handlers read the body as
/// a map so that a key given as `null` clears it and a key left out is kept).
#[derive(Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
pub(super) struct TenantIn {
    /// `POST` only: the tenant's name (lowercase letters, digits, - and _).
    name: Option<String>,
    /// Hard: nodes held at once (quorum-enforced).
    max_nodes: Option<u32>,
    /// Hard: running allocations at once.
    max_concurrent_allocations: Option<u32>,
    /// Soft: GPU-hours per budget period.
    gpu_hours_budget: Option<f64>,
    /// Soft: node-hours per budget period.
    node_hours_budget: Option<f64>,
    /// Soft: target share of the system (0-1).
    fair_share_target: Option<f64>,
    /// Soft: multiple of its share it may hold while others wait (>= 1).
    burst_allowance: Option<f64>,
    /// KAI-style deserved quota (nodes).
    deserved_nodes: Option<f64>,
    /// KAI over-quota weight.
    over_quota_weight: Option<f64>,
}

/// A project's quotas in a request (as [`TenantIn`]; a project has hard limits and budgets only).
#[derive(Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
pub(super) struct ProjectIn {
    /// `POST` only: the project's name (lowercase letters, digits, - and _).
    name: Option<String>,
    /// Hard: nodes the project holds at once (with the tenant's limit).
    max_nodes: Option<u32>,
    /// Hard: running allocations of the project at once.
    max_concurrent_allocations: Option<u32>,
    /// Soft: GPU-hours per budget period.
    gpu_hours_budget: Option<f64>,
    /// Soft: node-hours per budget period.
    node_hours_budget: Option<f64>,
}

pub(super) fn tenant_written(status: StatusCode, w: ops::TenantWritten) -> Response {
    let mut v = w.view;
    if let Some(warning) = w.warning {
        v["warning"] = json!(warning);
    }
    (status, Json(v)).into_response()
}

pub(super) async fn create_tenant(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let Some(name) = m.get("name").and_then(Value::as_str).map(str::to_string) else {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a tenant needs a `name`");
    };
    match ops::put_tenant(&s, &p, &name, &m, true).await {
        Ok(w) => tenant_written(StatusCode::CREATED, w),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn update_tenant(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if m.contains_key("name") {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a tenant is not renamed");
    }
    match ops::put_tenant(&s, &p, &id, &m, false).await {
        Ok(w) => tenant_written(StatusCode::OK, w),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn delete_tenant(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::delete_tenant(&s, &p, &id).await {
        Ok(()) => Json(json!({"name": id, "deleted": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /api/v1/tenants/{id}/projects`.
pub(super) async fn projects(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    answer(ops::projects_document(&s, &p, &id).await)
}

/// `GET /api/v1/tenants/{id}/projects/{project}`.
pub(super) async fn project(State(s): S, Extension(p): P, Path((id, project)): Path<(String, String)>) -> Response {
    answer(ops::project_document(&s, &p, &id, &project).await)
}

pub(super) async fn create_project(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let Some(name) = m.get("name").and_then(Value::as_str).map(str::to_string) else {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a project needs a `name`");
    };
    match ops::put_project(&s, &p, &id, &name, &m, true).await {
        Ok(w) => tenant_written(StatusCode::CREATED, w),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn update_project(
    State(s): S,
    Extension(p): P,
    Path((id, project)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if m.contains_key("name") {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a project is not renamed");
    }
    match ops::put_project(&s, &p, &id, &project, &m, false).await {
        Ok(w) => tenant_written(StatusCode::OK, w),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn delete_project(
    State(s): S,
    Extension(p): P,
    Path((id, project)): Path<(String, String)>,
) -> Response {
    match ops::delete_project(&s, &p, &id, &project).await {
        Ok(()) => Json(json!({"tenant": id, "name": project, "deleted": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /api/v1/admin/log` (SystemAdmin, Operator, ReadOnly).
pub(super) async fn admin_log(State(s): S, Extension(p): P) -> Response {
    answer(ops::admin_log(&s, &p).await)
}

pub(super) async fn accounting_status(State(s): S, Extension(p): P) -> Response {
    match crate::accounting::service::status(&s, &p).await {
        Ok(st) => Json(st).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn accounting_reconcile(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let w: crate::accounting::ReconcileIn = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return body_error(e),
    };
    match crate::accounting::service::reconcile_window(&s, &p, &w).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn vclusters(State(s): S) -> Json<Value> {
    Json(json!({ "vclusters": s.control.lock().await.vcluster_names() }))
}

pub(super) async fn vcluster(State(s): S, Path(id): Path<String>) -> Response {
    match ops::vcluster(&s, &id).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `lattice admin vcluster create`: `{"name": N, ...configuration keys}`.
pub(super) async fn create_vcluster(
    State(s): S,
    Extension(p): P,
    JsonIn(mut body): JsonIn<serde_json::Map<String, Value>>,
) -> Response {
    let name = match body.remove("name") {
        Some(Value::String(n)) => n,
        other => {
            return ops::ApiError::BadRequest {
                field: "name".into(),
                message: format!("expected the vCluster's name, got {}", other.unwrap_or(Value::Null)),
            }
            .into_response();
        }
    };
    match ops::put_vcluster(&s, &p, &name, &body, true).await {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `lattice admin vcluster set-config`: the configuration keys to change.
pub(super) async fn configure_vcluster(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    JsonIn(body): JsonIn<serde_json::Map<String, Value>>,
) -> Response {
    match ops::put_vcluster(&s, &p, &id, &body, false).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `lattice admin config get agents.KEY`: the site settings in force.
pub(super) async fn settings(State(s): S) -> Response {
    match ops::settings(&s).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `lattice admin config set agents.KEY=VALUE`: the settings to change.
pub(super) async fn put_settings(
    State(s): S,
    Extension(p): P,
    JsonIn(body): JsonIn<serde_json::Map<String, Value>>,
) -> Response {
    match ops::put_settings(&s, &p, &body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn queue(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::queue(&s, &p, &id).await {
        Ok(q) => Json(json!({ "vcluster": id, "queue": q })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `lattice admin vcluster set-weights`: the nine weights (missing ones 0); next cycle uses them.
pub(super) async fn set_weights(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    JsonIn(w): JsonIn<BTreeMap<String, f64>>,
) -> Response {
    match ops::set_weights(&s, &p, &id, &w).await {
        Ok(()) => Json(json!({"vcluster": id, "weights": w})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The newest backup file in `DATA_DIR/backups`.
pub(super) fn latest_backup(s: &Shared) -> Option<std::path::PathBuf> {
    let dir = s.data_dir.join("backups");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files.pop()
}

pub(super) async fn backup(State(s): S, Extension(p): P) -> Response {
    match ops::backup(&s, &p, None).await {
        Ok(b) => Json(json!({
            "path": b.path.display().to_string(),
            "sha256": b.backup.sha256,
            "last_applied": b.backup.data.last_applied.map(|l| l.index),
            "assignments": b.backup.data.state.assignments.len(),
            "audit_entries": b.backup.data.state.audit_total(),
            "archived": b.archived.as_ref().and_then(|a| a.as_ref().ok()),
            "archive_error": b.archived.as_ref().and_then(|a| a.as_ref().err()),
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
pub(super) struct PathQuery {
    path: Option<String>,
}

pub(super) async fn verify_backup(State(s): S, Extension(p): P, QueryIn(q): QueryIn<PathQuery>) -> Response {
    if !p.is_admin() {
        return forbidden("backups need SystemAdmin");
    }
    let Some(path) = q.path.map(std::path::PathBuf::from).or_else(|| latest_backup(&s)) else {
        return error(StatusCode::NOT_FOUND, Some("path"), "no backup yet");
    };
    match lattice_adapters::raft_store::Backup::read_verified(&path) {
        Ok(b) => Json(json!({"path": path.display().to_string(), "valid": true, "sha256": b.sha256})).into_response(),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"path": path.display().to_string(), "valid": false, "error": e})),
        )
            .into_response(),
    }
}

/// Stages a verified backup; it is installed when the member restarts ("requires restart").
pub(super) async fn restore(State(s): S, Extension(p): P, JsonIn(q): JsonIn<PathQuery>) -> Response {
    answer(ops::restore(&s, &p, q.path.as_deref()).await)
}

#[derive(Deserialize, schemars::JsonSchema)]
pub(super) struct MemberIn {
    id: u64,
    addr: String,
}

pub(super) async fn add_member(State(s): S, Extension(p): P, JsonIn(m): JsonIn<MemberIn>) -> Response {
    answer(ops::add_member(&s, &p, m.id, &m.addr).await)
}

pub(super) async fn remove_member(State(s): S, Extension(p): P, PathIn(id): PathIn<u64>) -> Response {
    answer(ops::remove_member(&s, &p, id).await)
}

pub(super) async fn raft_status(State(s): S) -> Json<Value> {
    let st = s.member.status();
    let q = s.member.state().await;
    Json(json!({
        "status": st,
        "assignments": q.assignments.len(),
        "commits": q.commits,
        "rejections": q.rejections,
        "audit_entries": q.audit_total(),
        "audit_held": q.audit.len(),
        "audit_archived_objects": q.audit_archive.len(),
        "audit_chain_valid": q.verify_audit().is_ok(),
        "owners": q.owners.len(),
        // This member's own applied state, digested: equal on members that applied the same log.
        "state_sha256": serde_json::to_vec(&q).map(|b| lattice_adapters::snapshots::sha256_hex(&b)).unwrap_or_default(),
    }))
}
