//! Per-allocation telemetry from /proc — the fallback the book's eBPF layer degrades to (this build
//! has no `ebpf` feature: [`ebpf_status`] says so once at start). For each allocation's process group
//! the sampler sums CPU time and I/O counters over its processes (`/proc/PID/stat` utime+stime,
//! `/proc/PID/io`), at the aggregation mode's period (prod 30 s, debug 1 s), and renders them in the
//! Prometheus text format the agent pushes to a Pushgateway-compatible endpoint.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The book's aggregation modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Aggregated snapshots every 30 s.
    Prod,
    /// Raw samples every second.
    Debug,
}

impl Mode {
    pub fn period(self) -> Duration {
        match self {
            Mode::Prod => Duration::from_secs(30),
            Mode::Debug => Duration::from_secs(1),
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "prod" => Some(Mode::Prod),
            "debug" => Some(Mode::Debug),
            _ => None,
        }
    }
}

/// Why the eBPF layer is not running here.
pub fn ebpf_status() -> String {
    "eBPF unavailable: this build has no `ebpf` feature; per-allocation counters come from /proc".into()
}

/// One allocation's counters on this node (cumulative over its live processes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub processes: u32,
    pub cpu_seconds: f64,
    /// Bytes the processes asked the block layer to read / write.
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Bytes passed through read/write system calls (any file, pipe or socket).
    pub rchar: u64,
    pub wchar: u64,
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Sums the counters of every process whose process group is `pgid` (under `proc_root`).
pub fn sample_group(proc_root: &Path, pgid: u32) -> Counters {
    let mut c = Counters::default();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return c;
    };
    let hz = ticks_per_second();
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state ppid pgrp ... utime(14) stime(15).
        let rest = stat.rsplit_once(')').map_or("", |x| x.1);
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(2).and_then(|g| g.parse::<u32>().ok()) != Some(pgid) {
            continue;
        }
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
        c.processes += 1;
        c.cpu_seconds += (num(11) + num(12)) / hz;
        if let Ok(io) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("io")) {
            for line in io.lines() {
                let (k, v) = line.split_once(':').unwrap_or(("", ""));
                let v: u64 = v.trim().parse().unwrap_or(0);
                match k {
                    "read_bytes" => c.read_bytes += v,
                    "write_bytes" => c.write_bytes += v,
                    "rchar" => c.rchar += v,
                    "wchar" => c.wchar += v,
                    _ => {}
                }
            }
        }
    }
    c
}

/// A metric's name, help text and value.
type Metric = (&'static str, &'static str, fn(&Counters) -> f64);

/// The Prometheus text exposition of one sample (`alloc` → counters) for `node`.
pub fn render(node: &str, samples: &BTreeMap<String, Counters>) -> String {
    let mut out = String::new();
    let metrics: [Metric; 6] = [
        (
            "lattice_alloc_cpu_seconds_total",
            "CPU time of the allocation's processes on this node",
            |c| c.cpu_seconds,
        ),
        (
            "lattice_alloc_processes",
            "Live processes of the allocation on this node",
            |c| c.processes as f64,
        ),
        ("lattice_alloc_read_bytes_total", "Bytes read from block devices", |c| {
            c.read_bytes as f64
        }),
        (
            "lattice_alloc_write_bytes_total",
            "Bytes written to block devices",
            |c| c.write_bytes as f64,
        ),
        (
            "lattice_alloc_rchar_bytes_total",
            "Bytes read through system calls",
            |c| c.rchar as f64,
        ),
        (
            "lattice_alloc_wchar_bytes_total",
            "Bytes written through system calls",
            |c| c.wchar as f64,
        ),
    ];
    for (name, help, get) in metrics {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (alloc, c) in samples {
            out.push_str(&format!("{name}{{alloc=\"{alloc}\",node=\"{node}\"}} {}\n", get(c)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_busy_group_accumulates_cpu_and_io_and_renders_as_prometheus_text() {
        let dir = std::env::temp_dir().join(format!("lattice-agent-tel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("out.bin");
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "head -c 2000000 /dev/zero > {}; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 5",
                file.display()
            ))
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let t0 = std::time::Instant::now();
        let c = loop {
            let c = sample_group(Path::new("/proc"), pgid);
            if c.cpu_seconds >= 0.05 && c.wchar >= 2_000_000 || t0.elapsed() > Duration::from_secs(20) {
                break c;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        unsafe { libc::killpg(pgid as i32, libc::SIGKILL) };
        let _ = child.wait();
        assert!(c.processes >= 1, "{c:?}");
        assert!(c.cpu_seconds >= 0.05, "{c:?}");
        assert!(c.wchar >= 2_000_000, "the 2 MB written through write(2): {c:?}");
        assert_eq!(sample_group(Path::new("/proc"), pgid).processes, 0, "gone");
        let text = render("n1", &[("a-000001".to_string(), c)].into_iter().collect());
        assert!(
            text.contains("# TYPE lattice_alloc_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(
            text.contains("lattice_alloc_wchar_bytes_total{alloc=\"a-000001\",node=\"n1\"} "),
            "{text}"
        );
        assert_eq!(Mode::parse("debug").unwrap().period(), Duration::from_secs(1));
        assert_eq!(Mode::Prod.period(), Duration::from_secs(30));
        assert!(Mode::parse("loud").is_none());
        assert!(ebpf_status().starts_with("eBPF unavailable: "));
    }
}
