//! The agent's REST client of the control plane (ureq, rustls): register, heartbeat, poll for work,
//! report exits. Identity (book: "Agent Authentication"): with a bootstrap certificate and key the
//! agent authenticates by mTLS — the certificate's CN is its node id, and no token is sent (mTLS
//! takes priority); otherwise the bearer token `LATTICE_AGENT_TOKEN` (an Operator-role agent token,
//! for development) is sent when set. `https://` endpoints are verified against the bootstrap CA or
//! the system roots.

use serde_json::Value;

/// What the control plane answered, when it was not a success.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{url}: {status}: {body}")]
    Refused { url: String, status: u16, body: String },
    #[error("{url}: {message}")]
    Transport { url: String, message: String },
}

impl ClientError {
    /// What the failure means to the protocol ([`crate::protocol::Failure`]).
    pub fn failure(&self) -> crate::protocol::Failure {
        match self {
            ClientError::Refused { status, body, .. } => crate::protocol::Failure::of(Some(*status), body),
            ClientError::Transport { .. } => crate::protocol::Failure::of(None, ""),
        }
    }
}

/// The wire types (declared once, with the control plane: `lattice-agent-protocol`).
pub use lattice_agent_protocol::{
    Buffered, CacheOrder, CacheOutcome, CachedImage, DataAccess, ExitKind, ImageUse, Launch, Metric, Outcome, Output,
    PreemptWork, RankEnd, Startup, TaskEnd, TaskGroup, TaskLaunch, TaskPeer, Work,
};

/// What the protocol keeps between polls and heartbeats ([`crate::protocol`]).
pub use crate::protocol::{Beat, Reports};

pub struct Client {
    /// The control plane's endpoints (its members' REST addresses); the protocol says which to ask.
    bases: Vec<String>,
    token: Option<String>,
    agent: ureq::Agent,
}

/// The agent's TLS material (PEM paths): the CA that signed the control plane's certificate, and the
/// bootstrap certificate and key that identify this node.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    pub ca: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
}

fn read_pem(path: &std::path::Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
}

impl Client {
    /// A client of `endpoint`: one URL, or several separated by commas (every member of the quorum:
    /// the agent moves on to the next when one does not answer or is not the leader).
    pub fn new(endpoint: &str, token: Option<String>, id: &Identity) -> anyhow::Result<Client> {
        use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};
        let mut tls = TlsConfig::builder().provider(TlsProvider::Rustls);
        if let Some(ca) = &id.ca {
            let cert = Certificate::from_pem(&read_pem(ca, "--bootstrap-ca")?)
                .map_err(|e| anyhow::anyhow!("--bootstrap-ca {}: {e}", ca.display()))?;
            tls = tls.root_certs(RootCerts::new_with_certs(&[cert]));
        }
        let mtls = match (&id.cert, &id.key) {
            (Some(c), Some(k)) => {
                let chain: Vec<Certificate<'static>> = ureq::tls::parse_pem(&read_pem(c, "--bootstrap-cert")?)
                    .filter_map(|i| match i {
                        Ok(PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if chain.is_empty() {
                    anyhow::bail!("--bootstrap-cert {}: no certificate in the file", c.display());
                }
                let key = PrivateKey::from_pem(&read_pem(k, "--bootstrap-key")?)
                    .map_err(|e| anyhow::anyhow!("--bootstrap-key {}: {e}", k.display()))?;
                tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
                true
            }
            (None, None) => false,
            _ => anyhow::bail!("--bootstrap-cert and --bootstrap-key go together"),
        };
        let bases: Vec<String> = endpoint
            .split(',')
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if bases.is_empty() {
            anyhow::bail!("--quorum-endpoint: no endpoint given");
        }
        Ok(Client {
            bases,
            // mTLS takes priority: the certificate is the identity, the token the fallback.
            token: if mtls { None } else { token },
            agent: ureq::Agent::config_builder()
                .tls_config(tls.build())
                .http_status_as_error(false)
                .timeout_global(Some(std::time::Duration::from_secs(10)))
                .build()
                .into(),
        })
    }

    /// How many endpoints the client knows.
    pub fn endpoints(&self) -> usize {
        self.bases.len()
    }

    /// The first endpoint (`LATTICE_ENDPOINT` for the `lattice` client inside allocations).
    pub fn first_endpoint(&self) -> &str {
        &self.bases[0]
    }

    /// Sends a protocol request to endpoint `to` ([`Client::endpoints`]): the answer's JSON.
    pub fn send(&self, to: usize, r: &crate::protocol::Request) -> Result<Value, ClientError> {
        let url = format!("{}{}", self.bases[to % self.bases.len()], r.path);
        let mut req = self.agent.post(&url);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let mut resp = req.send_json(&r.body).map_err(|e| ClientError::Transport {
            url: url.clone(),
            message: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if !(200..300).contains(&status) {
            return Err(ClientError::Refused {
                url,
                status,
                body: text,
            });
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// PUTs Prometheus text to a Pushgateway-compatible `url` (replacing this node's group).
    pub fn push_metrics(&self, url: &str, text: &str) -> Result<(), ClientError> {
        let req = self.agent.put(url).header("content-type", "text/plain; version=0.0.4");
        accepted(url, req.send(text))
    }

    /// POSTs a Prometheus remote-write body ([`crate::remote_write::encode`]) to `url`.
    pub fn remote_write(&self, url: &str, body: Vec<u8>) -> Result<(), ClientError> {
        let mut req = self.agent.post(url);
        for (k, v) in crate::remote_write::HEADERS {
            req = req.header(k, v);
        }
        accepted(url, req.send(&body[..]))
    }
}

/// A push's answer: any 2xx is taken, anything else is refused with its body.
fn accepted(url: &str, sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<(), ClientError> {
    let mut resp = sent.map_err(|e| ClientError::Transport {
        url: url.to_string(),
        message: e.to_string(),
    })?;
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        return Err(ClientError::Refused {
            url: url.to_string(),
            status,
            body,
        });
    }
    Ok(())
}
