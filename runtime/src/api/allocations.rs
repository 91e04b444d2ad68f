//! Allocations, DAGs, services and task launches.

use super::common::*;
use crate::ops;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use lattice_control::{SubmitRequest, UpdateRequest};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(super) async fn submit(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let req: SubmitRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::submit(&s, &p, req).await {
        Ok(answer) => (StatusCode::CREATED, Json(answer)).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn list(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::ListFilter>) -> Response {
    match ops::list(&s, &p, &q).await {
        Ok(all) => Json(json!({ "allocations": all })).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn get_one(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::get_audited(&s, &p, &id).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn cancel(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::cancel(&s, &p, &id).await {
        Ok(state) => Json(json!({"id": id, "state": state})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn submit_dag(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let req: ops::DagRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, Some("body"), e.to_string()),
    };
    match ops::submit_dag(&s, &p, req).await {
        Ok((id, members)) => {
            let m: BTreeMap<String, String> = members.into_iter().collect();
            (StatusCode::CREATED, Json(json!({"id": id, "allocations": m}))).into_response()
        }
        Err(e) => e.into_response(),
    }
}

pub(super) async fn get_dag(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::dag(&s, &p, &id).await {
        Ok((state, members)) => {
            let m: Vec<Value> = members
                .into_iter()
                .map(|(name, v)| json!({"name": name, "id": v.id, "state": v.state}))
                .collect();
            Json(json!({"id": id, "state": state, "allocations": m})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/dags/{id}/graph`: the members (name, id, state) and one edge per dependency between
/// two members, from the upstream to the dependent with its condition.
pub(super) async fn dag_graph(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    answer(ops::dag_graph(&s, &p, &id).await)
}

pub(super) async fn services(State(s): S, Extension(p): P, headers: axum::http::HeaderMap) -> Response {
    match ops::services(&s, &p, tenant_header(&headers)).await {
        Ok(all) => Json(json!({"services": all.into_keys().collect::<Vec<_>>()})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn service(
    State(s): S,
    Extension(p): P,
    headers: axum::http::HeaderMap,
    Path(name): Path<String>,
) -> Response {
    match ops::services(&s, &p, tenant_header(&headers)).await {
        Ok(mut all) => match all.remove(&name) {
            Some(endpoints) => Json(json!({"name": name, "endpoints": endpoints})).into_response(),
            None => error(StatusCode::NOT_FOUND, Some("name"), format!("no service {name}")),
        },
        Err(e) => e.into_response(),
    }
}

pub(super) async fn cancel_dag(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::cancel_dag(&s, &p, &id).await {
        Ok(n) => Json(json!({"id": id, "cancelled": n})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn update(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let req: UpdateRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::update(&s, &p, &id, &req).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn checkpoint(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::checkpoint(&s, &p, &id).await {
        Ok(n) => (StatusCode::ACCEPTED, Json(json!({"id": id, "checkpoints": n}))).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn list_dags(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::DagQuery>) -> Response {
    let dags: Vec<Value> = match ops::dags(&s, &p, &q).await {
        Ok(d) => d
            .into_iter()
            .map(|(id, state, m)| {
                let first = m.first().map(|(_, v)| v);
                json!({"id": id, "state": state, "allocations": m.len(),
                       "tenant": first.map(|v| v.tenant.clone()), "user": first.and_then(|v| v.user.clone())})
            })
            .collect(),
        Err(e) => return e.into_response(),
    };
    Json(json!({ "dags": dags })).into_response()
}

/// `POST /v1/allocations/{id}/tasks`: a task launch within the running allocation (`lattice launch`).
pub(super) async fn launch_tasks(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let req: lattice_control::tasks::TaskRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::launch_tasks(&s, &p, &id, &req).await {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn list_tasks(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::task_launches(&s, &p, &id).await {
        Ok(v) => Json(json!({"launches": v})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn get_task(State(s): S, Extension(p): P, Path((id, launch)): Path<(String, String)>) -> Response {
    match ops::task_launch(&s, &p, &id, &launch).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
