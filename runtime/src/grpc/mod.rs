//! The public gRPC API (tonic/prost, `proto/lattice/v1/*.proto`): AllocationService (submit, get,
//! list, cancel, watch, update, checkpoint, DAG submit/get/list/cancel), NodeService (list, get, drain,
//! undrain, disable, enable, register, heartbeat) and AdminService (raft status, tenants, vClusters,
//! queue, weights, backup/verify, audit query, usage), served
//! on the member's gRPC port next to the quorum's Raft service. Every call goes through the same
//! operations as REST ([`crate::ops`]); the bearer token travels in the `authorization` metadata.

pub mod coverage;
pub mod json;
mod observe;
mod site;

use crate::auth::{Principal, Refusal};
use crate::context::Shared;
use crate::ops::{self, ApiError};
use lattice_control::{
    AllocationView, DependsIn, LifecycleIn, NodeOp, NodeView, NodesIn, Resources, SubmitRequest, TelemetryIn,
    UpdateRequest,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub use crate::pb;

use pb::admin_service_server::AdminService;
use pb::allocation_service_server::AllocationService;
use pb::node_service_server::NodeService;

/// gRPC status codes for the API's refusals; the field travels in the message.
/// A tenant write's quota fields as the REST body's keys (set ones, and `clear`ed ones as null).
fn tenant_body(r: &pb::TenantWriteRequest) -> serde_json::Map<String, serde_json::Value> {
    quota_body(r.quota.as_ref(), &r.clear)
}

fn quota_body(quota: Option<&pb::TenantQuota>, clear: &[String]) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::json;
    let mut m = serde_json::Map::new();
    if let Some(q) = quota {
        let mut put = |k: &str, v: Option<serde_json::Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("max_nodes", q.max_nodes.map(|x| json!(x)));
        put(
            "max_concurrent_allocations",
            q.max_concurrent_allocations.map(|x| json!(x)),
        );
        put("gpu_hours_budget", q.gpu_hours_budget.map(|x| json!(x)));
        put("node_hours_budget", q.node_hours_budget.map(|x| json!(x)));
        put("fair_share_target", q.fair_share_target.map(|x| json!(x)));
        put("burst_allowance", q.burst_allowance.map(|x| json!(x)));
    }
    for k in clear {
        m.insert(k.clone(), serde_json::Value::Null);
    }
    m
}

/// A view's `quota` object as the message.
fn quota_message(q: &serde_json::Value) -> pb::TenantQuota {
    pb::TenantQuota {
        max_nodes: q["max_nodes"].as_u64().map(|x| x as u32),
        max_concurrent_allocations: q["max_concurrent_allocations"].as_u64().map(|x| x as u32),
        gpu_hours_budget: q["gpu_hours_budget"].as_f64(),
        node_hours_budget: q["node_hours_budget"].as_f64(),
        fair_share_target: q["fair_share_target"].as_f64(),
        burst_allowance: q["burst_allowance"].as_f64(),
    }
}

/// A project's view (`Control::project_view`) as the message.
fn project_answer(v: &serde_json::Value, warning: Option<String>) -> pb::ProjectResponse {
    pb::ProjectResponse {
        tenant: v["tenant"].as_str().unwrap_or_default().to_string(),
        name: v["name"].as_str().unwrap_or_default().to_string(),
        quota: Some(quota_message(&v["quota"])),
        nodes_held: v["nodes_held"].as_u64().unwrap_or(0),
        running: v["running"].as_u64().unwrap_or(0),
        pending: v["pending"].as_u64().unwrap_or(0),
        warning: warning.unwrap_or_default(),
    }
}

fn tenant_answer(name: &str, w: ops::TenantWritten) -> pb::TenantResponse {
    let v = &w.view;
    pb::TenantResponse {
        name: name.to_string(),
        quota: Some(quota_message(&v["quota"])),
        nodes_held: v["nodes_held"].as_u64().unwrap_or(0),
        running: v["running"].as_u64().unwrap_or(0),
        pending: v["pending"].as_u64().unwrap_or(0),
        warning: w.warning.unwrap_or_default(),
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let msg = match e.field() {
            Some(f) => format!("{}: {}", f, e.message()),
            None => e.message(),
        };
        match e {
            ApiError::BadRequest { .. } => Status::invalid_argument(msg),
            ApiError::Forbidden { .. } => Status::permission_denied(msg),
            ApiError::NotFound { .. } => Status::not_found(msg),
            ApiError::Unavailable { .. } => Status::unavailable(msg),
            ApiError::Conflict { .. } => Status::already_exists(msg),
            ApiError::NotLeader {
                leader_id,
                leader,
                leader_url,
            } => Status::failed_precondition(format!(
                "not the quorum leader (leader {}, {}{})",
                leader_id.map_or("unknown".into(), |l| l.to_string()),
                leader.unwrap_or_default(),
                leader_url.map(|u| format!(", REST {u}")).unwrap_or_default()
            )),
        }
    }
}

#[derive(Clone)]
pub struct Api {
    pub shared: Arc<Shared>,
}

impl Api {
    /// `CreateProject` (`create`) and `UpdateProject`.
    async fn write_project(
        &self,
        req: Request<pb::ProjectWriteRequest>,
        create: bool,
    ) -> Result<Response<pb::ProjectResponse>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let body = quota_body(r.quota.as_ref(), &r.clear);
        let w = ops::put_project(&self.shared, &p, &r.tenant, &r.name, &body, create).await?;
        Ok(Response::new(project_answer(&w.view, w.warning)))
    }

    pub(crate) fn principal<T>(&self, req: &Request<T>) -> Result<Principal, Status> {
        self.principal_with(req, true)
    }

    /// The node-agent calls (register, heartbeat) are not subject to the per-user rate limit.
    fn agent_principal<T>(&self, req: &Request<T>) -> Result<Principal, Status> {
        self.principal_with(req, false)
    }

    fn principal_with<T>(&self, req: &Request<T>, limited: bool) -> Result<Principal, Status> {
        let header = req.metadata().get("authorization").and_then(|v| v.to_str().ok());
        let checked = if limited {
            self.shared.auth.check(header)
        } else {
            let cn = req
                .peer_certs()
                .and_then(|c| c.first().and_then(|c| crate::tls::common_name(c)));
            self.shared.auth.check_agent(header, cn.as_deref())
        };
        checked.map_err(|r| match r {
            Refusal::Unauthenticated(why) => Status::unauthenticated(why),
            Refusal::RateLimited(secs) => {
                Status::resource_exhausted(format!("rate limit exceeded; retry after {secs} s"))
            }
        })
    }
}

fn buffered(h: &pb::HeartbeatRequest) -> Vec<lattice_control::BufferedBeat> {
    h.buffered
        .iter()
        .map(|b| lattice_control::BufferedBeat {
            seq: b.seq,
            at_ms: b.at_ms,
        })
        .collect()
}

fn to_pb(a: AllocationView) -> pb::Allocation {
    pb::Allocation {
        id: a.id,
        tenant: a.tenant,
        vcluster: a.vcluster,
        user: a.user.unwrap_or_default(),
        state: a.state,
        nodes: a.nodes,
        requested_nodes: a.requested_nodes,
        walltime_s: a.walltime_s,
        preemption_class: a.preemption_class as u32,
        submitted_ms: a.submitted_ms,
        started_ms: a.started_ms,
        ended_ms: a.ended_ms,
        end_reason: a.end_reason.unwrap_or_default(),
        entrypoint: a.entrypoint.unwrap_or_default(),
        tags: a.tags.into_iter().collect(),
        last_rejection: a.last_rejection.unwrap_or_default(),
        telemetry: a.telemetry,
        checkpoints: a.checkpoints,
        last_checkpoint_ms: a.last_checkpoint_ms,
        preempted: a.preempted,
        preemption: a.preemption.unwrap_or_default(),
        task_index: a.task_group.as_ref().map(|g| g.index),
        task_group: a.task_group.map(|g| g.group).unwrap_or_default(),
        environment: a.environment.map(|e| pb::Environment {
            uenv: e.uenv.unwrap_or_default(),
            view: e.view.unwrap_or_default(),
            image: e.image.unwrap_or_default(),
            tools_uenv: e.tools_uenv.unwrap_or_default(),
            sign_required: e.sign_required,
        }),
        constraints: a.constraints.map(|c| pb::Resources {
            nodes: 0,
            max_nodes: 0,
            gpu_type: c.gpu_type.unwrap_or_default(),
            gpu_count: c.gpu_count.unwrap_or_default(),
            features: c.features,
            topology: c.topology.unwrap_or_default(),
            cpu_cores: c.cpu_cores.unwrap_or_default(),
            memory_gb: c.memory_gb.unwrap_or_default(),
            require_unified_memory: c.require_unified_memory,
        }),
        requeue: a.requeue,
        max_requeues: a.max_requeues,
        mutex: a.mutex.unwrap_or_default(),
        storage_gbps: a.storage_gbps,
    }
}

fn dag_pb(id: String, state: String, members: Vec<(String, AllocationView)>) -> pb::Dag {
    let first = members.first().map(|(_, v)| v);
    pb::Dag {
        id,
        state,
        tenant: first.map(|v| v.tenant.clone()).unwrap_or_default(),
        user: first.and_then(|v| v.user.clone()).unwrap_or_default(),
        allocations: members
            .into_iter()
            .map(|(name, v)| pb::DagMemberStatus {
                name,
                allocation: Some(to_pb(v)),
            })
            .collect(),
    }
}

fn node_pb(n: NodeView) -> pb::Node {
    pb::Node {
        name: n.name,
        state: n.state,
        owner: n.owner.unwrap_or_default(),
        gpu_type: n.gpu_type.unwrap_or_default(),
        gpu_count: n.gpu_count,
        group: n.group,
        vcluster: n.vcluster.unwrap_or_default(),
        tenant: n.tenant.unwrap_or_default(),
    }
}

/// A usage request as the query REST decodes (empty fields are not given).
pub(crate) fn usage_query(r: pb::UsageRequest) -> ops::UsageQuery {
    ops::UsageQuery {
        tenant: none_if_empty(r.tenant),
        user: none_if_empty(r.user),
        days: (r.days > 0).then_some(r.days),
        since: none_if_empty(r.since),
        until: none_if_empty(r.until),
    }
}

/// An audit query's filters as REST takes them.
pub(super) fn audit_query(r: pb::AuditQueryRequest) -> ops::AuditQuery {
    ops::AuditQuery {
        user: none_if_empty(r.user),
        allocation: none_if_empty(r.allocation),
        node: none_if_empty(r.node),
        since: none_if_empty(r.since),
        until: none_if_empty(r.until),
        event: none_if_empty(r.event),
        data_path: none_if_empty(r.data_path),
        tenant: none_if_empty(r.tenant),
        scope: None,
    }
}

pub(crate) fn none_if_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The protobuf request as the API's request (the same validation follows).
/// A gRPC submission as the request type REST decodes (refusals name their field).
pub fn from_pb(r: pb::AllocationRequest) -> Result<SubmitRequest, Status> {
    let res = r
        .resources
        .ok_or_else(|| Status::invalid_argument("resources: required"))?;
    let nodes = if res.max_nodes == 0 {
        NodesIn::Exact(res.nodes as i64)
    } else {
        NodesIn::Range {
            min: res.nodes as i64,
            max: res.max_nodes as i64,
        }
    };
    let asked = !res.gpu_type.is_empty()
        || res.gpu_count > 0
        || !res.features.is_empty()
        || !res.topology.is_empty()
        || res.cpu_cores > 0
        || res.memory_gb > 0
        || res.require_unified_memory;
    let constraints = asked.then(|| lattice_control::ConstraintsIn {
        gpu_type: none_if_empty(res.gpu_type),
        gpu_count: (res.gpu_count > 0).then_some(res.gpu_count),
        features: res.features,
        topology: none_if_empty(res.topology),
        cpu_cores: (res.cpu_cores > 0).then_some(res.cpu_cores),
        memory_gb: (res.memory_gb > 0).then_some(res.memory_gb),
        require_unified_memory: res.require_unified_memory,
    });
    Ok(SubmitRequest {
        tenant: r.tenant,
        project: none_if_empty(r.project),
        vcluster: none_if_empty(r.vcluster),
        user: none_if_empty(r.user),
        entrypoint: none_if_empty(r.entrypoint),
        resources: Resources { nodes, constraints },
        lifecycle: r.lifecycle.map(|l| LifecycleIn {
            kind: if l.r#type.is_empty() {
                "bounded".into()
            } else {
                l.r#type
            },
            walltime: none_if_empty(l.walltime),
            min_nodes: (l.min_nodes > 0).then_some(l.min_nodes),
            max_nodes: (l.max_nodes > 0).then_some(l.max_nodes),
            metric: none_if_empty(l.metric),
            target: none_if_empty(l.target).map(serde_json::Value::String),
            scale_policy: {
                let mut p = serde_json::Map::new();
                for (k, v) in [
                    ("evaluation_interval", l.evaluation_interval),
                    ("scale_up_window", l.scale_up_window),
                    ("scale_down_window", l.scale_down_window),
                    ("cooldown", l.cooldown),
                ] {
                    if !v.is_empty() {
                        p.insert(k.to_string(), serde_json::Value::String(v));
                    }
                }
                if l.scale_down_threshold > 0.0 {
                    p.insert("scale_down_threshold".into(), serde_json::json!(l.scale_down_threshold));
                }
                (!p.is_empty()).then_some(serde_json::Value::Object(p))
            },
        }),
        preemption_class: r.preemption_class.map(i64::from),
        tags: r.tags.into_iter().collect(),
        duration: none_if_empty(r.duration),
        depends_on: r
            .depends_on
            .into_iter()
            .map(|d| DependsIn {
                reference: d.r#ref,
                condition: if d.condition.is_empty() {
                    "success".into()
                } else {
                    d.condition
                },
            })
            .collect(),
        sensitive: r.sensitive,
        checkpoint: match r.checkpoint {
            None => None,
            Some(c) => Some(lattice_control::CheckpointIn {
                port: match c.port {
                    0 => None,
                    p => Some(u16::try_from(p).map_err(|_| {
                        Status::invalid_argument(format!("checkpoint.port: {p} is not a port (1 to 65535)"))
                    })?),
                },
                strategy: c.strategy,
                estimated_minutes: c.estimated_minutes,
                mechanism: none_if_empty(c.mechanism),
            }),
        },
        connectivity: (!r.network_domain.is_empty() || !r.expose.is_empty()).then(|| lattice_control::ConnectivityIn {
            network_domain: none_if_empty(r.network_domain),
            expose: r
                .expose
                .into_iter()
                .map(|e| lattice_control::ExposeIn {
                    name: e.name,
                    port: e.port,
                    protocol: none_if_empty(e.protocol),
                })
                .collect(),
        }),
        liveness_probe: r.liveness_probe.map(|l| {
            let some = |v: u32| (v > 0).then_some(v);
            lattice_control::LivenessProbeIn {
                probe_type: l.probe_type,
                port: l.port,
                path: none_if_empty(l.path),
                period_secs: some(l.period_secs),
                initial_delay_secs: some(l.initial_delay_secs),
                failure_threshold: some(l.failure_threshold),
                timeout_secs: some(l.timeout_secs),
            }
        }),
        data: (!r.data.is_empty() || r.data_defaults.is_some()).then(|| lattice_control::DataIn {
            defaults: r.data_defaults,
            mounts: r
                .data
                .into_iter()
                .map(|m| lattice_control::MountIn {
                    source: m.source,
                    target: none_if_empty(m.target),
                    access: none_if_empty(m.access),
                    size_gb: m.size_gb,
                    tier: none_if_empty(m.tier),
                    tier_hint: none_if_empty(m.tier_hint),
                })
                .collect(),
        }),
        task_group: r.task_group.map(|t| lattice_control::TaskGroupIn {
            range: lattice_control::IndexRange {
                start: t.start,
                end: t.end,
            },
            concurrency: (t.concurrency > 0).then_some(t.concurrency),
        }),
        idempotency_key: none_if_empty(r.idempotency_key),
        environment: r.environment.map(|e| lattice_control::EnvironmentIn {
            uenv: none_if_empty(e.uenv),
            view: none_if_empty(e.view),
            image: none_if_empty(e.image),
            tools_uenv: none_if_empty(e.tools_uenv),
            sign_required: e.sign_required,
        }),
        requeue: none_if_empty(r.requeue),
        max_requeues: r.max_requeues.map(i64::from),
        mutex: none_if_empty(r.mutex),
        storage_gbps: r.storage_gbps,
    })
}

#[tonic::async_trait]
impl AllocationService for Api {
    async fn submit(&self, req: Request<pb::AllocationRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        let p = self.principal(&req)?;
        let r = from_pb(req.into_inner())?;
        let s = ops::submit(&self.shared, &p, r).await?;
        Ok(Response::new(pb::SubmitResponse {
            id: s.id,
            elements: s.elements,
        }))
    }

    async fn get(&self, req: Request<pb::GetAllocationRequest>) -> Result<Response<pb::Allocation>, Status> {
        let p = self.principal(&req)?;
        let v = ops::get_audited(&self.shared, &p, &req.into_inner().id).await?;
        Ok(Response::new(to_pb(v)))
    }

    async fn list(
        &self,
        req: Request<pb::ListAllocationsRequest>,
    ) -> Result<Response<pb::ListAllocationsResponse>, Status> {
        let p = self.principal(&req)?;
        let q = req.into_inner();
        let f = ops::ListFilter {
            tenant: none_if_empty(q.tenant),
            user: none_if_empty(q.user),
            state: none_if_empty(q.state),
            vcluster: none_if_empty(q.vcluster),
            mine: q.mine.then_some(true),
        };
        let all = ops::list(&self.shared, &p, &f).await?;
        Ok(Response::new(pb::ListAllocationsResponse {
            allocations: all.into_iter().map(to_pb).collect(),
        }))
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::CancelResponse>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        let state = ops::cancel(&self.shared, &p, &id).await?;
        Ok(Response::new(pb::CancelResponse { id, state }))
    }

    type AttachStream = tokio_stream::wrappers::ReceiverStream<Result<pb::AttachResponse, Status>>;

    async fn attach(
        &self,
        req: Request<tonic::Streaming<pb::AttachRequest>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        use lattice_adapters::peer::{AttachInput, AttachOutput};
        let p = self.principal(&req)?;
        let mut inbound = req.into_inner();
        let Some(pb::AttachRequest {
            msg: Some(pb::attach_request::Msg::Start(st)),
        }) = inbound.message().await?
        else {
            return Err(Status::invalid_argument("start: the first message must be `start`"));
        };
        let terminal = lattice_control::tasks::TerminalRequest {
            node: none_if_empty(st.node),
            command: none_if_empty(st.command),
            rows: Some(st.rows.clamp(1, u16::MAX as u32) as u16).filter(|_| st.rows > 0),
            cols: Some(st.cols.clamp(1, u16::MAX as u32) as u16).filter(|_| st.cols > 0),
            term: none_if_empty(st.term),
        };
        let id = st.allocation_id;
        let node = terminal.node.clone();
        let (start, addr, node, sensitive) =
            ops::attach_target(&self.shared, &p, &id, node.as_deref(), terminal).await?;
        // A sensitive allocation's session is opened at the quorum first: refused while another is.
        let rec = if sensitive {
            Some(ops::open_sensitive_session(&self.shared, &p, &id, &node, (start.rows, start.cols)).await?)
        } else {
            None
        };
        let (in_tx, in_rx) = tokio::sync::mpsc::channel(64);
        let mut out = match lattice_adapters::peer::attach(&addr, start, in_rx).await {
            Ok(o) => o,
            Err(e) => {
                if let Some(rec) = &rec {
                    ops::audit_attach(&self.shared, &p, &id, &node, "attach_end (node unreachable)", rec).await;
                }
                return Err(Status::unavailable(e.to_string()));
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let shared = self.shared.clone();
        let open = crate::metrics::StreamGuard::open(&shared.metrics, "attach");
        tokio::spawn(async move {
            let _open = open;
            let mut how = "client left";
            let mut leading = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tokio::select! {
                    // The token it was opened with expired: the session ends.
                    _ = p.token_expired() => {
                        how = "token expired";
                        let _ = tx.send(Err(Status::unauthenticated("token expired"))).await;
                        break;
                    }
                    // A sensitive session lives on the leader: it ends when this member stops leading.
                    _ = leading.tick(), if sensitive => {
                        if ops::session_must_end(&shared, sensitive) {
                            how = "leader changed";
                            let _ = tx.send(Err(Status::unavailable("the control plane's leader changed: attach again"))).await;
                            break;
                        }
                    }
                    m = inbound.message() => match m {
                        Ok(Some(pb::AttachRequest { msg: Some(m) })) => {
                            let i = match m {
                                pb::attach_request::Msg::Stdin(b) => {
                                    if let Some(r) = &rec {
                                        r.input(&b);
                                    }
                                    AttachInput::Stdin(b)
                                }
                                pb::attach_request::Msg::Resize(r) => AttachInput::Resize {
                                    rows: r.rows.min(u16::MAX as u32) as u16,
                                    cols: r.cols.min(u16::MAX as u32) as u16,
                                },
                                pb::attach_request::Msg::Signal(s) => AttachInput::Signal(s),
                                pb::attach_request::Msg::Start(_) => continue,
                            };
                            if in_tx.send(i).await.is_err() {
                                break;
                            }
                        }
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    },
                    o = out.recv() => {
                        let (msg, end) = match o {
                            Some(AttachOutput::Stdout(b)) => {
                                if let Some(r) = &rec {
                                    r.output(&b);
                                }
                                (pb::attach_response::Msg::Stdout(b), false)
                            }
                            Some(AttachOutput::Exit(c)) => {
                                how = "exited";
                                (pb::attach_response::Msg::ExitCode(c), true)
                            }
                            Some(AttachOutput::Error(e)) => {
                                how = "node lost";
                                (pb::attach_response::Msg::Error(e), true)
                            }
                            None => break,
                        };
                        if tx.send(Ok(pb::AttachResponse { msg: Some(msg) })).await.is_err() || end {
                            break;
                        }
                    }
                }
            }
            drop(in_tx);
            if let Some(rec) = &rec {
                ops::audit_attach(&shared, &p, &id, &node, &format!("attach_end ({how})"), rec).await;
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    type WatchStream = tokio_stream::wrappers::ReceiverStream<Result<pb::Allocation, Status>>;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        let first = ops::get(&self.shared, &p, &id).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut last = String::new();
            let mut view = Ok(first);
            loop {
                match view {
                    Ok(v) => {
                        let done = v.ended_ms.is_some();
                        if v.state != last {
                            last = v.state.clone();
                            if tx.send(Ok(to_pb(v))).await.is_err() {
                                return;
                            }
                        }
                        if done {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                if p.stream_deadline().is_some_and(|d| tokio::time::Instant::now() >= d) {
                    // The token it was opened with expired.
                    let _ = tx.send(Err(Status::unauthenticated("token expired"))).await;
                    return;
                }
                view = ops::get(&shared, &p, &id).await;
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn update(&self, req: Request<pb::UpdateRequest>) -> Result<Response<pb::Allocation>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let u = UpdateRequest {
            walltime: none_if_empty(r.walltime),
            tags: r.tags.into_iter().collect(),
            telemetry: none_if_empty(r.telemetry_mode).map(|mode| TelemetryIn { mode, duration: None }),
        };
        let v = ops::update(&self.shared, &p, &r.id, &u).await?;
        Ok(Response::new(to_pb(v)))
    }

    async fn checkpoint(
        &self,
        req: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::CheckpointResponse>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        let checkpoints = ops::checkpoint(&self.shared, &p, &id).await?;
        Ok(Response::new(pb::CheckpointResponse { id, checkpoints }))
    }

    async fn submit_dag(&self, req: Request<pb::SubmitDagRequest>) -> Result<Response<pb::Dag>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let mut allocations = Vec::with_capacity(r.allocations.len());
        for (i, m) in r.allocations.into_iter().enumerate() {
            let request = m
                .request
                .ok_or_else(|| Status::invalid_argument(format!("allocations[{i}].request: required")))?;
            allocations.push(ops::DagMember {
                name: m.name,
                request: from_pb(request)?,
            });
        }
        let dag = ops::DagRequest {
            id: none_if_empty(r.id),
            allocations,
        };
        let (id, _) = ops::submit_dag(&self.shared, &p, dag).await?;
        let (state, members) = ops::dag(&self.shared, &p, &id).await?;
        Ok(Response::new(dag_pb(id, state, members)))
    }

    async fn get_dag(&self, req: Request<pb::DagRequest>) -> Result<Response<pb::Dag>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        let (state, members) = ops::dag(&self.shared, &p, &id).await?;
        Ok(Response::new(dag_pb(id, state, members)))
    }

    async fn list_dags(&self, req: Request<pb::ListDagsRequest>) -> Result<Response<pb::ListDagsResponse>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let q = ops::DagQuery {
            tenant: none_if_empty(r.tenant),
            user: none_if_empty(r.user),
            state: none_if_empty(r.state),
        };
        let dags = ops::dags(&self.shared, &p, &q).await?;
        Ok(Response::new(pb::ListDagsResponse {
            dags: dags.into_iter().map(|(id, st, m)| dag_pb(id, st, m)).collect(),
        }))
    }

    async fn cancel_dag(&self, req: Request<pb::DagRequest>) -> Result<Response<pb::CancelDagResponse>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        let n = ops::cancel_dag(&self.shared, &p, &id).await?;
        Ok(Response::new(pb::CancelDagResponse {
            id,
            cancelled: n as u32,
        }))
    }
}

#[tonic::async_trait]
impl NodeService for Api {
    async fn list(&self, req: Request<pb::ListNodesRequest>) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.principal(&req)?;
        let r = req.into_inner();
        let q = ops::NodeQuery {
            state: none_if_empty(r.state),
            vcluster: none_if_empty(r.vcluster),
            tenant: none_if_empty(r.tenant),
        };
        Ok(Response::new(pb::ListNodesResponse {
            nodes: ops::nodes(&self.shared, &q).await?.into_iter().map(node_pb).collect(),
        }))
    }

    async fn get(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        self.principal(&req)?;
        Ok(Response::new(node_pb(
            ops::node(&self.shared, &req.into_inner().id).await?,
        )))
    }

    async fn drain(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        if r.urgent {
            ops::drain_urgent(&self.shared, &p, &r.id).await?;
        } else {
            ops::set_drain(&self.shared, &p, &r.id, true).await?;
        }
        Ok(Response::new(node_pb(ops::node(&self.shared, &r.id).await?)))
    }

    async fn register(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.agent_principal(&req)?;
        let id = req.into_inner().id;
        ops::register(&self.shared, &p, &id, None, None).await?;
        Ok(Response::new(node_pb(ops::node(&self.shared, &id).await?)))
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.agent_principal(&req)?;
        let h = req.into_inner();
        // 1,000 heartbeats a second at 10,000 agents: answer with the node's state only.
        let (state, _) = ops::heartbeat(&self.shared, &p, &h.id, &buffered(&h), (h.seq, None)).await?;
        Ok(Response::new(pb::Node {
            name: h.id,
            state,
            ..Default::default()
        }))
    }

    async fn heartbeat_stream(
        &self,
        req: Request<tonic::Streaming<pb::HeartbeatRequest>>,
    ) -> Result<Response<pb::HeartbeatSummary>, Status> {
        let p = self.agent_principal(&req)?;
        let mut stream = req.into_inner();
        let mut accepted = 0;
        while let Some(h) = stream.message().await? {
            ops::heartbeat(&self.shared, &p, &h.id, &buffered(&h), (h.seq, None)).await?;
            accepted += 1;
        }
        Ok(Response::new(pb::HeartbeatSummary { accepted }))
    }

    async fn undrain(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        ops::set_drain(&self.shared, &p, &id, false).await?;
        Ok(Response::new(node_pb(ops::node(&self.shared, &id).await?)))
    }

    async fn disable(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        ops::node_op(&self.shared, &p, &id, NodeOp::Disable).await?;
        Ok(Response::new(node_pb(ops::node(&self.shared, &id).await?)))
    }

    async fn enable(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        ops::node_op(&self.shared, &p, &id, NodeOp::Enable).await?;
        Ok(Response::new(node_pb(ops::node(&self.shared, &id).await?)))
    }
}

#[tonic::async_trait]
impl AdminService for Api {
    async fn raft_status(
        &self,
        req: Request<pb::RaftStatusRequest>,
    ) -> Result<Response<pb::RaftStatusResponse>, Status> {
        self.principal(&req)?;
        let st = self.shared.member.status();
        let q = self.shared.member.state().await;
        Ok(Response::new(pb::RaftStatusResponse {
            id: st.id,
            state: st.state,
            term: st.term,
            leader: st.leader,
            members: st.members.into_iter().collect(),
            assignments: q.assignments.len() as u64,
            commits: q.commits,
            rejections: q.rejections,
            audit_entries: q.audit_total(),
            audit_chain_valid: q.verify_audit().is_ok(),
        }))
    }

    async fn list_tenants(
        &self,
        req: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        self.principal(&req)?;
        let tenants = self.shared.control.lock().await.tenant_names();
        Ok(Response::new(pb::ListTenantsResponse { tenants }))
    }

    async fn list_v_clusters(
        &self,
        req: Request<pb::ListVClustersRequest>,
    ) -> Result<Response<pb::ListVClustersResponse>, Status> {
        self.principal(&req)?;
        let vclusters = self.shared.control.lock().await.vcluster_names();
        Ok(Response::new(pb::ListVClustersResponse { vclusters }))
    }

    async fn queue(&self, req: Request<pb::QueueRequest>) -> Result<Response<pb::QueueResponse>, Status> {
        let p = self.principal(&req)?;
        let q = ops::queue(&self.shared, &p, &req.into_inner().vcluster).await?;
        Ok(Response::new(pb::QueueResponse {
            allocations: q.into_iter().map(|a| a.id).collect(),
        }))
    }

    async fn set_weights(
        &self,
        req: Request<pb::SetWeightsRequest>,
    ) -> Result<Response<pb::SetWeightsResponse>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let w = r.weights.unwrap_or_default();
        let map: std::collections::BTreeMap<String, f64> = ops::WEIGHT_NAMES
            .iter()
            .zip([
                w.priority,
                w.wait_time,
                w.fair_share,
                w.topology,
                w.data_readiness,
                w.backlog,
                w.energy,
                w.checkpoint_efficiency,
                w.conformance,
            ])
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        ops::set_weights(&self.shared, &p, &r.vcluster, &map).await?;
        Ok(Response::new(pb::SetWeightsResponse { vcluster: r.vcluster }))
    }

    async fn backup(&self, req: Request<pb::BackupRequest>) -> Result<Response<pb::BackupResponse>, Status> {
        let p = self.principal(&req)?;
        let name = req.into_inner().name;
        let b = ops::backup(&self.shared, &p, Some(&name)).await?;
        Ok(Response::new(pb::BackupResponse {
            path: b.path.display().to_string(),
            last_applied: b.backup.data.last_applied.map_or(0, |l| l.index),
            sha256: b.backup.sha256,
        }))
    }

    async fn verify_backup(
        &self,
        req: Request<pb::VerifyBackupRequest>,
    ) -> Result<Response<pb::VerifyBackupResponse>, Status> {
        let p = self.principal(&req)?;
        if !p.is_admin() {
            return Err(Status::permission_denied("forbidden: backups need SystemAdmin"));
        }
        let name = req.into_inner().name;
        if name.is_empty() || name.contains('/') || name.contains("..") {
            return Err(Status::invalid_argument(
                "name: a backup's file name under the backup directory",
            ));
        }
        let path = self
            .shared
            .data_dir
            .join("backups")
            .join(format!("{}.json", name.trim_end_matches(".json")));
        let r = lattice_adapters::raft_store::Backup::read_verified(&path);
        Ok(Response::new(match r {
            Ok(b) => pb::VerifyBackupResponse {
                ok: true,
                detail: format!("{}: sha256 {}", path.display(), b.sha256),
            },
            Err(e) => pb::VerifyBackupResponse { ok: false, detail: e },
        }))
    }

    async fn query_audit(
        &self,
        req: Request<pb::AuditQueryRequest>,
    ) -> Result<Response<pb::AuditQueryResponse>, Status> {
        let p = self.principal(&req)?;
        let q = audit_query(req.into_inner());
        let (entries, chain_valid) = ops::audit(&self.shared, &p, &q).await?;
        Ok(Response::new(pb::AuditQueryResponse {
            entries: entries
                .into_iter()
                .map(|e| pb::AuditEntry {
                    seq: e.seq,
                    at_ms: e.at_ms,
                    user: e.user,
                    allocation: e.alloc,
                    action: e.action,
                    detail: e.detail,
                    hash: e.hash,
                    prev: e.prev,
                    key: e.key,
                    sig: e.sig,
                })
                .collect(),
            chain_valid,
        }))
    }

    async fn create_tenant(
        &self,
        req: Request<pb::TenantWriteRequest>,
    ) -> Result<Response<pb::TenantResponse>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let w = ops::put_tenant(&self.shared, &p, &r.name, &tenant_body(&r), true).await?;
        Ok(Response::new(tenant_answer(&r.name, w)))
    }

    async fn update_tenant(
        &self,
        req: Request<pb::TenantWriteRequest>,
    ) -> Result<Response<pb::TenantResponse>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        let w = ops::put_tenant(&self.shared, &p, &r.name, &tenant_body(&r), false).await?;
        Ok(Response::new(tenant_answer(&r.name, w)))
    }

    async fn delete_tenant(
        &self,
        req: Request<pb::TenantRequest>,
    ) -> Result<Response<pb::DeleteTenantResponse>, Status> {
        let p = self.principal(&req)?;
        let name = req.into_inner().name;
        ops::delete_tenant(&self.shared, &p, &name).await?;
        Ok(Response::new(pb::DeleteTenantResponse { name }))
    }

    async fn list_projects(
        &self,
        req: Request<pb::TenantRequest>,
    ) -> Result<Response<pb::ListProjectsResponse>, Status> {
        let p = self.principal(&req)?;
        let tenant = req.into_inner().name;
        let wide = p.can_operate() || p.has(crate::auth::Role::ReadOnly);
        if !wide && p.tenant.as_deref() != Some(tenant.as_str()) {
            return Err(ops::forbidden("another tenant's quotas and usage").into());
        }
        let view = self.shared.control.lock().await.tenant_view(&tenant);
        let Some(v) = view else {
            return Err(Status::not_found(format!("name: no tenant {tenant}")));
        };
        let projects = v["projects"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| project_answer(p, None))
            .collect();
        Ok(Response::new(pb::ListProjectsResponse { projects }))
    }

    async fn create_project(
        &self,
        req: Request<pb::ProjectWriteRequest>,
    ) -> Result<Response<pb::ProjectResponse>, Status> {
        self.write_project(req, true).await
    }

    async fn update_project(
        &self,
        req: Request<pb::ProjectWriteRequest>,
    ) -> Result<Response<pb::ProjectResponse>, Status> {
        self.write_project(req, false).await
    }

    async fn delete_project(
        &self,
        req: Request<pb::ProjectRequest>,
    ) -> Result<Response<pb::DeleteProjectResponse>, Status> {
        let p = self.principal(&req)?;
        let r = req.into_inner();
        ops::delete_project(&self.shared, &p, &r.tenant, &r.name).await?;
        Ok(Response::new(pb::DeleteProjectResponse {
            tenant: r.tenant,
            name: r.name,
        }))
    }

    async fn list_services(
        &self,
        req: Request<pb::ListServicesRequest>,
    ) -> Result<Response<pb::ListServicesResponse>, Status> {
        let p = self.principal(&req)?;
        let asked = req.metadata().get("x-lattice-tenant").and_then(|v| v.to_str().ok());
        let all = ops::services(&self.shared, &p, asked).await?;
        Ok(Response::new(pb::ListServicesResponse {
            names: all.into_keys().collect(),
        }))
    }

    async fn lookup_service(
        &self,
        req: Request<pb::LookupServiceRequest>,
    ) -> Result<Response<pb::LookupServiceResponse>, Status> {
        let p = self.principal(&req)?;
        let asked = req
            .metadata()
            .get("x-lattice-tenant")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let name = req.into_inner().name;
        let mut all = ops::services(&self.shared, &p, asked.as_deref()).await?;
        let endpoints = all
            .remove(&name)
            .ok_or_else(|| Status::not_found(format!("no service {name}")))?;
        Ok(Response::new(pb::LookupServiceResponse {
            name,
            endpoints: endpoints
                .into_iter()
                .map(|e| pb::ServiceEndpoint {
                    allocation: e.allocation,
                    tenant: e.tenant,
                    node: e.node,
                    host: e.host,
                    port: u32::from(e.port),
                    protocol: e.protocol,
                })
                .collect(),
        }))
    }

    async fn usage(&self, req: Request<pb::UsageRequest>) -> Result<Response<pb::UsageResponse>, Status> {
        let p = self.principal(&req)?;
        let q = usage_query(req.into_inner());
        let u = ops::usage(&self.shared, &p, &q).await?;
        Ok(Response::new(pb::UsageResponse {
            allocations: u.allocations,
            node_hours: u.node_hours,
            gpu_hours: u.gpu_hours,
            since_ms: u.since_ms,
            until_ms: u.until_ms,
        }))
    }
}
