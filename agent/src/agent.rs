//! The agent's loop: register (again whenever the control plane no longer knows it), heartbeat every
//! `heartbeat` interval with a strictly increasing sequence, poll for work every `poll` interval,
//! start what it is given with the seed's environment, stop what it is told to, and report every exit
//! — retried until the control plane takes it, so a report is never lost to a transient failure,
//! and kept on disk until then (the exits file beside the state file), so not to an agent restart
//! either. What to send when, and what each answer means, is [`crate::protocol`]; this loop does the
//! I/O and runs the processes.
//! During a partition the agent runs its allocations autonomously and buffers the heartbeats it could
//! not deliver (at most [`MAX_BUFFERED`], oldest dropped and counted); when the control plane is back
//! they are replayed in order with the next heartbeat (book: "Network Partition: Node ↔ Quorum").
//! Output goes to the log store in zstd chunks every `log_flush` and when a process ends; while
//! someone follows an allocation (the control plane lists it in `tail`), its new output rides along
//! with each poll (at most [`TAIL_BYTES_PER_POLL`]; the first poll replays the newest [`TAIL_REPLAY`]).

use crate::checkpoint::{Channel, GrpcResult, Mechanism};
use crate::client::{Client, ExitKind, Launch, Outcome, Reports};
use crate::discovery::{Capabilities, Sources, fingerprint};
use crate::protocol::{self, Beaten, Exit, Failure, Session};
use crate::runner::{self, Ending, RunSpec};
use lattice_node_adapters::logstore::Stream;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node: String,
    pub poll: Duration,
    pub heartbeat: Duration,
    /// SIGTERM → SIGKILL at the walltime.
    pub grace: Duration,
    pub log_dir: PathBuf,
    pub ring_bytes: usize,
    /// Also set the `SLURM_*` compatibility variables.
    pub slurm_env: bool,
    /// Where the running processes are recorded, so a restarted agent takes them over.
    pub state_file: Option<PathBuf>,
    /// Telemetry: the aggregation mode (how often allocations and GPUs are sampled and the GPU alert
    /// rules evaluated), and where samples go — a Prometheus remote-write endpoint and/or a
    /// Pushgateway-compatible URL (Prometheus text).
    pub telemetry: crate::telemetry::Mode,
    pub remote_write: Option<String>,
    pub metrics_push: Option<String>,
    /// The log store output is flushed to as zstd chunks every `log_flush` (and when a process ends).
    pub log_store: Option<lattice_node_adapters::logstore::LogStore>,
    pub log_flush: Duration,
    /// How often the conformance fingerprint is recomputed (the book: every 6 h).
    pub fingerprint_every: Duration,
    /// Where the host's `/proc`, `/sys` and `/etc` are seen (`/`; `/host` for an agent in a
    /// container with the host's root mounted there): the fingerprint and capabilities are read there.
    pub host_root: PathBuf,
    /// Where shmem checkpoint flags and gRPC endpoint files live (`/dev/shm`).
    pub shm_dir: PathBuf,
    pub callback: crate::checkpoint::CallbackTimeouts,
    /// The site's secure-wipe command for a released sensitive claim's node (`sh -c`, with
    /// `LATTICE_ALLOC_ID` and `LATTICE_NODE`); exit 0 = wiped. Without one a wipe fails (the node is
    /// quarantined): a sensitive node is never returned unwiped.
    pub wipe_command: Option<String>,
    /// uenv images: the registry, the node-local cache and the mount point.
    pub uenv: crate::uenv::UenvConfig,
    /// Each allocation's scratch is `DIR/ID/` (`LATTICE_SCRATCH`, `TMPDIR`), created at its start and
    /// removed when its process ends — also one a restarted agent took over. `None`: no scratch.
    pub scratch_dir: Option<PathBuf>,
    /// Where the site's storage is mounted on this node, by scheme (`nfs`, `s3`): data mounts and
    /// the default home and output directories come from there ([`crate::data`]).
    pub data_roots: BTreeMap<String, PathBuf>,
    /// The agent's own gRPC service (task launches' fences, aborts, `Exec`): where it listens, and the
    /// address other agents reach it at (default: the listen address; this host's name for
    /// `0.0.0.0`). `None`: no service (single-node launches still run).
    pub peer_listen: Option<String>,
    pub peer_advertise: Option<String>,
    /// A task launch's fence not complete within this is aborted ("PMI fence timeout").
    pub fence_timeout: Duration,
    /// `lattice-mpi-launcher`, for `mpirun` inside allocations (`HYDRA_LAUNCHER_EXEC`).
    pub launcher: Option<PathBuf>,
    /// OCI images: the store of image layouts, where bundles go, and the OCI runtime ([`crate::oci`]).
    pub oci: crate::oci::OciEngine,
}

/// Writes `LOG_DIR/.compat/srun`, which runs `lattice srun` (the `lattice` beside this agent, else the
/// one on the PATH); the directory, or `None` when it cannot be written.
fn compat_bin(log_dir: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = log_dir.join(".compat");
    let lattice = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("lattice")))
        .filter(|p| p.is_file())
        .map_or_else(|| "lattice".to_string(), |p| p.display().to_string());
    let script = format!("#!/bin/sh\nexec '{}' srun \"$@\"\n", lattice.replace('\'', "'\\''"));
    let srun = dir.join("srun");
    let made = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&srun, script))
        .and_then(|()| std::fs::set_permissions(&srun, std::fs::Permissions::from_mode(0o755)));
    match made {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!("lattice-agent: srun compatibility in {}: {e}", dir.display());
            None
        }
    }
}

/// The address other agents reach this agent's service at: the one configured, else the bound
/// address — with this host's name when it listens on every interface.
fn advertise(configured: Option<&str>, bound: std::net::SocketAddr) -> String {
    if let Some(a) = configured {
        return a.to_string();
    }
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    let host = ok
        .then(|| {
            let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
            String::from_utf8_lossy(&name[..end]).into_owned()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into());
    format!("{host}:{}", bound.port())
}

/// The allocation's scratch directory under `root`, when its id is a plain name (never a path).
pub fn scratch_of(root: &std::path::Path, id: &str) -> Option<PathBuf> {
    let plain = !id.is_empty() && id != "." && id != ".." && !id.contains(['/', '\\', '\0']);
    plain.then(|| root.join(id))
}

/// A checkpoint in flight on this node: until when to wait, and whether a preemption waits for it
/// (then the task is stopped when it completes or times out).
struct InFlight {
    until: Instant,
    preempt: bool,
}

/// Live tail: the most output sent with one poll, per allocation.
pub const TAIL_BYTES_PER_POLL: u64 = 256 * 1024;
/// Live tail: how much of the past a new follower gets first.
pub const TAIL_REPLAY: u64 = 64 * 1024;

/// Heartbeats kept during a partition (a day at the default 10 s interval).
pub const MAX_BUFFERED: usize = protocol::MAX_BUFFERED;

/// The processes recorded by a previous agent (none when the file is absent; an unreadable one is
/// an error naming it — taking over nothing would orphan live jobs silently).
pub fn read_state(path: &std::path::Path) -> anyhow::Result<Vec<runner::Record>> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| anyhow::anyhow!("state file {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("state file {}: {e}", path.display())),
    }
}

/// Writes the records (to a temporary file, then renamed: never half-written).
pub fn write_state(path: &std::path::Path, records: &[runner::Record]) -> std::io::Result<()> {
    write_json(path, records)
}

/// The exits a previous agent had not got taken (none when the file is absent; an unreadable one is
/// an error naming it — reporting nothing would leave those allocations running forever).
pub fn read_exits(path: &std::path::Path) -> anyhow::Result<Vec<Exit>> {
    let exits: Vec<Exit> = match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| anyhow::anyhow!("exits file {}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow::anyhow!("exits file {}: {e}", path.display())),
    };
    Ok(exits)
}

/// Writes `value` as JSON to `path` through a temporary file renamed over it: never half-written.
fn write_json<T: serde::Serialize + ?Sized>(path: &std::path::Path, value: &T) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value).unwrap_or_default())?;
    std::fs::rename(tmp, path)
}

/// The seed's environment for one task of an allocation. `LATTICE_NODEID` is this node's place in
/// the allocation; `LATTICE_TASK_INDEX` is a task group element's index (the seed's
/// `SLURM_ARRAY_TASK_ID`), and the node's place for an allocation outside a task group.
pub fn environment(l: &Launch, slurm: bool) -> Vec<(String, String)> {
    let task_index = l.task_group.as_ref().map_or(l.task_index, |g| g.index);
    let mut env = vec![
        ("LATTICE_ALLOC_ID".to_string(), l.id.clone()),
        ("LATTICE_NODELIST".to_string(), l.nodes.join(",")),
        ("LATTICE_NNODES".to_string(), l.nodes.len().to_string()),
        ("LATTICE_NODEID".to_string(), l.task_index.to_string()),
        ("LATTICE_TASK_INDEX".to_string(), task_index.to_string()),
        ("LATTICE_TENANT".to_string(), l.tenant.clone()),
    ];
    if let Some(g) = &l.task_group {
        env.push(("LATTICE_TASK_GROUP_ID".to_string(), g.group.clone()));
    }
    // The network domain (book: "Network Domains"): libfabric's CXI provider reads these.
    if let Some(vni) = l.vni {
        env.push(("LATTICE_VNI".to_string(), vni.to_string()));
        env.push(("SLINGSHOT_VNIS".to_string(), vni.to_string()));
    }
    if let Some(k) = &l.cxi_auth_key {
        env.push(("FI_CXI_AUTH_KEY".to_string(), k.clone()));
    }
    // Requeued after a checkpoint: the task restores its latest checkpoint (the work it kept, s).
    if let Some(s) = l.restart_from_s.filter(|s| *s > 0.0) {
        env.push(("LATTICE_RESTART_FROM".to_string(), format!("{s:.3}")));
    }
    if slurm {
        env.extend([
            ("SLURM_JOB_ID".to_string(), l.id.clone()),
            ("SLURM_JOB_NODELIST".to_string(), l.nodes.join(",")),
            ("SLURM_JOB_NUM_NODES".to_string(), l.nodes.len().to_string()),
            ("SLURM_NODEID".to_string(), l.task_index.to_string()),
            ("SLURM_PROCID".to_string(), l.task_index.to_string()),
        ]);
        if let Some(g) = &l.task_group {
            env.push(("SLURM_ARRAY_TASK_ID".to_string(), g.index.to_string()));
            env.push(("SLURM_ARRAY_JOB_ID".to_string(), g.group.clone()));
        }
    }
    env
}

/// Runs until `stop` is set; then stops its processes (and reports them) before returning.
pub fn run(client: &Client, cfg: &AgentConfig, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    run_with(client, cfg, stop, crate::gpu::default_provider())
}

/// [`run`] with a given GPU provider (tests use a fake one).
pub fn run_with(
    client: &Client,
    cfg: &AgentConfig,
    stop: Arc<AtomicBool>,
    gpu: Box<dyn crate::gpu::GpuProvider>,
) -> anyhow::Result<()> {
    let sources = Sources { root: &cfg.host_root };
    let (mut caps, mut fp) = discover(&sources, &*gpu);
    let mut last_fingerprint = Instant::now();
    // The protocol ([`protocol::Session`]) on this agent's monotonic clock.
    let t0 = Instant::now();
    let mut session = Session::new(&cfg.node, client.endpoints(), 0);
    // Fencing by lease, on its own thread ([`crate::fence`]).
    let fence = Arc::new(crate::fence::Fence::default());
    fence.spawn(cfg.node.clone(), cfg.heartbeat, cfg.grace, stop.clone());
    // Services' liveness probes, each on its own thread ([`crate::probe`]).
    let probes = crate::probe::Probes::default();
    let mut procs: BTreeMap<String, runner::Running> = BTreeMap::new();
    // Slurm compatibility: an `srun` that runs `lattice srun` first on the allocations' PATH.
    let compat_path = cfg.slurm_env.then(|| compat_bin(&cfg.log_dir)).flatten();
    // Task launches within running allocations, and the agents' own service they use.
    let tasks = crate::tasks::Tasks::new(crate::tasks::TasksConfig {
        node: cfg.node.clone(),
        log_dir: cfg.log_dir.clone(),
        grace: cfg.grace,
        fence_timeout: cfg.fence_timeout,
        slurm_env: cfg.slurm_env,
        alloc_wait: crate::tasks::ALLOC_WAIT,
    });
    let peer_addr: Option<String> = cfg.peer_listen.as_deref().and_then(|listen| match tasks.serve(listen) {
        Ok(a) => {
            let advertised = advertise(cfg.peer_advertise.as_deref(), a);
            eprintln!(
                "lattice-agent {}: agent service on {a} (reached at {advertised})",
                cfg.node
            );
            Some(advertised)
        }
        Err(e) => {
            eprintln!(
                "lattice-agent {}: agent service on {listen}: {e}; multi-node task launches will fail here",
                cfg.node
            );
            None
        }
    });
    // The node-local uenv image cache (its index survives restarts), opened when a uenv is first needed.
    let mut images: Option<crate::cache::ImageCache> = None;
    // Per running allocation: its checkpoint channel, and whether a shmem hint awaits "done".
    let mut channels: BTreeMap<String, (Channel, bool)> = BTreeMap::new();
    let open_channel = |id: &str, mechanism: &str| match Channel::create(&cfg.shm_dir, id, Mechanism::parse(mechanism))
    {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!(
                "lattice-agent {}: checkpoint channel of {id} in {}: {e}; hints will be signals",
                cfg.node,
                cfg.shm_dir.display()
            );
            None
        }
    };
    // Checkpoints in flight (hints and preemptions), tasks being stopped for a preemption (whether
    // their checkpoint completed), gRPC hints answered, and outcomes for the next poll.
    let mut in_flight: BTreeMap<String, InFlight> = BTreeMap::new();
    let mut stopping: BTreeMap<String, bool> = BTreeMap::new();
    let (grpc_done_tx, grpc_done) = std::sync::mpsc::channel::<String>();
    let (wiped_tx, wiped_rx) = std::sync::mpsc::channel::<Outcome>();
    let mut reports = Reports::default();
    // The image cache's contents as last reported.
    let mut reported_cache: Option<Vec<crate::client::CachedImage>> = None;
    // Per allocation: its CPU seconds at the last telemetry tick (for cpu_utilization).
    let mut cpu_seen: BTreeMap<String, (Instant, f64)> = BTreeMap::new();
    // What the exits file holds: what a previous agent had not got taken (written again when the
    // session's unreported exits differ, e.g. with those a take-over adds).
    let mut recorded_exits: Vec<Exit> = Vec::new();
    // Whether a too-short lease was reported (once).
    let mut lease_warned = false;
    // Take over what a previous agent started: live processes are watched again, ended ones reported.
    if let Some(path) = &cfg.state_file {
        // The lease of the last heartbeat the previous agent had accepted.
        if let Some((sent_ms, lease_ms)) = std::fs::read_to_string(path.with_extension("lease"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| Some((v["sent_ms"].as_u64()?, v["lease_ms"].as_u64()?)))
        {
            let ago = Duration::from_millis(crate::runner::wall_ms().saturating_sub(sent_ms));
            let lease = Duration::from_millis(lease_ms);
            match Instant::now().checked_sub(ago) {
                Some(sent) => fence.renewed(sent, lease),
                // Longer ago than this machine's uptime: over.
                None => fence.renewed(Instant::now(), Duration::ZERO),
            }
        }
        recorded_exits = read_exits(&path.with_extension("exits"))?;
        for e in recorded_exits.iter().cloned() {
            session.ended(e);
        }
        for rec in read_state(path)? {
            let id = rec.id.clone();
            match runner::attach(rec.clone()) {
                Some(r) => {
                    eprintln!("lattice-agent {}: took over {id} (pid {})", cfg.node, rec.pid);
                    tasks.alloc_started(
                        &id,
                        crate::tasks::AllocInfo {
                            env: Vec::new(),
                            pid: rec.pid,
                            mounted: rec.has_namespace(),
                            token: rec.launch_token.clone(),
                        },
                    );
                    if let Some(c) = Channel::reopen(&cfg.shm_dir, &id, Mechanism::parse(&rec.checkpoint)) {
                        channels.insert(id.clone(), (c, false));
                    }
                    fence.watch(&id, r.stopper());
                    if let Some(spec) = rec.liveness.clone() {
                        let ran = crate::runner::wall_ms().saturating_sub(rec.started_ms);
                        probes.watch(&id, spec, "127.0.0.1".into(), r.stopper(), Duration::from_millis(ran));
                    }
                    procs.insert(id, r);
                }
                None => {
                    flush_log(cfg, &rec);
                    if let Some(c) = &rec.container {
                        crate::oci::ContainerRuntime::cleanup(&cfg.oci, c);
                    }
                    let out = runner::ended_unwatched(&rec);
                    let code = match out.ending {
                        Ending::Exited(c) => c,
                        _ => -1,
                    };
                    session.ended(Exit {
                        id,
                        kind: ExitKind::Exited,
                        code,
                        tail: tail_of(&out.output),
                        err_tail: tail_of(&out.errors),
                    });
                }
            }
        }
    }
    let mut recorded: Vec<String> = Vec::new();
    // Followed allocations' streams: the output offset sent so far (None: not yet).
    let mut tailing: BTreeMap<(String, Stream), Option<u64>> = BTreeMap::new();
    let mut last_flush = Instant::now();
    let mut telemetry = crate::telemetry::Telemetry::new(gpu, cfg.telemetry);
    eprintln!("lattice-agent {}: {}", cfg.node, telemetry.ebpf_status());
    let mut last_push = Instant::now();
    let mut last_rtt: Option<Duration> = None;
    // The last output of followed processes that ended, for the next poll.
    let mut last_output: Vec<crate::client::Output> = Vec::new();
    // Exits held until the poll carrying their processes' final output has been sent.
    let mut held_exits: Vec<Exit> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        if session.must_register() {
            let answer = client.send(
                session.target(),
                &protocol::register_with(&cfg.node, &caps, &fp, peer_addr.as_deref()),
            );
            if let Err(e) = &answer {
                eprintln!("lattice-agent {}: register: {e}", cfg.node);
            }
            session.registered(answer.map(|_| ()).map_err(|e| e.failure()));
            if session.must_register() {
                std::thread::sleep(cfg.poll);
                continue;
            }
        }
        if let Some(mut req) = session.heartbeat_due(t0.elapsed(), cfg.heartbeat) {
            // The previous accepted heartbeat's round trip, for the control plane's metrics.
            if let Some(rtt) = last_rtt.take() {
                req.body["rtt_ms"] = serde_json::json!(rtt.as_secs_f64() * 1000.0);
            }
            let sent = Instant::now();
            let answer = client.send(session.target(), &req);
            let took = sent.elapsed();
            let beat = answer.as_ref().map(protocol::beat).map_err(|e| e.failure());
            match session.heartbeat_answered(beat, crate::runner::wall_ms()) {
                Beaten::Accepted { replayed, dropped } => {
                    last_rtt = Some(took);
                    if let Some((sent, l)) = session.lease() {
                        fence.renewed(t0 + sent, l);
                        if !lease_warned && protocol::lease_too_short(l, cfg.heartbeat, cfg.grace) {
                            lease_warned = true;
                            eprintln!(
                                "lattice-agent {}: warning: the control plane's lease ({:.0} s) does not cover this agent's stop grace ({:.0} s) and two heartbeats: a leader election will stop running work. Raise agents.heartbeat_timeout/agents.grace or lower --grace",
                                cfg.node,
                                l.as_secs_f64(),
                                cfg.grace.as_secs_f64()
                            );
                        }
                        // Kept beside the state file: a restarted agent still fences on time.
                        if let Some(path) = &cfg.state_file {
                            let ago = t0.elapsed().saturating_sub(sent).as_millis() as u64;
                            let sent_ms = crate::runner::wall_ms().saturating_sub(ago);
                            let text = serde_json::json!({"sent_ms": sent_ms, "lease_ms": l.as_millis() as u64});
                            let _ = std::fs::write(path.with_extension("lease"), text.to_string());
                        }
                    }
                    if replayed > 0 {
                        eprintln!(
                            "lattice-agent {}: control plane back; replayed {replayed} buffered heartbeats ({dropped} dropped)",
                            cfg.node
                        );
                    }
                }
                Beaten::Buffered { first: true } => eprintln!(
                    "lattice-agent {}: control plane unreachable, buffering heartbeats: {}",
                    cfg.node,
                    answer.err().map(|e| e.to_string()).unwrap_or_default()
                ),
                Beaten::Buffered { first: false } | Beaten::Unregistered => {}
                Beaten::Refused => eprintln!(
                    "lattice-agent {}: heartbeat: {}",
                    cfg.node,
                    answer.err().map(|e| e.to_string()).unwrap_or_default()
                ),
            }
        }
        // Collect ended processes.
        let ended: Vec<String> = procs
            .iter()
            .filter(|(_, r)| r.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for id in ended {
            let r = procs.remove(&id).expect("listed");
            let rec = r.record.clone();
            let out = r.wait();
            // Its container (and bundle) go with it.
            if let Some(c) = &rec.container {
                crate::oci::ContainerRuntime::cleanup(&cfg.oci, c);
            }
            // Stopped (cancelled, preempted, its walltime, fenced): its task launches' ranks stop
            // too. Ended by itself: they run on until the control plane says the allocation ended.
            match out.ending {
                Ending::Exited(_) => tasks.alloc_process_ended(&id),
                _ => tasks.alloc_ended(&id),
            }
            flush_log(cfg, &rec);
            if let Some(dir) = cfg.scratch_dir.as_deref().and_then(|root| scratch_of(root, &id))
                && let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                eprintln!("lattice-agent {}: scratch {}: {e}", cfg.node, dir.display());
            }
            // A follower still gets what it wrote after the last poll (then the store has it all),
            // and before the exit: the exit is held until the poll that carries that output.
            let mut had_final = false;
            for ((t, stream), from) in tailing.iter().filter(|((t, _), _)| *t == id) {
                if let Some(o) = new_output((t, *stream), &rec, *from).filter(|o| o.next > o.offset) {
                    last_output.push(o);
                    had_final = true;
                }
            }
            let mut report = |session: &mut Session, x: Exit| {
                if had_final {
                    held_exits.push(x);
                } else {
                    session.ended(x);
                }
            };
            tailing.retain(|(t, _), _| *t != id);
            if let Some((c, _)) = channels.remove(&id) {
                c.remove();
            }
            let tail = (tail_of(&out.output), tail_of(&out.errors));
            let code = match out.ending {
                Ending::Exited(code) => code,
                _ => 143,
            };
            fence.forget(&id);
            probes.forget(&id);
            let exit = |kind, code, (tail, err_tail): (String, String)| Exit {
                id: id.clone(),
                kind,
                code,
                tail,
                err_tail,
            };
            if fence.take_fenced(&id) {
                report(&mut session, exit(ExitKind::Fenced, code, tail));
                continue;
            }
            // Stopped by its liveness probe: said on its stderr too.
            if let Some(why) = probes.take_failed(&id) {
                eprintln!("lattice-agent {}: {id}: {why}", cfg.node);
                let (out, err) = tail;
                let err = format!(
                    "{err}{}lattice: {why}\n",
                    if err.is_empty() || err.ends_with('\n') {
                        ""
                    } else {
                        "\n"
                    }
                );
                report(&mut session, exit(ExitKind::Liveness, code, (out, err)));
                continue;
            }
            // A preempted task: reported as stopped with or without its checkpoint (also when it
            // exited by itself once its checkpoint was written, as signal handlers often do).
            let checkpointing = in_flight.contains_key(&id);
            let preempted = match (stopping.remove(&id), in_flight.remove(&id)) {
                (Some(done), _) => Some(done),
                (None, Some(f)) if f.preempt => Some(false),
                _ => None,
            };
            if let Some(done) = preempted {
                let kind = if done {
                    ExitKind::Checkpointed
                } else {
                    ExitKind::Preempted
                };
                report(&mut session, exit(kind, code, tail));
                continue;
            }
            match out.ending {
                Ending::Exited(code) => report(&mut session, exit(ExitKind::Exited, code, tail)),
                Ending::Walltime if checkpointing => {
                    report(&mut session, exit(ExitKind::WalltimeCheckpoint, 137, tail))
                }
                Ending::Walltime => report(&mut session, exit(ExitKind::Walltime, 137, tail)),
                // Stopped on the control plane's request: it already knows.
                Ending::Stopped => {}
            }
        }
        for e in session.unreported().to_vec() {
            let answer = client.send(session.target(), &protocol::exit(&cfg.node, &e));
            if let Err(err) = &answer {
                // During a partition (already said once) the retries are quiet.
                if err.failure() != Failure::Elsewhere || !session.partitioned() {
                    eprintln!("lattice-agent {}: report {}: {err}", cfg.node, e.id);
                }
            }
            session.exit_answered(&e.id, answer.map(|_| ()).map_err(|e| e.failure()));
        }
        let running: Vec<String> = procs.keys().cloned().collect();
        // New output of the allocations someone follows.
        let mut output: Vec<crate::client::Output> = tailing
            .iter()
            .filter_map(|((id, stream), from)| new_output((id, *stream), &procs.get(id)?.record, *from))
            .filter(|o| o.next > o.offset)
            .collect();
        output.append(&mut last_output);
        while let Ok(o) = wiped_rx.try_recv() {
            reports.wiped.push(o);
        }
        // What runs first, then what ended (a launch is listed ended before it stops being listed
        // running): every launch handed here is in one or the other.
        reports.tasks_running = tasks.running();
        // The cache's contents, when they changed since the last report.
        if let Some(c) = &images {
            let now: Vec<crate::client::CachedImage> = c
                .entries()
                .iter()
                .map(|(file, e)| crate::client::CachedImage {
                    file: file.clone(),
                    size: e.size,
                    last_used_ms: e.last_used_ms,
                    sticky: e.sticky,
                })
                .collect();
            if reported_cache.as_ref() != Some(&now) {
                reports.cache = Some(now);
            }
        }
        reports.task_ends.extend(tasks.take_ended());
        let answer = client
            .send(
                session.target(),
                &protocol::work(&cfg.node, &running, &output, &reports),
            )
            .and_then(|v| {
                protocol::parse_work(v).map_err(|message| crate::client::ClientError::Transport {
                    url: format!("/v1/nodes/{}/work", cfg.node),
                    message,
                })
            });
        if let Err(e) = &answer
            && (e.failure() != Failure::Elsewhere || !session.partitioned())
        {
            eprintln!("lattice-agent {}: work: {e}", cfg.node);
        }
        // The final output went out with this poll: their exits follow (reported next round, also
        // when the poll failed — an exit is never held back for long).
        for x in held_exits.drain(..) {
            session.ended(x);
        }
        if let Some(w) = session.work_answered(answer.map_err(|e| e.failure()), |id| procs.contains_key(id)) {
            if let Some(c) = reports.cache.take() {
                reported_cache = Some(c);
            }
            reports = Reports::default();
            // The conformance fingerprint is recomputed every `fingerprint_every` and when the
            // control plane asks; a new value (or a request) is reported by registering again.
            if w.refresh_fingerprint || last_fingerprint.elapsed() >= cfg.fingerprint_every {
                last_fingerprint = Instant::now();
                let (c, f) = discover(&sources, telemetry.gpu());
                if f != fp {
                    eprintln!(
                        "lattice-agent {}: conformance fingerprint changed: {fp} -> {f}",
                        cfg.node
                    );
                }
                if f != fp || w.refresh_fingerprint {
                    session.register_again();
                }
                (caps, fp) = (c, f);
            }
            for o in &output {
                tailing.insert((o.id.clone(), o.stream), Some(o.next));
            }
            tailing.retain(|(id, _), _| w.tail.contains(id));
            for id in &w.tail {
                for stream in Stream::BOTH {
                    tailing.entry((id.clone(), stream)).or_insert(None);
                }
            }
            for id in w.kill {
                if let Some(p) = procs.get(&id) {
                    p.stop();
                }
            }
            for id in w.checkpoint {
                let Some(p) = procs.get(&id) else { continue };
                request_checkpoint(&cfg.node, &id, p, &mut channels, cfg.callback, &grpc_done_tx);
                in_flight.entry(id).or_insert(InFlight {
                    until: Instant::now() + cfg.callback.deadline,
                    preempt: false,
                });
            }
            for pw in w.preempt {
                let Some(p) = procs.get(&pw.id) else { continue };
                if stopping.contains_key(&pw.id) || in_flight.get(&pw.id).is_some_and(|f| f.preempt) {
                    continue;
                }
                eprintln!("lattice-agent {}: {} preempted ({})", cfg.node, pw.id, pw.how);
                if pw.how == "checkpoint" {
                    // Checkpoint first (a hint already in flight counts), then stop.
                    if !in_flight.contains_key(&pw.id) {
                        request_checkpoint(&cfg.node, &pw.id, p, &mut channels, cfg.callback, &grpc_done_tx);
                    }
                    in_flight.insert(
                        pw.id,
                        InFlight {
                            until: Instant::now() + Duration::from_secs_f64(pw.deadline_s.max(0.0)),
                            preempt: true,
                        },
                    );
                } else {
                    p.stop();
                    stopping.insert(pw.id, false);
                }
            }
            for id in w.wipe {
                let (tx, node, command) = (wiped_tx.clone(), cfg.node.clone(), cfg.wipe_command.clone());
                std::thread::spawn(move || {
                    let ok = wipe(&node, &id, command.as_deref());
                    let _ = tx.send(Outcome { id, ok });
                });
            }
            let assigned = Instant::now();
            for l in w.launch {
                // Its software environment first: a uenv that cannot be pulled or read is a prologue
                // failure (the control plane retries it on other nodes), the reason as its output.
                let mut mounts = Vec::new();
                let mut uenv_env = Vec::new();
                if let Some(u) = &l.uenv {
                    // Images mounted by what runs here (also what a restart took over) stay.
                    let pinned: std::collections::BTreeSet<String> =
                        procs.values().filter_map(|r| r.record.image.clone()).collect();
                    let cache = images.get_or_insert_with(|| crate::uenv::open_cache(&cfg.uenv));
                    match crate::uenv::prepare(&cfg.uenv, cache, &pinned, u, l.uenv_view.as_deref()) {
                        Ok(p) => {
                            mounts.push(runner::Mount::Squashfs {
                                image: p.image,
                                at: cfg.uenv.mount_point.clone(),
                            });
                            uenv_env = p.env;
                        }
                        Err(e) => {
                            prologue_failed(&cfg.node, &mut session, &l.id, &e.to_string());
                            continue;
                        }
                    }
                }
                // Its data: declared mounts and the defaults (a source this node cannot provide is
                // a prologue failure too).
                let data = crate::data::plan(
                    &cfg.data_roots,
                    &crate::data::Request {
                        alloc: &l.id,
                        tenant: &l.tenant,
                        project: l.project.as_deref(),
                        user: l.user.as_deref(),
                        mounts: &l.mounts,
                        defaults: l.data_defaults,
                        checkpoints: l.checkpoints,
                    },
                );
                let data = match data {
                    Ok(d) => d,
                    Err(e) => {
                        prologue_failed(&cfg.node, &mut session, &l.id, &e.to_string());
                        continue;
                    }
                };
                let channel = open_channel(&l.id, &l.checkpoint);
                let mut env = environment(&l, cfg.slurm_env);
                env.extend(uenv_env);
                env.extend(data.env.iter().cloned());
                // The `lattice` client inside the allocation (`lattice launch`) talks to this control plane.
                if std::env::var_os("LATTICE_ENDPOINT").is_none() {
                    env.push(("LATTICE_ENDPOINT".to_string(), client.first_endpoint().to_string()));
                }
                if let Some(dir) = &compat_path {
                    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
                    env.push(("PATH".to_string(), format!("{}:{path}", dir.display())));
                }
                // `lattice-mpi-launcher` (mpirun's way to start processes without SSH) asks this
                // node's agent, presenting the allocation's token.
                if let (Some(t), Some(addr)) = (&l.launch_token, &peer_addr) {
                    env.push(("LATTICE_LAUNCH_TOKEN".to_string(), t.clone()));
                    env.push(("LATTICE_AGENT_ADDR".to_string(), addr.clone()));
                    let agents: Vec<String> = l.agents.iter().map(|(n, a)| format!("{n}={a}")).collect();
                    env.push(("LATTICE_AGENTS".to_string(), agents.join(",")));
                    if let Some(launcher) = &cfg.launcher {
                        // mpirun (Hydra) starts its proxies on the allocation's nodes through the
                        // agents instead of SSH.
                        env.push(("HYDRA_LAUNCHER".to_string(), "ssh".to_string()));
                        env.push(("HYDRA_LAUNCHER_EXEC".to_string(), launcher.display().to_string()));
                    }
                }
                // A fresh scratch directory (a requeued run on this node does not see the last one's).
                if let Some(dir) = cfg.scratch_dir.as_deref().and_then(|root| scratch_of(root, &l.id)) {
                    let _ = std::fs::remove_dir_all(&dir);
                    match std::fs::create_dir_all(&dir) {
                        Ok(()) => {
                            let d = dir.display().to_string();
                            env.push(("LATTICE_SCRATCH".to_string(), d.clone()));
                            env.push(("TMPDIR".to_string(), d));
                            // mpirun's hosts: the allocation's nodes.
                            if cfg.launcher.is_some() && l.launch_token.is_some() && peer_addr.is_some() {
                                let hosts = dir.join(".lattice-hosts");
                                if std::fs::write(&hosts, l.nodes.join("\n") + "\n").is_ok() {
                                    env.push(("HYDRA_HOST_FILE".to_string(), hosts.display().to_string()));
                                }
                            }
                        }
                        Err(e) => eprintln!("lattice-agent {}: scratch {}: {e}", cfg.node, dir.display()),
                    }
                }
                if let Some(c) = &channel {
                    env.extend(c.env());
                }
                // An OCI image: the wrapper runs the container (a prologue failure when it cannot be
                // prepared: retried on other nodes).
                let mut entrypoint = l.entrypoint.clone();
                let mut container = None;
                if let Some(image) = &l.image {
                    // Scratch at its own path, the data mounts at their targets.
                    let mut binds: Vec<crate::data::Bind> = cfg
                        .scratch_dir
                        .as_deref()
                        .and_then(|root| scratch_of(root, &l.id))
                        .filter(|d| d.is_dir())
                        .map(|d| crate::data::Bind {
                            from: d.clone(),
                            at: d,
                            read_only: false,
                        })
                        .into_iter()
                        .collect();
                    binds.extend(data.binds.iter().cloned());
                    match crate::oci::ContainerRuntime::prepare(&cfg.oci, &l.id, image, &l.entrypoint, &env, &binds) {
                        Ok(p) => {
                            entrypoint = p.command;
                            container = Some(p.container);
                        }
                        Err(e) => {
                            if let Some(c) = channel {
                                c.remove();
                            }
                            prologue_failed(&cfg.node, &mut session, &l.id, &e.to_string());
                            continue;
                        }
                    }
                }
                let spec = RunSpec {
                    id: l.id.clone(),
                    entrypoint,
                    env,
                    checkpoint: l.checkpoint.clone(),
                    tenant: l.tenant.clone(),
                    project: l.project.clone(),
                    walltime: l.walltime_s.map(Duration::from_secs_f64),
                    grace: cfg.grace,
                    log_dir: cfg.log_dir.clone(),
                    ring_bytes: cfg.ring_bytes,
                    // In a container the data mounts are the container's.
                    mounts: if container.is_some() {
                        mounts
                    } else {
                        mounts.extend(data.binds.iter().map(|b| runner::Mount::Bind {
                            from: b.from.clone(),
                            at: b.at.clone(),
                            read_only: b.read_only,
                        }));
                        mounts
                    },
                };
                let task_env = spec.env.clone();
                match runner::start(spec) {
                    Ok(mut r) => {
                        r.record.launch_token = l.launch_token.clone();
                        r.record.container = container;
                        r.record.liveness = l.liveness_probe.clone();
                        if let Some(spec) = &l.liveness_probe {
                            probes.watch(&l.id, spec.clone(), "127.0.0.1".into(), r.stopper(), Duration::ZERO);
                        }
                        tasks.alloc_started(
                            &l.id,
                            crate::tasks::AllocInfo {
                                env: task_env,
                                pid: r.pid,
                                mounted: r.record.has_namespace(),
                                token: l.launch_token.clone(),
                            },
                        );
                        fence.watch(&l.id, r.stopper());
                        reports.startups.push(crate::client::Startup {
                            id: l.id.clone(),
                            seconds: assigned.elapsed().as_secs_f64(),
                        });
                        procs.insert(l.id.clone(), r);
                        if let Some(c) = channel {
                            channels.insert(l.id.clone(), (c, false));
                        }
                    }
                    // Could not even start: a failure, reported like any other.
                    Err(e) => {
                        eprintln!("lattice-agent {}: start {}: {e}", cfg.node, l.id);
                        session.ended(Exit {
                            id: l.id.clone(),
                            kind: ExitKind::Exited,
                            code: 127,
                            tail: String::new(),
                            err_tail: format!("could not start: {e}"),
                        });
                    }
                }
            }
            // Task launches within the allocations running here (after their allocations started).
            // Image cache orders (pulls run here, like a uenv allocation's).
            for o in w.cache {
                let pinned: std::collections::BTreeSet<String> =
                    procs.values().filter_map(|r| r.record.image.clone()).collect();
                let cache = images.get_or_insert_with(|| crate::uenv::open_cache(&cfg.uenv));
                let result = cache_order(&cfg.uenv, cache, &pinned, &o);
                if let Err(e) = &result {
                    eprintln!("lattice-agent {}: cache {} {}: {e}", cfg.node, o.op, o.image);
                }
                reports.cache_done.push(crate::client::CacheOutcome {
                    op: o.op.clone(),
                    image: o.image.clone(),
                    ok: result.is_ok(),
                    detail: result.err().unwrap_or_default(),
                });
            }
            for id in w.stop_tasks {
                tasks.stop(&id, "the launch ended at the control plane");
            }
            for t in w.tasks {
                tasks.start(t);
            }
        }
        if cfg.log_store.is_some() && last_flush.elapsed() >= cfg.log_flush {
            last_flush = Instant::now();
            for r in procs.values() {
                flush_log(cfg, &r.record);
            }
        }
        // Checkpoints in flight: completed (shmem "done", the gRPC answer, or the sentinel file), or
        // past their deadline. A hint's outcome goes to the control plane; a preempted task is
        // stopped now, and reported with whether its checkpoint completed once it has ended.
        let answered: Vec<String> = grpc_done.try_iter().collect();
        let settled: Vec<(String, bool)> = in_flight
            .iter()
            .filter_map(|(id, f)| {
                let done = answered.contains(id)
                    || channels
                        .get(id)
                        .is_some_and(|(c, _)| (c.mechanism == Mechanism::Shmem && c.take_done()) || c.take_sentinel());
                (done || Instant::now() >= f.until).then(|| (id.clone(), done))
            })
            .collect();
        for (id, done) in settled {
            let f = in_flight.remove(&id).expect("listed");
            eprintln!(
                "lattice-agent {}: {id} checkpoint {}",
                cfg.node,
                if done { "written" } else { "not written in time" }
            );
            if f.preempt {
                if let Some(p) = procs.get(&id) {
                    p.stop();
                    stopping.insert(id, done);
                }
            } else {
                reports.checkpointed.push(Outcome { id, ok: done });
            }
        }
        if last_push.elapsed() >= cfg.telemetry.period() {
            last_push = Instant::now();
            let groups: BTreeMap<String, u32> = procs.iter().map(|(id, r)| (id.clone(), r.pid)).collect();
            // What collecting costs: this thread's CPU time for the tick, over the period.
            let cpu0 = crate::telemetry::thread_cpu_ns();
            let mut tick = telemetry.tick(&cfg.node, std::path::Path::new("/proc"), &groups);
            let spent = crate::telemetry::thread_cpu_ns().saturating_sub(cpu0);
            reports.collection_overhead_pct =
                Some(spent as f64 / cfg.telemetry.period().as_nanos().max(1) as f64 * 100.0);
            if let Some(c) = &images {
                tick.series
                    .extend(crate::telemetry::cache_series(&cfg.node, &c.stats, c.used()));
            }
            // Scaling metrics for reactive allocations: built-in ones and those the tasks report.
            let at = Instant::now();
            let cores = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
            let mut metrics: Vec<crate::client::Metric> =
                crate::telemetry::scaling_metrics(&tick, at, cores, &mut cpu_seen)
                    .into_iter()
                    .map(|(id, name, value)| crate::client::Metric {
                        id,
                        name: name.to_string(),
                        value,
                    })
                    .collect();
            for (id, (c, _)) in &channels {
                for (name, value) in c.app_metrics() {
                    metrics.push(crate::client::Metric {
                        id: id.clone(),
                        name,
                        value,
                    });
                }
            }
            // Only the newest samples matter: an unreachable control plane does not pile them up.
            reports.metrics = metrics;
            for a in &tick.new_alerts {
                eprintln!("lattice-agent {}: alert: {a}", cfg.node);
            }
            if let Some(url) = &cfg.remote_write {
                let req = crate::remote_write::request(&tick.series, crate::runner::wall_ms() as i64);
                if let Err(e) = client.remote_write(url, crate::remote_write::encode(&req)) {
                    eprintln!("lattice-agent {}: remote write: {e}", cfg.node);
                }
            }
            if let Some(url) = &cfg.metrics_push
                && let Err(e) = client.push_metrics(url, &crate::telemetry::render(&tick.series))
            {
                eprintln!("lattice-agent {}: metrics push: {e}", cfg.node);
            }
        }
        if let Some(path) = &cfg.state_file
            && session.unreported() != recorded_exits.as_slice()
        {
            let exits = path.with_extension("exits");
            match write_json(&exits, session.unreported()) {
                Ok(()) => recorded_exits = session.unreported().to_vec(),
                Err(e) => eprintln!("lattice-agent {}: exits file {}: {e}", cfg.node, exits.display()),
            }
        }
        if let Some(path) = &cfg.state_file {
            let now: Vec<String> = procs.keys().cloned().collect();
            if now != recorded {
                let records: Vec<runner::Record> = procs.values().map(|r| r.record.clone()).collect();
                match write_state(path, &records) {
                    Ok(()) => recorded = now,
                    Err(e) => eprintln!("lattice-agent {}: state file {}: {e}", cfg.node, path.display()),
                }
            }
        }
        std::thread::sleep(cfg.poll);
    }
    // Stopping the agent does not stop its jobs (systemd KillMode=process): a restarted agent takes
    // them over from the state file. Without one, nothing could, so they are stopped.
    if cfg.state_file.is_some() {
        return Ok(());
    }
    for p in procs.values() {
        p.stop();
    }
    for (_, p) in procs {
        let _ = p.wait();
    }
    Ok(())
}

/// Asks `id`'s task to checkpoint by its mechanism (its completion is watched by the caller): a shmem
/// flag, the gRPC callback (on its own thread; `answered` gets the id when the application completed),
/// or SIGUSR1 — the fallback of the others.
fn request_checkpoint(
    node: &str,
    id: &str,
    p: &runner::Running,
    channels: &mut BTreeMap<String, (Channel, bool)>,
    t: crate::checkpoint::CallbackTimeouts,
    answered: &std::sync::mpsc::Sender<String>,
) {
    if let Some((c, _)) = channels.get(id) {
        c.clear_sentinel();
    }
    match channels.get_mut(id) {
        Some((c, pending)) if c.mechanism == Mechanism::Shmem => match c.request() {
            Ok(()) => *pending = true,
            Err(e) => {
                eprintln!("lattice-agent {node}: shmem hint to {id}: {e}; signalling");
                p.signal(libc::SIGUSR1);
            }
        },
        Some((c, _)) if c.mechanism == Mechanism::Grpc => {
            let (c, pgid, node, tx) = (c.clone(), p.pid, node.to_string(), answered.clone());
            std::thread::spawn(move || match crate::checkpoint::deliver_grpc(&c, pgid, t) {
                GrpcResult::Completed { deferred_s, updates } => {
                    eprintln!(
                        "lattice-agent {node}: {} checkpointed over its callback (deferred {deferred_s} s, {updates} updates)",
                        c.alloc
                    );
                    let _ = tx.send(c.alloc.clone());
                }
                GrpcResult::FellBack(why) => {
                    eprintln!("lattice-agent {node}: {}: {why}; sent SIGUSR1 instead", c.alloc)
                }
            });
        }
        _ => p.signal(libc::SIGUSR1),
    }
}

/// An allocation that could not be prepared here (its uenv or OCI image): a prologue failure, the
/// reason as its output (the control plane retries it on other nodes).
fn prologue_failed(node: &str, session: &mut Session, id: &str, why: &str) {
    eprintln!("lattice-agent {node}: start {id}: {why}");
    session.ended(Exit {
        id: id.to_string(),
        kind: ExitKind::Prologue,
        code: 127,
        tail: String::new(),
        err_tail: why.to_string(),
    });
}

/// Carries out an image cache order: `warm` pulls the uenv into the cache (verified; `sticky` marks it
/// never to be evicted), `evict` removes it unless a running allocation has it mounted.
fn cache_order(
    cfg: &crate::uenv::UenvConfig,
    cache: &mut crate::cache::ImageCache,
    pinned: &std::collections::BTreeSet<String>,
    o: &crate::client::CacheOrder,
) -> Result<(), String> {
    let (_, file) = crate::uenv::layout(&o.image).map_err(|e| e.to_string())?;
    match o.op.as_str() {
        "warm" => {
            crate::uenv::pull(cfg, cache, pinned, &o.image, runner::wall_ms()).map_err(|e| e.to_string())?;
            if o.sticky {
                cache.set_sticky(&file, true);
            }
            Ok(())
        }
        "evict" if pinned.contains(&file) => Err(format!("{} is mounted by a running allocation", o.image)),
        "evict" if !cache.entries().contains_key(&file) => Err(format!("{} is not cached here", o.image)),
        "evict" => {
            cache.evict(&file, pinned);
            Ok(())
        }
        other => Err(format!("unknown cache order {other:?}")),
    }
}

/// Runs the site's wipe command for a released claim's node; whether it succeeded.
fn wipe(node: &str, alloc: &str, command: Option<&str>) -> bool {
    let Some(command) = command else {
        eprintln!("lattice-agent {node}: wipe after {alloc}: no --wipe-command configured; the node is quarantined");
        return false;
    };
    match std::process::Command::new("sh")
        .args(["-c", command])
        .env("LATTICE_ALLOC_ID", alloc)
        .env("LATTICE_NODE", node)
        .status()
    {
        Ok(st) if st.success() => {
            eprintln!("lattice-agent {node}: wiped after {alloc}");
            true
        }
        Ok(st) => {
            eprintln!("lattice-agent {node}: wipe after {alloc} failed ({st})");
            false
        }
        Err(e) => {
            eprintln!("lattice-agent {node}: wipe after {alloc}: {e}");
            false
        }
    }
}

/// Flushes a process's stdout and stderr to the log store (errors are reported, never fatal: the log
/// files stay).
fn flush_log(cfg: &AgentConfig, rec: &runner::Record) {
    let Some(store) = &cfg.log_store else { return };
    for stream in Stream::BOTH {
        let src = lattice_node_adapters::logstore::Source {
            tenant: &rec.tenant,
            project: rec.project.as_deref(),
            alloc: &rec.id,
            node: &cfg.node,
            stream,
        };
        if let Err(e) = store.flush(&src, &stream_log(rec, stream), runner::wall_ms()) {
            eprintln!("lattice-agent {}: log store: {e}", cfg.node);
        }
    }
}

/// The file a process's `stream` goes to.
fn stream_log(rec: &runner::Record, stream: Stream) -> std::path::PathBuf {
    match stream {
        Stream::Stdout => rec.log.clone(),
        Stream::Stderr => rec.err_log(),
    }
}

/// The output of `stream` after `from` (a new follower: the newest [`TAIL_REPLAY`] bytes), at most
/// [`TAIL_BYTES_PER_POLL`].
fn new_output((id, stream): (&str, Stream), rec: &runner::Record, from: Option<u64>) -> Option<crate::client::Output> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(stream_log(rec, stream)).ok()?;
    let len = f.metadata().ok()?.len();
    let offset = from.unwrap_or(len.saturating_sub(TAIL_REPLAY)).min(len);
    let n = (len - offset).min(TAIL_BYTES_PER_POLL);
    let mut buf = vec![0u8; n as usize];
    f.seek(SeekFrom::Start(offset)).ok()?;
    f.read_exact(&mut buf).ok()?;
    Some(crate::client::Output {
        id: id.to_string(),
        stream,
        offset,
        next: offset + n,
        data: String::from_utf8_lossy(&buf).into_owned(),
    })
}

/// The node's capabilities and conformance fingerprint (the GPU driver from the GPU provider).
pub fn discover(sources: &Sources, gpu: &dyn crate::gpu::GpuProvider) -> (Capabilities, String) {
    let mut caps: Capabilities = sources.capabilities();
    let mut components = sources.components();
    let (gpus, model, driver) = crate::gpu::summary(gpu);
    caps.gpu_count = gpus;
    caps.gpu_model = model;
    if let Some(d) = driver {
        components.insert("gpu_driver".into(), d);
    }
    (caps, fingerprint(&components))
}

/// The newest 64 KiB of an output, as text (invalid UTF-8 replaced).
fn tail_of(out: &[u8]) -> String {
    let from = out.len().saturating_sub(64 * 1024);
    String::from_utf8_lossy(&out[from..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_a_directory_per_plain_id_only() {
        let root = std::path::Path::new("/scratch/local");
        assert_eq!(scratch_of(root, "a-000007"), Some(root.join("a-000007")));
        assert_eq!(scratch_of(root, "a-000007[3]"), Some(root.join("a-000007[3]")));
        for bad in ["", ".", "..", "../etc", "a/b", "a\\b"] {
            assert_eq!(scratch_of(root, bad), None, "{bad}");
        }
    }

    #[test]
    fn the_environment_names_the_allocation_its_nodes_and_the_task() {
        let l = Launch {
            id: "a-000007".into(),
            entrypoint: "hostname".into(),
            nodes: vec!["n1".into(), "n2".into()],
            task_index: 1,
            walltime_s: Some(60.0),
            tenant: "physics".into(),
            user: None,
            project: None,
            checkpoint: "signal".into(),
            vni: Some(1042),
            cxi_auth_key: Some("k-1".into()),
            restart_from_s: None,
            task_group: None,
            uenv: None,
            uenv_view: None,
            launch_token: None,
            agents: Default::default(),
            image: None,
            mounts: Vec::new(),
            data_defaults: true,
            checkpoints: false,
            liveness_probe: None,
        };
        let env: BTreeMap<String, String> = environment(&l, true).into_iter().collect();
        assert_eq!(env["LATTICE_ALLOC_ID"], "a-000007");
        assert_eq!(env["LATTICE_NODELIST"], "n1,n2");
        assert_eq!(env["LATTICE_NNODES"], "2");
        assert_eq!(env["LATTICE_TASK_INDEX"], "1");
        assert_eq!(env["SLURM_JOB_NUM_NODES"], "2");
        assert_eq!(
            (env["LATTICE_VNI"].as_str(), env["SLINGSHOT_VNIS"].as_str()),
            ("1042", "1042")
        );
        assert_eq!(env["FI_CXI_AUTH_KEY"], "k-1");
        assert!(!environment(&l, false).iter().any(|(k, _)| k.starts_with("SLURM_")));
        // A first run has no restart point; a requeued one resumes from its checkpoint's work.
        assert!(!env.contains_key("LATTICE_RESTART_FROM"));
        let again = Launch {
            restart_from_s: Some(600.0),
            ..l
        };
        let env: BTreeMap<String, String> = environment(&again, false).into_iter().collect();
        assert_eq!(env["LATTICE_RESTART_FROM"], "600.000");
        assert!(!env.contains_key("LATTICE_TASK_GROUP_ID"));
        // A task group element: its index, not the node's place, is the task index.
        let element = Launch {
            id: "a-000009[3]".into(),
            task_group: Some(crate::client::TaskGroup {
                group: "a-000009".into(),
                index: 3,
                concurrency: None,
            }),
            ..again
        };
        let env: BTreeMap<String, String> = environment(&element, true).into_iter().collect();
        assert_eq!(env["LATTICE_TASK_INDEX"], "3");
        assert_eq!(env["LATTICE_NODEID"], "1");
        assert_eq!(env["LATTICE_TASK_GROUP_ID"], "a-000009");
        assert_eq!(
            (env["SLURM_ARRAY_TASK_ID"].as_str(), env["SLURM_ARRAY_JOB_ID"].as_str()),
            ("3", "a-000009")
        );
    }
}
