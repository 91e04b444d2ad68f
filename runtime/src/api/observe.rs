//! Logs (stored, live and streamed), per-allocation metrics, diagnostics and comparisons: the
//! documents and event relays of [`crate::ops`] over HTTP (streams as Server-Sent Events).

use super::common::*;
use crate::ops;
use axum::Extension;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};

pub(super) async fn logs(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<ops::LogsQuery>,
) -> Response {
    answer(ops::logs_document(&s, &p, &id, &q).await)
}

pub(super) async fn live_logs(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<ops::LiveQuery>,
) -> Response {
    answer(ops::live_logs_document(&s, &p, &id, &q).await)
}

pub(super) async fn alloc_metrics(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<ops::MetricsQuery>,
) -> Response {
    answer(ops::metrics_document(&s, &p, &id, &q).await)
}

/// `GET /v1/allocations/{id}/metrics/stream`: [`ops::relay_metrics`]'s events (`--alerts-only`
/// clients keep only the `alert` ones).
pub(super) async fn stream_metrics(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<ops::MetricsQuery>,
) -> Response {
    if let Err(e) = ops::open_metrics_stream(&s, &p, &id).await {
        return e.into_response();
    }
    let until = p.stream_deadline();
    sse_events(until, move |tx| ops::relay_metrics(s, p, id, q.metrics, tx))
}

pub(super) async fn diagnostics(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<ops::MetricsQuery>,
) -> Response {
    answer(ops::diagnostics_document(&s, &p, &id, None, &q).await)
}

pub(super) async fn diagnostics_part(
    State(s): S,
    Extension(p): P,
    Path((id, part)): Path<(String, String)>,
    QueryIn(q): QueryIn<ops::MetricsQuery>,
) -> Response {
    answer(ops::diagnostics_document(&s, &p, &id, Some(&part), &q).await)
}

pub(super) async fn compare(State(s): S, Extension(p): P, QueryIn(q): QueryIn<ops::CompareQuery>) -> Response {
    answer(ops::compare_document(&s, &p, &q).await)
}

/// `GET /v1/allocations/{id}/logs/stream`: the live tail pushed as Server-Sent Events
/// ([`ops::relay_logs`]'s `output` events, then `end`). Refusals (unknown id, another user's
/// allocation) are answered as such, before the stream.
pub(super) async fn stream_logs(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<ops::LiveQuery>,
) -> Response {
    let (stream, after) = match ops::open_log_stream(&s, &p, &id, &q).await {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let until = p.stream_deadline();
    sse_events(until, move |tx| ops::relay_logs(s, p, id, stream, after, tx))
}
