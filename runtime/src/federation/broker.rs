//! The federation broker inside a member: its view of the peers, signed calls to them with retries,
//! the catalog sync loop and this site's own catalog.

use super::sign::{self, Signed};
use super::{Catalog, FederationConfig, PeerView, now_ms};
use crate::server::Shared;
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
    client: reqwest::Client,
    pub views: Mutex<BTreeMap<String, PeerView>>,
    nonces: Mutex<sign::Nonces>,
    /// Since when this member has seen no leader (a long election degrades this site).
    leaderless_since: Mutex<Option<Instant>>,
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

    fn view<R>(&self, f: impl FnOnce(&mut BTreeMap<String, PeerView>) -> R) -> R {
        f(&mut self.views.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Records the outcome of a call to `peer`.
    fn outcome(&self, peer: &str, failure: Option<String>) {
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

    /// `method path` at `peer`, signed, with the configured retries (1 s, 2 s, 4 s, … at most 30 s,
    /// or longer when the peer says `Retry-After`); each endpoint of the peer is tried in turn (a
    /// member that is not the leader answers 421). The peer's signed answer, whatever its status, or
    /// the last failure once the retries are spent.
    pub async fn call(
        &self,
        s: &Shared,
        peer: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, CallError> {
        self.call_retrying(s, peer, method, path, body, self.cfg.retries).await
    }

    /// [`Broker::call`] without retries (a caller that tries again at its next round).
    pub async fn call_once(
        &self,
        s: &Shared,
        peer: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, CallError> {
        self.call_retrying(s, peer, method, path, body, 0).await
    }

    async fn call_retrying(
        &self,
        s: &Shared,
        peer: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        retries: u32,
    ) -> Result<Answer, CallError> {
        let (p, revoked) = peer_of(s, peer).await;
        let p = p.ok_or_else(|| CallError::Setup(format!("no federation peer {peer}")))?;
        if revoked {
            return Err(CallError::Setup(format!(
                "{peer}: workspace {} is revoked",
                p.workspace
            )));
        }
        let key = self.cfg.key(&p.workspace).map_err(CallError::Setup)?;
        let bytes = body
            .map(|b| serde_json::to_vec(b).unwrap_or_default())
            .unwrap_or_default();
        let mut wait = self.cfg.first_backoff();
        let mut last = String::new();
        for attempt in 0..=retries {
            let mut retry_after = None;
            let mut failures = Vec::new();
            for endpoint in &p.endpoints {
                match self.attempt(&key, &p, peer, endpoint, &method, path, &bytes).await {
                    Ok(a) if matches!(a.status, 421 | 429) || a.status >= 500 => {
                        retry_after = retry_after.max(a.body.get("retry_after_s").and_then(|v| v.as_u64()));
                        failures.push(format!(
                            "{endpoint}: {} {}",
                            a.status,
                            a.body.get("error").unwrap_or(&a.body)
                        ));
                    }
                    Ok(a) => {
                        self.outcome(peer, None);
                        return Ok(a);
                    }
                    Err(e) => failures.push(e),
                }
            }
            // What every endpoint said in the last round.
            last = if failures.is_empty() {
                "the peer has no endpoint".to_string()
            } else {
                failures.join("; ")
            };
            if attempt == retries {
                break;
            }
            let pause = wait.max(Duration::from_secs(retry_after.unwrap_or(0))).min(MAX_BACKOFF);
            tracing::info!("federation: {peer}: {last}; retrying in {pause:?}");
            tokio::time::sleep(pause).await;
            wait = (wait * 2).min(MAX_BACKOFF);
        }
        let msg = format!("{peer}: failed after {} attempt(s): {last}", retries + 1);
        self.outcome(peer, Some(msg.clone()));
        Err(CallError::Unreachable(msg))
    }

    /// One signed request to one endpoint; its answer's signature checked.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        key: &sign::WorkspaceKey,
        p: &FederationPeer,
        peer: &str,
        endpoint: &str,
        method: &reqwest::Method,
        path: &str,
        body: &[u8],
    ) -> Result<Answer, String> {
        let t = now_ms();
        let nonce = nonce();
        let site = self.cfg.site.as_str();
        let signature = key.sign(&Signed {
            method: method.as_str(),
            path,
            time_ms: t,
            nonce: &nonce,
            body,
            site,
            workspace: &p.workspace,
        });
        let url = format!("{}{path}", endpoint.trim_end_matches('/'));
        let mut req = self
            .client
            .request(method.clone(), &url)
            .header(sign::SITE, site)
            .header(sign::WORKSPACE, &p.workspace)
            .header(sign::TIME, t.to_string())
            .header(sign::NONCE, &nonce)
            .header(sign::SIGNATURE, signature);
        if !body.is_empty() {
            req = req.header("content-type", "application/json").body(body.to_vec());
        }
        let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status().as_u16();
        let header = |h: &str| resp.headers().get(h).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (their_sig, their_time, retry_after) = (header(sign::SIGNATURE), header(sign::TIME), header("retry-after"));
        let text = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
        let mut value: serde_json::Value = if text.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&text)
                .unwrap_or_else(|_| serde_json::json!({"error": String::from_utf8_lossy(&text)}))
        };
        let signed = match (&their_sig, their_time.as_deref().and_then(|t| t.parse().ok())) {
            (Some(sig), Some(time_ms)) => key.verify(
                &Signed {
                    method: "ANSWER",
                    path: &status.to_string(),
                    time_ms,
                    nonce: &nonce,
                    body: &text,
                    site: peer,
                    workspace: &p.workspace,
                },
                sig,
            ),
            _ => false,
        };
        if !signed {
            let said = value
                .get("error")
                .and_then(|e| e.as_str())
                .unwrap_or_default()
                .to_string();
            let why = format!(
                "{url}: {status} `{said}`: the answer is not signed by {peer} (workspace {})",
                p.workspace
            );
            // An unsigned refusal (the peer does not trust this request: unknown site, revoked
            // workspace, bad signature) is final; anything else unsigned (a proxy, a rogue
            // endpoint, a member still electing that cannot tell) is a failure to retry. Its
            // content is not trusted either way.
            if (400..500).contains(&status) && !matches!(status, 421 | 429) {
                return Ok(Answer {
                    status,
                    body: serde_json::json!({"error": format!("{said} (an unsigned refusal: {why})")}),
                });
            }
            return Err(why);
        }
        if let (Some(r), Some(obj)) = (retry_after.and_then(|r| r.parse::<u64>().ok()), value.as_object_mut()) {
            obj.insert("retry_after_s".into(), r.into());
        }
        Ok(Answer { status, body: value })
    }

    /// Checks an inbound request's signature: the calling site is a peer in the named workspace,
    /// the workspace is not revoked, the time is within the skew and the nonce is new. The site and
    /// the workspace key (to sign the answer).
    pub async fn verify_inbound(
        &self,
        s: &Shared,
        method: &str,
        path: &str,
        headers: &axum::http::HeaderMap,
        body: &[u8],
    ) -> Result<(String, sign::WorkspaceKey, String), (u16, String)> {
        let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let (site, ws, nonce, sig) = (h(sign::SITE), h(sign::WORKSPACE), h(sign::NONCE), h(sign::SIGNATURE));
        if site.is_empty() || ws.is_empty() || nonce.is_empty() || sig.is_empty() {
            return Err((401, "a federation request must be signed (x-lattice-* headers)".into()));
        }
        let (peer, revoked) = peer_of_ws(s, site, ws).await;
        if revoked {
            return Err((403, format!("workspace {ws} is revoked")));
        }
        let Some(peer) = peer else {
            return Err((403, format!("{site} is not a federation peer in workspace {ws}")));
        };
        if peer.workspace != ws {
            return Err((
                403,
                format!("{site} is a peer in workspace {}, not {ws}", peer.workspace),
            ));
        }
        let key = self.cfg.key(ws).map_err(|e| (403, e))?;
        let Ok(t) = h(sign::TIME).parse::<u64>() else {
            return Err((401, "x-lattice-time: milliseconds since the epoch".into()));
        };
        let now = now_ms();
        if now.abs_diff(t) > sign::MAX_SKEW_MS {
            return Err((
                401,
                format!("request time {t} is more than 5 minutes from ours ({now})"),
            ));
        }
        let m = Signed {
            method,
            path,
            time_ms: t,
            nonce,
            body,
            site,
            workspace: ws,
        };
        if !key.verify(&m, sig) {
            return Err((401, format!("bad signature for {site} in workspace {ws}")));
        }
        if !self.nonces.lock().unwrap_or_else(|e| e.into_inner()).fresh(nonce, now) {
            return Err((401, "replayed request (nonce seen before)".into()));
        }
        Ok((site.to_string(), key, nonce.to_string()))
    }

    /// The signature headers of an answer to a request with `nonce`.
    pub fn sign_answer(
        &self,
        key: &sign::WorkspaceKey,
        workspace: &str,
        nonce: &str,
        status: u16,
        body: &[u8],
    ) -> [(String, String); 2] {
        let t = now_ms();
        let sig = key.sign(&Signed {
            method: "ANSWER",
            path: &status.to_string(),
            time_ms: t,
            nonce,
            body,
            site: &self.cfg.site,
            workspace,
        });
        [
            (sign::TIME.to_string(), t.to_string()),
            (sign::SIGNATURE.to_string(), sig),
        ]
    }

    /// This site's catalog, as `asking` sees it (the tenants its policy accepts from there).
    pub async fn local_catalog(&self, s: &Shared, asking: Option<&str>) -> Catalog {
        let (nodes, price) = {
            let c = s.control.lock().await;
            (c.nodes(), c.energy_price_now())
        };
        let mut gpu_types = BTreeMap::new();
        for n in &nodes {
            if let Some(g) = &n.gpu_type {
                *gpu_types.entry(g.clone()).or_insert(0u32) += 1;
            }
        }
        let degraded = self
            .leaderless_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() > ELECTION_DEGRADED);
        Catalog {
            site: self.cfg.site.clone(),
            generated_ms: now_ms(),
            status: if degraded { "degraded" } else { "healthy" }.into(),
            nodes: nodes.len() as u32,
            available_nodes: nodes
                .iter()
                .filter(|n| n.state == "ready" && n.owner.is_none() && !n.drifted)
                .count() as u32,
            gpu_types,
            energy_price: price.or(self.cfg.energy_price),
            datasets: self.cfg.datasets.clone(),
            uenvs: self.cfg.uenvs.clone(),
            tenants: asking
                .and_then(|a| self.cfg.accept.get(a))
                .map(|p| p.tenants.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// Fetches `peer`'s catalog once (no retries: the next round tries again).
    pub async fn sync_peer(&self, s: &Shared, peer: &str) -> Result<(), CallError> {
        // One attempt per endpoint: the loop's next round is the retry.
        let answer = self
            .call_retrying(s, peer, reqwest::Method::GET, "/federation/v1/catalog", None, 0)
            .await;
        let result = match answer {
            Ok(a) if a.status == 200 => serde_json::from_value::<Catalog>(a.body)
                .map_err(|e| CallError::Unreachable(format!("{peer}: catalog: {e}"))),
            Ok(a) => Err(CallError::Unreachable(format!(
                "{peer}: catalog: {} {}",
                a.status, a.body
            ))),
            Err(e) => Err(e),
        };
        match result {
            Ok(c) => {
                self.outcome(peer, None);
                self.view(|v| {
                    let e = v.entry(peer.to_string()).or_default();
                    // A peer whose own quorum is electing too long says so: degraded.
                    e.failing = (c.status != "healthy").then(|| format!("{peer} reports itself {}", c.status));
                    e.synced_ms = Some(now_ms());
                    e.catalog = Some(c);
                });
                Ok(())
            }
            Err(e) => {
                self.outcome(peer, Some(e.to_string()));
                Err(e)
            }
        }
    }

    /// Sets the staleness gauges from the views.
    fn gauge(&self, peers: &BTreeMap<String, FederationPeer>) {
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

/// The peer named `name` and whether its workspace is revoked.
pub async fn peer_of(s: &Shared, name: &str) -> (Option<FederationPeer>, bool) {
    let name = name.to_string();
    s.member
        .read(move |q| {
            let p = q.federation_peers.get(&name).cloned();
            let revoked = p.as_ref().is_some_and(|p| q.revoked_workspaces.contains(&p.workspace));
            (p, revoked)
        })
        .await
}

async fn peer_of_ws(s: &Shared, name: &str, ws: &str) -> (Option<FederationPeer>, bool) {
    let (name, ws) = (name.to_string(), ws.to_string());
    s.member
        .read(move |q| {
            (
                q.federation_peers.get(&name).cloned(),
                q.revoked_workspaces.contains(&ws),
            )
        })
        .await
}

/// A request's nonce: 128 random bits.
fn nonce() -> String {
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).expect("the system's random source");
    sign::hex(&b)
}

/// Every member: fetch each peer's catalog when due (every `sync_interval`; every 30 s at most
/// while it fails), keep the staleness gauges and note a long election.
pub async fn run(s: Arc<Shared>, b: Arc<Broker>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let tick = Duration::from_millis(500);
    // Ends of allocations peers forwarded here, reported to them by this member (as the leader).
    let mut reported = std::collections::BTreeSet::new();
    let mut last_report = Instant::now();
    loop {
        if !crate::server::sleep_unless_stopped(&mut stopped, tick).await {
            return;
        }
        {
            let mut l = b.leaderless_since.lock().unwrap_or_else(|e| e.into_inner());
            match (s.member.status().leader, *l) {
                (Some(_), _) => *l = None,
                (None, None) => *l = Some(Instant::now()),
                (None, Some(_)) => {}
            }
        }
        let peers = s.member.read(|q| q.federation_peers.clone()).await;
        b.view(|v| v.retain(|n, _| peers.contains_key(n)));
        let now = now_ms();
        let sync = b.cfg.sync().as_millis() as u64;
        for name in peers.keys() {
            let due = b.view(|v| {
                let e = v.get(name).cloned().unwrap_or_default();
                let every = if e.failing.is_some() { sync.min(30_000) } else { sync };
                e.attempted_ms.is_none_or(|t| now.saturating_sub(t) >= every)
            });
            if due && let Err(e) = b.sync_peer(&s, name).await {
                tracing::warn!("federation: catalog of {name}: {e}");
            }
        }
        b.gauge(&peers);
        if s.member.is_leader() && last_report.elapsed() >= REPORT_EVERY {
            last_report = Instant::now();
            super::api::report_ends(&s, &b, &mut reported).await;
        }
    }
}

/// How often the leader reports ended allocations to the sites they came from.
pub const REPORT_EVERY: Duration = Duration::from_secs(2);
