//! The Raft transport over gRPC (tonic): a lazily connected, cached channel per peer on the client
//! side, with openraft's per-RPC deadline; the server side hands requests to the local `Raft`.
//! Connection failures are `Unreachable` (openraft backs off), transport failures `Network` (retried),
//! and errors of the remote Raft come back as `RemoteError`.

use crate::raft_store::{NodeId, Raft, TypeConfig};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, RaftNetwork, RaftNetworkFactory};
use serde::{Deserialize, Serialize};

pub mod pb {
    tonic::include_proto!("lattice.raft.v1");
}

/// Largest Raft message (snapshot chunks are 3 MiB of bytes, about 4× that as JSON numbers).
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// Fault injection for chaos tests (process-wide): links cut between members, checked by the
/// sending side of every RPC, so a cut `(a, b)` pair isolates both directions when both are cut.
pub mod fault {
    use super::NodeId;
    use std::collections::BTreeSet;
    use std::sync::{Mutex, OnceLock};

    fn cut() -> &'static Mutex<BTreeSet<(NodeId, NodeId)>> {
        static CUT: OnceLock<Mutex<BTreeSet<(NodeId, NodeId)>>> = OnceLock::new();
        CUT.get_or_init(Default::default)
    }

    /// Partitions the members into `groups`: every link between two groups is cut (both directions).
    pub fn partition(groups: &[&[NodeId]]) {
        let mut c = cut().lock().unwrap_or_else(|p| p.into_inner());
        for (i, a) in groups.iter().enumerate() {
            for b in &groups[i + 1..] {
                for x in *a {
                    for y in *b {
                        c.insert((*x, *y));
                        c.insert((*y, *x));
                    }
                }
            }
        }
    }

    /// Restores every link.
    pub fn heal() {
        cut().lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub(crate) fn is_cut(from: NodeId, to: NodeId) -> bool {
        cut().lock().unwrap_or_else(|p| p.into_inner()).contains(&(from, to))
    }
}

/// TLS between members (PEM bytes): peers' server certificates are verified against `ca`, and this
/// member presents `cert`/`key` as its client certificate (mTLS). The same material serves the
/// member's own gRPC port, so a member certificate carries both serverAuth and clientAuth usages.
#[derive(Clone, Debug)]
pub struct PeerTls {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl PeerTls {
    /// tonic's client configuration for a peer at `host` (the name or IP its certificate names).
    pub fn client_config(&self, host: &str) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca))
            .identity(tonic::transport::Identity::from_pem(&self.cert, &self.key))
            .domain_name(host)
    }
}

/// The host part of `host:port` (`[v6]:port` too).
fn host_of(addr: &str) -> &str {
    let h = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']')
}

/// Turns a peer's endpoint into a channel. Production connects lazily over TCP
/// ([`Endpoint::connect_lazy`](tonic::transport::Endpoint::connect_lazy)); a deterministic
/// simulation connects through its simulated network instead.
pub type Dialer = std::sync::Arc<dyn Fn(tonic::transport::Endpoint) -> tonic::transport::Channel + Send + Sync>;

/// The channel to `endpoint`: through `dial` when given, else lazily over TCP. HTTP/2 keep-alive
/// pings every second, answered within two, so a connection to a peer that vanished without a reset
/// (power cut, a partition) is dropped and redialled within seconds instead of hanging every request
/// on it until TCP gives up (minutes).
pub fn dial(endpoint: tonic::transport::Endpoint, dial: Option<&Dialer>) -> tonic::transport::Channel {
    let endpoint = endpoint
        .http2_keep_alive_interval(std::time::Duration::from_secs(1))
        .keep_alive_timeout(std::time::Duration::from_secs(2))
        .keep_alive_while_idle(true);
    match dial {
        Some(d) => d(endpoint),
        None => endpoint.connect_lazy(),
    }
}

/// Creates one [`Conn`] per peer for the member `from`.
#[derive(Clone, Default)]
pub struct Network {
    pub from: NodeId,
    /// `Some`: peers are reached over TLS with this member's client certificate.
    pub tls: Option<std::sync::Arc<PeerTls>>,
    /// `Some`: how channels are made (a simulated network).
    pub dial: Option<Dialer>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Conn {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let channel = tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", node.addr))
            .and_then(|e| match &self.tls {
                Some(t) => e.tls_config(t.client_config(host_of(&node.addr))),
                None => Ok(e),
            })
            .map(|e| {
                dial(
                    e.connect_timeout(std::time::Duration::from_secs(1)).tcp_nodelay(true),
                    self.dial.as_ref(),
                )
            })
            .map_err(|e| format!("{}: {e}", node.addr));
        Conn {
            from: self.from,
            target,
            channel,
        }
    }
}

pub struct Conn {
    from: NodeId,
    target: NodeId,
    /// The lazily connected channel, or why the peer's address/TLS settings are unusable (every RPC
    /// then fails as `Unreachable` with that reason).
    channel: Result<tonic::transport::Channel, String>,
}

#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl Conn {
    async fn call<Req, Resp, E>(
        &self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
    where
        Req: Serialize,
        Resp: for<'a> Deserialize<'a>,
        E: std::error::Error + for<'a> Deserialize<'a>,
    {
        if fault::is_cut(self.from, self.target) {
            let e = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "link cut (fault injection)");
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        }
        let channel = match &self.channel {
            Ok(c) => c.clone(),
            Err(why) => {
                let e = std::io::Error::other(format!("node {}: {why}", self.target));
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
        };
        let mut client = pb::raft_service_client::RaftServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let data = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let request = pb::RaftRequest { data };
        let fut = async {
            match rpc {
                Rpc::Append => client.append_entries(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::Snapshot => client.install_snapshot(request).await,
            }
        };
        let reply = match tokio::time::timeout(option.hard_ttl(), fut).await {
            Err(_) => {
                let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "raft rpc deadline");
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
            Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&status)));
            }
            Ok(Err(status)) => return Err(RPCError::Network(NetworkError::new(&status))),
            Ok(Ok(r)) => r.into_inner(),
        };
        if !reply.error.is_empty() {
            let e: E = serde_json::from_str(&reply.error).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
            return Err(RPCError::RemoteError(RemoteError::new(self.target, e)));
        }
        serde_json::from_slice(&reply.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(Rpc::Append, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(Rpc::Snapshot, &rpc, &option).await
    }
}

/// The gRPC service a member serves to its peers.
pub struct RaftService {
    pub raft: Raft,
    /// This member's snapshot files (a peer recovering from damaged ones fetches the latest).
    pub snaps: std::sync::Arc<crate::snapshots::Snapshots>,
}

fn reply<T: Serialize, E: Serialize>(r: Result<T, E>) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
    let encode = |e: serde_json::Error| tonic::Status::internal(e.to_string());
    Ok(tonic::Response::new(match r {
        Ok(v) => pb::RaftReply {
            data: serde_json::to_vec(&v).map_err(encode)?,
            error: String::new(),
        },
        Err(e) => pb::RaftReply {
            data: Vec::new(),
            error: serde_json::to_string(&e).map_err(encode)?,
        },
    }))
}

fn decode<T: for<'a> Deserialize<'a>>(r: tonic::Request<pb::RaftRequest>) -> Result<T, tonic::Status> {
    serde_json::from_slice(&r.into_inner().data).map_err(|e| tonic::Status::invalid_argument(e.to_string()))
}

#[tonic::async_trait]
impl pb::raft_service_server::RaftService for RaftService {
    async fn append_entries(
        &self,
        r: tonic::Request<pb::RaftRequest>,
    ) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
        reply(self.raft.append_entries(decode(r)?).await)
    }

    async fn vote(&self, r: tonic::Request<pb::RaftRequest>) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
        reply(self.raft.vote(decode(r)?).await)
    }

    async fn install_snapshot(
        &self,
        r: tonic::Request<pb::RaftRequest>,
    ) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
        reply(self.raft.install_snapshot(decode(r)?).await)
    }

    async fn fetch_snapshot(
        &self,
        _: tonic::Request<pb::RaftRequest>,
    ) -> Result<tonic::Response<pb::RaftReply>, tonic::Status> {
        let latest = self.snaps.latest().map_err(|e| e.to_string());
        reply(latest)
    }
}

/// A peer's latest snapshot, for a member whose own snapshots all fail their checksums: fetched
/// over the Raft service at `addr` (with this member's TLS and dialer), `None` when it has none.
pub async fn fetch_snapshot(
    addr: &str,
    tls: Option<&PeerTls>,
    dial_with: Option<&Dialer>,
) -> Result<Option<crate::snapshots::StoredSnapshot>, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
        .and_then(|e| match tls {
            Some(t) => e.tls_config(t.client_config(host_of(addr))),
            None => Ok(e),
        })
        .map_err(|e| format!("{addr}: {e}"))?
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(std::time::Duration::from_secs(30));
    let mut client = pb::raft_service_client::RaftServiceClient::new(dial(endpoint, dial_with))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let r = client
        .fetch_snapshot(pb::RaftRequest { data: Vec::new() })
        .await
        .map_err(|e| format!("{addr}: {e}"))?
        .into_inner();
    if !r.error.is_empty() {
        return Err(format!("{addr}: {}", r.error));
    }
    serde_json::from_slice(&r.data).map_err(|e| format!("{addr}: not a snapshot: {e}"))
}

/// Accepted connections with Nagle's algorithm off: Raft's small messages must not wait for the
/// peer's delayed ACK (40 ms on Linux), which otherwise shows up as the commit latency's p99.
pub fn nodelay(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            let _ = s.set_nodelay(true);
        }
        s
    })
}

/// The tonic server for a member's Raft service, with the message size limits raised.
pub fn server(
    raft: Raft,
    snaps: std::sync::Arc<crate::snapshots::Snapshots>,
) -> pb::raft_service_server::RaftServiceServer<RaftService> {
    pb::raft_service_server::RaftServiceServer::new(RaftService { raft, snaps })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

/// A loopback port for a member to listen on later, below the kernel's ephemeral range.
///
/// A port from `bind(":0")` comes from the ephemeral range, and once that probe socket closes the
/// kernel may hand the same port to any outgoing connection — e.g. one member dialling another
/// while the next member is still starting, which then fails to bind ("address in use"). Ports in
/// 20000..32000 are never picked for outgoing connections or `:0` binds; each call in a process
/// takes the next one (starting at an offset from the pid so concurrent processes rarely meet) and
/// skips any that is taken now.
pub fn loopback_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id() * 97) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "no free loopback port in 20000..32000",
    ))
}
