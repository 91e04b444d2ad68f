//! The API's operations, independent of the transport: REST ([`crate::api`]) and gRPC
//! ([`crate::grpc`]) both call these, so validation, authorization and tenant scoping are one code.

use crate::auth::Principal;
use crate::context::Shared;
use crate::control::{AllocationView, NodeOp, NodeView, SubmitRequest, UpdateRequest, Usage};
use crate::effects::execute;
pub use crate::error::{ApiError, forbidden};
use crate::mirror::MirrorOp;
use lattice_adapters::logstore::Stream;
use std::collections::BTreeMap;
use std::sync::Arc;

fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::NotFound {
        field: "id".into(),
        message: format!("no {what} {id}"),
    }
}

/// Writes are served by the leader only.
pub fn leader_only(s: &Shared) -> Result<(), ApiError> {
    if s.member.is_leader() {
        return Ok(());
    }
    let st = s.member.status();
    Err(ApiError::NotLeader {
        leader_id: st.leader,
        leader: st.leader.and_then(|l| st.members.get(&l).cloned()),
    })
}

/// Acknowledges the submission `op` (already queued here and applied to this member's copy, which
/// `local` makes durable) only once it is on this member's disk and a majority of the members holds
/// it, so it survives any restart and the leader's death; otherwise refuses (503) and, with `cancel`,
/// cancels it (without an idempotency key a retry is a new submission; with one, the retry mirrors
/// this one again).
async fn mirrored(s: &Arc<Shared>, (op, term, local): Recorded, cancel: bool) -> Result<(), ApiError> {
    let ids: Vec<String> = match &op {
        MirrorOp::Submit { items, .. } => items.iter().map(|(id, _)| id.clone()).collect(),
        MirrorOp::Entries { entries, .. } => entries.iter().map(|e| e.id.clone()).collect(),
        _ => Vec::new(),
    };
    let (disk, peers) = tokio::join!(
        local.wait(),
        crate::mirror::net::replicate(s, &op, term, std::time::Duration::from_secs(2))
    );
    if disk.is_ok() && peers {
        return Ok(());
    }
    let why = match disk {
        Err(e) => format!("could not be written to disk ({e})"),
        Ok(()) => "could not be mirrored to a majority of the quorum".into(),
    };
    if !cancel {
        return Err(ApiError::Unavailable {
            message: format!("{} {why} yet; retry with the same idempotency_key", ids.join(", ")),
        });
    }
    for id in &ids {
        let actions = {
            let mut c = s.control.lock().await;
            c.cancel(id);
            c.take_actions()
        };
        execute(s.clone(), actions).await;
    }
    Err(ApiError::Unavailable {
        message: format!("{} {why}; not accepted, retry", ids.join(", ")),
    })
}

/// A change recorded in this member's copy: the op to mirror, the leader term it was made in and
/// the handle of its local write ([`crate::mirror::net::record`]).
type Recorded = (MirrorOp, u64, crate::mirror::Durable);

/// Queues `items` (one submission or a DAG's members) in this member's copy of the queue.
fn record_submit(
    s: &Shared,
    c: &crate::control::Control,
    items: Vec<(String, SubmitRequest)>,
    dag: Option<(String, Vec<(String, String)>)>,
) -> Recorded {
    let submitted_ms = items.first().map_or(0, |(id, _)| c.submitted_ms(id));
    let op = MirrorOp::Submit {
        items,
        submitted_ms,
        dag,
    };
    crate::mirror::net::record(s, op)
}

/// Writes that touch the queue or the engine: served by the leader once it has taken over the queue
/// (a member that just won an election adopts its mirror first, here or in its scheduling loop).
pub async fn writable(s: &Shared) -> Result<(), ApiError> {
    leader_only(s)?;
    if !crate::leadership::sync_leadership(s).await {
        leader_only(s)?;
        // The leader that could not adopt the queue yet (a majority's copies did not answer) does
        // not serve: an empty queue would lose acknowledged work and hand out used ids.
        return Err(ApiError::Unavailable {
            message: "the new leader is still taking over the queue; retry".into(),
        });
    }
    leader_only(s)
}

/// Reads of the queue and allocations: served by the leader once it has taken over the queue (a
/// member that has just started or just won an election adopts the durable queue first), so a read
/// never shows an empty queue that is really only not loaded yet. Others answer 421 naming the leader.
pub async fn readable(s: &Shared) -> Result<(), ApiError> {
    writable(s).await
}

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
                            .filter_map(|n| m.entries.get(&crate::control::id_number(n)?))
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
    Ok(answer)
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

/// "No allocation `id`" — said only after confirming with a majority that this member still leads:
/// a deposed leader that has not heard of its successor yet must not deny what the new leader
/// acknowledged (it answers "not the leader" instead).
async fn absent(s: &Shared, id: &str) -> ApiError {
    absent_as(s, "allocation", id).await
}

/// [`absent`] for any kind of record (`allocation`, `DAG`).
async fn absent_as(s: &Shared, kind: &str, id: &str) -> ApiError {
    match s.member.confirm_leader().await {
        // And only from the queue adopted in the term it leads (not a control plane replaced by a
        // leadership change while the request ran).
        Ok(()) if s.control.lock().await.adopted_term == s.member.leader_term() => not_found(kind, id),
        Ok(()) => ApiError::Unavailable {
            message: "the leader is taking over the queue; retry".into(),
        },
        Err(lattice_adapters::ProposeError::NotLeader { leader_id, leader }) => {
            ApiError::NotLeader { leader_id, leader }
        }
        Err(e) => ApiError::Unavailable {
            message: format!("id: could not confirm leadership to look up {id}: {e}"),
        },
    }
}

/// Filters of a listing (empty = any).
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
pub struct ListFilter {
    pub tenant: Option<String>,
    pub user: Option<String>,
    pub state: Option<String>,
    pub vcluster: Option<String>,
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
        .filter(|a| keep(&q.state, &a.state))
        .filter(|a| keep(&q.vcluster, &a.vcluster))
        .collect())
}

/// The caller may change allocation `id` (owner, tenant admin or system admin): 403 if they only see
/// it, 404 if they do not even see it.
async fn may_change(s: &Shared, p: &Principal, id: &str, what: &str) -> Result<(), ApiError> {
    let owner = {
        let c = s.control.lock().await;
        c.view_named(id).map(|v| (v.tenant, v.user))
    };
    match owner {
        Some((t, u)) if p.can_cancel(&t, u.as_deref()) => Ok(()),
        Some((t, u)) if p.can_see(&t, u.as_deref()) => Err(ApiError::Forbidden {
            field: None,
            message: format!("forbidden: {what} this allocation"),
        }),
        _ => Err(absent(s, id).await),
    }
}

fn bad_request(e: crate::control::FieldError) -> ApiError {
    ApiError::BadRequest {
        field: e.field,
        message: e.message,
    }
}

/// `PATCH /v1/allocations/{id}`: walltime, tags, telemetry mode; the allocation afterwards.
pub async fn update(s: &Shared, p: &Principal, id: &str, req: &UpdateRequest) -> Result<AllocationView, ApiError> {
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

/// Waits until `op` (applied to this member's copy, `local` its write) is on this member's disk, while
/// the other members are sent it too (best effort: the next leader merges what it missed).
async fn on_disk(s: &Shared, (op, term, local): Recorded) -> Result<(), String> {
    let (disk, _) = tokio::join!(
        local.wait(),
        crate::mirror::net::replicate(s, &op, term, std::time::Duration::from_secs(2))
    );
    disk
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

pub async fn nodes(s: &Shared) -> Vec<NodeView> {
    s.control.lock().await.nodes()
}

pub async fn node(s: &Shared, id: &str) -> Result<NodeView, ApiError> {
    let c = s.control.lock().await;
    c.node_index(id)
        .and_then(|i| c.node_view(i))
        .ok_or_else(|| not_found("node", id))
}

/// Drains (or undrains) a node; its state afterwards.
pub async fn set_drain(s: &Arc<Shared>, p: &Principal, id: &str, drain: bool) -> Result<String, ApiError> {
    node_op(s, p, id, if drain { NodeOp::Drain } else { NodeOp::Undrain }).await
}

/// Node operations need the Operator or SystemAdmin role.
fn may_operate_nodes(p: &Principal) -> Result<(), ApiError> {
    if !p.can_operate() {
        return Err(ApiError::Forbidden {
            field: None,
            message: "forbidden: node operations need the Operator or SystemAdmin role".into(),
        });
    }
    Ok(())
}

/// Retries a quarantined node's wipe (book: "Wipe Failure Handling": `lattice admin node wipe <id>
/// --force`; Operator/SystemAdmin, `force` required): the claim whose wipe failed. Refused — nothing
/// wiped — without `force`, for an unknown node (404) and for a node not quarantined (409).
pub async fn retry_wipe(s: &Arc<Shared>, p: &Principal, id: &str, force: bool) -> Result<String, ApiError> {
    may_operate_nodes(p)?;
    writable(s).await?;
    if !force {
        return Err(ApiError::BadRequest {
            field: "force".into(),
            message: "retrying a quarantined node's wipe needs `force: true` (the node is wiped again; once wiped it returns to the pool)".into(),
        });
    }
    let (r, actions) = {
        let mut c = s.control.lock().await;
        let r = c.retry_wipe(id, &p.user);
        (r, c.take_actions())
    };
    execute(s.clone(), actions).await;
    r.map_err(|e| {
        if e.message.starts_with("no node") {
            not_found("node", id)
        } else {
            ApiError::Conflict { message: e.message }
        }
    })
}

/// Drain, undrain, disable or enable a node; its state afterwards. A disabled node's allocation is
/// requeued or failed by the engine, and its nodes are released at the quorum.
pub async fn node_op(s: &Arc<Shared>, p: &Principal, id: &str, op: NodeOp) -> Result<String, ApiError> {
    may_operate_nodes(p)?;
    writable(s).await?;
    let refused = |e: crate::control::FieldError| {
        if e.message.starts_with("no node") {
            not_found("node", id)
        } else {
            bad_request(e)
        }
    };
    // Whether the node's state allows it now; the order itself may still change (an undrain of a
    // node a new leader has not seen come back yet lifts the drain; a drain of a down node holds
    // when it comes back).
    let allowed = match s.control.lock().await.check_node_op(id, op) {
        Err(e) if e.message.starts_with("no node") => return Err(refused(e)),
        r => r,
    };
    // The standing order is recorded at the quorum first, so a new leader keeps it.
    let was = s
        .member
        .read(|q| q.node_admin.get(id).copied())
        .await
        .unwrap_or_default();
    let mut order = was;
    match op {
        NodeOp::Drain => order.drained = true,
        NodeOp::Undrain => order.drained = false,
        NodeOp::Disable => order.disabled = true,
        NodeOp::Enable => order.disabled = false,
    }
    if order == was {
        // Nothing to record: refused when the state does not allow it (nothing changes).
        allowed.map_err(refused)?;
    } else {
        let cmd = lattice_adapters::QuorumCommand::NodeAdmin {
            node: id.to_string(),
            drained: order.drained,
            disabled: order.disabled,
        };
        s.member.propose(cmd).await.map_err(|e| match e {
            lattice_adapters::ProposeError::NotLeader { leader_id, leader } => {
                ApiError::NotLeader { leader_id, leader }
            }
            e => ApiError::Unavailable {
                message: format!("node {id}: the order could not be recorded at the quorum ({e}); retry"),
            },
        })?;
    }
    let (r, actions) = {
        let mut c = s.control.lock().await;
        c.set_admin(id, order.drained, order.disabled);
        // Asked again: the node's state may have changed while the order was being recorded (its
        // agent registered, say); a recorded order holds either way.
        let r = match c.check_node_op(id, op) {
            Ok(()) => c.node_op(id, op),
            Err(e) if order == was => Err(e),
            Err(_) => {
                c.enforce_admin();
                Ok((c.node_state_of(id).unwrap_or_default(), Vec::new()))
            }
        };
        (r, c.take_actions())
    };
    execute(s.clone(), actions).await;
    let (state, lost) = r.map_err(refused)?;
    for alloc in lost {
        tracing::warn!("{alloc} lost node {id} ({op:?})");
    }
    s.wake.notify_one();
    Ok(state)
}

/// One DAG's summary: id, overall state, members.
pub async fn dags(s: &Shared, p: &Principal) -> Result<Vec<(String, String, Vec<(String, AllocationView)>)>, ApiError> {
    readable(s).await?;
    let ids: Vec<String> = s.control.lock().await.dag_ids();
    let mut out = Vec::new();
    for id in ids {
        if let Ok((state, members)) = dag_view(s, p, &id).await {
            out.push((id, state, members));
        }
    }
    Ok(out)
}

/// A vCluster's pending allocations the caller may see, in queue order.
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
pub const WEIGHT_NAMES: [&str; 9] = [
    "priority",
    "wait_time",
    "fair_share",
    "topology",
    "data_readiness",
    "backlog",
    "energy",
    "checkpoint",
    "conformance",
];

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

/// A backup written by this member: where, at which log index, its checksum.
pub struct BackupMade {
    pub path: std::path::PathBuf,
    pub backup: lattice_adapters::raft_store::Backup,
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
        None => format!("backup-{:013}.json", crate::control::wall_now().0),
    };
    let path = s.data_dir.join("backups").join(file);
    match s.member.backup(&path).await {
        Ok(backup) => Ok(BackupMade { path, backup }),
        Err(e) => Err(ApiError::BadRequest {
            field: "name".into(),
            message: e,
        }),
    }
}

/// `lattice audit query`: filters of the quorum's audit log (empty = any).
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub user: Option<String>,
    pub allocation: Option<String>,
    pub node: Option<String>,
    /// `YYYY-MM-DD` (UTC midnight) or milliseconds since the epoch.
    pub since: Option<String>,
    pub until: Option<String>,
}

/// `2026-03-01` → ms at UTC midnight; a bare integer is taken as ms.
pub fn parse_instant(field: &str, v: &str) -> Result<u64, ApiError> {
    let bad = || ApiError::BadRequest {
        field: field.into(),
        message: format!("`{v}`: expected YYYY-MM-DD or milliseconds since the epoch"),
    };
    if let Ok(ms) = v.parse::<u64>() {
        return Ok(ms);
    }
    let parts: Vec<&str> = v.split('-').collect();
    let [y, m, d] = parts[..] else { return Err(bad()) };
    let (y, m, d) = (
        y.parse::<i64>().map_err(|_| bad())?,
        m.parse::<i64>().map_err(|_| bad())?,
        d.parse::<i64>().map_err(|_| bad())?,
    );
    // Years past 9999 are refused too: the day arithmetic below would overflow (a fuzzed query
    // string found it: `since=9223372036854775807-01-01` panicked the handler).
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    // Days from civil (proleptic Gregorian), Howard Hinnant's algorithm.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days as u64 * 86_400_000)
}

/// The audit entries matching `q` and whether the whole chain verifies. SystemAdmin and Operator see
/// every entry; anyone else only their own.
pub async fn audit(
    s: &Shared,
    p: &Principal,
    q: &AuditQuery,
) -> Result<(Vec<lattice_adapters::AuditEntry>, bool), ApiError> {
    let since = q.since.as_deref().map(|v| parse_instant("since", v)).transpose()?;
    let until = q.until.as_deref().map(|v| parse_instant("until", v)).transpose()?;
    let all = p.is_admin() || p.can_operate();
    let want = |w: &Option<String>, have: &str| w.as_deref().is_none_or(|w| w.is_empty() || w == have);
    let (entries, valid) = s
        .member
        .read(|st| {
            let e: Vec<_> = st
                .audit
                .iter()
                .filter(|e| all || e.user == p.user)
                .filter(|e| want(&q.user, &e.user) && want(&q.allocation, &e.alloc))
                .filter(|e| {
                    q.node
                        .as_deref()
                        .is_none_or(|n| n.is_empty() || e.detail.split(',').any(|d| d == n))
                })
                .filter(|e| since.is_none_or(|t| e.at_ms >= t) && until.is_none_or(|t| e.at_ms < t))
                .cloned()
                .collect();
            (e, st.verify_audit().is_ok())
        })
        .await;
    Ok((entries, valid))
}

/// `GET /api/v1/tenants/{id}/usage?days=N` and `GET /api/v1/usage?user=U&days=N`.
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    pub tenant: Option<String>,
    pub user: Option<String>,
    pub days: Option<u32>,
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
) -> Result<(Usage, Vec<crate::control::UsageRecord>), ApiError> {
    let w = usage_window(s, p, q).await?;
    let c = s.control.lock().await;
    let (t, u) = (w.tenant.as_deref(), w.user.as_deref());
    Ok((c.usage(t, u, w.since, w.until), c.usage_records(t, u, w.since, w.until)))
}

struct Window {
    tenant: Option<String>,
    user: Option<String>,
    since: lattice_engine::Time,
    until: lattice_engine::Time,
}

/// The filters and window of a usage query, once the caller may see them.
async fn usage_window(s: &Shared, p: &Principal, q: &UsageQuery) -> Result<Window, ApiError> {
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
    let own_tenant = tenant.is_some() && tenant == p.tenant.as_deref() && p.has(Role::TenantAdmin);
    let own_user = user == Some(p.user.as_str()) && tenant.is_none_or(|t| Some(t) == p.tenant.as_deref());
    if !(wide || own_tenant || own_user) {
        return Err(forbidden("usage of other tenants or users"));
    }
    let until = s.control.lock().await.now();
    Ok(Window {
        tenant: tenant.map(str::to_string),
        user: user.map(str::to_string),
        since: lattice_engine::Time(until.0.saturating_sub(days as u64 * 86_400_000)),
        until,
    })
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
    pub resources: Option<crate::control::Resources>,
    /// Default: bounded, walltime 4 h.
    #[serde(default)]
    pub lifecycle: Option<crate::control::LifecycleIn>,
    #[serde(default)]
    pub environment: Option<crate::control::EnvironmentIn>,
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
) -> Result<BTreeMap<String, Vec<crate::control::ServiceEndpoint>>, ApiError> {
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
fn valid_tenant_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// SystemAdmin only, on the leader; a new tenant's or project's name is valid.
async fn may_write_contract(s: &Shared, p: &Principal, what: &str, name: &str, create: bool) -> Result<(), ApiError> {
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
fn over_limit(who: &str, view: &serde_json::Value, max_nodes: Option<u32>) -> Option<String> {
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

/// Proposes `cmd` and waits for its commit; a rejection at apply time is the caller's error.
async fn committed(s: &Shared, cmd: lattice_adapters::QuorumCommand, what: &str) -> Result<(), ApiError> {
    match s.member.propose(cmd).await {
        Ok(lattice_adapters::QuorumResponse::Applied) => Ok(()),
        Ok(lattice_adapters::QuorumResponse::Rejected { reason, message }) => Err(match reason.as_str() {
            "no_tenant" => not_found("tenant", what),
            "no_project" => not_found("project", what),
            _ => ApiError::Conflict { message },
        }),
        Err(lattice_adapters::ProposeError::NotLeader { leader_id, leader }) => {
            Err(ApiError::NotLeader { leader_id, leader })
        }
        Err(e) => Err(ApiError::Unavailable {
            message: format!("{what}: the change could not be committed at the quorum ({e}); retry"),
        }),
    }
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
        resources: r.resources.unwrap_or(crate::control::Resources {
            nodes: crate::control::NodesIn::Exact(1),
            constraints: None,
        }),
        lifecycle: Some(r.lifecycle.unwrap_or(crate::control::LifecycleIn {
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

/// The book's limit on one DAG.
pub const MAX_DAG_SIZE: usize = 1000;

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
                .filter_map(|n| m.entries.get(&crate::control::id_number(n)?))
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
fn dag_key(dag: &str, i: usize) -> String {
    format!("dag:{dag}:{i}")
}

/// Whether a DAG's record still names its own members: each (keyed by the DAG) is the allocation
/// its key names here. A number handed out again by a later leader breaks it.
fn dag_record_holds(c: &crate::control::Control, dag: &str, req: &DagRequest, existing: &[(String, String)]) -> bool {
    existing.iter().all(|(name, id)| {
        match req.allocations.iter().position(|m| m.name == *name) {
            // Its own key (not the DAG's): nothing to tell by.
            Some(i) if req.allocations[i].request.idempotency_key.is_some() => true,
            Some(i) => c.by_key(&req.allocations[i].request.tenant, &dag_key(dag, i)) == Some(id),
            None => true,
        }
    })
}

/// Runs `work` — mirroring a submission and settling whether it is acknowledged — to its end even
/// when the request that started it is dropped (a client that gave up and closed its connection):
/// otherwise its allocations would stay "being acknowledged" for good, never start, and hold up the
/// queue behind them (found by DST, seed 586).
async fn settled<F>(s: &Arc<Shared>, work: impl FnOnce(Arc<Shared>) -> F) -> Result<(), ApiError>
where
    F: std::future::Future<Output = Result<(), ApiError>> + Send + 'static,
{
    tokio::spawn(work(s.clone())).await.unwrap_or_else(|e| {
        Err(ApiError::Unavailable {
            message: format!("acknowledging the submission failed ({e}); retry"),
        })
    })
}

/// After a DAG's mirroring: its members are acknowledged (they may start), or wait to be mirrored
/// again (by a retry, or in the background).
async fn settle_dag_ack(s: &Shared, ids: &[String], acked: bool) {
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

async fn dag_view(s: &Shared, p: &Principal, id: &str) -> Result<(String, Vec<(String, AllocationView)>), ApiError> {
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

/// Agents act for their own node: an agent authenticated by its certificate only for the node its CN
/// names (`sim-000`, or a name under it such as `sim-000.site.lattice.internal`); a node-agent token
/// carries the Operator role (or the runtime runs without auth in development).
fn agent_allowed(p: &Principal, node: &str) -> Result<(), ApiError> {
    match &p.node {
        Some(cn) if cn == node || cn.strip_prefix(node).is_some_and(|r| r.starts_with('.')) => Ok(()),
        Some(cn) => Err(ApiError::Forbidden {
            field: Some("node".into()),
            message: format!("forbidden: the client certificate names {cn}, not node {node}"),
        }),
        None if p.can_operate() => Ok(()),
        None => Err(ApiError::Forbidden {
            field: None,
            message: "forbidden: agents authenticate with a node certificate or an Operator (agent) token".into(),
        }),
    }
}

fn field_error(node: &str, e: crate::control::FieldError) -> ApiError {
    if e.field == "id" && e.message.starts_with("no node") {
        not_found("node", node)
    } else {
        ApiError::BadRequest {
            field: e.field,
            message: e.message,
        }
    }
}

pub async fn register(
    s: &Shared,
    p: &Principal,
    node: &str,
    fingerprint: Option<String>,
    capabilities: Option<serde_json::Value>,
) -> Result<String, ApiError> {
    agent_allowed(p, node)?;
    // Only the leader that took over the queue watches agents (a follower's registration would
    // be a lease nobody keeps); a leadership change resets the control plane first.
    writable(s).await?;
    let r = s
        .control
        .lock()
        .await
        .register_agent_with(node, fingerprint, capabilities);
    r.map_err(|e| field_error(node, e))
}

/// [`register`] with the address of the agent's own service (task launches' fences).
pub async fn register_with(
    s: &Shared,
    p: &Principal,
    node: &str,
    fingerprint: Option<String>,
    capabilities: Option<serde_json::Value>,
    peer: Option<String>,
) -> Result<String, ApiError> {
    let state = register(s, p, node, fingerprint, capabilities).await?;
    s.control
        .lock()
        .await
        .set_agent_service(node, peer)
        .map_err(|e| field_error(node, e))?;
    Ok(state)
}

/// `POST /v1/allocations/{id}/tasks`: a task launch in running allocation `id` (its owner or an
/// admin); each node's agent gets its ranks with its next poll.
pub async fn launch_tasks(
    s: &Shared,
    p: &Principal,
    id: &str,
    req: &crate::tasks::TaskRequest,
) -> Result<crate::tasks::LaunchView, ApiError> {
    writable(s).await?;
    may_change(s, p, id, "launching tasks in").await?;
    let token = random_token();
    let r = s.control.lock().await.launch_tasks(id, req, token);
    r.map_err(bad_request)
}

/// The launch's secret: 128 random bits (the agents accept its fences and aborts only with it).
fn random_token() -> String {
    random_secret()[..16].iter().map(|x| format!("{x:02x}")).collect()
}

/// 256 random bits from the kernel.
pub fn random_secret() -> [u8; 32] {
    use std::io::Read;
    let mut b = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        // Never a predictable secret: the time and address of this call, hashed.
        use sha2::Digest;
        let seed = format!("{:?}{:p}", std::time::SystemTime::now(), &b);
        b.copy_from_slice(&sha2::Sha256::digest(seed.as_bytes()));
    }
    b
}

/// Where a user's terminal into allocation `id` goes (`lattice attach`): only its owner or an admin
/// may attach; the node (its first by default) must hold it and serve terminals. The relay's start,
/// the agent's address, the node, and whether the attach is audited (a sensitive claim).
pub async fn attach_target(
    s: &Shared,
    p: &Principal,
    id: &str,
    node: Option<&str>,
    terminal: crate::tasks::TerminalRequest,
) -> Result<(lattice_adapters::peer::AttachStart, String, String, bool), ApiError> {
    readable(s).await?;
    may_change(s, p, id, "attaching to").await?;
    // Just started: its agent starts it there with its next poll (a few seconds at most).
    let t0 = std::time::Instant::now();
    let (node, addr, token, sensitive) = loop {
        let r = s.control.lock().await.attach_target(id, node);
        match r {
            Err(e) if e.message.contains("has not started") && t0.elapsed() < std::time::Duration::from_secs(10) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            r => break r.map_err(bad_request)?,
        }
    };
    let start = lattice_adapters::peer::AttachStart {
        alloc: id.to_string(),
        token,
        command: terminal.command.filter(|c| !c.trim().is_empty()),
        rows: terminal.rows.unwrap_or(24),
        cols: terminal.cols.unwrap_or(80),
        term: terminal.term,
    };
    Ok((start, addr, node, sensitive))
}

/// A sensitive allocation's attach, in the quorum's audit log (start and end).
pub async fn audit_attach(s: &Arc<Shared>, p: &Principal, id: &str, node: &str, what: &str) {
    crate::context::audit(s, &p.user, id, what, format!("terminal on {node}")).await;
}

/// Orders a cache `op` (`warm`, `evict`) on nodes (operators and admins); the node names.
pub async fn cache_order(
    s: &Shared,
    p: &Principal,
    op: &str,
    req: &crate::cache::CacheRequest,
) -> Result<Vec<String>, ApiError> {
    if !p.can_operate() {
        return Err(ApiError::Forbidden {
            field: None,
            message: "forbidden: cache operations need the Operator or SystemAdmin role".into(),
        });
    }
    writable(s).await?;
    let r = s.control.lock().await.cache_order(op, req);
    r.map_err(bad_request)
}

/// The nodes' image caches (everyone who may see nodes).
pub async fn cache_list(
    s: &Shared,
    _p: &Principal,
    node: Option<&str>,
) -> Result<BTreeMap<String, crate::cache::NodeCache>, ApiError> {
    readable(s).await?;
    Ok(s.control.lock().await.caches.view(node))
}

/// The task launches of allocation `id` (whoever may see it).
pub async fn task_launches(s: &Shared, p: &Principal, id: &str) -> Result<Vec<crate::tasks::LaunchView>, ApiError> {
    get(s, p, id).await?;
    Ok(s.control.lock().await.task_launches(id))
}

pub async fn task_launch(
    s: &Shared,
    p: &Principal,
    id: &str,
    launch: &str,
) -> Result<crate::tasks::LaunchView, ApiError> {
    get(s, p, id).await?;
    let found = s.control.lock().await.task_launch(id, launch);
    found.ok_or_else(|| not_found("task launch", launch))
}

pub async fn heartbeat(
    s: &Shared,
    p: &Principal,
    node: &str,
    buffered: &[crate::control::BufferedBeat],
    (seq, rtt_ms): (u64, Option<f64>),
) -> Result<(String, u64), ApiError> {
    agent_allowed(p, node)?;
    // Only the leader's acceptance counts: it is the one that declares a silent node Down, so a
    // lease granted by a follower would let a cut-off agent run past its requeue (found by DST).
    writable(s).await?;
    let mut c = s.control.lock().await;
    let state = c
        .heartbeat_with(node, buffered, seq)
        .map_err(|e| field_error(node, e))?;
    // The round trip of the agent's previous heartbeat, as it measured it.
    if let Some(ms) = rtt_ms.filter(|ms| ms.is_finite() && *ms >= 0.0) {
        s.metrics
            .heartbeat_latency
            .with_label_values(&[node])
            .observe(ms / 1000.0);
    }
    Ok((state, c.lease_ms(node)))
}

/// `POST /v1/nodes/{id}/fingerprint`: the node's agent recomputes its conformance fingerprint and
/// reports it (Operator or SystemAdmin).
pub async fn ask_fingerprint(s: &Shared, p: &Principal, node: &str) -> Result<(), ApiError> {
    if !p.can_operate() || p.node.is_some() {
        return Err(ApiError::Forbidden {
            field: None,
            message: "forbidden: asking for a fingerprint needs the Operator role".into(),
        });
    }
    writable(s).await?;
    let r = s.control.lock().await.ask_fingerprint(node);
    r.map_err(|e| field_error(node, e))
}

/// `POST /v1/nodes/{id}/work {"running": [...], "output": [...], "checkpointed": [...], "wiped": [...]}`:
/// an agent's poll (leader only), with the new output of the allocations someone follows and the
/// outcomes of checkpoint hints and wipes on its node.
pub async fn work(
    s: &Arc<Shared>,
    p: &Principal,
    node: &str,
    running: &[String],
    output: Vec<crate::control::OutputIn>,
    reports: &crate::control::AgentReports,
) -> Result<crate::control::Work, ApiError> {
    agent_allowed(p, node)?;
    writable(s).await?;
    let mut c = s.control.lock().await;
    c.add_output(node, output);
    c.agent_reports(node, reports).map_err(|e| field_error(node, e))?;
    let mut w = c.work(node, running).map_err(|e| field_error(node, e))?;
    (w.tasks, w.stop_tasks) = c.task_work(node, &reports.tasks_running);
    // A checkpoint or wipe outcome may have changed what the engine can do.
    let actions = c.take_actions();
    drop(c);
    if !actions.is_empty() {
        execute(s.clone(), actions).await;
        s.wake.notify_one();
    }
    Ok(w)
}

/// `POST /v1/allocations/{id}/exit {"node", "kind", "exit_code"}`: an agent reports a process's end.
pub async fn agent_exit(
    s: &Arc<Shared>,
    p: &Principal,
    id: &str,
    node: &str,
    kind: crate::control::ExitKind,
    code: i32,
    tails: &[(Stream, &str)],
) -> Result<bool, ApiError> {
    agent_allowed(p, node)?;
    writable(s).await?;
    // The run the exit belongs to: its nodes' assignment at the quorum (exits of an earlier run,
    // before a requeue, must not count for this one after a restart).
    let run = s.member.read(|q| q.assignments.get(id).map_or(0, |a| a.since_ms)).await;
    let mut c = s.control.lock().await;
    for (stream, t) in tails {
        c.add_log(id, node, *stream, t);
    }
    let r = c.agent_exit(id, node, kind, code);
    let ended = r.map_err(|e| {
        if e.field == "id" {
            not_found("allocation", id)
        } else {
            bad_request(e)
        }
    })?;
    let preemption = matches!(
        kind,
        crate::control::ExitKind::Checkpointed | crate::control::ExitKind::Preempted
    );
    if !ended && preemption {
        // One node of a victim stopped: the victim is suspended (or fails) once all did. A
        // restart before then runs it again from its last checkpoint; nothing to record.
        let actions = c.take_actions();
        drop(c);
        execute(s.clone(), actions).await;
    } else if !ended {
        // One node of several is done: recorded, so a restart does not start it there again.
        let op = MirrorOp::Exit {
            id: id.to_string(),
            node: node.to_string(),
            code,
            run,
        };
        let recorded = crate::mirror::net::record(s, op);
        drop(c);
        on_disk(s, recorded).await.map_err(|e| ApiError::Unavailable {
            message: format!("{id}: the exit could not be written to disk ({e}); report it again"),
        })?;
    } else {
        let actions = c.take_actions();
        drop(c);
        execute(s.clone(), actions).await;
        s.wake.notify_one();
    }
    Ok(ended)
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
) -> Result<BTreeMap<String, crate::control::LiveOutput>, ApiError> {
    get(s, p, id).await?;
    let mut c = s.control.lock().await;
    c.follow(id, stream, after).ok_or_else(|| not_found("allocation", id))
}
