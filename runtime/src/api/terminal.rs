//! Attaching to a running allocation and interactive sessions: the WebSocket terminal relay.

use super::common::*;
use crate::ops;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

pub(super) async fn create_session(State(s): S, Extension(p): P, body: axum::body::Bytes) -> Response {
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

pub(super) async fn get_session(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    match ops::session(&s, &p, &id).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn delete_session(State(s): S, Extension(p): P, Path(id): Path<String>) -> Response {
    answer(ops::delete_session(&s, &p, &id).await)
}

/// `GET /v1/sessions/{id}/terminal`: a session's terminal, as `attach` opens it.
pub(super) async fn session_terminal(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    q: QueryIn<lattice_control::tasks::TerminalRequest>,
    ws: Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    if let Err(e) = ops::session(&s, &p, &id).await {
        return e.into_response();
    }
    attach(State(s), Extension(p), Path(id), q, ws).await
}

/// `GET /v1/allocations/{id}/attach?node=&command=&rows=&cols=&term=` (WebSocket upgrade): a terminal
/// inside the running allocation, relayed to its node's agent. Binary frames are the terminal's bytes
/// both ways; text frames from the client are `{"resize": {"rows", "cols"}}` or `{"signal": "INT"}`;
/// the server ends with a text frame `{"exit_code": N}` (or `{"error": "..."}`) and closes.
pub(super) async fn attach(
    State(s): S,
    Extension(p): P,
    Path(id): Path<String>,
    QueryIn(q): QueryIn<lattice_control::tasks::TerminalRequest>,
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
    // A sensitive allocation's session is opened at the quorum first (refused while another is),
    // and recorded.
    let rec = if sensitive {
        match ops::open_sensitive_session(&s, &p, &id, &node, (start.rows, start.cols)).await {
            Ok(r) => Some(r),
            Err(e) => return e.into_response(),
        }
    } else {
        None
    };
    let (fs, fp, fid, fnode, frec) = (s.clone(), p.clone(), id.clone(), node.clone(), rec.clone());
    ws.on_failed_upgrade(move |_| {
        if let Some(rec) = frec {
            tokio::spawn(async move {
                ops::audit_attach(&fs, &fp, &fid, &fnode, "attach_end (upgrade failed)", &rec).await;
            });
        }
    })
    .on_upgrade(move |socket| relay_terminal(s, p, id, node, start, addr, rec, socket))
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn relay_terminal(
    s: std::sync::Arc<crate::context::Shared>,
    p: crate::auth::Principal,
    id: String,
    node: String,
    start: lattice_adapters::peer::AttachStart,
    addr: String,
    rec: Option<crate::recording::Recording>,
    socket: axum::extract::ws::WebSocket,
) {
    let sensitive = rec.is_some();
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
            if let Some(rec) = &rec {
                ops::audit_attach(&s, &p, &id, &node, "attach_end (node unreachable)", rec).await;
            }
            return;
        }
    };
    let mut how = "client left";
    let mut leading = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            // The token it was opened with expired: the session ends (re-attach with a fresh one).
            _ = p.token_expired() => {
                how = "token expired";
                let _ = sink.send(Message::Text(json!({"error": "token expired"}).to_string().into())).await;
                break;
            }
            // A sensitive session lives on the leader: it ends when this member stops leading.
            _ = leading.tick(), if sensitive => {
                if ops::session_must_end(&s, sensitive) {
                    how = "leader changed";
                    let _ = sink.send(Message::Text(json!({"error": "the control plane's leader changed: attach again"}).to_string().into())).await;
                    break;
                }
            }
            m = stream.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    if let Some(r) = &rec {
                        r.input(&b);
                    }
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
                    if let (Some(r), Some(AttachInput::Stdin(b))) = (&rec, &input) {
                        r.input(b);
                    }
                    if let Some(i) = input && in_tx.send(i).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            o = out.recv() => match o {
                Some(AttachOutput::Stdout(b)) => {
                    if let Some(r) = &rec {
                        r.output(&b);
                    }
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
    if let Some(rec) = &rec {
        ops::audit_attach(&s, &p, &id, &node, &format!("attach_end ({how})"), rec).await;
    }
}
