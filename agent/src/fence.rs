//! Fencing: an agent cut off from the control plane stops its work before the control plane may
//! requeue it elsewhere — never two runs of one allocation at once.
//!
//! Every heartbeat the leader accepts answers a lease (`lease_ms`: the heartbeat timeout plus the
//! node's grace). Counted from when that heartbeat was *sent* — no later than the control plane
//! received it, so the agent's count never ends after the control plane's — the agent stops every
//! process once a heartbeat is overdue and what is left of the lease is no more than the processes'
//! stop grace and two heartbeats. The check runs on its own thread: the agent's loop may be blocked
//! in calls to an unreachable control plane for longer than that.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the loop and the fence thread share.
#[derive(Default)]
pub struct Fence {
    /// The last accepted heartbeat: when it was sent, and its lease.
    lease: Mutex<Option<(Instant, Duration)>>,
    /// Each running process's stop handle, by allocation.
    stops: Mutex<BTreeMap<String, Arc<AtomicBool>>>,
    /// Processes the fence stopped (reported as fenced once they ended).
    fenced: Mutex<BTreeSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fence {
    /// A heartbeat sent at `sent` was accepted with `lease`.
    pub fn renewed(&self, sent: Instant, lease: Duration) {
        *lock(&self.lease) = Some((sent, lease));
    }

    pub fn watch(&self, id: &str, stop: Arc<AtomicBool>) {
        lock(&self.stops).insert(id.to_string(), stop);
    }

    pub fn forget(&self, id: &str) {
        lock(&self.stops).remove(id);
    }

    /// Whether the fence stopped `id` (asked once, when it has ended).
    pub fn take_fenced(&self, id: &str) -> bool {
        lock(&self.fenced).remove(id)
    }

    /// Stops what runs once the lease is as good as over (see the module doc); the ids it stopped
    /// now, with how long ago the last accepted heartbeat was sent and the lease.
    pub fn check(
        &self,
        now: Instant,
        heartbeat: Duration,
        grace: Duration,
    ) -> Option<(Vec<String>, Duration, Duration)> {
        let (sent, lease) = (*lock(&self.lease))?;
        let quiet = now.saturating_duration_since(sent);
        if !crate::protocol::lease_over(quiet, lease, heartbeat, grace) {
            return None;
        }
        let mut fenced = lock(&self.fenced);
        let mut stopped = Vec::new();
        for (id, stop) in lock(&self.stops).iter() {
            if fenced.insert(id.clone()) {
                stop.store(true, Ordering::SeqCst);
                stopped.push(id.clone());
            }
        }
        Some((stopped, quiet, lease))
    }

    /// The fence thread: checks every tenth of a heartbeat (at most every second) until `stop`.
    pub fn spawn(self: &Arc<Self>, node: String, heartbeat: Duration, grace: Duration, stop: Arc<AtomicBool>) {
        let fence = self.clone();
        let every = (heartbeat / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Some((stopped, quiet, lease)) = fence.check(Instant::now(), heartbeat, grace) {
                    for id in stopped {
                        eprintln!(
                            "lattice-agent {node}: {id} stopped: no accepted heartbeat for {:.1} s, past the {:.1} s lease",
                            quiet.as_secs_f64(),
                            lease.as_secs_f64()
                        );
                    }
                }
                std::thread::sleep(every);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_stopped_only_once_the_lease_less_the_stop_grace_and_two_beats_has_run_out() {
        let f = Fence::default();
        let t0 = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        f.watch("a-1", stop.clone());
        let (beat, grace) = (Duration::from_secs(10), Duration::from_secs(30));
        // No lease yet (never heard back): nothing to count from.
        assert!(f.check(t0 + Duration::from_secs(500), beat, grace).is_none());
        f.renewed(t0, Duration::from_secs(90));
        // 39 s after the accepted heartbeat was sent: 39 + 30 + 20 < 90.
        assert!(f.check(t0 + Duration::from_secs(39), beat, grace).is_none());
        assert!(!stop.load(Ordering::SeqCst));
        let (stopped, quiet, _) = f.check(t0 + Duration::from_secs(41), beat, grace).unwrap();
        assert_eq!((stopped, quiet), (vec!["a-1".to_string()], Duration::from_secs(41)));
        assert!(stop.load(Ordering::SeqCst));
        // Stopped once, reported as fenced once.
        assert!(f.check(t0 + Duration::from_secs(42), beat, grace).unwrap().0.is_empty());
        assert!(f.take_fenced("a-1") && !f.take_fenced("a-1"));
        // A lease shorter than the margin: stopped as soon as a heartbeat is overdue, not before.
        let g = Fence::default();
        g.watch("a-2", Arc::new(AtomicBool::new(false)));
        g.renewed(t0, Duration::from_secs(3));
        assert!(g.check(t0 + Duration::from_secs(19), beat, grace).is_none());
        assert_eq!(g.check(t0 + Duration::from_secs(21), beat, grace).unwrap().0, ["a-2"]);
    }
}
