//! The API's operations, independent of the transport: REST ([`crate::api`]) and gRPC
//! ([`crate::grpc`]) both call these, so validation, authorization and tenant scoping are one code.

use crate::auth::Principal;
use crate::control::{AllocationView, NodeView, SubmitRequest};
use crate::server::{Shared, release};
use std::sync::Arc;

/// Why an operation was refused; each transport maps it to its status codes.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    BadRequest {
        field: String,
        message: String,
    },
    Forbidden {
        field: Option<String>,
        message: String,
    },
    /// Absent — or invisible to the caller (no existence leak across tenants).
    NotFound {
        field: String,
        message: String,
    },
    /// Writes go to the leader.
    NotLeader {
        leader_id: Option<u64>,
        leader: Option<String>,
    },
}

impl ApiError {
    pub fn message(&self) -> String {
        match self {
            ApiError::BadRequest { message, .. }
            | ApiError::Forbidden { message, .. }
            | ApiError::NotFound { message, .. } => message.clone(),
            ApiError::NotLeader { .. } => "not the quorum leader".into(),
        }
    }

    pub fn field(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { field, .. } | ApiError::NotFound { field, .. } => Some(field),
            ApiError::Forbidden { field, .. } => field.as_deref(),
            ApiError::NotLeader { .. } => None,
        }
    }
}

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

/// Queues an allocation for the caller; its id.
pub async fn submit(s: &Shared, p: &Principal, mut req: SubmitRequest) -> Result<String, ApiError> {
    leader_only(s)?;
    if !p.can_submit_for(&req.tenant) {
        return Err(ApiError::Forbidden {
            field: Some("tenant".into()),
            message: format!("{} may not submit for tenant {}", p.user, req.tenant),
        });
    }
    if !p.is_admin() || req.user.is_none() {
        // The submitter is the token's subject.
        req.user = Some(p.user.clone());
    }
    let r = s.control.lock().await.submit(req);
    let id = r.map_err(|e| ApiError::BadRequest {
        field: e.field,
        message: e.message,
    })?;
    s.metrics.submitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    s.wake.notify_one();
    Ok(id)
}

pub async fn get(s: &Shared, p: &Principal, id: &str) -> Result<AllocationView, ApiError> {
    let c = s.control.lock().await;
    c.id_of(id)
        .and_then(|i| c.view(i))
        .filter(|v| p.can_see(&v.tenant, v.user.as_deref()))
        .ok_or_else(|| not_found("allocation", id))
}

/// Filters of a listing (empty = any).
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct ListFilter {
    pub tenant: Option<String>,
    pub user: Option<String>,
    pub state: Option<String>,
    pub vcluster: Option<String>,
}

pub async fn list(s: &Shared, p: &Principal, q: &ListFilter) -> Vec<AllocationView> {
    let keep = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w.is_empty() || w == have);
    s.control
        .lock()
        .await
        .list()
        .into_iter()
        .filter(|a| p.can_see(&a.tenant, a.user.as_deref()))
        .filter(|a| keep(&q.tenant, &a.tenant))
        .filter(|a| keep(&q.user, a.user.as_deref().unwrap_or_default()))
        .filter(|a| keep(&q.state, &a.state))
        .filter(|a| keep(&q.vcluster, &a.vcluster))
        .collect()
}

/// Cancels; a running allocation's nodes are released at the quorum.
pub async fn cancel(s: &Arc<Shared>, p: &Principal, id: &str) -> Result<(), ApiError> {
    leader_only(s)?;
    let owner = {
        let c = s.control.lock().await;
        c.id_of(id).and_then(|i| c.view(i)).map(|v| (v.tenant, v.user))
    };
    match owner {
        Some((t, u)) if p.can_cancel(&t, u.as_deref()) => {}
        Some((t, u)) if p.can_see(&t, u.as_deref()) => {
            return Err(ApiError::Forbidden {
                field: None,
                message: "forbidden: cancelling this allocation".into(),
            });
        }
        _ => return Err(not_found("allocation", id)),
    }
    let held = s
        .control
        .lock()
        .await
        .cancel(id)
        .ok_or_else(|| not_found("allocation", id))?;
    if held {
        release(s, id.to_string()).await;
    }
    s.wake.notify_one();
    Ok(())
}

pub async fn nodes(s: &Shared) -> Vec<NodeView> {
    s.control.lock().await.nodes()
}

pub async fn node(s: &Shared, id: &str) -> Result<NodeView, ApiError> {
    nodes(s)
        .await
        .into_iter()
        .find(|n| n.name == id)
        .ok_or_else(|| not_found("node", id))
}

/// Drains (or undrains) a node; its state afterwards.
pub async fn set_drain(s: &Shared, p: &Principal, id: &str, drain: bool) -> Result<String, ApiError> {
    if !p.can_operate() {
        return Err(ApiError::Forbidden {
            field: None,
            message: "forbidden: node operations need the Operator or SystemAdmin role".into(),
        });
    }
    leader_only(s)?;
    let r = s.control.lock().await.drain(id, drain);
    let state = r.map_err(|e| {
        if e.message.starts_with("no node") {
            not_found("node", id)
        } else {
            ApiError::BadRequest {
                field: e.field,
                message: e.message,
            }
        }
    })?;
    s.wake.notify_one();
    Ok(state)
}
