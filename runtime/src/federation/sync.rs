//! The federation's background loop in every member: each peer's catalog fetched when due, the
//! staleness gauges kept, a long election noted, and (on the leader) ended forwarded allocations
//! reported to the sites they came from.

use super::broker::Broker;
use super::now_ms;
use crate::context::{Shared, sleep_unless_stopped};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every member: fetch each peer's catalog when due (every `sync_interval`; every 30 s at most
/// while it fails), keep the staleness gauges and note a long election.
pub async fn run(s: Arc<Shared>, b: Arc<Broker>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let tick = Duration::from_millis(500);
    // Ends of allocations peers forwarded here, reported to them by this member (as the leader).
    let mut reported = std::collections::BTreeSet::new();
    let mut last_report = Instant::now();
    loop {
        if !sleep_unless_stopped(&mut stopped, tick).await {
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
