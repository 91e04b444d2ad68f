//! Checkpoint hints to the application (book: "Checkpoint Broker", application protocol). The
//! mechanism is the one the allocation declared at submission:
//! - `signal`: SIGUSR1 to the task's process group (legacy; also `dmtcp`, whose coordinator is not
//!   integrated, gets the signal);
//! - `shmem`: a flag in a small shared-memory file (`LATTICE_CHECKPOINT_FLAG`, under `/dev/shm` by
//!   default): the agent sets byte 0 to 1; the application polls it, checkpoints, clears byte 0 and
//!   sets byte 1 ("done"), which the agent sees and clears;
//! - `grpc`: the application serves the `lattice.checkpoint.v1.CheckpointCallback` service on loopback
//!   and registers its `host:port` by writing it to `LATTICE_CHECKPOINT_ENDPOINT_FILE`; the agent calls
//!   it with timeouts (first answer, then completion). A deferral request is granted up to the maximum
//!   deferral (default 5 minutes), then the call is repeated as forced. No endpoint, no answer or an
//!   error falls back to SIGUSR1 — a hint is never silently lost.
//!
//! Completion (book: "signals completion via … a sentinel file"): an application that took a hint by
//! signal (or any mechanism) creates the file `LATTICE_CHECKPOINT_DONE` once its checkpoint is
//! written; shmem applications set the "done" byte, gRPC ones answer the call. The agent reports the
//! outcome (or a timeout) to the control plane, and during a preemption stops the task only then.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a task takes checkpoint hints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Signal,
    Shmem,
    Grpc,
    Dmtcp,
}

impl Mechanism {
    /// The runtime's name for it (unknown names are signals: the legacy default).
    pub fn parse(s: &str) -> Mechanism {
        match s {
            "shmem" => Mechanism::Shmem,
            "grpc" => Mechanism::Grpc,
            "dmtcp" => Mechanism::Dmtcp,
            _ => Mechanism::Signal,
        }
    }
}

/// Timeouts of the gRPC callback.
#[derive(Clone, Copy, Debug)]
pub struct CallbackTimeouts {
    /// For the application's first answer.
    pub answer: Duration,
    /// For the checkpoint to complete.
    pub deadline: Duration,
    /// The longest deferral granted in all.
    pub max_deferral: Duration,
}

impl Default for CallbackTimeouts {
    fn default() -> Self {
        CallbackTimeouts {
            answer: Duration::from_secs(5),
            deadline: Duration::from_secs(600),
            max_deferral: Duration::from_secs(300),
        }
    }
}

/// One allocation's checkpoint channel on this node.
#[derive(Clone, Debug)]
pub struct Channel {
    pub alloc: String,
    pub mechanism: Mechanism,
    /// `DIR/lattice-checkpoint-ID/`: `flag` (shmem) and `endpoint` (grpc).
    dir: PathBuf,
}

impl Channel {
    /// Creates the channel's files under `shm_dir` (shmem: the 2-byte flag, zeroed; grpc: the folder
    /// the endpoint file goes in; signals need none).
    pub fn create(shm_dir: &Path, alloc: &str, mechanism: Mechanism) -> std::io::Result<Channel> {
        let dir = shm_dir.join(format!("lattice-checkpoint-{alloc}"));
        std::fs::create_dir_all(&dir)?;
        let c = Channel {
            alloc: alloc.to_string(),
            mechanism,
            dir,
        };
        if mechanism == Mechanism::Shmem {
            std::fs::write(c.flag(), [0u8, 0u8])?;
        }
        Ok(c)
    }

    /// The channel of a process a previous agent started (its files are left as they are).
    pub fn reopen(shm_dir: &Path, alloc: &str, mechanism: Mechanism) -> Option<Channel> {
        let dir = shm_dir.join(format!("lattice-checkpoint-{alloc}"));
        dir.is_dir().then(|| Channel {
            alloc: alloc.to_string(),
            mechanism,
            dir,
        })
    }

    fn flag(&self) -> PathBuf {
        self.dir.join("flag")
    }

    fn endpoint_file(&self) -> PathBuf {
        self.dir.join("endpoint")
    }

    fn sentinel(&self) -> PathBuf {
        self.dir.join("done")
    }

    fn metrics_file(&self) -> PathBuf {
        self.dir.join("metrics")
    }

    /// Metrics the application reports for autoscaling (`LATTICE_METRICS_FILE`: lines `name value`,
    /// e.g. `queue_depth 12`; the file is rewritten by the application, the latest values count).
    pub fn app_metrics(&self) -> Vec<(String, f64)> {
        let Ok(text) = std::fs::read_to_string(self.metrics_file()) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (name, value) = (it.next()?, it.next()?.parse::<f64>().ok()?);
                value.is_finite().then(|| (name.to_string(), value))
            })
            .collect()
    }

    /// Whether the application created the completion file since the request (it is removed, ready
    /// for the next one).
    pub fn take_sentinel(&self) -> bool {
        std::fs::remove_file(self.sentinel()).is_ok()
    }

    /// Forgets an earlier completion before a new request.
    pub fn clear_sentinel(&self) {
        let _ = std::fs::remove_file(self.sentinel());
    }

    /// The variables that tell the task how hints reach it.
    pub fn env(&self) -> Vec<(String, String)> {
        let name = match self.mechanism {
            Mechanism::Signal => "signal",
            Mechanism::Shmem => "shmem",
            Mechanism::Grpc => "grpc",
            Mechanism::Dmtcp => "dmtcp",
        };
        let mut env = vec![
            ("LATTICE_CHECKPOINT_MECHANISM".to_string(), name.to_string()),
            (
                "LATTICE_CHECKPOINT_DONE".to_string(),
                self.sentinel().display().to_string(),
            ),
            (
                "LATTICE_METRICS_FILE".to_string(),
                self.metrics_file().display().to_string(),
            ),
        ];
        match self.mechanism {
            Mechanism::Shmem => env.push(("LATTICE_CHECKPOINT_FLAG".into(), self.flag().display().to_string())),
            Mechanism::Grpc => env.push((
                "LATTICE_CHECKPOINT_ENDPOINT_FILE".into(),
                self.endpoint_file().display().to_string(),
            )),
            _ => {}
        }
        env
    }

    /// Shmem: sets the request flag (byte 0) and clears "done" (byte 1).
    pub fn request(&self) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).open(self.flag())?;
        f.write_all(&[1u8, 0u8])?;
        f.sync_data()
    }

    /// Shmem: whether the application has set "done" since the request (then both bytes are cleared).
    pub fn take_done(&self) -> bool {
        let Ok(mut f) = std::fs::OpenOptions::new().read(true).write(true).open(self.flag()) else {
            return false;
        };
        let mut b = [0u8; 2];
        if f.read_exact(&mut b).is_err() || b[1] != 1 {
            return false;
        }
        let _ = f.seek(SeekFrom::Start(0)).and_then(|_| f.write_all(&[0u8, 0u8]));
        true
    }

    /// Grpc: the loopback port the allocation declared at submission (`--checkpoint-port`) is its
    /// endpoint until the application writes another.
    pub fn declare_port(&self, port: u16) -> std::io::Result<()> {
        if self.mechanism != Mechanism::Grpc {
            return Ok(());
        }
        std::fs::write(self.endpoint_file(), format!("127.0.0.1:{port}\n"))
    }

    /// Grpc: the endpoint the application registered (or the port it declared), if any.
    pub fn endpoint(&self) -> Option<String> {
        let s = std::fs::read_to_string(self.endpoint_file()).ok()?;
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_string())
    }

    /// Removes the channel's files (the allocation ended here).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What became of a gRPC hint (for the agent's log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcResult {
    Completed {
        deferred_s: u64,
        updates: u32,
    },
    /// The callback failed; SIGUSR1 was sent instead.
    FellBack(String),
}

/// Delivers a gRPC hint (blocking: run it on its own thread): calls the registered endpoint,
/// honours deferrals up to `t.max_deferral`, then forces; on failure signals `pgid` with SIGUSR1.
pub fn deliver_grpc(channel: &Channel, pgid: u32, t: CallbackTimeouts) -> GrpcResult {
    use lattice_node_adapters::checkpoint::{CallbackOutcome, call};
    let fall_back = |why: String| {
        // SAFETY: killpg only sends a signal; a gone group yields ESRCH.
        unsafe {
            libc::killpg(pgid as i32, libc::SIGUSR1);
        }
        GrpcResult::FellBack(why)
    };
    let Some(endpoint) = channel.endpoint() else {
        return fall_back("no checkpoint endpoint registered".into());
    };
    let mut deferred = Duration::ZERO;
    let mut forced = false;
    loop {
        match call(&endpoint, &channel.alloc, forced, t.answer, t.deadline) {
            Ok(CallbackOutcome::Completed { updates, .. }) => {
                return GrpcResult::Completed {
                    deferred_s: deferred.as_secs(),
                    updates,
                };
            }
            Ok(CallbackOutcome::Deferred(s)) => {
                let left = t.max_deferral.saturating_sub(deferred);
                let wait = Duration::from_secs(u64::from(s)).min(left);
                std::thread::sleep(wait);
                deferred += wait;
                forced = deferred >= t.max_deferral;
            }
            Err(e) => return fall_back(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shmem_flag_protocol() {
        let dir = std::env::temp_dir().join(format!("lattice-ckpt-{}", std::process::id()));
        let c = Channel::create(&dir, "a-1", Mechanism::Shmem).unwrap();
        let flag = PathBuf::from(&c.env()[3].1);
        assert_eq!(std::fs::read(&flag).unwrap(), [0, 0]);
        assert!(!c.take_done());
        c.request().unwrap();
        assert_eq!(std::fs::read(&flag).unwrap(), [1, 0]);
        assert!(!c.take_done(), "requested, not done");
        // The application clears the request and sets done.
        std::fs::write(&flag, [0u8, 1u8]).unwrap();
        assert!(c.take_done());
        assert_eq!(std::fs::read(&flag).unwrap(), [0, 0], "cleared for the next hint");
        assert!(!c.take_done());
        c.remove();
        assert!(!flag.exists());
    }

    #[test]
    fn mechanisms_and_their_environment() {
        let dir = std::env::temp_dir().join(format!("lattice-ckpt-env-{}", std::process::id()));
        assert_eq!(Mechanism::parse("grpc"), Mechanism::Grpc);
        assert_eq!(Mechanism::parse("anything"), Mechanism::Signal);
        let g = Channel::create(&dir, "a-2", Mechanism::Grpc).unwrap();
        let env: std::collections::BTreeMap<_, _> = g.env().into_iter().collect();
        assert_eq!(env["LATTICE_CHECKPOINT_MECHANISM"], "grpc");
        assert_eq!(g.endpoint(), None);
        g.declare_port(7777).unwrap();
        assert_eq!(g.endpoint().as_deref(), Some("127.0.0.1:7777"), "the declared port");
        std::fs::write(&env["LATTICE_CHECKPOINT_ENDPOINT_FILE"], "127.0.0.1:9999\n").unwrap();
        assert_eq!(
            g.endpoint().as_deref(),
            Some("127.0.0.1:9999"),
            "the application's own wins"
        );
        let s = Channel::create(&dir, "a-3", Mechanism::Signal).unwrap();
        let env: std::collections::BTreeMap<_, _> = s.env().into_iter().collect();
        assert_eq!(env.len(), 3);
        // Application-reported scaling metrics: `name value` lines; malformed ones are skipped.
        assert!(s.app_metrics().is_empty());
        std::fs::write(
            &env["LATTICE_METRICS_FILE"],
            "queue_depth 12\nbad line\nrequest_rate 3.5\n",
        )
        .unwrap();
        assert_eq!(
            s.app_metrics(),
            [("queue_depth".to_string(), 12.0), ("request_rate".to_string(), 3.5)]
        );
        // The application signals completion with the sentinel file; it is taken once.
        assert!(!s.take_sentinel());
        std::fs::write(&env["LATTICE_CHECKPOINT_DONE"], "").unwrap();
        assert!(s.take_sentinel());
        assert!(!s.take_sentinel());
        let _ = std::fs::remove_dir_all(dir);
    }
}
