//! The agent's REST client of the control plane (ureq, rustls): register, heartbeat, poll for work,
//! report exits. Identity (book: "Agent Authentication"): with a bootstrap certificate and key the
//! agent authenticates by mTLS — the certificate's CN is its node id, and no token is sent (mTLS
//! takes priority); otherwise the bearer token `LATTICE_AGENT_TOKEN` (an Operator-role agent token,
//! for development) is sent when set. `https://` endpoints are verified against the bootstrap CA or
//! the system roots.

use serde::{Deserialize, Serialize};
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

/// Work the control plane hands this node (see the runtime's `Work`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Work {
    pub launch: Vec<Launch>,
    pub kill: Vec<String>,
    /// Checkpoint hints for these allocations (by their declared mechanism).
    #[serde(default)]
    pub checkpoint: Vec<String>,
    /// Preempted allocations: how to stop them.
    #[serde(default)]
    pub preempt: Vec<PreemptWork>,
    /// Released sensitive claims: wipe this node (the site's wipe command).
    #[serde(default)]
    pub wipe: Vec<String>,
    /// Someone follows these allocations' output: send what is new with the next polls.
    #[serde(default)]
    pub tail: Vec<String>,
    /// Recompute the conformance fingerprint now and report it.
    #[serde(default)]
    pub refresh_fingerprint: bool,
    /// Task launches within running allocations that have ranks on this node (`lattice launch`).
    #[serde(default)]
    pub tasks: Vec<TaskLaunch>,
    /// Task launches running here that ended at the control plane (or that it does not know): stop them.
    #[serde(default)]
    pub stop_tasks: Vec<String>,
    /// Image cache orders (`lattice cache warm|evict`).
    #[serde(default)]
    pub cache: Vec<CacheOrder>,
}

/// An operator's order for this node's image cache.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CacheOrder {
    /// `warm` (pull it; `sticky`: never evict it) or `evict`.
    pub op: String,
    /// A uenv, `name/version:tag`.
    pub image: String,
    #[serde(default)]
    pub sticky: bool,
}

/// An order's outcome, reported with a poll.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CacheOutcome {
    pub op: String,
    pub image: String,
    pub ok: bool,
    pub detail: String,
}

/// One cached image, reported when the cache changed.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CachedImage {
    pub file: String,
    pub size: u64,
    pub last_used_ms: u64,
    pub sticky: bool,
}

/// One task launch's part on this node (see the runtime's `TaskWork`): ranks
/// `first_rank..first_rank + num_ranks` of `world_size`, run as `/bin/sh -c ENTRYPOINT`, with a PMI
/// server; the launch's nodes are `peers` (this one is `peers[node_index]`, the head agent — rank 0's
/// — is `peers[0]`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct TaskLaunch {
    pub launch_id: String,
    pub alloc: String,
    pub entrypoint: String,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    pub world_size: u32,
    pub node_index: u32,
    pub peers: Vec<TaskPeer>,
    /// The launch's secret: agents accept fences and aborts of this launch only with it.
    pub token: String,
    /// How long a fence may take before the launch is aborted ("PMI fence timeout").
    #[serde(default)]
    pub fence_timeout_s: Option<f64>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct TaskPeer {
    pub node: String,
    /// Its agent's service address (`host:port`).
    #[serde(default)]
    pub address: Option<String>,
    pub first_rank: u32,
    pub num_ranks: u32,
}

/// How a task launch ended on this node, reported with a poll.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TaskEnd {
    pub launch_id: String,
    pub alloc: String,
    pub ranks: Vec<RankEnd>,
    /// Why the launch was aborted (a rank failed, "PMI fence timeout", the allocation ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One rank's end: its exit code (128 + signal when a signal ended it) and the newest output.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RankEnd {
    pub rank: u32,
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Outcomes an agent reports with its next poll.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reports {
    pub checkpointed: Vec<Outcome>,
    pub wiped: Vec<Outcome>,
    /// Scaling metrics of allocations on this node (built-in and application-reported).
    pub metrics: Vec<Metric>,
    /// Task launches that ended on this node.
    pub task_ends: Vec<TaskEnd>,
    /// Task launches that run on this node now.
    pub tasks_running: Vec<String>,
    /// Outcomes of cache orders, and the cache's contents when they changed.
    pub cache_done: Vec<CacheOutcome>,
    pub cache: Option<Vec<CachedImage>>,
    /// Allocations started here since the last poll: seconds from the work answer that assigned
    /// them to their processes' start (uenv pull and mount included).
    pub startups: Vec<Startup>,
    /// The last telemetry collection's CPU time over its period, percent of one core.
    pub collection_overhead_pct: Option<f64>,
}

/// How long one allocation took to start on this node.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Startup {
    pub id: String,
    pub seconds: f64,
}

/// One scaling-metric sample of an allocation on this node.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Metric {
    pub id: String,
    pub name: String,
    pub value: f64,
}

/// A preemption of an allocation this node runs (see the runtime's `PreemptWork`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct PreemptWork {
    pub id: String,
    /// `checkpoint` (hint, wait up to `deadline_s`, stop), `stop` or `kill` (stop without one).
    pub how: String,
    #[serde(default)]
    pub deadline_s: f64,
    #[serde(default)]
    pub grace_s: f64,
}

/// The outcome of a checkpoint hint or a wipe on this node, reported with a poll.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Outcome {
    pub id: String,
    pub ok: bool,
}

/// New output of a followed allocation: bytes `offset..next` of one of its streams, as text.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Output {
    pub id: String,
    pub stream: lattice_adapters::logstore::Stream,
    pub offset: u64,
    pub next: u64,
    pub data: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Launch {
    pub id: String,
    pub entrypoint: String,
    pub nodes: Vec<String>,
    pub task_index: u32,
    pub walltime_s: Option<f64>,
    pub tenant: String,
    pub user: Option<String>,
    #[serde(default)]
    pub project: Option<String>,
    /// How the application takes checkpoint hints: signal (default), shmem, grpc, dmtcp.
    #[serde(default = "signal")]
    pub checkpoint: String,
    /// Its network domain's Slingshot VNI and CXI auth key, when it has one.
    #[serde(default)]
    pub vni: Option<u32>,
    #[serde(default)]
    pub cxi_auth_key: Option<String>,
    /// Seconds of work its last completed checkpoint kept: it restarts from that checkpoint.
    #[serde(default)]
    pub restart_from_s: Option<f64>,
    /// A task group element: its group's id and its index.
    #[serde(default)]
    pub task_group: Option<TaskGroup>,
    /// The uenv its processes run in, and the view to activate.
    #[serde(default)]
    pub uenv: Option<String>,
    #[serde(default)]
    pub uenv_view: Option<String>,
    /// The OCI image its processes run in (a container of this node's OCI runtime).
    #[serde(default)]
    pub image: Option<String>,
    /// The allocation's secret for `lattice-mpi-launcher` (`LATTICE_LAUNCH_TOKEN`): this node's
    /// agent runs a process inside the allocation for whoever presents it.
    #[serde(default)]
    pub launch_token: Option<String>,
    /// The allocation's nodes' agent service addresses (`LATTICE_AGENTS`, for `lattice-mpi-launcher`).
    #[serde(default)]
    pub agents: std::collections::BTreeMap<String, String>,
    /// Its data mounts (those with a target) and whether it gets the default ones.
    #[serde(default)]
    pub mounts: Vec<crate::data::DataMount>,
    #[serde(default = "yes")]
    pub data_defaults: bool,
    /// It has a checkpoint strategy (its checkpoint directory is made).
    #[serde(default)]
    pub checkpoints: bool,
    /// Its service's liveness probe ([`crate::probe`]).
    #[serde(default)]
    pub liveness_probe: Option<crate::probe::ProbeSpec>,
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct TaskGroup {
    pub group: String,
    pub index: u32,
}

fn signal() -> String {
    "signal".into()
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExitKind {
    Exited,
    Walltime,
    /// Preempted: stopped after its checkpoint was written.
    Checkpointed,
    /// Preempted: stopped without a (complete) checkpoint.
    Preempted,
    /// Stopped by the agent itself: cut off from the control plane past its lease.
    Fenced,
    /// Could not be prepared here (its uenv could not be pulled or read): retried on other nodes.
    Prologue,
    /// Stopped by the agent after its liveness probe failed `failure_threshold` times in a row.
    Liveness,
    /// Killed at its walltime while a checkpoint it was asked for was still in progress (the book's
    /// walltime/checkpoint race: walltime wins).
    WalltimeCheckpoint,
}

/// What a heartbeat answered: the node's state and the agent's lease — how long it may keep running
/// its work without another accepted heartbeat (the control plane may requeue it elsewhere after).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Beat {
    pub state: String,
    pub lease: Option<std::time::Duration>,
}

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

/// A heartbeat that could not be delivered when it was due (during a partition), kept to be
/// replayed: its sequence number and when it was due (ms since the epoch).
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Buffered {
    pub seq: u64,
    pub at_ms: u64,
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
