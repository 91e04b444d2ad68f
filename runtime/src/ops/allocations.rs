//! Allocations: submit, get, list, update, checkpoint, cancel, services, sessions and logs.

use super::common::*;
use crate::auth::Principal;
use crate::context::Shared;
use crate::effects::execute;
use crate::error::ApiError;
use crate::mirror::MirrorOp;
use lattice_adapters::logstore::Stream;
use lattice_control::{AllocationView, SubmitRequest, UpdateRequest};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a submission answers: its id, and a task group's elements.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SubmitAnswer {
    pub id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub elements: Vec<String>,
}

/// Queues an allocation (or a task group's elements, all or none) for the caller; its id.
pub async fn submit(s: &Arc<Shared>, p: &Principal, mut req: SubmitRequest) -> Result<SubmitAnswer, ApiError> {
    writable(s).await?;
    if !p.can_submit_for(&req.tenant) {
        return Err(ApiError::Forbidden {
            field: Some("tenant".into()),
            message: format!("{} may not submit for tenant {}", p.user, req.tenant),
        });
    }
    if req.sensitive && !(p.is_admin() || p.has(crate::auth::Role::ClaimingUser)) {
        return Err(ApiError::Forbidden {
            field: Some("sensitive".into()),
            message: format!("{} may not make sensitive claims (needs the ClaimingUser role)", p.user),
        });
    }
    if !p.is_admin() || req.user.is_none() {
        // The submitter is the token's subject.
        req.user = Some(p.user.clone());
    }
    // Where the input data is and how big (VAST catalog/locality), unless the request says.
    if let (Some(vast), Some(d)) = (&s.vast, req.data.as_mut()) {
        for (i, m) in d.mounts.iter_mut().enumerate() {
            if m.tier.is_none() || m.size_gb.is_none() {
                let l = vast.locality(&m.source).await.map_err(|e| ApiError::Unavailable {
                    message: format!("data.mounts[{i}]: VAST locality of {}: {e}", m.source),
                })?;
                m.tier.get_or_insert(l.tier);
                m.size_gb.get_or_insert(l.bytes as f64 / 1e9);
            }
        }
    }
    let sensitive = req.sensitive;
    let key = req.idempotency_key.clone().map(|k| (req.tenant.clone(), k));
    let (answer, recorded) = {
        // Queued and mirrored locally under one lock (a leadership change adopts one or the other).
        let mut c = s.control.lock().await;
        if let Some((tenant, k)) = &key
            && let Some(id) = c.by_key(tenant, k).cloned()
        {
            // A retry: the first submission's id, once that one is on a majority's disks.
            let elements = c.group_members(&id);
            match c.ack_state(&id) {
                None => return Ok(SubmitAnswer { id, elements }),
                Some(true) => {
                    return Err(ApiError::Unavailable {
                        message: format!(
                            "idempotency_key: `{k}`: its first submission ({id}) is still being acknowledged; retry"
                        ),
                    });
                }
                Some(false) => {
                    // Not yet on a majority: its record is mirrored again.
                    let names = if elements.is_empty() {
                        vec![id.clone()]
                    } else {
                        elements.clone()
                    };
                    let entries: Vec<crate::mirror::Entry> = {
                        let m = s.mirror.lock().unwrap_or_else(|e| e.into_inner());
                        names
                            .iter()
                            .filter_map(|n| m.entries.get(&lattice_control::id_number(n)?))
                            .cloned()
                            .collect()
                    };
                    if entries.len() != names.len() {
                        return Err(ApiError::Unavailable {
                            message: format!("idempotency_key: `{k}`: {id} is not in this member's record; retry"),
                        });
                    }
                    c.unacked(&id, true);
                    let recorded = crate::mirror::net::record(
                        s,
                        MirrorOp::Entries {
                            entries,
                            dags: Vec::new(),
                        },
                    );
                    (SubmitAnswer { id, elements }, recorded)
                }
            }
        } else {
            let queued = c.submit_all(req, None).map_err(bad_request)?;
            tracing::debug!(
                "member {} (term {:?}) queues {} under key {:?}",
                s.member.id,
                s.member.leader_term(),
                queued.id,
                key
            );
            c.unacked(&queued.id, true);
            let group = queued.elements.len() > 1 || queued.elements.first().is_some_and(|(e, _)| *e != queued.id);
            let answer = SubmitAnswer {
                id: queued.id,
                elements: if group {
                    queued.elements.iter().map(|(e, _)| e.clone()).collect()
                } else {
                    Vec::new()
                },
            };
            (answer, record_submit(s, &c, queued.elements, None))
        }
    };
    let keyed = key.is_some();
    let id = answer.id.clone();
    let acked = settled(s, async move |s: Arc<Shared>| {
        let acked = mirrored(&s, recorded, !keyed).await;
        let mut c = s.control.lock().await;
        match (&acked, keyed) {
            // Kept queued under its key: a retry mirrors it again.
            (Err(_), true) => c.unacked(&id, false),
            _ => c.acked(&id),
        }
        acked
    })
    .await;
    acked?;
    let n = answer.elements.len().max(1) as u64;
    s.metrics.submitted.inc_by(n);
    s.wake.notify_one();
    if sensitive {
        claim_decided(s, &answer.id).await?;
    }
    Ok(answer)
}

/// How long a claim's submitter waits for its pool's pass to place or refuse it before the answer
/// says only that it was accepted (a pass runs as soon as the claim is acknowledged).
const CLAIM_DECISION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits until sensitive claim `id` is placed (its nodes committed or coming) or refused: a refusal
/// is the submitter's answer, `409 OwnershipConflict` naming the nodes and who holds them (book:
/// "Concurrent Sensitive Claims" — immediate or rejected, never queued).
async fn claim_decided(s: &Arc<Shared>, id: &str) -> Result<(), ApiError> {
    let deadline = tokio::time::Instant::now() + CLAIM_DECISION_WAIT;
    let incarnation = s.control.lock().await.incarnation;
    loop {
        let c = s.control.lock().await;
        match c.claim_outcome(id) {
            Some(Ok(())) => return Ok(()),
            Some(Err(message)) => return Err(ApiError::Conflict { message }),
            // Another control plane now (this member stopped leading): the submission is durable
            // and the next leader decides; the client asks again with its idempotency key.
            None if c.incarnation != incarnation => {
                return Err(ApiError::Unavailable {
                    message: format!("{id}: the leadership changed while its claim was decided; ask again"),
                });
            }
            None => {}
        }
        drop(c);
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("{id}: its claim was neither placed nor refused within {CLAIM_DECISION_WAIT:?}");
            return Ok(());
        }
        s.wake.notify_one();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// `GET /v1/allocations/{id}` (gRPC `GetAllocation`): [`get`], the read of a sensitive allocation
/// audited ([`audit_access`]).
pub async fn get_audited(s: &Shared, p: &Principal, id: &str) -> Result<AllocationView, ApiError> {
    let v = get(s, p, id).await?;
    audit_access(s, p, id, "api_call", "get").await?;
    Ok(v)
}

pub async fn get(s: &Shared, p: &Principal, id: &str) -> Result<AllocationView, ApiError> {
    readable(s).await?;
    let found = s
        .control
        .lock()
        .await
        .view_named(id)
        .filter(|v| p.can_see(&v.tenant, v.user.as_deref()));
    match found {
        Some(v) => Ok(v),
        None => Err(absent(s, id).await),
    }
}

/// Filters of a listing (empty = any).
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
pub struct ListFilter {
    pub tenant: Option<String>,
    pub user: Option<String>,
    /// One state, or several comma-separated (`pending,running`).
    pub state: Option<String>,
    pub vcluster: Option<String>,
    /// `true`: the caller's own allocations only (`lattice cancel --all-mine`).
    pub mine: Option<bool>,
}

pub async fn list(s: &Shared, p: &Principal, q: &ListFilter) -> Result<Vec<AllocationView>, ApiError> {
    readable(s).await?;
    let keep = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w.is_empty() || w == have);
    Ok(s.control
        .lock()
        .await
        .list()
        .into_iter()
        .filter(|a| p.can_see(&a.tenant, a.user.as_deref()))
        .filter(|a| keep(&q.tenant, &a.tenant))
        .filter(|a| keep(&q.user, a.user.as_deref().unwrap_or_default()))
        .filter(|a| {
            q.state
                .as_deref()
                .is_none_or(|w| w.is_empty() || w.split(',').any(|s| s.trim() == a.state))
        })
        .filter(|a| keep(&q.vcluster, &a.vcluster))
        .filter(|a| q.mine != Some(true) || a.user.as_deref() == Some(p.user.as_str()))
        .collect())
}

/// `PATCH /v1/allocations/{id}`: walltime, tags, telemetry mode; the allocation afterwards.
pub async fn update(s: &Arc<Shared>, p: &Principal, id: &str, req: &UpdateRequest) -> Result<AllocationView, ApiError> {
    writable(s).await?;
    may_change(s, p, id, "updating").await?;
    let (view, durable) = {
        let mut c = s.control.lock().await;
        c.update(id, req).map_err(bad_request)?;
        let view = c.view_named(id).ok_or_else(|| not_found("allocation", id))?;
        // The new walltime and tags are part of its durable record.
        let op = MirrorOp::Update {
            id: id.to_string(),
            walltime: req.walltime.clone(),
            tags: req.tags.clone(),
        };
        (view, crate::mirror::net::record(s, op))
    };
    s.wake.notify_one();
    on_disk(s, durable).await.map_err(|e| ApiError::Unavailable {
        message: format!("{id}: the update could not be written to disk ({e})"),
    })?;
    Ok(view)
}

/// `POST /v1/allocations/{id}/checkpoint`: checkpoints taken so far.
pub async fn checkpoint(s: &Shared, p: &Principal, id: &str) -> Result<u32, ApiError> {
    writable(s).await?;
    may_change(s, p, id, "checkpointing").await?;
    let r = s.control.lock().await.checkpoint(id);
    r.map_err(bad_request)
}

/// Cancels; a running allocation's nodes are released at the quorum.
/// Cancels `id` (a task group's id: every element); its state afterwards (`cancelled`, or how it
/// ended if it already had).
pub async fn cancel(s: &Arc<Shared>, p: &Principal, id: &str) -> Result<String, ApiError> {
    writable(s).await?;
    // A task group's id cancels every element still queued or running.
    let members = s.control.lock().await.group_members(id);
    if !members.is_empty() {
        for m in &members {
            may_change(s, p, m, "cancelling").await?;
        }
        let actions = {
            let mut c = s.control.lock().await;
            for m in &members {
                c.cancel(m);
            }
            c.take_actions()
        };
        execute(s.clone(), actions).await;
        s.wake.notify_one();
        return Ok("cancelled".into());
    }
    may_change(s, p, id, "cancelling").await?;
    let (actions, state) = {
        let mut c = s.control.lock().await;
        // One that already ended stays as it ended.
        let ended = c
            .view_named(id)
            .map(|v| v.state)
            .filter(|st| matches!(st.as_str(), "completed" | "failed" | "cancelled"));
        if let Some(st) = ended {
            return Ok(st);
        }
        if c.cancel(id).is_none() {
            drop(c);
            return Err(absent(s, id).await);
        }
        (c.take_actions(), "cancelled".to_string())
    };
    execute(s.clone(), actions).await;
    s.wake.notify_one();
    Ok(state)
}

/// `POST /v1/sessions` (book: "Interactive Sessions"): an allocation whose work is a terminal. Its
/// nodes are held by a process that waits; the terminal (`GET /v1/sessions/{id}/terminal`) is opened
/// once it runs, and deleting the session ends the allocation.
#[derive(Clone, Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    pub tenant: String,
    #[serde(default)]
    pub project: Option<String>,
    /// Typically the site's interactive vCluster.
    #[serde(default)]
    pub vcluster: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// Default: one node.
    #[serde(default)]
    pub resources: Option<lattice_control::Resources>,
    /// Default: bounded, walltime 4 h.
    #[serde(default)]
    pub lifecycle: Option<lattice_control::LifecycleIn>,
    #[serde(default)]
    pub environment: Option<lattice_control::EnvironmentIn>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// The service registry as the caller may see it (book: "Service Discovery Isolation"): `asked` is
/// the `x-lattice-tenant` header — an administrator, operator or read-only caller may name any tenant
/// (and sees every tenant's without one), others only their own (and see their own without one).
pub async fn services(
    s: &Shared,
    p: &Principal,
    asked: Option<&str>,
) -> Result<BTreeMap<String, Vec<lattice_control::ServiceEndpoint>>, ApiError> {
    readable(s).await?;
    let wide = p.can_operate() || p.has(crate::auth::Role::ReadOnly);
    let scope = match (asked.filter(|t| !t.is_empty()), wide) {
        (Some(t), true) => Some(t.to_string()),
        (Some(t), false) if p.tenant.as_deref() == Some(t) => Some(t.to_string()),
        (Some(t), false) => {
            return Err(ApiError::Forbidden {
                field: Some("x-lattice-tenant".into()),
                message: format!("{} may not see tenant {t}'s services", p.user),
            });
        }
        (None, true) => None,
        (None, false) => Some(p.tenant.clone().unwrap_or_default()),
    };
    Ok(s.control.lock().await.services(scope.as_deref()))
}

/// The tag that marks an allocation as a session.
pub const SESSION_TAG: &str = "session";

/// Creates a session: its allocation's id (also the session's).
pub async fn create_session(s: &Arc<Shared>, p: &Principal, r: SessionRequest) -> Result<String, ApiError> {
    let mut tags = r.tags;
    tags.insert(SESSION_TAG.into(), "true".into());
    let req = SubmitRequest {
        tenant: r.tenant,
        project: r.project,
        vcluster: r.vcluster,
        user: r.user,
        entrypoint: Some("exec sleep infinity".into()),
        resources: r.resources.unwrap_or(lattice_control::Resources {
            nodes: lattice_control::NodesIn::Exact(1),
            constraints: None,
        }),
        lifecycle: Some(r.lifecycle.unwrap_or(lattice_control::LifecycleIn {
            kind: "bounded".into(),
            walltime: Some("4h".into()),
            min_nodes: None,
            max_nodes: None,
            metric: None,
            target: None,
            scale_policy: None,
        })),
        preemption_class: None,
        tags,
        duration: None,
        depends_on: Vec::new(),
        sensitive: false,
        checkpoint: None,
        connectivity: None,
        data: None,
        task_group: None,
        idempotency_key: None,
        liveness_probe: None,
        environment: r.environment,
        requeue: None,
        max_requeues: None,
        mutex: None,
        storage_gbps: None,
    };
    Ok(submit(s, p, req).await?.id)
}

/// A session the caller may see (an allocation tagged as one; anything else is not a session).
pub async fn session(s: &Shared, p: &Principal, id: &str) -> Result<AllocationView, ApiError> {
    let v = get(s, p, id).await?;
    if v.tags.get(SESSION_TAG).map(String::as_str) != Some("true") {
        return Err(not_found("session", id));
    }
    Ok(v)
}

/// `GET /v1/allocations/{id}/logs`: historical output of one stream by node (same visibility as the
/// allocation itself) — from the log store when configured and the agents flushed there (`node`,
/// `offset`, `limit`, `since`, `until` apply), else the tails the agents reported with each exit.
/// Returns the source (`store` or `exit_tails`) too.
pub async fn logs(
    s: &Shared,
    p: &Principal,
    id: &str,
    (node, stream): (Option<&str>, Stream),
    range: &lattice_adapters::logstore::Range,
) -> Result<(&'static str, BTreeMap<String, String>), ApiError> {
    get(s, p, id).await?;
    audit_access(
        s,
        p,
        id,
        "log_access",
        &format!("{} {}", stream.as_str(), node.unwrap_or("all nodes")),
    )
    .await?;
    let c = s.control.lock().await;
    let tails = c.logs(id, stream).ok_or_else(|| not_found("allocation", id))?;
    let owner = c.log_owner(id);
    drop(c);
    if let (Some(store), Some((tenant, project))) = (&s.log_store, owner) {
        let nodes = store.nodes(&tenant, project.as_deref(), id);
        if !nodes.is_empty() {
            let mut out = BTreeMap::new();
            for n in nodes.iter().filter(|n| node.is_none_or(|x| x == n.as_str())) {
                let src = lattice_adapters::logstore::Source {
                    tenant: &tenant,
                    project: project.as_deref(),
                    alloc: id,
                    node: n,
                    stream,
                };
                let bytes = store
                    .read(&src, range)
                    .map_err(|e| ApiError::Unavailable { message: e.to_string() })?;
                out.insert(n.clone(), String::from_utf8_lossy(&bytes).into_owned());
            }
            return Ok(("store", out));
        }
    }
    let tails = tails
        .into_iter()
        .filter(|(n, _)| node.is_none_or(|x| x == n.as_str()))
        .collect();
    Ok(("exit_tails", tails))
}

/// `GET /v1/allocations/{id}/logs/live?after=NODE:OFFSET,...`: follows the output (live tail): the
/// agents stream it while someone follows, this answers what arrived after the given offsets.
pub async fn live_logs(
    s: &Shared,
    p: &Principal,
    id: &str,
    stream: Stream,
    after: &BTreeMap<String, u64>,
) -> Result<BTreeMap<String, lattice_control::LiveOutput>, ApiError> {
    get(s, p, id).await?;
    // Following the output is one access: audited when it starts (no offsets yet), not per poll.
    if after.is_empty() {
        audit_access(s, p, id, "log_access", &format!("{} live", stream.as_str())).await?;
    }
    let mut c = s.control.lock().await;
    c.follow(id, stream, after).ok_or_else(|| not_found("allocation", id))
}
