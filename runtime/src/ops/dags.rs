//! DAGs: submitted whole (mirrored as one), their views and cancels.

use super::allocations::cancel;
use super::common::*;
use crate::auth::Principal;
use crate::context::Shared;
use crate::error::ApiError;
use crate::mirror::MirrorOp;
use lattice_control::{AllocationView, SubmitRequest};
use std::sync::Arc;

/// `GET /v1/dags` and `lattice dag list`: which DAGs (empty = any). A DAG's tenant and user are
/// its members'.
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DagQuery {
    pub tenant: Option<String>,
    pub user: Option<String>,
    /// The DAG's overall state (`pending`, `running`, `completed`, `failed`, `cancelled`).
    pub state: Option<String>,
}

/// One DAG's summary: id, overall state, members — those the caller may see that `q` selects.
pub async fn dags(
    s: &Shared,
    p: &Principal,
    q: &DagQuery,
) -> Result<Vec<(String, String, Vec<(String, AllocationView)>)>, ApiError> {
    readable(s).await?;
    let ids: Vec<String> = s.control.lock().await.dag_ids();
    let mut out = Vec::new();
    for id in ids {
        if let Ok((state, members)) = dag_view(s, p, &id).await {
            let first = members.first().map(|(_, v)| v);
            if selects(&q.state, Some(&state))
                && selects(&q.tenant, first.map(|v| v.tenant.as_str()))
                && selects(&q.user, first.and_then(|v| v.user.as_deref()))
            {
                out.push((id, state, members));
            }
        }
    }
    Ok(out)
}

/// `POST /v1/dags`: allocations with edges between them by member name.
#[derive(Clone, Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DagRequest {
    #[serde(default)]
    pub id: Option<String>,
    pub allocations: Vec<DagMember>,
}

#[derive(Clone, Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct DagMember {
    /// The member's name inside the DAG (what `depends_on.ref` of other members names).
    pub name: String,
    #[serde(flatten)]
    pub request: SubmitRequest,
}

/// The book's limit on one DAG (the same for a trace's DAG: one set of limits).
pub use lattice_traces::MAX_DAG_SIZE;

/// Submits a DAG: members in dependency order (refs name earlier or later members; cycles and unknown
/// refs are refused before anything is queued). Returns the DAG id and member name → allocation id.
pub async fn submit_dag(
    s: &Arc<Shared>,
    p: &Principal,
    req: DagRequest,
) -> Result<(String, Vec<(String, String)>), ApiError> {
    writable(s).await?;
    let bad = |field: String, message: String| ApiError::BadRequest { field, message };
    let n = req.allocations.len();
    if n == 0 {
        return Err(bad("allocations".into(), "a DAG needs at least one allocation".into()));
    }
    if n > MAX_DAG_SIZE {
        return Err(bad(
            "allocations".into(),
            format!("DAG has {n} allocations; the limit is {MAX_DAG_SIZE}"),
        ));
    }
    let index: std::collections::BTreeMap<&str, usize> = req
        .allocations
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name.as_str(), i))
        .collect();
    if index.len() != n {
        return Err(bad("allocations.name".into(), "member names must be unique".into()));
    }
    // Kahn's algorithm over in-DAG refs (refs to existing allocation ids are allowed too).
    let mut indegree = vec![0usize; n];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, m) in req.allocations.iter().enumerate() {
        if !p.can_submit_for(&m.request.tenant) {
            return Err(ApiError::Forbidden {
                field: Some(format!("allocations[{i}].tenant")),
                message: format!("{} may not submit for tenant {}", p.user, m.request.tenant),
            });
        }
        for d in &m.request.depends_on {
            if let Some(&j) = index.get(d.reference.as_str()) {
                indegree[i] += 1;
                children[j].push(i);
            } else if s.control.lock().await.id_of(&d.reference).is_none() {
                return Err(bad(
                    format!("allocations[{i}].depends_on"),
                    format!("ref `{}` is neither a member of the DAG nor an allocation", d.reference),
                ));
            }
        }
    }
    let mut ready: std::collections::VecDeque<usize> = (0..n).filter(|i| indegree[*i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_front() {
        order.push(i);
        for &c in &children[i] {
            indegree[c] -= 1;
            if indegree[c] == 0 {
                ready.push_back(c);
            }
        }
    }
    if order.len() != n {
        let stuck: Vec<&str> = (0..n)
            .filter(|i| indegree[*i] > 0)
            .map(|i| req.allocations[i].name.as_str())
            .collect();
        return Err(bad(
            "allocations.depends_on".into(),
            format!("dependency cycle among {}", stuck.join(", ")),
        ));
    }
    if let Some(id) = &req.id
        && (id.is_empty() || id.len() > MAX_DAG_ID)
    {
        return Err(bad("id".into(), format!("{} characters; 1 to {MAX_DAG_ID}", id.len())));
    }
    // A DAG id of the client's choosing is its idempotency key: a retry (after a timeout, a lost
    // answer, a 503, a fail-over) gets the first submission's members once a majority holds them,
    // never a second DAG. Each member is keyed `dag:ID:INDEX`, so a new leader mirrors an adopted
    // member again (with the DAG's record) before it starts, as for any keyed submission.
    let keyed = req.id.is_some();
    let mut c = s.control.lock().await;
    let dag_id = req.id.clone().unwrap_or_else(|| c.next_dag_id());
    if let Some(existing) = c.dag(&dag_id).cloned()
        && keyed
        && !dag_record_holds(&c, &dag_id, &req, &existing)
    {
        // A record of an earlier attempt that was never acknowledged: some member's number now
        // belongs to another allocation (a later leader that never saw the attempt handed it out).
        // The attempt's members still here are cancelled and the DAG is queued anew (found by DST).
        // Whatever holds a member's key now is such an attempt too (the record may name an older one).
        for (i, m) in req.allocations.iter().enumerate() {
            if m.request.idempotency_key.is_none()
                && let Some(id) = c.by_key(&m.request.tenant, &dag_key(&dag_id, i)).cloned()
            {
                c.cancel(&id);
            }
        }
        c.remove_dag(&dag_id);
        tracing::warn!("DAG {dag_id}: an earlier attempt's record does not hold (never acknowledged); queued anew");
    }
    if let Some(existing) = c.dag(&dag_id).cloned() {
        let names: Vec<&str> = existing.iter().map(|(n, _)| n.as_str()).collect();
        let mut asked: Vec<&str> = req.allocations.iter().map(|m| m.name.as_str()).collect();
        let mut had = names.clone();
        asked.sort_unstable();
        had.sort_unstable();
        if asked != had {
            return Err(bad(
                "id".into(),
                format!("DAG {dag_id} exists with other members ({})", names.join(", ")),
            ));
        }
        let ids: Vec<String> = existing.iter().map(|(_, id)| id.clone()).collect();
        if ids.iter().any(|i| c.ack_state(i) == Some(true)) {
            return Err(ApiError::Unavailable {
                message: format!("DAG {dag_id} is still being acknowledged; retry"),
            });
        }
        if ids.iter().all(|i| c.ack_state(i).is_none()) {
            return Ok((dag_id, existing));
        }
        // Not yet on a majority: its members' records and its own are mirrored again.
        let entries: Vec<crate::mirror::Entry> = {
            let m = s.mirror.lock().unwrap_or_else(|e| e.into_inner());
            ids.iter()
                .filter_map(|n| m.entries.get(&lattice_control::id_number(n)?))
                .cloned()
                .collect()
        };
        if entries.len() != ids.len() {
            return Err(ApiError::Unavailable {
                message: format!("DAG {dag_id}: not every member is in this member's record; retry"),
            });
        }
        for i in &ids {
            c.unacked(i, true);
        }
        let recorded = crate::mirror::net::record(
            s,
            MirrorOp::Entries {
                entries,
                dags: vec![(dag_id.clone(), existing.clone())],
            },
        );
        drop(c);
        let acked = settled(s, async move |s: Arc<Shared>| {
            let acked = mirrored(&s, recorded, false).await;
            settle_dag_ack(&s, &ids, acked.is_ok()).await;
            acked
        })
        .await;
        acked?;
        s.wake.notify_one();
        return Ok((dag_id, existing));
    }
    let mut ids: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    let mut members = Vec::new();
    let mut items = Vec::new();
    for i in order {
        let m = &req.allocations[i];
        let mut r = m.request.clone();
        if r.task_group.is_some() {
            return Err(ApiError::BadRequest {
                field: format!("allocations[{i}].task_group"),
                message: "a DAG member is one allocation; submit the task group on its own".into(),
            });
        }
        for d in &mut r.depends_on {
            if let Some(id) = ids.get(&d.reference) {
                d.reference = id.clone();
            }
        }
        if !p.is_admin() || r.user.is_none() {
            r.user = Some(p.user.clone());
        }
        if keyed && r.idempotency_key.is_none() {
            r.idempotency_key = Some(dag_key(&dag_id, i));
        }
        let id = c.submit(r.clone()).map_err(|e| ApiError::BadRequest {
            field: format!("allocations[{i}].{}", e.field),
            message: e.message,
        })?;
        // Not started before a majority holds it (a retry could otherwise run it twice).
        c.unacked(&id, true);
        ids.insert(m.name.clone(), id.clone());
        members.push((m.name.clone(), id.clone()));
        items.push((id, r));
    }
    c.add_dag(&dag_id, members.clone());
    let recorded = record_submit(s, &c, items, Some((dag_id.clone(), members.clone())));
    drop(c);
    let ids: Vec<String> = members.iter().map(|(_, id)| id.clone()).collect();
    let acked = settled(s, async move |s: Arc<Shared>| {
        let acked = mirrored(&s, recorded, !keyed).await;
        // Without a key a DAG that could not be made durable is cancelled (nothing to mirror again).
        settle_dag_ack(&s, &ids, acked.is_ok() || !keyed).await;
        acked
    })
    .await;
    acked?;
    s.metrics.submitted.inc_by(members.len() as u64);
    s.wake.notify_one();
    Ok((dag_id, members))
}

/// The idempotency key of the member at position `i` of a DAG submitted under the client's id.
pub(super) fn dag_key(dag: &str, i: usize) -> String {
    format!("dag:{dag}:{i}")
}

/// Whether a DAG's record still names its own members: each (keyed by the DAG) is the allocation
/// its key names here. A number handed out again by a later leader breaks it.
pub(super) fn dag_record_holds(
    c: &lattice_control::Control,
    dag: &str,
    req: &DagRequest,
    existing: &[(String, String)],
) -> bool {
    existing.iter().all(|(name, id)| {
        match req.allocations.iter().position(|m| m.name == *name) {
            // Its own key (not the DAG's): nothing to tell by.
            Some(i) if req.allocations[i].request.idempotency_key.is_some() => true,
            Some(i) => c.by_key(&req.allocations[i].request.tenant, &dag_key(dag, i)) == Some(id),
            None => true,
        }
    })
}

/// After a DAG's mirroring: its members are acknowledged (they may start), or wait to be mirrored
/// again (by a retry, or in the background).
pub(super) async fn settle_dag_ack(s: &Shared, ids: &[String], acked: bool) {
    let mut c = s.control.lock().await;
    for id in ids {
        if acked {
            c.acked(id);
        } else {
            c.unacked(id, false);
        }
    }
}

/// The longest DAG id a client may choose.
pub const MAX_DAG_ID: usize = 100;

/// A DAG's members and its overall state: `failed` if any failed, else `cancelled` if any was,
/// `completed` when all completed, `running` when any runs, else `pending`.
pub async fn dag(s: &Shared, p: &Principal, id: &str) -> Result<(String, Vec<(String, AllocationView)>), ApiError> {
    readable(s).await?;
    match dag_view(s, p, id).await {
        // Said only once this member is sure it still leads (as for an allocation).
        Err(ApiError::NotFound { .. }) => Err(absent_as(s, "DAG", id).await),
        r => r,
    }
}

pub(super) async fn dag_view(
    s: &Shared,
    p: &Principal,
    id: &str,
) -> Result<(String, Vec<(String, AllocationView)>), ApiError> {
    let c = s.control.lock().await;
    let members = c.dag(id).ok_or_else(|| not_found("DAG", id))?.clone();
    let mut out = Vec::new();
    for (name, alloc) in members {
        if let Some(v) = c.view_named(&alloc) {
            out.push((name, v));
        }
    }
    if !out.iter().any(|(_, v)| p.can_see(&v.tenant, v.user.as_deref())) {
        return Err(not_found("DAG", id));
    }
    let any = |st: &str| out.iter().any(|(_, v)| v.state == st);
    let state = if any("failed") {
        "failed"
    } else if any("cancelled") {
        "cancelled"
    } else if out.iter().all(|(_, v)| v.state == "completed") {
        "completed"
    } else if any("running") || any("staging") {
        "running"
    } else {
        "pending"
    };
    Ok((state.to_string(), out))
}

/// Cancels every member of a DAG that has not ended.
pub async fn cancel_dag(s: &Arc<Shared>, p: &Principal, id: &str) -> Result<usize, ApiError> {
    let (_, members) = dag(s, p, id).await?;
    let mut n = 0;
    for (_, v) in members {
        if v.ended_ms.is_none() {
            let _ = cancel(s, p, &v.id).await?;
            n += 1;
        }
    }
    Ok(n)
}
