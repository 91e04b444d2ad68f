//! TLS and mTLS with rustls (ring provider) on both of a member's ports: REST (tokio-rustls in
//! front of axum, served by hyper-util) and gRPC (tonic's rustls: the public API and the quorum's
//! Raft service, whose peers connect with their member certificate). With `mtls: true` every client
//! — peers, node agents, the `lattice` CLI — must present a certificate signed by the site CA;
//! bearer tokens still decide *who* the caller is and what they may do.

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;

/// `tls:` in the runtime config (paths relative to the config file).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// This member's certificate chain (PEM). It names the member's address (IP or DNS SAN) and has
    /// both serverAuth and clientAuth usages: members are each other's Raft clients.
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8 or SEC1).
    pub key: PathBuf,
    /// The site CA (PEM): verifies peers' server certificates and, with `mtls`, client certificates.
    pub ca: PathBuf,
    /// Require a client certificate signed by `ca` on REST and gRPC.
    #[serde(default)]
    pub mtls: bool,
}

/// The PEM material, read and checked once at start.
#[derive(Clone)]
pub struct Tls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub ca_pem: Vec<u8>,
    pub mtls: bool,
    certs: Vec<CertificateDer<'static>>,
    roots: Arc<rustls::RootCertStore>,
}

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("tls.{what}: reading {}", path.display()))
}

impl Tls {
    /// Reads the files and parses them, so a bad certificate fails the start with the file's name
    /// rather than the first handshake.
    pub fn load(cfg: &TlsConfig) -> Result<Tls> {
        let cert_pem = read(&cfg.cert, "cert")?;
        let key_pem = read(&cfg.key, "key")?;
        let ca_pem = read(&cfg.ca, "ca")?;
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("tls.cert: {}", cfg.cert.display()))?;
        if certs.is_empty() {
            anyhow::bail!("tls.cert: {}: no certificate in the file", cfg.cert.display());
        }
        PrivateKeyDer::from_pem_slice(&key_pem).with_context(|| format!("tls.key: {}", cfg.key.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&ca_pem) {
            let c = c.with_context(|| format!("tls.ca: {}", cfg.ca.display()))?;
            roots.add(c).with_context(|| format!("tls.ca: {}", cfg.ca.display()))?;
        }
        if roots.is_empty() {
            anyhow::bail!("tls.ca: {}: no certificate in the file", cfg.ca.display());
        }
        Ok(Tls {
            cert_pem,
            key_pem,
            ca_pem,
            mtls: cfg.mtls,
            certs,
            roots: Arc::new(roots),
        })
    }

    /// How this member reaches its peers (verifying them against the CA, presenting its certificate).
    pub fn peer(&self) -> lattice_adapters::raft_net::PeerTls {
        lattice_adapters::raft_net::PeerTls {
            ca: self.ca_pem.clone(),
            cert: self.cert_pem.clone(),
            key: self.key_pem.clone(),
        }
    }

    /// tonic's server side: the member's identity and, with mTLS, the CA client certificates must chain to.
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        let cfg = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem));
        if self.mtls {
            cfg.client_ca_root(tonic::transport::Certificate::from_pem(&self.ca_pem))
        } else {
            cfg
        }
    }

    /// rustls' server configuration for REST (HTTP/2 and HTTP/1.1 by ALPN).
    pub fn rest(&self) -> Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder =
            rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
        let builder = if self.mtls {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider).build()?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)?;
        let mut cfg = builder.with_single_cert(self.certs.clone(), key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// The subject CN of the certificate a client presented over mTLS (a request extension on REST).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCn(pub String);

/// The subject common name of a DER certificate (`None` if it has none or does not parse).
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Serves `app` over TLS on `listener` until `stop` changes. A failed handshake (no or untrusted
/// client certificate under mTLS, plaintext) closes that connection only.
pub async fn serve_rest(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    config: Arc<rustls::ServerConfig>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    loop {
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::warn!("REST accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("REST TLS handshake refused: {e}");
                    return;
                }
            };
            // The client certificate's CN (mTLS): a node agent's identity.
            let cn = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| common_name(c));
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                if let Some(cn) = &cn {
                    req.extensions_mut().insert(PeerCn(cn.clone()));
                }
                tower::ServiceExt::oneshot(app.clone(), req)
            });
            let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
            }
        });
    }
}
