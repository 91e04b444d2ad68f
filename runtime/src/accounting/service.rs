//! The accounting pipeline in a running member: the push loop ([`run`]), event generation from the
//! control plane's records and the quorum's audit log, and the API's status and reconcile calls.

use super::{Accountant, AccountingStatus, MARK_LAG_MS, ReconcileIn, Reconciled, audit_events, events_of, parse_when};
use crate::auth::Principal;
use crate::context::Shared;
use crate::error::ApiError;
use lattice_adapters::waldur::AccountingEvent;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Every event at or after `since_ms` (and, with `until_ms`, before it), oldest first.
async fn generate(s: &Shared, since_ms: u64, until_ms: Option<u64>) -> (Vec<AccountingEvent>, u64) {
    let audit: Vec<_> = s
        .member
        .read(|q| q.audit.iter().filter(|e| e.at_ms >= since_ms).cloned().collect())
        .await;
    let c = s.control.lock().await;
    let now = c.now().0;
    let mut evs: Vec<AccountingEvent> = c.accounting_rows(since_ms).iter().flat_map(events_of).collect();
    evs.extend(audit_events(&audit, since_ms, |a| c.view_named(a)));
    drop(c);
    evs.retain(|e| e.at_ms >= since_ms && until_ms.is_none_or(|u| e.at_ms < u));
    evs.sort_by(|a, b| (a.at_ms, &a.key).cmp(&(b.at_ms, &b.key)));
    (evs, now)
}

/// `lattice admin accounting reconcile`: queues the window's events again (Waldur keeps the ones it
/// has by their keys); returns how many were queued and dropped.
pub async fn reconcile(s: &Shared, a: &Accountant, since_ms: u64, until_ms: u64) -> (u64, u64) {
    let (evs, _) = generate(s, since_ms, Some(until_ms)).await;
    let n = evs.len() as u64;
    let dropped = a.enqueue(evs);
    (n, dropped)
}

/// The pipeline's task: every push interval the leader queues what happened since its last scan (or
/// the quorum's mark), every member delivers what its buffer holds, and the leader moves the mark.
pub async fn run(s: Arc<Shared>, a: Arc<Accountant>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let period = std::time::Duration::from_secs(a.cfg.push_interval_seconds);
    while crate::context::sleep_unless_stopped(&mut stopped, period).await {
        let term = *s.leading.lock().await;
        let mark = s.member.read(|q| q.accounting_mark).await;
        a.state.lock().unwrap().mark_ms = mark;
        let mut scanned = None;
        if let Some(term) = term {
            let (evs, now) = generate(&s, mark, None).await;
            let fresh: Vec<AccountingEvent> = {
                let mut em = a.emitted.lock().unwrap();
                if em.0 != Some(term) {
                    // A new leadership: everything from the mark is generated again.
                    *em = (Some(term), BTreeMap::new());
                }
                em.1.retain(|_, at| *at >= mark);
                evs.into_iter()
                    .filter(|e| em.1.insert(e.key.clone(), e.at_ms).is_none())
                    .collect()
            };
            let dropped = a.enqueue(fresh);
            if dropped > 0 {
                tracing::error!("accounting: {dropped} event(s) dropped: memory and disk buffers are full");
            }
            scanned = Some(now);
        }
        let empty = a.push_round().await;
        if let (true, Some(now)) = (empty, scanned) {
            let to = now.saturating_sub(MARK_LAG_MS);
            if to > mark
                && s.member.is_leader()
                && let Err(e) = s
                    .member
                    .propose(lattice_adapters::QuorumCommand::AccountingMark { ms: to })
                    .await
            {
                tracing::debug!("accounting: mark not committed: {e}");
            }
        }
    }
}

/// `GET /api/v1/admin/accounting` (`lattice admin accounting status`): SystemAdmin, Operator, ReadOnly.
pub async fn status(s: &Shared, p: &Principal) -> Result<AccountingStatus, ApiError> {
    if !(p.can_operate() || p.has(crate::auth::Role::ReadOnly)) {
        return Err(crate::ops::forbidden("the accounting status"));
    }
    let Some(a) = &s.accounting else {
        return Ok(AccountingStatus {
            provider: "none".into(),
            ..Default::default()
        });
    };
    let mut st = a.status();
    st.mark_ms = s.member.read(|q| q.accounting_mark).await;
    Ok(st)
}

/// `POST /api/v1/admin/accounting/reconcile` (SystemAdmin, on the leader).
pub async fn reconcile_window(s: &Shared, p: &Principal, w: &ReconcileIn) -> Result<Reconciled, ApiError> {
    if !p.is_admin() {
        return Err(crate::ops::forbidden("accounting reconcile (SystemAdmin)"));
    }
    let Some(a) = &s.accounting else {
        return Err(ApiError::Conflict {
            message: "accounting is not enabled (accounting.enabled in the runtime's config)".into(),
        });
    };
    let (since_ms, until_ms) = (parse_when("since", &w.since)?, parse_when("until", &w.until)?);
    if until_ms <= since_ms {
        return Err(ApiError::BadRequest {
            field: "until".into(),
            message: "after since".into(),
        });
    }
    crate::ops::writable(s).await?;
    let (queued, dropped) = reconcile(s, a, since_ms, until_ms).await;
    tracing::info!(
        "accounting: reconcile {since_ms}..{until_ms} queued {queued} event(s) by {}",
        p.user
    );
    Ok(Reconciled {
        since_ms,
        until_ms,
        queued,
        dropped,
    })
}
