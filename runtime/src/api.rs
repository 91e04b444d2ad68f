//! The REST API (axum): the seed's `/v1/...` paths with JSON bodies for curl and the Python users,
//! `/healthz`, Prometheus `/metrics`, and the quorum's status at `/api/v1/raft/status`. Writes are
//! served by the quorum leader; a follower answers 421 with the leader's id so clients can redirect.
//! Bad requests get 400 with `{"error", "field"}` naming the field.

use crate::auth::{Principal, Refusal};
use crate::control::{NodeOp, SubmitRequest, UpdateRequest};
use crate::ops::{self, ApiError};
use crate::server::Shared;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Extension, Json, Router};
use lattice_adapters::logstore::Stream;
use lattice_agent_protocol::{ExitReport, HeartbeatBody, RegisterBody, WorkPoll};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

type S = State<Arc<Shared>>;

/// Every route [`router`] serves, documented: `GET /openapi.json` (a test checks that the two agree,
/// both ways).
pub fn documented() -> Vec<crate::openapi::Op> {
    use crate::control::{AllocationView, NodeView, SubmitRequest, UpdateRequest};
    use crate::openapi::Op;
    use crate::tasks::{LaunchView, TaskRequest, TerminalRequest};
    let a = "allocations";
    let n = "nodes";
    let ops = vec![
        Op::get("/healthz", "meta", "Liveness and this member's Raft state").open(),
        Op::get("/metrics", "meta", "Prometheus metrics (text exposition format)")
            .open()
            .text(),
        Op::get("/openapi.json", "meta", "This document").open(),
        Op::get(
            "/api/v1/auth/discovery",
            "meta",
            "Where `lattice login` finds the IdP: mode, issuer, idp_url, client_id",
        )
        .open(),
        Op::get("/v1/allocations", a, "List allocations (a user sees their tenant's)")
            .query::<ops::ListFilter>()
            .answer_list::<AllocationView>("allocations"),
        Op::post(
            "/v1/allocations",
            a,
            "Submit an allocation, or a task group (its elements in `elements`)",
        )
        .body::<SubmitRequest>()
        .status(201),
        Op::get("/v1/allocations/{id}", a, "An allocation").answer::<AllocationView>(),
        Op::delete(
            "/v1/allocations/{id}",
            a,
            "Cancel an allocation (a task group: every element)",
        ),
        Op::patch(
            "/v1/allocations/{id}",
            a,
            "Extend the walltime, set tags, switch the telemetry mode",
        )
        .body::<UpdateRequest>()
        .answer::<AllocationView>(),
        Op::post(
            "/v1/allocations/{id}/checkpoint",
            a,
            "Ask the application to checkpoint",
        )
        .status(202),
        Op::get("/v1/allocations/{id}/tasks", a, "Its task launches").answer_list::<LaunchView>("launches"),
        Op::post(
            "/v1/allocations/{id}/tasks",
            a,
            "Launch tasks (ranks with a PMI server) in a running allocation",
        )
        .body::<TaskRequest>()
        .answer::<LaunchView>()
        .status(201),
        Op::get(
            "/v1/allocations/{id}/tasks/{launch}",
            a,
            "A task launch: its ranks' exit codes and output",
        )
        .answer::<LaunchView>(),
        Op::get(
            "/v1/allocations/{id}/attach",
            a,
            "A terminal in the allocation (WebSocket upgrade)",
        )
        .query::<TerminalRequest>()
        .status(101),
        Op::post(
            "/v1/allocations/{id}/attach",
            a,
            "A terminal in the allocation (WebSocket upgrade)",
        )
        .query::<TerminalRequest>()
        .status(101),
        Op::post(
            "/v1/allocations/{id}/exit",
            "agents",
            "An agent reports its process's end (agents only)",
        ),
        Op::get("/v1/allocations/{id}/logs", a, "Stored output of one stream, by node").query::<LogsIn>(),
        Op::get(
            "/v1/allocations/{id}/logs/live",
            a,
            "Live tail of one stream after the given offsets",
        )
        .query::<LiveIn>(),
        Op::get(
            "/v1/allocations/{id}/logs/stream",
            a,
            "Live log tail as Server-Sent Events: `output` events ({node, offset, data, next}) until \
             it ended and its agents' output has arrived, then one `end` event ({state})",
        )
        .query::<LiveIn>()
        .text(),
        Op::get(
            "/v1/allocations/{id}/metrics",
            a,
            "Its metrics from the TSDB: summary, per node or per GPU, over `duration` (default 5m)",
        )
        .query::<MetricsIn>(),
        Op::get(
            "/v1/allocations/{id}/metrics/stream",
            a,
            "Live metrics as Server-Sent Events at its telemetry mode's resolution (prod 30 s, debug \
             1 s): `metrics` events (per node), `alert` events, then `end` ({state}) once it ended",
        )
        .query::<MetricsIn>()
        .text(),
        Op::get(
            "/v1/allocations/{id}/diagnostics",
            a,
            "Network (nodes, dragonfly groups, VNI) and storage (mounts, QoS floor vs measured) diagnostics",
        )
        .query::<MetricsIn>(),
        Op::get(
            "/v1/allocations/{id}/diagnostics/{part}",
            a,
            "One part of the diagnostics: `network` or `storage`",
        )
        .query::<MetricsIn>(),
        Op::get(
            "/v1/compare",
            "allocations",
            "Allocations' metric series side by side, aligned to their starts",
        )
        .query::<CompareIn>(),
        Op::post(
            "/v1/sessions",
            "sessions",
            "Create an interactive session: an allocation (default 1 node, 4 h) whose work is a terminal",
        )
        .body::<ops::SessionRequest>()
        .status(201),
        Op::get("/v1/sessions/{id}", "sessions", "A session: its allocation's state").answer::<AllocationView>(),
        Op::delete(
            "/v1/sessions/{id}",
            "sessions",
            "End a session (cancels its allocation)",
        ),
        Op::get(
            "/v1/sessions/{id}/terminal",
            "sessions",
            "The session's terminal on its first node (WebSocket upgrade; as attach)",
        )
        .query::<TerminalRequest>()
        .status(101),
        Op::get("/v1/dags", "dags", "List DAGs"),
        Op::post("/v1/dags", "dags", "Submit a DAG")
            .body::<ops::DagRequest>()
            .status(201),
        Op::get("/v1/dags/{id}", "dags", "A DAG: its state and members"),
        Op::delete("/v1/dags/{id}", "dags", "Cancel every allocation of a DAG"),
        Op::get(
            "/v1/dags/{id}/graph",
            "dags",
            "A DAG's structure: its allocations and the dependency edges between them",
        ),
        Op::get(
            "/v1/accounting",
            "accounting",
            "Usage records (node-hours, GPU-hours) of each allocation in the window, and the totals",
        )
        .query::<ops::UsageQuery>()
        .answer_list::<crate::control::UsageRecord>("records"),
        Op::get("/v1/nodes", n, "List nodes")
            .query::<NodesIn>()
            .answer_list::<NodeView>("nodes"),
        Op::get("/v1/nodes/{id}", n, "A node").answer::<NodeView>(),
        Op::post(
            "/v1/nodes/{id}/register",
            "agents",
            "An agent registers its node (agents only)",
        ),
        Op::post(
            "/v1/nodes/{id}/heartbeat",
            "agents",
            "An agent's heartbeat (agents only)",
        ),
        Op::post("/v1/nodes/{id}/work", "agents", "An agent polls for work (agents only)"),
        Op::post("/v1/nodes/{id}/drain", n, "Drain a node (Operator)"),
        Op::post("/v1/nodes/{id}/undrain", n, "Undrain a node (Operator)"),
        Op::post("/v1/nodes/{id}/disable", n, "Take a node out of service (Operator)"),
        Op::post("/v1/nodes/{id}/enable", n, "Return a node to service (Operator)"),
        Op::post(
            "/v1/nodes/{id}/wipe",
            n,
            "Retry a quarantined node's secure wipe: `{\"force\": true}` (Operator); wiped, it returns to the pool",
        )
        .body::<WipeIn>()
        .status(202),
        Op::post(
            "/v1/nodes/{id}/fingerprint",
            n,
            "Ask the node's agent for a fresh conformance fingerprint",
        )
        .status(202),
        Op::get("/v1/cache", "cache", "Each node's image cache (Operator)").query::<CacheQuery>(),
        Op::post(
            "/v1/cache/warm",
            "cache",
            "Pull an image into nodes' caches, sticky (Operator)",
        )
        .body::<crate::cache::CacheRequest>()
        .status(202),
        Op::post(
            "/v1/cache/evict",
            "cache",
            "Remove an image from nodes' caches (Operator)",
        )
        .body::<crate::cache::CacheRequest>()
        .status(202),
        Op::get("/v1/network/domains", "network", "Network domains and the VNI pool"),
        Op::get(
            "/v1/audit/logs",
            "audit",
            "The sensitive audit log and whether its hash chain holds",
        )
        .query::<ops::AuditQuery>(),
        Op::get("/api/v1/tenants/{id}/usage", "accounting", "A tenant's usage").query::<DaysIn>(),
        Op::get("/api/v1/usage", "accounting", "Usage by tenant or user").query::<ops::UsageQuery>(),
        Op::get("/v1/tenants", "tenants", "Tenant names"),
        Op::get(
            "/v1/tenants/{id}",
            "tenants",
            "A tenant: its quotas, nodes held, running and pending allocations, 90-day usage",
        ),
        Op::post(
            "/api/v1/tenants",
            "tenants",
            "Create a tenant with its quotas, committed through the quorum (SystemAdmin)",
        )
        .body::<TenantIn>()
        .status(201),
        Op::get("/api/v1/tenants/{id}", "tenants", "A tenant (as GET /v1/tenants/{id})"),
        Op::put(
            "/api/v1/tenants/{id}",
            "tenants",
            "Change a tenant's quotas: only the keys given, null clears one (SystemAdmin; Raft-committed)",
        )
        .body::<TenantIn>(),
        Op::delete(
            "/api/v1/tenants/{id}",
            "tenants",
            "Delete a tenant with nothing queued or running (SystemAdmin)",
        ),
        Op::get(
            "/api/v1/tenants/{id}/projects",
            "tenants",
            "A tenant's projects: each one's quotas, nodes held, running and pending allocations",
        ),
        Op::post(
            "/api/v1/tenants/{id}/projects",
            "tenants",
            "Create a project in a tenant with its own hard quotas and soft budgets (SystemAdmin; Raft-committed)",
        )
        .body::<ProjectIn>()
        .status(201),
        Op::get(
            "/api/v1/tenants/{id}/projects/{project}",
            "tenants",
            "A project of a tenant",
        ),
        Op::put(
            "/api/v1/tenants/{id}/projects/{project}",
            "tenants",
            "Change a project's quotas: only the keys given, null clears one (SystemAdmin; Raft-committed)",
        )
        .body::<ProjectIn>(),
        Op::delete(
            "/api/v1/tenants/{id}/projects/{project}",
            "tenants",
            "Delete a project with nothing queued or running (SystemAdmin)",
        ),
        Op::get(
            "/api/v1/admin/log",
            "quorum",
            "The administrative log: every tenant change, who made it and when",
        ),
        Op::get(
            "/api/v1/admin/accounting",
            "accounting",
            "The accounting pipeline: Waldur reachable, events buffered in memory and on disk, dropped, the mark",
        )
        .answer::<crate::accounting::AccountingStatus>(),
        Op::post(
            "/api/v1/admin/accounting/reconcile",
            "accounting",
            "Regenerate a window's accounting events from the allocation records and the audit log (SystemAdmin)",
        )
        .body::<crate::accounting::ReconcileIn>()
        .answer::<crate::accounting::Reconciled>(),
        Op::get("/v1/vclusters", "vclusters", "vCluster names"),
        Op::get(
            "/v1/vclusters/{id}/queue",
            "vclusters",
            "A vCluster's queue in score order",
        ),
        Op::put(
            "/v1/vclusters/{id}/weights",
            "vclusters",
            "Set a vCluster's cost-function weights (SystemAdmin)",
        )
        .body::<BTreeMap<String, f64>>(),
        Op::get(
            "/api/v1/services",
            "services",
            "Registered service names (a tenant's: `x-lattice-tenant`, or the caller's own)",
        ),
        Op::get(
            "/api/v1/services/{name}",
            "services",
            "A service's endpoints: allocation, node, host, port, protocol",
        )
        .answer_list::<crate::control::ServiceEndpoint>("endpoints"),
        Op::get("/api/v1/raft/status", "quorum", "The quorum's Raft status"),
        Op::get("/v1/admin/raft/status", "quorum", "The quorum's Raft status"),
        Op::post(
            "/api/v1/admin/backup",
            "quorum",
            "Write a backup of the quorum's state (SystemAdmin)",
        ),
        Op::get("/api/v1/admin/backup/verify", "quorum", "Verify a backup file").query::<PathQuery>(),
        Op::post(
            "/api/v1/admin/restore",
            "quorum",
            "Stage a backup for restore at the next start",
        )
        .body::<PathQuery>(),
        Op::post("/api/v1/admin/members", "quorum", "Add a quorum member").body::<MemberIn>(),
        Op::delete("/api/v1/admin/members/{id}", "quorum", "Remove a quorum member"),
    ];
    #[cfg(feature = "federation")]
    let ops = [ops, crate::federation::api::documented()].concat();
    ops
}

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
        .route("/v1/vclusters", get(vclusters))
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
    let agent_call = (path.starts_with("/v1/nodes/")
        && (path.ends_with("/register") || path.ends_with("/heartbeat") || path.ends_with("/work")))
        || (path.starts_with("/v1/allocations/") && path.ends_with("/exit"));
    let checked = if agent_call {
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

type P = Extension<Principal>;

fn forbidden(what: &str) -> Response {
    error(StatusCode::FORBIDDEN, None, format!("forbidden: {what}"))
}

fn error(status: StatusCode, field: Option<&str>, message: impl Into<String>) -> Response {
    let mut body = json!({ "error": message.into() });
    if let Some(f) = field {
        body["field"] = Value::from(f);
    }
    (status, Json(body)).into_response()
}

/// REST status codes: 400 (naming the field), 403, 404, and 421 Misdirected Request naming the leader.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::BadRequest { field, message } => error(StatusCode::BAD_REQUEST, Some(field), message.clone()),
            ApiError::Forbidden { field, message } => error(StatusCode::FORBIDDEN, field.as_deref(), message.clone()),
            ApiError::NotFound { field, message } => error(StatusCode::NOT_FOUND, Some(field), message.clone()),
            ApiError::Unavailable { message } => error(StatusCode::SERVICE_UNAVAILABLE, None, message.clone()),
            ApiError::Conflict { message } => error(StatusCode::CONFLICT, None, message.clone()),
            ApiError::NotLeader { leader_id, leader } => (
                StatusCode::MISDIRECTED_REQUEST,
                Json(json!({"error": "not the quorum leader", "leader_id": leader_id, "leader_grpc": leader})),
            )
                .into_response(),
        }
    }
}

fn not_leader(shared: &Shared) -> Option<Response> {
    ops::leader_only(shared).err().map(IntoResponse::into_response)
}

async fn healthz(State(s): S) -> Json<Value> {
    let st = s.member.status();
    Json(json!({"status": "ok", "raft_state": st.state, "leader": st.leader, "term": st.term}))
}

async fn metrics(State(s): S) -> Response {
    use crate::metrics::set_all;
    let m = &s.metrics;
    {
        let mut c = s.control.lock().await;
        m.add(&c.take_tally());
        let mut allocs: BTreeMap<String, f64> = BTreeMap::new();
        let mut tenants: BTreeMap<(String, String), f64> = BTreeMap::new();
        let mut queued: BTreeMap<String, f64> = c.vcluster_names().into_iter().map(|v| (v, 0.0)).collect();
        let mut used: BTreeMap<String, f64> = BTreeMap::new();
        for a in c.list() {
            *allocs.entry(a.state.clone()).or_default() += 1.0;
            if a.ended_ms.is_none() {
                *tenants.entry((a.tenant.clone(), a.state.clone())).or_default() += 1.0;
            }
            match a.state.as_str() {
                "pending" | "staging" => *queued.entry(a.vcluster.clone()).or_default() += 1.0,
                "running" => *used.entry(a.tenant.clone()).or_default() += a.nodes.len() as f64,
                _ => {}
            }
        }
        m.allocations_active
            .set(allocs.get("running").copied().unwrap_or(0.0) as i64);
        set_all(&m.allocations, allocs.iter().map(|(k, v)| (vec![k.as_str()], *v)));
        set_all(
            &m.tenant_allocations,
            tenants.iter().map(|((t, st), v)| (vec![t.as_str(), st.as_str()], *v)),
        );
        set_all(&m.queue_depth, queued.iter().map(|(k, v)| (vec![k.as_str()], *v)));
        let mut nodes: BTreeMap<String, f64> = BTreeMap::new();
        for n in c.nodes() {
            *nodes.entry(n.state).or_default() += 1.0;
        }
        set_all(&m.nodes, nodes.iter().map(|(k, v)| (vec![k.as_str()], *v)));
        let heard = c.last_heard();
        let names: Vec<String> = heard.iter().map(|(n, _)| n.clone()).collect();
        m.known(&c.vcluster_names(), &names, &s.member.id.to_string());
        set_all(
            &m.last_heartbeat,
            heard.iter().map(|(n, at)| (vec![n.as_str()], *at as f64 / 1000.0)),
        );
        let quotas = c.node_quotas();
        set_all(
            &m.quota_max,
            quotas.iter().map(|(t, q)| (vec![t.as_str()], f64::from(*q))),
        );
        set_all(
            &m.quota_used,
            quotas
                .iter()
                .map(|(t, _)| (vec![t.as_str()], used.get(t).copied().unwrap_or(0.0))),
        );
        let (vni_total, vni_used) = c.network.pool();
        m.vni_total.set(vni_total as i64);
        m.vni_available.set(vni_total.saturating_sub(vni_used) as i64);
        m.checkpoint_storage_unavailable
            .set(i64::from(!c.checkpoint_storage_available()));
    }
    let member = s.member.id.to_string();
    let member = member.as_str();
    let st = s.member.status();
    m.raft_term.set(st.term as i64);
    m.raft_leader
        .with_label_values(&[member])
        .set(i64::from(s.member.is_leader()));
    let (entries, snapshot_bytes, built) = s.member.log_stats();
    m.raft_log_entries.with_label_values(&[member]).set(entries as i64);
    m.raft_snapshot_size
        .with_label_values(&[member])
        .set(snapshot_bytes as f64);
    for b in built {
        m.snapshot_duration.with_label_values(&[member]).observe(b);
    }
    if let Some((used, total)) = crate::metrics::disk_usage(&s.data_dir) {
        m.raft_disk_used.with_label_values(&[member]).set(used);
        m.raft_disk_total.with_label_values(&[member]).set(total);
    }
    if let Some(a) = &s.accounting {
        let st = a.status();
        m.accounting_buffered.set(st.buffered as i64);
        m.accounting_on_disk.set(st.on_disk as i64);
        m.accounting_dropped
            .inc_by(st.dropped_total.saturating_sub(m.accounting_dropped.get()));
        m.accounting_delivered
            .inc_by(st.delivered_total.saturating_sub(m.accounting_delivered.get()));
    }
    if let Some(entries) = s.member.try_read(|q| q.audit.len() as u64) {
        let seen = m.audit_entries.get();
        m.audit_entries.inc_by(entries.saturating_sub(seen));
    }
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
        .into_response()
}

async fn submit(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let req: SubmitRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::submit(&s, &p, req).await {
        Ok(answer) => (StatusCode::CREATED, Json(answer)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn list(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::ListFilter>) -> Response {
    match ops::list(&s, &p, &q).await {
        Ok(all) => Json(json!({ "allocations": all })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_one(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::get(&s, &p, &id).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn cancel(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::cancel(&s, &p, &id).await {
        Ok(state) => Json(json!({"id": id, "state": state})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn submit_dag(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
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

async fn get_dag(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
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
async fn dag_graph(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::dag(&s, &p, &id).await {
        Ok((state, members)) => {
            let name_of: BTreeMap<&str, &str> = members.iter().map(|(n, v)| (v.id.as_str(), n.as_str())).collect();
            let nodes: Vec<Value> = members
                .iter()
                .map(|(name, v)| json!({"name": name, "id": v.id, "state": v.state}))
                .collect();
            let mut edges = Vec::new();
            for (name, v) in &members {
                for d in &v.depends_on {
                    if let Some(from) = name_of.get(d.reference.as_str()) {
                        edges.push(json!({"from": from, "to": name, "condition": d.condition}));
                    }
                }
            }
            Json(json!({"id": id, "state": state, "allocations": nodes, "edges": edges})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn services(State(s): S, Extension(p): P, headers: axum::http::HeaderMap) -> Response {
    match ops::services(&s, &p, tenant_header(&headers)).await {
        Ok(all) => Json(json!({"services": all.into_keys().collect::<Vec<_>>()})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn service(State(s): S, Extension(p): P, headers: axum::http::HeaderMap, Path(name): Path<String>) -> Response {
    match ops::services(&s, &p, tenant_header(&headers)).await {
        Ok(mut all) => match all.remove(&name) {
            Some(endpoints) => Json(json!({"name": name, "endpoints": endpoints})).into_response(),
            None => error(StatusCode::NOT_FOUND, Some("name"), format!("no service {name}")),
        },
        Err(e) => e.into_response(),
    }
}

/// The `x-lattice-tenant` header.
fn tenant_header(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get("x-lattice-tenant").and_then(|v| v.to_str().ok())
}

/// `GET /api/v1/auth/discovery` (public).
async fn auth_discovery(State(s): S) -> Json<Value> {
    Json(s.auth.discovery())
}

async fn create_session(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let req: ops::SessionRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::create_session(&s, &p, req).await {
        Ok(id) => (
            StatusCode::CREATED,
            Json(json!({"session_id": id, "allocation_id": id})),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_session(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::session(&s, &p, &id).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn delete_session(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    if let Err(e) = ops::session(&s, &p, &id).await {
        return e.into_response();
    }
    match ops::cancel(&s, &p, &id).await {
        Ok(state) => Json(json!({"session_id": id, "state": state})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/sessions/{id}/terminal`: a session's terminal, as `attach` opens it.
async fn session_terminal(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    q: QueryIn<crate::tasks::TerminalRequest>,
    ws: Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    if let Err(e) = ops::session(&s, &p, &id).await {
        return e.into_response();
    }
    attach(State(s), Extension(p), Path(id), q, ws).await
}

async fn cancel_dag(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::cancel_dag(&s, &p, &id).await {
        Ok(n) => Json(json!({"id": id, "cancelled": n})).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NodesIn {
    /// Only nodes in this state (`ready`, `allocated`, `draining`, `down`, …).
    state: Option<String>,
}

async fn nodes(State(s): S, QueryIn(q): QueryIn<NodesIn>) -> Json<Value> {
    let all = ops::nodes(&s).await;
    let nodes: Vec<_> = all
        .into_iter()
        .filter(|n| q.state.as_deref().is_none_or(|st| n.state == st))
        .collect();
    Json(json!({ "nodes": nodes }))
}

async fn node(State(s): S, Path(id): Path<String>) -> Response {
    match ops::node(&s, &id).await {
        Ok(n) => Json(n).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn register(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
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

async fn heartbeat(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
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

async fn drain(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    set_drain(s, p, id, true).await
}

async fn undrain(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    set_drain(s, p, id, false).await
}

async fn disable(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    node_op(s, p, id, NodeOp::Disable).await
}

async fn enable(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    node_op(s, p, id, NodeOp::Enable).await
}

/// `POST /v1/nodes/{id}/wipe`'s body.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WipeIn {
    /// Required `true`: the node is wiped again (`lattice admin node wipe NODE --force`).
    #[serde(default)]
    force: bool,
}

async fn retry_wipe(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
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

async fn set_drain(s: Arc<Shared>, p: Principal, id: String, drain: bool) -> Response {
    node_op(s, p, id, if drain { NodeOp::Drain } else { NodeOp::Undrain }).await
}

async fn node_op(s: Arc<Shared>, p: Principal, id: String, op: NodeOp) -> Response {
    match ops::node_op(&s, &p, &id, op).await {
        Ok(state) => Json(json!({"node": id, "state": state})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn update(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let req: UpdateRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::update(&s, &p, &id, &req).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn checkpoint(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::checkpoint(&s, &p, &id).await {
        Ok(n) => (StatusCode::ACCEPTED, Json(json!({"id": id, "checkpoints": n}))).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn list_dags(State(s): S, Extension(p): P) -> Response {
    let dags: Vec<Value> = match ops::dags(&s, &p).await {
        Ok(d) => d
            .into_iter()
            .map(|(id, state, m)| json!({"id": id, "state": state, "allocations": m.len()}))
            .collect(),
        Err(e) => return e.into_response(),
    };
    Json(json!({ "dags": dags })).into_response()
}

async fn audit_logs(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::AuditQuery>) -> Response {
    match ops::audit(&s, &p, &q).await {
        Ok((entries, valid)) => Json(json!({"entries": entries, "chain_valid": valid})).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DaysIn {
    days: Option<u32>,
}

async fn tenant_usage(State(s): S, Extension(p): P, Path(id): Path<String>, QueryIn(q): QueryIn<DaysIn>) -> Response {
    let q = ops::UsageQuery {
        tenant: Some(id),
        user: None,
        days: q.days,
    };
    match ops::usage(&s, &p, &q).await {
        Ok(u) => Json(u).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn usage(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::UsageQuery>) -> Response {
    match ops::usage(&s, &p, &q).await {
        Ok(u) => Json(u).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn accounting(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::UsageQuery>) -> Response {
    match ops::accounting(&s, &p, &q).await {
        Ok((total, records)) => Json(json!({"total": total, "records": records})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A body serde could not read: 400 naming the unknown or mistyped field.
/// A JSON body whose refusal is the API's 400 naming the field (axum's own `Json` answers plain text).
struct JsonIn<T>(T);

impl<T: serde::de::DeserializeOwned, St: Send + Sync> FromRequest<St> for JsonIn<T> {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &St) -> Result<Self, Response> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        serde_json::from_slice(&bytes).map(JsonIn).map_err(body_error)
    }
}

/// A query string whose refusal is a JSON 400 naming the parameter (`query` when the decoder does
/// not say which).
struct QueryIn<T>(T);

impl<T: serde::de::DeserializeOwned, St: Send + Sync> FromRequestParts<St> for QueryIn<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &St) -> Result<Self, Response> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|Query(q)| QueryIn(q))
            .map_err(|e| {
                let text = e.body_text();
                let field = named_field(&text).unwrap_or("query");
                error(StatusCode::BAD_REQUEST, Some(field), text.clone())
            })
    }
}

/// A path parameter whose refusal is a JSON 400 naming it (`id`).
struct PathIn<T>(T);

impl<T: serde::de::DeserializeOwned + Send, St: Send + Sync> FromRequestParts<St> for PathIn<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &St) -> Result<Self, Response> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| PathIn(v))
            .map_err(|e| error(StatusCode::BAD_REQUEST, Some("id"), e.body_text()))
    }
}

/// The field a decoder's message names: serde's "unknown field `x`" / "missing field `x`", or a
/// query decoder's "…query string: x: why".
fn named_field(msg: &str) -> Option<&str> {
    if msg.contains("field")
        && let Some(f) = msg.split('`').nth(1).filter(|f| !f.is_empty())
    {
        return Some(f);
    }
    let rest = msg.split_once("query string: ")?.1;
    let (name, _) = rest.split_once(": ")?;
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')).then_some(name)
}

fn body_error(e: serde_json::Error) -> Response {
    let msg = e.to_string();
    let field = named_field(&msg).unwrap_or("body").to_string();
    error(StatusCode::BAD_REQUEST, Some(&field), msg)
}

async fn tenants(State(s): S) -> Json<Value> {
    Json(json!({ "tenants": s.control.lock().await.tenant_names() }))
}

/// `GET /v1/tenants/{id}`: for its own members, operators, read-only callers and administrators.
async fn tenant(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    if let Err(r) = may_read_tenant(&p, &id) {
        return r;
    }
    match s.control.lock().await.tenant_view(&id) {
        Some(v) => Json(v).into_response(),
        None => error(StatusCode::NOT_FOUND, Some("id"), format!("no tenant {id}")),
    }
}

/// A tenant's quotas in a request (documentation of the accepted keys; the handlers read the body as
/// a map so that a key given as `null` clears it and a key left out is kept).
#[derive(Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct TenantIn {
    /// `POST` only: the tenant's name (lowercase letters, digits, - and _).
    name: Option<String>,
    /// Hard: nodes held at once (quorum-enforced).
    max_nodes: Option<u32>,
    /// Hard: running allocations at once.
    max_concurrent_allocations: Option<u32>,
    /// Soft: GPU-hours per budget period.
    gpu_hours_budget: Option<f64>,
    /// Soft: node-hours per budget period.
    node_hours_budget: Option<f64>,
    /// Soft: target share of the system (0-1).
    fair_share_target: Option<f64>,
    /// Soft: multiple of its share it may hold while others wait (>= 1).
    burst_allowance: Option<f64>,
    /// KAI-style deserved quota (nodes).
    deserved_nodes: Option<f64>,
    /// KAI over-quota weight.
    over_quota_weight: Option<f64>,
}

/// A project's quotas in a request (as [`TenantIn`]; a project has hard limits and budgets only).
#[derive(Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct ProjectIn {
    /// `POST` only: the project's name (lowercase letters, digits, - and _).
    name: Option<String>,
    /// Hard: nodes the project holds at once (with the tenant's limit).
    max_nodes: Option<u32>,
    /// Hard: running allocations of the project at once.
    max_concurrent_allocations: Option<u32>,
    /// Soft: GPU-hours per budget period.
    gpu_hours_budget: Option<f64>,
    /// Soft: node-hours per budget period.
    node_hours_budget: Option<f64>,
}

/// A JSON object body, or 400 naming `body`.
#[allow(clippy::result_large_err)]
fn object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(error(StatusCode::BAD_REQUEST, Some("body"), "expected a JSON object")),
        Err(e) => Err(body_error(e)),
    }
}

fn tenant_written(status: StatusCode, w: ops::TenantWritten) -> Response {
    let mut v = w.view;
    if let Some(warning) = w.warning {
        v["warning"] = json!(warning);
    }
    (status, Json(v)).into_response()
}

async fn create_tenant(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let Some(name) = m.get("name").and_then(Value::as_str).map(str::to_string) else {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a tenant needs a `name`");
    };
    match ops::put_tenant(&s, &p, &name, &m, true).await {
        Ok(w) => tenant_written(StatusCode::CREATED, w),
        Err(e) => e.into_response(),
    }
}

async fn update_tenant(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if m.contains_key("name") {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a tenant is not renamed");
    }
    match ops::put_tenant(&s, &p, &id, &m, false).await {
        Ok(w) => tenant_written(StatusCode::OK, w),
        Err(e) => e.into_response(),
    }
}

async fn delete_tenant(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::delete_tenant(&s, &p, &id).await {
        Ok(()) => Json(json!({"name": id, "deleted": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Who may read a tenant's quotas and usage: its members, operators, read-only callers, administrators.
#[allow(clippy::result_large_err)]
fn may_read_tenant(p: &crate::auth::Principal, tenant: &str) -> Result<(), Response> {
    let wide = p.can_operate() || p.has(crate::auth::Role::ReadOnly);
    if !wide && p.tenant.as_deref() != Some(tenant) {
        return Err(forbidden("another tenant's quotas and usage"));
    }
    Ok(())
}

/// `GET /api/v1/tenants/{id}/projects`.
async fn projects(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    if let Err(r) = may_read_tenant(&p, &id) {
        return r;
    }
    match s.control.lock().await.tenant_view(&id) {
        Some(v) => Json(json!({ "tenant": id, "projects": v["projects"] })).into_response(),
        None => error(StatusCode::NOT_FOUND, Some("id"), format!("no tenant {id}")),
    }
}

/// `GET /api/v1/tenants/{id}/projects/{project}`.
async fn project(State(s): S, Extension(p): P, Path((id, project)): Path<(String, String)>) -> Response {
    if let Err(r) = may_read_tenant(&p, &id) {
        return r;
    }
    match s.control.lock().await.project_view(&id, &project) {
        Some(v) => Json(v).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            Some("project"),
            format!("no project {id}/{project}"),
        ),
    }
}

async fn create_project(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let Some(name) = m.get("name").and_then(Value::as_str).map(str::to_string) else {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a project needs a `name`");
    };
    match ops::put_project(&s, &p, &id, &name, &m, true).await {
        Ok(w) => tenant_written(StatusCode::CREATED, w),
        Err(e) => e.into_response(),
    }
}

async fn update_project(
    State(s): S,
    Extension(p): P,
    Path((id, project)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    if m.contains_key("name") {
        return error(StatusCode::BAD_REQUEST, Some("name"), "a project is not renamed");
    }
    match ops::put_project(&s, &p, &id, &project, &m, false).await {
        Ok(w) => tenant_written(StatusCode::OK, w),
        Err(e) => e.into_response(),
    }
}

async fn delete_project(State(s): S, Extension(p): P, Path((id, project)): Path<(String, String)>) -> Response {
    match ops::delete_project(&s, &p, &id, &project).await {
        Ok(()) => Json(json!({"tenant": id, "name": project, "deleted": true})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /api/v1/admin/log` (SystemAdmin, Operator, ReadOnly).
async fn admin_log(State(s): S, Extension(p): P) -> Response {
    if !(p.can_operate() || p.has(crate::auth::Role::ReadOnly)) {
        return forbidden("the administrative log");
    }
    let entries = s.member.read(|q| q.admin_log.clone()).await;
    Json(json!({ "entries": entries })).into_response()
}

async fn accounting_status(State(s): S, Extension(p): P) -> Response {
    match crate::accounting::status(&s, &p).await {
        Ok(st) => Json(st).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn accounting_reconcile(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let w: crate::accounting::ReconcileIn = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return body_error(e),
    };
    match crate::accounting::reconcile_window(&s, &p, &w).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn vclusters(State(s): S) -> Json<Value> {
    Json(json!({ "vclusters": s.control.lock().await.vcluster_names() }))
}

async fn queue(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::queue(&s, &p, &id).await {
        Ok(q) => Json(json!({ "vcluster": id, "queue": q })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `lattice admin vcluster set-weights`: the nine weights (missing ones 0); next cycle uses them.
async fn set_weights(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    JsonIn(w): JsonIn<BTreeMap<String, f64>>,
) -> Response {
    match ops::set_weights(&s, &p, &id, &w).await {
        Ok(()) => Json(json!({"vcluster": id, "weights": w})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The newest backup file in `DATA_DIR/backups`.
fn latest_backup(s: &Shared) -> Option<std::path::PathBuf> {
    let dir = s.data_dir.join("backups");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files.pop()
}

async fn backup(State(s): S, Extension(p): P) -> Response {
    match ops::backup(&s, &p, None).await {
        Ok(b) => Json(json!({
            "path": b.path.display().to_string(),
            "sha256": b.backup.sha256,
            "last_applied": b.backup.data.last_applied.map(|l| l.index),
            "assignments": b.backup.data.state.assignments.len(),
            "audit_entries": b.backup.data.state.audit.len(),
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
struct PathQuery {
    path: Option<String>,
}

async fn verify_backup(State(s): S, Extension(p): P, QueryIn(q): QueryIn<PathQuery>) -> Response {
    if !p.is_admin() {
        return forbidden("backups need SystemAdmin");
    }
    let Some(path) = q.path.map(std::path::PathBuf::from).or_else(|| latest_backup(&s)) else {
        return error(StatusCode::NOT_FOUND, Some("path"), "no backup yet");
    };
    match lattice_adapters::raft_store::Backup::read_verified(&path) {
        Ok(b) => Json(json!({"path": path.display().to_string(), "valid": true, "sha256": b.sha256})).into_response(),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"path": path.display().to_string(), "valid": false, "error": e})),
        )
            .into_response(),
    }
}

/// Stages a verified backup; it is installed when the member restarts ("requires restart").
async fn restore(State(s): S, Extension(p): P, JsonIn(q): JsonIn<PathQuery>) -> Response {
    if !p.is_admin() {
        return forbidden("restores need SystemAdmin");
    }
    let Some(path) = q.path else {
        return error(StatusCode::BAD_REQUEST, Some("path"), "which backup? {\"path\": ...}");
    };
    if let Err(e) = lattice_adapters::raft_store::Backup::read_verified(std::path::Path::new(&path)) {
        return error(StatusCode::BAD_REQUEST, Some("path"), e);
    }
    let staged = s.data_dir.join(crate::server::RESTORE_PENDING);
    match std::fs::copy(&path, &staged) {
        Ok(_) => Json(json!({"staged": staged.display().to_string(), "restart_required": true})).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, None, e.to_string()),
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
struct MemberIn {
    id: u64,
    addr: String,
}

async fn add_member(State(s): S, Extension(p): P, JsonIn(m): JsonIn<MemberIn>) -> Response {
    if !p.is_admin() {
        return forbidden("membership changes need SystemAdmin");
    }
    if let Some(r) = not_leader(&s) {
        return r;
    }
    match s.member.add_member(m.id, &m.addr).await {
        Ok(()) => Json(json!({"members": s.member.status().members})).into_response(),
        Err(e) => error(StatusCode::CONFLICT, None, e.to_string()),
    }
}

async fn remove_member(State(s): S, Extension(p): P, PathIn(id): PathIn<u64>) -> Response {
    if !p.is_admin() {
        return forbidden("membership changes need SystemAdmin");
    }
    if let Some(r) = not_leader(&s) {
        return r;
    }
    match s.member.remove_member(id).await {
        Ok(()) => Json(json!({"members": s.member.status().members})).into_response(),
        Err(e) => error(StatusCode::CONFLICT, None, e.to_string()),
    }
}

async fn raft_status(State(s): S) -> Json<Value> {
    let st = s.member.status();
    let q = s.member.state().await;
    Json(json!({
        "status": st,
        "assignments": q.assignments.len(),
        "commits": q.commits,
        "rejections": q.rejections,
        "audit_entries": q.audit.len(),
        "audit_chain_valid": q.verify_audit().is_ok(),
    }))
}

async fn work(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let w: WorkPoll = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return body_error(e),
    };
    if let Some(p) = w.collection_overhead_pct.filter(|p| p.is_finite() && *p >= 0.0) {
        s.metrics.agent_overhead.with_label_values(&[id.as_str()]).set(p);
    }
    for st in &w.startups {
        if st.seconds.is_finite() && st.seconds >= 0.0 {
            s.metrics
                .agent_startup
                .with_label_values(&[id.as_str()])
                .observe(st.seconds);
        }
    }
    let reports = crate::control::AgentReports {
        checkpointed: w.checkpointed,
        wiped: w.wiped,
        metrics: w.metrics,
        task_ends: w.task_ends,
        tasks_running: w.tasks,
        cache_done: w.cache_done,
        cache: w.cache,
    };
    match ops::work(&s, &p, &id, &w.running, w.output, &reports).await {
        Ok(w) => Json(w).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/allocations/{id}/attach?node=&command=&rows=&cols=&term=` (WebSocket upgrade): a terminal
/// inside the running allocation, relayed to its node's agent. Binary frames are the terminal's bytes
/// both ways; text frames from the client are `{"resize": {"rows", "cols"}}` or `{"signal": "INT"}`;
/// the server ends with a text frame `{"exit_code": N}` (or `{"error": "..."}`) and closes.
async fn attach(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<crate::tasks::TerminalRequest>,
    ws: Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let node = q.node.clone();
    let (start, addr, node, sensitive) = match ops::attach_target(&s, &p, &id, node.as_deref(), q).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Ok(ws) = ws else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "a terminal needs a WebSocket upgrade", "field": "connection"})),
        )
            .into_response();
    };
    ws.on_upgrade(move |socket| relay_terminal(s, p, id, node, start, addr, sensitive, socket))
}

#[allow(clippy::too_many_arguments)]
async fn relay_terminal(
    s: std::sync::Arc<crate::server::Shared>,
    p: crate::auth::Principal,
    id: String,
    node: String,
    start: lattice_adapters::peer::AttachStart,
    addr: String,
    sensitive: bool,
    socket: axum::extract::ws::WebSocket,
) {
    use axum::extract::ws::Message;
    use futures_util::{SinkExt, StreamExt};
    use lattice_adapters::peer::{AttachInput, AttachOutput};
    let _open = crate::metrics::StreamGuard::open(&s.metrics, "attach");
    let (mut sink, mut stream) = socket.split();
    let (in_tx, in_rx) = tokio::sync::mpsc::channel(64);
    let mut out = match lattice_adapters::peer::attach(&addr, start, in_rx).await {
        Ok(o) => o,
        Err(e) => {
            let _ = sink
                .send(Message::Text(json!({"error": e.to_string()}).to_string().into()))
                .await;
            let _ = sink.close().await;
            return;
        }
    };
    if sensitive {
        ops::audit_attach(&s, &p, &id, &node, "attach").await;
    }
    let mut how = "client left";
    loop {
        tokio::select! {
            m = stream.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    if in_tx.send(AttachInput::Stdin(b.to_vec())).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    let input = if let Some(r) = v.get("resize") {
                        Some(AttachInput::Resize {
                            rows: r["rows"].as_u64().unwrap_or(24).min(u16::MAX as u64) as u16,
                            cols: r["cols"].as_u64().unwrap_or(80).min(u16::MAX as u64) as u16,
                        })
                    } else if let Some(sig) = v["signal"].as_str() {
                        Some(AttachInput::Signal(sig.to_string()))
                    } else {
                        v["stdin"].as_str().map(|d| AttachInput::Stdin(d.as_bytes().to_vec()))
                    };
                    if let Some(i) = input && in_tx.send(i).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            o = out.recv() => match o {
                Some(AttachOutput::Stdout(b)) => {
                    if sink.send(Message::Binary(b.into())).await.is_err() {
                        break;
                    }
                }
                Some(AttachOutput::Exit(c)) => {
                    how = "exited";
                    let _ = sink.send(Message::Text(json!({"exit_code": c}).to_string().into())).await;
                    break;
                }
                Some(AttachOutput::Error(e)) => {
                    how = "node lost";
                    let _ = sink.send(Message::Text(json!({"error": e}).to_string().into())).await;
                    break;
                }
                None => break,
            },
        }
    }
    // Dropping the input hangs the terminal up (SIGHUP to its session) if it still runs.
    drop(in_tx);
    let _ = sink.close().await;
    if sensitive {
        ops::audit_attach(&s, &p, &id, &node, &format!("attach_end ({how})")).await;
    }
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CacheQuery {
    node: Option<String>,
}

/// `GET /v1/cache[?node=]`: each node's cached images, orders not yet handed out and recent outcomes.
async fn cache_list(State(s): S, Extension(p): P, QueryIn(q): QueryIn<CacheQuery>) -> Response {
    match ops::cache_list(&s, &p, q.node.as_deref()).await {
        Ok(v) => Json(json!({"nodes": v})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn cache_order(s: S, p: P, op: &str, body: axum::body::Bytes) -> Response {
    let (State(s), Extension(p)) = (s, p);
    let req: crate::cache::CacheRequest = match serde_json::from_slice(&body) {
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
async fn cache_warm(s: S, p: P, body: axum::body::Bytes) -> Response {
    cache_order(s, p, "warm", body).await
}

/// `POST /v1/cache/evict {"image", "nodes"|"group"}` (operators): unless a running allocation has it
/// mounted.
async fn cache_evict(s: S, p: P, body: axum::body::Bytes) -> Response {
    cache_order(s, p, "evict", body).await
}

/// `POST /v1/allocations/{id}/tasks`: a task launch within the running allocation (`lattice launch`).
async fn launch_tasks(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let req: crate::tasks::TaskRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return body_error(e),
    };
    match ops::launch_tasks(&s, &p, &id, &req).await {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn list_tasks(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::task_launches(&s, &p, &id).await {
        Ok(v) => Json(json!({"launches": v})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_task(State(s): S, Extension(p): P, Path((id, launch)): Path<(String, String)>) -> Response {
    match ops::task_launch(&s, &p, &id, &launch).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn agent_exit(State(s): S, Extension(p): P, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let x: ExitReport = match serde_json::from_slice(&body) {
        Ok(x) => x,
        Err(e) => return body_error(e),
    };
    let tails: Vec<(Stream, &str)> = [(Stream::Stdout, &x.log_tail), (Stream::Stderr, &x.err_tail)]
        .into_iter()
        .filter_map(|(s, t)| Some((s, t.as_deref()?)))
        .collect();
    match ops::agent_exit(&s, &p, &id, &x.node, x.kind, x.exit_code, &tails).await {
        Ok(ended) => Json(json!({"id": id, "ended": ended})).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct LogsIn {
    node: Option<String>,
    /// `stdout` (the default) or `stderr`.
    stream: Option<String>,
    offset: Option<u64>,
    limit: Option<u64>,
    since: Option<String>,
    until: Option<String>,
}

async fn logs(State(s): S, Extension(p): P, Path(id): Path<String>, QueryIn(q): QueryIn<LogsIn>) -> Response {
    let instant = |f: &str, v: &Option<String>| v.as_deref().map(|v| ops::parse_instant(f, v)).transpose();
    let (since_ms, until_ms) = match (instant("since", &q.since), instant("until", &q.until)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return e.into_response(),
    };
    let range = lattice_adapters::logstore::Range {
        offset: q.offset.unwrap_or(0),
        limit: q.limit.unwrap_or(u64::MAX),
        since_ms,
        until_ms,
    };
    let stream = match stream_of(q.stream.as_deref()) {
        Ok(s) => s,
        Err(r) => return r,
    };
    match ops::logs(&s, &p, &id, (q.node.as_deref(), stream), &range).await {
        Ok((source, l)) => Json(json!({"id": id, "source": source, "stream": stream, "nodes": l})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn ask_fingerprint(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
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
async fn network_domains(State(s): S, Extension(p): P) -> Response {
    let c = s.control.lock().await;
    let (total, used) = c.network.pool();
    let domains: Vec<_> = c
        .network
        .views()
        .into_iter()
        .filter(|d| p.can_operate() || p.tenant.as_deref() == Some(d.tenant.as_str()))
        .collect();
    Json(json!({"domains": domains, "vni_pool": {"total": total, "in_use": used}})).into_response()
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct LiveIn {
    /// `NODE:OFFSET,...`: what the follower already has.
    after: Option<String>,
    /// `stdout` (the default) or `stderr`.
    stream: Option<String>,
}

/// The `stream` query parameter: `stdout` when absent.
#[allow(clippy::result_large_err)]
fn stream_of(v: Option<&str>) -> Result<Stream, Response> {
    match v {
        None => Ok(Stream::Stdout),
        Some(v) => Stream::parse(v).ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                Some("stream"),
                format!("`{v}`: expected stdout or stderr"),
            )
        }),
    }
}

/// The `after` query parameter (`NODE:OFFSET,...`).
#[allow(clippy::result_large_err)]
fn offsets(after: Option<&str>) -> Result<BTreeMap<String, u64>, Response> {
    let mut out = BTreeMap::new();
    for part in after.unwrap_or("").split(',').filter(|p| !p.is_empty()) {
        match part
            .rsplit_once(':')
            .and_then(|(n, o)| Some((n, o.parse::<u64>().ok()?)))
        {
            Some((n, o)) => {
                out.insert(n.to_string(), o);
            }
            None => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    Some("after"),
                    format!("`{part}`: expected NODE:OFFSET"),
                ));
            }
        }
    }
    Ok(out)
}

async fn live_logs(State(s): S, Extension(p): P, Path(id): Path<String>, QueryIn(q): QueryIn<LiveIn>) -> Response {
    let (after, stream) = match (offsets(q.after.as_deref()), stream_of(q.stream.as_deref())) {
        (Ok(a), Ok(s)) => (a, s),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    match ops::live_logs(&s, &p, &id, stream, &after).await {
        Ok(l) => Json(json!({"id": id, "stream": stream, "nodes": l})).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct MetricsIn {
    /// `summary` (the default), `per-node` or `per-gpu`.
    mode: Option<String>,
    /// How far back to look, e.g. `5m` (the default), `30s`, `1h`.
    duration: Option<String>,
    /// Comma-separated metric names (default: all).
    metrics: Option<String>,
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CompareIn {
    /// Comma-separated allocation ids (2 to 10).
    ids: Option<String>,
    /// Comma-separated metric names (default: all).
    metrics: Option<String>,
    /// `relative` (time from each allocation's start, the default) or `absolute` (unix seconds).
    align: Option<String>,
    /// Seconds between points, e.g. `5s` (default: a 120th of each run, at least 1 s).
    step: Option<String>,
}

impl IntoResponse for crate::observe::ObserveError {
    fn into_response(self) -> Response {
        match self {
            crate::observe::ObserveError::Bad(field, m) => error(StatusCode::BAD_REQUEST, Some(field), m),
            crate::observe::ObserveError::Unavailable(m) => error(StatusCode::SERVICE_UNAVAILABLE, None, m),
        }
    }
}

/// A duration parameter in seconds (`default` when absent); 400 naming `field` when unreadable.
#[allow(clippy::result_large_err)]
fn seconds(field: &str, v: Option<&str>, default: f64) -> Result<f64, Response> {
    match v {
        None => Ok(default),
        Some(v) => match lattice_traces::parse_duration(v) {
            Ok(t) if t.0 > 0 => Ok(t.0 as f64 / 1000.0),
            Ok(_) => Err(error(
                StatusCode::BAD_REQUEST,
                Some(field),
                format!("`{v}`: must be positive"),
            )),
            Err(m) => Err(error(StatusCode::BAD_REQUEST, Some(field), format!("`{v}`: {m}"))),
        },
    }
}

/// The TSDB, or 503 saying how to configure one.
#[allow(clippy::result_large_err)]
fn tsdb(s: &Shared) -> Result<&lattice_adapters::tsdb::Tsdb, Response> {
    s.tsdb.as_ref().ok_or_else(|| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "no TSDB configured: set services.tsdb in the runtime's config (the agents' --remote-write target)",
        )
    })
}

async fn alloc_metrics(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<MetricsIn>,
) -> Response {
    let v = match ops::get(&s, &p, &id).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let (t, d) = match (tsdb(&s), seconds("duration", q.duration.as_deref(), 300.0)) {
        (Ok(t), Ok(d)) => (t, d),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let now = s.control.lock().await.now().0;
    let mode = q.mode.as_deref().unwrap_or("summary");
    match crate::observe::snapshot(t, &v, now, mode, d, q.metrics.as_deref()).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/allocations/{id}/metrics/stream`: every period of its telemetry mode (read again each
/// time, so `lattice telemetry ID --mode debug` takes effect on open streams) a `metrics` event with
/// each node's values over the last two periods, an `alert` event per local alert rule firing on its
/// nodes (`--alerts-only` clients keep only those), and `end` once it has ended.
async fn stream_metrics(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<MetricsIn>,
) -> Response {
    use axum::response::sse::Event;
    if let Err(e) = ops::get(&s, &p, &id).await {
        return e.into_response();
    }
    if let Err(r) = tsdb(&s) {
        return r;
    }
    sse(move |tx| async move {
        let _open = crate::metrics::StreamGuard::open(&s.metrics, "metrics");
        let Some(t) = s.tsdb.as_ref() else { return };
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            let v = match ops::get(&s, &p, &id).await {
                Ok(v) => v,
                Err(_) => break,
            };
            let period = if v.telemetry == "debug" { 1.0 } else { 30.0 };
            let now = s.control.lock().await.now().0;
            // Looked at every second (an end, or a switch of mode, is seen soon); sent every period.
            let every = std::time::Duration::from_secs_f64(period);
            let due = last.is_none_or(|l| l.elapsed() >= every) || v.ended_ms.is_some();
            if due {
                last = Some(tokio::time::Instant::now());
            }
            if due && v.started_ms.is_some() {
                let snap = crate::observe::snapshot(t, &v, now, "per-node", 2.0 * period, q.metrics.as_deref()).await;
                let ev = match snap {
                    Ok(m) => Event::default().event("metrics").data(
                        json!({"at_ms": m["at_ms"], "mode": v.telemetry, "summary": m["summary"],
                               "per_node": m["per_node"], "units": m["units"]})
                        .to_string(),
                    ),
                    Err(e) => Event::default()
                        .event("error")
                        .data(json!({"error": format!("{e:?}")}).to_string()),
                };
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
                if let Ok(alerts) = crate::observe::alerts(t, &v.nodes, now as f64 / 1000.0).await {
                    for a in alerts {
                        if tx
                            .send(Ok(Event::default().event("alert").data(a.to_string())))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
            if v.ended_ms.is_some() {
                let _ = tx
                    .send(Ok(Event::default()
                        .event("end")
                        .data(json!({"state": v.state}).to_string())))
                    .await;
                break;
            }
            let wait = last.map_or(every, |l| every.saturating_sub(l.elapsed()));
            tokio::time::sleep(wait.clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(1)))
                .await;
        }
    })
}

async fn diagnostics(s: S, p: P, id: Path<String>, q: QueryIn<MetricsIn>) -> Response {
    diagnose(s, p, id.0, None, q.0).await
}

async fn diagnostics_part(s: S, p: P, Path((id, part)): Path<(String, String)>, q: QueryIn<MetricsIn>) -> Response {
    if part != "network" && part != "storage" {
        return error(
            StatusCode::NOT_FOUND,
            Some("part"),
            format!("`{part}`: expected network or storage"),
        );
    }
    diagnose(s, p, id, Some(part), q.0).await
}

async fn diagnose(State(s): S, Extension(p): P, id: String, part: Option<String>, q: MetricsIn) -> Response {
    let v = match ops::get(&s, &p, &id).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let d = match seconds("duration", q.duration.as_deref(), 300.0) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let (facts, now) = {
        let c = s.control.lock().await;
        (c.diagnostics_facts(&id), c.now().0)
    };
    match crate::observe::diagnostics(s.tsdb.as_ref(), &v, facts.as_ref(), now, d, part.as_deref()).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn compare(State(s): S, Extension(p): P, QueryIn(q): QueryIn<CompareIn>) -> Response {
    let ids: Vec<&str> = q
        .ids
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if ids.is_empty() || ids.len() > crate::observe::COMPARE_MAX {
        return error(
            StatusCode::BAD_REQUEST,
            Some("ids"),
            format!(
                "{} allocation(s): compare 1 to {}",
                ids.len(),
                crate::observe::COMPARE_MAX
            ),
        );
    }
    let relative = match crate::observe::parse_align(q.align.as_deref()) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let step = match &q.step {
        None => None,
        Some(v) => match seconds("step", Some(v), 0.0) {
            Ok(s) => Some(s),
            Err(r) => return r,
        },
    };
    let t = match tsdb(&s) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let mut views = Vec::new();
    for id in ids {
        match ops::get(&s, &p, id).await {
            Ok(v) => views.push(v),
            Err(e) => return e.into_response(),
        }
    }
    let now = s.control.lock().await.now().0;
    match crate::observe::compare(t, &views, now, q.metrics.as_deref(), relative, step).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// What a Server-Sent Events relay sends on.
type EventTx = tokio::sync::mpsc::Sender<Result<axum::response::sse::Event, std::convert::Infallible>>;

/// A Server-Sent Events answer fed by `relay`, which runs on a task of its own until it returns or
/// the client goes away (its sends fail); comments keep an idle connection alive.
fn sse<F, Fut>(relay: F) -> Response
where
    F: FnOnce(EventTx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use axum::response::sse::{KeepAlive, Sse};
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(relay(tx));
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// How often the SSE log stream looks for new output.
const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(300);

/// `GET /v1/allocations/{id}/logs/stream`: the live tail pushed as Server-Sent Events. Each new piece
/// of a node's output is an `output` event; once the allocation has ended and three looks in a row
/// found nothing new (its agents' final output has arrived), one `end` event with its state closes
/// the stream. A client that goes away ends the relay.
async fn stream_logs(State(s): S, Extension(p): P, Path(id): Path<String>, QueryIn(q): QueryIn<LiveIn>) -> Response {
    use axum::response::sse::Event;
    let (mut after, stream) = match (offsets(q.after.as_deref()), stream_of(q.stream.as_deref())) {
        (Ok(a), Ok(s)) => (a, s),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    // Refusals (unknown id, another user's allocation) are answered as such, before the stream.
    if let Err(e) = ops::live_logs(&s, &p, &id, stream, &BTreeMap::new()).await {
        return e.into_response();
    }
    sse(move |tx| async move {
        let _open = crate::metrics::StreamGuard::open(&s.metrics, "logs");
        let mut quiet = 0;
        let mut trouble = 0;
        loop {
            let nodes = match ops::live_logs(&s, &p, &id, stream, &after).await {
                Ok(n) => {
                    trouble = 0;
                    n
                }
                // A leader still taking over, or a moment without one: looked at again a few times
                // before the stream says why it ends (a client resumes with its offsets).
                Err(e @ (ApiError::Unavailable { .. } | ApiError::NotLeader { .. })) if trouble < 20 => {
                    trouble += 1;
                    tracing::debug!("log stream {id}: {e:?}");
                    tokio::time::sleep(STREAM_POLL).await;
                    continue;
                }
                Err(e) => {
                    let _ = tx
                        .send(Ok(Event::default()
                            .event("error")
                            .data(json!({"error": format!("{e:?}")}).to_string())))
                        .await;
                    break;
                }
            };
            let mut got = false;
            for (node, o) in nodes {
                after.insert(node.clone(), o.next);
                if o.data.is_empty() {
                    continue;
                }
                got = true;
                let ev = json!({"node": node, "offset": o.offset, "data": o.data, "next": o.next});
                if tx
                    .send(Ok(Event::default().event("output").data(ev.to_string())))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            quiet = if got { 0 } else { quiet + 1 };
            if quiet >= 3 {
                match ops::get(&s, &p, &id).await {
                    Ok(v) if v.ended_ms.is_some() => {
                        let _ = tx
                            .send(Ok(Event::default()
                                .event("end")
                                .data(json!({"state": v.state}).to_string())))
                            .await;
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            tokio::time::sleep(STREAM_POLL).await;
        }
    })
}
