//! Federation's HTTP surface. Two parts:
//!
//! - **Between sites** (`/federation/v1/...`, signed, outside the bearer-token layer): the catalog,
//!   inbound submissions, and the calling site's allocations here (status, logs, cancel).
//! - **For this site's users and operators** (`/api/v1/federation/...`, `/api/v1/admin/federation`,
//!   bearer tokens as everywhere): submit with a site (`auto` or a name), follow the allocations
//!   forwarded to peers, and manage peers and workspaces.

use super::broker::{Broker, CallError};
use super::route::{self, Decision, PeerStatus, Target};
use super::{FederationStatus, PeerStatusView, now_ms};
use crate::auth::{Principal, Role};
use crate::context::Shared;
use crate::ops::{self, ApiError};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Extension, Json, Router};
use lattice_adapters::QuorumCommand;
use lattice_control::{NodesIn, SubmitRequest};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

type S = State<Arc<Shared>>;
type P = Extension<Principal>;

/// Tags an allocation submitted from a peer carries here.
pub const ORIGIN_TAG: &str = "federation.origin";
pub const USER_TAG: &str = "federation.user";
pub const TENANT_TAG: &str = "federation.tenant";

/// What a peer sends to submit here.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct FederatedSubmit {
    /// The user at the sending site.
    pub user: String,
    pub request: SubmitRequest,
}

/// `POST /api/v1/federation/allocations`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteSubmit {
    /// `auto` (the broker's recommendation) or a site's name (this one's included).
    pub site: String,
    pub request: SubmitRequest,
}

fn err(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

#[allow(clippy::result_large_err)]
fn broker(s: &Shared) -> Result<Arc<Broker>, Response> {
    s.federation
        .clone()
        .ok_or_else(|| err(StatusCode::NOT_FOUND, "federation is not enabled on this site"))
}

/// Routes between sites (no bearer token: the signature is the credential).
pub fn peer_routes() -> Router<Arc<Shared>> {
    Router::new().route("/federation/v1/{*rest}", any(inbound))
}

/// Routes for this site's users and operators (behind the bearer-token layer).
pub fn user_routes(r: Router<Arc<Shared>>) -> Router<Arc<Shared>> {
    r.route("/api/v1/federation/allocations", get(list_remote).post(submit))
        .route("/api/v1/federation/ended", get(ended))
        .route(
            "/api/v1/federation/allocations/{site}/{id}",
            get(get_remote).delete(cancel_remote),
        )
        .route("/api/v1/federation/allocations/{site}/{id}/logs", get(logs_remote))
        .route("/api/v1/admin/federation", get(status))
        .route("/api/v1/admin/federation/peers", post(add_peer))
        .route(
            "/api/v1/admin/federation/peers/{name}",
            axum::routing::delete(remove_peer),
        )
        .route("/api/v1/admin/federation/workspaces/{ws}/revoke", post(revoke))
}

/// The federation routes, for `/openapi.json` (the peer-facing ones are listed as open: they carry
/// a workspace signature instead of a bearer token).
pub fn documented() -> Vec<crate::openapi::Op> {
    use crate::openapi::Op;
    let f = "federation";
    vec![
        Op::get(
            "/federation/v1/catalog",
            f,
            "Between sites (signed): this site's catalog entry",
        )
        .open(),
        Op::post(
            "/federation/v1/allocations",
            f,
            "Between sites (signed): a peer's submission",
        )
        .open()
        .status(201),
        Op::get(
            "/federation/v1/allocations",
            f,
            "Between sites (signed): the asking site's allocations here",
        )
        .open(),
        Op::get(
            "/federation/v1/allocations/{id}",
            f,
            "Between sites (signed): one of them",
        )
        .open(),
        Op::delete(
            "/federation/v1/allocations/{id}",
            f,
            "Between sites (signed): cancel one",
        )
        .open(),
        Op::get(
            "/federation/v1/allocations/{id}/logs",
            f,
            "Between sites (signed): its output",
        )
        .open(),
        Op::post(
            "/federation/v1/ended",
            f,
            "Between sites (signed): allocations the asking site forwarded here ended (`{\"allocations\": [{id, user, tenant, state, end_reason, ended_ms}]}`)",
        )
        .open(),
        Op::get(
            "/api/v1/federation/ended",
            f,
            "The caller's allocations that ran at peers and ended there, as the peers reported them",
        ),
        Op::post(
            "/api/v1/federation/allocations",
            f,
            "Submit at a site: `{\"site\": \"auto\"|NAME, \"request\": {...}}`; answers the site, id and routing",
        )
        .status(201),
        Op::get(
            "/api/v1/federation/allocations",
            f,
            "The caller's allocations at every peer (`?site=`)",
        ),
        Op::get(
            "/api/v1/federation/allocations/{site}/{id}",
            f,
            "An allocation forwarded to a peer",
        ),
        Op::delete(
            "/api/v1/federation/allocations/{site}/{id}",
            f,
            "Cancel an allocation forwarded to a peer",
        ),
        Op::get(
            "/api/v1/federation/allocations/{site}/{id}/logs",
            f,
            "Its output, from the peer",
        ),
        Op::get(
            "/api/v1/admin/federation",
            f,
            "This site's catalog and every peer's status",
        )
        .answer::<FederationStatus>(),
        Op::post(
            "/api/v1/admin/federation/peers",
            f,
            "Add (or replace) a peer: name, endpoint(s), workspace",
        ),
        Op::delete("/api/v1/admin/federation/peers/{name}", f, "Remove a peer"),
        Op::post(
            "/api/v1/admin/federation/workspaces/{ws}/revoke",
            f,
            "Revoke a shared workspace (every peer in it defederated)",
        ),
    ]
}

// ---- between sites ------------------------------------------------------------------------------

/// Every signed request from a peer: verified, carried out, its answer signed.
async fn inbound(State(s): S, req: axum::extract::Request) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    // During an election nothing is queued: the peer's retries resubmit (book: "Federation Requests
    // During Leader Election"). The catalog is still served (saying `degraded` after 10 s).
    let electing = || {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "5")],
            Json(json!({"error": "the quorum is electing a leader; retry"})),
        )
            .into_response()
    };
    let leaderless = s.member.status().leader.is_none();
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 4 << 20).await else {
        return err(
            StatusCode::PAYLOAD_TOO_LARGE,
            "a federation request's body is at most 4 MiB",
        );
    };
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let method = parts.method.as_str().to_string();
    let (site, key, nonce) = match b.verify_inbound(&s, &method, &path, &parts.headers, &body).await {
        Ok(v) => v,
        // A member that has not applied the peers yet cannot tell: retry after the election.
        Err(_) if leaderless => return electing(),
        Err((code, why)) => {
            tracing::warn!("federation: refused {method} {path}: {why}");
            return err(StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN), why);
        }
    };
    let workspace = parts
        .headers
        .get(super::sign::WORKSPACE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let q: BTreeMap<String, String> = parts.uri.query().map(serde_urlencoded_pairs).unwrap_or_default();
    let answer = if leaderless && parts.uri.path() != "/federation/v1/catalog" {
        electing()
    } else {
        serve_peer(&s, &b, &site, &parts.method, parts.uri.path(), &q, &body).await
    };
    let (mut head, body) = answer.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    if head.status == StatusCode::SERVICE_UNAVAILABLE {
        head.headers
            .insert(axum::http::header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    for (k, v) in b.sign_answer(&key, &workspace, &nonce, head.status.as_u16(), &bytes) {
        if let (Ok(k), Ok(v)) = (
            axum::http::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            head.headers.insert(k, v);
        }
    }
    Response::from_parts(head, axum::body::Body::from(bytes))
}

/// `a=b&c=d` (percent-decoded; a malformed query is an empty one).
fn serde_urlencoded_pairs(q: &str) -> BTreeMap<String, String> {
    serde_urlencoded::from_str(q).unwrap_or_default()
}

/// A peer's principal here: `user@site`, a plain user of the tenant the policy maps to.
fn peer_principal(site: &str, user: &str, tenant: &str) -> Principal {
    Principal {
        user: format!("{user}@{site}"),
        tenant: Some(tenant.to_string()),
        roles: vec![Role::User],
        node: None,
        expires_at: None,
    }
}

/// Sees every allocation (what a peer may see is filtered by origin below).
fn site_reader() -> Principal {
    Principal {
        user: "federation".into(),
        tenant: None,
        roles: vec![Role::ReadOnly],
        node: None,
        expires_at: None,
    }
}

async fn serve_peer(
    s: &Arc<Shared>,
    b: &Broker,
    site: &str,
    method: &axum::http::Method,
    path: &str,
    q: &BTreeMap<String, String>,
    body: &[u8],
) -> Response {
    let rest: Vec<&str> = path
        .trim_start_matches("/federation/v1/")
        .split('/')
        .filter(|x| !x.is_empty())
        .collect();
    use axum::http::Method;
    match (method, rest.as_slice()) {
        (&Method::GET, ["catalog"]) => Json(b.local_catalog(s, Some(site)).await).into_response(),
        (&Method::POST, ["allocations"]) => inbound_submit(s, b, site, body).await,
        (&Method::POST, ["ended"]) => inbound_ended(s, site, body).await,
        (&Method::GET, ["allocations"]) => match ops::list(s, &site_reader(), &ops::ListFilter::default()).await {
            Ok(all) => {
                let mine: Vec<_> = all
                    .into_iter()
                    .filter(|v| v.tags.get(ORIGIN_TAG).map(String::as_str) == Some(site))
                    .filter(|v| q.get("user").is_none_or(|u| v.tags.get(USER_TAG) == Some(u)))
                    .collect();
                Json(json!({ "allocations": mine })).into_response()
            }
            Err(e) => e.into_response(),
        },
        (m, ["allocations", id, tail @ ..]) => {
            let view = match ops::get(s, &site_reader(), id).await {
                Ok(v) if v.tags.get(ORIGIN_TAG).map(String::as_str) == Some(site) => v,
                Ok(_) => return err(StatusCode::NOT_FOUND, format!("{id} was not submitted from {site}")),
                Err(e) => return e.into_response(),
            };
            match (m, tail) {
                (&Method::GET, []) => Json(view).into_response(),
                (&Method::DELETE, []) => {
                    let user = view.tags.get(USER_TAG).cloned().unwrap_or_default();
                    let p = peer_principal(site, &user, &view.tenant);
                    match ops::cancel(s, &p, id).await {
                        Ok(state) => Json(json!({"id": id, "state": state})).into_response(),
                        Err(e) => e.into_response(),
                    }
                }
                (&Method::GET, ["logs"]) => {
                    let stream = lattice_adapters::logstore::Stream::Stdout;
                    let range = lattice_adapters::logstore::Range::default();
                    match ops::logs(s, &site_reader(), id, (None, stream), &range).await {
                        Ok((source, l)) => Json(json!({"id": id, "source": source, "nodes": l})).into_response(),
                        Err(e) => e.into_response(),
                    }
                }
                _ => err(StatusCode::NOT_FOUND, format!("no federation route {method} {path}")),
            }
        }
        _ => err(StatusCode::NOT_FOUND, format!("no federation route {method} {path}")),
    }
}

/// One ended allocation a peer reports (`POST /federation/v1/ended`).
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct EndedIn {
    id: String,
    user: String,
    tenant: String,
    state: String,
    #[serde(default)]
    end_reason: Option<String>,
    ended_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndedReport {
    allocations: Vec<EndedIn>,
}

/// A peer reports that allocations this site forwarded there ended (book: "On completion: Site B
/// reports results, Site A's user notified"): each is committed at the quorum once, for its user
/// (`GET /api/v1/federation/ended`), and logged.
async fn inbound_ended(s: &Arc<Shared>, site: &str, body: &[u8]) -> Response {
    let r: EndedReport = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    if let Some(e) = r
        .allocations
        .iter()
        .find(|e| !matches!(e.state.as_str(), "completed" | "failed" | "cancelled"))
    {
        return err(
            StatusCode::BAD_REQUEST,
            format!("allocations: {} is {}, not ended", e.id, e.state),
        );
    }
    let known = s.member.read(|q| q.federated_ends.clone()).await;
    let mut recorded = 0;
    for e in r.allocations {
        if known.contains_key(&format!("{site}/{}", e.id)) {
            continue;
        }
        let end = lattice_adapters::FederatedEnd {
            site: site.to_string(),
            id: e.id,
            user: e.user,
            tenant: e.tenant,
            state: e.state,
            end_reason: e.end_reason,
            ended_ms: e.ended_ms,
            at_ms: super::now_ms(),
        };
        let what = format!("{} at {site} ended {} ({})", end.id, end.state, end.user);
        match s.member.propose(QuorumCommand::FederatedEnd(end)).await {
            Ok(_) => {
                recorded += 1;
                tracing::info!("federation: {what}");
            }
            Err(lattice_adapters::ProposeError::NotLeader { leader_id, leader }) => {
                return crate::ops::redirect(s, leader_id, leader).into_response();
            }
            Err(e) => {
                return err(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{what}: not committed at the quorum ({e}); retry"),
                );
            }
        }
    }
    Json(json!({ "recorded": recorded })).into_response()
}

/// Reports to each origin site the allocations it forwarded here that ended and are not reported
/// yet (`reported`: ids already delivered by this member; a new leader reports again, which the
/// origin ignores). One attempt per origin: what fails goes at the next round.
pub async fn report_ends(s: &Shared, b: &Broker, reported: &mut std::collections::BTreeSet<String>) {
    let Ok(all) = ops::list(s, &site_reader(), &ops::ListFilter::default()).await else {
        return;
    };
    let mut by_origin: BTreeMap<String, Vec<(String, EndedIn)>> = BTreeMap::new();
    for v in all {
        let (Some(origin), Some(ended_ms)) = (v.tags.get(ORIGIN_TAG), v.ended_ms) else {
            continue;
        };
        let key = format!("{origin}/{}", v.id);
        if reported.contains(&key) || !matches!(v.state.as_str(), "completed" | "failed" | "cancelled") {
            continue;
        }
        by_origin.entry(origin.clone()).or_default().push((
            key,
            EndedIn {
                user: v.tags.get(USER_TAG).cloned().unwrap_or_default(),
                tenant: v.tags.get(TENANT_TAG).cloned().unwrap_or_default(),
                state: v.state.clone(),
                end_reason: v.end_reason.clone(),
                ended_ms,
                id: v.id,
            },
        ));
    }
    for (origin, ends) in by_origin {
        let (keys, body): (Vec<String>, Vec<EndedIn>) = ends.into_iter().unzip();
        let body = json!({ "allocations": body });
        match b
            .call_once(s, &origin, reqwest::Method::POST, "/federation/v1/ended", Some(&body))
            .await
        {
            Ok(a) if a.status == 200 => reported.extend(keys),
            Ok(a) => tracing::warn!("federation: reporting ends to {origin}: {} {}", a.status, a.body),
            Err(e) => tracing::warn!("federation: reporting ends to {origin}: {e} (again at the next round)"),
        }
    }
}

/// `GET /api/v1/federation/ended`: the caller's allocations that ran at peers and ended there
/// (everyone's for an administrator or a read-only auditor), newest first.
pub(crate) async fn ended(State(s): S, Extension(p): P) -> Response {
    if let Err(r) = broker(&s) {
        return r;
    }
    let all = s.member.read(|q| q.federated_ends.clone()).await;
    let mut mine: Vec<_> = all
        .into_values()
        .filter(|e| reads_all(&p) || e.user == p.user)
        .collect();
    mine.sort_by(|a, b| b.ended_ms.cmp(&a.ended_ms).then_with(|| a.id.cmp(&b.id)));
    Json(json!({ "ended": mine })).into_response()
}

fn nodes_asked(r: &SubmitRequest) -> u32 {
    match r.resources.nodes {
        NodesIn::Exact(n) => n.max(0) as u32,
        NodesIn::Range { max, .. } => max.max(0) as u32,
    }
}

/// A peer's submission: its policy checked, then submitted into this site's quorum as `user@site`.
async fn inbound_submit(s: &Arc<Shared>, b: &Broker, site: &str, body: &[u8]) -> Response {
    let refuse = |status: StatusCode, why: String| {
        b.metrics.proposals.with_label_values(&[site, "rejected"]).inc();
        tracing::info!("federation: refused a submission from {site}: {why}");
        err(status, why)
    };
    let mut f: FederatedSubmit = match serde_json::from_slice(body) {
        Ok(f) => f,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    let Some(policy) = b.cfg.accept.get(site) else {
        return refuse(
            StatusCode::FORBIDDEN,
            format!("{} accepts no submissions from {site}", b.cfg.site),
        );
    };
    if f.request.sensitive {
        return refuse(
            StatusCode::FORBIDDEN,
            "sensitive workloads do not federate: they run where their data is".into(),
        );
    }
    let Some(tenant) = policy.tenants.get(&f.request.tenant).cloned() else {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "tenant {} of {site} is not authorized at {}",
                f.request.tenant, b.cfg.site
            ),
        );
    };
    let asked = nodes_asked(&f.request);
    if let Some(max) = policy.max_nodes.filter(|m| asked > *m) {
        return refuse(
            StatusCode::FORBIDDEN,
            format!("{asked} nodes asked; {site}'s requests may have at most {max} here"),
        );
    }
    if f.user.trim().is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "user: required".into());
    }
    let p = peer_principal(site, &f.user, &tenant);
    let remote_tenant = std::mem::replace(&mut f.request.tenant, tenant);
    f.request.user = None;
    f.request.tags.insert(ORIGIN_TAG.into(), site.to_string());
    f.request.tags.insert(USER_TAG.into(), f.user.clone());
    f.request.tags.insert(TENANT_TAG.into(), remote_tenant);
    match ops::submit(s, &p, f.request).await {
        Ok(a) => {
            b.metrics.proposals.with_label_values(&[site, "accepted"]).inc();
            tracing::info!("federation: {} from {site} ({}) accepted", a.id, f.user);
            (
                StatusCode::CREATED,
                Json(json!({"site": b.cfg.site, "id": a.id, "elements": a.elements})),
            )
                .into_response()
        }
        Err(e @ (ApiError::Unavailable { .. } | ApiError::NotLeader { .. })) => e.into_response(),
        Err(e) => {
            b.metrics.proposals.with_label_values(&[site, "rejected"]).inc();
            e.into_response()
        }
    }
}

// ---- this site's users --------------------------------------------------------------------------

fn forbidden(why: String) -> Response {
    err(StatusCode::FORBIDDEN, format!("forbidden: {why}"))
}

/// What routing needs from a submission.
fn routing_request(r: &SubmitRequest) -> route::Request {
    route::Request {
        nodes: nodes_asked(r),
        gpu_type: r.resources.constraints.as_ref().and_then(|c| c.gpu_type.clone()),
        sensitive: r.sensitive,
        data: r
            .data
            .as_ref()
            .map(|d| d.mounts.iter().map(|m| (m.source.clone(), m.size_gb)).collect())
            .unwrap_or_default(),
        uenv: r.environment.as_ref().and_then(|e| e.uenv.clone()),
    }
}

/// A peer the quorum knows, with what this member knows of it now.
struct PeerNow {
    name: String,
    peer: lattice_adapters::FederationPeer,
    revoked: bool,
    view: super::PeerView,
    status: PeerStatus,
}

/// Every peer now, and the revoked workspaces.
async fn peers_now(s: &Shared, b: &Broker) -> (Vec<PeerNow>, std::collections::BTreeSet<String>) {
    let (peers, revoked) = s
        .member
        .read(|q| (q.federation_peers.clone(), q.revoked_workspaces.clone()))
        .await;
    let views = b.views.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let now = now_ms();
    let all = peers
        .into_iter()
        .map(|(name, peer)| {
            let view = views.get(&name).cloned().unwrap_or_default();
            PeerNow {
                status: view.status(&b.cfg, peer.added_ms, now),
                revoked: revoked.contains(&peer.workspace),
                name,
                peer,
                view,
            }
        })
        .collect();
    (all, revoked)
}

/// Every site as routing sees it: this one first, then each peer from the catalog.
async fn sites(s: &Shared, b: &Broker, tenant: &str) -> Vec<route::Site> {
    let local = b.local_catalog(s, None).await;
    let mut out = vec![site_of(&local, true, PeerStatus::Healthy, true)];
    for p in peers_now(s, b).await.0.into_iter().filter(|p| !p.revoked) {
        let status = p.status;
        match &p.view.catalog {
            Some(c) => out.push(site_of(c, false, status, c.tenants.iter().any(|t| t == tenant))),
            None => out.push(route::Site {
                name: p.name,
                local: false,
                status,
                nodes: 0,
                available_nodes: 0,
                gpu_types: Vec::new(),
                energy_price: None,
                datasets: Vec::new(),
                authorized: false,
                uenvs: Vec::new(),
                known: false,
            }),
        }
    }
    out
}

fn site_of(c: &super::Catalog, local: bool, status: PeerStatus, authorized: bool) -> route::Site {
    route::Site {
        name: c.site.clone(),
        local,
        status,
        nodes: c.nodes,
        available_nodes: c.available_nodes,
        gpu_types: c.gpu_types.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        energy_price: c.energy_price,
        datasets: c.datasets.clone(),
        authorized,
        uenvs: c.uenvs.clone(),
        known: true,
    }
}

/// `POST /api/v1/federation/allocations`: routed, then submitted here or forwarded.
pub(crate) async fn submit(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let SiteSubmit { site, mut request } = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    if !p.can_submit_for(&request.tenant) {
        return forbidden(format!("{} may not submit for tenant {}", p.user, request.tenant));
    }
    let target = if site == "auto" {
        Target::Auto
    } else {
        Target::Site(site.clone())
    };
    // A peer asked for by name whose catalog has not come yet: fetch it now.
    if let Target::Site(name) = &target
        && *name != b.cfg.site
    {
        let known = b
            .views
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .is_some_and(|v| v.catalog.is_some());
        if !known && let Err(e) = b.sync_peer(&s, name).await {
            tracing::info!("federation: catalog of {name} before routing: {e}");
        }
    }
    let rr = routing_request(&request);
    let known = sites(&s, &b, &request.tenant).await;
    let mut routing = route::route(&rr, &known, &target, &b.cfg.weights);
    for peer in known.iter().filter(|x| !x.local) {
        for (source, _) in &rr.data {
            let held = peer.datasets.iter().any(|d| source.starts_with(d.name.as_str()));
            b.metrics
                .data_gravity
                .with_label_values(&[&peer.name, source])
                .set(f64::from(u8::from(held)));
        }
    }
    let local = |s: Arc<Shared>, p: Principal, request: SubmitRequest, routing: route::Routing, site: String| async move {
        match ops::submit(&s, &p, request).await {
            Ok(a) => (
                StatusCode::CREATED,
                Json(json!({"site": site, "id": a.id, "elements": a.elements, "routing": routing})),
            )
                .into_response(),
            Err(e) => e.into_response(),
        }
    };
    match routing.decision.clone() {
        Decision::Local => local(s.clone(), p, request, routing, b.cfg.site.clone()).await,
        Decision::Reject(why) => (
            StatusCode::CONFLICT,
            Json(json!({"error": format!("no site can take it: {why}"), "routing": routing})),
        )
            .into_response(),
        Decision::Remote(peer) => {
            // One key for every retry: the peer queues it once however often it arrives.
            if request.idempotency_key.is_none() {
                request.idempotency_key = Some(format!("fed-{}-{}", b.cfg.site, super::sign::hex(&rand_bytes())));
            }
            let user = if p.is_admin() {
                request.user.clone().unwrap_or_else(|| p.user.clone())
            } else {
                p.user.clone()
            };
            let body = json!({"user": user, "request": request});
            let t0 = std::time::Instant::now();
            let answer = b
                .call(
                    &s,
                    &peer,
                    reqwest::Method::POST,
                    "/federation/v1/allocations",
                    Some(&body),
                )
                .await;
            b.metrics
                .latency
                .with_label_values(&[&peer])
                .observe(t0.elapsed().as_secs_f64());
            let fall_back = |why: String, routing: &mut route::Routing| {
                routing
                    .warnings
                    .push(format!("{why}; scheduled at {} instead", b.cfg.site));
                routing.decision = Decision::Local;
            };
            match answer {
                Ok(a) if a.status == 201 => {
                    b.metrics.proposals.with_label_values(&[&peer, "accepted"]).inc();
                    (
                        StatusCode::CREATED,
                        Json(json!({
                            "site": peer,
                            "id": a.body.get("id"),
                            "elements": a.body.get("elements"),
                            "routing": routing,
                        })),
                    )
                        .into_response()
                }
                Ok(a) => {
                    b.metrics.proposals.with_label_values(&[&peer, "rejected"]).inc();
                    let why = format!(
                        "{peer} refused it ({}): {}",
                        a.status,
                        a.body.get("error").and_then(Value::as_str).unwrap_or("")
                    );
                    if target == Target::Auto {
                        fall_back(why, &mut routing);
                        local(s.clone(), p, request, routing, b.cfg.site.clone()).await
                    } else {
                        let status = StatusCode::from_u16(a.status)
                            .ok()
                            .filter(|c| c.is_client_error())
                            .unwrap_or(StatusCode::BAD_GATEWAY);
                        (status, Json(json!({"error": why, "routing": routing}))).into_response()
                    }
                }
                Err(e) => {
                    if matches!(e, CallError::Unreachable(_)) {
                        b.metrics.proposals.with_label_values(&[&peer, "timeout"]).inc();
                    }
                    if target == Target::Auto {
                        fall_back(e.to_string(), &mut routing);
                        local(s.clone(), p, request, routing, b.cfg.site.clone()).await
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            Json(json!({"error": e.to_string(), "routing": routing})),
                        )
                            .into_response()
                    }
                }
            }
        }
    }
}

fn rand_bytes() -> [u8; 12] {
    let mut b = [0u8; 12];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).expect("the system's random source");
    b
}

/// Whether `p` may see a forwarded allocation's view (its own, or any for readers of everything).
fn may_see(p: &Principal, view: &Value) -> bool {
    reads_all(p) || view["tags"][USER_TAG].as_str() == Some(p.user.as_str())
}

/// SystemAdmin, Operator and ReadOnly read everything.
fn reads_all(p: &Principal) -> bool {
    p.is_admin() || p.has(Role::Operator) || p.has(Role::ReadOnly)
}

/// A peer's answer, passed on (its status kept); an unreachable peer is a 503 naming it.
#[allow(clippy::result_large_err)]
fn relay(site: &str, a: Result<super::broker::Answer, CallError>) -> Result<(StatusCode, Value), Response> {
    match a {
        Ok(a) => Ok((
            StatusCode::from_u16(a.status).unwrap_or(StatusCode::BAD_GATEWAY),
            a.body,
        )),
        Err(CallError::Setup(m)) => Err(err(StatusCode::NOT_FOUND, m)),
        Err(CallError::Unreachable(m)) => Err(err(StatusCode::SERVICE_UNAVAILABLE, format!("{site}: {m}"))),
    }
}

async fn fetch_view(s: &Shared, b: &Broker, p: &Principal, site: &str, id: &str) -> Result<Value, Response> {
    let path = format!("/federation/v1/allocations/{id}");
    let (status, mut v) = relay(site, b.call(s, site, reqwest::Method::GET, &path, None).await)?;
    if !status.is_success() {
        return Err((status, Json(v)).into_response());
    }
    if !may_see(p, &v) {
        return Err(err(
            StatusCode::NOT_FOUND,
            format!("no allocation {id} of yours at {site}"),
        ));
    }
    v["site"] = json!(site);
    Ok(v)
}

/// `GET /api/v1/federation/allocations/{site}/{id}`: the allocation's state at the peer.
pub(crate) async fn get_remote(State(s): S, Extension(p): P, Path((site, id)): Path<(String, String)>) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    match fetch_view(&s, &b, &p, &site, &id).await {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

pub(crate) async fn cancel_remote(State(s): S, Extension(p): P, Path((site, id)): Path<(String, String)>) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let view = match fetch_view(&s, &b, &p, &site, &id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !(p.is_admin() || view["tags"][USER_TAG].as_str() == Some(p.user.as_str())) {
        return forbidden(format!("{} may not cancel {id} at {site}", p.user));
    }
    let path = format!("/federation/v1/allocations/{id}");
    match relay(&site, b.call(&s, &site, reqwest::Method::DELETE, &path, None).await) {
        Ok((status, v)) => (status, Json(v)).into_response(),
        Err(r) => r,
    }
}

pub(crate) async fn logs_remote(State(s): S, Extension(p): P, Path((site, id)): Path<(String, String)>) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Err(r) = fetch_view(&s, &b, &p, &site, &id).await {
        return r;
    }
    let path = format!("/federation/v1/allocations/{id}/logs");
    match relay(&site, b.call(&s, &site, reqwest::Method::GET, &path, None).await) {
        Ok((status, mut v)) => {
            v["site"] = json!(site);
            (status, Json(v)).into_response()
        }
        Err(r) => r,
    }
}

#[derive(Deserialize)]
pub(crate) struct ListIn {
    pub(crate) site: Option<String>,
}

/// `GET /api/v1/federation/allocations`: the caller's allocations at every peer (each peer asked
/// now; one that does not answer is listed under `unreachable`).
pub(crate) async fn list_remote(State(s): S, Extension(p): P, Query(q): Query<ListIn>) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let peers = s.member.read(|q| q.federation_peers.clone()).await;
    let sees_all = reads_all(&p);
    let mut all = Vec::new();
    let mut unreachable = BTreeMap::new();
    for name in peers.keys().filter(|n| q.site.as_ref().is_none_or(|s| s == *n)) {
        let path = if sees_all {
            "/federation/v1/allocations".to_string()
        } else {
            format!("/federation/v1/allocations?user={}", encode(&p.user))
        };
        match b.call(&s, name, reqwest::Method::GET, &path, None).await {
            Ok(a) if a.status == 200 => {
                for mut v in a.body["allocations"].as_array().cloned().unwrap_or_default() {
                    if may_see(&p, &v) {
                        v["site"] = json!(name);
                        all.push(v);
                    }
                }
            }
            Ok(a) => {
                unreachable.insert(name.clone(), format!("{}: {}", a.status, a.body));
            }
            Err(e) => {
                unreachable.insert(name.clone(), e.to_string());
            }
        }
    }
    Json(json!({"allocations": all, "unreachable": unreachable})).into_response()
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `GET /api/v1/admin/federation`: this site's catalog and every peer's status and catalog.
pub(crate) async fn status(State(s): S, Extension(p): P) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !reads_all(&p) {
        return forbidden(format!("{} may not read the federation's status", p.user));
    }
    let (peers, revoked) = peers_now(&s, &b).await;
    let peers = peers
        .into_iter()
        .map(|p| PeerStatusView {
            status: p.status,
            revoked: p.revoked,
            name: p.name,
            endpoints: p.peer.endpoints,
            workspace: p.peer.workspace,
            synced_ms: p.view.synced_ms,
            last_error: p.view.failing,
            catalog: p.view.catalog,
        })
        .collect();
    Json(FederationStatus {
        site: b.cfg.site.clone(),
        sync_interval: b.cfg.sync_interval.clone(),
        local: b.local_catalog(&s, None).await,
        peers,
        revoked_workspaces: revoked.into_iter().collect(),
    })
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerIn {
    name: String,
    /// One endpoint or several (the peer's members).
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    endpoints: Vec<String>,
    workspace: String,
}

/// Proposes a federation change (SystemAdmin only: the book's operators cannot manage federation).
async fn commit(s: &Shared, p: &Principal, cmd: QuorumCommand, what: &str) -> Response {
    if !p.is_admin() {
        return forbidden(format!("{} may not manage federation (SystemAdmin)", p.user));
    }
    match s.member.propose(cmd).await {
        Ok(lattice_adapters::QuorumResponse::Applied | lattice_adapters::QuorumResponse::Batch(_)) => {
            Json(json!({"ok": what})).into_response()
        }
        Ok(lattice_adapters::QuorumResponse::Rejected { reason, message }) => {
            let status = if reason == "no_peer" {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::CONFLICT
            };
            err(status, message)
        }
        Err(lattice_adapters::ProposeError::NotLeader { leader_id, leader }) => {
            crate::ops::redirect(s, leader_id, leader).into_response()
        }
        Err(e) => err(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{what}: not committed at the quorum ({e}); retry"),
        ),
    }
}

pub(crate) async fn add_peer(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
    let b = match broker(&s) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let r: PeerIn = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    let mut endpoints = r.endpoints.clone();
    endpoints.extend(r.endpoint.clone());
    let bad =
        |field: &str, m: String| (StatusCode::BAD_REQUEST, Json(json!({"error": m, "field": field}))).into_response();
    if r.name.trim().is_empty() || r.name == b.cfg.site {
        return bad("name", format!("`{}`: a peer's site name (not this site's)", r.name));
    }
    if endpoints.is_empty() {
        return bad("endpoint", "at least one endpoint (http[s]://host:port)".into());
    }
    if let Some(e) = endpoints
        .iter()
        .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
    {
        return bad("endpoint", format!("`{e}`: http[s]://host:port"));
    }
    if let Err(e) = b.cfg.key(&r.workspace) {
        return bad("workspace", e);
    }
    let cmd = QuorumCommand::PutFederationPeer {
        name: r.name.clone(),
        endpoints,
        workspace: r.workspace,
        at_ms: now_ms(),
        by: p.user.clone(),
    };
    commit(&s, &p, cmd, &format!("peer {} added", r.name)).await
}

pub(crate) async fn remove_peer(State(s): S, Extension(p): P, Path(name): Path<String>) -> Response {
    let (at_ms, by) = (now_ms(), p.user.clone());
    let what = format!("peer {name} removed");
    change(&s, &p, QuorumCommand::RemoveFederationPeer { name, at_ms, by }, &what).await
}

pub(crate) async fn revoke(State(s): S, Extension(p): P, Path(workspace): Path<String>) -> Response {
    let (at_ms, by) = (now_ms(), p.user.clone());
    let what = format!("workspace {workspace} revoked");
    change(&s, &p, QuorumCommand::RevokeWorkspace { workspace, at_ms, by }, &what).await
}

/// [`commit`] on a site with federation.
async fn change(s: &Shared, p: &Principal, cmd: QuorumCommand, what: &str) -> Response {
    match broker(s) {
        Ok(_) => commit(s, p, cmd, what).await,
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_strings_decode() {
        let q = super::serde_urlencoded_pairs("user=alice%40x&b=c+d");
        assert_eq!(q["user"], "alice@x");
        assert_eq!(q["b"], "c d");
        assert_eq!(super::encode("a@b c"), "a%40b%20c");
        assert_eq!(
            super::serde_urlencoded_pairs(&format!("user={}", super::encode("ü@x")))
                .get("user")
                .unwrap(),
            "ü@x"
        );
    }
}
