//! `lattice-runtime` and `lattice-agent` processes that leave nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A child process SIGKILLed when dropped, however the test ends — and when it is an agent (its
/// command line has `--log-dir`), with it every process group whose command line names that
/// directory: an allocation's processes outlive their agent by design (the next agent takes them
/// over), so a test that ends while its work still runs would otherwise leave it behind.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let log_dir = log_dir_of(self.0.id());
        let _ = self.0.kill();
        let _ = self.0.wait();
        if let Some(dir) = log_dir {
            kill_groups_naming(&dir);
        }
    }
}

/// Agent processes (or any), SIGKILLed when dropped with what they ran, as [`Proc`] is; a test
/// kills, restarts or replaces one of them through the vector.
pub struct Agents(pub Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        let log_dirs: Vec<String> = self.0.iter().filter_map(|c| log_dir_of(c.id())).collect();
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        for dir in log_dirs {
            kill_groups_naming(&dir);
        }
    }
}

/// The `--log-dir` of a running process.
fn log_dir_of(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    args.windows(2).find(|w| w[0] == "--log-dir").map(|w| w[1].clone())
}

/// SIGKILLs the process group of every process whose command line names `needle` (an allocation's
/// wrapper names its status file in the agent's log directory; the wrapper leads its own group).
fn kill_groups_naming(needle: &str) {
    // SAFETY: getpgid and kill take plain integers and touch no memory of ours.
    let own = unsafe { libc::getpgid(0) };
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let named = std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_bytes()));
        let group = unsafe { libc::getpgid(pid) };
        if named && group > 1 && group != own {
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }
}

/// A workspace binary built beside the running test (`cargo test --workspace` builds them all into
/// the target directory above the test's `deps/`).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().and_then(Path::parent).expect("the target directory");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build --bin {name}` (cargo test --workspace does)",
        p.display()
    );
    p
}

/// The `lattice-agent` binary.
pub fn agent_binary() -> PathBuf {
    bin("lattice-agent")
}

/// A `lattice-runtime` process on `config` (it bootstraps); its output goes to `log`.
pub fn runtime_process(config: &Path, log: &Path) -> Proc {
    runtime_process_with(config, log, true)
}

/// [`runtime_process`], bootstrapping the quorum or not.
pub fn runtime_process_with(config: &Path, log: &Path, bootstrap: bool) -> Proc {
    runtime_process_env(config, log, bootstrap, &[])
}

/// [`runtime_process_with`] with environment variables of its own (credentials a config names).
pub fn runtime_process_env(config: &Path, log: &Path, bootstrap: bool, env: &[(&str, &str)]) -> Proc {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    Proc(
        Command::new(bin("lattice-runtime"))
            .arg("--config")
            .arg(config)
            .args(bootstrap.then_some("--bootstrap"))
            .env("RUST_LOG", "info,openraft=warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("lattice-runtime starts"),
    )
}

/// `lattice-agent` for `node` against `endpoint`: fast polls (100 ms) and heartbeats (200 ms), its
/// logs in `dir/logs-NODE`, its state in `dir/state-NODE.json`, scratch in `dir/scratch-NODE`, its
/// peer service on a free loopback port; callers add their own flags.
pub fn agent_command(node: &str, endpoint: &str, dir: &Path) -> Command {
    let mut c = Command::new(agent_binary());
    c.args(["--node-id", node, "--quorum-endpoint", endpoint])
        .args(["--poll", "100ms", "--heartbeat", "200ms"])
        .arg("--log-dir")
        .arg(dir.join(format!("logs-{node}")))
        .arg("--state-file")
        .arg(dir.join(format!("state-{node}.json")))
        .arg("--scratch-dir")
        .arg(dir.join(format!("scratch-{node}")))
        .args(["--peer-listen", "127.0.0.1:0"]);
    c
}

/// An [`agent_command`] process with `extra` arguments, its output in `dir/agent-NODE.log`.
pub fn agent_process(base: &str, node: &str, dir: &Path, extra: &[&str]) -> Proc {
    let log = std::fs::File::create(dir.join(format!("agent-{node}.log"))).unwrap();
    Proc(
        agent_command(node, base, dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("lattice-agent starts"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Whether `pid` still runs (gone, or a zombie waiting to be reaped, counts as not running).
    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
            .unwrap_or(false)
    }

    #[test]
    fn a_dropped_agent_takes_what_it_ran_with_it() {
        let dir = std::env::temp_dir().join(format!("lattice-testkit-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("logs");
        let pid_file = dir.join("job.pid");
        // An "agent" that starts a job in a process group of its own (as the agent's wrapper does),
        // the job's command line naming the agent's log directory, then waits.
        let script = format!(
            "setsid sh -c 'while true; do sleep 1; done; : {}/job.status' & echo $! > {}; wait",
            log.display(),
            pid_file.display()
        );
        let agent = Command::new("sh")
            .args(["-c", &script, "agent", "--log-dir"])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        // Started once it leads a process group of its own (before `setsid` runs, the forked
        // child is still in the agent's group, under the agent's command line).
        let job: u32 = loop {
            if let Some(p) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                // SAFETY: getpgid takes a plain integer and touches no memory of ours.
                .filter(|p| unsafe { libc::getpgid(*p as i32) } == *p as i32)
            {
                break p;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "the job did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(running(job));
        drop(Proc(agent));
        let t0 = Instant::now();
        while running(job) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the job {job} outlived its agent"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
