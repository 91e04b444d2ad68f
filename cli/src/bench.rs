//! `rm-replay bench`: replays real traces with each policy in a fresh `rm-replay` process and reports
//! whole-process wall time, jobs/s and peak resident memory (from `wait4`'s rusage), the numbers the
//! speed targets are stated in. Benchmarks measure; tests never assert on time.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    pub trace: String,
    pub policy: String,
    pub jobs: u64,
    /// Best (minimum) wall time over the runs, seconds.
    pub wall_s_min: f64,
    /// Median wall time, seconds.
    pub wall_s_median: f64,
    pub jobs_per_s: f64,
    /// Peak resident set size, MiB (max over runs).
    pub peak_rss_mib: f64,
    pub runs: u32,
}

/// The policies the issue asks to compare.
pub const POLICIES: [(&str, &[&str]); 4] = [
    ("fcfs", &["--policy", "fcfs"]),
    ("easy", &["--policy", "easy"]),
    ("easy --compat pyss", &["--policy", "easy", "--compat", "pyss"]),
    ("conservative", &["--policy", "conservative"]),
];

pub fn default_traces(dir: &Path) -> Vec<PathBuf> {
    ["KTH-SP2-1996-2.1-cln.swf.gz", "LANL-CM5-1994-4.1-cln.swf.gz"]
        .iter()
        .map(|f| dir.join(f))
        .collect()
}

/// Runs every (trace, policy) `runs` times.
pub fn run(traces: &[PathBuf], runs: u32, mut on_row: impl FnMut(&BenchRow)) -> Result<Vec<BenchRow>> {
    let exe = std::env::current_exe().context("locating the rm-replay executable")?;
    let mut rows = Vec::new();
    for trace in traces {
        if !trace.exists() {
            bail!("{}: trace not found", trace.display());
        }
        for (label, args) in POLICIES {
            let mut walls = Vec::new();
            let mut rss: u64 = 0;
            let mut jobs = 0;
            for _ in 0..runs.max(1) {
                let mut a: Vec<String> = vec!["--trace".into(), trace.display().to_string(), "--quiet".into()];
                a.extend(args.iter().map(|s| s.to_string()));
                let m = measure(&exe, &a)?;
                walls.push(m.wall_s);
                rss = rss.max(m.max_rss_kib);
                jobs = m
                    .stdout
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("jobs="))
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("child printed no job count: {}", m.stdout))?;
            }
            walls.sort_by(f64::total_cmp);
            let min = walls[0];
            let row = BenchRow {
                trace: trace
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                policy: label.to_string(),
                jobs,
                wall_s_min: min,
                wall_s_median: walls[walls.len() / 2],
                jobs_per_s: (jobs as f64 / min).round(),
                peak_rss_mib: (rss as f64 / 1024.0 * 10.0).round() / 10.0,
                runs: walls.len() as u32,
            };
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

struct Measured {
    wall_s: f64,
    max_rss_kib: u64,
    stdout: String,
}

fn measure(exe: &Path, args: &[String]) -> Result<Measured> {
    let start = std::time::Instant::now();
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {}", exe.display()))?;
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout)
        .context("reading child output")?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; wait4 fills it for our own child, which nobody else reaps.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_s = start.elapsed().as_secs_f64();
    if r != pid {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("rm-replay {} failed (status {status})", args.join(" "));
    }
    Ok(Measured {
        wall_s,
        max_rss_kib: usage.ru_maxrss as u64,
        stdout,
    })
}
