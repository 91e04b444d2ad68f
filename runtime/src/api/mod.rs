//! The REST API (axum): the seed's `/v1/...` paths with JSON bodies for curl and the Python users,
//! `/healthz`, Prometheus `/metrics`, and the quorum's status at `/api/v1/raft/status`. Writes are
//! served by the quorum leader; a follower answers 421 with the leader's id and URL so clients can
//! redirect, and forwards reads to the leader (`forward`).
//! Bad requests get 400 with `{"error", "field"}` naming the field.

mod admin;
mod allocations;
mod common;
mod docs;
mod forward;
mod nodes;
mod observe;
mod terminal;

use crate::auth::Refusal;
use crate::context::Shared;
use admin::*;
use allocations::*;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use common::*;
use nodes::*;
use observe::*;
use serde_json::{Value, json};
use std::sync::Arc;
use terminal::*;

pub use docs::documented;

/// `GET /openapi.json`.
async fn openapi() -> Json<Value> {
    Json(crate::openapi::document(&documented()))
}

pub fn router(shared: Arc<Shared>) -> Router {
    let open = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/api/v1/auth/discovery", get(auth_discovery));
    let guarded = Router::new()
        .route("/v1/allocations", get(list).post(submit))
        .route("/v1/allocations/{id}", get(get_one).delete(cancel).patch(update))
        .route("/v1/allocations/{id}/checkpoint", axum::routing::post(checkpoint))
        .route("/v1/allocations/{id}/tasks", get(list_tasks).post(launch_tasks))
        .route("/v1/allocations/{id}/tasks/{launch}", get(get_task))
        .route("/v1/allocations/{id}/attach", get(attach).post(attach))
        .route("/v1/sessions", axum::routing::post(create_session))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route("/v1/sessions/{id}/terminal", get(session_terminal))
        .route("/v1/dags", get(list_dags).post(submit_dag))
        .route("/v1/dags/{id}", get(get_dag).delete(cancel_dag))
        .route("/v1/dags/{id}/graph", get(dag_graph))
        .route("/v1/accounting", get(accounting))
        .route("/v1/nodes", get(nodes))
        .route("/v1/cache", get(cache_list))
        .route("/v1/cache/warm", axum::routing::post(cache_warm))
        .route("/v1/cache/evict", axum::routing::post(cache_evict))
        .route("/v1/nodes/{id}", get(node))
        .route("/v1/nodes/{id}/register", axum::routing::post(register))
        .route("/v1/nodes/{id}/heartbeat", axum::routing::post(heartbeat))
        .route("/v1/nodes/{id}/drain", axum::routing::post(drain))
        .route("/v1/nodes/{id}/undrain", axum::routing::post(undrain))
        .route("/v1/nodes/{id}/work", axum::routing::post(work))
        .route("/v1/allocations/{id}/exit", axum::routing::post(agent_exit))
        .route("/v1/allocations/{id}/logs", get(logs))
        .route("/v1/allocations/{id}/logs/live", get(live_logs))
        .route("/v1/allocations/{id}/logs/stream", get(stream_logs))
        .route("/v1/allocations/{id}/metrics", get(alloc_metrics))
        .route("/v1/allocations/{id}/metrics/stream", get(stream_metrics))
        .route("/v1/allocations/{id}/diagnostics", get(diagnostics))
        .route("/v1/allocations/{id}/diagnostics/{part}", get(diagnostics_part))
        .route("/v1/compare", get(compare))
        .route("/v1/network/domains", get(network_domains))
        .route("/v1/nodes/{id}/fingerprint", axum::routing::post(ask_fingerprint))
        .route("/v1/nodes/{id}/disable", axum::routing::post(disable))
        .route("/v1/nodes/{id}/enable", axum::routing::post(enable))
        .route("/v1/nodes/{id}/wipe", axum::routing::post(retry_wipe))
        .route("/v1/audit/logs", get(audit_logs))
        .route("/v1/audit/export", get(audit_export))
        .route("/api/v1/audit", get(audit_logs))
        .route("/api/v1/tenants/{id}/usage", get(tenant_usage))
        .route("/api/v1/usage", get(usage))
        .route("/v1/tenants", get(tenants))
        .route("/v1/tenants/{id}", get(tenant))
        .route("/api/v1/tenants", axum::routing::post(create_tenant))
        .route(
            "/api/v1/tenants/{id}",
            get(tenant).put(update_tenant).delete(delete_tenant),
        )
        .route("/api/v1/tenants/{id}/projects", get(projects).post(create_project))
        .route(
            "/api/v1/tenants/{id}/projects/{project}",
            get(project).put(update_project).delete(delete_project),
        )
        .route("/api/v1/admin/log", get(admin_log))
        .route("/api/v1/admin/accounting", get(accounting_status))
        .route(
            "/api/v1/admin/accounting/reconcile",
            axum::routing::post(accounting_reconcile),
        )
        .route("/v1/config", get(settings).patch(put_settings))
        .route("/v1/vclusters", get(vclusters).post(create_vcluster))
        .route("/v1/vclusters/{id}", get(vcluster).patch(configure_vcluster))
        .route("/v1/vclusters/{id}/queue", get(queue))
        .route("/v1/vclusters/{id}/weights", put(set_weights))
        .route("/api/v1/services", get(services))
        .route("/api/v1/services/{name}", get(service))
        .route("/api/v1/raft/status", get(raft_status))
        .route("/v1/admin/raft/status", get(raft_status))
        .route("/api/v1/admin/backup", axum::routing::post(backup))
        .route("/api/v1/admin/backup/verify", get(verify_backup))
        .route("/api/v1/admin/restore", axum::routing::post(restore))
        .route("/api/v1/admin/members", axum::routing::post(add_member))
        .route("/api/v1/admin/members/{id}", axum::routing::delete(remove_member));
    #[cfg(feature = "federation")]
    let (open, guarded) = (
        open.merge(crate::federation::api::peer_routes()),
        crate::federation::api::user_routes(guarded),
    );
    let guarded = guarded.layer(axum::middleware::from_fn_with_state(shared.clone(), authenticate));
    open.merge(guarded)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            forward::forward_reads,
        ))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), count_request))
        .with_state(shared)
}

/// Every request: `lattice_api_requests_total{method, status}` and its latency by method (refusals
/// of the authentication layer included; a WebSocket upgrade counts when it is answered).
async fn count_request(State(s): S, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = req.method().as_str().to_string();
    let t0 = std::time::Instant::now();
    let r = next.run(req).await;
    s.metrics
        .api_requests
        .with_label_values(&[method.as_str(), r.status().as_str()])
        .inc();
    s.metrics
        .api_duration
        .with_label_values(&[method.as_str()])
        .observe(t0.elapsed().as_secs_f64());
    r
}

/// Every `/v1` and `/api/v1` request: a valid bearer token (401 otherwise) within the user's rate limit
/// (429 with Retry-After); the principal goes to the handler.
async fn authenticate(State(s): S, mut req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let path = req.uri().path();
    let checked = if forward::agent_call(path) {
        let cn = req.extensions().get::<crate::tls::PeerCn>().map(|c| c.0.as_str());
        s.auth.check_agent(header, cn)
    } else {
        s.auth.check(header)
    };
    match checked {
        Ok(p) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(Refusal::Unauthenticated(why)) => (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            Json(json!({"error": why})),
        )
            .into_response(),
        Err(Refusal::RateLimited(secs)) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(axum::http::header::RETRY_AFTER, secs.to_string())],
            Json(json!({"error": "rate limit exceeded", "retry_after_s": secs})),
        )
            .into_response(),
    }
}
