//! Starting a runtime: the quorum member, the scheduling loop (the same engine as `sim`, on the wall
//! clock, proposing ownership through the quorum), simulated agents, and the REST API.

use crate::api;
use crate::config::RuntimeConfig;
use crate::effects::{execute, prefetch, release_ended_holdings, settle_ends, simulated_run};
use crate::leadership::{prune_mirror, remirror_unacked, sync_leadership};
use crate::metrics::Metrics;
use anyhow::{Context, Result};
use lattice_adapters::{Member, QuorumCommand};
use lattice_control::Control;
use lattice_engine::{NodeSpec, VClusterConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{Mutex, Notify};

pub use crate::context::{ControlLock, RESTORE_PENDING, Shared};
pub use crate::listen::Listen;

/// How a runtime meets the world: its ports, its disk, how it dials peers, its clock and Raft
/// timings. [`start`] wires it to TCP, the data directory and the system clock; the deterministic
/// simulation (`lattice-dst`) to its own network, disk and clock — the rest is the same code.
pub struct Wiring {
    pub grpc: Listen,
    pub rest: Listen,
    pub disk: lattice_adapters::disk::Disk,
    pub dial: Option<lattice_adapters::raft_net::Dialer>,
    pub clock: lattice_control::Clock,
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
        clock: crate::context::member_clock(lattice_control::wall_now().0),
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
    // Simulated agents by default only for simulated nodes (not for an inventory file or SMD's).
    let simulate_agents = cfg
        .simulate_agents
        .unwrap_or(cfg.inventory.is_none() && cfg.services.openchami.is_none());
    // Allocations' launch tokens derive from a secret of this process (a simulation's is fixed).
    let launch_secret = match &disk {
        lattice_adapters::disk::Disk::Dir(_) => crate::ops::random_secret(),
        _ => [0; 32],
    };
    let (control, fresh_control) = controls(
        &cfg,
        Made {
            inventory,
            baselines,
            tenants: tenants.clone(),
            clock,
            launch_secret,
            simulate_agents,
        },
    )?;
    let (fabric, vast, tsdb) = service_clients(&cfg)?;
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
        config: raft.or_else(|| {
            cfg.raft_snapshot_every.map(|n| lattice_adapters::openraft::Config {
                snapshot_policy: lattice_adapters::openraft::SnapshotPolicy::LogsSinceLast(n),
                max_in_snapshot_log_to_keep: n + n / 10 + 1,
                ..lattice_adapters::raft_config()
            })
        }),
        peers: cfg
            .quorum_members()
            .into_iter()
            .filter(|(id, _)| *id != cfg.node_id)
            .map(|(_, addr)| addr)
            .collect(),
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
    let rest_url = match &cfg.rest_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => advertised(rest.local_addr()?, cfg.tls.is_some()),
    };
    let audit_key = crate::audit_key::load(
        cfg.sensitive.audit_signing_key_path.as_deref(),
        dial.is_some().then_some(cfg.node_id),
    )?;
    let archive = match &cfg.services.archive {
        Some(a) => Some(Arc::new(crate::archive::Archive::from_config(a)?)),
        None => None,
    };
    let shared = Arc::new(Shared {
        rest_url,
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
        rounds: Default::default(),
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
        audit_key,
        archive: archive.clone(),
        audit_verified: Default::default(),
    });
    // Quotas and the sensitive pool go to the quorum once a leader exists.
    let mut tasks = vec![
        tokio::spawn(push_quotas(shared.clone(), tenants, sensitive_pool, stopped.clone())),
        tokio::spawn(scheduling_loop(shared.clone(), cfg.cycle(), stopped.clone())),
    ];
    if let Some(a) = accounting {
        tasks.push(tokio::spawn(crate::accounting::service::run(
            shared.clone(),
            a,
            stopped.clone(),
        )));
    }
    #[cfg(feature = "federation")]
    if let Some(b) = shared.federation.clone() {
        tracing::info!(
            "federation: site {} (catalog every {})",
            b.cfg.site,
            b.cfg.sync_interval
        );
        tasks.push(tokio::spawn(crate::federation::sync::run(
            shared.clone(),
            b,
            stopped.clone(),
        )));
    }
    if let Some(a) = archive {
        tasks.push(tokio::spawn(crate::archive::service::run(
            shared.clone(),
            a,
            stopped.clone(),
        )));
    }
    if let Some(probe) = &cfg.services.checkpoint_store {
        let task = crate::storage_probe::run(shared.clone(), probe.clone(), stopped.clone());
        tasks.push(tokio::spawn(task));
    }
    if let (Some(oc), Some(c)) = (openchami, &cfg.services.openchami) {
        let refresh = crate::openchami::sync::refresh(shared.clone(), oc, c.clone(), smd_down, stopped.clone());
        tasks.push(tokio::spawn(refresh));
    }
    tasks.push(serve_grpc(grpc, &shared, tls.as_ref(), stopped.clone())?);
    let rest_addr = rest.local_addr()?;
    tasks.push(serve_rest(rest, &shared, tls.as_ref(), stopped.clone())?);
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

/// The external services' clients, where configured: the fabric manager, VAST and the TSDB.
#[allow(clippy::type_complexity)]
fn service_clients(
    cfg: &RuntimeConfig,
) -> Result<(
    Option<lattice_adapters::fabric::FabricClient>,
    Option<lattice_adapters::vast::VastClient>,
    Option<lattice_adapters::tsdb::Tsdb>,
)> {
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
    Ok((fabric, vast, tsdb))
}

/// Serves the gRPC port until the runtime stops: the quorum's Raft service, the public API and the
/// queue mirror.
fn serve_grpc(
    grpc: Listen,
    shared: &Arc<Shared>,
    tls: Option<&crate::tls::Tls>,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>> {
    let api = crate::grpc::Api { shared: shared.clone() };
    let mut grpc_stop = stopped;
    let mut builder = tonic::transport::Server::builder();
    if let Some(t) = tls {
        builder = builder.tls_config(t.grpc()).context("gRPC TLS")?;
    }
    let grpc_server = builder
        .add_service(shared.member.raft_service())
        .add_service(crate::pb::allocation_service_server::AllocationServiceServer::new(
            api.clone(),
        ))
        .add_service(crate::pb::node_service_server::NodeServiceServer::new(api.clone()))
        .add_service(crate::pb::admin_service_server::AdminServiceServer::new(api.clone()))
        .add_service(crate::pb::observe_service_server::ObserveServiceServer::new(
            api.clone(),
        ))
        .add_service(crate::pb::task_service_server::TaskServiceServer::new(api.clone()))
        .add_service(crate::pb::site_service_server::SiteServiceServer::new(api.clone()))
        .add_service(crate::pb::queue_mirror_server::QueueMirrorServer::new(
            crate::mirror::net::MirrorService { shared: shared.clone() },
        ));
    #[cfg(feature = "federation")]
    let grpc_server = grpc_server.add_service(crate::pb::federation_service_server::FederationServiceServer::new(
        api.clone(),
    ));
    drop(api);
    let grpc_stopped = async move {
        let _ = grpc_stop.changed().await;
    };
    Ok(match grpc {
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
    })
}

/// Serves the REST API until the runtime stops (TLS when configured).
fn serve_rest(
    rest: Listen,
    shared: &Arc<Shared>,
    tls: Option<&crate::tls::Tls>,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>> {
    let app = api::router(shared.clone());
    let mut rest_stop = stopped.clone();
    let rest_stopped = async move {
        let _ = rest_stop.changed().await;
    };
    Ok(match (rest, tls) {
        (Listen::Tcp(rest), Some(t)) => tokio::spawn(crate::tls::serve_rest(rest, app, t.rest()?, stopped)),
        (Listen::Tcp(rest), None) => tokio::spawn(async move {
            let _ = axum::serve(rest, app).with_graceful_shutdown(rest_stopped).await;
        }),
        (Listen::Other(rest), _) => tokio::spawn(async move {
            let _ = axum::serve(crate::listen::Rest(rest), app)
                .with_graceful_shutdown(rest_stopped)
                .await;
        }),
    })
}

/// What a fresh control plane is made from, besides the configuration.
struct Made {
    inventory: lattice_traces::Inventory,
    baselines: BTreeMap<String, String>,
    tenants: lattice_traces::Contracts,
    clock: lattice_control::Clock,
    launch_secret: [u8; 32],
    simulate_agents: bool,
}

/// A fresh control plane made now, and the maker a member that gains or loses leadership starts
/// from.
type FreshControl = Box<dyn Fn() -> Result<Control> + Send + Sync>;

/// The control plane as configured (its engine, network domains, agents' timings and services),
/// once now and as a maker for later.
fn controls(cfg: &RuntimeConfig, made: Made) -> Result<(Control, FreshControl)> {
    let Made {
        inventory,
        baselines,
        tenants,
        clock,
        launch_secret,
        simulate_agents,
    } = made;
    let vcs = vcluster_configs(cfg)?;
    let capture = cfg.scheduler.trace_capture.clone();
    let network = cfg.network.clone();
    let fabric_on = cfg.services.fabric.is_some();
    let vast_gbps = cfg.services.vast.as_ref().and_then(|v| v.write_gbps);
    let wipe_timeout_ms = cfg.sensitive.wipe_timeout_ms();
    let preemption_report_grace_ms = cfg.agents.preemption_slack_ms();
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
    let sensitive_boot_ms = cfg.sensitive.boot_timeout().0;
    let node_boot = cfg.agents.boot_timeouts().map_err(anyhow::Error::msg)?;
    let make = move |inv: &lattice_traces::Inventory,
                     vcs,
                     quotas: &lattice_traces::Contracts,
                     capture: Option<&std::path::Path>| {
        let mut c = Control::new(inv, vcs, quotas, capture)?;
        c.wall = clock;
        c.ctl.grace = heartbeat_grace;
        c.ctl.drift_timeout = drift_timeout;
        c.ctl.hardened_boot = hardened_boot;
        c.ctl.hardened_boot_timeout = lattice_engine::Duration(sensitive_boot_ms);
        c.ctl.node_boot = node_boot.clone();
        c.ctl.heartbeat_timeout = lattice_engine::Duration(heartbeat_timeout_ms);
        c.launch_secret = launch_secret;
        c.ctl.network = Some(network.domains()?);
        c.fabric = fabric_on;
        c.real_agents = !simulate_agents;
        c.set_baselines(&baselines);
        c.wipe_by_openchami = wipe_by_openchami;
        c.ctl.wipe_timeout = Some(lattice_engine::Duration(wipe_timeout_ms));
        c.ctl.preemption_report_grace = Some(lattice_engine::Duration(preemption_report_grace_ms));
        if let Some(g) = vast_gbps {
            c.ctl.engine.set_vast_bandwidth(g);
        }
        Ok::<_, anyhow::Error>(c)
    };
    let control = make(&inventory, vcs.clone(), &tenants, capture.as_deref())?;
    let quotas = tenants.clone();
    let fresh_control: Box<dyn Fn() -> Result<Control> + Send + Sync> =
        Box::new(move || make(&inventory, vcs.clone(), &quotas, capture.as_deref()));
    Ok((control, fresh_control))
}

/// The REST URL of a member bound to `addr`: this host's name when bound to every interface.
fn advertised(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        format!("{scheme}://{host}:{}", addr.port())
    } else {
        format!("{scheme}://{addr}")
    }
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
    // So does the profile: a vCluster the quorum does not know yet is created with the profile's
    // configuration; one it knows keeps what the API set.
    let vclusters = shared.control.lock().await.vcluster_configs();
    cmds.extend(vclusters.into_iter().map(|(name, config)| QuorumCommand::PutVCluster {
        name,
        config,
        write,
        at_ms,
        by: "profile".to_string(),
    }));
    // And the site settings decisions read (this member's config file), while the quorum holds none.
    let settings = shared.control.lock().await.settings();
    cmds.push(QuorumCommand::PutSettings {
        settings: settings.into_iter().map(|(k, ms)| (k, Some(ms))).collect(),
        write,
        at_ms,
        by: "config".to_string(),
    });
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
        // CXI services a new leader took over: their auth keys are read again.
        let services = shared.control.lock().await.cxi_to_read();
        if !services.is_empty() {
            tokio::spawn(crate::effects::take_over_fabric(shared.clone(), services));
        }
        if shared.simulate_agents {
            // Re-attached runs: their simulated agents carry on.
            for (alloc, run) in shared.control.lock().await.take_resumed() {
                tokio::spawn(simulated_run(shared.clone(), alloc, run));
            }
        }
        let actions = {
            let mut c = shared.control.lock().await;
            c.check_agents();
            c.take_actions()
        };
        execute(shared.clone(), actions).await;
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
