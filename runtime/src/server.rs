//! Starting a runtime: the quorum member, the scheduling loop (the same engine as `sim`, on the wall
//! clock, proposing ownership through the quorum), simulated agents, and the REST API.

use crate::api;
use crate::config::RuntimeConfig;
use crate::control::{Control, PendingProposal};
use crate::metrics::Metrics;
use crate::world::Action;
use anyhow::{Context, Result};
use lattice_adapters::{Member, QuorumCommand, QuorumResponse};
use lattice_engine::{AllocId, AllocState, EndReason, NodeSpec, PreemptHow, Time, VClusterConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{Mutex, Notify};

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
    /// How peers are reached when the gRPC port runs TLS.
    pub peer_tls: Option<lattice_adapters::raft_net::PeerTls>,
    /// A fresh control plane (the engine as configured): a member that gains or loses leadership
    /// starts from one.
    pub fresh_control: Box<dyn Fn() -> Result<Control> + Send + Sync>,
    /// Nodes that joined from SMD since this member started (a fresh control plane adds them:
    /// [`crate::openchami::join`]).
    pub joined: std::sync::Mutex<Vec<crate::openchami::NodeEntry>>,
    /// The term in which this member's control plane adopted the queue as the leader (`None`: it is
    /// not the leader's); changes under this lock only ([`sync_leadership`]).
    pub leading: Mutex<Option<u64>>,
    /// The member's clock (the control plane's; audit entries are stamped with it).
    pub clock: crate::control::Clock,
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
    pub federation: Option<Arc<crate::federation::broker::Broker>>,
}

pub use crate::listen::Listen;

/// How a runtime meets the world: its ports, its disk, how it dials peers, its clock and Raft
/// timings. [`start`] wires it to TCP, the data directory and the system clock; the deterministic
/// simulation (`lattice-dst`) to its own network, disk and clock — the rest is the same code.
pub struct Wiring {
    pub grpc: Listen,
    pub rest: Listen,
    pub disk: lattice_adapters::disk::Disk,
    pub dial: Option<lattice_adapters::raft_net::Dialer>,
    pub clock: crate::control::Clock,
    pub raft: Option<lattice_adapters::openraft::Config>,
    pub bugs: crate::faults::Bugs,
}

/// A started runtime: its bound addresses and a way to stop it.
pub struct Running {
    pub rest_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub shared: Arc<Shared>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops the loop, the API and every simulated agent, then the quorum member; when it returns the
    /// member's store is closed (a restart in the same process can open it).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        self.shared.member.shutdown().await;
        // Wait for the last holders of the shared state (agents winding down) and of the store
        // (Raft's workers, the gRPC services) to let go, so the store closes when this returns.
        let t0 = std::time::Instant::now();
        while (Arc::strong_count(&self.shared) > 1 || self.shared.member.store_handles() > 1)
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

/// The site: the inventory, or `simulated_nodes` plain nodes.
fn inventory_of(cfg: &RuntimeConfig) -> Result<lattice_traces::Inventory> {
    match &cfg.inventory {
        Some(path) => Ok(lattice_traces::read_inventory(path)?),
        None => Ok(lattice_traces::Inventory {
            nodes: (0..cfg.simulated_nodes)
                .map(|i| NodeSpec::plain(format!("sim-{i:03}")))
                .collect(),
            ..Default::default()
        }),
    }
}

fn vcluster_configs(cfg: &RuntimeConfig) -> Result<BTreeMap<String, VClusterConfig>> {
    let Some(path) = &cfg.profile else {
        return Ok(BTreeMap::new());
    };
    let prof = lattice_traces::read_profile(path)?;
    // The same mapping rm-replay uses: a profile schedules here as it did in simulation.
    Ok(prof
        .vclusters
        .iter()
        .map(|(name, p)| (name.clone(), p.config(None)))
        .collect())
}

/// Starts a runtime from `cfg`; `bootstrap` forms the quorum on first start. Binding port 0 picks a
/// free port (tests); the bound addresses are in the result.
pub async fn start(cfg: RuntimeConfig, bootstrap: bool) -> Result<Running> {
    let grpc = tokio::net::TcpListener::bind(&cfg.grpc_listen)
        .await
        .with_context(|| format!("binding gRPC on {}", cfg.grpc_listen))?;
    let rest = tokio::net::TcpListener::bind(&cfg.rest_listen)
        .await
        .with_context(|| format!("binding REST on {}", cfg.rest_listen))?;
    let wiring = Wiring {
        grpc: Listen::Tcp(grpc),
        rest: Listen::Tcp(rest),
        disk: lattice_adapters::disk::Disk::Dir(cfg.data_dir.clone()),
        dial: None,
        clock: crate::control::Clock::system(),
        raft: None,
        bugs: crate::faults::Bugs::default(),
    };
    start_wired(cfg, bootstrap, wiring).await
}

/// [`start`] on the given [`Wiring`].
pub async fn start_wired(cfg: RuntimeConfig, bootstrap: bool, wiring: Wiring) -> Result<Running> {
    let Wiring {
        grpc,
        rest,
        disk,
        dial,
        clock,
        raft,
        bugs,
    } = wiring;
    // Nodes from OpenCHAMI's SMD when it is configured and no inventory file is given.
    let mut smd_down = std::collections::BTreeSet::new();
    let (inventory, baselines) = match (&cfg.services.openchami, &cfg.inventory) {
        (Some(oc), None) => {
            let smd = crate::openchami::read_smd(oc, &cfg.data_dir).await?;
            smd_down = smd
                .components
                .iter()
                .filter(|c| !c.usable())
                .map(|c| c.id.clone())
                .collect();
            crate::openchami::inventory(oc, &smd).map_err(|m| anyhow::anyhow!("services.openchami: {m}"))?
        }
        _ => (inventory_of(&cfg)?, BTreeMap::new()),
    };
    let sensitive_pool = inventory.sensitive_pool_size;
    let tenants = match &cfg.tenants {
        Some(p) => lattice_traces::read_tenants(p)?,
        None => lattice_traces::Contracts::default(),
    };
    let vcs = vcluster_configs(&cfg)?;
    let capture = cfg.scheduler.trace_capture.clone();
    let network = cfg.network.clone();
    let grace_ms = lattice_traces::parse_duration(&network.grace).map_or(300_000, |d| d.0);
    let fabric_on = cfg.services.fabric.is_some();
    let vast_gbps = cfg.services.vast.as_ref().and_then(|v| v.write_gbps);
    // Simulated agents by default only for simulated nodes (not for an inventory file or SMD's).
    let simulate_agents = cfg
        .simulate_agents
        .unwrap_or(cfg.inventory.is_none() && cfg.services.openchami.is_none());
    let wipe_timeout_ms = cfg.sensitive.wipe_timeout_ms();
    let wipe_by_openchami = cfg.services.openchami.as_ref().is_some_and(|o| o.wipe.is_some()) && !simulate_agents;
    let heartbeat_grace = cfg.agents.grace();
    let drift_timeout = cfg.agents.drift_timeout();
    // Claims boot the hardened image first only where OpenCHAMI has one to boot.
    let hardened_boot = cfg
        .services
        .openchami
        .as_ref()
        .and_then(|o| o.hardened.as_ref())
        .map(|_| cfg.sensitive.boot_timeout());
    let heartbeat_timeout_ms = cfg.agents.durations().0;
    // Allocations' launch tokens derive from a secret of this process (a simulation's is fixed).
    let launch_secret = match &disk {
        lattice_adapters::disk::Disk::Dir(_) => crate::ops::random_secret(),
        _ => [0; 32],
    };
    let make = move |inv: &lattice_traces::Inventory,
                     vcs,
                     quotas: &lattice_traces::Contracts,
                     capture: Option<&std::path::Path>| {
        let mut c = Control::new(inv, vcs, quotas, capture)?;
        c.wall = clock;
        c.ctl.grace = heartbeat_grace;
        c.ctl.drift_timeout = drift_timeout;
        c.ctl.hardened_boot = hardened_boot;
        c.heartbeat_timeout_ms = heartbeat_timeout_ms;
        c.launch_secret = launch_secret;
        c.network = crate::network::NetworkDomains::new(&network, grace_ms)?;
        c.fabric = fabric_on;
        c.real_agents = !simulate_agents;
        c.set_baselines(&baselines);
        c.wipe_by_openchami = wipe_by_openchami;
        c.wipe_timeout_ms = wipe_timeout_ms;
        if let Some(g) = vast_gbps {
            c.ctl.engine.set_vast_bandwidth(g);
        }
        Ok::<_, anyhow::Error>(c)
    };
    let control = make(&inventory, vcs.clone(), &tenants, capture.as_deref())?;
    let quotas = tenants.clone();
    let fresh_control: Box<dyn Fn() -> Result<Control> + Send + Sync> =
        Box::new(move || make(&inventory, vcs.clone(), &quotas, capture.as_deref()));
    let fabric = match &cfg.services.fabric {
        Some(f) => Some(
            lattice_adapters::fabric::FabricClient::new(f.http().map_err(anyhow::Error::msg)?)
                .context("services.fabric")?,
        ),
        None => None,
    };
    let vast = match &cfg.services.vast {
        Some(v) => Some(
            lattice_adapters::vast::VastClient::new(v.http().map_err(anyhow::Error::msg)?).context("services.vast")?,
        ),
        None => None,
    };
    let tsdb = match &cfg.services.tsdb {
        Some(t) => {
            Some(lattice_adapters::tsdb::Tsdb::new(t.http().map_err(anyhow::Error::msg)?).context("services.tsdb")?)
        }
        None => None,
    };
    // The quorum member and its gRPC service.
    let grpc_addr = grpc.local_addr()?;
    // A restore staged through the API is installed before the member starts.
    let staged = cfg.data_dir.join(RESTORE_PENDING);
    if matches!(disk, lattice_adapters::disk::Disk::Dir(_)) && staged.exists() {
        let b = lattice_adapters::raft_store::Backup::read_verified(&staged).map_err(anyhow::Error::msg)?;
        lattice_adapters::raft_store::restore(&cfg.data_dir, &b).map_err(anyhow::Error::msg)?;
        std::fs::remove_file(&staged)?;
        tracing::info!("restored the quorum state from the staged backup ({})", b.sha256);
    }
    let tls = cfg.tls.as_ref().map(crate::tls::Tls::load).transpose()?;
    if tls.is_some() && matches!(grpc, Listen::Other(_)) {
        anyhow::bail!("tls: only on TCP listeners");
    }
    let options = lattice_adapters::MemberOptions {
        tls: tls.as_ref().map(|t| t.peer()),
        dial: dial.clone(),
        config: raft,
    };
    let member = Member::start_with(cfg.node_id, &disk, options).await?;
    if bootstrap {
        let mut members = cfg.quorum_members();
        // A single member announces the address it actually bound.
        if members.len() == 1 {
            members.insert(cfg.node_id, grpc_addr.to_string());
        }
        if member.bootstrap(&members).await? {
            tracing::info!("quorum bootstrapped with {} member(s)", members.len());
        } else {
            tracing::info!("quorum already initialised; --bootstrap ignored");
        }
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let openchami = match &cfg.services.openchami {
        Some(oc) => Some(Arc::new(
            oc.client().map_err(|m| anyhow::anyhow!("services.openchami: {m}"))?,
        )),
        None => None,
    };
    let accounting = match (cfg.accounting.enabled, &disk) {
        (true, lattice_adapters::disk::Disk::Dir(_)) => Some(Arc::new(crate::accounting::Accountant::new(
            &cfg.accounting,
            &cfg.data_dir,
        )?)),
        (true, _) => anyhow::bail!("accounting: not available on a simulated disk"),
        (false, _) => None,
    };
    let metrics = Metrics::default();
    #[cfg(feature = "federation")]
    let federation = match &cfg.federation {
        Some(f) if f.enabled => Some(Arc::new(crate::federation::broker::Broker::new(f.clone(), &metrics)?)),
        _ => None,
    };
    let shared = Arc::new(Shared {
        control: ControlLock::new(control),
        member,
        metrics,
        wake: Notify::new(),
        simulate_agents,
        wipe_time: cfg.agents.wipe_time(),
        data_dir: cfg.data_dir.clone(),
        log_store: cfg.log_store.clone().map(lattice_adapters::logstore::LogStore::new),
        fabric,
        vast,
        tsdb,
        stopped: stopped.clone(),
        auth: crate::auth::Authenticator::new(cfg.auth.clone())?,
        mirror: std::sync::Mutex::new(
            crate::mirror::Mirror::open_on(&disk).context("opening the durable allocation records")?,
        ),
        peers: Default::default(),
        peer_tls: tls.as_ref().map(|t| t.peer()),
        fresh_control,
        joined: Default::default(),
        leading: Mutex::new(None),
        clock,
        dial,
        bugs,
        accounting: accounting.clone(),
        openchami: openchami.clone(),
        openchami_cfg: cfg.services.openchami.clone(),
        openchami_wipe: cfg.services.openchami.as_ref().and_then(|o| o.wipe.clone()),
        openchami_hardened: cfg.services.openchami.as_ref().and_then(|o| o.hardened.clone()),
        #[cfg(feature = "federation")]
        federation,
    });
    // Quotas and the sensitive pool go to the quorum once a leader exists.
    let mut tasks = vec![
        tokio::spawn(push_quotas(shared.clone(), tenants, sensitive_pool, stopped.clone())),
        tokio::spawn(scheduling_loop(
            shared.clone(),
            cfg.cycle(),
            cfg.agents.durations().0,
            cfg.agents.preemption_slack_ms(),
            stopped.clone(),
        )),
    ];
    if let Some(a) = accounting {
        tasks.push(tokio::spawn(crate::accounting::run(shared.clone(), a, stopped.clone())));
    }
    #[cfg(feature = "federation")]
    if let Some(b) = shared.federation.clone() {
        tracing::info!(
            "federation: site {} (catalog every {})",
            b.cfg.site,
            b.cfg.sync_interval
        );
        tasks.push(tokio::spawn(crate::federation::broker::run(
            shared.clone(),
            b,
            stopped.clone(),
        )));
    }
    if let (Some(oc), Some(c)) = (openchami, &cfg.services.openchami) {
        let refresh = crate::openchami::refresh(shared.clone(), oc, c.clone(), smd_down, stopped.clone());
        tasks.push(tokio::spawn(refresh));
    }
    // One gRPC port: the quorum's Raft service and the public API.
    let api = crate::grpc::Api { shared: shared.clone() };
    let mut grpc_stop = stopped.clone();
    let mut builder = tonic::transport::Server::builder();
    if let Some(t) = &tls {
        builder = builder.tls_config(t.grpc()).context("gRPC TLS")?;
    }
    let grpc_server = builder
        .add_service(lattice_adapters::raft_net::server(shared.member.raft.clone()))
        .add_service(crate::grpc::pb::allocation_service_server::AllocationServiceServer::new(api.clone()))
        .add_service(crate::grpc::pb::node_service_server::NodeServiceServer::new(
            api.clone(),
        ))
        .add_service(crate::grpc::pb::admin_service_server::AdminServiceServer::new(api))
        .add_service(crate::grpc::pb::queue_mirror_server::QueueMirrorServer::new(
            crate::mirror::MirrorService { shared: shared.clone() },
        ));
    let grpc_stopped = async move {
        let _ = grpc_stop.changed().await;
    };
    tasks.push(match grpc {
        Listen::Tcp(l) => tokio::spawn(async move {
            let served = grpc_server.serve_with_incoming_shutdown(lattice_adapters::raft_net::nodelay(l), grpc_stopped);
            if let Err(e) = served.await {
                tracing::error!("gRPC server: {e}");
            }
        }),
        Listen::Other(l) => tokio::spawn(async move {
            let served = grpc_server.serve_with_incoming_shutdown(crate::listen::incoming(l), grpc_stopped);
            if let Err(e) = served.await {
                tracing::error!("gRPC server: {e}");
            }
        }),
    });
    let rest_addr = rest.local_addr()?;
    let app = api::router(shared.clone());
    let mut rest_stop = stopped.clone();
    let rest_stopped = async move {
        let _ = rest_stop.changed().await;
    };
    match (rest, &tls) {
        (Listen::Tcp(rest), Some(t)) => tasks.push(tokio::spawn(crate::tls::serve_rest(
            rest,
            app,
            t.rest()?,
            stopped.clone(),
        ))),
        (Listen::Tcp(rest), None) => tasks.push(tokio::spawn(async move {
            let _ = axum::serve(rest, app).with_graceful_shutdown(rest_stopped).await;
        })),
        (Listen::Other(rest), _) => tasks.push(tokio::spawn(async move {
            let _ = axum::serve(crate::listen::Rest(rest), app)
                .with_graceful_shutdown(rest_stopped)
                .await;
        })),
    }
    let scheme = match &tls {
        Some(t) if t.mtls => "mTLS",
        Some(_) => "TLS",
        None => "plaintext",
    };
    tracing::info!("REST on {rest_addr}, gRPC (API and quorum) on {grpc_addr} ({scheme})");
    Ok(Running {
        rest_addr,
        grpc_addr,
        shared,
        stop,
        tasks,
    })
}

/// Nanoseconds on this process's monotonic clock (the engine's cost-function stopwatch).
fn mono_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

async fn push_quotas(
    shared: Arc<Shared>,
    contracts: lattice_traces::Contracts,
    sensitive_pool: Option<u32>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    // The tenants file seeds the quorum: a tenant (or project) it does not know yet is created with
    // the file's contract; one it knows keeps what the API set.
    let at_ms = lattice_util::clock::epoch_ms();
    let write = lattice_adapters::TenantWrite::Seed;
    let by = "tenants file".to_string();
    let mut cmds: Vec<QuorumCommand> = contracts
        .tenants
        .iter()
        .map(|(t, q)| QuorumCommand::PutTenant {
            name: t.clone(),
            quota: *q,
            write,
            at_ms,
            by: by.clone(),
        })
        .collect();
    cmds.extend(contracts.project_list().map(|(t, p, q)| QuorumCommand::PutProject {
        tenant: t.to_string(),
        name: p.to_string(),
        quota: *q,
        write,
        at_ms,
        by: by.clone(),
    }));
    if sensitive_pool.is_some() {
        cmds.push(QuorumCommand::SetSensitivePool { size: sensitive_pool });
    }
    while !cmds.is_empty() && !*stopped.borrow() {
        if shared.member.is_leader() {
            let cmd = cmds[0].clone();
            if shared.member.propose(cmd).await.is_ok() {
                cmds.remove(0);
                continue;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            _ = stopped.changed() => {}
        }
    }
}

/// The control plane's actor: woken when the engine asked (its next wake-up: a cycle tick, an
/// energy window, a staging end), by an input (a submission, a completion), or at the latest every
/// `cycle` to watch the agents. On the leader it runs the pass and carries out what it decided.
async fn scheduling_loop(
    shared: Arc<Shared>,
    cycle: std::time::Duration,
    agent_timeout: u64,
    preemption_slack: u64,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let sleep = {
            let c = shared.control.lock().await;
            let now = c.now();
            c.next_wakeup().map_or(cycle, |t| {
                std::time::Duration::from_millis(t.0.saturating_sub(now.0)).min(cycle)
            })
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = shared.wake.notified() => {}
            _ = stopped.changed() => {}
        }
        if *stopped.borrow() {
            return;
        }
        if !sync_leadership(&shared).await {
            continue;
        }
        prune_mirror(&shared).await;
        remirror_unacked(&shared).await;
        settle_ends(&shared).await;
        release_ended_holdings(&shared).await;
        if shared.simulate_agents {
            // Re-attached runs: their simulated agents carry on.
            for (alloc, run) in shared.control.lock().await.take_resumed() {
                tokio::spawn(simulated_run(shared.clone(), alloc, run));
            }
        }
        let actions = {
            let mut c = shared.control.lock().await;
            c.check_agents(agent_timeout);
            c.expire_wipes();
            c.expire_preemptions(preemption_slack);
            c.take_actions()
        };
        execute(shared.clone(), actions).await;
        for (tenant, domain, vni) in shared.control.lock().await.expire_network() {
            tracing::info!("network domain {tenant}/{domain} released (VNI {vni})");
        }
        let actions = {
            let mut c = shared.control.lock().await;
            // The engine times its cost function with this member's monotonic clock.
            c.ctl.engine.set_stopwatch(Some(mono_ns));
            let (stats, took) = c.schedule();
            for (vcs, secs) in c.ctl.engine.take_cost_timings() {
                for vc in vcs {
                    let name = c.ctl.engine.vcluster(vc).map(|v| v.name).unwrap_or_default();
                    shared
                        .metrics
                        .cost_function
                        .with_label_values(&[name.as_str()])
                        .observe(secs);
                }
            }
            tracing::trace!("m{}: pass at {:?}: {stats:?}", shared.member.id, c.now());
            shared.metrics.cycle(took);
            let scaled = c.ctl.engine.scale_stats();
            shared
                .metrics
                .autoscaling_query_failures
                .inc_by(u64::from(scaled.metric_unavailable));
            shared.metrics.backfilled.inc_by(u64::from(stats.backfilled));
            shared
                .metrics
                .scheduling_preemptions
                .inc_by(u64::from(stats.preemptions));
            c.take_actions()
        };
        if shared.vast.is_some() {
            for (name, sources) in shared.control.lock().await.to_prefetch() {
                tokio::spawn(prefetch(shared.clone(), name, sources));
            }
        }
        execute(shared.clone(), actions).await;
    }
}

/// Carries out the controller's decisions in order (one exhaustive `match`): quorum proposals
/// (whose answers go back to the controller, and what those cause is carried out next), releases,
/// scale changes, audit entries, launches, preemptions, checkpoint hints and wipes.
pub fn execute(
    shared: Arc<Shared>,
    actions: Vec<Action>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let mut queue: std::collections::VecDeque<Action> = actions.into();
        while let Some(a) = queue.pop_front() {
            match a {
                Action::Propose(p) => queue.extend(propose_start(&shared, p).await),
                Action::Release { name, .. } => {
                    release(&shared, name).await;
                    shared.wake.notify_one();
                }
                Action::Scale { name, node, added, .. } => {
                    let cmd = QuorumCommand::Scale {
                        alloc: name.clone(),
                        node: node.clone(),
                        added,
                    };
                    match shared.member.propose(cmd).await {
                        Ok(QuorumResponse::Applied) => {}
                        Ok(QuorumResponse::Rejected { message, .. }) => {
                            tracing::warn!("{name}: scaling by {node} rejected: {message}")
                        }
                        Err(e) => tracing::warn!("{name}: scaling by {node}: {e}"),
                    }
                }
                Action::Audit {
                    user,
                    name,
                    event,
                    nodes,
                    note,
                    ..
                } => {
                    let mut detail = nodes.join(",");
                    if !note.is_empty() {
                        detail = format!("{detail}; {note}");
                    }
                    audit(&shared, &user, &name, event.as_str(), detail).await
                }
                Action::Launch {
                    alloc,
                    name,
                    nodes,
                    vni,
                    resume_from,
                    staging_remaining_s: _,
                } => {
                    if let (Some(vni), Some(_)) = (vni, &shared.fabric) {
                        tokio::spawn(setup_fabric(shared.clone(), name.clone(), vni, nodes));
                    }
                    if shared.simulate_agents {
                        let run = shared.control.lock().await.simulated_run(alloc, resume_from);
                        tokio::spawn(simulated_run(shared.clone(), alloc, run));
                    }
                    // Real agents get the launch (with its resume point) at their next poll.
                }
                // Real agents see at their next poll that the run is no longer theirs; a simulated
                // run sees it is over.
                Action::Stop { name, why, .. } => tracing::debug!("{name}: its agents stop it ({why:?})"),
                // The deadline is kept by the control plane (`check_agents` applies it).
                Action::Watch { .. } => {}
                Action::Drift {
                    name,
                    drifted,
                    sensitive,
                    message,
                    claim,
                    ..
                } => {
                    if drifted {
                        tracing::warn!("{name}: conformance drift ({message}): drained, remediation asked");
                    } else {
                        tracing::info!("{name}: conforms to its baseline again");
                    }
                    if sensitive {
                        let action = if drifted { "drift" } else { "conformant" };
                        let detail = format!("{name} {message}");
                        audit(&shared, "lattice", claim.as_deref().unwrap_or(""), action, detail).await;
                    }
                    if let Some(oc) = &shared.openchami {
                        let flag = crate::openchami::flag_drift(shared.clone(), oc.clone(), name, drifted, message);
                        tokio::spawn(flag);
                    }
                }
                Action::Preempt { name, order } => {
                    let (alloc, how, at) = (order.alloc, order.how, order.at);
                    if shared.simulate_agents {
                        tokio::spawn(simulated_preempt(shared.clone(), alloc, how, at));
                    } else {
                        // Real agents get it at their next poll (from `at`): they checkpoint by the
                        // allocation's mechanism and stop it, or stop it, and report how it stopped.
                        tracing::debug!("{name}: its agents preempt it ({how:?})");
                    }
                }
                Action::Checkpoint { alloc, name } => {
                    if shared.simulate_agents {
                        // A simulated application writes its checkpoint at once.
                        let mut c = shared.control.lock().await;
                        c.checkpointed(alloc, true);
                        queue.extend(c.take_actions());
                    } else {
                        tracing::debug!("{name}: checkpoint hint for its agents (they report its outcome)");
                    }
                }
                Action::Wipe { alloc, name, nodes } => {
                    if let (Some(oc), Some(w), false) =
                        (&shared.openchami, &shared.openchami_wipe, shared.simulate_agents)
                    {
                        for node in nodes {
                            let wipe =
                                crate::openchami::wipe(shared.clone(), oc.clone(), w.clone(), name.clone(), node);
                            tokio::spawn(wipe);
                        }
                    } else if shared.simulate_agents {
                        tokio::spawn(simulated_wipe(shared.clone(), alloc, nodes, shared.wipe_time));
                    } else {
                        // Each node's agent runs the site's wipe command at its next poll and reports.
                        tracing::info!("{name}: its agents wipe {}", nodes.join(","));
                    }
                }
                Action::Boot { name, nodes, .. } => match (&shared.openchami, &shared.openchami_hardened) {
                    (Some(oc), Some(image)) => {
                        for node in nodes {
                            let boot =
                                crate::openchami::harden(shared.clone(), oc.clone(), image.clone(), name.clone(), node);
                            tokio::spawn(boot);
                        }
                    }
                    // The controller only boots with a hardened image configured.
                    _ => tracing::warn!("{name}: a hardened boot without OpenCHAMI's hardened image"),
                },
            }
        }
    })
}

/// A simulated agent stops a preempted allocation when its sequence starts: a simulated application
/// writes its checkpoint at once and stops; one without checkpoints honours the SIGTERM at once; one
/// that cannot write its checkpoint (storage down) is killed.
async fn simulated_preempt(shared: Arc<Shared>, alloc: AllocId, how: PreemptHow, at: Time) {
    let wait = {
        let c = shared.control.lock().await;
        at.0.saturating_sub(c.now().0)
    };
    let mut stopped = shared.stopped.clone();
    tokio::select! {
        _ = tokio::time::sleep(std::time::Duration::from_millis(wait)) => {}
        _ = stopped.changed() => return,
    }
    let actions = {
        let mut c = shared.control.lock().await;
        match how {
            PreemptHow::CheckpointThenStop { .. } => {
                c.suspended(alloc, true);
            }
            PreemptHow::Stop { .. } => {
                c.suspended(alloc, false);
            }
            PreemptHow::Kill { .. } => {
                c.completed(alloc, EndReason::PreemptionKilled);
            }
        }
        c.take_actions()
    };
    execute(shared.clone(), actions).await;
    shared.wake.notify_one();
}

/// A simulated secure wipe: the nodes come back after `took`.
async fn simulated_wipe(shared: Arc<Shared>, alloc: AllocId, nodes: Vec<String>, took: std::time::Duration) {
    let mut stopped = shared.stopped.clone();
    tokio::select! {
        _ = tokio::time::sleep(took) => {}
        _ = stopped.changed() => return,
    }
    let actions = {
        let mut c = shared.control.lock().await;
        c.simulated_wiped(alloc, &nodes);
        c.take_actions()
    };
    execute(shared.clone(), actions).await;
    shared.wake.notify_one();
}

/// Brings this member's control plane in line with its Raft role (adopting the mirror when it has just
/// become the leader); whether it leads.
pub async fn sync_leadership(shared: &Shared) -> bool {
    let mut leading = shared.leading.lock().await;
    let term = shared.member.leader_term();
    // A new term is a new leadership, also when this member leads again: another leader may have
    // acknowledged work in between, and what this one could not record must be taken over again.
    if term != *leading {
        if let Err(e) = leadership_changed(shared, term.is_some()).await {
            // Not serving until the queue is adopted (tried again at the next pass or request).
            tracing::warn!("taking over the queue: {e:#}");
            return false;
        }
        *leading = shared.control.lock().await.adopted_term;
        return leading.is_some() && *leading == shared.member.leader_term();
    }
    term.is_some()
}

/// A member that gains leadership merges the other members' copies of the queue into its own, then
/// starts from a fresh engine and adopts the result ([`crate::mirror`]): ended allocations as their
/// final records, the others queued again under their ids — re-attached to the nodes the quorum still
/// gives them (their agents kept running them), or run again when that fails. Nodes the quorum gives
/// to allocations nobody runs any more are freed. One that loses leadership drops its engine state
/// (the new leader owns the queue now).
async fn leadership_changed(shared: &Shared, leader: bool) -> Result<()> {
    let mut control = (shared.fresh_control)()?;
    crate::openchami::join(shared, &mut control, false);
    if !leader {
        *shared.control.lock().await = control;
        tracing::info!("no longer the leader: the queue is the new leader's");
        return Ok(());
    }
    // What the others hold that this member missed (e.g. while it was down): a majority's copies,
    // each fenced against the leaders before this term first.
    let term = shared
        .member
        .leader_term()
        .ok_or_else(|| anyhow::anyhow!("lost leadership while taking over"))?;
    let promised = shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).promise(term);
    promised.wait().await.map_err(anyhow::Error::msg)?;
    // Everything earlier leaders committed is applied here first (a start they proposed may
    // commit only now, with this term's first entry): the node ownership read below is then whole.
    shared
        .member
        .confirm_leader()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // A member that leads again after a restart, in the term it led before, may not have applied
    // what it committed then (its committed index is a hint it can lose): a write now commits and
    // applies everything before it (found by DST: a drain was read as absent after a cluster crash).
    shared
        .member
        .propose(QuorumCommand::Barrier)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let copies = crate::mirror::fetch_all(shared, term, std::time::Duration::from_secs(1))
        .await
        .map_err(anyhow::Error::msg)?;
    tracing::debug!(
        "member {} takes over in term {term}: its copy's max id {}; the others' {:?}",
        shared.member.id,
        shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).max_id,
        copies.iter().map(|c| c.max_id).collect::<Vec<_>>()
    );
    for snap in copies {
        tracing::trace!(
            "m{} term {term}: a copy's records: {:?}",
            shared.member.id,
            snap.entries
                .values()
                .map(|e| (
                    e.id.clone(),
                    e.term,
                    e.origin,
                    e.submitted_ms,
                    e.ended.as_ref().map(|v| v.state.clone())
                ))
                .collect::<Vec<_>>()
        );
        let durable = shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).merge(snap);
        durable.wait().await.map_err(anyhow::Error::msg)?;
    }
    // Hold the control lock while adopting: a submission either lands before (and is in the mirror)
    // or after (in the new engine).
    let mut current = shared.control.lock().await;
    let snap = shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).snapshot();
    tracing::debug!(
        "member {} adopts term {term}: max id {}, entries {:?}",
        shared.member.id,
        snap.max_id,
        snap.entries.keys().collect::<Vec<_>>()
    );
    control.ids_above(snap.max_id);
    tracing::trace!(
        "m{} term {term}: adopting {:?}",
        shared.member.id,
        snap.entries
            .values()
            .map(|e| (e.id.clone(), e.term, e.kept, e.ended.as_ref().map(|v| v.state.clone())))
            .collect::<Vec<_>>()
    );
    let held = shared.member.read(|q| q.assignments.clone()).await;
    // Nodes the quorum gives to allocations: all of them known here (SMD may have gained some).
    let named: std::collections::BTreeSet<String> = held.values().flat_map(|a| a.nodes.iter().cloned()).collect();
    crate::openchami::join_named(shared, &mut control, &named).await;
    let mut attached = std::collections::BTreeSet::new();
    let (mut adopted, mut ended, mut rerun) = (0, 0, 0);
    // Submissions by idempotency key (tenant, key) → base ids, each with the newest term that kept
    // it (see `Entry::kept`).
    let mut keyed: BTreeMap<(String, String), Vec<(String, u64)>> = BTreeMap::new();
    // Members of a DAG attempt a later leader overwrote in part were never acknowledged: they are
    // cancelled, and their keys are the retry's to take.
    let stranded = snap.stranded_dag_members();
    for e in snap.entries.into_values() {
        let stranded_here = stranded.contains(&e.id);
        // A retry with an adopted submission's idempotency key still gets its id — once its record
        // is mirrored again (this copy may be the only one that has it).
        if !stranded_here {
            control.remember_key(&e.req, &e.id);
        }
        if e.req.idempotency_key.is_some() && !stranded_here {
            control.unacked(
                crate::control::group_element(&e.id).map_or(e.id.as_str(), |(b, _)| b),
                false,
            );
        }
        // Ended ones count too: a retry may have run (and ended) while an earlier attempt waited
        // in a copy this member had not read; that attempt must not run now.
        if let Some(k) = e.req.idempotency_key.as_ref().filter(|_| !stranded_here) {
            let base = crate::control::group_element(&e.id)
                .map_or(e.id.as_str(), |(b, _)| b)
                .to_string();
            let ids = keyed.entry((e.req.tenant.clone(), k.clone())).or_default();
            match ids.iter_mut().find(|(b, _)| *b == base) {
                Some((_, t)) => *t = (*t).max(e.kept_term()),
                None => ids.push((base, e.kept_term())),
            }
        }
        if let Some(v) = e.ended {
            control.add_ended(v);
            ended += 1;
            continue;
        }
        let mut req = e.req;
        // Dependencies that ended before are judged by their final records (at submission);
        // unknown ones (forgotten) count as satisfied.
        req.depends_on
            .retain(|d| control.id_of(&d.reference).is_some() || control.view_named(&d.reference).is_some());
        let mut unmet = false;
        match control.submit_named(req.clone(), Some(&e.id)) {
            Ok(_) => adopted += 1,
            Err(err) if err.field.starts_with("depends_on") && err.message.contains("can never be met") => {
                // A dependency ended so that it can never run, and its own end (cancelled, as the
                // engine ends such a dependent) was not recorded before the fail-over: it is adopted
                // and ends so now — an acknowledged allocation is never dropped (found by DST).
                req.depends_on.retain(|d| control.id_of(&d.reference).is_some());
                if let Err(err) = control.submit_named(req, Some(&e.id)) {
                    tracing::warn!("could not adopt {}: {err}", e.id);
                    continue;
                }
                adopted += 1;
                unmet = true;
            }
            Err(err) => {
                tracing::warn!("could not adopt {}: {err}", e.id);
                continue;
            }
        }
        control.resubmitted(&e.id, e.submitted_ms);
        if unmet || stranded_here {
            control.cancel(&e.id);
            if stranded_here {
                tracing::info!(
                    "{}: its DAG attempt was never acknowledged (a later leader reused its numbers); cancelled",
                    e.id
                );
            } else {
                tracing::info!("{}: a dependency ended unmet; cancelled", e.id);
            }
            continue;
        }
        if let Some(a) = held.get(&e.id) {
            // Exits of an earlier run (before a requeue) do not count for this one.
            let exits = if e.exits_run == a.since_ms {
                e.exits.clone()
            } else {
                BTreeMap::new()
            };
            match control.reattach(&e.id, &a.nodes, a.since_ms, e.submitted_ms, &exits) {
                Ok(()) => {
                    attached.insert(e.id.clone());
                }
                Err(err) => {
                    tracing::warn!("{err}; it runs again");
                    rerun += 1;
                }
            }
        }
    }
    for (id, members) in snap.dags {
        control.add_dag(&id, members);
    }
    // Allocations whose held nodes are freed here (run again, or not adopted): their agents may
    // still run them there; a next start waits until those show they stopped.
    for (alloc, a) in held.iter().filter(|(a, _)| !attached.contains(*a)) {
        control.stopping_on_nodes(alloc, &a.nodes);
    }
    settle_keys(&mut control, &keyed);
    control.await_agents();
    // Operators' standing orders (drains, disables) live at the quorum: a fail-over keeps them.
    let orders = shared.member.read(|q| q.node_admin.clone()).await;
    tracing::trace!("m{}: standing orders at adoption: {orders:?}", shared.member.id);
    for (node, o) in &orders {
        control.set_admin(node, o.drained, o.disabled);
    }
    // Tenants' contracts as the quorum committed them (the API's changes outlive fail-overs and
    // restarts; the tenants file only seeds the quorum).
    let tenants = shared.member.read(|q| q.tenants.clone()).await;
    for (name, quota) in &tenants {
        control.set_tenant(name, *quota);
    }
    let projects = shared.member.read(|q| q.projects.clone()).await;
    for (tenant, ps) in &projects {
        for (name, quota) in ps {
            control.set_project(tenant, name, *quota);
        }
    }
    control.enforce_admin();
    control.adopted_term = Some(term);
    // Nodes held for allocations that are not running here any more are freed (not `release`: that
    // reads the control plane, whose lock is held here).
    for alloc in held.keys().filter(|a| !attached.contains(*a)) {
        propose_retried(shared, QuorumCommand::Release { alloc: alloc.clone() }).await;
    }
    *current = control;
    drop(current);
    shared.wake.notify_one();
    tracing::info!(
        "leader: adopted {adopted} allocation(s) from the durable queue ({} re-attached to their nodes, {rerun} run again) and {ended} ended record(s)",
        attached.len()
    );
    Ok(())
}

/// Mirrors again, whole, submissions that are not yet on a majority's disks (a retry that could not
/// be made durable, or a record adopted from a copy others may lack); each is acknowledged — and may
/// start — once a majority holds it.
async fn remirror_unacked(shared: &Arc<Shared>) {
    let ids = shared.control.lock().await.unacked_idle(64);
    if ids.is_empty() {
        return;
    }
    let (entries, dags) = {
        let c = shared.control.lock().await;
        let m = shared.mirror.lock().unwrap_or_else(|e| e.into_inner());
        let entries: Vec<crate::mirror::Entry> = ids
            .iter()
            .flat_map(|id| {
                let members = c.group_members(id);
                if members.is_empty() { vec![id.clone()] } else { members }
            })
            .filter_map(|n| m.entries.get(&crate::control::id_number(&n)?).cloned())
            .collect();
        // The DAGs they belong to: their records may be on as few copies as the members'.
        (entries, c.dags_of(&ids))
    };
    {
        let mut c = shared.control.lock().await;
        for id in &ids {
            c.unacked(id, true);
        }
    }
    let (op, term, durable) = crate::mirror::record(shared, crate::mirror::MirrorOp::Entries { entries, dags });
    let (disk, peers) = tokio::join!(
        durable.wait(),
        crate::mirror::replicate(shared, &op, term, std::time::Duration::from_secs(1))
    );
    tracing::trace!(
        "m{}: mirrored {ids:?} again: disk {disk:?}, a majority {peers}",
        shared.member.id
    );
    let mut c = shared.control.lock().await;
    for id in &ids {
        if disk.is_ok() && peers {
            c.acked(id);
        } else {
            c.unacked(id, false);
        }
    }
    if disk.is_ok() && peers {
        shared.wake.notify_one();
    }
}

/// After adoption: one allocation per idempotency key, and each still to be acknowledged. Two
/// queued under one key means a retry reached a leader that had not seen the first attempt; the
/// first was then never on a majority's disks (a majority's copies are read before a leader serves,
/// and older leaders are fenced), so it was never acknowledged: the one the newest term mirrored is
/// kept, the others are cancelled. The kept one is mirrored again when its client retries (it may be on fewer than a
/// majority's disks).
fn settle_keys(control: &mut Control, keyed: &BTreeMap<(String, String), Vec<(String, u64)>>) {
    for ((tenant, key), ids) in keyed {
        let mut ids = ids.clone();
        // The attempt a newer term kept is the one that can have been acknowledged: a leader
        // reads a majority's copies before it acknowledges anything, so it saw every attempt
        // acknowledged before its term and kept (and re-mirrored) that one; an attempt only an
        // isolated leader's copy holds was never on a majority. Isolated leaders hand out numbers
        // independently, so the highest number proves nothing (found by DST: seed 89 of
        // isolate-leader without agents), and the term that recorded an attempt's end proves
        // nothing either: it may have cancelled it as never acknowledged (seed 59). One term keeps
        // at most one attempt per key; the number breaks ties between records written before
        // terms were kept.
        ids.sort_by_key(|(i, t)| (*t, crate::control::id_number(i).unwrap_or(0)));
        if ids.len() > 1 {
            tracing::debug!("key {key} of {tenant}: attempts (id, term) {ids:?}");
        }
        let Some((keep, _)) = ids.pop() else { continue };
        for (dup, _) in ids {
            let members = control.group_members(&dup);
            let names = if members.is_empty() { vec![dup.clone()] } else { members };
            for n in names {
                control.cancel(&n);
            }
            tracing::warn!(
                "{dup}: superseded by {keep}, a retry with the same idempotency key of {tenant} ({key}); cancelled"
            );
        }
        control.set_key(tenant, key, &keep);
        control.unacked(&keep, false);
    }
}

/// Records allocations that ended in the mirrors, with their final state (this member's durably,
/// before it returns; the others' in the background).
async fn prune_mirror(shared: &Arc<Shared>) {
    let ended = {
        let c = shared.control.lock().await;
        let m = shared.mirror.lock().unwrap_or_else(|e| e.into_inner());
        c.ended_among(m.active())
    };
    record_ended(shared, ended).await;
}

/// Records `ended` in the mirrors and waits until a majority holds it (up to `attempts` tries of
/// a second each, while this member leads).
async fn record_ended_on_majority(shared: &Arc<Shared>, ended: Vec<String>, attempts: u32) -> bool {
    for _ in 0..attempts {
        if shared.member.leader_term().is_none() {
            return false;
        }
        let Some(op) = ended_op(shared, ended.clone()).await else {
            return false;
        };
        let (op, term, durable) = crate::mirror::record(shared, op);
        let (disk, peers) = tokio::join!(
            durable.wait(),
            crate::mirror::replicate(shared, &op, term, std::time::Duration::from_secs(1))
        );
        if disk.is_ok() && peers {
            let ids = ended_ids(&op);
            shared.control.lock().await.ends_settled(&ids);
            return true;
        }
        tracing::debug!("recording the end of {ended:?} in term {term}: own disk {disk:?}, a majority: {peers}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    false
}

/// The mirror op recording `ended` with their final records — only from the control plane that
/// adopted the queue in the term this member leads, and only allocations it knows: one it does not
/// know (a control plane replaced by a leadership change meanwhile) is no reason to touch the
/// record, which may be another leader's acknowledged allocation.
async fn ended_op(shared: &Arc<Shared>, ended: Vec<String>) -> Option<crate::mirror::MirrorOp> {
    let c = shared.control.lock().await;
    if c.adopted_term.is_none() || c.adopted_term != shared.member.leader_term() {
        return None;
    }
    // Only ended ones: a retried recording may find one running again (re-attached in a new term).
    let views: Vec<_> = ended
        .iter()
        .filter_map(|id| c.view_named(id))
        .filter(|v| matches!(v.state.as_str(), "completed" | "failed" | "cancelled"))
        .collect();
    let entries = shared
        .mirror
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ended_entries(views);
    (!entries.is_empty()).then_some(crate::mirror::MirrorOp::Entries {
        entries,
        dags: Vec::new(),
    })
}

/// Records `ended` (allocations that ended, or that this control plane does not know) in the mirrors
/// with their final state: this member's durably before it returns, the others' in the background.
async fn record_ended(shared: &Arc<Shared>, ended: Vec<String>) {
    if ended.is_empty() {
        return;
    }
    let Some(op) = ended_op(shared, ended).await else {
        return;
    };
    let (op, term, durable) = crate::mirror::record(shared, op);
    if let Err(e) = durable.wait().await {
        tracing::error!("recording ended allocations: {e}");
        return;
    }
    let s = shared.clone();
    tokio::spawn(async move {
        if crate::mirror::replicate(&s, &op, term, std::time::Duration::from_secs(1)).await {
            let ids = ended_ids(&op);
            s.control.lock().await.ends_settled(&ids);
        }
    });
}

/// The allocations a mirrored end record names.
fn ended_ids(op: &crate::mirror::MirrorOp) -> Vec<String> {
    match op {
        crate::mirror::MirrorOp::Entries { entries, .. } => entries.iter().map(|e| e.id.clone()).collect(),
        _ => Vec::new(),
    }
}

/// Records on a majority the ends dependents wait for (ends adopted from this member's own copy, or
/// recorded in the background and not yet confirmed).
async fn settle_ends(shared: &Arc<Shared>) {
    let wanted = shared.control.lock().await.take_settle_wanted();
    if wanted.is_empty() {
        return;
    }
    if record_ended_on_majority(shared, wanted.clone(), 1).await {
        shared.control.lock().await.ends_settled(&wanted);
        shared.wake.notify_one();
    }
}

/// Proposes a start to the quorum and tells the controller its answer; what that causes (the launch,
/// a claim's audit entry) is returned to be carried out next.
async fn propose_start(shared: &Arc<Shared>, p: PendingProposal) -> Vec<Action> {
    {
        let mut c = shared.control.lock().await;
        // A dependent starts only once its dependencies' ends are on a majority's copies: an end a
        // fail-over could lose would run the dependency again beside it (found by DST).
        let deps: Vec<String> = crate::control::id_number(&p.name)
            .and_then(|n| {
                let m = shared.mirror.lock().unwrap_or_else(|e| e.into_inner());
                m.entries
                    .get(&n)
                    .map(|e| e.req.depends_on.iter().map(|d| d.reference.clone()).collect())
            })
            .unwrap_or_default();
        let unsettled = c.unsettled_ends(&deps);
        if c.incarnation == p.incarnation && !unsettled.is_empty() {
            c.rejected(
                p.alloc,
                format!(
                    "waiting until the end of {} is on a majority of the members' disks",
                    unsettled.join(", ")
                ),
            );
            return c.take_actions();
        }
        if c.incarnation == p.incarnation && c.waits_for_ack(&p.name) {
            tracing::trace!("m{}: {} waits for its acknowledgement", shared.member.id, p.name);
            // Not started before it is on a majority's disks (mirrored again in the background).
            c.rejected(
                p.alloc,
                "waiting until it is on a majority of the members' disks".into(),
            );
            return c.take_actions();
        }
    }
    let cmd = QuorumCommand::Assign {
        alloc: p.name.clone(),
        tenant: p.tenant.clone(),
        nodes: p.nodes.clone(),
        sensitive: p.sensitive,
        at_ms: shared.control.lock().await.now().0,
        project: p.project.clone(),
    };
    let t0 = std::time::Instant::now();
    let r = shared.member.propose(cmd).await;
    shared.metrics.commit(t0.elapsed());
    let mut c = shared.control.lock().await;
    tracing::trace!(
        "m{}: start of {} on {:?}: {r:?} (incarnation {} now {})",
        shared.member.id,
        p.name,
        p.nodes,
        p.incarnation,
        c.incarnation
    );
    if c.incarnation != p.incarnation {
        // The control plane that proposed it is gone (a leadership change). A start that committed
        // anyway is undone unless the new one took it over (it adopted after the commit and runs it).
        let runs_here = c
            .view_named(&p.name)
            .is_some_and(|v| v.state == "running" && v.nodes == p.nodes);
        drop(c);
        if matches!(r, Ok(QuorumResponse::Applied)) && !runs_here {
            release_stale(shared, &p.name).await;
        }
        return Vec::new();
    }
    match r {
        Ok(QuorumResponse::Applied) => {
            shared.metrics.placements.inc();
            shared.metrics.proposals.with_label_values(&["accepted"]).inc();
            c.committed(p.alloc);
        }
        Ok(QuorumResponse::Rejected { reason, message }) => {
            shared.metrics.proposals.with_label_values(&["rejected"]).inc();
            tracing::info!("quorum rejected {} ({reason}): {message}", p.name);
            c.rejected(p.alloc, message);
            if reason == "duplicate" {
                // The quorum still holds nodes for it from a start whose answer was lost (or that
                // committed only after a leadership change): it runs nowhere, so those are freed and
                // it is proposed again.
                drop(c);
                release_stale(shared, &p.name).await;
                return shared.control.lock().await.take_actions();
            }
        }
        Err(e) => c.rejected(p.alloc, e.to_string()),
    }
    c.take_actions()
}

/// Asks VAST to bring a staging allocation's data to the hot tier; a failure is a staging failure
/// (asked again next cycle, up to the retry limit).
async fn prefetch(shared: Arc<Shared>, name: String, sources: Vec<String>) {
    let Some(vast) = &shared.vast else { return };
    for src in sources {
        if let Err(e) = vast.prefetch(&src).await {
            let again = shared.control.lock().await.prefetch_failed(&name);
            let next = if again { "retrying" } else { "giving up (alert)" };
            tracing::warn!("{name}: VAST prefetch of {src}: {e}; {next}");
            shared.metrics.staging_failures.inc();
            return;
        }
    }
}

/// Creates the allocation's CXI service on its VNI and fetches its auth key; its tasks start once
/// both are there. A failure (after the client's retries) is a prologue failure: the allocation is
/// retried on other nodes.
async fn setup_fabric(shared: Arc<Shared>, name: String, vni: u32, nodes: Vec<String>) {
    let Some(fabric) = &shared.fabric else { return };
    let r = async {
        let s = fabric.create_service(&name, vni, &nodes).await?;
        let key = fabric.auth_key(&s.id).await?;
        Ok::<_, lattice_adapters::http::HttpError>((s.id, key))
    }
    .await;
    match r {
        Ok((service, key)) => shared.control.lock().await.cxi_ready(&name, service, key),
        Err(e) => {
            tracing::warn!("{name}: fabric manager: {e}; retrying the allocation elsewhere");
            shared.metrics.fabric_errors.inc();
            let actions = {
                let mut c = shared.control.lock().await;
                c.cxi_failed(&name);
                c.take_actions()
            };
            execute(shared.clone(), actions).await;
            shared.wake.notify_one();
        }
    }
}

/// A simulated agent: the allocation runs for its duration (killed at its walltime, read again as
/// it runs so a `PATCH` extension counts), then completes and its nodes are released at the quorum.
/// A run whose allocation lost its nodes meanwhile (disabled node, cancel) just stops.
async fn simulated_run(shared: Arc<Shared>, alloc: lattice_engine::AllocId, run: std::time::Duration) {
    let started = {
        let c = shared.control.lock().await;
        c.ctl.engine.allocation(alloc).and_then(|a| a.started)
    };
    let Some(started) = started else { return };
    let mut stopped = shared.stopped.clone();
    let reason = loop {
        let (now, walltime, same_run) = {
            let c = shared.control.lock().await;
            let a = c.ctl.engine.allocation(alloc);
            (
                c.now(),
                a.and_then(|a| a.spec.lifecycle.walltime())
                    .map(|w| std::time::Duration::from_millis(w.0)),
                a.is_some_and(|a| a.state == AllocState::Running && a.started == Some(started)),
            )
        };
        if !same_run {
            return;
        }
        let (end, reason) = match walltime {
            Some(w) if w < run => (w, EndReason::WalltimeExceeded),
            _ => (run, EndReason::Success),
        };
        let elapsed = std::time::Duration::from_millis(now.0.saturating_sub(started.0));
        if elapsed >= end {
            break reason;
        }
        // Wake at the end, or within a second to see a walltime change.
        let wait = (end - elapsed).min(std::time::Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped.changed() => return,
        }
    };
    let actions = {
        let mut c = shared.control.lock().await;
        c.completed(alloc, reason);
        c.take_actions()
    };
    execute(shared.clone(), actions).await;
    shared.wake.notify_one();
}

/// Frees an allocation's nodes at the quorum (retried until a leader takes it). A sensitive claim's
/// release is audited by the controller (with its wipe).
pub async fn release(shared: &Arc<Shared>, name: String) {
    // Its end is on a majority's disks first: a restart or a fail-over between the two never runs it
    // again (a requeued one is not ended: it stays queued in the record). Until then the quorum keeps
    // its nodes, so a new leader re-attaches it (its agents report the exit again) instead of running
    // it a second time.
    let ended = shared.control.lock().await.ended_among(std::iter::once(&name));
    if !ended.is_empty() && !record_ended_on_majority(shared, ended.clone(), 10).await {
        tracing::warn!("{name}: its end is not on a majority of the members yet; its nodes stay held meanwhile");
        let shared = shared.clone();
        tokio::spawn(async move {
            // Until a majority holds it, or this member stops leading (its successor re-attaches
            // the allocation and hears of its end again).
            while !*shared.stopped.borrow() && shared.member.leader_term().is_some() {
                if record_ended_on_majority(&shared, ended.clone(), 1).await {
                    release_nodes(&shared, name).await;
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        return;
    }
    release_nodes(shared, name).await;
}

/// Frees an ended or stopped allocation's network domain, CXI service and nodes at the quorum.
async fn release_nodes(shared: &Arc<Shared>, name: String) {
    // Out of its network domain; its CXI service revoked.
    let service = shared.control.lock().await.left_network(&name);
    if let (Some(service), Some(fabric)) = (service, &shared.fabric)
        && let Err(e) = fabric.revoke(&service).await
    {
        tracing::warn!("{name}: revoking CXI service {service}: {e}");
    }
    if !propose_retried(shared, QuorumCommand::Release { alloc: name.clone() }).await {
        tracing::warn!("could not release {name} at the quorum");
    }
}

/// Frees nodes the quorum still holds for allocations this control plane knows ended (a release
/// whose proposals all failed during a leadership change would otherwise keep them forever).
async fn release_ended_holdings(shared: &Arc<Shared>) {
    let Some(held) = shared
        .member
        .try_read(|q| q.assignments.keys().cloned().collect::<Vec<_>>())
    else {
        return;
    };
    let ended: Vec<String> = {
        let c = shared.control.lock().await;
        let now = c.now().0;
        // Ended a while ago: its own release has had its chance.
        held.into_iter()
            .filter(|a| {
                c.view_named(a).is_some_and(|v| {
                    matches!(v.state.as_str(), "completed" | "failed" | "cancelled")
                        && v.ended_ms.is_some_and(|e| now.saturating_sub(e) > 5_000)
                })
            })
            .collect()
    };
    for name in ended {
        tracing::info!("{name}: ended, yet the quorum still holds nodes for it; releasing them");
        release_nodes(shared, name).await;
    }
}

/// Frees nodes the quorum holds for `name` from a start this control plane does not run.
async fn release_stale(shared: &Arc<Shared>, name: &str) {
    tracing::info!("{name}: freeing the nodes the quorum holds for it from a start it does not run");
    // That start's agents may run it there: its next start waits until they show it stopped.
    let nodes = shared
        .member
        .read(|q| q.assignments.get(name).map(|a| a.nodes.clone()))
        .await
        .unwrap_or_default();
    shared.control.lock().await.stopping_on_nodes(name, &nodes);
    if !propose_retried(
        shared,
        QuorumCommand::Release {
            alloc: name.to_string(),
        },
    )
    .await
    {
        tracing::warn!("could not free the stale nodes of {name} at the quorum");
    }
}

/// Appends to the quorum's hash-chained audit log (book: sensitive workloads).
pub(crate) async fn audit(shared: &Arc<Shared>, user: &str, alloc: &str, action: &str, detail: String) {
    let cmd = QuorumCommand::Audit {
        at_ms: shared.clock.now_ms(),
        user: user.to_string(),
        alloc: alloc.to_string(),
        action: action.to_string(),
        detail,
    };
    if !propose_retried(shared, cmd).await {
        tracing::error!("could not append {action} of {alloc} to the audit log");
    }
}

/// Waits `d`, or until the runtime stops: whether it still runs.
pub(crate) async fn sleep_unless_stopped(
    stopped: &mut tokio::sync::watch::Receiver<bool>,
    d: std::time::Duration,
) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stopped.changed() => {}
    }
    !*stopped.borrow()
}

async fn propose_retried(shared: &Shared, cmd: QuorumCommand) -> bool {
    for _ in 0..50 {
        if shared.member.propose(cmd.clone()).await.is_ok() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}
