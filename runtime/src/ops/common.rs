//! What every operation shares: leader-only writes, mirroring a change to a majority before it is
//! acknowledged, the refusals' shapes, and random tokens.

use crate::auth::Principal;
use crate::context::Shared;
use crate::effects::execute;
use crate::error::ApiError;
use crate::mirror::MirrorOp;
use lattice_control::SubmitRequest;
use std::sync::Arc;

/// Whether a list filter lets `have` through: an absent or empty filter lets everything through,
/// else only the value it names.
pub(super) fn selects(filter: &Option<String>, have: Option<&str>) -> bool {
    filter.as_deref().is_none_or(|w| w.is_empty() || Some(w) == have)
}

pub(super) fn not_found(what: &str, id: &str) -> ApiError {
    ApiError::NotFound {
        field: "id".into(),
        message: format!("no {what} {id}"),
    }
}

/// Writes are served by the leader only.
pub fn leader_only(s: &Shared) -> Result<(), ApiError> {
    if s.member.is_leader() {
        return Ok(());
    }
    let st = s.member.status();
    Err(redirect(
        s,
        st.leader,
        st.leader.and_then(|l| st.members.get(&l).cloned()),
    ))
}

/// "Not the leader", naming the leader (its quorum address and, when the quorum holds it, its REST
/// URL: clients go there).
pub fn redirect(s: &Shared, leader_id: Option<u64>, leader: Option<String>) -> ApiError {
    let leader_url = leader_id.and_then(|id| s.member.try_read(|q| q.member_urls.get(&id).cloned()).flatten());
    ApiError::NotLeader {
        leader_id,
        leader,
        leader_url,
    }
}

/// Acknowledges the submission `op` (already queued here and applied to this member's copy, which
/// `local` makes durable) only once it is on this member's disk and a majority of the members holds
/// it, so it survives any restart and the leader's death; otherwise refuses (503) and, with `cancel`,
/// cancels it (without an idempotency key a retry is a new submission; with one, the retry mirrors
/// this one again).
pub(super) async fn mirrored(s: &Arc<Shared>, (op, term, local): Recorded, cancel: bool) -> Result<(), ApiError> {
    let ids: Vec<String> = match &op {
        MirrorOp::Submit { items, .. } => items.iter().map(|(id, _)| id.clone()).collect(),
        MirrorOp::Entries { entries, .. } => entries.iter().map(|e| e.id.clone()).collect(),
        _ => Vec::new(),
    };
    let (disk, peers) = tokio::join!(
        local.wait(),
        crate::mirror::net::replicate(s, &op, term, std::time::Duration::from_secs(2))
    );
    if disk.is_ok() && peers {
        return Ok(());
    }
    let why = match disk {
        Err(e) => format!("could not be written to disk ({e})"),
        Ok(()) => "could not be mirrored to a majority of the quorum".into(),
    };
    if !cancel {
        return Err(ApiError::Unavailable {
            message: format!("{} {why} yet; retry with the same idempotency_key", ids.join(", ")),
        });
    }
    for id in &ids {
        let actions = {
            let mut c = s.control.lock().await;
            c.cancel(id);
            c.take_actions()
        };
        execute(s.clone(), actions).await;
    }
    Err(ApiError::Unavailable {
        message: format!("{} {why}; not accepted, retry", ids.join(", ")),
    })
}

/// A change recorded in this member's copy: the op to mirror, the leader term it was made in and
/// the handle of its local write ([`crate::mirror::net::record`]).
pub(super) type Recorded = (MirrorOp, u64, crate::mirror::Durable);

/// Queues `items` (one submission or a DAG's members) in this member's copy of the queue.
pub(super) fn record_submit(
    s: &Shared,
    c: &lattice_control::Control,
    items: Vec<(String, SubmitRequest)>,
    dag: Option<(String, Vec<(String, String)>)>,
) -> Recorded {
    let submitted_ms = items.first().map_or(0, |(id, _)| c.submitted_ms(id));
    let op = MirrorOp::Submit {
        items,
        submitted_ms,
        dag,
    };
    crate::mirror::net::record(s, op)
}

/// Writes that touch the queue or the engine: served by the leader once it has taken over the queue
/// (a member that just won an election adopts its mirror first, here or in its scheduling loop).
pub async fn writable(s: &Shared) -> Result<(), ApiError> {
    leader_only(s)?;
    if !crate::leadership::sync_leadership(s).await {
        leader_only(s)?;
        // The leader that could not adopt the queue yet (a majority's copies did not answer) does
        // not serve: an empty queue would lose acknowledged work and hand out used ids.
        return Err(ApiError::Unavailable {
            message: "the new leader is still taking over the queue; retry".into(),
        });
    }
    leader_only(s)
}

/// Reads of the queue and allocations: served by the leader once it has taken over the queue (a
/// member that has just started or just won an election adopts the durable queue first), so a read
/// never shows an empty queue that is really only not loaded yet. Others answer 421 naming the leader.
pub async fn readable(s: &Shared) -> Result<(), ApiError> {
    writable(s).await
}

/// "No allocation `id`" — said only after confirming with a majority that this member still leads:
/// a deposed leader that has not heard of its successor yet must not deny what the new leader
/// acknowledged (it answers "not the leader" instead).
pub(super) async fn absent(s: &Shared, id: &str) -> ApiError {
    absent_as(s, "allocation", id).await
}

/// [`absent`] for any kind of record (`allocation`, `DAG`).
pub(super) async fn absent_as(s: &Shared, kind: &str, id: &str) -> ApiError {
    match s.member.confirm_leader().await {
        // And only from the queue adopted in the term it leads (not a control plane replaced by a
        // leadership change while the request ran).
        Ok(()) if s.control.lock().await.adopted_term == s.member.leader_term() => not_found(kind, id),
        Ok(()) => ApiError::Unavailable {
            message: "the leader is taking over the queue; retry".into(),
        },
        Err(lattice_adapters::ProposeError::NotLeader { leader_id, leader }) => redirect(s, leader_id, leader),
        Err(e) => ApiError::Unavailable {
            message: format!("id: could not confirm leadership to look up {id}: {e}"),
        },
    }
}

/// The caller may change allocation `id` (owner, tenant admin or system admin): 403 if they only see
/// it, 404 if they do not even see it.
pub(super) async fn may_change(s: &Shared, p: &Principal, id: &str, what: &str) -> Result<(), ApiError> {
    let owner = {
        let c = s.control.lock().await;
        c.view_named(id).map(|v| (v.tenant, v.user, c.is_sensitive_named(id)))
    };
    match owner {
        Some((t, u, sensitive)) if p.can_cancel(&t, u.as_deref()) => {
            if sensitive {
                audit_committed(s, p, id, "api_call", what).await?;
            }
            Ok(())
        }
        Some((t, u, _)) if p.can_see(&t, u.as_deref()) => Err(ApiError::Forbidden {
            field: None,
            message: format!("forbidden: {what} this allocation"),
        }),
        _ => Err(absent(s, id).await),
    }
}

/// Book ("Sensitive Workload Design": "All access was logged with user identity and timestamp"):
/// a call about a sensitive allocation — reading it, its logs or its metrics, changing it — is
/// in the quorum's audit log before it is answered (`action`: `api_call`, `log_access`,
/// `metrics_query`; `detail` what was asked). A call whose entry cannot be committed is refused.
pub(crate) async fn audit_access(
    s: &Shared,
    p: &Principal,
    id: &str,
    action: &str,
    detail: &str,
) -> Result<(), ApiError> {
    if !s.control.lock().await.is_sensitive_named(id) {
        return Ok(());
    }
    audit_committed(s, p, id, action, detail).await
}

async fn audit_committed(s: &Shared, p: &Principal, id: &str, action: &str, detail: &str) -> Result<(), ApiError> {
    let cmd = crate::context::audit_command(s, &p.user, id, action, detail.to_string());
    committed(s, cmd, action).await
}

pub(super) fn bad_request(e: lattice_control::FieldError) -> ApiError {
    ApiError::BadRequest {
        field: e.field,
        message: e.message,
    }
}

/// Waits until `op` (applied to this member's copy, `local` its write) is on this member's disk, while
/// the other members are sent it too (best effort: the next leader merges what it missed).
pub(super) async fn on_disk(s: &Arc<Shared>, (op, term, local): Recorded) -> Result<(), String> {
    let (disk, _) = tokio::join!(
        local.wait(),
        crate::mirror::net::replicate(s, &op, term, std::time::Duration::from_secs(2))
    );
    disk
}

/// Proposes `cmd` and waits for its commit; a rejection at apply time is the caller's error.
pub(super) async fn committed(s: &Shared, cmd: lattice_adapters::QuorumCommand, what: &str) -> Result<(), ApiError> {
    match s.member.propose(cmd).await {
        // (A single command is never answered with a batch's answers.)
        Ok(lattice_adapters::QuorumResponse::Applied | lattice_adapters::QuorumResponse::Batch(_)) => Ok(()),
        Ok(lattice_adapters::QuorumResponse::Rejected { reason, message }) => Err(match reason.as_str() {
            "no_tenant" => not_found("tenant", what),
            "no_vcluster" => not_found("vcluster", what),
            "no_project" => not_found("project", what),
            _ => ApiError::Conflict { message },
        }),
        Err(lattice_adapters::ProposeError::NotLeader { leader_id, leader }) => Err(redirect(s, leader_id, leader)),
        Err(e) => Err(ApiError::Unavailable {
            message: format!("{what}: the change could not be committed at the quorum ({e}); retry"),
        }),
    }
}

/// Runs `work` — mirroring a submission and settling whether it is acknowledged — to its end even
/// when the request that started it is dropped (a client that gave up and closed its connection):
/// otherwise its allocations would stay "being acknowledged" for good, never start, and hold up the
/// queue behind them (found by DST, seed 586).
pub(super) async fn settled<F>(s: &Arc<Shared>, work: impl FnOnce(Arc<Shared>) -> F) -> Result<(), ApiError>
where
    F: std::future::Future<Output = Result<(), ApiError>> + Send + 'static,
{
    tokio::spawn(work(s.clone())).await.unwrap_or_else(|e| {
        Err(ApiError::Unavailable {
            message: format!("acknowledging the submission failed ({e}); retry"),
        })
    })
}

pub(super) fn field_error(node: &str, e: lattice_control::FieldError) -> ApiError {
    if e.field == "id" && e.message.starts_with("no node") {
        not_found("node", node)
    } else {
        ApiError::BadRequest {
            field: e.field,
            message: e.message,
        }
    }
}

/// The launch's secret: 128 random bits (the agents accept its fences and aborts only with it).
pub(super) fn random_token() -> String {
    random_secret()[..16].iter().map(|x| format!("{x:02x}")).collect()
}

/// 256 random bits from the kernel.
pub fn random_secret() -> [u8; 32] {
    use std::io::Read;
    let mut b = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        // Never a predictable secret: the time and address of this call, hashed.
        use sha2::Digest;
        let seed = format!("{:?}{:p}", std::time::SystemTime::now(), &b);
        b.copy_from_slice(&sha2::Sha256::digest(seed.as_bytes()));
    }
    b
}

/// `2026-03-01` → ms at UTC midnight; a bare integer is taken as ms.
pub fn parse_instant(field: &str, v: &str) -> Result<u64, ApiError> {
    let bad = || ApiError::BadRequest {
        field: field.into(),
        message: format!("`{v}`: expected YYYY-MM-DD or milliseconds since the epoch"),
    };
    if let Ok(ms) = v.parse::<u64>() {
        return Ok(ms);
    }
    let parts: Vec<&str> = v.split('-').collect();
    let [y, m, d] = parts[..] else { return Err(bad()) };
    let (y, m, d) = (
        y.parse::<i64>().map_err(|_| bad())?,
        m.parse::<i64>().map_err(|_| bad())?,
        d.parse::<i64>().map_err(|_| bad())?,
    );
    // Years past 9999 are refused too: the day arithmetic below would overflow (a fuzzed query
    // string found it: `since=9223372036854775807-01-01` panicked the handler).
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    // Days from civil (proleptic Gregorian), Howard Hinnant's algorithm.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days as u64 * 86_400_000)
}
