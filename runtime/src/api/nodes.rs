//! Nodes and their agents: listing, register, heartbeat, work polls and exits, drain/disable,
//! wipes, fingerprints, the image cache and network domains.

use super::common::*;
use crate::auth::Principal;
use crate::context::Shared;
use crate::ops;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use lattice_agent_protocol::{ExitReport, HeartbeatBody, RegisterBody, WorkPoll};
use lattice_control::NodeOp;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

pub(super) async fn nodes(State(s): S, QueryIn(q): QueryIn<ops::NodeQuery>) -> Response {
    match ops::nodes(&s, &q).await {
        Ok(nodes) => Json(json!({ "nodes": nodes })).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn node(State(s): S, Path(id): Path<String>) -> Response {
    match ops::node(&s, &id).await {
        Ok(n) => Json(n).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn register(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let r: RegisterBody = if body.is_empty() {
        RegisterBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return body_error(e),
        }
    };
    match ops::register_with(&s, &p, &id, r.fingerprint, r.capabilities, r.peer).await {
        Ok(state) => Json(json!({"node": id, "state": state})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn heartbeat(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let h: HeartbeatBody = match serde_json::from_slice(&body) {
        Ok(h) => h,
        Err(e) => return body_error(e),
    };
    match ops::heartbeat(&s, &p, &id, &h.buffered, (h.seq, h.rtt_ms)).await {
        Ok((state, lease_ms)) => Json(json!({
            "node": id, "state": state, "seq": h.seq, "buffered": h.buffered.len(), "lease_ms": lease_ms
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/nodes/{id}/drain`'s parameters.
#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainQuery {
    /// `true`: the allocation on it is asked to checkpoint now (`lattice node drain NODE --urgent`).
    urgent: Option<bool>,
}

pub(super) async fn drain(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<DrainQuery>,
) -> Response {
    if q.urgent == Some(true) {
        return answer(ops::drain_urgent(&s, &p, &id).await);
    }
    set_drain(s, p, id, true).await
}

pub(super) async fn undrain(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    set_drain(s, p, id, false).await
}

pub(super) async fn disable(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    node_op(s, p, id, NodeOp::Disable).await
}

pub(super) async fn enable(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    node_op(s, p, id, NodeOp::Enable).await
}

/// `POST /v1/nodes/{id}/wipe`'s body.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WipeIn {
    /// Required `true`: the node is wiped again (`lattice admin node wipe NODE --force`).
    #[serde(default)]
    force: bool,
}

pub(super) async fn retry_wipe(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let w: WipeIn = if body.is_empty() {
        WipeIn { force: false }
    } else {
        match serde_json::from_slice(&body) {
            Ok(w) => w,
            Err(e) => return body_error(e),
        }
    };
    match ops::retry_wipe(&s, &p, &id, w.force).await {
        Ok(claim) => (
            StatusCode::ACCEPTED,
            Json(json!({"node": id, "claim": claim, "wiping": true})),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn set_drain(s: Arc<Shared>, p: Principal, id: String, drain: bool) -> Response {
    node_op(s, p, id, if drain { NodeOp::Drain } else { NodeOp::Undrain }).await
}

pub(super) async fn node_op(s: Arc<Shared>, p: Principal, id: String, op: NodeOp) -> Response {
    match ops::node_op(&s, &p, &id, op).await {
        Ok(state) => Json(json!({"node": id, "state": state})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn work(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    match serde_json::from_slice::<WorkPoll>(&body) {
        Ok(w) => answer(ops::work_poll(&s, &p, &id, w).await),
        Err(e) => body_error(e),
    }
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CacheQuery {
    node: Option<String>,
}

/// `GET /v1/cache[?node=]`: each node's cached images, orders not yet handed out and recent outcomes.
pub(super) async fn cache_list(State(s): S, Extension(p): P, QueryIn(q): QueryIn<CacheQuery>) -> Response {
    match ops::cache_list(&s, &p, q.node.as_deref()).await {
        Ok(v) => Json(json!({"nodes": v})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn cache_order(s: S, p: P, op: &str, body: axum::body::Bytes) -> Response {
    let (State(s), Extension(p)) = (s, p);
    let req: lattice_control::cache::CacheRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::cache_order(&s, &p, op, &req).await {
        Ok(nodes) => (
            StatusCode::ACCEPTED,
            Json(json!({"op": op, "image": req.image, "nodes": nodes})),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/cache/warm {"image", "nodes"|"group", "sticky"}` (operators): the nodes' agents pull it.
pub(super) async fn cache_warm(s: S, p: P, body: axum::body::Bytes) -> Response {
    cache_order(s, p, "warm", body).await
}

/// `POST /v1/cache/evict {"image", "nodes"|"group"}` (operators): unless a running allocation has it
/// mounted.
pub(super) async fn cache_evict(s: S, p: P, body: axum::body::Bytes) -> Response {
    cache_order(s, p, "evict", body).await
}

pub(super) async fn agent_exit(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    match serde_json::from_slice::<ExitReport>(&body) {
        Ok(x) => answer(ops::exit_report(&s, &p, &id, &x).await),
        Err(e) => body_error(e),
    }
}

pub(super) async fn ask_fingerprint(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::ask_fingerprint(&s, &p, &id).await {
        Ok(()) => (
            StatusCode::ACCEPTED,
            Json(json!({"node": id, "fingerprint": "requested"})),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/network/domains`: the network domains (operators and admins see every tenant's, others
/// their tenant's) and the VNI pool.
pub(super) async fn network_domains(State(s): S, Extension(p): P) -> Response {
    Json(ops::network_domains(&s, &p).await).into_response()
}
