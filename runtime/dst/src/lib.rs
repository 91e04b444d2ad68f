//! `lattice-dst`: deterministic simulation testing of the control plane. Three (or five)
//! real quorum members — `server::start_wired`, so the real openraft state machine and redb store
//! (on a [`SimDisk`]), the queue mirror, the controller and the runtime's simulated agents — and
//! clients speaking the gRPC API run in one process on [turmoil]'s simulated network and clock,
//! driven step by step from a seed. Faults are injected on a seeded schedule; safety is checked
//! after every step; liveness once the faults heal. Same seed, same event log, same digest.
//!
//! Why turmoil and not madsim: turmoil simulates hosts, TCP and time on top of the ordinary tokio
//! runtime, so tonic, axum, hyper and openraft run unmodified (the runtime only needed seams for
//! its listeners, its dialer, its disk and its clock: [`lattice_runtime::server::Wiring`]). madsim replaces
//! tokio and tonic with its own crates under a `--cfg madsim` build of the whole dependency tree,
//! which openraft and axum do not support without patches. turmoil does not simulate disks or
//! randomness: the disk is [`SimDisk`] (durable vs. written), and openraft's one source of
//! randomness, the election timeout, is pinned per member from the seed.
//!
//! A crate of its own beside `lattice-runtime`: the runtime knows only its seams (listeners behind
//! `listen::Acceptor`, a dialer, a disk, a clock and the test-only [`Bugs`]), so the production
//! binary links neither turmoil nor the simulated hosts.

pub mod agents;
pub mod check;
pub mod client;
pub mod net;
pub mod obs;

use lattice_adapters::disk::{Disk, SimDisk};
pub use lattice_runtime::faults::Bugs;
use lattice_runtime::server::{Listen, Wiring};
use obs::{EPOCH_MS, GRPC_PORT, REST_PORT, host_name};
pub use obs::{LIVENESS_BOUND, NODES, Obs, QUOTA_NODES, QUOTA_TENANT, SharedObs, TICK, lock};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the simulated users do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Workload {
    /// Two gRPC clients submitting (with idempotency keys) and cancelling; a REST client submitting
    /// DAGs (retried under their id) and cancelling them; without agent hosts, a claimant of
    /// sensitive nodes; with agent hosts, an operator draining and
    /// undraining nodes.
    #[default]
    Full,
    /// The two gRPC clients only (the workload the earliest regression seeds were found with).
    Basic,
}

impl Workload {
    pub fn parse(name: &str) -> Result<Workload, String> {
        match name {
            "full" => Ok(Workload::Full),
            "basic" => Ok(Workload::Basic),
            other => Err(format!("--workload: unknown `{other}` (known: full, basic)")),
        }
    }
}

/// The faults the schedule may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// A symmetric partition of the members into a minority and a majority.
    Partition,
    /// One direction of one link between two members cut.
    Asymmetric,
    /// The leader cut off from the other members.
    IsolateLeader,
    /// Links lose messages (connections break mid-stream) at random.
    Loss,
    /// Messages take up to 300 ms (reordering across connections).
    Delay,
    /// A member's process dies (its disk stays) and restarts later.
    Crash,
    /// A member loses power: what it wrote but never synced is gone too.
    PowerLoss,
    /// Every member crashes at once, and the quorum restarts.
    ClusterCrash,
    /// A member's wall clock jumps (an hour either way), then it restarts on it.
    ClockJump,
    /// An agent cut off from every member (its work keeps running; past its lease it fences it).
    IsolateAgent,
    /// An agent's process dies and restarts (its processes keep running; it takes them over).
    AgentCrash,
    /// An agent's links take up to a second per message.
    SlowAgent,
}

pub const ALL_FAULTS: [Fault; 12] = [
    Fault::Partition,
    Fault::Asymmetric,
    Fault::IsolateLeader,
    Fault::Loss,
    Fault::Delay,
    Fault::Crash,
    Fault::PowerLoss,
    Fault::ClusterCrash,
    Fault::ClockJump,
    Fault::IsolateAgent,
    Fault::AgentCrash,
    Fault::SlowAgent,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Partition => "partition",
            Fault::Asymmetric => "asymmetric",
            Fault::IsolateLeader => "isolate-leader",
            Fault::Loss => "loss",
            Fault::Delay => "delay",
            Fault::Crash => "crash",
            Fault::PowerLoss => "power-loss",
            Fault::ClusterCrash => "cluster-crash",
            Fault::ClockJump => "clock-jump",
            Fault::IsolateAgent => "isolate-agent",
            Fault::AgentCrash => "agent-crash",
            Fault::SlowAgent => "slow-agent",
        }
    }
}

/// `--faults`: `all`, `none`, or a comma-separated list of fault names.
pub fn parse_faults(list: &str) -> Result<Vec<Fault>, String> {
    match list.trim() {
        "all" => return Ok(ALL_FAULTS.to_vec()),
        "none" | "" => return Ok(Vec::new()),
        _ => {}
    }
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim) {
        let f = ALL_FAULTS.iter().find(|f| f.name() == name).ok_or_else(|| {
            let known: Vec<&str> = ALL_FAULTS.iter().map(|f| f.name()).collect();
            format!(
                "--faults: unknown fault `{name}` (known: all, none, {})",
                known.join(", ")
            )
        })?;
        if !out.contains(f) {
            out.push(*f);
        }
    }
    out.sort();
    Ok(out)
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub seeds: u64,
    pub seed: u64,
    /// Steps of the faulty phase (10 ms of simulated time each); the healed phase follows.
    pub steps: u64,
    pub faults: Vec<Fault>,
    pub members: u64,
    /// Node agents as simulated hosts speaking the agent protocol (one node each); 0: the
    /// runtime's own simulated agents run the work.
    pub agents: usize,
    pub workload: Workload,
    pub bugs: Bugs,
    /// Seeds run in parallel on this many threads (each simulation is single-threaded).
    pub threads: usize,
    /// Keep each seed's event log in its report.
    pub keep_log: bool,
    /// Start no new seed after the first failure.
    pub fail_fast: bool,
}

impl Options {
    /// The command line that replays one seed.
    pub fn reproducer(&self, seed: u64) -> String {
        let faults: Vec<&str> = self.faults.iter().map(|f| f.name()).collect();
        let faults = if faults.is_empty() {
            "none".into()
        } else {
            faults.join(",")
        };
        let mut cmd = format!(
            "lattice-dst --seeds 1 --seed {seed} --steps {} --faults {faults} --members {} --agents {}",
            self.steps, self.members, self.agents
        );
        if self.workload == Workload::Basic {
            cmd.push_str(" --workload basic");
        }
        if let Some(bug) = self.bugs.name() {
            cmd.push_str(&format!(" --bug {bug}"));
        }
        cmd
    }
}

/// One seed's outcome.
#[derive(Clone, Debug)]
pub struct SeedReport {
    pub seed: u64,
    /// SHA-256 of the seed's event log.
    pub digest: [u8; 32],
    /// The first violation (safety or liveness), with the last events before it.
    pub failure: Option<String>,
    pub acked: usize,
    pub ended: usize,
    pub faults: usize,
    pub events: usize,
    /// Simulated seconds, faulty phase and healing included.
    pub simulated_s: f64,
    /// The event log (with [`Options::keep_log`]).
    pub log: Vec<String>,
}

/// Every seed's outcome, in seed order.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seeds: Vec<SeedReport>,
}

impl Report {
    pub fn failures(&self) -> usize {
        self.seeds.iter().filter(|s| s.failure.is_some()).count()
    }

    /// SHA-256 over the seeds' digests in seed order, hex.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        for s in &self.seeds {
            h.update(s.seed.to_le_bytes());
            h.update(s.digest);
        }
        hex(&h.finalize())
    }

    /// The last line: `dst seeds=N failures=F digest=HEX`.
    pub fn last_line(&self) -> String {
        format!(
            "dst seeds={} failures={} digest={}",
            self.seeds.len(),
            self.failures(),
            self.digest()
        )
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs every seed (in parallel over `opts.threads`), reporting each as it ends through `each`.
pub fn run(opts: &Options, each: &(dyn Fn(&SeedReport) + Sync)) -> Report {
    let next = std::sync::atomic::AtomicU64::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let out = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..opts.threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= opts.seeds || (opts.fail_fast && failed.load(std::sync::atomic::Ordering::Relaxed)) {
                        return;
                    }
                    let seed = opts.seed.wrapping_add(i);
                    // A panic in the code under test (or in a library it runs) fails the seed, with
                    // its reproducer, instead of the run.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_seed(seed, opts)))
                        .unwrap_or_else(|p| {
                            let why = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "a panic".into());
                            SeedReport {
                                seed,
                                digest: [0; 32],
                                failure: Some(format!(
                                    "seed {seed}: panicked: {why}\n  reproduce: {}",
                                    opts.reproducer(seed)
                                )),
                                acked: 0,
                                ended: 0,
                                faults: 0,
                                events: 0,
                                simulated_s: 0.0,
                                log: Vec::new(),
                            }
                        });
                    if r.failure.is_some() {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    each(&r);
                    out.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                }
            });
        }
    });
    let mut seeds = out.into_inner().unwrap_or_else(|p| p.into_inner());
    seeds.sort_by_key(|s| s.seed);
    Report { seeds }
}

thread_local! {
    /// Panics on this thread since the last look: every task of a seed's simulation runs on the
    /// thread that steps it, so a panic inside a member's task (which tokio would contain, leaving
    /// the member half dead) fails the seed instead of passing unnoticed.
    static PANICS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Installs (once) a panic hook that also records each panic on its thread's list.
fn watch_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let what = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            let at = info
                .location()
                .map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
            let _ = PANICS.try_with(|p| p.borrow_mut().push(format!("{what}{at}")));
            previous(info);
        }));
    });
}

/// The panics recorded on this thread since the last call.
fn take_panics() -> Vec<String> {
    PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()))
}

/// The member's config: the site's simulated nodes and agents, a tenant with a hard quota.
fn member_config(
    i: u64,
    n: u64,
    agents: usize,
    tenants: &std::path::Path,
) -> anyhow::Result<lattice_runtime::config::RuntimeConfig> {
    let members: Vec<String> = (1..=n).map(|j| format!("  {j}: m{j}:{GRPC_PORT}")).collect();
    // Agent hosts: one node each, a 1 s heartbeat timeout and 2 s grace (a 3 s lease).
    let nodes = if agents > 0 {
        format!(
            "simulated_nodes: {agents}\nsimulate_agents: false\nagents:\n  heartbeat_timeout: 1s\n  grace: 2s\n  sensitive_grace: 2s\n"
        )
    } else {
        format!("simulated_nodes: {NODES}\n")
    };
    let text = format!(
        "node_id: {i}\nrest_listen: 0.0.0.0:{REST_PORT}\ngrpc_listen: 0.0.0.0:{GRPC_PORT}\n\
         data_dir: /dst/m{i}\nmembers:\n{}\n{nodes}tenants: {}\ncycle: 200ms\n",
        members.join("\n"),
        tenants.display()
    );
    Ok(lattice_runtime::config::RuntimeConfig::parse("dst.yaml", &text)?)
}

/// Raft timings under simulation: the defaults' heartbeat, an election timeout pinned per member
/// (openraft draws it from `thread_rng` in `[min, max)`; a one-millisecond range makes that draw
/// deterministic) and snapshots every 40 entries, keeping 5, so lagging members install snapshots.
fn raft_config(i: u64, rng: &mut ChaCha8Rng) -> lattice_adapters::openraft::Config {
    let min = 400 + 150 * (i - 1) + rng.next_u64() % 100;
    lattice_adapters::openraft::Config {
        election_timeout_min: min,
        election_timeout_max: min + 1,
        snapshot_policy: lattice_adapters::openraft::SnapshotPolicy::LogsSinceLast(40),
        max_in_snapshot_log_to_keep: 5,
        purge_batch_size: 1,
        ..lattice_adapters::raft_config()
    }
}

/// The tenants file every member reads (a hard quota for [`QUOTA_TENANT`]), written once per
/// process (seeds run in parallel read it).
fn tenants_file() -> Result<std::path::PathBuf, String> {
    static FILE: std::sync::OnceLock<Result<std::path::PathBuf, String>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lattice-dst-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("tenants.yaml");
        let text = format!("{QUOTA_TENANT}:\n  max_nodes: {QUOTA_NODES}\nphysics:\n  fair_share_target: 0.5\n");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    })
    .clone()
}

/// One seed: build the simulation, run the faulty phase with a check after every step, heal, run
/// until liveness holds (or its bound passes), digest the event log.
pub fn run_seed(seed: u64, opts: &Options) -> SeedReport {
    let n = opts.members.max(1);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let obs: SharedObs = Arc::new(Mutex::new(Obs {
        members: vec![None; n as usize],
        clock_offsets: vec![0; n as usize],
        procs: vec![BTreeMap::new(); opts.agents],
        leases: vec![None; opts.agents],
        exits: vec![Vec::new(); opts.agents],
        ..Default::default()
    }));
    let mut faults_injected = 0;
    watch_panics();
    take_panics();
    let result = (|| -> Result<(), String> {
        let tenants = tenants_file().map_err(|e| format!("harness: tenants file: {e}"))?;
        let mut sim = turmoil::Builder::new()
            .rng_seed(seed)
            .tick_duration(TICK)
            .simulation_duration(Duration::from_secs(24 * 3600))
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(5))
            .build();
        let disks: Vec<SimDisk> = (0..n).map(|_| SimDisk::new()).collect();
        for i in 1..=n {
            let cfg = member_config(i, n, opts.agents, &tenants).map_err(|e| format!("harness: config: {e:#}"))?;
            let raft = raft_config(i, &mut rng);
            let disk = disks[(i - 1) as usize].clone();
            let obs = obs.clone();
            let bugs = opts.bugs;
            sim.host(host_name(i).as_str(), move || {
                let (cfg, raft, disk, obs) = (cfg.clone(), raft.clone(), disk.clone(), obs.clone());
                async move {
                    let grpc = turmoil::net::TcpListener::bind(("0.0.0.0", GRPC_PORT)).await?;
                    let rest = turmoil::net::TcpListener::bind(("0.0.0.0", REST_PORT)).await?;
                    let offset = lock(&obs).clock_offsets[(i - 1) as usize];
                    let now = EPOCH_MS as i64 + turmoil::elapsed().as_millis() as i64 + offset;
                    let wiring = Wiring {
                        grpc: Listen::Other(Box::new(net::SimListener(grpc))),
                        rest: Listen::Other(Box::new(net::SimListener(rest))),
                        disk: Disk::Sim(disk),
                        dial: Some(net::dialer()),
                        clock: lattice_runtime::context::member_clock(now.max(0) as u64),
                        raft: Some(raft),
                        bugs,
                    };
                    let running = lattice_runtime::server::start_wired(cfg, i == 1, wiring)
                        .await
                        .map_err(|e| format!("m{i} did not start: {e:#}"))?;
                    lock(&obs).members[(i - 1) as usize] = Some(Arc::downgrade(&running.shared));
                    let _running = running;
                    std::future::pending::<()>().await;
                    Ok(())
                }
            });
        }
        for a in 0..opts.agents {
            let obs = obs.clone();
            let fence = !opts.bugs.agent_no_fence;
            sim.host(agents::host_name(a).as_str(), move || {
                agents::run(a, n, fence, obs.clone())
            });
        }
        let full = opts.workload == Workload::Full;
        if opts.agents > 0 {
            let obs = obs.clone();
            // Its drains draw from their own stream: the other plans stay as the seed made them.
            let drains = full.then_some(seed ^ 0x6472_6169_6e73);
            // So do its weight changes.
            let weights = full.then_some(seed ^ 0x7765_6967_6874);
            sim.host("operator", move || {
                agents::operator(n, opts.agents, drains, weights, obs.clone())
            });
        }
        let plan = client::plan(&mut rng, opts.steps);
        let mut clients = Vec::new();
        for (c, ops) in plan.into_iter().enumerate() {
            let obs = obs.clone();
            let name = format!("c{}", c + 1);
            sim.client(name.as_str(), client::run(name.clone(), ops, n, obs));
            clients.push(name);
        }
        if full {
            let mut dag_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6461_6773);
            let ops = client::dag_plan(&mut dag_rng, opts.steps, "c3");
            let obs = obs.clone();
            sim.client("c3", client::run_dags("c3".into(), ops, n, obs));
            clients.push("c3".into());
        }
        // A claimant of sensitive nodes, with the runtime's simulated agents (which wipe).
        if full && opts.agents == 0 {
            let mut claims_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636c_6169_6d73);
            let ops = client::claims_plan(&mut claims_rng, opts.steps, "c4");
            let obs = obs.clone();
            sim.client("c4", client::run("c4".into(), ops, n, obs));
            clients.push("c4".into());
        }
        if full && opts.agents > 0 {
            clients.push("operator".into());
        }
        let mut chaos = Chaos::new(n, clients, opts.agents, disks, opts.faults.clone());
        let mut checker = check::Checker::new(n);
        for step in 0..opts.steps {
            sim.step().map_err(|e| format!("harness: step {step}: {e}"))?;
            lock(&obs).now_ms = sim.elapsed().as_millis() as u64;
            chaos.step(&mut sim, &mut rng, &obs);
            checker.after_step(&obs, false);
            panicked(&obs);
            if let Some(v) = lock(&obs).violations.first() {
                return Err(v.clone());
            }
        }
        faults_injected = chaos.injected;
        chaos.heal_all(&mut sim, &obs);
        {
            let mut o = lock(&obs);
            o.healed = true;
            o.event("healed".into());
        }
        let bound = (LIVENESS_BOUND.as_millis() / TICK.as_millis()) as u64;
        let mut live = false;
        for step in 0..bound {
            let clients_done = sim.step().map_err(|e| format!("harness: healing step {step}: {e}"))?;
            lock(&obs).now_ms = sim.elapsed().as_millis() as u64;
            checker.after_step(&obs, clients_done);
            panicked(&obs);
            if let Some(v) = lock(&obs).violations.first() {
                return Err(v.clone());
            }
            if clients_done && checker.all_ended(&obs) {
                live = true;
                break;
            }
        }
        if !live {
            let running: Vec<String> = (1..=n)
                .map(|m| {
                    format!(
                        "m{m} {}",
                        if sim.is_host_running(host_name(m).as_str()) {
                            "up"
                        } else {
                            "down"
                        }
                    )
                })
                .collect();
            let why = format!("{} [{}]", checker.liveness_failure(&obs), running.join(", "));
            lock(&obs).violation(why.clone());
            return Err(why);
        }
        lock(&obs).event("live".into());
        Ok(())
    })();
    let o = lock(&obs);
    let mut h = Sha256::new();
    for e in &o.log {
        h.update(e.as_bytes());
        h.update(b"\n");
    }
    let failure = result.err().map(|why| {
        let tail: Vec<&String> = o.log.iter().rev().take(25).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
        format!(
            "seed {seed}: {why}\n  reproduce: {}\n  last events:\n    {}",
            opts.reproducer(seed),
            tail.join("\n    ")
        )
    });
    SeedReport {
        seed,
        digest: h.finalize().into(),
        failure,
        acked: o.acked.len(),
        ended: o.log.iter().filter(|e| e.contains(" ended ")).count(),
        faults: faults_injected,
        events: o.log.len(),
        simulated_s: o.now_ms as f64 / 1000.0,
        log: if opts.keep_log { o.log.clone() } else { Vec::new() },
    }
}

/// A panic in any task of the simulation (a member's Raft core, a server task) is a violation.
fn panicked(obs: &SharedObs) {
    for p in take_panics() {
        lock(obs).violation(format!("a task panicked: {p}"));
    }
}

/// An active fault and the step it heals at.
struct Active {
    fault: Fault,
    until: u64,
    /// The members (1-based) it concerns.
    on: Vec<u64>,
}

/// The seeded fault schedule: at each step of the faulty phase a new fault starts with a small
/// probability (one at a time per kind); each heals after 0.5–3 s. At most a minority of the
/// members is down at once, except in a cluster crash.
struct Chaos {
    n: u64,
    /// The clients' host names.
    clients: Vec<String>,
    /// Agent hosts.
    agents: usize,
    disks: Vec<SimDisk>,
    faults: Vec<Fault>,
    active: Vec<Active>,
    step: u64,
    injected: usize,
}

impl Chaos {
    fn new(n: u64, clients: Vec<String>, agents: usize, disks: Vec<SimDisk>, faults: Vec<Fault>) -> Chaos {
        Chaos {
            n,
            clients,
            agents,
            disks,
            faults,
            active: Vec::new(),
            step: 0,
            injected: 0,
        }
    }

    fn down(&self) -> Vec<u64> {
        let mut d: Vec<u64> = self
            .active
            .iter()
            .filter(|a| matches!(a.fault, Fault::Crash | Fault::PowerLoss | Fault::ClusterCrash))
            .flat_map(|a| a.on.iter().copied())
            .collect();
        d.sort();
        d.dedup();
        d
    }

    fn step(&mut self, sim: &mut turmoil::Sim<'_>, rng: &mut ChaCha8Rng, obs: &SharedObs) {
        self.step += 1;
        let now = self.step;
        let (due, keep): (Vec<Active>, Vec<Active>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| a.until <= now);
        self.active = keep;
        for a in due {
            self.heal(sim, &a, obs);
        }
        if self.faults.is_empty() || !rng.next_u64().is_multiple_of(60) {
            return;
        }
        let fault = self.faults[(rng.next_u64() % self.faults.len() as u64) as usize];
        if self.active.iter().any(|a| a.fault == fault) {
            return;
        }
        let until = now + 50 + rng.next_u64() % 250;
        if matches!(fault, Fault::IsolateAgent | Fault::AgentCrash | Fault::SlowAgent) {
            self.agent_fault(sim, rng, fault, obs);
            return;
        }
        let pick = |rng: &mut ChaCha8Rng, n: u64| 1 + rng.next_u64() % n;
        let down = self.down();
        let minority = (self.n - 1) / 2;
        let on = match fault {
            Fault::Partition => {
                // A minority (at least one member) against the rest.
                let k = 1 + rng.next_u64() % minority.max(1);
                let mut all: Vec<u64> = (1..=self.n).collect();
                let mut side = Vec::new();
                for _ in 0..k {
                    let j = (rng.next_u64() % all.len() as u64) as usize;
                    side.push(all.remove(j));
                }
                for a in &side {
                    for b in &all {
                        sim.partition(host_name(*a).as_str(), host_name(*b).as_str());
                    }
                }
                side
            }
            Fault::Asymmetric => {
                let a = pick(rng, self.n);
                let b = 1 + (a + rng.next_u64() % (self.n - 1)) % self.n;
                sim.partition_oneway(host_name(a).as_str(), host_name(b).as_str());
                vec![a, b]
            }
            Fault::IsolateLeader => {
                let Some(l) = check::leader(obs) else { return };
                for b in (1..=self.n).filter(|b| *b != l) {
                    sim.partition(host_name(l).as_str(), host_name(b).as_str());
                }
                vec![l]
            }
            Fault::Loss => {
                sim.set_fail_rate(0.02);
                vec![]
            }
            Fault::Delay => {
                sim.set_max_message_latency(Duration::from_millis(300));
                vec![]
            }
            Fault::Crash | Fault::PowerLoss | Fault::ClockJump => {
                if down.len() as u64 >= minority {
                    return;
                }
                let candidates: Vec<u64> = (1..=self.n).filter(|m| !down.contains(m)).collect();
                let m = candidates[(rng.next_u64() % candidates.len() as u64) as usize];
                if fault == Fault::ClockJump {
                    let jump = if rng.next_u64().is_multiple_of(2) {
                        3_600_000
                    } else {
                        -3_600_000
                    };
                    lock(obs).clock_offsets[(m - 1) as usize] += jump;
                    self.kill(sim, m, false, obs);
                    self.restart(sim, m, obs);
                    self.injected += 1;
                    lock(obs).event(format!("fault clock-jump m{m} {jump:+}ms, restarted"));
                    return;
                }
                self.kill(sim, m, fault == Fault::PowerLoss, obs);
                vec![m]
            }
            Fault::ClusterCrash => {
                if !down.is_empty() {
                    return;
                }
                let power = rng.next_u64().is_multiple_of(2);
                for m in 1..=self.n {
                    self.kill(sim, m, power, obs);
                }
                (1..=self.n).collect()
            }
            Fault::IsolateAgent | Fault::AgentCrash | Fault::SlowAgent => return,
        };
        self.injected += 1;
        let on_names: Vec<String> = on.iter().map(|m| host_name(*m)).collect();
        lock(obs).event(format!(
            "fault {} {} until step {until}",
            fault.name(),
            on_names.join(",")
        ));
        self.active.push(Active { fault, until, on });
    }

    /// A fault on one agent host (not already under another): cut off from every member for
    /// 0.5–6 s (often past its 3 s lease), crashed for 0.3–1.5 s (less than its lease: a dead agent
    /// cannot fence its work), or slowed to up to a second per message for 0.5–3 s.
    fn agent_fault(&mut self, sim: &mut turmoil::Sim<'_>, rng: &mut ChaCha8Rng, fault: Fault, obs: &SharedObs) {
        if self.agents == 0 {
            return;
        }
        let a = (rng.next_u64() % self.agents as u64) as usize;
        let busy = self.active.iter().any(|x| {
            matches!(x.fault, Fault::IsolateAgent | Fault::AgentCrash | Fault::SlowAgent) && x.on == [a as u64]
        });
        if busy {
            return;
        }
        let host = agents::host_name(a);
        let until = self.step
            + match fault {
                Fault::IsolateAgent => 50 + rng.next_u64() % 550,
                Fault::AgentCrash => 30 + rng.next_u64() % 120,
                _ => 50 + rng.next_u64() % 250,
            };
        match fault {
            Fault::IsolateAgent => {
                for m in 1..=self.n {
                    sim.partition(host.as_str(), host_name(m).as_str());
                }
            }
            Fault::AgentCrash => {
                // Cut off while its tasks are dropped (as for a member: no resets in task order).
                for m in 1..=self.n {
                    sim.partition(host.as_str(), host_name(m).as_str());
                }
                sim.crash(host.as_str());
                for m in 1..=self.n {
                    sim.repair(host.as_str(), host_name(m).as_str());
                }
            }
            _ => {
                for m in 1..=self.n {
                    sim.set_link_max_message_latency(host.as_str(), host_name(m).as_str(), Duration::from_secs(1));
                }
            }
        }
        self.injected += 1;
        lock(obs).event(format!("fault {} {host} until step {until}", fault.name()));
        self.active.push(Active {
            fault,
            until,
            on: vec![a as u64],
        });
    }

    /// Kills member `m`'s process: its disk first (nothing it does from now on reaches it), then
    /// its tasks. It is cut off from every host while its tasks are dropped, so the connections it
    /// held die silently (as in a power cut) instead of sending resets in the order tokio happens
    /// to drop its tasks — an order that depends on process-global task ids, which would make a
    /// seed's run depend on what else the process ran.
    fn kill(&self, sim: &mut turmoil::Sim<'_>, m: u64, power: bool, obs: &SharedObs) {
        let disk = &self.disks[(m - 1) as usize];
        disk.crash();
        let me = host_name(m);
        let others: Vec<String> = (1..=self.n)
            .filter(|o| *o != m)
            .map(host_name)
            .chain(self.clients.iter().cloned())
            .chain((0..self.agents).map(agents::host_name))
            .collect();
        for o in &others {
            sim.partition(me.as_str(), o.as_str());
        }
        sim.crash(me.as_str());
        for o in &others {
            sim.repair(me.as_str(), o.as_str());
        }
        // The active faults' cuts, as they were.
        for f in &self.active {
            match f.fault {
                Fault::Partition => {
                    for x in &f.on {
                        for y in (1..=self.n).filter(|y| !f.on.contains(y)) {
                            sim.partition(host_name(*x).as_str(), host_name(y).as_str());
                        }
                    }
                }
                Fault::Asymmetric => sim.partition_oneway(host_name(f.on[0]).as_str(), host_name(f.on[1]).as_str()),
                Fault::IsolateLeader => {
                    for y in (1..=self.n).filter(|y| *y != f.on[0]) {
                        sim.partition(host_name(f.on[0]).as_str(), host_name(y).as_str());
                    }
                }
                Fault::IsolateAgent => {
                    sim.partition(agents::host_name(f.on[0] as usize).as_str(), me.as_str());
                }
                _ => {}
            }
        }
        let lost = if power { disk.lose_unsynced() } else { 0 };
        let mut o = lock(obs);
        o.members[(m - 1) as usize] = None;
        o.event(format!(
            "m{m} killed{}",
            if power {
                format!(", {lost} unsynced pages lost")
            } else {
                String::new()
            }
        ));
    }

    fn restart(&self, sim: &mut turmoil::Sim<'_>, m: u64, obs: &SharedObs) {
        let disk = &self.disks[(m - 1) as usize];
        let open = disk.in_use();
        if !open.is_empty() {
            lock(obs).violation(format!(
                "harness: m{m}'s crashed incarnation still holds {}",
                open.join(", ")
            ));
        }
        sim.bounce(host_name(m).as_str());
        lock(obs).event(format!("m{m} restarted"));
    }

    fn heal(&mut self, sim: &mut turmoil::Sim<'_>, a: &Active, obs: &SharedObs) {
        match a.fault {
            Fault::Partition => {
                let rest: Vec<u64> = (1..=self.n).filter(|m| !a.on.contains(m)).collect();
                for x in &a.on {
                    for y in &rest {
                        sim.repair(host_name(*x).as_str(), host_name(*y).as_str());
                    }
                }
            }
            Fault::Asymmetric => sim.repair_oneway(host_name(a.on[0]).as_str(), host_name(a.on[1]).as_str()),
            Fault::IsolateLeader => {
                for b in (1..=self.n).filter(|b| *b != a.on[0]) {
                    sim.repair(host_name(a.on[0]).as_str(), host_name(b).as_str());
                }
            }
            Fault::Loss => sim.set_fail_rate(0.0),
            Fault::Delay => sim.set_max_message_latency(Duration::from_millis(5)),
            Fault::Crash | Fault::PowerLoss | Fault::ClusterCrash => {
                for m in &a.on {
                    self.restart(sim, *m, obs);
                }
            }
            Fault::ClockJump => {}
            Fault::IsolateAgent => {
                for m in 1..=self.n {
                    sim.repair(agents::host_name(a.on[0] as usize).as_str(), host_name(m).as_str());
                }
            }
            Fault::AgentCrash => {
                sim.bounce(agents::host_name(a.on[0] as usize).as_str());
            }
            Fault::SlowAgent => {
                for m in 1..=self.n {
                    sim.set_link_max_message_latency(
                        agents::host_name(a.on[0] as usize).as_str(),
                        host_name(m).as_str(),
                        Duration::from_millis(5),
                    );
                }
            }
        }
        let names: Vec<String> = if matches!(a.fault, Fault::IsolateAgent | Fault::AgentCrash | Fault::SlowAgent) {
            vec![agents::host_name(a.on[0] as usize)]
        } else {
            a.on.iter().map(|m| host_name(*m)).collect()
        };
        lock(obs).event(format!("heal {} {}", a.fault.name(), names.join(",")));
    }

    fn heal_all(&mut self, sim: &mut turmoil::Sim<'_>, obs: &SharedObs) {
        for a in std::mem::take(&mut self.active) {
            self.heal(sim, &a, obs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_lists_parse_and_unknown_names_are_refused_naming_the_known_ones() {
        assert_eq!(parse_faults("all").unwrap().len(), ALL_FAULTS.len());
        assert!(parse_faults("none").unwrap().is_empty());
        assert_eq!(
            parse_faults("crash, partition,crash").unwrap(),
            [Fault::Partition, Fault::Crash]
        );
        let e = parse_faults("partition,meteor").unwrap_err();
        assert!(e.contains("`meteor`") && e.contains("power-loss"), "{e}");
        assert!(Bugs::parse("nope").unwrap_err().contains("ack-without-majority"));
    }
}
