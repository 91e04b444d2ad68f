//! Queue mirroring: the seed keeps queues out of Raft (eventually consistent), yet an acknowledged
//! submission must survive the leader's death. The leader therefore mirrors every submission to the
//! other members over the gRPC port (`QueueMirror.Apply`) and acknowledges it only once a majority of
//! the members (itself included) holds it; ended allocations are pruned from the mirrors each cycle.
//! A member that becomes leader starts from a fresh engine and adopts its mirror: every allocation not
//! yet ended is queued again under the id its submitter was given (one that held nodes under the old
//! leader has them released first — its simulated agent died with that leader — and runs again).
//! Ids are never reused: the mirror carries the highest id handed out.

use crate::control::{SubmitRequest, id_number};
use crate::grpc::pb;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// One mirrored change.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MirrorOp {
    /// Queued under these ids (one submission, or a DAG's members in dependency order).
    Submit { items: Vec<(String, SubmitRequest)> },
    /// These ended (completed, failed, cancelled): nothing to adopt.
    Ended { ids: Vec<String> },
}

/// A member's copy of the leader's queue: allocation number → (id, request).
#[derive(Debug, Default)]
pub struct Mirror {
    pub entries: BTreeMap<u64, (String, SubmitRequest)>,
    /// The highest allocation number ever mirrored here (ids continue above it).
    pub max_id: u64,
}

impl Mirror {
    pub fn apply(&mut self, op: MirrorOp) {
        match op {
            MirrorOp::Submit { items } => {
                for (id, req) in items {
                    if let Some(n) = id_number(&id) {
                        self.max_id = self.max_id.max(n);
                        self.entries.insert(n, (id, req));
                    }
                }
            }
            MirrorOp::Ended { ids } => {
                for id in ids {
                    if let Some(n) = id_number(&id) {
                        self.entries.remove(&n);
                    }
                }
            }
        }
    }
}

/// Peer channels, created lazily (TLS with the member's certificate when configured).
#[derive(Default)]
pub struct Peers {
    channels: BTreeMap<u64, (String, tonic::transport::Channel)>,
}

impl Peers {
    fn channel(
        &mut self,
        id: u64,
        addr: &str,
        tls: Option<&lattice_adapters::raft_net::PeerTls>,
    ) -> Option<tonic::transport::Channel> {
        if let Some((a, c)) = self.channels.get(&id)
            && a == addr
        {
            return Some(c.clone());
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let mut e = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}")).ok()?;
        if let Some(t) = tls {
            e = e.tls_config(t.client_config(host.trim_matches(['[', ']']))).ok()?;
        }
        let c = e
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .connect_lazy();
        self.channels.insert(id, (addr.to_string(), c.clone()));
        Some(c)
    }
}

/// Sends `op` to every other member; true once enough of them applied it that a majority of the
/// members (this one included) holds it. Gives up after `within`.
pub async fn replicate(shared: &crate::server::Shared, op: &MirrorOp, within: Duration) -> bool {
    let st = shared.member.status();
    let me = shared.member.id;
    let peers: Vec<(u64, String)> = st
        .members
        .iter()
        .filter(|(id, _)| **id != me)
        .map(|(id, a)| (*id, a.clone()))
        .collect();
    let needed = st.members.len() / 2;
    if needed == 0 {
        return true;
    }
    let Ok(bytes) = serde_json::to_vec(op) else {
        return false;
    };
    let mut set = tokio::task::JoinSet::new();
    {
        let mut p = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
        for (id, addr) in peers {
            let Some(ch) = p.channel(id, &addr, shared.peer_tls.as_ref()) else {
                continue;
            };
            let req = pb::MirrorRequest {
                from: me,
                op: bytes.clone(),
            };
            set.spawn(async move {
                let mut c = pb::queue_mirror_client::QueueMirrorClient::new(ch);
                tokio::time::timeout(within, c.apply(req))
                    .await
                    .is_ok_and(|r| r.is_ok())
            });
        }
    }
    let mut acks = 0;
    while let Some(r) = set.join_next().await {
        if r.unwrap_or(false) {
            acks += 1;
            if acks >= needed {
                // The rest finish on their own (the set is dropped: they are cancelled, which is fine:
                // a peer that misses an op catches up on adoption only through what it holds).
                set.detach_all();
                return true;
            }
        }
    }
    false
}

/// The member side of `QueueMirror`.
pub struct MirrorService {
    pub shared: std::sync::Arc<crate::server::Shared>,
}

#[tonic::async_trait]
impl pb::queue_mirror_server::QueueMirror for MirrorService {
    async fn apply(
        &self,
        req: tonic::Request<pb::MirrorRequest>,
    ) -> Result<tonic::Response<pb::MirrorReply>, tonic::Status> {
        let r = req.into_inner();
        let op: MirrorOp =
            serde_json::from_slice(&r.op).map_err(|e| tonic::Status::invalid_argument(format!("op: {e}")))?;
        if r.from == self.shared.member.id {
            return Err(tonic::Status::invalid_argument(
                "from: a member does not mirror to itself",
            ));
        }
        self.shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).apply(op);
        Ok(tonic::Response::new(pb::MirrorReply {}))
    }
}
