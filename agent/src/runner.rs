//! Runs one allocation's entrypoint on this node as a real process: `/bin/sh -c ENTRYPOINT` in its
//! own process group with the seed's environment, stdout and stderr captured into a bounded ring
//! buffer (the newest bytes win; how many were dropped is counted) that is written to the log
//! directory when the process ends. At the walltime the whole group gets SIGTERM, and SIGKILL after
//! the grace period; a stop request (cancel, preemption) does the same at once.

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Ring buffer size (the seed's default is 64 MiB).
    pub ring_bytes: usize,
}

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
    /// The output kept (at most `ring_bytes`), and how many older bytes were dropped.
    pub output: Vec<u8>,
    pub dropped: u64,
    pub log: PathBuf,
}

/// A bounded byte ring: appends drop the oldest bytes beyond the capacity.
#[derive(Debug, Default)]
pub struct Ring {
    buf: VecDeque<u8>,
    cap: usize,
    dropped: u64,
}

impl Ring {
    pub fn new(cap: usize) -> Ring {
        Ring {
            buf: VecDeque::new(),
            cap,
            dropped: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let bytes = if bytes.len() > self.cap {
            self.dropped += (bytes.len() - self.cap) as u64;
            &bytes[bytes.len() - self.cap..]
        } else {
            bytes
        };
        let over = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.dropped += over as u64;
        self.buf.extend(bytes);
    }

    pub fn contents(&self) -> Vec<u8> {
        self.buf.iter().copied().collect()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// A started process.
pub struct Running {
    pub id: String,
    pub pid: u32,
    stop: Arc<AtomicBool>,
    done: std::thread::JoinHandle<Outcome>,
}

impl Running {
    /// Asks it to stop (SIGTERM to its group, SIGKILL after the grace period).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
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

/// Starts `spec` (the process group is the child's pid).
pub fn start(spec: RunSpec) -> std::io::Result<Running> {
    std::fs::create_dir_all(&spec.log_dir)?;
    let id = spec.id.clone();
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(&spec.entrypoint)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let pid = child.id();
    let ring = Arc::new(Mutex::new(Ring::new(spec.ring_bytes)));
    let mut readers = Vec::new();
    let out: Vec<Box<dyn Read + Send>> = vec![
        Box::new(child.stdout.take().expect("piped")),
        Box::new(child.stderr.take().expect("piped")),
    ];
    for mut r in out {
        let ring = ring.clone();
        readers.push(std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                ring.lock().unwrap_or_else(|e| e.into_inner()).push(&buf[..n]);
            }
        }));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let done = std::thread::spawn(move || {
        let t0 = Instant::now();
        let pgid = pid as i32;
        let mut term: Option<(Instant, Ending)> = None;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => {}
                Err(_) => break None,
            }
            if term.is_none() {
                let why = if stop2.load(Ordering::SeqCst) {
                    Some(Ending::Stopped)
                } else if spec.walltime.is_some_and(|w| t0.elapsed() >= w) {
                    Some(Ending::Walltime)
                } else {
                    None
                };
                if let Some(why) = why {
                    signal_group(pgid, libc::SIGTERM);
                    term = Some((Instant::now(), why));
                }
            } else if let Some((at, _)) = &term
                && at.elapsed() >= spec.grace
            {
                signal_group(pgid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Whatever the entrypoint left behind in its group goes too (it would hold the pipes open).
        signal_group(pgid, libc::SIGKILL);
        for r in readers {
            let _ = r.join();
        }
        let ending = match (term, status) {
            (Some((_, why)), _) => why,
            (None, Some(st)) => Ending::Exited(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))),
            (None, None) => Ending::Exited(-1),
        };
        let r = ring.lock().unwrap_or_else(|e| e.into_inner());
        let log = spec.log_dir.join(format!("{}.log", spec.id));
        let _ = std::fs::write(&log, r.contents());
        Outcome {
            ending,
            output: r.contents(),
            dropped: r.dropped(),
            log,
        }
    });
    Ok(Running { id, pid, stop, done })
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
        }
    }

    #[test]
    fn exit_codes_output_and_environment() {
        let o = start(spec("a1", "echo hi $LATTICE_ALLOC_ID; echo err >&2; exit 3", None))
            .unwrap()
            .wait();
        assert_eq!(o.ending, Ending::Exited(3));
        let text = String::from_utf8_lossy(&o.output);
        assert!(text.contains("hi a1") && text.contains("err"), "{text}");
        assert_eq!(std::fs::read(&o.log).unwrap(), o.output);
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
    fn the_ring_keeps_the_newest_bytes_and_counts_the_rest() {
        let mut r = Ring::new(8);
        r.push(b"0123");
        r.push(b"456789");
        assert_eq!(r.contents(), b"23456789");
        assert_eq!(r.dropped(), 2);
        r.push(b"abcdefghijkl");
        assert_eq!(r.contents(), b"efghijkl");
        assert_eq!(r.dropped(), 2 + 8 + 4);
        let o = start(spec("a4", "head -c 1000 /dev/zero | tr '\\0' x", None))
            .unwrap()
            .wait();
        assert_eq!((o.output.len(), o.dropped), (64, 936));
    }
}
