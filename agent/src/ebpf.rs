//! eBPF telemetry (the `ebpf` feature; book: "Telemetry Architecture", layer 1). Two tracepoint
//! programs (`ebpf/lattice.s`, BPF assembly assembled with `llvm-mc` at build time, or the committed
//! `ebpf/lattice.bpf.o` where LLVM is not installed — no
//! nightly toolchain or bpf-linker needed) count per process (tgid):
//! - `sched/sched_switch`: the CPU time since the previous switch on that CPU is charged to the task
//!   switching out (`cpu_ns`, nanoseconds);
//! - `block/block_bio_queue` (runs in the submitter's context): bytes queued to block devices, read or
//!   written (`io_bytes`).
//!
//! - audit mode, `syscalls/sys_enter_openat`: every file a process in a watched cgroup (a sensitive
//!   allocation's own, [`crate::cgroup`]) opens, with its flags, into a ring buffer a thread of the
//!   agent empties as it fills; the agent takes them at each poll ([`Probes::drain_opens`]) and
//!   reports them, batched, for the quorum's audit log — and how many could not be recorded
//!   ([`Probes::opens_lost`]: a full ring or queue), never dropping them silently.
//!
//! aya loads them when the kernel allows (root or CAP_BPF + CAP_PERFMON, tracefs mounted — the agent
//! mounts it when it runs as root); otherwise [`load`] says "eBPF unavailable: <reason>" and the agent
//! keeps its /proc sampler. The agent sums the counters over the processes of each allocation's
//! process group it has seen ([`Counters::sum`]), so processes that exited between samples still
//! count, and drops map entries of processes that are gone and belong to no allocation.

use std::collections::{BTreeMap, BTreeSet};

/// The assembled object, 8-byte aligned (ELF64 parsing needs it).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lattice.bpf.o"));

/// The loaded programs and their maps.
pub struct Probes {
    bpf: aya::Ebpf,
    /// Audit mode's opens, taken off the ring buffer as they come by a thread of its own (`None`:
    /// its program could not attach here; the reason is in `audit_error`).
    opens: Option<Drainer>,
    pub audit_error: Option<String>,
}

/// The thread that empties the ring buffer as it fills (a process's start alone — the dynamic
/// loader trying each library directory — can open hundreds of files within a millisecond), into a
/// bounded queue the agent's poll takes from.
struct Drainer {
    queue: std::sync::Arc<std::sync::Mutex<Queue>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Tests hold the ring full with it.
    #[cfg_attr(not(test), allow(dead_code))]
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Opens waiting for the agent's poll, and those that did not fit.
#[derive(Default)]
struct Queue {
    opens: std::collections::VecDeque<Open>,
    overflow: u64,
}

/// At most this many opens wait between two polls; more are counted as not recorded.
const QUEUE_MAX: usize = 1_000_000;

impl Drainer {
    fn start(mut ring: aya::maps::RingBuf<aya::maps::MapData>) -> std::io::Result<Drainer> {
        use std::os::fd::AsRawFd;
        let queue = std::sync::Arc::new(std::sync::Mutex::new(Queue::default()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (q, halt, hold) = (queue.clone(), stop.clone(), paused.clone());
        let thread = std::thread::Builder::new().name("audit-opens".into()).spawn(move || {
            let fd = ring.as_raw_fd();
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; the ring's fd lives as long as `ring`.
                unsafe { libc::poll(&mut pfd, 1, 50) };
                if hold.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                let mut batch = Vec::new();
                while let Some(item) = ring.next() {
                    if let Some(o) = Open::parse(&item) {
                        batch.push(o);
                    }
                }
                if !batch.is_empty() {
                    let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
                    for o in batch {
                        if q.opens.len() < QUEUE_MAX {
                            q.opens.push_back(o);
                        } else {
                            q.overflow += 1;
                        }
                    }
                }
            }
        })?;
        Ok(Drainer {
            queue,
            stop,
            paused,
            thread: Some(thread),
        })
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One file open in a watched cgroup (audit mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Open {
    /// The slot the agent watched the cgroup under.
    pub slot: u32,
    /// `openat`'s flags (`O_ACCMODE` bits: read, write, both; `O_CREAT`, `O_TRUNC`, …).
    pub flags: u32,
    pub tgid: u32,
    /// The path as the process passed it (relative ones are relative to its working directory).
    pub path: String,
}

impl Open {
    /// One ring buffer record: slot, flags, tgid, padding (4 bytes each), the NUL-terminated path.
    fn parse(item: &[u8]) -> Option<Open> {
        if item.len() < 16 {
            return None;
        }
        let word = |i: usize| u32::from_ne_bytes(item[i..i + 4].try_into().expect("4 bytes"));
        let name = &item[16..];
        let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
        Some(Open {
            slot: word(0),
            flags: word(4),
            tgid: word(8),
            path: String::from_utf8_lossy(&name[..end]).into_owned(),
        })
    }

    /// Whether the open may write (write or read-write access, or create/truncate).
    pub fn writes(&self) -> bool {
        let f = self.flags as i32;
        f & libc::O_ACCMODE != libc::O_RDONLY || f & (libc::O_CREAT | libc::O_TRUNC) != 0
    }
}

/// One process's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcCounters {
    pub cpu_ns: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

fn ensure_tracefs() -> Result<(), String> {
    if TRACEFS.iter().any(|p| std::path::Path::new(p).join("events").is_dir()) {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("tracefs is not mounted at /sys/kernel/tracing and the agent is not root".into());
    }
    let target = std::ffi::CString::new(TRACEFS[0]).expect("no NUL");
    let fstype = std::ffi::CString::new("tracefs").expect("no NUL");
    // SAFETY: valid C strings; a failed mount returns -1 and sets errno.
    let r = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        return Err(format!(
            "mounting tracefs at {}: {}",
            TRACEFS[0],
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Loads and attaches the programs: `Err` is the reason eBPF is unavailable here.
pub fn load() -> Result<Probes, String> {
    ensure_tracefs()?;
    let mut bpf = aya::Ebpf::load(OBJECT).map_err(|e| format!("loading the programs: {e}"))?;
    for (prog, category, name) in [
        ("sched_switch", "sched", "sched_switch"),
        ("block_bio_queue", "block", "block_bio_queue"),
    ] {
        let p: &mut aya::programs::TracePoint = bpf
            .program_mut(prog)
            .ok_or_else(|| format!("program {prog} missing from the object"))?
            .try_into()
            .map_err(|e| format!("{prog}: {e}"))?;
        p.load().map_err(|e| format!("{prog}: load: {e}"))?;
        p.attach(category, name)
            .map_err(|e| format!("{prog}: attach to {category}/{name}: {e}"))?;
    }
    // Audit mode: optional (the counters run without it).
    let audit = (|| -> Result<Drainer, String> {
        let p: &mut aya::programs::TracePoint = bpf
            .program_mut("sys_enter_openat")
            .ok_or("program sys_enter_openat missing from the object")?
            .try_into()
            .map_err(|e| format!("sys_enter_openat: {e}"))?;
        p.load().map_err(|e| format!("sys_enter_openat: load: {e}"))?;
        p.attach("syscalls", "sys_enter_openat")
            .map_err(|e| format!("sys_enter_openat: attach: {e}"))?;
        let map = bpf.take_map("opens").ok_or("map opens missing from the object")?;
        let ring = aya::maps::RingBuf::try_from(map).map_err(|e| format!("opens: {e}"))?;
        Drainer::start(ring).map_err(|e| format!("opens: a thread to drain them: {e}"))
    })();
    let (opens, audit_error) = match audit {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    Ok(Probes {
        bpf,
        opens,
        audit_error,
    })
}

impl Probes {
    /// Every process's counters now.
    pub fn read(&self) -> BTreeMap<u32, ProcCounters> {
        let mut out: BTreeMap<u32, ProcCounters> = BTreeMap::new();
        if let Some(m) = self.bpf.map("cpu_ns")
            && let Ok(cpu) = aya::maps::HashMap::<_, u32, u64>::try_from(m)
        {
            for (tgid, ns) in cpu.iter().flatten() {
                out.entry(tgid).or_default().cpu_ns = ns;
            }
        }
        if let Some(m) = self.bpf.map("io_bytes")
            && let Ok(io) = aya::maps::HashMap::<_, u32, [u64; 2]>::try_from(m)
        {
            for (tgid, [r, w]) in io.iter().flatten() {
                let c = out.entry(tgid).or_default();
                c.read_bytes = r;
                c.write_bytes = w;
            }
        }
        out
    }

    /// Audit mode: records every file its processes open from now on for the cgroup (v2) with id
    /// `cgroup` (its directory's inode number), under `slot`.
    pub fn watch(&mut self, cgroup: u64, slot: u32) -> Result<(), String> {
        let m = self.bpf.map_mut("watched").ok_or("map watched missing")?;
        let mut h = aya::maps::HashMap::<_, u64, u32>::try_from(m).map_err(|e| e.to_string())?;
        h.insert(cgroup, slot, 0).map_err(|e| e.to_string())
    }

    pub fn unwatch(&mut self, cgroup: u64) {
        if let Some(m) = self.bpf.map_mut("watched")
            && let Ok(mut h) = aya::maps::HashMap::<_, u64, u32>::try_from(m)
        {
            let _ = h.remove(&cgroup);
        }
    }

    /// The opens recorded since the last call (at most `max`; the rest wait for the next).
    pub fn drain_opens(&mut self, max: usize) -> Vec<Open> {
        let Some(d) = self.opens.as_ref() else {
            return Vec::new();
        };
        let mut q = d.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.opens.len().min(max);
        q.opens.drain(..n).collect()
    }

    /// How many opens of watched cgroups could not be recorded so far (the kernel's ring buffer or
    /// the agent's queue was full).
    pub fn opens_lost(&self) -> u64 {
        let in_kernel = self
            .bpf
            .map("lost")
            .and_then(|m| aya::maps::Array::<_, u64>::try_from(m).ok())
            .and_then(|a| a.get(&0, 0).ok())
            .unwrap_or(0);
        let queued = self
            .opens
            .as_ref()
            .map_or(0, |d| d.queue.lock().unwrap_or_else(|e| e.into_inner()).overflow);
        in_kernel + queued
    }

    /// Removes the entries of `tgids` (processes gone that no allocation needs).
    pub fn forget(&mut self, tgids: &BTreeSet<u32>) {
        for name in ["cpu_ns", "io_bytes"] {
            if let Some(m) = self.bpf.map_mut(name) {
                if name == "cpu_ns" {
                    if let Ok(mut h) = aya::maps::HashMap::<_, u32, u64>::try_from(m) {
                        for t in tgids {
                            let _ = h.remove(t);
                        }
                    }
                } else if let Ok(mut h) = aya::maps::HashMap::<_, u32, [u64; 2]>::try_from(m) {
                    for t in tgids {
                        let _ = h.remove(t);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Whether a load failure is the environment's (no privileges, no tracefs) rather than ours (a
    /// program the verifier refuses, a broken object) — only the former may pass.
    fn environmental(why: &str) -> bool {
        [
            "Operation not permitted",
            "Permission denied",
            "not root",
            "not mounted",
            "EPERM",
            "EACCES",
        ]
        .iter()
        .any(|s| why.contains(s))
    }

    #[test]
    fn the_programs_load_where_the_kernel_allows_and_count_cpu_and_block_io() {
        let mut probes = match load() {
            Ok(p) => p,
            Err(why) => {
                assert!(environmental(&why), "eBPF failed for a reason of ours: {why}");
                eprintln!("eBPF unavailable here: {why}");
                return;
            }
        };
        // A process that burns CPU, then writes 4 MiB with O_DIRECT (straight to the block layer).
        let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let file = dir.join(format!("lattice-ebpf-{}.bin", std::process::id()));
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec dd if=/dev/zero of={} bs=1M count=4 oflag=direct status=none",
                file.display()
            ))
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let status = child.wait().unwrap();
        let _ = std::fs::remove_file(&file);
        assert!(status.success());
        let c = probes.read().get(&pid).copied().unwrap_or_default();
        assert!(c.cpu_ns > 20_000_000, "the shell loop's CPU time: {c:?}");
        assert!(c.write_bytes >= 4 << 20, "dd's 4 MiB of direct writes: {c:?}");
        probes.forget(&[pid].into_iter().collect());
        assert!(!probes.read().contains_key(&pid), "forgotten");
    }

    /// Audit mode: the opens of a process in a watched cgroup are recorded — path, read or write —
    /// and an unwatched cgroup's are not.
    #[test]
    fn opens_in_a_watched_cgroup_are_recorded_with_their_access() {
        let mut probes = match load() {
            Ok(p) => p,
            Err(why) => {
                assert!(environmental(&why), "eBPF failed for a reason of ours: {why}");
                eprintln!("eBPF unavailable here: {why}");
                return;
            }
        };
        if let Some(why) = &probes.audit_error {
            assert!(environmental(why) || why.contains("attach"), "audit mode failed: {why}");
            eprintln!("audit mode unavailable here: {why}");
            return;
        }
        let Some(group) = crate::cgroup::Group::create("lattice-ebpf-test").ok() else {
            eprintln!("no cgroup v2 to test in");
            return;
        };
        probes.watch(group.id(), 7).unwrap();
        let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let written = dir.join(format!("lattice-audit-{}.txt", std::process::id()));
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("cat /etc/hostname > /dev/null; echo x > {}", written.display()));
        group.enter_on_exec(&mut cmd);
        assert!(cmd.status().unwrap().success());
        // Opens outside the cgroup: not recorded.
        std::fs::read("/etc/hostname").unwrap();
        let want = written.display().to_string();
        let mut opens = Vec::new();
        let t0 = std::time::Instant::now();
        while !opens.iter().any(|o: &Open| o.path == want) && t0.elapsed() < std::time::Duration::from_secs(5) {
            opens.extend(probes.drain_opens(10_000));
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = std::fs::remove_file(&written);
        probes.unwatch(group.id());
        assert!(opens.iter().all(|o| o.slot == 7), "{opens:?}");
        let read = opens.iter().find(|o| o.path == "/etc/hostname").expect("the read open");
        assert!(!read.writes(), "{read:?}");
        let write = opens
            .iter()
            .find(|o| o.path == written.display().to_string())
            .unwrap_or_else(|| panic!("the write open: {opens:?}"));
        assert!(write.writes(), "{write:?}");
        let agent = std::process::id();
        assert!(
            opens.iter().all(|o| o.tgid != agent),
            "the test's own open is not in: {opens:?}"
        );
    }

    /// Audit mode never drops an open silently: with the ring held full, the opens it has no room
    /// for are counted, and every open is either recorded or counted.
    #[test]
    fn opens_the_ring_has_no_room_for_are_counted() {
        let Ok(mut probes) = load() else { return };
        if probes.audit_error.is_some() {
            return;
        }
        let Some(group) = crate::cgroup::Group::create("lattice-ebpf-lost-test").ok() else {
            return;
        };
        probes.watch(group.id(), 3).unwrap();
        let paused = probes.opens.as_ref().expect("audit mode").paused.clone();
        paused.store(true, std::sync::atomic::Ordering::Relaxed);
        // 20,000 opens of 280 bytes each: more than the 4 MiB ring holds.
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("i=0; while [ $i -lt 20000 ]; do : < /etc/hostname; i=$((i+1)); done");
        group.enter_on_exec(&mut cmd);
        assert!(cmd.status().unwrap().success());
        probes.unwatch(group.id());
        let lost = probes.opens_lost();
        assert!(lost > 0, "a full ring loses opens, and counts them");
        paused.store(false, std::sync::atomic::Ordering::Relaxed);
        let mut recorded = 0;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(2) {
            recorded += probes
                .drain_opens(100_000)
                .iter()
                .filter(|o| o.path == "/etc/hostname")
                .count() as u64;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(recorded > 0);
        assert!(recorded + lost >= 20_000, "recorded {recorded} + lost {lost}");
    }
}
