//! Nodes and their agents: node orders and wipes, registration, heartbeats, work polls and exits,
//! task launches, terminals, fingerprints and the image cache.

use super::allocations::get;
use super::common::*;
use crate::auth::Principal;
use crate::context::Shared;
use crate::effects::execute;
use crate::error::ApiError;
use crate::mirror::MirrorOp;
use lattice_adapters::logstore::Stream;
use lattice_control::{NodeOp, NodeView};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The nodes as the leader schedules them (a member that has not taken over yet would show the
/// inventory without what the quorum recorded: it answers 421 naming the leader).
/// `GET /v1/nodes` and `lattice nodes`: which nodes (empty = any).
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeQuery {
    /// Only nodes in this state (`ready`, `allocated`, `draining`, `down`, …).
    pub state: Option<String>,
    /// Only nodes running an allocation of this vCluster.
    pub vcluster: Option<String>,
    /// Only nodes running an allocation of this tenant.
    pub tenant: Option<String>,
}

pub async fn nodes(s: &Shared, q: &NodeQuery) -> Result<Vec<NodeView>, ApiError> {
    readable(s).await?;
    Ok(s.control
        .lock()
        .await
        .nodes()
        .into_iter()
        .filter(|n| {
            selects(&q.state, Some(&n.state))
                && selects(&q.vcluster, n.vcluster.as_deref())
                && selects(&q.tenant, n.tenant.as_deref())
        })
        .collect())
}

pub async fn node(s: &Shared, id: &str) -> Result<NodeView, ApiError> {
    readable(s).await?;
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
pub(super) fn may_operate_nodes(p: &Principal) -> Result<(), ApiError> {
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
    let refused = |e: lattice_control::FieldError| {
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
            lattice_adapters::ProposeError::NotLeader { leader_id, leader } => redirect(s, leader_id, leader),
            e => ApiError::Unavailable {
                message: format!("node {id}: the order could not be recorded at the quorum ({e}); retry"),
            },
        })?;
    }
    let (r, actions) = {
        let mut c = s.control.lock().await;
        // The controller holds the node to the order at once (a drain or disable is carried out).
        let lost = c.set_admin(id, order.drained, order.disabled);
        // Asked again: the order may have done it, or the node's state may have changed while the
        // order was being recorded (its agent registered, say); a recorded order holds either way.
        let r = match c.check_node_op(id, op) {
            Ok(()) => c.node_op(id, op),
            Err(e) if order == was => Err(e),
            Err(_) => Ok((c.node_state_of(id).unwrap_or_default(), lost)),
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

/// Agents act for their own node: an agent authenticated by its certificate only for the node its CN
/// names (`sim-000`, or a name under it such as `sim-000.site.lattice.internal`); a node-agent token
/// carries the Operator role (or the runtime runs without auth in development).
pub(super) fn agent_allowed(p: &Principal, node: &str) -> Result<(), ApiError> {
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
    let (r, fill) = {
        let mut c = s.control.lock().await;
        let r = c.register_agent_with(node, fingerprint, capabilities);
        (r, c.discovery_fill(node))
    };
    let state = r.map_err(|e| field_error(node, e))?;
    if let Some(fill) = fill {
        record_discovery(s, node, fill).await;
    }
    Ok(state)
}

/// What `node`'s agent discovered where its inventory leaves capabilities unset: recorded at the
/// quorum, then applied (every leader schedules the node alike). A record that fails changes
/// nothing here: the node stays as the inventory says until its agent registers again.
async fn record_discovery(s: &Shared, node: &str, fill: lattice_engine::DiscoveredCapabilities) {
    let cmd = lattice_adapters::QuorumCommand::Discovered {
        node: node.to_string(),
        capabilities: fill.clone(),
    };
    match s.member.propose(cmd).await {
        Ok(_) => match s.control.lock().await.apply_discovered(node, fill) {
            Ok(_) => {
                s.wake.notify_one();
            }
            Err(e) => tracing::warn!("node {node}: discovered capabilities: {}", e.message),
        },
        Err(e) => tracing::warn!("node {node}: what its agent discovered could not be recorded at the quorum: {e}"),
    }
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
    req: &lattice_control::tasks::TaskRequest,
) -> Result<lattice_control::tasks::LaunchView, ApiError> {
    writable(s).await?;
    may_change(s, p, id, "launching tasks in").await?;
    let token = random_token();
    let r = s.control.lock().await.launch_tasks(id, req, token);
    r.map_err(bad_request)
}

/// Where a user's terminal into allocation `id` goes (`lattice attach`): only its owner or an admin
/// may attach; the node (its first by default) must hold it and serve terminals. The relay's start,
/// the agent's address, the node, and whether the attach is audited (a sensitive claim).
pub async fn attach_target(
    s: &Shared,
    p: &Principal,
    id: &str,
    node: Option<&str>,
    terminal: lattice_control::tasks::TerminalRequest,
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
    // Book: a sensitive allocation is attached to only when it runs a signed uenv.
    if sensitive && !s.control.lock().await.runs_signed_uenv(id) {
        return Err(ApiError::Forbidden {
            field: Some("environment.sign_required".into()),
            message: format!(
                "{id} is sensitive: attach only to one that runs a signed uenv (environment.uenv with sign_required: true)"
            ),
        });
    }
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

/// A sensitive allocation's terminal session as its audit entries name it: the node, and the member
/// that serves it (whose restart ends the sessions it served).
fn session_detail(s: &Shared, node: &str) -> String {
    format!("terminal on {node} via m{}", s.member.id)
}

/// Opens a sensitive allocation's terminal session at the quorum (its `attach` entry) before it
/// starts: refused (409, nothing started) while another is open — one at a time, decided at the
/// quorum, so of two opened at once exactly one is.
///
/// The session is recorded ([`crate::recording`]): the recording is started first, so the `attach`
/// entry names it; a session that cannot be recorded is not opened. The terminal's `size`
/// (rows, cols) heads the recording.
pub async fn open_sensitive_session(
    s: &Shared,
    p: &Principal,
    id: &str,
    node: &str,
    size: (u16, u16),
) -> Result<crate::recording::Recording, ApiError> {
    let rec =
        crate::recording::Recording::start(&s.data_dir, id, (&p.user, node), size, s.clock.now_ms()).map_err(|e| {
            ApiError::Unavailable {
                message: format!("{id}: its session cannot be recorded ({e}), so it is not opened"),
            }
        })?;
    let detail = format!("{} recording={}", session_detail(s, node), rec.name);
    let cmd = crate::context::audit_command(s, &p.user, id, "attach", detail);
    if let Err(e) = committed(s, cmd, "attach").await {
        let _ = rec.finish();
        let _ = std::fs::remove_file(s.data_dir.join(&rec.name));
        return Err(e);
    }
    Ok(rec)
}

/// A sensitive allocation's session ended (`attach_end (how)`), in the quorum's audit log.
/// The entry names the session's recording, ended: its name, size and SHA-256.
pub async fn audit_attach(
    s: &Arc<Shared>,
    p: &Principal,
    id: &str,
    node: &str,
    what: &str,
    rec: &crate::recording::Recording,
) {
    let recorded = match rec.finish() {
        // At the session's end its recording goes to the archive too (when there is one), named
        // in the entry.
        Ok(r) if what.starts_with("attach_end") && s.archive.is_some() => {
            let tenant = s
                .control
                .lock()
                .await
                .view_named(id)
                .map(|v| v.tenant)
                .unwrap_or_default();
            let archive = s.archive.as_ref().expect("checked");
            match archive.archive_recording(&s.data_dir.join(&r.name), &tenant, id).await {
                Ok(key) => format!("{r} archived={key}"),
                Err(e) => format!("{r} archive_error={e:?}"),
            }
        }
        Ok(r) => r.to_string(),
        Err(e) => format!("recording={} unreadable: {e}", rec.name),
    };
    crate::context::audit(s, &p.user, id, what, format!("{} {recorded}", session_detail(s, node))).await;
}

/// Whether a sensitive session relayed here must end: its member no longer leads (the new leader
/// ends it in the audit log).
pub fn session_must_end(s: &Shared, sensitive: bool) -> bool {
    sensitive && !s.member.is_leader()
}

/// Orders a cache `op` (`warm`, `evict`) on nodes (operators and admins); the node names.
pub async fn cache_order(
    s: &Shared,
    p: &Principal,
    op: &str,
    req: &lattice_control::cache::CacheRequest,
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
) -> Result<BTreeMap<String, lattice_control::cache::NodeCache>, ApiError> {
    readable(s).await?;
    Ok(s.control.lock().await.caches.view(node))
}

/// The task launches of allocation `id` (whoever may see it).
pub async fn task_launches(
    s: &Shared,
    p: &Principal,
    id: &str,
) -> Result<Vec<lattice_control::tasks::LaunchView>, ApiError> {
    get(s, p, id).await?;
    Ok(s.control.lock().await.task_launches(id))
}

pub async fn task_launch(
    s: &Shared,
    p: &Principal,
    id: &str,
    launch: &str,
) -> Result<lattice_control::tasks::LaunchView, ApiError> {
    get(s, p, id).await?;
    let found = s.control.lock().await.task_launch(id, launch);
    found.ok_or_else(|| not_found("task launch", launch))
}

pub async fn heartbeat(
    s: &Shared,
    p: &Principal,
    node: &str,
    buffered: &[lattice_control::BufferedBeat],
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
    output: Vec<lattice_control::OutputIn>,
    reports: &lattice_control::AgentReports,
) -> Result<lattice_control::Work, ApiError> {
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
    kind: lattice_control::ExitKind,
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
    if kind == lattice_control::ExitKind::Prologue
        && let Some(why) = tails
            .iter()
            .filter(|(stream, _)| *stream == Stream::Stderr)
            .find_map(|(_, t)| t.lines().rev().find(|l| !l.trim().is_empty()))
    {
        c.note_prologue_failure(id, node, why.trim());
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
        lattice_control::ExitKind::Checkpointed | lattice_control::ExitKind::Preempted
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
