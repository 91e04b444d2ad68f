//! What every part of a running member shares ([`Shared`]): the control plane behind its lock, the
//! quorum member, the metrics, the configured services, and the few helpers every task needs (an
//! audit entry, a retried proposal, a sleep that ends when the runtime stops). It sits at the bottom
//! of the server's modules: the effects, the services, the operations and the transports all import
//! it, and it imports none of them (only the state types it holds).

use crate::metrics::Metrics;
use lattice_adapters::{Member, QuorumCommand};
use lattice_control::Control;
use std::sync::Arc;
use tokio::sync::{Mutex, Notify};

/// The member's clock ([`lattice_control::Clock`]): the wall clock at `wall_ms`, advanced by tokio's
/// monotonic clock (the simulation's, under DST).
pub fn member_clock(wall_ms: u64) -> lattice_control::Clock {
    lattice_control::Clock::starting_at(wall_ms, || tokio::time::Instant::now().into_std())
}

/// A backup staged by `POST /api/v1/admin/restore`, installed at the next start.
pub const RESTORE_PENDING: &str = "restore-pending.json";

/// The control plane's lock, counting how often it was taken. Every change to the control plane
/// happens under the lock, so while the count stands still nothing in it changed: the simulation's
/// checker re-reads every acknowledged allocation only when it moved.
pub struct ControlLock {
    inner: Mutex<Control>,
    taken: std::sync::atomic::AtomicU64,
}

impl ControlLock {
    pub fn new(c: Control) -> ControlLock {
        ControlLock {
            inner: Mutex::new(c),
            taken: Default::default(),
        }
    }

    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, Control> {
        let g = self.inner.lock().await;
        self.taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        g
    }

    pub fn try_lock(&self) -> Result<tokio::sync::MutexGuard<'_, Control>, tokio::sync::TryLockError> {
        let g = self.inner.try_lock()?;
        self.taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(g)
    }

    /// How often the lock was taken.
    pub fn taken(&self) -> u64 {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Everything the API handlers and the loop share.
pub struct Shared {
    pub control: ControlLock,
    pub member: Member,
    pub metrics: Metrics,
    /// Wakes the scheduling loop early (a submission, a completion).
    pub wake: Notify,
    pub simulate_agents: bool,
    /// Simulated agents: how long a secure wipe takes.
    pub wipe_time: std::time::Duration,
    /// The quorum's data folder (backups go to `backups/`, a staged restore to `restore-pending.json`).
    pub data_dir: std::path::PathBuf,
    /// Where clients reach this member's REST API (recorded at the quorum when it leads).
    pub rest_url: String,
    /// VAST, when configured (data locality at submission, prefetch while staging).
    pub vast: Option<lattice_adapters::vast::VastClient>,
    /// The TSDB's query API, when configured (per-allocation metrics, compare, diagnostics).
    pub tsdb: Option<lattice_adapters::tsdb::Tsdb>,
    /// The Slingshot fabric manager, when configured.
    pub fabric: Option<lattice_adapters::fabric::FabricClient>,
    /// The agents' log store, when configured (historical logs).
    pub log_store: Option<lattice_adapters::logstore::LogStore>,
    /// Becomes `true` when the runtime stops (tasks end; nothing keeps the store open).
    pub stopped: tokio::sync::watch::Receiver<bool>,
    pub auth: crate::auth::Authenticator,
    /// This member's copy of the leader's queue ([`crate::mirror`]).
    pub mirror: std::sync::Mutex<crate::mirror::Mirror>,
    pub peers: std::sync::Mutex<crate::mirror::Peers>,
    /// The mirror rounds waiting to go to the other members ([`crate::mirror::net::replicate`]).
    pub rounds: crate::mirror::Rounds,
    /// How peers are reached when the gRPC port runs TLS.
    pub peer_tls: Option<lattice_adapters::raft_net::PeerTls>,
    /// A fresh control plane (the engine as configured): a member that gains or loses leadership
    /// starts from one.
    pub fresh_control: Box<dyn Fn() -> anyhow::Result<Control> + Send + Sync>,
    /// Nodes that joined from SMD since this member started (a fresh control plane adds them:
    /// [`crate::openchami::join`]).
    pub joined: std::sync::Mutex<Vec<crate::openchami::NodeEntry>>,
    /// The term in which this member's control plane adopted the queue as the leader (`None`: it is
    /// not the leader's); changes under this lock only ([`sync_leadership`]).
    pub leading: Mutex<Option<u64>>,
    /// The member's clock (the control plane's; audit entries are stamped with it).
    pub clock: lattice_control::Clock,
    /// How peers are dialled (`Some` under a deterministic simulation).
    pub dial: Option<lattice_adapters::raft_net::Dialer>,
    /// Test-only injected bugs (the simulation shows it catches them); all off in production.
    pub bugs: crate::faults::Bugs,
    /// The accounting pipeline (`accounting.enabled`).
    pub accounting: Option<Arc<crate::accounting::Accountant>>,
    /// OpenCHAMI (`services.openchami`): SMD, BSS and PCS.
    pub openchami: Option<Arc<lattice_adapters::openchami::OpenChami>>,
    /// `services.openchami`, when configured.
    pub openchami_cfg: Option<crate::openchami::OpenChamiConfig>,
    /// `services.openchami.wipe`: OpenCHAMI wipes released sensitive nodes.
    pub openchami_wipe: Option<crate::openchami::BootImage>,
    /// `services.openchami.hardened`: claimed nodes boot the hardened image first.
    pub openchami_hardened: Option<crate::openchami::BootImage>,
    /// The federation broker (`federation.enabled`, built with the `federation` feature).
    #[cfg(feature = "federation")]
    pub federation: Option<Arc<crate::federation::state::Broker>>,
    /// Signs the audit entries this member proposes and its exports ([`crate::audit_key`]).
    pub audit_key: ed25519_dalek::SigningKey,
    /// The S3 archive (`services.archive`): old audit entries and backups.
    pub archive: Option<Arc<crate::archive::Archive>>,
    /// How far this member's audit queries have verified the held chain.
    pub audit_verified: crate::audit_verified::Verified,
}

/// Appends to the quorum's hash-chained audit log (book: sensitive workloads).
/// Retried until the quorum answers (an entry is never given up while the member runs: a
/// partition longer than a few seconds must not lose it).
pub async fn audit(shared: &Arc<Shared>, user: &str, alloc: &str, action: &str, detail: String) {
    let cmd = audit_command(shared, user, alloc, action, detail);
    let mut wait = std::time::Duration::from_millis(100);
    let mut stopped = shared.stopped.clone();
    loop {
        match shared.member.propose(cmd.clone()).await {
            Ok(_) => return,
            Err(e) => tracing::debug!("{action} of {alloc} not in the audit log yet: {e}"),
        }
        if !sleep_unless_stopped(&mut stopped, wait).await {
            tracing::error!("stopped before {action} of {alloc} reached the audit log");
            return;
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(1));
    }
}

/// An audit entry to propose, stamped with the member's clock and signed with its audit key.
pub fn audit_command(shared: &Shared, user: &str, alloc: &str, action: &str, detail: String) -> QuorumCommand {
    let at_ms = shared.clock.now_ms();
    let signed = lattice_engine::audit::sign(&shared.audit_key, at_ms, user, alloc, action, &detail);
    QuorumCommand::Audit {
        at_ms,
        user: user.to_string(),
        alloc: alloc.to_string(),
        action: action.to_string(),
        detail,
        signed: Some(signed),
    }
}

/// Waits `d`, or until the runtime stops: whether it still runs.
pub async fn sleep_unless_stopped(stopped: &mut tokio::sync::watch::Receiver<bool>, d: std::time::Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stopped.changed() => {}
    }
    !*stopped.borrow()
}

pub async fn propose_retried(shared: &Shared, cmd: QuorumCommand) -> bool {
    for _ in 0..50 {
        if shared.member.propose(cmd.clone()).await.is_ok() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}
