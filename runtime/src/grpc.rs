//! The public gRPC API (tonic/prost, `proto/lattice/v1/*.proto`): AllocationService (submit, get,
//! list, cancel, watch), NodeService (list, get, drain, undrain) and AdminService (raft status), served
//! on the member's gRPC port next to the quorum's Raft service. Every call goes through the same
//! operations as REST ([`crate::ops`]); the bearer token travels in the `authorization` metadata.

use crate::auth::{Principal, Refusal};
use crate::control::{AllocationView, LifecycleIn, NodeView, NodesIn, Resources, SubmitRequest};
use crate::ops::{self, ApiError};
use crate::server::Shared;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub mod pb {
    tonic::include_proto!("lattice.v1");
}

use pb::admin_service_server::AdminService;
use pb::allocation_service_server::AllocationService;
use pb::node_service_server::NodeService;

/// gRPC status codes for the API's refusals; the field travels in the message.
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
            ApiError::NotLeader { leader_id, leader } => Status::failed_precondition(format!(
                "not the quorum leader (leader {}, {})",
                leader_id.map_or("unknown".into(), |l| l.to_string()),
                leader.unwrap_or_default()
            )),
        }
    }
}

#[derive(Clone)]
pub struct Api {
    pub shared: Arc<Shared>,
}

impl Api {
    fn principal<T>(&self, req: &Request<T>) -> Result<Principal, Status> {
        let header = req.metadata().get("authorization").and_then(|v| v.to_str().ok());
        self.shared.auth.check(header).map_err(|r| match r {
            Refusal::Unauthenticated(why) => Status::unauthenticated(why),
            Refusal::RateLimited(secs) => {
                Status::resource_exhausted(format!("rate limit exceeded; retry after {secs} s"))
            }
        })
    }
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
    }
}

fn none_if_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// The protobuf request as the API's request (the same validation follows).
fn from_pb(r: pb::AllocationRequest) -> Result<SubmitRequest, Status> {
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
    let constraints = (!res.gpu_type.is_empty() || res.gpu_count > 0 || !res.features.is_empty()).then(|| {
        crate::control::ConstraintsIn {
            gpu_type: none_if_empty(res.gpu_type),
            gpu_count: (res.gpu_count > 0).then_some(res.gpu_count),
            features: res.features,
            topology: None,
        }
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
        }),
        preemption_class: r.preemption_class.map(i64::from),
        tags: r.tags.into_iter().collect(),
        duration: none_if_empty(r.duration),
        depends_on: Vec::new(),
    })
}

#[tonic::async_trait]
impl AllocationService for Api {
    async fn submit(&self, req: Request<pb::AllocationRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        let p = self.principal(&req)?;
        let r = from_pb(req.into_inner())?;
        let id = ops::submit(&self.shared, &p, r).await?;
        Ok(Response::new(pb::SubmitResponse { id }))
    }

    async fn get(&self, req: Request<pb::GetAllocationRequest>) -> Result<Response<pb::Allocation>, Status> {
        let p = self.principal(&req)?;
        let v = ops::get(&self.shared, &p, &req.into_inner().id).await?;
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
        };
        let all = ops::list(&self.shared, &p, &f).await;
        Ok(Response::new(pb::ListAllocationsResponse {
            allocations: all.into_iter().map(to_pb).collect(),
        }))
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::CancelResponse>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        ops::cancel(&self.shared, &p, &id).await?;
        Ok(Response::new(pb::CancelResponse {
            id,
            state: "cancelled".into(),
        }))
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
                view = ops::get(&shared, &p, &id).await;
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

#[tonic::async_trait]
impl NodeService for Api {
    async fn list(&self, req: Request<pb::ListNodesRequest>) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.principal(&req)?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: ops::nodes(&self.shared).await.into_iter().map(node_pb).collect(),
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
        let id = req.into_inner().id;
        ops::set_drain(&self.shared, &p, &id, true).await?;
        Ok(Response::new(node_pb(ops::node(&self.shared, &id).await?)))
    }

    async fn register(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        ops::register(&self.shared, &p, &id).await?;
        Ok(Response::new(node_pb(ops::node(&self.shared, &id).await?)))
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.principal(&req)?;
        let h = req.into_inner();
        ops::heartbeat(&self.shared, &p, &h.id, h.seq).await?;
        Ok(Response::new(node_pb(ops::node(&self.shared, &h.id).await?)))
    }

    async fn undrain(&self, req: Request<pb::NodeRequest>) -> Result<Response<pb::Node>, Status> {
        let p = self.principal(&req)?;
        let id = req.into_inner().id;
        ops::set_drain(&self.shared, &p, &id, false).await?;
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
            audit_entries: q.audit.len() as u64,
            audit_chain_valid: q.verify_audit().is_ok(),
        }))
    }
}
