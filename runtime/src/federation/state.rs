//! The federation broker's state in one member (held by [`crate::context::Shared`]): the peers as
//! it sees them, the nonces it accepted, its HTTP client and its metrics. What it does with them —
//! signed calls, the catalog sync — is [`super::broker`] and [`super::sync`].

use super::sign;
use super::{FederationConfig, PeerView, now_ms};
use lattice_adapters::FederationPeer;
use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest wait between two retries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A quorum without a leader this long makes this site `degraded` in its catalog.
pub const ELECTION_DEGRADED: Duration = Duration::from_secs(10);

/// The broker's metrics (book: "Federation Broker Metrics"), on the runtime's `/metrics`.
pub struct FederationMetrics {
    pub proposals: IntCounterVec,
    pub latency: HistogramVec,
    pub peer_status: IntGaugeVec,
    pub data_gravity: GaugeVec,
    pub peer_stale: IntGaugeVec,
}

impl FederationMetrics {
    fn new(m: &crate::metrics::Metrics) -> FederationMetrics {
        let proposals = IntCounterVec::new(
            Opts::new(
                "lattice_federation_proposals_total",
                "Placement proposals sent to and received from peers, by result (accepted/rejected/timeout).",
            ),
            &["peer", "result"],
        )
        .expect("a valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "lattice_federation_proposal_latency_seconds",
                "Round-trip time of placement proposals sent to peers (retries included).",
            )
            .buckets(vec![0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
            &["peer"],
        )
        .expect("a valid metric");
        let peer_status = IntGaugeVec::new(
            Opts::new(
                "lattice_federation_peer_status",
                "1 = the peer answered the last request or catalog fetch, 0 = unreachable.",
            ),
            &["peer"],
        )
        .expect("a valid metric");
        let data_gravity = GaugeVec::new(
            Opts::new(
                "lattice_federation_data_gravity_score",
                "Share of a routed request's dataset the peer holds (higher = more data at the peer).",
            ),
            &["peer", "dataset"],
        )
        .expect("a valid metric");
        let peer_stale = IntGaugeVec::new(
            Opts::new(
                "lattice_federation_peer_stale",
                "1 while the peer's catalog is older than twice the sync interval.",
            ),
            &["peer"],
        )
        .expect("a valid metric");
        for c in [
            Box::new(proposals.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(peer_status.clone()),
            Box::new(data_gravity.clone()),
            Box::new(peer_stale.clone()),
        ] {
            m.register(c);
        }
        FederationMetrics {
            proposals,
            latency,
            peer_status,
            data_gravity,
            peer_stale,
        }
    }
}

/// The broker's state in one member.
pub struct Broker {
    pub cfg: FederationConfig,
    pub(super) client: reqwest::Client,
    pub views: Mutex<BTreeMap<String, PeerView>>,
    pub(super) nonces: Mutex<sign::Nonces>,
    /// Since when this member has seen no leader (a long election degrades this site).
    pub(super) leaderless_since: Mutex<Option<Instant>>,
    pub metrics: FederationMetrics,
}

/// A failed call to a peer.
#[derive(Debug, Clone)]
pub enum CallError {
    /// Not ours to try: no such peer, a revoked workspace, no key.
    Setup(String),
    /// Every attempt failed (the last failure's description).
    Unreachable(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Setup(m) | CallError::Unreachable(m) => f.write_str(m),
        }
    }
}

/// A peer's signed answer.
pub struct Answer {
    pub status: u16,
    pub body: serde_json::Value,
}

impl Broker {
    pub fn new(cfg: FederationConfig, metrics: &crate::metrics::Metrics) -> anyhow::Result<Broker> {
        cfg.validate().map_err(anyhow::Error::msg)?;
        // Peers' certificates: the system's roots, and the peers' CA bundle (`federation.ca`).
        let mut roots = rustls::RootCertStore::empty();
        let mut bundles = vec![std::path::PathBuf::from("/etc/ssl/certs/ca-certificates.crt")];
        bundles.extend(cfg.ca.clone());
        for (i, path) in bundles.iter().enumerate() {
            match std::fs::read(path) {
                Ok(pem) => {
                    use rustls::pki_types::pem::PemObject;
                    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
                        let _ = roots.add(c);
                    }
                }
                Err(e) if i > 0 => anyhow::bail!("federation.ca: {}: {e}", path.display()),
                Err(_) => {}
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow::anyhow!("federation: TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .timeout(cfg.request_timeout())
            .build()
            .map_err(|e| anyhow::anyhow!("federation: HTTP client: {e}"))?;
        Ok(Broker {
            cfg,
            client,
            views: Mutex::new(BTreeMap::new()),
            nonces: Mutex::new(sign::Nonces::default()),
            leaderless_since: Mutex::new(None),
            metrics: FederationMetrics::new(metrics),
        })
    }

    pub(super) fn view<R>(&self, f: impl FnOnce(&mut BTreeMap<String, PeerView>) -> R) -> R {
        f(&mut self.views.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Records the outcome of a call to `peer`.
    pub(super) fn outcome(&self, peer: &str, failure: Option<String>) {
        self.metrics
            .peer_status
            .with_label_values(&[peer])
            .set(i64::from(failure.is_none()));
        self.view(|v| {
            let e = v.entry(peer.to_string()).or_default();
            e.attempted_ms = Some(now_ms());
            e.failing = failure;
        });
    }

    /// Sets the staleness gauges from the views.
    pub(super) fn gauge(&self, peers: &BTreeMap<String, FederationPeer>) {
        let now = now_ms();
        let views = self.views.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (name, p) in peers {
            let st = views
                .get(name)
                .cloned()
                .unwrap_or_default()
                .status(&self.cfg, p.added_ms, now);
            let stale = matches!(
                st,
                super::route::PeerStatus::Stale | super::route::PeerStatus::Unreachable
            );
            self.metrics.peer_stale.with_label_values(&[name]).set(i64::from(stale));
            if st == super::route::PeerStatus::Unreachable {
                self.metrics.peer_status.with_label_values(&[name]).set(0);
            }
        }
    }
}
