//! The agent's loop as a state machine: [`Agent`] holds what the agent keeps from one round to the
//! next, [`Agent::new`] sets it up (taking over what a previous agent left), and [`Agent::tick`] runs
//! one round, phase by phase — register, heartbeat, reap ended processes, report exits, poll for work
//! and carry it out (the fingerprint, followed output, kills, checkpoint hints, preemptions, wipes,
//! launches, image cache orders, task launches), flush output to the log store, settle checkpoints,
//! collect and push telemetry, and keep the exits and state files up to date.

use super::config::AgentConfig;
use super::files::{write_json, write_state};
use super::launch::{self, scratch_of};
use super::node::{compat_bin, discover, serve};
use super::orders::{InFlight, cache_order, prologue_failed, request_checkpoint, wipe};
use super::output::{flush_log, new_output, tail_of};
use super::takeover::{TakenOver, Watchers, take_over};
use crate::checkpoint::{Channel, Mechanism};
use crate::client::{CacheOrder, Client, ExitKind, Launch, Outcome, Output, PreemptWork, Reports, TaskLaunch, Work};
use crate::discovery::{Capabilities, Sources};
use crate::protocol::{self, Beaten, Exit, Failure, Session};
use crate::runner::{self, Ending};
use lattice_node_adapters::logstore::Stream;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

/// The node agent between two rounds of its loop: the protocol session on the agent's monotonic
/// clock, the processes it runs and what it tracks about them (checkpoint channels and checkpoints in
/// flight, preemptions, followed output, liveness probes, the fence), what goes to the control plane
/// with the next poll, and when it last did its periodic work. Built by [`Agent::new`], driven by
/// [`Agent::tick`], ended by [`Agent::shutdown`].
///
/// The fields are declared in the reverse of the order they are set up in: they are dropped in
/// the order the loop's local variables were.
pub(super) struct Agent<'a> {
    /// Exits held until the poll carrying their processes' final output has been sent.
    held_exits: Vec<Exit>,
    /// The last output of followed processes that ended, for the next poll.
    last_output: Vec<Output>,
    /// The previous accepted heartbeat's round trip, for the control plane's metrics.
    last_rtt: Option<Duration>,
    /// When telemetry was last collected and pushed.
    last_push: Instant,
    /// Per-allocation and GPU samples, and the local GPU alert rules.
    telemetry: crate::telemetry::Telemetry,
    /// When output was last flushed to the log store.
    last_flush: Instant,
    /// Followed allocations' streams: the output offset sent so far (None: not yet).
    tailing: BTreeMap<(String, Stream), Option<u64>>,
    /// The allocations the state file holds.
    recorded: Vec<String>,
    /// Whether a too-short lease was reported (once).
    lease_warned: bool,
    /// What the exits file holds: what a previous agent had not got taken (written again when the
    /// session's unreported exits differ, e.g. with those a take-over adds).
    recorded_exits: Vec<Exit>,
    /// Per allocation: its CPU seconds at the last telemetry tick (for cpu_utilization).
    cpu_seen: BTreeMap<String, (Instant, f64)>,
    /// The image cache's contents as last reported.
    reported_cache: Option<Vec<crate::client::CachedImage>>,
    /// Outcomes and the rest of what goes with the next poll.
    reports: Reports,
    /// Wipes' outcomes, from their threads.
    wiped_rx: Receiver<Outcome>,
    wiped_tx: Sender<Outcome>,
    /// Allocations whose application answered a gRPC checkpoint hint.
    grpc_done: Receiver<String>,
    grpc_done_tx: Sender<String>,
    /// Tasks being stopped for a preemption: whether their checkpoint completed.
    stopping: BTreeMap<String, bool>,
    /// Checkpoints in flight (hints and preemptions).
    in_flight: BTreeMap<String, InFlight>,
    /// Per running allocation: its checkpoint channel, and whether a shmem hint awaits "done".
    channels: BTreeMap<String, (Channel, bool)>,
    /// The node-local uenv image cache (its index survives restarts), opened when a uenv is first needed.
    images: Option<crate::cache::ImageCache>,
    /// The address other agents reach this agent's service at (`None`: no service).
    peer_addr: Option<String>,
    /// Task launches within running allocations, and the agents' own service they use.
    tasks: crate::tasks::Tasks,
    /// Slurm compatibility: an `srun` that runs `lattice srun` first on the allocations' PATH.
    compat_path: Option<PathBuf>,
    /// The allocations' processes running here.
    procs: BTreeMap<String, runner::Running>,
    /// Services' liveness probes, each on its own thread ([`crate::probe`]).
    probes: crate::probe::Probes,
    /// Fencing by lease, on its own thread ([`crate::fence`]).
    fence: Arc<crate::fence::Fence>,
    /// The protocol ([`protocol::Session`]): what to send when, and what each answer means.
    session: Session,
    /// The start of the agent's monotonic clock, the session's time base.
    t0: Instant,
    /// When the conformance fingerprint was last computed.
    last_fingerprint: Instant,
    /// The node's conformance fingerprint and capabilities, as registered.
    fp: String,
    caps: Capabilities,
    client: &'a Client,
    cfg: &'a AgentConfig,
}

impl<'a> Agent<'a> {
    /// Sets the agent up: discovers the node, starts the fence's thread (ending with `stop`), opens
    /// the agent's service, takes over what a previous agent left beside the state file (an
    /// unreadable state or exits file is an error), and starts telemetry on `gpu`.
    pub(super) fn new(
        client: &'a Client,
        cfg: &'a AgentConfig,
        stop: &Arc<AtomicBool>,
        gpu: Box<dyn crate::gpu::GpuProvider>,
    ) -> anyhow::Result<Self> {
        let (caps, fp) = discover(&Sources { root: &cfg.host_root }, &*gpu);
        let last_fingerprint = Instant::now();
        // The protocol ([`protocol::Session`]) on this agent's monotonic clock.
        let t0 = Instant::now();
        let mut session = Session::new(&cfg.node, client.endpoints(), 0);
        // Fencing by lease, on its own thread ([`crate::fence`]).
        let fence = Arc::new(crate::fence::Fence::default());
        fence.spawn(cfg.node.clone(), cfg.heartbeat, cfg.grace, stop.clone());
        // Services' liveness probes, each on its own thread ([`crate::probe`]).
        let probes = crate::probe::Probes::default();
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
        let peer_addr = serve(cfg, &tasks);
        let (grpc_done_tx, grpc_done) = std::sync::mpsc::channel::<String>();
        let (wiped_tx, wiped_rx) = std::sync::mpsc::channel::<Outcome>();
        // Take over what a previous agent started: live processes are watched again, ended ones reported.
        let TakenOver {
            recorded_exits,
            procs,
            channels,
        } = match &cfg.state_file {
            Some(path) => {
                let w = Watchers {
                    fence: &fence,
                    probes: &probes,
                    tasks: &tasks,
                };
                take_over(cfg, path, &w, &mut session)?
            }
            None => TakenOver::default(),
        };
        let last_flush = Instant::now();
        let telemetry = crate::telemetry::Telemetry::new(gpu, cfg.telemetry);
        eprintln!("lattice-agent {}: {}", cfg.node, telemetry.ebpf_status());
        let last_push = Instant::now();
        Ok(Agent {
            held_exits: Vec::new(),
            last_output: Vec::new(),
            last_rtt: None,
            last_push,
            telemetry,
            last_flush,
            tailing: BTreeMap::new(),
            recorded: Vec::new(),
            lease_warned: false,
            recorded_exits,
            cpu_seen: BTreeMap::new(),
            reported_cache: None,
            reports: Reports::default(),
            wiped_rx,
            wiped_tx,
            grpc_done,
            grpc_done_tx,
            stopping: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            channels,
            images: None,
            peer_addr,
            tasks,
            compat_path,
            procs,
            probes,
            fence,
            session,
            t0,
            last_fingerprint,
            fp,
            caps,
            client,
            cfg,
        })
    }

    /// One round of the loop, its phases in order. Until the agent is registered a round is only
    /// the attempt to register. The caller waits the poll interval between rounds.
    pub(super) fn tick(&mut self) {
        if !self.register() {
            return;
        }
        self.heartbeat();
        self.reap_exits();
        self.report_exits();
        if let Some((w, sent)) = self.poll_work() {
            self.refresh_fingerprint(w.refresh_fingerprint);
            self.follow_output(&sent, &w.tail);
            self.stop_killed(w.kill);
            self.hint_checkpoints(w.checkpoint);
            self.preempt(w.preempt);
            self.start_wipes(w.wipe);
            self.launch(w.launch);
            self.cache_orders(w.cache);
            self.task_orders(w.stop_tasks, w.tasks);
        }
        self.flush_logs();
        self.settle_checkpoints();
        self.push_telemetry();
        self.record_exits();
        self.record_state();
    }

    /// Stops the agent. Its jobs outlive it (systemd KillMode=process) when there is a state file:
    /// a restarted agent takes them over from there. Without one, nothing could, so they are stopped
    /// and waited for.
    pub(super) fn shutdown(self) {
        if self.cfg.state_file.is_some() {
            return;
        }
        for p in self.procs.values() {
            p.stop();
        }
        for (_, p) in self.procs {
            let _ = p.wait();
        }
    }

    /// Registers (again) when the session says it must: at start, when the control plane no longer
    /// knows this node, and when the fingerprint changed. Whether the agent is registered now: the
    /// rest of the round waits until it is.
    fn register(&mut self) -> bool {
        if self.session.must_register() {
            let answer = self.client.send(
                self.session.target(),
                &protocol::register_with(&self.cfg.node, &self.caps, &self.fp, self.peer_addr.as_deref()),
            );
            if let Err(e) = &answer {
                eprintln!("lattice-agent {}: register: {e}", self.cfg.node);
            }
            self.session.registered(answer.map(|_| ()).map_err(|e| e.failure()));
            if self.session.must_register() {
                return false;
            }
        }
        true
    }

    /// Sends the heartbeat when it is due (with the previous one's round trip, and the heartbeats
    /// buffered during a partition): an accepted one renews the fence's lease (kept beside the state
    /// file), warning once when the lease is too short; a failed one is buffered.
    fn heartbeat(&mut self) {
        let cfg = self.cfg;
        let Some(mut req) = self.session.heartbeat_due(self.t0.elapsed(), cfg.heartbeat) else {
            return;
        };
        // The previous accepted heartbeat's round trip, for the control plane's metrics.
        if let Some(rtt) = self.last_rtt.take() {
            req.body["rtt_ms"] = serde_json::json!(rtt.as_secs_f64() * 1000.0);
        }
        let sent = Instant::now();
        let answer = self.client.send(self.session.target(), &req);
        let took = sent.elapsed();
        let beat = answer.as_ref().map(protocol::beat).map_err(|e| e.failure());
        match self.session.heartbeat_answered(beat, crate::runner::wall_ms()) {
            Beaten::Accepted { replayed, dropped } => {
                self.last_rtt = Some(took);
                if let Some((sent, l)) = self.session.lease() {
                    self.fence.renewed(self.t0 + sent, l);
                    if !self.lease_warned && protocol::lease_too_short(l, cfg.heartbeat, cfg.grace) {
                        self.lease_warned = true;
                        eprintln!(
                            "lattice-agent {}: warning: the control plane's lease ({:.0} s) does not cover this agent's stop grace ({:.0} s) and two heartbeats: a leader election will stop running work. Raise agents.heartbeat_timeout/agents.grace or lower --grace",
                            cfg.node,
                            l.as_secs_f64(),
                            cfg.grace.as_secs_f64()
                        );
                    }
                    // Kept beside the state file: a restarted agent still fences on time.
                    if let Some(path) = &cfg.state_file {
                        let ago = self.t0.elapsed().saturating_sub(sent).as_millis() as u64;
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

    /// Collects the processes that ended ([`Agent::reap`] each).
    fn reap_exits(&mut self) {
        let ended: Vec<String> = self
            .procs
            .iter()
            .filter(|(_, r)| r.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for id in ended {
            self.reap(id);
        }
    }

    /// One ended process: its container removed, its task launches told, its log flushed, its
    /// scratch removed, a follower's last output kept for the next poll, its checkpoint channel,
    /// fence watch and probe dropped, and its exit ([`Agent::exit_of`]) handed to the session — or
    /// held until the poll that carries that last output.
    fn reap(&mut self, id: String) {
        let cfg = self.cfg;
        let r = self.procs.remove(&id).expect("listed");
        let rec = r.record.clone();
        let out = r.wait();
        // Its container (and bundle) go with it.
        if let Some(c) = &rec.container {
            crate::oci::ContainerRuntime::cleanup(&cfg.oci, c);
        }
        // Stopped (cancelled, preempted, its walltime, fenced): its task launches' ranks stop
        // too. Ended by itself: they run on until the control plane says the allocation ended.
        match out.ending {
            Ending::Exited(_) => self.tasks.alloc_process_ended(&id),
            _ => self.tasks.alloc_ended(&id),
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
        for ((t, stream), from) in self.tailing.iter().filter(|((t, _), _)| *t == id) {
            if let Some(o) = new_output((t, *stream), &rec, *from).filter(|o| o.next > o.offset) {
                self.last_output.push(o);
                had_final = true;
            }
        }
        self.tailing.retain(|(t, _), _| *t != id);
        if let Some((c, _)) = self.channels.remove(&id) {
            c.remove();
        }
        let tail = (tail_of(&out.output), tail_of(&out.errors));
        let code = match out.ending {
            Ending::Exited(code) => code,
            _ => 143,
        };
        self.fence.forget(&id);
        self.probes.forget(&id);
        if let Some(x) = self.exit_of(&id, out.ending, code, tail) {
            if had_final {
                self.held_exits.push(x);
            } else {
                self.session.ended(x);
            }
        }
    }

    /// How an ended process is reported, checked in this order: fenced; stopped by its liveness
    /// probe (said on its stderr too); preempted, with or without its checkpoint; else by how it
    /// ended — `None` when the control plane stopped it (it already knows).
    fn exit_of(&mut self, id: &str, ending: Ending, code: i32, tail: (String, String)) -> Option<Exit> {
        let exit = |kind, code, (tail, err_tail): (String, String)| Exit {
            id: id.to_string(),
            kind,
            code,
            tail,
            err_tail,
        };
        if self.fence.take_fenced(id) {
            return Some(exit(ExitKind::Fenced, code, tail));
        }
        // Stopped by its liveness probe: said on its stderr too.
        if let Some(why) = self.probes.take_failed(id) {
            eprintln!("lattice-agent {}: {id}: {why}", self.cfg.node);
            let (out, err) = tail;
            let err = format!(
                "{err}{}lattice: {why}\n",
                if err.is_empty() || err.ends_with('\n') {
                    ""
                } else {
                    "\n"
                }
            );
            return Some(exit(ExitKind::Liveness, code, (out, err)));
        }
        // A preempted task: reported as stopped with or without its checkpoint (also when it
        // exited by itself once its checkpoint was written, as signal handlers often do).
        let checkpointing = self.in_flight.contains_key(id);
        let preempted = match (self.stopping.remove(id), self.in_flight.remove(id)) {
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
            return Some(exit(kind, code, tail));
        }
        match ending {
            Ending::Exited(code) => Some(exit(ExitKind::Exited, code, tail)),
            Ending::Walltime if checkpointing => Some(exit(ExitKind::WalltimeCheckpoint, 137, tail)),
            Ending::Walltime => Some(exit(ExitKind::Walltime, 137, tail)),
            // Stopped on the control plane's request: it already knows.
            Ending::Stopped => None,
        }
    }

    /// Reports every exit the control plane has not taken yet (retried each round until it does;
    /// quietly during a partition).
    fn report_exits(&mut self) {
        for e in self.session.unreported().to_vec() {
            let answer = self
                .client
                .send(self.session.target(), &protocol::exit(&self.cfg.node, &e));
            if let Err(err) = &answer {
                // During a partition (already said once) the retries are quiet.
                if err.failure() != Failure::Elsewhere || !self.session.partitioned() {
                    eprintln!("lattice-agent {}: report {}: {err}", self.cfg.node, e.id);
                }
            }
            self.session
                .exit_answered(&e.id, answer.map(|_| ()).map_err(|e| e.failure()));
        }
    }

    /// Polls for work with what runs here, followed allocations' new output and the reports
    /// (wipes' outcomes, task launches running and ended, the image cache's contents when they
    /// changed), then lets the held exits follow. The work to carry out, with the output it
    /// sent, when the control plane answered (the reports it took are then cleared).
    fn poll_work(&mut self) -> Option<(Work, Vec<Output>)> {
        let cfg = self.cfg;
        let running: Vec<String> = self.procs.keys().cloned().collect();
        // New output of the allocations someone follows.
        let procs = &self.procs;
        let mut output: Vec<Output> = self
            .tailing
            .iter()
            .filter_map(|((id, stream), from)| new_output((id, *stream), &procs.get(id)?.record, *from))
            .filter(|o| o.next > o.offset)
            .collect();
        output.append(&mut self.last_output);
        while let Ok(o) = self.wiped_rx.try_recv() {
            self.reports.wiped.push(o);
        }
        // Audit mode: what the watched allocations opened, batched into this poll; allocations
        // that ended here are no longer watched.
        self.telemetry.audit_drain(&mut self.reports.data_access);
        for id in self.telemetry.audited() {
            if !self.procs.contains_key(&id) {
                let (opens, under) = self.telemetry.audit_unwatch(&id);
                eprintln!(
                    "lattice-agent {}: {id}: audit mode saw {opens} opens, {under} under its data paths",
                    cfg.node
                );
            }
        }
        // What runs first, then what ended (a launch is listed ended before it stops being listed
        // running): every launch handed here is in one or the other.
        self.reports.tasks_running = self.tasks.running();
        // The cache's contents, when they changed since the last report.
        if let Some(c) = &self.images {
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
            if self.reported_cache.as_ref() != Some(&now) {
                self.reports.cache = Some(now);
            }
        }
        self.reports.task_ends.extend(self.tasks.take_ended());
        let answer = self
            .client
            .send(
                self.session.target(),
                &protocol::work(&cfg.node, &running, &output, &self.reports),
            )
            .and_then(|v| {
                protocol::parse_work(v).map_err(|message| crate::client::ClientError::Transport {
                    url: format!("/v1/nodes/{}/work", cfg.node),
                    message,
                })
            });
        if let Err(e) = &answer
            && (e.failure() != Failure::Elsewhere || !self.session.partitioned())
        {
            eprintln!("lattice-agent {}: work: {e}", cfg.node);
        }
        // The final output went out with this poll: their exits follow (reported next round, also
        // when the poll failed — an exit is never held back for long).
        for x in self.held_exits.drain(..) {
            self.session.ended(x);
        }
        let procs = &self.procs;
        let w = self
            .session
            .work_answered(answer.map_err(|e| e.failure()), |id| procs.contains_key(id))?;
        if let Some(c) = self.reports.cache.take() {
            self.reported_cache = Some(c);
        }
        self.reports = Reports::default();
        Some((w, output))
    }

    /// Recomputes the conformance fingerprint every `fingerprint_every` and when the control plane
    /// asks; a new value (or a request) is reported by registering again.
    fn refresh_fingerprint(&mut self, asked: bool) {
        if asked || self.last_fingerprint.elapsed() >= self.cfg.fingerprint_every {
            self.last_fingerprint = Instant::now();
            let (c, f) = discover(
                &Sources {
                    root: &self.cfg.host_root,
                },
                self.telemetry.gpu(),
            );
            if f != self.fp {
                eprintln!(
                    "lattice-agent {}: conformance fingerprint changed: {} -> {f}",
                    self.cfg.node, self.fp
                );
            }
            if f != self.fp || asked {
                self.session.register_again();
            }
            (self.caps, self.fp) = (c, f);
        }
    }

    /// Moves the followed streams past the output `sent`, and follows exactly the allocations in
    /// `tail` (a new one from the newest output).
    fn follow_output(&mut self, sent: &[Output], tail: &[String]) {
        for o in sent {
            self.tailing.insert((o.id.clone(), o.stream), Some(o.next));
        }
        self.tailing.retain(|(id, _), _| tail.contains(id));
        for id in tail {
            for stream in Stream::BOTH {
                self.tailing.entry((id.clone(), stream)).or_insert(None);
            }
        }
    }

    /// Stops the processes the control plane no longer runs here.
    fn stop_killed(&self, kill: Vec<String>) {
        for id in kill {
            if let Some(p) = self.procs.get(&id) {
                p.stop();
            }
        }
    }

    /// Hints the running allocations whose checkpoint was requested, by their mechanism; each is
    /// in flight until its callback deadline.
    fn hint_checkpoints(&mut self, ids: Vec<String>) {
        let cfg = self.cfg;
        for id in ids {
            let Some(p) = self.procs.get(&id) else { continue };
            request_checkpoint(&cfg.node, &id, p, &mut self.channels, cfg.callback, &self.grpc_done_tx);
            self.in_flight.entry(id).or_insert(InFlight {
                until: Instant::now() + cfg.callback.deadline,
                preempt: false,
            });
        }
    }

    /// Preempts running allocations (not already being preempted): checkpoint first (a hint
    /// already in flight counts), stopped once it completes or its deadline passes; or stopped now.
    fn preempt(&mut self, orders: Vec<PreemptWork>) {
        let cfg = self.cfg;
        for pw in orders {
            let Some(p) = self.procs.get(&pw.id) else { continue };
            if self.stopping.contains_key(&pw.id) || self.in_flight.get(&pw.id).is_some_and(|f| f.preempt) {
                continue;
            }
            eprintln!("lattice-agent {}: {} preempted ({})", cfg.node, pw.id, pw.how);
            if pw.how == "checkpoint" {
                // Checkpoint first (a hint already in flight counts), then stop.
                if !self.in_flight.contains_key(&pw.id) {
                    request_checkpoint(
                        &cfg.node,
                        &pw.id,
                        p,
                        &mut self.channels,
                        cfg.callback,
                        &self.grpc_done_tx,
                    );
                }
                self.in_flight.insert(
                    pw.id,
                    InFlight {
                        until: Instant::now() + Duration::from_secs_f64(pw.deadline_s.max(0.0)),
                        preempt: true,
                    },
                );
            } else {
                p.stop();
                self.stopping.insert(pw.id, false);
            }
        }
    }

    /// Runs the site's wipe command for each released claim, each on its own thread; the outcomes
    /// go with a later poll.
    fn start_wipes(&self, ids: Vec<String>) {
        for id in ids {
            let (tx, node, command) = (
                self.wiped_tx.clone(),
                self.cfg.node.clone(),
                self.cfg.wipe_command.clone(),
            );
            std::thread::spawn(move || {
                let ok = wipe(&node, &id, command.as_deref());
                let _ = tx.send(Outcome { id, ok });
            });
        }
    }

    /// Starts the allocations handed to this node: each prepared ([`launch::prepare`]; what cannot
    /// be is a prologue failure), then started ([`Agent::start`]).
    fn launch(&mut self, launches: Vec<Launch>) {
        let assigned = Instant::now();
        for l in launches {
            let ctx = launch::Context {
                cfg: self.cfg,
                client: self.client,
                compat_path: self.compat_path.as_deref(),
                peer_addr: self.peer_addr.as_deref(),
            };
            match launch::prepare(&ctx, &mut self.images, &self.procs, &l) {
                Ok(p) => self.start(&l, p, assigned),
                Err(why) => prologue_failed(&self.cfg.node, &mut self.session, &l.id, &why),
            }
        }
    }

    /// Starts a prepared allocation's process: watched by its liveness probe, the task launches and
    /// the fence, its start-up time (since the work was `assigned`) reported. One that could not
    /// even start is a failure, reported like any other.
    fn start(&mut self, l: &Launch, p: launch::Prepared, assigned: Instant) {
        let launch::Prepared {
            mut spec,
            container,
            channel,
            images,
        } = p;
        // Audit mode (a sensitive allocation): its processes in a cgroup of their own, whose opens
        // under its data mounts are recorded (eBPF, where the kernel allows).
        if l.sensitive {
            // Its data paths: the data mounts, and its output and checkpoint directories.
            let mut paths: Vec<std::path::PathBuf> = spec
                .mounts
                .iter()
                .filter_map(|m| match m {
                    crate::runner::Mount::Bind { at, .. } => Some(at.clone()),
                    crate::runner::Mount::Squashfs { .. } => None,
                })
                .collect();
            paths.extend(
                spec.env
                    .iter()
                    .filter(|(k, _)| k == "LATTICE_OUTPUT_DIR" || k == "LATTICE_CHECKPOINT_DIR")
                    .map(|(_, v)| std::path::PathBuf::from(v)),
            );
            // Named for this agent too: an id is unique at its site, not on a host running
            // several agents (tests), and a restarted agent starts its own.
            let name = format!("{}.{}.{}", self.cfg.node, std::process::id(), l.id);
            match crate::cgroup::Group::create(&name) {
                Ok(g) if !paths.is_empty() && self.telemetry.audit_watch(&l.id, &g, paths) => {
                    spec.cgroup = Some(std::sync::Arc::new(g));
                }
                Ok(_) => eprintln!(
                    "lattice-agent {}: {}: no data-access audit (no data paths, or audit mode unavailable)",
                    self.cfg.node, l.id
                ),
                Err(e) => eprintln!("lattice-agent {}: audit mode for {}: {e}", self.cfg.node, l.id),
            }
        }
        let task_env = spec.env.clone();
        match runner::start(spec) {
            Ok(mut r) => {
                r.record.launch_token = l.launch_token.clone();
                r.record.container = container;
                r.record.liveness = l.liveness_probe.clone();
                if let Some(spec) = &l.liveness_probe {
                    self.probes
                        .watch(&l.id, spec.clone(), "127.0.0.1".into(), r.stopper(), Duration::ZERO);
                }
                self.tasks.alloc_started(
                    &l.id,
                    crate::tasks::AllocInfo {
                        env: task_env,
                        pid: r.pid,
                        mounted: r.record.has_namespace(),
                        token: l.launch_token.clone(),
                    },
                );
                self.fence.watch(&l.id, r.stopper());
                self.reports.startups.push(crate::client::Startup {
                    id: l.id.clone(),
                    seconds: assigned.elapsed().as_secs_f64(),
                    images,
                });
                self.procs.insert(l.id.clone(), r);
                if let Some(c) = channel {
                    self.channels.insert(l.id.clone(), (c, false));
                }
            }
            // Could not even start: a failure, reported like any other.
            Err(e) => {
                eprintln!("lattice-agent {}: start {}: {e}", self.cfg.node, l.id);
                self.session.ended(Exit {
                    id: l.id.clone(),
                    kind: ExitKind::Exited,
                    code: 127,
                    tail: String::new(),
                    err_tail: format!("could not start: {e}"),
                });
            }
        }
    }

    /// Carries out the image cache orders (pulls run here, like a uenv allocation's), sparing the
    /// images running allocations have mounted; each outcome goes with the next poll.
    fn cache_orders(&mut self, orders: Vec<CacheOrder>) {
        let cfg = self.cfg;
        for o in orders {
            let pinned: std::collections::BTreeSet<String> =
                self.procs.values().flat_map(|r| r.record.images().cloned()).collect();
            let cache = self.images.get_or_insert_with(|| crate::uenv::open_cache(&cfg.uenv));
            let result = cache_order(&cfg.uenv, cache, &pinned, &o);
            if let Err(e) = &result {
                eprintln!("lattice-agent {}: cache {} {}: {e}", cfg.node, o.op, o.image);
            }
            self.reports.cache_done.push(crate::client::CacheOutcome {
                op: o.op.clone(),
                image: o.image.clone(),
                ok: result.is_ok(),
                detail: result.err().unwrap_or_default(),
            });
        }
    }

    /// Task launches within the allocations running here (after their allocations started): the
    /// ranks of launches that ended at the control plane stopped, new launches started.
    fn task_orders(&self, stop: Vec<String>, start: Vec<TaskLaunch>) {
        for id in stop {
            self.tasks.stop(&id, "the launch ended at the control plane");
        }
        for t in start {
            self.tasks.start(t);
        }
    }

    /// Flushes every running process's output to the log store every `log_flush`.
    fn flush_logs(&mut self) {
        if self.cfg.log_store.is_some() && self.last_flush.elapsed() >= self.cfg.log_flush {
            self.last_flush = Instant::now();
            for r in self.procs.values() {
                flush_log(self.cfg, &r.record);
            }
        }
    }

    /// Checkpoints in flight: completed (shmem "done", the gRPC answer, or the sentinel file), or
    /// past their deadline. A hint's outcome goes to the control plane; a preempted task is stopped
    /// now, and reported with whether its checkpoint completed once it has ended.
    fn settle_checkpoints(&mut self) {
        let answered: Vec<String> = self.grpc_done.try_iter().collect();
        let channels = &self.channels;
        let settled: Vec<(String, bool)> = self
            .in_flight
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
            let f = self.in_flight.remove(&id).expect("listed");
            eprintln!(
                "lattice-agent {}: {id} checkpoint {}",
                self.cfg.node,
                if done { "written" } else { "not written in time" }
            );
            if f.preempt {
                if let Some(p) = self.procs.get(&id) {
                    p.stop();
                    self.stopping.insert(id, done);
                }
            } else {
                self.reports.checkpointed.push(Outcome { id, ok: done });
            }
        }
    }

    /// Every telemetry period: samples the allocations and GPUs (with what collecting costs), adds
    /// the image cache's series, keeps the newest scaling metrics (built-in ones and those the
    /// tasks report) for the next poll, says new alerts, and pushes the series by remote-write
    /// and/or as Prometheus text.
    fn push_telemetry(&mut self) {
        let cfg = self.cfg;
        if self.last_push.elapsed() < cfg.telemetry.period() {
            return;
        }
        self.last_push = Instant::now();
        let groups: BTreeMap<String, u32> = self.procs.iter().map(|(id, r)| (id.clone(), r.pid)).collect();
        // What collecting costs: this thread's CPU time for the tick, over the period.
        let cpu0 = crate::telemetry::thread_cpu_ns();
        let mut tick = self.telemetry.tick(&cfg.node, std::path::Path::new("/proc"), &groups);
        let spent = crate::telemetry::thread_cpu_ns().saturating_sub(cpu0);
        self.reports.collection_overhead_pct =
            Some(spent as f64 / cfg.telemetry.period().as_nanos().max(1) as f64 * 100.0);
        if let Some(c) = &self.images {
            tick.series
                .extend(crate::telemetry::cache_series(&cfg.node, &c.stats, c.used()));
        }
        // Scaling metrics for reactive allocations: built-in ones and those the tasks report.
        let at = Instant::now();
        let cores = std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64);
        let mut metrics: Vec<crate::client::Metric> =
            crate::telemetry::scaling_metrics(&tick, at, cores, &mut self.cpu_seen)
                .into_iter()
                .map(|(id, name, value)| crate::client::Metric {
                    id,
                    name: name.to_string(),
                    value,
                })
                .collect();
        for (id, (c, _)) in &self.channels {
            for (name, value) in c.app_metrics() {
                metrics.push(crate::client::Metric {
                    id: id.clone(),
                    name,
                    value,
                });
            }
        }
        // Only the newest samples matter: an unreachable control plane does not pile them up.
        self.reports.metrics = metrics;
        for a in &tick.new_alerts {
            eprintln!("lattice-agent {}: alert: {a}", cfg.node);
        }
        if let Some(url) = &cfg.remote_write {
            let req = crate::remote_write::request(&tick.series, crate::runner::wall_ms() as i64);
            if let Err(e) = self.client.remote_write(url, crate::remote_write::encode(&req)) {
                eprintln!("lattice-agent {}: remote write: {e}", cfg.node);
            }
        }
        if let Some(url) = &cfg.metrics_push
            && let Err(e) = self.client.push_metrics(url, &crate::telemetry::render(&tick.series))
        {
            eprintln!("lattice-agent {}: metrics push: {e}", cfg.node);
        }
    }

    /// Writes the exits file (beside the state file) when the session's unreported exits changed,
    /// so an exit is not lost to an agent restart either.
    fn record_exits(&mut self) {
        if let Some(path) = &self.cfg.state_file
            && self.session.unreported() != self.recorded_exits.as_slice()
        {
            let exits = path.with_extension("exits");
            match write_json(&exits, self.session.unreported()) {
                Ok(()) => self.recorded_exits = self.session.unreported().to_vec(),
                Err(e) => eprintln!("lattice-agent {}: exits file {}: {e}", self.cfg.node, exits.display()),
            }
        }
    }

    /// Writes the state file when the set of running processes changed, so a restarted agent takes
    /// them over.
    fn record_state(&mut self) {
        if let Some(path) = &self.cfg.state_file {
            let now: Vec<String> = self.procs.keys().cloned().collect();
            if now != self.recorded {
                let records: Vec<runner::Record> = self.procs.values().map(|r| r.record.clone()).collect();
                match write_state(path, &records) {
                    Ok(()) => self.recorded = now,
                    Err(e) => eprintln!("lattice-agent {}: state file {}: {e}", self.cfg.node, path.display()),
                }
            }
        }
    }
}
