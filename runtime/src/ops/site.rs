//! The rest of the API's documents, for REST and gRPC alike: a tenant's and a project's quotas and
//! usage, the administrative log, staging a restore, quorum membership, a DAG's graph, agents' work
//! polls and exits, and deleting a session.

use super::allocations::{cancel, checkpoint, session};
use super::common::leader_only;
use super::dags::dag;
use super::nodes::{agent_exit, node, node_op, work};
use crate::auth::{Principal, Role};
use crate::context::Shared;
use crate::error::{ApiError, forbidden};
use lattice_adapters::logstore::Stream;
use lattice_agent_protocol::{ExitReport, WorkPoll};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Who may read a tenant's quotas and usage: its members, operators, read-only callers, administrators.
pub fn may_read_tenant(p: &Principal, tenant: &str) -> Result<(), ApiError> {
    let wide = p.can_operate() || p.has(Role::ReadOnly);
    if !wide && p.tenant.as_deref() != Some(tenant) {
        return Err(forbidden("another tenant's quotas and usage"));
    }
    Ok(())
}

/// A tenant's quotas, holdings and projects.
pub async fn tenant_document(s: &Shared, p: &Principal, id: &str) -> Result<Value, ApiError> {
    may_read_tenant(p, id)?;
    s.control
        .lock()
        .await
        .tenant_view(id)
        .ok_or_else(|| ApiError::NotFound {
            field: "id".into(),
            message: format!("no tenant {id}"),
        })
}

/// A tenant's projects.
pub async fn projects_document(s: &Shared, p: &Principal, id: &str) -> Result<Value, ApiError> {
    let v = tenant_document(s, p, id).await?;
    Ok(json!({ "tenant": id, "projects": v["projects"] }))
}

/// One project's quotas and holdings.
pub async fn project_document(s: &Shared, p: &Principal, id: &str, project: &str) -> Result<Value, ApiError> {
    may_read_tenant(p, id)?;
    s.control
        .lock()
        .await
        .project_view(id, project)
        .ok_or_else(|| ApiError::NotFound {
            field: "project".into(),
            message: format!("no project {id}/{project}"),
        })
}

/// The administrative log (SystemAdmin, Operator, ReadOnly).
pub async fn admin_log(s: &Shared, p: &Principal) -> Result<Value, ApiError> {
    if !(p.can_operate() || p.has(Role::ReadOnly)) {
        return Err(forbidden("the administrative log"));
    }
    let entries = s.member.read(|q| q.admin_log.clone()).await;
    Ok(json!({ "entries": entries }))
}

/// Stages a verified backup (SystemAdmin); it is installed when the member restarts.
pub async fn restore(s: &Shared, p: &Principal, path: Option<&str>) -> Result<Value, ApiError> {
    if !p.is_admin() {
        return Err(forbidden("restores need SystemAdmin"));
    }
    let bad = |message: String| ApiError::BadRequest {
        field: "path".into(),
        message,
    };
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return Err(bad("which backup? {\"path\": ...}".into()));
    };
    lattice_adapters::raft_store::Backup::read_verified(std::path::Path::new(path)).map_err(bad)?;
    let staged = s.data_dir.join(crate::context::RESTORE_PENDING);
    std::fs::copy(path, &staged).map_err(|e| ApiError::Unavailable {
        message: format!("could not stage {path} at {}: {e}", staged.display()),
    })?;
    Ok(json!({"staged": staged.display().to_string(), "restart_required": true}))
}

/// Adds a quorum member (SystemAdmin, on the leader): the members afterwards.
pub async fn add_member(s: &Shared, p: &Principal, id: u64, addr: &str) -> Result<Value, ApiError> {
    membership(s, p)?;
    s.member
        .add_member(id, addr)
        .await
        .map_err(|e| ApiError::Conflict { message: e.to_string() })?;
    Ok(json!({"members": s.member.status().members}))
}

/// Removes a quorum member (SystemAdmin, on the leader): the members afterwards.
pub async fn remove_member(s: &Shared, p: &Principal, id: u64) -> Result<Value, ApiError> {
    membership(s, p)?;
    s.member
        .remove_member(id)
        .await
        .map_err(|e| ApiError::Conflict { message: e.to_string() })?;
    Ok(json!({"members": s.member.status().members}))
}

fn membership(s: &Shared, p: &Principal) -> Result<(), ApiError> {
    if !p.is_admin() {
        return Err(forbidden("membership changes need SystemAdmin"));
    }
    leader_only(s)
}

/// `lattice node drain NODE --urgent`: drains the node, then asks the allocation on it to checkpoint
/// now (the book: "Drain with checkpoint trigger") — the node's state afterwards, and what was asked
/// or why it could not be (an allocation that takes no checkpoints).
pub async fn drain_urgent(s: &Arc<Shared>, p: &Principal, id: &str) -> Result<Value, ApiError> {
    let state = node_op(s, p, id, lattice_control::NodeOp::Drain).await?;
    let owner = node(s, id).await?.owner;
    let mut checkpointed = Vec::new();
    let mut refused = serde_json::Map::new();
    if let Some(alloc) = owner {
        match checkpoint(s, p, &alloc).await {
            Ok(_) => checkpointed.push(alloc),
            Err(e) => {
                refused.insert(alloc, Value::String(e.message()));
            }
        }
    }
    Ok(json!({"node": id, "state": state, "checkpointed": checkpointed, "not_checkpointed": refused}))
}

/// A DAG's members (name, id, state) and one edge per dependency between two members, from the
/// upstream to the dependent with its condition.
pub async fn dag_graph(s: &Shared, p: &Principal, id: &str) -> Result<Value, ApiError> {
    let (state, members) = dag(s, p, id).await?;
    let name_of: BTreeMap<&str, &str> = members.iter().map(|(n, v)| (v.id.as_str(), n.as_str())).collect();
    let nodes: Vec<Value> = members
        .iter()
        .map(|(name, v)| json!({"name": name, "id": v.id, "state": v.state}))
        .collect();
    let mut edges = Vec::new();
    for (name, v) in &members {
        for d in &v.depends_on {
            if let Some(from) = name_of.get(d.reference.as_str()) {
                edges.push(json!({"from": from, "to": name, "condition": d.condition}));
            }
        }
    }
    Ok(json!({"id": id, "state": state, "allocations": nodes, "edges": edges}))
}

/// Ends a session (its allocation): the state it reached.
pub async fn delete_session(s: &Arc<Shared>, p: &Principal, id: &str) -> Result<Value, ApiError> {
    session(s, p, id).await?;
    let state = cancel(s, p, id).await?;
    Ok(json!({"session_id": id, "state": state}))
}

/// Which of `ids` are sensitive: held as such by the engine, or — one that ended before its
/// agent's report arrived — with a `claim` in the quorum's audit log.
async fn sensitive_of(s: &Shared, ids: &[&str]) -> std::collections::BTreeSet<String> {
    let (mut known, unknown): (Vec<&str>, Vec<&str>) = {
        let c = s.control.lock().await;
        ids.iter().partition(|id| c.is_sensitive_named(id))
    };
    if !unknown.is_empty() {
        let claimed: Vec<&str> = s
            .member
            .read(|q| {
                unknown
                    .iter()
                    .copied()
                    .filter(|id| q.audit.iter().rev().any(|e| e.alloc == *id && e.action == "claim"))
                    .collect()
            })
            .await;
        known.extend(claimed);
    }
    known.into_iter().map(str::to_string).collect()
}

/// The images a sensitive allocation's prologue mounted on `node` (book: the audit trail holds
/// image pulls and what ran with its hash): an `image_pull` entry each, `NODE image=NAME
/// sha256=HEX pulled|cached`, written in the background (the agent's poll does not wait on the
/// quorum).
async fn audit_image_uses(s: &Arc<Shared>, node: &str, startups: &[lattice_agent_protocol::Startup]) {
    let with_images: Vec<&lattice_agent_protocol::Startup> =
        startups.iter().filter(|st| !st.images.is_empty()).collect();
    if with_images.is_empty() {
        return;
    }
    let ids: Vec<&str> = with_images.iter().map(|st| st.id.as_str()).collect();
    let sensitive = sensitive_of(s, &ids).await;
    let entries: Vec<(String, String, String)> = {
        let c = s.control.lock().await;
        with_images
            .iter()
            .filter(|st| sensitive.contains(&st.id))
            .flat_map(|st| {
                let user = c.view_named(&st.id).and_then(|v| v.user).unwrap_or_default();
                st.images.iter().map(move |i| {
                    let how = if i.pulled { "pulled" } else { "cached" };
                    (
                        user.clone(),
                        st.id.clone(),
                        format!("{node} image={} sha256={} {how}", i.image, i.sha256),
                    )
                })
            })
            .collect()
    };
    for (user, alloc, detail) in entries {
        let s = s.clone();
        tokio::spawn(async move { crate::context::audit(&s, &user, &alloc, "image_pull", detail).await });
    }
}

/// Most paths one `data_access` entry names (the rest are counted).
const ACCESS_PATHS_PER_ENTRY: usize = 32;

/// One `data_access` entry's detail: `NODE read PATH ×N, write PATH ×M, …` (paths in order, at
/// most [`ACCESS_PATHS_PER_ENTRY`], then `and K more paths (C opens)`).
pub fn data_access_detail(node: &str, accesses: &[&lattice_agent_protocol::DataAccess]) -> String {
    let lost: u64 = accesses
        .iter()
        .filter(|d| d.path.is_empty())
        .map(|d| u64::from(d.count))
        .sum();
    let mut sorted: Vec<&&lattice_agent_protocol::DataAccess> =
        accesses.iter().filter(|d| !d.path.is_empty()).collect();
    sorted.sort_by(|a, b| (&a.path, a.write).cmp(&(&b.path, b.write)));
    let mut parts: Vec<String> = sorted
        .iter()
        .take(ACCESS_PATHS_PER_ENTRY)
        .map(|d| format!("{} {} ×{}", if d.write { "write" } else { "read" }, d.path, d.count))
        .collect();
    if sorted.len() > ACCESS_PATHS_PER_ENTRY {
        let rest = &sorted[ACCESS_PATHS_PER_ENTRY..];
        let opens: u64 = rest.iter().map(|d| u64::from(d.count)).sum();
        parts.push(format!("and {} more paths ({opens} opens)", rest.len()));
    }
    if lost > 0 {
        parts.push(format!(
            "{lost} opens on the node not recorded while it was watched (audit buffer full)"
        ));
    }
    format!("{node} {}", parts.join(", "))
}

/// Audit mode's report (book: data access under a sensitive allocation's data paths, from the
/// agent's eBPF telemetry, batched): one `data_access` entry per allocation and poll, written in
/// the background.
async fn audit_data_access(s: &Arc<Shared>, node: &str, accesses: &[lattice_agent_protocol::DataAccess]) {
    if accesses.is_empty() {
        return;
    }
    let mut by_alloc: std::collections::BTreeMap<&str, Vec<&lattice_agent_protocol::DataAccess>> = Default::default();
    for a in accesses {
        by_alloc.entry(a.id.as_str()).or_default().push(a);
    }
    let ids: Vec<&str> = by_alloc.keys().copied().collect();
    let sensitive = sensitive_of(s, &ids).await;
    let entries: Vec<(String, String, String)> = {
        let c = s.control.lock().await;
        by_alloc
            .into_iter()
            .filter(|(id, _)| sensitive.contains(*id))
            .map(|(id, list)| {
                let user = c.view_named(id).and_then(|v| v.user).unwrap_or_default();
                (user, id.to_string(), data_access_detail(node, &list))
            })
            .collect()
    };
    for (user, alloc, detail) in entries {
        let s = s.clone();
        tokio::spawn(async move { crate::context::audit(&s, &user, &alloc, "data_access", detail).await });
    }
}

/// An agent's work poll: its overhead and startup figures go to the metrics, its reports to the
/// quorum; the answer is its work.
pub async fn work_poll(s: &Arc<Shared>, p: &Principal, id: &str, w: WorkPoll) -> Result<Value, ApiError> {
    if let Some(pct) = w.collection_overhead_pct.filter(|p| p.is_finite() && *p >= 0.0) {
        s.metrics.agent_overhead.with_label_values(&[id]).set(pct);
    }
    for st in &w.startups {
        if st.seconds.is_finite() && st.seconds >= 0.0 {
            s.metrics.agent_startup.with_label_values(&[id]).observe(st.seconds);
        }
    }
    audit_image_uses(s, id, &w.startups).await;
    audit_data_access(s, id, &w.data_access).await;
    let reports = lattice_control::AgentReports {
        checkpointed: w.checkpointed,
        wiped: w.wiped,
        metrics: w.metrics,
        task_ends: w.task_ends,
        tasks_running: w.tasks,
        cache_done: w.cache_done,
        cache: w.cache,
    };
    let work = work(s, p, id, &w.running, w.output, &reports).await?;
    serde_json::to_value(work).map_err(|e| ApiError::Unavailable { message: e.to_string() })
}

/// An agent's report that an allocation's process on its node exited (with its output's tails).
pub async fn exit_report(s: &Arc<Shared>, p: &Principal, id: &str, x: &ExitReport) -> Result<Value, ApiError> {
    let tails: Vec<(Stream, &str)> = [(Stream::Stdout, &x.log_tail), (Stream::Stderr, &x.err_tail)]
        .into_iter()
        .filter_map(|(s, t)| Some((s, t.as_deref()?)))
        .collect();
    let ended = agent_exit(s, p, id, &x.node, x.kind, x.exit_code, &tails).await?;
    Ok(json!({"id": id, "ended": ended}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_access_entry_names_each_path_and_counts_the_rest() {
        let d = |path: &str, write: bool, count: u32| lattice_agent_protocol::DataAccess {
            id: "a-1".into(),
            path: path.into(),
            write,
            count,
        };
        let list = [d("/data/b", true, 2), d("/data/a", false, 5)];
        let refs: Vec<_> = list.iter().collect();
        assert_eq!(data_access_detail("x1", &refs), "x1 read /data/a ×5, write /data/b ×2");
        let many: Vec<_> = (0..40).map(|i| d(&format!("/data/f{i:02}"), false, 3)).collect();
        let refs: Vec<_> = many.iter().collect();
        let detail = data_access_detail("x1", &refs);
        assert!(detail.ends_with("and 8 more paths (24 opens)"), "{detail}");
        assert_eq!(detail.matches("read ").count(), 32);
        // Opens the node could not record are said, not dropped.
        let list = [d("/data/a", false, 1), d("", false, 7)];
        let refs: Vec<_> = list.iter().collect();
        assert_eq!(
            data_access_detail("x1", &refs),
            "x1 read /data/a ×1, 7 opens on the node not recorded while it was watched (audit buffer full)"
        );
    }
}
