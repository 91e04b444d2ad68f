//! The queue mirror between members: a change recorded in this member's copy ([`record`]), mirrored
//! to the others until a majority holds it ([`replicate`]; the changes made while a round is out go
//! together in the next, [`super::Rounds`]), served to them (`QueueMirror.Apply`,
//! `QueueMirror.Fetch`: [`MirrorService`]) and fetched from them by a new leader ([`fetch_all`]).

use super::{Durable, MirrorOp, Queued, Snapshot};
use crate::context::Shared;
use crate::pb;
use std::sync::Arc;
use std::time::Duration;

/// Applies `op` to this member's copy as the leader of its current term: the op, that term (0 when
/// this member does not lead: every member refuses it) and the local write.
pub fn record(shared: &Shared, op: MirrorOp) -> (MirrorOp, u64, Durable) {
    let term = shared.member.leader_term().unwrap_or(0);
    let current = shared.member.current_term();
    let durable = shared
        .mirror
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .apply_fenced(op.clone(), term, current);
    (op, term, durable)
}

/// A round carries at most this many bytes of operations (a gRPC message is at most 4 MiB).
const ROUND_BYTES: usize = 2 << 20;

/// Sends `op` (made by the leader of `term`) to every other member, in the next mirror round; true
/// once enough of them applied it that a majority of the members (this one included) holds it.
/// Gives up after `within`.
pub async fn replicate(shared: &Arc<Shared>, op: &MirrorOp, term: u64, within: Duration) -> bool {
    if shared.bugs.ack_without_majority {
        // The test-only injected bug (`lattice-dst --bug`): acknowledged on the leader's
        // own disk alone.
        return true;
    }
    if shared.member.status().members.len() / 2 == 0 {
        return true;
    }
    let Ok(op) = serde_json::to_vec(op) else {
        return false;
    };
    let (done, answer) = tokio::sync::oneshot::channel();
    let start = {
        let mut r = shared.rounds.state.lock().unwrap_or_else(|e| e.into_inner());
        r.queue.push_back(Queued { op, term, within, done });
        !std::mem::replace(&mut r.sending, true)
    };
    if start {
        tokio::spawn(send_rounds(shared.clone()));
    }
    matches!(tokio::time::timeout(within, answer).await, Ok(Ok(true)))
}

/// Sends rounds until the queue is empty: each round the operations queued (of one term, up to
/// [`ROUND_BYTES`]), in order.
async fn send_rounds(shared: Arc<Shared>) {
    loop {
        let round: Vec<Queued> = {
            let mut r = shared.rounds.state.lock().unwrap_or_else(|e| e.into_inner());
            let Some(first) = r.queue.front() else {
                r.sending = false;
                return;
            };
            let term = first.term;
            let mut bytes = 0;
            let mut n = 0;
            for q in r.queue.iter() {
                if q.term != term || (n > 0 && bytes + q.op.len() > ROUND_BYTES) {
                    break;
                }
                bytes += q.op.len();
                n += 1;
            }
            r.queue.drain(..n).collect()
        };
        let term = round[0].term;
        let within = round.iter().map(|q| q.within).max().unwrap_or_default();
        let (ops, dones): (Vec<Vec<u8>>, Vec<_>) = round.into_iter().map(|q| (q.op, q.done)).unzip();
        let ok = send_round(&shared, ops, term, within).await;
        for d in dones {
            let _ = d.send(ok);
        }
    }
}

/// One round to every other member; true once enough of them applied it that a majority of the
/// members (this one included) holds it. Gives up after `within`.
async fn send_round(shared: &Shared, mut ops: Vec<Vec<u8>>, term: u64, within: Duration) -> bool {
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
    // One operation goes as `op` (what every member reads); several as `ops`.
    let (op, ops) = if ops.len() == 1 {
        (ops.pop().unwrap_or_default(), Vec::new())
    } else {
        (Vec::new(), ops)
    };
    let mut set = tokio::task::JoinSet::new();
    {
        let mut p = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
        for (id, addr) in peers {
            let Some(ch) = p.channel(id, &addr, shared.peer_tls.as_ref(), shared.dial.as_ref()) else {
                continue;
            };
            let req = pb::MirrorRequest {
                from: me,
                op: op.clone(),
                term,
                ops: ops.clone(),
            };
            set.spawn(async move {
                let mut c = pb::queue_mirror_client::QueueMirrorClient::new(ch);
                match tokio::time::timeout(within, c.apply(req)).await {
                    Ok(Ok(_)) => true,
                    Ok(Err(status)) => {
                        tracing::debug!("mirroring to member {id}: {status}");
                        false
                    }
                    Err(_) => {
                        tracing::debug!("mirroring to member {id}: no answer within {within:?}");
                        false
                    }
                }
            });
        }
    }
    let mut acks = 0;
    while let Some(r) = set.join_next().await {
        if r.unwrap_or(false) {
            acks += 1;
            if acks >= needed {
                // The rest finish on their own (a peer that misses an op catches up on adoption
                // only through what it holds).
                set.detach_all();
                return true;
            }
        }
    }
    false
}

/// The member side of `QueueMirror`.
pub struct MirrorService {
    pub shared: std::sync::Arc<Shared>,
}

#[tonic::async_trait]
impl pb::queue_mirror_server::QueueMirror for MirrorService {
    async fn apply(
        &self,
        req: tonic::Request<pb::MirrorRequest>,
    ) -> Result<tonic::Response<pb::MirrorReply>, tonic::Status> {
        let r = req.into_inner();
        // One operation (`op`), or a round of several (`ops`), applied in order.
        let raw: Vec<&[u8]> = if r.ops.is_empty() {
            vec![r.op.as_slice()]
        } else {
            r.ops.iter().map(Vec::as_slice).collect()
        };
        let ops: Vec<MirrorOp> = raw
            .iter()
            .enumerate()
            .map(|(i, b)| {
                serde_json::from_slice(b).map_err(|e| tonic::Status::invalid_argument(format!("ops[{i}]: {e}")))
            })
            .collect::<Result<_, _>>()?;
        if r.from == self.shared.member.id {
            return Err(tonic::Status::invalid_argument(
                "from: a member does not mirror to itself",
            ));
        }
        // Answered only once it is on this member's disk; refused from a deposed leader.
        let current = self.shared.member.current_term();
        not_ahead_of_raft(r.term, current)?;
        let written: Vec<Durable> = {
            let mut m = self.shared.mirror.lock().unwrap_or_else(|e| e.into_inner());
            ops.into_iter().map(|op| m.apply_fenced(op, r.term, current)).collect()
        };
        for durable in written {
            durable.wait().await.map_err(tonic::Status::failed_precondition)?;
        }
        Ok(tonic::Response::new(pb::MirrorReply {}))
    }

    async fn fetch(
        &self,
        req: tonic::Request<pb::MirrorRequest>,
    ) -> Result<tonic::Response<pb::MirrorSnapshot>, tonic::Status> {
        // The fence first: no operation of an older leader lands here after this answer.
        let term = req.into_inner().term;
        not_ahead_of_raft(term, self.shared.member.current_term())?;
        let promised = self
            .shared
            .mirror
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .promise(term);
        promised.wait().await.map_err(tonic::Status::unavailable)?;
        let snap = self.shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).snapshot();
        let bytes = serde_json::to_vec(&snap).map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(tonic::Response::new(pb::MirrorSnapshot { snapshot: bytes }))
    }
}

/// A term this member's Raft has not seen yet is refused (retry): a leader's term reaches its voters
/// before it reads or writes their copies, and taking a term on a peer's word alone would let one
/// malformed message fence this copy against every real leader to come (found by the gRPC fuzz: a
/// mutated term of 127 left a term-1 leader unable to acknowledge anything).
fn not_ahead_of_raft(term: u64, current: u64) -> Result<(), tonic::Status> {
    if term > current {
        return Err(tonic::Status::unavailable(format!(
            "term: {term} is newer than any this member's Raft has seen ({current}); retry"
        )));
    }
    Ok(())
}

/// The other members' copies, read by the new leader of `term` (each promises to refuse older
/// leaders' operations first); an error unless enough answer within `within` that they and this
/// member form a majority — every acknowledged operation is then in one of the copies.
pub async fn fetch_all(shared: &Shared, term: u64, within: Duration) -> Result<Vec<Snapshot>, String> {
    let st = shared.member.status();
    let me = shared.member.id;
    let needed = st.members.len() / 2;
    let mut set = tokio::task::JoinSet::new();
    {
        let mut p = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
        for (id, addr) in st.members.iter().filter(|(id, _)| **id != me) {
            let Some(ch) = p.channel(*id, addr, shared.peer_tls.as_ref(), shared.dial.as_ref()) else {
                continue;
            };
            set.spawn(async move {
                let mut c = pb::queue_mirror_client::QueueMirrorClient::new(ch);
                let r = tokio::time::timeout(
                    within,
                    c.fetch(pb::MirrorRequest {
                        from: me,
                        op: Vec::new(),
                        term,
                        ops: Vec::new(),
                    }),
                )
                .await;
                let bytes = r.ok()?.ok()?.into_inner().snapshot;
                serde_json::from_slice::<Snapshot>(&bytes).ok()
            });
        }
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(Some(s)) = r {
            out.push(s);
        }
    }
    if out.len() < needed {
        return Err(format!(
            "only {} of the {needed} other copies needed for a majority answered",
            out.len()
        ));
    }
    Ok(out)
}
