//! Pieces every REST handler shares: the state and principal extractors, the JSON error answers
//! (the API's refusals as status codes), body/query/path extractors whose refusal names the field,
//! and Server-Sent Events.

use crate::auth::Principal;
use crate::context::Shared;
use crate::ops::{self, ApiError};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use std::sync::Arc;

pub(super) type S = State<Arc<Shared>>;

pub(super) type P = Extension<Principal>;

pub(super) fn forbidden(what: &str) -> Response {
    error(StatusCode::FORBIDDEN, None, format!("forbidden: {what}"))
}

pub(super) fn error(status: StatusCode, field: Option<&str>, message: impl Into<String>) -> Response {
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
            ApiError::NotLeader {
                leader_id,
                leader,
                leader_url,
            } => (
                StatusCode::MISDIRECTED_REQUEST,
                Json(
                    json!({"error": "not the quorum leader", "leader_id": leader_id, "leader_grpc": leader, "leader_url": leader_url}),
                ),
            )
                .into_response(),
        }
    }
}

/// The `x-lattice-tenant` header.
pub(super) fn tenant_header(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get("x-lattice-tenant").and_then(|v| v.to_str().ok())
}

/// A body serde could not read: 400 naming the unknown or mistyped field.
/// A JSON body whose refusal is the API's 400 naming the field (axum's own `Json` answers plain text).
pub(super) struct JsonIn<T>(pub(super) T);

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
pub(super) struct QueryIn<T>(pub(super) T);

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
pub(super) struct PathIn<T>(pub(super) T);

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
pub(super) fn named_field(msg: &str) -> Option<&str> {
    if msg.contains("field")
        && let Some(f) = msg.split('`').nth(1).filter(|f| !f.is_empty())
    {
        return Some(f);
    }
    let rest = msg.split_once("query string: ")?.1;
    let (name, _) = rest.split_once(": ")?;
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')).then_some(name)
}

pub(super) fn body_error(e: serde_json::Error) -> Response {
    let msg = e.to_string();
    let field = named_field(&msg).unwrap_or("body").to_string();
    error(StatusCode::BAD_REQUEST, Some(&field), msg)
}

/// A JSON object body, or 400 naming `body`.
#[allow(clippy::result_large_err)]
pub(super) fn object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(error(StatusCode::BAD_REQUEST, Some("body"), "expected a JSON object")),
        Err(e) => Err(body_error(e)),
    }
}

/// A document as the answer (200), or the refusal.
pub(super) fn answer(r: Result<Value, ops::ApiError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// What a Server-Sent Events relay sends on.
pub(super) type EventTx = tokio::sync::mpsc::Sender<Result<axum::response::sse::Event, std::convert::Infallible>>;

/// A Server-Sent Events answer fed by `relay`, which runs on a task of its own until it returns, the
/// client goes away (its sends fail) or `until` (the caller's token expires: an `error` event says so
/// and the stream ends); comments keep an idle connection alive.
pub(super) fn sse<F, Fut>(until: Option<tokio::time::Instant>, relay: F) -> Response
where
    F: FnOnce(EventTx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use axum::response::sse::{Event, KeepAlive, Sse};
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let last = tx.clone();
    let relay = relay(tx);
    tokio::spawn(async move {
        match until {
            None => relay.await,
            Some(deadline) => {
                if tokio::time::timeout_at(deadline, relay).await.is_err() {
                    let expired = Event::default()
                        .event("error")
                        .data(serde_json::json!({"error": "token expired"}).to_string());
                    let _ = last.send(Ok(expired)).await;
                }
            }
        }
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A Server-Sent Events answer of an [`ops::EventTx`] relay's named events (each one's data as JSON).
pub(super) fn sse_events<F, Fut>(until: Option<tokio::time::Instant>, relay: F) -> Response
where
    F: FnOnce(ops::EventTx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (etx, mut erx) = tokio::sync::mpsc::channel(16);
    let producer = relay(etx);
    sse(until, move |tx| async move {
        let forward = async move {
            while let Some((name, data)) = erx.recv().await {
                let ev = axum::response::sse::Event::default().event(name).data(data.to_string());
                if tx.send(Ok(ev)).await.is_err() {
                    // The client went away: dropping the receiver ends the relay.
                    break;
                }
            }
        };
        tokio::join!(producer, forward);
    })
}
