//! The federation broker inside a member: its view of the peers, signed calls to them with retries,
//! the catalog sync loop and this site's own catalog.

use super::sign::{self, Signed};
use super::{Catalog, now_ms};
use crate::context::Shared;
use lattice_adapters::FederationPeer;
use std::collections::BTreeMap;
use std::time::Duration;

pub use super::state::{Answer, Broker, CallError, ELECTION_DEGRADED, FederationMetrics, MAX_BACKOFF};

impl Broker {
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
