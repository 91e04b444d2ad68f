//! Any member serves reads: a `GET` that this member refuses because it does not lead (421 naming
//! the leader's REST URL, which the quorum records) is forwarded to the leader, and the leader's
//! answer — a stream too (`logs --follow`, metrics) — is relayed as it comes. So a client behind
//! one DNS name or VIP never sees a read refused. Writes are not forwarded: they answer 421 with the
//! leader's URL, which `lattice` and the SDK follow, so a write is sent once and answered by the
//! member that applied it. Not forwarded either: requests already forwarded once (no loops while
//! members disagree about who leads), WebSocket upgrades (attach), node agents' own calls (they
//! carry their own member list and their certificate is their identity), and anything under the
//! deterministic simulation (its network carries the members' gRPC only).

use crate::context::Shared;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;

/// Set on a forwarded request (the forwarding member's URL): the leader never forwards it again.
pub const FORWARDED_BY: &str = "x-lattice-forwarded-by";
/// Set on a relayed answer: the URL of the member that served it.
pub const SERVED_BY: &str = "x-lattice-served-by";

/// The largest 421 body read back to find the leader's URL.
const REFUSAL_LIMIT: usize = 64 * 1024;

/// A node agent's call (registration, heartbeat, work, exits): authenticated by its certificate.
pub(super) fn agent_call(path: &str) -> bool {
    (path.starts_with("/v1/nodes/")
        && (path.ends_with("/register") || path.ends_with("/heartbeat") || path.ends_with("/work")))
        || (path.starts_with("/v1/allocations/") && path.ends_with("/exit"))
}

/// The middleware: runs the request here, and forwards a refused read to the leader.
pub(super) async fn forward_reads(
    State(s): State<Arc<Shared>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // Under the deterministic simulation members reach each other only through its network
    // (`Shared::dial`), which carries gRPC alone: reads there are refused naming the leader.
    let forwardable = s.dial.is_none()
        && matches!(*req.method(), Method::GET | Method::HEAD)
        && !req.headers().contains_key(FORWARDED_BY)
        && !req.headers().contains_key(header::UPGRADE)
        && !agent_call(req.uri().path());
    if !forwardable {
        return next.run(req).await;
    }
    let (method, uri, headers) = (req.method().clone(), req.uri().clone(), req.headers().clone());
    let answer = next.run(req).await;
    if answer.status() != StatusCode::MISDIRECTED_REQUEST {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, REFUSAL_LIMIT).await else {
        return (StatusCode::BAD_GATEWAY, "the refusal could not be read").into_response();
    };
    let leader_url = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["leader_url"].as_str().map(str::to_string))
        .filter(|u| u.trim_end_matches('/') != s.rest_url);
    let Some(leader_url) = leader_url else {
        // No leader known yet (an election), or this member is named: the client sees the 421.
        return Response::from_parts(parts, Body::from(bytes));
    };
    match relay(&s, &leader_url, method, &uri, &headers).await {
        Ok(r) => r,
        Err(why) => {
            tracing::warn!("forwarding a read to the leader at {leader_url}: {why}");
            // The leader could not be reached from here: the client gets the refusal (which names
            // the leader) and tries it, or another member, itself.
            Response::from_parts(parts, Body::from(bytes))
        }
    }
}

/// Headers that describe one connection, not the request (RFC 9110 §7.6.1), and `Host`.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "te" | "trailer" | "transfer-encoding" | "upgrade" | "host"
    )
}

/// Sends the request to the leader over a connection of its own (TLS with the member's certificate
/// when the quorum uses TLS) and streams the leader's answer back.
async fn relay(
    s: &Shared,
    leader_url: &str,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, String> {
    let base: Uri = leader_url
        .parse()
        .map_err(|e| format!("leader URL {leader_url}: {e}"))?;
    let host = base.host().ok_or_else(|| format!("leader URL {leader_url}: no host"))?;
    let https = base.scheme_str() == Some("https");
    let port = base.port_u16().unwrap_or(if https { 443 } else { 80 });
    let authority = base
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_else(|| host.to_string());
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = hyper::Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    for (k, v) in headers {
        if !hop_by_hop(k) {
            out.headers_mut().append(k.clone(), v.clone());
        }
    }
    let host_header = HeaderValue::from_str(&authority).map_err(|e| e.to_string())?;
    out.headers_mut().insert(header::HOST, host_header);
    let me = HeaderValue::from_str(&s.rest_url).map_err(|e| e.to_string())?;
    out.headers_mut().insert(FORWARDED_BY, me);
    let tcp = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect((host, port)))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let answer = if https {
        let tls = client_tls(s)?;
        let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
            .map_err(|e| e.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        send(hyper_util::rt::TokioIo::new(stream), out).await?
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), out).await?
    };
    let (mut parts, body) = answer.into_parts();
    if let Ok(v) = HeaderValue::from_str(leader_url) {
        parts.headers.insert(SERVED_BY, v);
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// One HTTP/1.1 exchange on `io`; the connection lives as long as the answer's body is read.
async fn send<I>(io: I, req: hyper::Request<Body>) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("forwarded read's connection: {e}");
        }
    });
    tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .map_err(|_| "the leader did not answer within 30 s".to_string())?
        .map_err(|e| e.to_string())
}

/// The TLS client side towards another member: the site CA, and the member's own certificate (the
/// leader may require one with mTLS). The forwarded bearer token still decides who the caller is.
fn client_tls(s: &Shared) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let peer = s
        .peer_tls
        .as_ref()
        .ok_or("the leader's URL is https but this member has no tls:")?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&peer.ca) {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    let certs = CertificateDer::pem_slice_iter(&peer.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(&peer.key).map_err(|e| e.to_string())?;
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(cfg))
}
