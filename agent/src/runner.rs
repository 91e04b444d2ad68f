//! Runs one allocation's entrypoint on this node as a real process: `/bin/sh -c ENTRYPOINT` in its
//! own process group with the seed's environment. Its stdout goes straight to `LOG_DIR/ID.log` and
//! its stderr to `LOG_DIR/ID.err` (not through the agent, so the process outlives an agent restart),
//! and a small wrapper shell writes its exit status to `LOG_DIR/ID.status`. When it ends, the newest
//! `ring_bytes` of each are the outcome's output (how many older bytes there were is counted). At
//! the walltime the whole group gets SIGTERM, and SIGKILL after the grace period; a stop request
//! (cancel, preemption) does the same at once. [`attach`] takes over a process a previous agent
//! started (found alive with `kill(pid, 0)`), enforcing the same walltime from its recorded start.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub id: String,
    pub entrypoint: String,
    pub env: Vec<(String, String)>,
    pub walltime: Option<Duration>,
    /// SIGTERM → SIGKILL.
    pub grace: Duration,
    pub log_dir: PathBuf,
    /// How much of the newest output an outcome carries in memory (the seed's ring: 64 MiB).
    pub ring_bytes: usize,
    /// Its checkpoint mechanism's name (kept in the state file for a restarted agent).
    pub checkpoint: String,
    /// Whose it is: where its logs go in the log store.
    pub tenant: String,
    pub project: Option<String>,
    /// What to mount in a private mount namespace of the process tree before the task starts: a uenv
    /// (see [`crate::uenv`]), data mounts (see [`crate::data`]). None: no namespace of its own.
    pub mounts: Vec<Mount>,
    /// Audit mode: the cgroup its process tree runs in (entered before exec).
    pub cgroup: Option<std::sync::Arc<crate::cgroup::Group>>,
}

/// One mount in an allocation's mount namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mount {
    /// A uenv SquashFS image, read-only.
    Squashfs { image: PathBuf, at: PathBuf },
    /// A directory of this node (a data mount), its mount point created when missing.
    Bind {
        from: PathBuf,
        at: PathBuf,
        read_only: bool,
    },
}

impl Mount {
    /// The wrapper's three arguments for it.
    fn args(&self) -> [std::ffi::OsString; 3] {
        let (kind, a, b) = match self {
            Mount::Squashfs { image, at } => ("squashfs", image, at),
            Mount::Bind {
                from,
                at,
                read_only: false,
            } => ("bind", from, at),
            Mount::Bind {
                from,
                at,
                read_only: true,
            } => ("bind-ro", from, at),
        };
        [kind.into(), a.into(), b.into()]
    }
}

/// The wrapper: it outlives a SIGTERM or a checkpoint hint (SIGUSR1) to the group (handlers, not
/// ignores: the task still gets the signals) until the task ends, then records its status.
const WRAPPER: &str = r#"trap 'true' TERM USR1; /bin/sh -c "$1"; c=$?; echo $c > "$2"; exit $c"#;

/// [`WRAPPER`] in its own mount namespace (`unshare --mount --propagation private`) after making the
/// mounts given as `KIND FROM AT` triples after `$2` ([`Mount::args`]): only this process tree sees
/// them, and they go with the tree (nothing to unmount, also after an agent restart). A mount that
/// fails ends the task with 125 and says so on its stderr.
const NS_WRAPPER: &str = r#"t="$1"; s="$2"; shift 2
fail() { echo "$1" >&2; echo 125 > "$s"; exit 125; }
while [ $# -ge 3 ]; do
  case "$1" in
    squashfs) mount -t squashfs -o loop,ro "$2" "$3" || fail "uenv mount failed: $2 at $3" ;;
    bind) { mkdir -p "$3" && mount --bind "$2" "$3"; } || fail "data mount failed: $2 at $3" ;;
    bind-ro) { mkdir -p "$3" && mount --bind "$2" "$3" && mount -o remount,bind,ro "$3"; } || fail "data mount failed: $2 at $3" ;;
  esac
  shift 3
done
trap 'true' TERM USR1; /bin/sh -c "$t"; c=$?; echo $c > "$s"; exit $c"#;

/// How it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Exited by itself (code, or 128 + signal when a signal ended it).
    Exited(i32),
    /// Killed at its walltime.
    Walltime,
    /// Stopped on request.
    Stopped,
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub ending: Ending,
    /// The stdout kept (at most `ring_bytes`), and how many older bytes were dropped.
    pub output: Vec<u8>,
    pub dropped: u64,
    /// The stderr kept (at most `ring_bytes`).
    pub errors: Vec<u8>,
    pub log: PathBuf,
}

/// A started process.
pub struct Running {
    pub id: String,
    pub pid: u32,
    /// What the state file keeps of it.
    pub record: Record,
    stop: Arc<AtomicBool>,
    done: std::thread::JoinHandle<Outcome>,
}

impl Running {
    /// Asks it to stop (SIGTERM to its group, SIGKILL after the grace period).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// A handle that stops it like [`Running::stop`], for another thread (the fence).
    pub fn stopper(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Sends `sig` to its process group (a checkpoint hint is SIGUSR1).
    pub fn signal(&self, sig: i32) {
        signal_group(self.pid as i32, sig);
    }

    pub fn is_finished(&self) -> bool {
        self.done.is_finished()
    }

    /// Waits for it to end.
    pub fn wait(self) -> Outcome {
        self.done.join().unwrap_or_else(|_| Outcome {
            ending: Ending::Exited(-1),
            output: Vec::new(),
            dropped: 0,
            errors: Vec::new(),
            log: PathBuf::new(),
        })
    }
}

fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: killpg only sends a signal; a group that is gone yields ESRCH, which is fine.
    unsafe {
        libc::killpg(pgid, sig);
    }
}

/// What the agent's state file keeps of a running process, to take it over after a restart.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Record {
    pub id: String,
    pub pid: u32,
    /// Wall-clock start, ms since the epoch.
    pub started_ms: u64,
    pub walltime_s: Option<f64>,
    pub grace_ms: u64,
    pub log: PathBuf,
    pub status: PathBuf,
    pub ring_bytes: usize,
    #[serde(default)]
    pub checkpoint: String,
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub project: Option<String>,
    /// The cached uenv image it has mounted (its file name): pinned in the cache while it runs, also
    /// for an agent that took it over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its tools uenv's cached image (file name), pinned likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_image: Option<String>,
    /// It runs in a mount namespace of its own (a uenv, data mounts): task launches and terminals
    /// join it. (A record from before this field: it had one when it had a uenv.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub namespace: bool,
    /// The allocation's launch token (`lattice-mpi-launcher` presents it), kept for a restarted agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_token: Option<String>,
    /// Its OCI container's name: deleted (with its bundle) when the process ends, also for an agent
    /// that took it over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Its liveness probe, kept for an agent that takes it over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<crate::probe::ProbeSpec>,
}

impl Record {
    /// The cached images it has mounted (pinned while it runs).
    pub fn images(&self) -> impl Iterator<Item = &String> {
        self.image.iter().chain(self.tools_image.iter())
    }

    /// Whether its processes have a mount namespace of their own.
    pub fn has_namespace(&self) -> bool {
        self.namespace || self.image.is_some()
    }

    /// Where its stderr is (beside its stdout's `ID.log`: `ID.err`).
    pub fn err_log(&self) -> PathBuf {
        self.log.with_extension("err")
    }
}

/// Gives a child about to `exec` the default signal dispositions and an empty signal mask: an agent
/// started with signals ignored or blocked (`nohup`, a background job of a non-interactive shell,
/// some service managers) would otherwise pass that on, and a job's Ctrl-C, hang-up or walltime
/// SIGTERM would not reach it.
///
/// # Safety
/// Only between `fork` and `exec` (`pre_exec`): `signal` and `sigprocmask` are async-signal-safe.
pub unsafe fn default_signals() {
    for sig in [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGCHLD,
        libc::SIGPIPE,
    ] {
        // SAFETY: per the function's contract.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    // SAFETY: as above; an empty set is a valid mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Wall-clock ms since the epoch.
pub fn wall_ms() -> u64 {
    lattice_util::clock::epoch_ms()
}

/// Whether `pid` is alive (`kill(pid, 0)`; a zombie of ours counts as ended once waited).
pub fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// The newest `cap` bytes of `path`, and how many came before them.
fn tail(path: &std::path::Path, cap: usize) -> (Vec<u8>, u64) {
    use std::io::{Seek, SeekFrom};
    let Some(mut f) = regular_file(path) else {
        return (Vec::new(), 0);
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(cap as u64);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_ok() {
        // Never more than the file held when asked (it may still grow) nor than the ring.
        let _ = f.take((len - from).min(cap as u64)).read_to_end(&mut buf);
    }
    (buf, from)
}

/// `path` opened for reading when it is a regular file. Paths come from the state file, which a
/// crash or an edit may have corrupted: a device (`/dev/zero`), a FIFO or a directory there must
/// not hang the agent's start-up or fill its memory.
fn regular_file(path: &std::path::Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO nobody writes does not wait for a writer.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    f.metadata().ok()?.is_file().then_some(f)
}

fn status_code(path: &std::path::Path) -> Option<i32> {
    let mut text = String::new();
    regular_file(path)?.take(64).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Starts `spec` (the process group is the child's pid); its [`Record`] is `Running::record`.
pub fn start(spec: RunSpec) -> std::io::Result<Running> {
    std::fs::create_dir_all(&spec.log_dir)?;
    let log = spec.log_dir.join(format!("{}.log", spec.id));
    let status = spec.log_dir.join(format!("{}.status", spec.id));
    let _ = std::fs::remove_file(&status);
    let out = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log.with_extension("err"))?;
    let mut command = if spec.mounts.is_empty() {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(WRAPPER);
        c
    } else {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "/bin/sh", "-c", NS_WRAPPER]);
        c
    };
    command.arg("lattice-task").arg(&spec.entrypoint).arg(&status);
    for m in &spec.mounts {
        command.args(m.args());
    }
    command
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            default_signals();
            Ok(())
        });
    }
    if let Some(g) = &spec.cgroup {
        g.enter_on_exec(&mut command);
    }
    let child = command.spawn()?;
    // The uenv's image first, then the tools uenv's ([`crate::agent`]'s mount order).
    let mut squashfs = spec.mounts.iter().filter_map(|m| match m {
        Mount::Squashfs { image, .. } => image.file_name().map(|f| f.to_string_lossy().into_owned()),
        Mount::Bind { .. } => None,
    });
    let record = Record {
        id: spec.id.clone(),
        pid: child.id(),
        started_ms: wall_ms(),
        walltime_s: spec.walltime.map(|w| w.as_secs_f64()),
        grace_ms: spec.grace.as_millis() as u64,
        log,
        status,
        ring_bytes: spec.ring_bytes,
        checkpoint: spec.checkpoint.clone(),
        tenant: spec.tenant.clone(),
        project: spec.project.clone(),
        image: squashfs.next(),
        tools_image: squashfs.next(),
        namespace: !spec.mounts.is_empty(),
        launch_token: None,
        container: None,
        liveness: None,
    };
    Ok(watch(record, Some(child)))
}

/// Takes over a process a previous agent started: `None` when it is no longer alive.
pub fn attach(record: Record) -> Option<Running> {
    owns(&record).then(|| watch(record, None))
}

/// Whether `record.pid` is the wrapper its allocation was started with: alive, and its command line
/// is `lattice-task` naming the record's own status file. A state file corrupted or edited to name
/// another process — `init`, the agent itself, anyone's — is never taken over, so that process is
/// never signalled at a walltime or a stop (the record is reported ended instead).
pub fn owns(record: &Record) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if record.pid <= 1 || !alive(record.pid) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", record.pid)) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|c| *c == 0).collect();
    args.contains(&b"lattice-task".as_slice()) && args.contains(&record.status.as_os_str().as_bytes())
}

/// What a process that ended while no agent watched it left behind (its status file and log).
pub fn ended_unwatched(record: &Record) -> Outcome {
    let (output, dropped) = tail(&record.log, record.ring_bytes);
    Outcome {
        ending: Ending::Exited(status_code(&record.status).unwrap_or(-1)),
        output,
        dropped,
        errors: tail(&record.err_log(), record.ring_bytes).0,
        log: record.log.clone(),
    }
}

fn watch(record: Record, mut child: Option<std::process::Child>) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let r = record.clone();
    let done = std::thread::spawn(move || {
        let pgid = r.pid as i32;
        let started = r.started_ms;
        let grace = Duration::from_millis(r.grace_ms);
        let mut term: Option<(Instant, Ending)> = None;
        let code = loop {
            match child.as_mut() {
                Some(c) => match c.try_wait() {
                    Ok(Some(st)) => break Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))),
                    Ok(None) => {}
                    Err(_) => break None,
                },
                None if !alive(r.pid) => break status_code(&r.status),
                None => {}
            }
            if term.is_none() {
                let ran = Duration::from_millis(wall_ms().saturating_sub(started));
                let why = if stop2.load(Ordering::SeqCst) {
                    Some(Ending::Stopped)
                } else if r.walltime_s.is_some_and(|w| ran.as_secs_f64() >= w) {
                    Some(Ending::Walltime)
                } else {
                    None
                };
                if let Some(why) = why {
                    signal_group(pgid, libc::SIGTERM);
                    term = Some((Instant::now(), why));
                }
            } else if let Some((at, _)) = &term
                && at.elapsed() >= grace
            {
                signal_group(pgid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Whatever the entrypoint left behind in its group goes too.
        signal_group(pgid, libc::SIGKILL);
        let ending = match (term, code) {
            (Some((_, why)), _) => why,
            (None, Some(c)) => Ending::Exited(c),
            (None, None) => Ending::Exited(-1),
        };
        let (output, dropped) = tail(&r.log, r.ring_bytes);
        Outcome {
            ending,
            output,
            dropped,
            errors: tail(&r.err_log(), r.ring_bytes).0,
            log: r.log.clone(),
        }
    });
    Running {
        id: record.id.clone(),
        pid: record.pid,
        record,
        stop,
        done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, cmd: &str, walltime_ms: Option<u64>) -> RunSpec {
        RunSpec {
            id: id.into(),
            entrypoint: cmd.into(),
            env: vec![("LATTICE_ALLOC_ID".into(), id.into())],
            walltime: walltime_ms.map(Duration::from_millis),
            grace: Duration::from_millis(300),
            log_dir: std::env::temp_dir().join(format!("lattice-agent-run-{}", std::process::id())),
            ring_bytes: 64,
            checkpoint: "signal".into(),
            tenant: "physics".into(),
            project: None,
            mounts: Vec::new(),
            cgroup: None,
        }
    }

    #[test]
    fn exit_codes_output_and_environment() {
        let o = start(spec("a1", "echo hi $LATTICE_ALLOC_ID; echo err >&2; exit 3", None))
            .unwrap()
            .wait();
        assert_eq!(o.ending, Ending::Exited(3));
        // stdout and stderr kept apart, each in its own file.
        assert_eq!(String::from_utf8_lossy(&o.output), "hi a1\n");
        assert_eq!(String::from_utf8_lossy(&o.errors), "err\n");
        assert_eq!(std::fs::read(&o.log).unwrap(), o.output);
        assert_eq!(std::fs::read(o.log.with_extension("err")).unwrap(), o.errors);
        assert_eq!(
            std::fs::read_to_string(o.log.with_extension("status")).unwrap().trim(),
            "3"
        );
    }

    #[test]
    fn the_walltime_terms_then_kills_the_whole_group() {
        // The shell ignores SIGTERM, and a background child would keep running: SIGKILL after the grace.
        let t0 = Instant::now();
        let o = start(spec("a2", "trap '' TERM; sleep 30 & sleep 30", Some(200)))
            .unwrap()
            .wait();
        assert_eq!(o.ending, Ending::Walltime);
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }

    #[test]
    fn a_stop_request_ends_it() {
        let r = start(spec("a3", "sleep 30", None)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        r.stop();
        assert_eq!(r.wait().ending, Ending::Stopped);
    }

    #[test]
    fn a_restarted_agent_takes_over_a_live_process_and_reads_an_ended_ones_status() {
        let r = start(spec("a5", "sleep 0.5; echo done; exit 4", None)).unwrap();
        let rec = r.record.clone();
        assert!(owned_soon(&rec));
        // The agent "restarts": the new one attaches by pid and sees the end through the status file.
        drop(r);
        let again = attach(rec.clone()).expect("still alive");
        let o = again.wait();
        assert_eq!(o.ending, Ending::Exited(4));
        assert!(String::from_utf8_lossy(&o.output).contains("done"));
        assert!(attach(rec.clone()).is_none(), "gone now");
        assert_eq!(ended_unwatched(&rec).ending, Ending::Exited(4));
        // A taken-over process still gets its walltime from its recorded start.
        let w = start(spec("a6", "sleep 30", Some(300))).unwrap().record.clone();
        assert!(owned_soon(&w));
        let t0 = Instant::now();
        assert_eq!(attach(w).unwrap().wait().ending, Ending::Walltime);
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// A just-started wrapper shows its own command line within moments (a restarted agent reads it
    /// seconds later).
    fn owned_soon(rec: &Record) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            if owns(rec) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn a_state_file_naming_someone_elses_process_is_never_taken_over_nor_signalled() {
        let mine = start(spec("a7", "sleep 30", None)).unwrap();
        let rec = mine.record.clone();
        assert!(owned_soon(&rec), "{rec:?}");
        // A live process that is not a task of ours, the agent itself, init, pid 0.
        let mut other = Command::new("sleep").arg("30").spawn().unwrap();
        for pid in [other.id(), std::process::id(), 1, 0] {
            let forged = Record { pid, ..rec.clone() };
            assert!(!owns(&forged), "pid {pid}");
            assert!(attach(forged).is_none(), "pid {pid}");
        }
        // Another allocation's record (its status file) does not own this wrapper either.
        let theirs = Record {
            status: rec.status.with_file_name("a8.status"),
            ..rec.clone()
        };
        assert!(!owns(&theirs));
        // Nothing was signalled: the unrelated process still runs.
        assert!(other.try_wait().unwrap().is_none());
        let _ = other.kill();
        let _ = other.wait();
        mine.stop();
        assert_eq!(mine.wait().ending, Ending::Stopped);
    }

    #[test]
    fn the_output_keeps_the_newest_bytes_and_counts_the_rest() {
        let o = start(spec("a4", "head -c 1000 /dev/zero | tr '\\0' x", None))
            .unwrap()
            .wait();
        assert_eq!((o.output.len(), o.dropped), (64, 936));
    }
}
