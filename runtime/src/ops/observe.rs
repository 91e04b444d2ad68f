//! Watching allocations, for REST and gRPC alike: stored and live output, metrics snapshots,
//! diagnostics and comparisons as the API's JSON documents, and the log and metrics streams as
//! relays of named events (REST sends them as Server-Sent Events, gRPC as a message stream).

use super::allocations::{get, live_logs, logs};
use super::common::audit_access;
use super::common::parse_instant;
use crate::auth::Principal;
use crate::context::Shared;
use crate::error::ApiError;
use crate::observe::ObserveError;
use lattice_adapters::logstore::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

impl From<ObserveError> for ApiError {
    fn from(e: ObserveError) -> ApiError {
        match e {
            ObserveError::Bad(field, message) => ApiError::BadRequest {
                field: field.into(),
                message,
            },
            ObserveError::Unavailable(message) => ApiError::Unavailable { message },
        }
    }
}

/// Where a relay sends its events: the event's name (`output`, `metrics`, `alert`, `error`, `end`)
/// and its data. A relay ends when the receiver is gone.
pub type EventTx = tokio::sync::mpsc::Sender<(&'static str, Value)>;

/// The `stream` parameter: `stdout` when absent.
pub fn stream_named(v: Option<&str>) -> Result<Stream, ApiError> {
    match v {
        None | Some("") => Ok(Stream::Stdout),
        Some(v) => Stream::parse(v).ok_or_else(|| ApiError::BadRequest {
            field: "stream".into(),
            message: format!("`{v}`: expected stdout or stderr"),
        }),
    }
}

/// The `after` parameter (`NODE:OFFSET,...`): what a follower already has.
pub fn after_offsets(after: Option<&str>) -> Result<BTreeMap<String, u64>, ApiError> {
    let mut out = BTreeMap::new();
    for part in after.unwrap_or("").split(',').filter(|p| !p.is_empty()) {
        let Some((n, o)) = part
            .rsplit_once(':')
            .and_then(|(n, o)| Some((n, o.parse::<u64>().ok()?)))
        else {
            return Err(ApiError::BadRequest {
                field: "after".into(),
                message: format!("`{part}`: expected NODE:OFFSET"),
            });
        };
        out.insert(n.to_string(), o);
    }
    Ok(out)
}

/// A duration parameter in seconds (`default` when absent), refused naming `field` when unreadable
/// or not positive.
pub fn seconds(field: &str, v: Option<&str>, default: f64) -> Result<f64, ApiError> {
    let bad = |message: String| ApiError::BadRequest {
        field: field.into(),
        message,
    };
    match v {
        None | Some("") => Ok(default),
        Some(v) => match lattice_traces::parse_duration(v) {
            Ok(t) if t.0 > 0 => Ok(t.0 as f64 / 1000.0),
            Ok(_) => Err(bad(format!("`{v}`: must be positive"))),
            Err(m) => Err(bad(format!("`{v}`: {m}"))),
        },
    }
}

/// `GET /v1/allocations/{id}/logs`'s parameters.
#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    pub node: Option<String>,
    /// `stdout` (the default) or `stderr`.
    pub stream: Option<String>,
    pub offset: Option<u64>,
    pub limit: Option<u64>,
    pub since: Option<String>,
    pub until: Option<String>,
}

/// An allocation's stored output of one stream, by node (see [`super::logs`]).
pub async fn logs_document(s: &Shared, p: &Principal, id: &str, q: &LogsQuery) -> Result<Value, ApiError> {
    let instant = |f: &str, v: &Option<String>| {
        v.as_deref()
            .filter(|v| !v.is_empty())
            .map(|v| parse_instant(f, v))
            .transpose()
    };
    let range = lattice_adapters::logstore::Range {
        offset: q.offset.unwrap_or(0),
        limit: q.limit.unwrap_or(u64::MAX),
        since_ms: instant("since", &q.since)?,
        until_ms: instant("until", &q.until)?,
    };
    let stream = stream_named(q.stream.as_deref())?;
    let node = q.node.as_deref().filter(|n| !n.is_empty());
    let (source, l) = logs(s, p, id, (node, stream), &range).await?;
    Ok(json!({"id": id, "source": source, "stream": stream, "nodes": l}))
}

/// The live tail's parameters (`GET /v1/allocations/{id}/logs/live` and `.../logs/stream`).
#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LiveQuery {
    /// `NODE:OFFSET,...`: what the follower already has.
    pub after: Option<String>,
    /// `stdout` (the default) or `stderr`.
    pub stream: Option<String>,
}

/// What arrived after the given offsets (see [`super::live_logs`]).
pub async fn live_logs_document(s: &Shared, p: &Principal, id: &str, q: &LiveQuery) -> Result<Value, ApiError> {
    let after = after_offsets(q.after.as_deref())?;
    let stream = stream_named(q.stream.as_deref())?;
    let l = live_logs(s, p, id, stream, &after).await?;
    Ok(json!({"id": id, "stream": stream, "nodes": l}))
}

/// How often the log stream looks for new output.
pub const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(300);

/// Checks a log stream may open (its parameters, and that the caller sees the allocation: refusals
/// are answered as such, before any stream); the stream and offsets it starts from.
pub async fn open_log_stream(
    s: &Shared,
    p: &Principal,
    id: &str,
    q: &LiveQuery,
) -> Result<(Stream, BTreeMap<String, u64>), ApiError> {
    let after = after_offsets(q.after.as_deref())?;
    let stream = stream_named(q.stream.as_deref())?;
    live_logs(s, p, id, stream, &BTreeMap::new()).await?;
    Ok((stream, after))
}

/// The live tail as events: each new piece of a node's output is an `output` event
/// (`{node, offset, data, next}`); once the allocation has ended and three looks in a row found
/// nothing new (its agents' final output has arrived), the tail reported with the exit of a node
/// whose output never came live (a run shorter than its agent's polls), then one `end` event with
/// its state. A receiver that goes away ends the relay.
pub async fn relay_logs(
    s: Arc<Shared>,
    p: Principal,
    id: String,
    stream: Stream,
    mut after: BTreeMap<String, u64>,
    tx: EventTx,
) {
    let _open = crate::metrics::StreamGuard::open(&s.metrics, "logs");
    let mut quiet = 0;
    let mut trouble = 0;
    loop {
        let nodes = match live_logs(&s, &p, &id, stream, &after).await {
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
                let _ = tx.send(("error", json!({"error": format!("{e:?}")}))).await;
                return;
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
            if tx.send(("output", ev)).await.is_err() {
                return;
            }
        }
        quiet = if got { 0 } else { quiet + 1 };
        if quiet >= 3 {
            match get(&s, &p, &id).await {
                Ok(v) if v.ended_ms.is_some() => {
                    let tails = s.control.lock().await.logs(&id, stream).unwrap_or_default();
                    for (node, tail) in tails
                        .into_iter()
                        .filter(|(n, t)| !after.contains_key(n) && !t.is_empty())
                    {
                        let ev = json!({"node": node, "offset": 0, "data": tail, "next": tail.len()});
                        if tx.send(("output", ev)).await.is_err() {
                            return;
                        }
                    }
                    let _ = tx.send(("end", json!({"state": v.state}))).await;
                    return;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
        tokio::time::sleep(STREAM_POLL).await;
    }
}

/// Metrics parameters (`GET /v1/allocations/{id}/metrics`, its stream and diagnostics).
#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsQuery {
    /// `summary` (the default), `per-node` or `per-gpu`.
    pub mode: Option<String>,
    /// How far back to look, e.g. `5m` (the default), `30s`, `1h`.
    pub duration: Option<String>,
    /// Comma-separated metric names (default: all).
    pub metrics: Option<String>,
}

/// The TSDB, or unavailable saying how to configure one.
pub fn tsdb(s: &Shared) -> Result<&lattice_adapters::tsdb::Tsdb, ApiError> {
    s.tsdb.as_ref().ok_or_else(|| ApiError::Unavailable {
        message: "no TSDB configured: set services.tsdb in the runtime's config (the agents' --remote-write target)"
            .into(),
    })
}

fn metric_names(m: &Option<String>) -> Option<&str> {
    m.as_deref().filter(|m| !m.is_empty())
}

/// An allocation's metrics from the TSDB over the last `duration`.
pub async fn metrics_document(s: &Shared, p: &Principal, id: &str, q: &MetricsQuery) -> Result<Value, ApiError> {
    let v = get(s, p, id).await?;
    audit_access(
        s,
        p,
        id,
        "metrics_query",
        q.mode.as_deref().filter(|m| !m.is_empty()).unwrap_or("summary"),
    )
    .await?;
    let t = tsdb(s)?;
    let d = seconds("duration", q.duration.as_deref(), 300.0)?;
    let now = s.control.lock().await.now().0;
    let mode = q.mode.as_deref().filter(|m| !m.is_empty()).unwrap_or("summary");
    Ok(crate::observe::snapshot(t, &v, now, mode, d, metric_names(&q.metrics)).await?)
}

/// Checks a metrics stream may open: the caller sees the allocation and a TSDB is configured.
pub async fn open_metrics_stream(s: &Shared, p: &Principal, id: &str) -> Result<(), ApiError> {
    get(s, p, id).await?;
    audit_access(s, p, id, "metrics_query", "stream").await?;
    tsdb(s).map(|_| ())
}

/// The metrics stream as events: every period of its telemetry mode (read again each time, so
/// `lattice telemetry ID --mode debug` takes effect on open streams) a `metrics` event with each
/// node's values over the last two periods, an `alert` event per local alert rule firing on its
/// nodes, and `end` once it has ended.
pub async fn relay_metrics(s: Arc<Shared>, p: Principal, id: String, metrics: Option<String>, tx: EventTx) {
    let _open = crate::metrics::StreamGuard::open(&s.metrics, "metrics");
    let Some(t) = s.tsdb.as_ref() else { return };
    let mut last: Option<tokio::time::Instant> = None;
    loop {
        let Ok(v) = get(&s, &p, &id).await else { break };
        let period = if v.telemetry == "debug" { 1.0 } else { 30.0 };
        let now = s.control.lock().await.now().0;
        // Looked at every second (an end, or a switch of mode, is seen soon); sent every period.
        let every = std::time::Duration::from_secs_f64(period);
        let due = last.is_none_or(|l| l.elapsed() >= every) || v.ended_ms.is_some();
        if due {
            last = Some(tokio::time::Instant::now());
        }
        if due && v.started_ms.is_some() {
            let snap = crate::observe::snapshot(t, &v, now, "per-node", 2.0 * period, metric_names(&metrics)).await;
            let ev = match snap {
                Ok(m) => (
                    "metrics",
                    json!({"at_ms": m["at_ms"], "mode": v.telemetry, "summary": m["summary"],
                           "per_node": m["per_node"], "units": m["units"]}),
                ),
                Err(e) => ("error", json!({"error": format!("{e:?}")})),
            };
            if tx.send(ev).await.is_err() {
                return;
            }
            if let Ok(alerts) = crate::observe::alerts(t, &v.nodes, now as f64 / 1000.0).await {
                for a in alerts {
                    if tx.send(("alert", a)).await.is_err() {
                        return;
                    }
                }
            }
        }
        if v.ended_ms.is_some() {
            let _ = tx.send(("end", json!({"state": v.state}))).await;
            break;
        }
        let wait = last.map_or(every, |l| every.saturating_sub(l.elapsed()));
        tokio::time::sleep(wait.clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(1))).await;
    }
}

/// Why an allocation runs as it does: network and storage diagnostics (`part`: only `network` or
/// `storage`).
pub async fn diagnostics_document(
    s: &Shared,
    p: &Principal,
    id: &str,
    part: Option<&str>,
    q: &MetricsQuery,
) -> Result<Value, ApiError> {
    if let Some(part) = part.filter(|p| !matches!(*p, "network" | "storage")) {
        return Err(ApiError::NotFound {
            field: "part".into(),
            message: format!("`{part}`: expected network or storage"),
        });
    }
    let v = get(s, p, id).await?;
    audit_access(s, p, id, "api_call", &format!("diagnostics {}", part.unwrap_or("all"))).await?;
    let d = seconds("duration", q.duration.as_deref(), 300.0)?;
    let (facts, now) = {
        let c = s.control.lock().await;
        (c.diagnostics_facts(id), c.now().0)
    };
    Ok(crate::observe::diagnostics(s.tsdb.as_ref(), &v, facts.as_ref(), now, d, part).await?)
}

/// `GET /v1/compare`'s parameters.
#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompareQuery {
    /// Comma-separated allocation ids (2 to 10).
    pub ids: Option<String>,
    /// Comma-separated metric names (default: all).
    pub metrics: Option<String>,
    /// `relative` (time from each allocation's start, the default) or `absolute` (unix seconds).
    pub align: Option<String>,
    /// Seconds between points, e.g. `5s` (default: a 120th of each run, at least 1 s).
    pub step: Option<String>,
}

/// Allocations' metrics side by side.
pub async fn compare_document(s: &Shared, p: &Principal, q: &CompareQuery) -> Result<Value, ApiError> {
    let ids: Vec<&str> = q
        .ids
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if ids.is_empty() || ids.len() > crate::observe::COMPARE_MAX {
        return Err(ApiError::BadRequest {
            field: "ids".into(),
            message: format!(
                "{} allocation(s): compare 1 to {}",
                ids.len(),
                crate::observe::COMPARE_MAX
            ),
        });
    }
    let relative = crate::observe::parse_align(q.align.as_deref().filter(|a| !a.is_empty()))?;
    let step = match q.step.as_deref().filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => Some(seconds("step", Some(v), 0.0)?),
    };
    let mut views = Vec::new();
    for id in ids {
        views.push(get(s, p, id).await?);
    }
    // Book ("Observability Constraints"): a sensitive allocation's metrics are never shown beside
    // another's.
    // A sensitive claim is one the engine holds as such, or one the audit log has entries of (an
    // ended claim the engine forgot).
    if views.len() > 1 {
        let held: Vec<bool> = {
            let c = s.control.lock().await;
            views.iter().map(|v| c.is_sensitive_named(&v.id)).collect()
        };
        let names: Vec<String> = views.iter().map(|v| v.id.clone()).collect();
        let audited = s
            .member
            .read(move |q| names.into_iter().find(|n| q.audit.iter().any(|e| &e.alloc == n)))
            .await;
        if let Some(id) = views
            .iter()
            .zip(&held)
            .find(|(_, h)| **h)
            .map(|(v, _)| v.id.clone())
            .or(audited)
        {
            return Err(ApiError::BadRequest {
                field: "ids".into(),
                message: format!("{id} is sensitive: it is compared with no other allocation"),
            });
        }
    }
    let t = tsdb(s)?;
    let now = s.control.lock().await.now().0;
    Ok(crate::observe::compare(t, &views, now, metric_names(&q.metrics), relative, step).await?)
}

/// The network domains (operators and admins see every tenant's, others their tenant's) and the VNI
/// pool.
pub async fn network_domains(s: &Shared, p: &Principal) -> Value {
    let c = s.control.lock().await;
    let (domains, (total, used)) = c.network_views();
    let domains: Vec<_> = domains
        .into_iter()
        .filter(|d| p.can_operate() || p.tenant.as_deref() == Some(d.tenant.as_str()))
        .collect();
    json!({"domains": domains, "vni_pool": {"total": total, "in_use": used}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_refused_naming_their_field() {
        assert_eq!(after_offsets(Some("a:3,b:0")).unwrap().len(), 2);
        let e = after_offsets(Some("a:3,b")).unwrap_err();
        assert_eq!(e.field(), Some("after"));
        assert_eq!(stream_named(None).unwrap(), Stream::Stdout);
        assert_eq!(stream_named(Some("stderr")).unwrap(), Stream::Stderr);
        assert_eq!(stream_named(Some("stdin")).unwrap_err().field(), Some("stream"));
        assert_eq!(seconds("duration", Some("90s"), 1.0).unwrap(), 90.0);
        assert_eq!(seconds("duration", None, 300.0).unwrap(), 300.0);
        assert_eq!(seconds("step", Some("0s"), 1.0).unwrap_err().field(), Some("step"));
        assert_eq!(seconds("step", Some("soon"), 1.0).unwrap_err().field(), Some("step"));
    }
}
