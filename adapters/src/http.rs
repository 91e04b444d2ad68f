//! The JSON-over-HTTPS plumbing the storage and fabric clients share (reqwest on rustls with ring):
//! a per-request timeout, retries with exponential backoff on what can heal (connection failures,
//! timeouts, 429, 5xx), never on a 4xx, and typed errors that name the URL.

use serde_json::Value;
use std::time::Duration;

/// How a client reaches its service.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// e.g. `https://vast-mgmt.example.org/api`.
    pub base: String,
    /// Bearer token (from the secrets manager), if the service wants one.
    pub token: Option<String>,
    /// The `Authorization` scheme the token goes with: `Bearer` (default), or `Token` (Waldur).
    pub auth_scheme: String,
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: u32,
    /// First backoff; doubled each retry, capped at 5 s.
    pub backoff: Duration,
}

impl HttpConfig {
    pub fn new(base: &str) -> HttpConfig {
        HttpConfig {
            base: base.trim_end_matches('/').to_string(),
            token: None,
            auth_scheme: "Bearer".into(),
            timeout: Duration::from_secs(10),
            retries: 3,
            backoff: Duration::from_millis(200),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HttpError {
    #[error("{method} {url}: no answer within {timeout_ms} ms (after {attempts} attempt(s))")]
    Timeout {
        method: String,
        url: String,
        timeout_ms: u64,
        attempts: u32,
    },
    #[error("{method} {url}: {message} (after {attempts} attempt(s))")]
    Transport {
        method: String,
        url: String,
        message: String,
        attempts: u32,
    },
    #[error("{method} {url}: HTTP {status}: {body}")]
    Status {
        method: String,
        url: String,
        status: u16,
        body: String,
    },
    #[error("{method} {url}: unexpected answer: {message}")]
    Decode {
        method: String,
        url: String,
        message: String,
    },
    #[error("TLS setup: {0}")]
    Setup(String),
}

impl HttpError {
    /// The service said the thing does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, HttpError::Status { status: 404, .. })
    }
}

pub struct Http {
    client: reqwest::Client,
    cfg: HttpConfig,
}

/// A reqwest client on rustls with ring and the system's roots, answering within `timeout`.
pub fn tls_client(timeout: Duration) -> Result<reqwest::Client, HttpError> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    // The system's roots where there are any; a site CA can be appended by the caller's config.
    if let Ok(pem) = std::fs::read("/etc/ssl/certs/ca-certificates.crt") {
        use rustls::pki_types::pem::PemObject;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
            let _ = roots.add(c);
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Setup(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(timeout)
        .build()
        .map_err(|e| HttpError::Setup(e.to_string()))
}

impl Http {
    pub fn new(cfg: HttpConfig) -> Result<Http, HttpError> {
        let client = tls_client(cfg.timeout)?;
        Ok(Http { client, cfg })
    }

    /// `method path` with an optional JSON body; the JSON answer (`null` for an empty one).
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value, HttpError> {
        self.call_with(method, path, body, &[], self.cfg.token.as_deref()).await
    }

    /// [`Http::call`] with extra headers (e.g. an `Idempotency-Key`, sent on every attempt) and the
    /// token to send (a rotated secret read just before the call).
    pub async fn call_with(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
        token: Option<&str>,
    ) -> Result<Value, HttpError> {
        let url = format!("{}{path}", self.cfg.base);
        let m = method.to_string();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = self.client.request(method.clone(), &url);
            if let Some(t) = token {
                req = req.header(reqwest::header::AUTHORIZATION, format!("{} {t}", self.cfg.auth_scheme));
            }
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let failure = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    if (200..300).contains(&status) {
                        if text.trim().is_empty() {
                            return Ok(Value::Null);
                        }
                        return serde_json::from_str(&text).map_err(|e| HttpError::Decode {
                            method: m,
                            url,
                            message: e.to_string(),
                        });
                    }
                    let err = HttpError::Status {
                        method: m.clone(),
                        url: url.clone(),
                        status,
                        body: text.chars().take(500).collect(),
                    };
                    if status != 429 && status < 500 {
                        return Err(err);
                    }
                    err
                }
                Err(e) if e.is_timeout() => HttpError::Timeout {
                    method: m.clone(),
                    url: url.clone(),
                    timeout_ms: self.cfg.timeout.as_millis() as u64,
                    attempts: attempt,
                },
                Err(e) => HttpError::Transport {
                    method: m.clone(),
                    url: url.clone(),
                    message: e.to_string(),
                    attempts: attempt,
                },
            };
            if attempt > self.cfg.retries {
                return Err(failure);
            }
            let wait = self.cfg.backoff * 2u32.saturating_pow(attempt - 1);
            tokio::time::sleep(wait.min(Duration::from_secs(5))).await;
        }
    }
}
