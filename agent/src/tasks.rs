//! Task launches within a running allocation (`lattice launch`, `srun`; book: "MPI Process
//! Management"): this node's ranks of a launch, each `/bin/sh -c ENTRYPOINT` in its own process
//! group with the seed's rank environment and its stdout and stderr in separate files
//! (`LOG_DIR/LAUNCH.RANK.out`, `.err`), and the PMI server they talk to: one socket per rank,
//! inherited as `PMI_FD` ([`crate::pmi`] speaks the wire protocols).
//!
//! The fence is the one operation across nodes. Once every local rank entered it, this node's puts
//! go to the head agent (the one hosting rank 0, `peers[0]`) over the agents' gRPC service
//! ([`lattice_node_adapters::peer`]); the head answers every node with the merged puts once all nodes are
//! in (a star). A fence not complete within the launch's fence timeout aborts the launch with "PMI
//! fence timeout"; a rank that exits non-zero or asks to abort aborts it too — on every node (this
//! agent tells the others). The ranks of an allocation that ends on this node are stopped. Ranks get
//! SIGKILL if their agent dies (`PR_SET_PDEATHSIG`): a launch does not outlive the agent that runs it.
//!
//! `Exec` (for `lattice-mpi-launcher`): a process inside a running allocation for whoever presents
//! the allocation's launch token, its output streamed back.

use crate::client::{RankEnd, TaskEnd, TaskLaunch};
use crate::pmi;
use lattice_node_adapters::peer::{AttachSession, AttachStart, ExecEvent, FenceIn, Peer, PeerHandler};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The default fence timeout (the seed: 60 s).
pub const FENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `Exec` and a terminal wait for their allocation to start on this node.
pub const ALLOC_WAIT: Duration = Duration::from_secs(10);
/// Allocations whose entrypoint ended here that still take task launches (the newest).
pub const KEEP_ENDED_ALLOCS: usize = 256;
/// How much of each rank's stdout and stderr its end report carries.
pub const RANK_TAIL: u64 = 64 * 1024;

/// What the agent knows of an allocation running here (its terminals need it too).
pub use crate::attach::AllocInfo;

/// How this node's agent runs task launches.
#[derive(Clone, Debug)]
pub struct TasksConfig {
    pub node: String,
    pub log_dir: PathBuf,
    /// SIGTERM → SIGKILL when a launch is aborted.
    pub grace: Duration,
    /// Used when the launch names none.
    pub fence_timeout: Duration,
    /// Also set the `SLURM_*` compatibility variables.
    pub slurm_env: bool,
    /// How long `Exec` and a terminal wait for their allocation to start here ([`ALLOC_WAIT`]).
    pub alloc_wait: Duration,
}

/// The task launches of this node (cheap to clone: shared).
#[derive(Clone)]
pub struct Tasks {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: TasksConfig,
    peer: OnceLock<Arc<Peer>>,
    launches: Mutex<BTreeMap<String, Arc<Launch>>>,
    /// Aborts of launches not (yet) started here: a late start ends at once.
    aborted_early: Mutex<BTreeMap<String, String>>,
    allocs: Mutex<BTreeMap<String, AllocInfo>>,
    /// Processes `Exec` started, per allocation (stopped with it).
    execs: Mutex<BTreeMap<String, Vec<u32>>>,
    ended: Mutex<Vec<TaskEnd>>,
    timings: Mutex<Vec<LaunchTiming>>,
}

/// When things happened in a launch on this node (for measuring fan-out and fences).
#[derive(Clone, Debug)]
pub struct LaunchTiming {
    pub launch_id: String,
    /// When [`Tasks::start`] took it.
    pub started: Instant,
    /// When the last local rank sent its first PMI command (None: some never did).
    pub all_connected: Option<Instant>,
    /// Each fence: when the last local rank entered it, and when the merged puts came back.
    pub fences: Vec<(Instant, Instant)>,
}

struct Launch {
    started: Instant,
    work: TaskLaunch,
    fence_timeout: Duration,
    st: Mutex<State>,
    cv: Condvar,
}

/// Key-value pairs, in order.
type Pairs = Vec<(String, String)>;

#[derive(Default)]
struct State {
    kvs: pmi::Kvs,
    /// Each connected rank's socket (for replies sent from another thread) and framing.
    conns: BTreeMap<u32, (UnixStream, pmi::Wire)>,
    /// Local ranks in the current fence, since when, and which fence it is.
    in_fence: BTreeSet<u32>,
    fence_since: Option<Instant>,
    epoch: u32,
    /// Ranks waiting for a node attribute.
    attr_waiters: Vec<(u32, String)>,
    ended: BTreeSet<u32>,
    aborted: Option<String>,
    /// At the head: the nodes' contributions to fence `head_epoch`, since when, and the last merge.
    head_epoch: u32,
    head_in: BTreeMap<u32, Vec<(String, String)>>,
    head_first: Option<Instant>,
    merged: Option<(u32, Arc<Pairs>)>,
    /// Ranks that sent a first PMI command, and when the last did.
    connected: BTreeSet<u32>,
    all_connected: Option<Instant>,
    fences: Vec<(Instant, Instant)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A launch or rank file name: plain characters only (never a path).
fn plain(id: &str) -> bool {
    !id.is_empty() && id != "." && id != ".." && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.[]".contains(&b))
}

impl Tasks {
    pub fn new(cfg: TasksConfig) -> Tasks {
        Tasks {
            inner: Arc::new(Inner {
                cfg,
                peer: OnceLock::new(),
                launches: Mutex::default(),
                aborted_early: Mutex::default(),
                allocs: Mutex::default(),
                execs: Mutex::default(),
                ended: Mutex::default(),
                timings: Mutex::default(),
            }),
        }
    }

    /// Serves the agents' service on `listen` and uses it for calls; the address it listens on.
    pub fn serve(&self, listen: &str) -> std::io::Result<std::net::SocketAddr> {
        let peer = Peer::serve(listen, Arc::new(self.clone()))?;
        let addr = peer.addr().expect("a serving peer has an address");
        let _ = self.inner.peer.set(Arc::new(peer));
        Ok(addr)
    }

    fn peer(&self) -> Option<Arc<Peer>> {
        if let Some(p) = self.inner.peer.get() {
            return Some(p.clone());
        }
        let p = Arc::new(Peer::client().ok()?);
        Some(self.inner.peer.get_or_init(|| p).clone())
    }

    /// An allocation started (or was taken over) on this node.
    pub fn alloc_started(&self, id: &str, info: AllocInfo) {
        lock(&self.inner.allocs).insert(id.to_string(), info);
    }

    /// An allocation's entrypoint ended by itself on this node: the allocation may still run on others,
    /// and task launches may still run here (as with a batch script that runs on every node); the
    /// control plane says when they are to stop ([`Tasks::stop`]). Only the last few such
    /// allocations are remembered.
    pub fn alloc_process_ended(&self, id: &str) {
        let mut allocs = lock(&self.inner.allocs);
        if let Some(info) = allocs.get_mut(id) {
            info.pid = 0;
        }
        let ended: Vec<String> = allocs
            .iter()
            .filter(|(_, i)| i.pid == 0)
            .map(|(k, _)| k.clone())
            .collect();
        for old in ended.iter().take(ended.len().saturating_sub(KEEP_ENDED_ALLOCS)) {
            allocs.remove(old);
        }
    }

    /// Stops launch `id`'s ranks here (the control plane ended it).
    pub fn stop(&self, id: &str, why: &str) {
        if let Some(l) = self.launch(id) {
            self.abort_launch(&l, why.to_string(), false);
        }
    }

    /// An allocation ended on this node: its launches' ranks and `Exec` processes are stopped.
    pub fn alloc_ended(&self, id: &str) {
        lock(&self.inner.allocs).remove(id);
        let mine: Vec<Arc<Launch>> = lock(&self.inner.launches)
            .values()
            .filter(|l| l.work.alloc == id)
            .cloned()
            .collect();
        for l in mine {
            self.abort_launch(&l, "allocation ended".into(), false);
        }
        for pid in lock(&self.inner.execs).remove(id).unwrap_or_default() {
            // SAFETY: killpg only sends a signal; each Exec process leads its own group.
            unsafe {
                libc::killpg(pid as i32, libc::SIGKILL);
            }
        }
    }

    /// Launches that ended here since the last call.
    pub fn take_ended(&self) -> Vec<TaskEnd> {
        std::mem::take(&mut *lock(&self.inner.ended))
    }

    /// The timings of launches that ended here since the last call.
    pub fn take_timings(&self) -> Vec<LaunchTiming> {
        std::mem::take(&mut *lock(&self.inner.timings))
    }

    /// Which launches run here now.
    pub fn running(&self) -> Vec<String> {
        lock(&self.inner.launches).keys().cloned().collect()
    }

    /// Starts this node's ranks of `w` (once: a launch already here is left alone).
    pub fn start(&self, w: TaskLaunch) {
        if lock(&self.inner.launches).contains_key(&w.launch_id) {
            return;
        }
        let me = w.peers.get(w.node_index as usize).cloned();
        let fail = |why: String| {
            eprintln!("lattice-agent {}: launch {}: {why}", self.inner.cfg.node, w.launch_id);
            lock(&self.inner.ended).push(TaskEnd {
                launch_id: w.launch_id.clone(),
                alloc: w.alloc.clone(),
                ranks: Vec::new(),
                reason: Some(why),
            });
        };
        let Some(me) = me.filter(|m| m.node == self.inner.cfg.node) else {
            return fail(format!("this node is not peer {} of the launch", w.node_index));
        };
        if !plain(&w.launch_id) {
            return fail("a launch id that is not a plain name".into());
        }
        let Some(alloc) = lock(&self.inner.allocs).get(&w.alloc).cloned() else {
            return fail(format!("allocation {} does not run on this node", w.alloc));
        };
        if alloc.mounted && alloc.pid == 0 {
            return fail(format!(
                "allocation {}'s uenv is no longer mounted on this node (its entrypoint ended here)",
                w.alloc
            ));
        }
        if w.peers.len() > 1 && w.peers.iter().any(|p| p.address.is_none()) {
            return fail("a node of the launch has no agent service address".into());
        }
        let sizes: Vec<u32> = w.peers.iter().map(|p| p.num_ranks).collect();
        let kvs = pmi::Kvs::new(
            &format!("kvs_{}", w.launch_id),
            w.world_size,
            pmi::process_mapping(&sizes),
        );
        let started = Instant::now();
        let launch = Arc::new(Launch {
            started,
            fence_timeout: w
                .fence_timeout_s
                .filter(|s| s.is_finite() && *s > 0.0)
                .map_or(self.inner.cfg.fence_timeout, Duration::from_secs_f64),
            work: w,
            st: Mutex::new(State {
                kvs,
                ..State::default()
            }),
            cv: Condvar::new(),
        });
        if let Some(why) = lock(&self.inner.aborted_early).remove(&launch.work.launch_id) {
            lock(&launch.st).aborted = Some(why);
        }
        lock(&self.inner.launches).insert(launch.work.launch_id.clone(), launch.clone());
        let tasks = self.clone();
        // The thread that starts the ranks lives until they end (their parent-death signal is
        // tied to it).
        std::thread::spawn(move || tasks.run(launch, me, alloc));
    }

    fn run(&self, l: Arc<Launch>, me: crate::client::TaskPeer, alloc: AllocInfo) {
        let cfg = &self.inner.cfg;
        let w = &l.work;
        let nodes: Vec<String> = w.peers.iter().map(|p| p.node.clone()).collect();
        let mut children: Vec<(u32, Option<Child>, Option<i32>)> = Vec::new();
        let _ = std::fs::create_dir_all(&cfg.log_dir);
        for local in 0..me.num_ranks {
            let rank = me.first_rank + local;
            if lock(&l.st).aborted.is_some() {
                children.push((rank, None, Some(-1)));
                continue;
            }
            let mut env = alloc.env.clone();
            env.extend(w.env.iter().cloned());
            let mut rank_env = vec![
                ("PMI_FD", "3".to_string()),
                ("PMI_RANK", rank.to_string()),
                ("PMI_SIZE", w.world_size.to_string()),
                ("PMI_SPAWNED", "0".to_string()),
                ("LATTICE_LAUNCH_ID", w.launch_id.clone()),
                ("LATTICE_ALLOC_ID", w.alloc.clone()),
                ("LATTICE_NODELIST", nodes.join(",")),
                ("LATTICE_NNODES", nodes.len().to_string()),
                ("LATTICE_NODEID", w.node_index.to_string()),
                ("LATTICE_NPROCS", w.world_size.to_string()),
                ("LATTICE_RANK", rank.to_string()),
                ("LATTICE_LOCAL_RANK", local.to_string()),
                ("LATTICE_LOCAL_SIZE", me.num_ranks.to_string()),
            ];
            if cfg.slurm_env {
                rank_env.extend([
                    ("SLURM_PROCID", rank.to_string()),
                    ("SLURM_NPROCS", w.world_size.to_string()),
                    ("SLURM_NTASKS", w.world_size.to_string()),
                    ("SLURM_LOCALID", local.to_string()),
                    ("SLURM_NODEID", w.node_index.to_string()),
                    ("SLURM_STEP_NODELIST", nodes.join(",")),
                ]);
            }
            env.extend(rank_env.into_iter().map(|(k, v)| (k.to_string(), v)));
            match self.spawn_rank(&l, rank, &alloc, &env) {
                Ok(c) => children.push((rank, Some(c), None)),
                Err(e) => {
                    self.abort_launch(&l, format!("rank {rank} could not start: {e}"), true);
                    children.push((rank, None, Some(127)));
                }
            }
        }
        // Watch the ranks: exits, aborts (TERM, then KILL after the grace), the local fence timeout.
        let mut term_at: Option<Instant> = None;
        loop {
            for (rank, child, code) in children.iter_mut() {
                let Some(c) = child else { continue };
                if code.is_some() {
                    continue;
                }
                if let Ok(Some(st)) = c.try_wait() {
                    let exit = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
                    *code = Some(exit);
                    {
                        let mut s = lock(&l.st);
                        s.ended.insert(*rank);
                        s.conns.remove(rank);
                    }
                    if exit != 0 {
                        let why = match st.signal() {
                            Some(sig) => format!("rank {rank} was killed by signal {sig}"),
                            None => format!("rank {rank} exited with code {exit}"),
                        };
                        self.abort_launch(&l, why, true);
                    }
                }
            }
            if children.iter().all(|(_, _, c)| c.is_some()) {
                break;
            }
            let (aborted, fence_since) = {
                let s = lock(&l.st);
                (s.aborted.is_some(), s.fence_since)
            };
            if fence_since.is_some_and(|t| t.elapsed() >= l.fence_timeout) {
                self.abort_launch(&l, "PMI fence timeout".into(), true);
            }
            if aborted {
                let sig = match term_at {
                    None => {
                        term_at = Some(Instant::now());
                        Some(libc::SIGTERM)
                    }
                    Some(t) if t.elapsed() >= cfg.grace => Some(libc::SIGKILL),
                    Some(_) => None,
                };
                if let Some(sig) = sig {
                    for (_, c, code) in &children {
                        if let (Some(c), None) = (c, code) {
                            // SAFETY: killpg only sends a signal; each rank leads its own group.
                            unsafe {
                                libc::killpg(c.id() as i32, sig);
                            }
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Whatever a rank left behind in its group goes too.
        for (_, c, _) in &children {
            if let Some(c) = c {
                // SAFETY: as above.
                unsafe {
                    libc::killpg(c.id() as i32, libc::SIGKILL);
                }
            }
        }
        let ranks = children
            .iter()
            .map(|(rank, _, code)| RankEnd {
                rank: *rank,
                code: code.unwrap_or(-1),
                stdout: tail(&self.rank_file(&w.launch_id, *rank, "out")),
                stderr: tail(&self.rank_file(&w.launch_id, *rank, "err")),
            })
            .collect();
        let (reason, timing) = {
            let s = lock(&l.st);
            let timing = LaunchTiming {
                launch_id: w.launch_id.clone(),
                started: l.started,
                all_connected: s.all_connected,
                fences: s.fences.clone(),
            };
            (s.aborted.clone(), timing)
        };
        let mut timings = lock(&self.inner.timings);
        if timings.len() >= 1024 {
            timings.remove(0);
        }
        timings.push(timing);
        drop(timings);
        // Reported ended before it stops being listed as running: a poll never sees it in neither.
        lock(&self.inner.ended).push(TaskEnd {
            launch_id: w.launch_id.clone(),
            alloc: w.alloc.clone(),
            ranks,
            reason,
        });
        lock(&self.inner.launches).remove(&w.launch_id);
    }

    fn rank_file(&self, launch: &str, rank: u32, what: &str) -> PathBuf {
        self.inner.cfg.log_dir.join(format!("{launch}.{rank}.{what}"))
    }

    fn spawn_rank(
        &self,
        l: &Arc<Launch>,
        rank: u32,
        alloc: &AllocInfo,
        env: &[(String, String)],
    ) -> std::io::Result<Child> {
        let (ours, theirs) = UnixStream::pair()?;
        let fd = theirs.as_raw_fd();
        let out = std::fs::File::create(self.rank_file(&l.work.launch_id, rank, "out"))?;
        let err = std::fs::File::create(self.rank_file(&l.work.launch_id, rank, "err"))?;
        let mut cmd = if alloc.mounted {
            // Inside the allocation's private mount namespace: its uenv is there.
            let mut c = Command::new("nsenter");
            c.args(["--target", &alloc.pid.to_string(), "--mount", "--", "/bin/sh", "-c"]);
            c
        } else {
            let mut c = Command::new("/bin/sh");
            c.arg("-c");
            c
        };
        cmd.arg(&l.work.entrypoint)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0);
        // SAFETY: only async-signal-safe calls between fork and exec: the rank's PMI socket becomes
        // fd 3 (without close-on-exec), and the rank dies with this thread's process.
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                crate::runner::default_signals();
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        drop(theirs);
        lock(&l.st).conns.insert(rank, (ours.try_clone()?, pmi::Wire::V1));
        let tasks = self.clone();
        let l = l.clone();
        std::thread::spawn(move || tasks.serve_rank(l, rank, ours));
        Ok(child)
    }

    /// The PMI server of one rank: reads its commands until it closes the socket.
    fn serve_rank(&self, l: Arc<Launch>, rank: u32, mut sock: UnixStream) {
        let mut conn = pmi::Conn::new(rank);
        let mut buf = [0u8; 8192];
        loop {
            let n = match sock.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let cmds = match conn.feed(&buf[..n]) {
                Ok(c) => c,
                Err(e) => return self.abort_launch(&l, format!("rank {rank}: {e}"), true),
            };
            for cmd in cmds {
                let action = {
                    let mut s = lock(&l.st);
                    if s.connected.insert(rank)
                        && s.connected.len() as u32 == l.work.peers[l.work.node_index as usize].num_ranks
                    {
                        s.all_connected = Some(Instant::now());
                    }
                    let a = conn.handle(&mut s.kvs, &cmd);
                    if let Some(slot) = s.conns.get_mut(&rank) {
                        slot.1 = conn.wire;
                    }
                    a
                };
                match action {
                    Err(e) => return self.abort_launch(&l, format!("rank {rank}: {e}"), true),
                    Ok(pmi::Action::Reply(bytes)) | Ok(pmi::Action::Finalized(bytes)) => {
                        if sock.write_all(&bytes).is_err() {
                            return;
                        }
                        if cmd.name == "info-putnodeattr" {
                            self.wake_attr_waiters(&l);
                        }
                    }
                    Ok(pmi::Action::Abort { code, message }) => {
                        let why = if message.is_empty() {
                            format!("rank {rank} called abort (exit code {code})")
                        } else {
                            format!("rank {rank} called abort (exit code {code}): {message}")
                        };
                        return self.abort_launch(&l, why, true);
                    }
                    Ok(pmi::Action::WaitNodeAttr(key)) => {
                        lock(&l.st).attr_waiters.push((rank, key));
                        self.wake_attr_waiters(&l);
                    }
                    Ok(pmi::Action::Fence) => self.enter_fence(&l, rank),
                }
            }
        }
    }

    fn wake_attr_waiters(&self, l: &Launch) {
        let mut s = lock(&l.st);
        let State {
            attr_waiters,
            kvs,
            conns,
            ..
        } = &mut *s;
        attr_waiters.retain(|(rank, key)| {
            let Some(v) = kvs.node_attrs.get(key) else { return true };
            if let Some((sock, _)) = conns.get(rank) {
                let reply = pmi::Conn::new(*rank).node_attr_ready(v);
                let _ = (&*sock).write_all(&reply);
            }
            false
        });
    }

    /// `rank` entered the fence; the last local rank in sends this node's puts to the head.
    fn enter_fence(&self, l: &Arc<Launch>, rank: u32) {
        let batch = {
            let mut s = lock(&l.st);
            s.in_fence.insert(rank);
            s.fence_since.get_or_insert_with(Instant::now);
            let me = &l.work.peers[l.work.node_index as usize];
            let live = (me.first_rank..me.first_rank + me.num_ranks)
                .filter(|r| !s.ended.contains(r))
                .count();
            (s.in_fence.len() >= live && s.aborted.is_none()).then(|| (s.kvs.pending.clone(), s.epoch))
        };
        let Some((puts, epoch)) = batch else { return };
        let all_in = Instant::now();
        let w = &l.work;
        let f = FenceIn {
            launch_id: w.launch_id.clone(),
            token: w.token.clone(),
            node_index: w.node_index,
            epoch,
            puts,
        };
        let result = if w.node_index == 0 {
            self.head_fence(l, f)
        } else {
            let addr = w.peers[0].address.clone().unwrap_or_default();
            match self.peer() {
                Some(p) => p
                    .fence(&addr, f, l.fence_timeout + Duration::from_secs(5))
                    .map_err(|e| match e {
                        lattice_node_adapters::peer::PeerError::Refused { message, .. } => message,
                        other => format!("fence: {other}"),
                    }),
                None => Err("fence: no agent service".into()),
            }
        };
        match result {
            Ok(merged) => {
                let mut s = lock(&l.st);
                s.kvs.merge(merged);
                s.fences.push((all_in, Instant::now()));
                s.epoch += 1;
                s.fence_since = None;
                let waiting = std::mem::take(&mut s.in_fence);
                for r in waiting {
                    if let Some((sock, wire)) = s.conns.get(&r) {
                        let mut c = pmi::Conn::new(r);
                        c.wire = *wire;
                        let _ = (&*sock).write_all(&c.fence_done());
                    }
                }
            }
            Err(why) => self.abort_launch(l, why, true),
        }
    }

    /// The head's side of a fence: `f`'s node is in; the merged puts once every node is.
    fn head_fence(&self, l: &Launch, f: FenceIn) -> Result<Vec<(String, String)>, String> {
        if f.token != l.work.token {
            return Err("not this launch's token".into());
        }
        let nodes = l.work.peers.len();
        if f.node_index as usize >= nodes {
            return Err(format!("node index {} of {nodes}", f.node_index));
        }
        let mut s = lock(&l.st);
        if let Some(why) = &s.aborted {
            return Err(why.clone());
        }
        if f.epoch != s.head_epoch {
            return Err(format!(
                "fence {} while the launch is at fence {}",
                f.epoch, s.head_epoch
            ));
        }
        s.head_in.insert(f.node_index, f.puts);
        let first = *s.head_first.get_or_insert_with(Instant::now);
        if s.head_in.len() == nodes {
            let merged: Vec<(String, String)> = std::mem::take(&mut s.head_in).into_values().flatten().collect();
            let merged = Arc::new(merged);
            s.merged = Some((f.epoch, merged.clone()));
            s.head_epoch += 1;
            s.head_first = None;
            l.cv.notify_all();
            return Ok((*merged).clone());
        }
        let deadline = first + l.fence_timeout;
        loop {
            if let Some((e, m)) = &s.merged
                && *e == f.epoch
            {
                return Ok((**m).clone());
            }
            if let Some(why) = &s.aborted {
                return Err(why.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                drop(s);
                self.abort_launch(l, "PMI fence timeout".into(), true);
                return Err("PMI fence timeout".into());
            }
            s =
                l.cv.wait_timeout(s, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
        }
    }

    /// Aborts `l` here (first reason wins), and on the launch's other nodes when `propagate`.
    fn abort_launch(&self, l: &Launch, why: String, propagate: bool) {
        {
            let mut s = lock(&l.st);
            if s.aborted.is_some() {
                return;
            }
            s.aborted = Some(why.clone());
            l.cv.notify_all();
        }
        eprintln!(
            "lattice-agent {}: launch {} aborted: {why}",
            self.inner.cfg.node, l.work.launch_id
        );
        if !propagate || l.work.peers.len() < 2 {
            return;
        }
        let Some(peer) = self.peer() else { return };
        for (i, p) in l.work.peers.iter().enumerate() {
            if i == l.work.node_index as usize {
                continue;
            }
            let Some(addr) = p.address.clone() else { continue };
            let (peer, w, why) = (peer.clone(), l.work.clone(), why.clone());
            std::thread::spawn(move || {
                if let Err(e) = peer.abort(
                    &addr,
                    &w.launch_id,
                    &w.token,
                    &why,
                    w.node_index,
                    Duration::from_secs(5),
                ) {
                    eprintln!("lattice-agent: launch {}: abort to {addr}: {e}", w.launch_id);
                }
            });
        }
    }

    /// What this node knows of allocation `alloc`, waiting a little for it: another node's process
    /// (mpirun on node 0) may ask before this agent's next poll started it here.
    fn alloc_soon(&self, alloc: &str) -> Result<AllocInfo, String> {
        let t0 = Instant::now();
        loop {
            if let Some(info) = lock(&self.inner.allocs).get(alloc).cloned() {
                return Ok(info);
            }
            if t0.elapsed() >= self.inner.cfg.alloc_wait {
                return Err(format!("allocation {alloc} does not run on this node"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn launch(&self, id: &str) -> Option<Arc<Launch>> {
        lock(&self.inner.launches).get(id).cloned()
    }
}

impl PeerHandler for Tasks {
    fn fence(&self, f: FenceIn) -> Result<Vec<(String, String)>, String> {
        // The head's agent may not have polled its part of the launch yet: wait for it a while.
        let t0 = Instant::now();
        let l = loop {
            if let Some(l) = self.launch(&f.launch_id) {
                break l;
            }
            if let Some(why) = lock(&self.inner.aborted_early).get(&f.launch_id) {
                return Err(why.clone());
            }
            if t0.elapsed() >= self.inner.cfg.fence_timeout {
                return Err(format!("launch {} is not known on this node", f.launch_id));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if l.work.node_index != 0 {
            return Err(format!("this node is not launch {}'s head", f.launch_id));
        }
        self.head_fence(&l, f)
    }

    fn abort(&self, launch_id: &str, token: &str, reason: &str, _from: u32) -> bool {
        match self.launch(launch_id) {
            Some(l) if l.work.token == token => {
                self.abort_launch(&l, reason.to_string(), false);
                true
            }
            Some(_) => false,
            None => {
                let mut early = lock(&self.inner.aborted_early);
                if early.len() >= 1024 {
                    early.pop_first();
                }
                early.insert(launch_id.to_string(), reason.to_string());
                false
            }
        }
    }

    fn exec(
        &self,
        alloc: &str,
        token: &str,
        argv: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<std::sync::mpsc::Receiver<ExecEvent>, String> {
        let info = self.alloc_soon(alloc)?;
        if info.token.as_deref() != Some(token) || token.is_empty() {
            return Err(format!("not allocation {alloc}'s launch token"));
        }
        let Some((prog, args)) = argv.split_first() else {
            return Err("nothing to run".into());
        };
        let mut cmd = if info.mounted {
            let mut c = Command::new("nsenter");
            c.args(["--target", &info.pid.to_string(), "--mount", "--"]).arg(prog);
            c
        } else {
            Command::new(prog)
        };
        cmd.args(args)
            .envs(info.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let (tx, rx) = std::sync::mpsc::channel();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let execs = self.inner.clone();
        let alloc = alloc.to_string();
        // The thread that starts it waits for it (the parent-death signal is tied to it).
        std::thread::spawn(move || {
            // SAFETY: prctl is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    crate::runner::default_signals();
                    Ok(())
                });
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    let _ = started_tx.send(Err(e.to_string()));
                    return;
                }
            };
            lock(&execs.execs).entry(alloc.clone()).or_default().push(child.id());
            let _ = started_tx.send(Ok(()));
            let mut readers = Vec::new();
            if let Some(mut out) = child.stdout.take() {
                let tx = tx.clone();
                readers.push(std::thread::spawn(move || {
                    pump(&mut out, |b| tx.send(ExecEvent::Stdout(b)).is_ok())
                }));
            }
            if let Some(mut err) = child.stderr.take() {
                let tx = tx.clone();
                readers.push(std::thread::spawn(move || {
                    pump(&mut err, |b| tx.send(ExecEvent::Stderr(b)).is_ok())
                }));
            }
            let st = child.wait();
            for r in readers {
                let _ = r.join();
            }
            if let Some(pids) = lock(&execs.execs).get_mut(&alloc) {
                pids.retain(|p| *p != child.id());
            }
            let code = match st {
                Ok(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)),
                Err(_) => -1,
            };
            let _ = tx.send(ExecEvent::Exit(code));
        });
        match started_rx.recv() {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(e)) => Err(format!("cannot start {prog}: {e}")),
            Err(_) => Err(format!("cannot start {prog}")),
        }
    }

    fn attach(&self, start: AttachStart) -> Result<AttachSession, String> {
        self.open_terminal(start)
    }
}

impl Tasks {
    /// A terminal inside allocation `s.alloc` ([`crate::attach`]), for whoever presents its token.
    fn open_terminal(&self, s: AttachStart) -> Result<AttachSession, String> {
        let info = self.alloc_soon(&s.alloc)?;
        if info.token.as_deref() != Some(s.token.as_str()) || s.token.is_empty() {
            return Err(format!("not allocation {}'s launch token", s.alloc));
        }
        if info.mounted && info.pid == 0 {
            return Err(format!(
                "allocation {}'s uenv is no longer mounted on this node (its entrypoint ended here)",
                s.alloc
            ));
        }
        let (on, off) = (self.inner.clone(), self.inner.clone());
        let (a1, a2) = (s.alloc.clone(), s.alloc.clone());
        let t = crate::attach::Terminal {
            command: s.command.as_deref(),
            rows: s.rows,
            cols: s.cols,
            term: s.term.as_deref(),
        };
        crate::attach::open(
            &s.alloc,
            &info,
            t,
            move |pid| lock(&on.execs).entry(a1).or_default().push(pid),
            move |pid| {
                if let Some(pids) = lock(&off.execs).get_mut(&a2) {
                    pids.retain(|p| *p != pid);
                }
            },
        )
        .map_err(|e| format!("cannot open a terminal: {e}"))
    }
}

fn pump(r: &mut impl Read, mut send: impl FnMut(Vec<u8>) -> bool) {
    let mut buf = [0u8; 16384];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if !send(buf[..n].to_vec()) {
                    return;
                }
            }
        }
    }
}

/// The newest [`RANK_TAIL`] bytes of a rank's output file, as text.
fn tail(path: &std::path::Path) -> String {
    use std::io::{Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(RANK_TAIL);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_ok() {
        let _ = f.take(RANK_TAIL).read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::TaskPeer;

    /// A rank in `sh` speaking PMI-1 on fd 3: init, put its key, fence, get the other rank's key.
    const RANK: &str = r#"
printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&3; read -r l <&3
printf 'cmd=put kvsname=k key=r%s value=v%s\n' "$PMI_RANK" "$PMI_RANK" >&3; read -r l <&3
printf 'cmd=barrier_in\n' >&3; read -r l <&3
printf 'cmd=get kvsname=k key=r%s\n' $((1 - PMI_RANK)) >&3; read -r l <&3
echo "rank $PMI_RANK of $PMI_SIZE local $LATTICE_LOCAL_RANK/$LATTICE_LOCAL_SIZE nodes $LATTICE_NNODES got $l $FROM_ALLOC $SLURM_PROCID"
echo "err $PMI_RANK" >&2
printf 'cmd=finalize\n' >&3; read -r l <&3
"#;

    fn tasks(node: &str, tag: &str, fence_timeout: Duration) -> (Tasks, PathBuf) {
        let dir = std::env::temp_dir().join(format!("lattice-tasks-{tag}-{node}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let t = Tasks::new(TasksConfig {
            node: node.into(),
            log_dir: dir.clone(),
            grace: Duration::from_millis(200),
            fence_timeout,
            slurm_env: true,
            alloc_wait: Duration::from_millis(100),
        });
        t.alloc_started(
            "a-1",
            AllocInfo {
                env: vec![("FROM_ALLOC".into(), "yes".into())],
                pid: std::process::id(),
                mounted: false,
                token: Some("secret".into()),
            },
        );
        (t, dir)
    }

    fn work(entrypoint: &str, peers: Vec<TaskPeer>, node_index: u32) -> TaskLaunch {
        TaskLaunch {
            launch_id: "a-1.1".into(),
            alloc: "a-1".into(),
            entrypoint: entrypoint.into(),
            env: vec![],
            world_size: peers.iter().map(|p| p.num_ranks).sum(),
            node_index,
            peers,
            token: "t".into(),
            fence_timeout_s: None,
        }
    }

    fn peer(node: &str, address: Option<String>, first_rank: u32, num_ranks: u32) -> TaskPeer {
        TaskPeer {
            node: node.into(),
            address,
            first_rank,
            num_ranks,
        }
    }

    fn ended(t: &Tasks, within: Duration) -> TaskEnd {
        let t0 = Instant::now();
        loop {
            if let Some(e) = t.take_ended().pop() {
                return e;
            }
            assert!(t0.elapsed() < within, "the launch did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn local_ranks_exchange_keys_through_a_fence_with_their_output_kept_apart() {
        let (t, dir) = tasks("n0", "local", Duration::from_secs(10));
        t.start(work(RANK, vec![peer("n0", None, 0, 2)], 0));
        let e = ended(&t, Duration::from_secs(10));
        assert_eq!(e.reason, None, "{e:?}");
        assert_eq!(
            e.ranks.iter().map(|r| (r.rank, r.code)).collect::<Vec<_>>(),
            vec![(0, 0), (1, 0)]
        );
        assert_eq!(
            e.ranks[0].stdout,
            "rank 0 of 2 local 0/2 nodes 1 got cmd=get_result rc=0 msg=success value=v1 yes 0\n"
        );
        assert_eq!(
            e.ranks[1].stdout,
            "rank 1 of 2 local 1/2 nodes 1 got cmd=get_result rc=0 msg=success value=v0 yes 1\n"
        );
        assert_eq!(e.ranks[1].stderr, "err 1\n");
        assert_eq!(std::fs::read_to_string(dir.join("a-1.1.0.err")).unwrap(), "err 0\n");
        assert!(t.running().is_empty());
    }

    #[test]
    fn a_fence_spans_two_agents_over_their_service() {
        let (t0, _) = tasks("n0", "span", Duration::from_secs(10));
        let (t1, _) = tasks("n1", "span", Duration::from_secs(10));
        let a0 = t0.serve("127.0.0.1:0").unwrap().to_string();
        let a1 = t1.serve("127.0.0.1:0").unwrap().to_string();
        let peers = vec![peer("n0", Some(a0), 0, 1), peer("n1", Some(a1), 1, 1)];
        // The other node gets its part first: its fence waits for the head to know the launch.
        t1.start(work(RANK, peers.clone(), 1));
        std::thread::sleep(Duration::from_millis(100));
        t0.start(work(RANK, peers, 0));
        let (e0, e1) = (ended(&t0, Duration::from_secs(10)), ended(&t1, Duration::from_secs(10)));
        assert_eq!((e0.reason.clone(), e1.reason.clone()), (None, None), "{e0:?} {e1:?}");
        assert!(
            e0.ranks[0]
                .stdout
                .contains("rank 0 of 2 local 0/1 nodes 2 got cmd=get_result rc=0 msg=success value=v1")
        );
        assert!(
            e1.ranks[0]
                .stdout
                .contains("rank 1 of 2 local 0/1 nodes 2 got cmd=get_result rc=0 msg=success value=v0")
        );
        // While a launch runs, a fence or an abort with another token is refused, and changes nothing.
        let peers = vec![
            peer("n0", Some("127.0.0.1:9".into()), 0, 1),
            peer("n1", Some("127.0.0.1:9".into()), 1, 1),
        ];
        t0.start(TaskLaunch {
            launch_id: "a-1.2".into(),
            ..work("exec sleep 30", peers, 0)
        });
        let forged = FenceIn {
            launch_id: "a-1.2".into(),
            token: "wrong".into(),
            node_index: 1,
            epoch: 0,
            puts: vec![("k".into(), "v".into())],
        };
        assert_eq!(
            PeerHandler::fence(&t0, forged),
            Err("not this launch's token".to_string())
        );
        assert!(!PeerHandler::abort(&t0, "a-1.2", "wrong", "forged", 1));
        assert_eq!(t0.running(), vec!["a-1.2".to_string()]);
        assert!(lock(&t0.launch("a-1.2").unwrap().st).head_in.is_empty());
        t0.alloc_ended("a-1");
        assert_eq!(
            ended(&t0, Duration::from_secs(5)).reason.as_deref(),
            Some("allocation ended")
        );
    }

    #[test]
    fn a_fence_that_never_completes_aborts_every_rank_with_the_seeds_message() {
        let (t0, _) = tasks("n0", "timeout", Duration::from_secs(10));
        let (t1, _) = tasks("n1", "timeout", Duration::from_secs(10));
        let a0 = t0.serve("127.0.0.1:0").unwrap().to_string();
        let a1 = t1.serve("127.0.0.1:0").unwrap().to_string();
        let peers = vec![peer("n0", Some(a0), 0, 1), peer("n1", Some(a1), 1, 1)];
        // Rank 1 never enters the fence.
        let script = r#"if [ "$PMI_RANK" = 1 ]; then exec sleep 30; fi
printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&3; read -r l <&3
printf 'cmd=barrier_in\n' >&3; read -r l <&3; echo "never here""#;
        let mut w0 = work(script, peers.clone(), 0);
        let mut w1 = work(script, peers, 1);
        w0.fence_timeout_s = Some(0.5);
        w1.fence_timeout_s = Some(0.5);
        let started = Instant::now();
        t0.start(w0);
        t1.start(w1);
        let (e0, e1) = (ended(&t0, Duration::from_secs(10)), ended(&t1, Duration::from_secs(10)));
        assert_eq!(e0.reason.as_deref(), Some("PMI fence timeout"));
        assert_eq!(e1.reason.as_deref(), Some("PMI fence timeout"));
        // Both ranks were stopped (SIGTERM), well before rank 1's 30 s.
        assert_eq!((e0.ranks[0].code, e1.ranks[0].code), (143, 143));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!e0.ranks[0].stdout.contains("never here"));
    }

    #[test]
    fn a_failing_rank_aborts_the_others_and_says_which() {
        let (t, _) = tasks("n0", "fail", Duration::from_secs(10));
        t.start(work(
            r#"if [ "$PMI_RANK" = 1 ]; then exit 3; fi; exec sleep 30"#,
            vec![peer("n0", None, 0, 2)],
            0,
        ));
        let e = ended(&t, Duration::from_secs(5));
        assert_eq!(e.reason.as_deref(), Some("rank 1 exited with code 3"));
        assert_eq!(e.ranks.iter().map(|r| r.code).collect::<Vec<_>>(), vec![143, 3]);
        // A rank's PMI abort, too.
        t.start(TaskLaunch {
            launch_id: "a-1.2".into(),
            ..work(
                r#"printf 'cmd=abort exitcode=9\n' >&3; exec sleep 30"#,
                vec![peer("n0", None, 0, 1)],
                0,
            )
        });
        let e = ended(&t, Duration::from_secs(5));
        assert_eq!(e.reason.as_deref(), Some("rank 0 called abort (exit code 9)"));
    }

    #[test]
    fn tasks_need_their_allocation_here_and_end_with_it() {
        let (t, _) = tasks("n0", "alloc", Duration::from_secs(10));
        t.start(TaskLaunch {
            alloc: "a-2".into(),
            ..work("true", vec![peer("n0", None, 0, 1)], 0)
        });
        let e = ended(&t, Duration::from_secs(1));
        assert_eq!(e.reason.as_deref(), Some("allocation a-2 does not run on this node"));
        assert!(e.ranks.is_empty());
        t.start(work("exec sleep 30", vec![peer("n0", None, 0, 1)], 0));
        std::thread::sleep(Duration::from_millis(100));
        t.alloc_ended("a-1");
        let e = ended(&t, Duration::from_secs(5));
        assert_eq!(e.reason.as_deref(), Some("allocation ended"));
        assert_eq!(e.ranks[0].code, 143);
    }

    #[test]
    fn exec_runs_inside_an_allocation_for_its_token_only() {
        let (t, _) = tasks("n0", "exec", Duration::from_secs(10));
        assert!(PeerHandler::exec(&t, "a-1", "nope", vec!["true".into()], vec![]).is_err());
        assert!(PeerHandler::exec(&t, "a-9", "secret", vec!["true".into()], vec![]).is_err());
        let rx = PeerHandler::exec(
            &t,
            "a-1",
            "secret",
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo $FROM_ALLOC $X; echo e >&2; exit 4".into(),
            ],
            vec![("X".into(), "1".into())],
        )
        .unwrap();
        let events: Vec<ExecEvent> = rx.iter().collect();
        assert!(events.contains(&ExecEvent::Stdout(b"yes 1\n".to_vec())), "{events:?}");
        assert!(events.contains(&ExecEvent::Stderr(b"e\n".to_vec())));
        assert_eq!(events.last(), Some(&ExecEvent::Exit(4)));
    }
}
