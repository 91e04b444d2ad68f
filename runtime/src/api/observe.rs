//! Logs (stored, live and streamed), per-allocation metrics, diagnostics and comparisons.

use super::common::*;
use crate::context::Shared;
use crate::ops::{self, ApiError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use lattice_adapters::logstore::Stream;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LogsIn {
    node: Option<String>,
    /// `stdout` (the default) or `stderr`.
    stream: Option<String>,
    offset: Option<u64>,
    limit: Option<u64>,
    since: Option<String>,
    until: Option<String>,
}

pub(super) async fn logs(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<LogsIn>,
) -> Response {
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

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LiveIn {
    /// `NODE:OFFSET,...`: what the follower already has.
    after: Option<String>,
    /// `stdout` (the default) or `stderr`.
    stream: Option<String>,
}

/// The `stream` query parameter: `stdout` when absent.
#[allow(clippy::result_large_err)]
pub(super) fn stream_of(v: Option<&str>) -> Result<Stream, Response> {
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
pub(super) fn offsets(after: Option<&str>) -> Result<BTreeMap<String, u64>, Response> {
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

pub(super) async fn live_logs(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<LiveIn>,
) -> Response {
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
pub(super) struct MetricsIn {
    /// `summary` (the default), `per-node` or `per-gpu`.
    mode: Option<String>,
    /// How far back to look, e.g. `5m` (the default), `30s`, `1h`.
    duration: Option<String>,
    /// Comma-separated metric names (default: all).
    metrics: Option<String>,
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CompareIn {
    /// Comma-separated allocation ids (2 to 10).
    ids: Option<String>,
    /// Comma-separated metric names (default: all).
    metrics: Option<String>,
    /// `relative` (time from each allocation's start, the default) or `absolute` (unix seconds).
    align: Option<String>,
    /// Seconds between points, e.g. `5s` (default: a 120th of each run, at least 1 s).
    step: Option<String>,
}

/// The TSDB, or 503 saying how to configure one.
#[allow(clippy::result_large_err)]
pub(super) fn tsdb(s: &Shared) -> Result<&lattice_adapters::tsdb::Tsdb, Response> {
    s.tsdb.as_ref().ok_or_else(|| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "no TSDB configured: set services.tsdb in the runtime's config (the agents' --remote-write target)",
        )
    })
}

pub(super) async fn alloc_metrics(
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
pub(super) async fn stream_metrics(
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
    sse(p.stream_deadline(), move |tx| async move {
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

pub(super) async fn diagnostics(s: S, p: P, id: Path<String>, q: QueryIn<MetricsIn>) -> Response {
    diagnose(s, p, id.0, None, q.0).await
}

pub(super) async fn diagnostics_part(
    s: S,
    p: P,
    Path((id, part)): Path<(String, String)>,
    q: QueryIn<MetricsIn>,
) -> Response {
    if part != "network" && part != "storage" {
        return error(
            StatusCode::NOT_FOUND,
            Some("part"),
            format!("`{part}`: expected network or storage"),
        );
    }
    diagnose(s, p, id, Some(part), q.0).await
}

pub(super) async fn diagnose(State(s): S, Extension(p): P, id: String, part: Option<String>, q: MetricsIn) -> Response {
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

pub(super) async fn compare(State(s): S, Extension(p): P, QueryIn(q): QueryIn<CompareIn>) -> Response {
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

/// How often the SSE log stream looks for new output.
pub(super) const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(300);

/// `GET /v1/allocations/{id}/logs/stream`: the live tail pushed as Server-Sent Events. Each new piece
/// of a node's output is an `output` event; once the allocation has ended and three looks in a row
/// found nothing new (its agents' final output has arrived), the tail reported with the exit of a
/// node whose output never came live (a run shorter than its agent's polls), then one `end` event
/// with its state closes the stream. A client that goes away ends the relay.
pub(super) async fn stream_logs(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<LiveIn>,
) -> Response {
    use axum::response::sse::Event;
    let (mut after, stream) = match (offsets(q.after.as_deref()), stream_of(q.stream.as_deref())) {
        (Ok(a), Ok(s)) => (a, s),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    // Refusals (unknown id, another user's allocation) are answered as such, before the stream.
    if let Err(e) = ops::live_logs(&s, &p, &id, stream, &BTreeMap::new()).await {
        return e.into_response();
    }
    sse(p.stream_deadline(), move |tx| async move {
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
                        // A node whose output never came live (a run shorter than its agent's
                        // polls): the tail its agent reported with the exit.
                        let tails = s.control.lock().await.logs(&id, stream).unwrap_or_default();
                        for (node, tail) in tails
                            .into_iter()
                            .filter(|(n, t)| !after.contains_key(n) && !t.is_empty())
                        {
                            let ev = json!({"node": node, "offset": 0, "data": tail, "next": tail.len()});
                            if tx
                                .send(Ok(Event::default().event("output").data(ev.to_string())))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
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
