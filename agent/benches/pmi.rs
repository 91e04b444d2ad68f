//! Task launch fan-out and PMI fence time on loopback (book: "MPI Process Management", performance
//! considerations: a star fence of ~10 ms below 128 nodes). Agents run in this process, each with its
//! gRPC service on loopback; their ranks are real processes speaking PMI-1 on their `PMI_FD`
//! (`init`, `put`, one fence, `get` of another node's key, `finalize`), and — when `mpicc` is
//! there — an MPI program (Debian's MPICH: `MPI_Init`, `MPI_Allreduce`, `MPI_Finalize`).
//!
//! Per layout it prints the median of `RUNS` launches: fan-out (the launch handed to every agent at
//! once → every rank's first PMI command), the fence (the last rank anywhere entering it → the last
//! node getting the merged puts back), and the launch's whole run (→ every rank ended).
//!
//! `cargo bench -p lattice-agent --bench pmi` (`RUNS=N` to change the number of runs).

use lattice_agent::client::{TaskLaunch, TaskPeer};
use lattice_agent::tasks::{AllocInfo, Tasks, TasksConfig};
use std::time::{Duration, Instant};

const RANK: &str = r#"printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&3; read -r l <&3
printf 'cmd=put kvsname=k key=r%s value=v%s\n' "$PMI_RANK" "$PMI_RANK" >&3; read -r l <&3
printf 'cmd=barrier_in\n' >&3; read -r l <&3
printf 'cmd=get kvsname=k key=r%s\n' $(( (PMI_RANK + LATTICE_LOCAL_SIZE) % PMI_SIZE )) >&3; read -r l <&3
case "$l" in *rc=0*) ;; *) exit 1;; esac
printf 'cmd=finalize\n' >&3; read -r l <&3"#;

struct Run {
    fan_out: Duration,
    fence: Duration,
    whole: Duration,
}

fn launch(agents: &[(Tasks, String)], ranks: u32, entrypoint: &str, n: u32) -> Run {
    let per = ranks / agents.len() as u32;
    let peers: Vec<TaskPeer> = agents
        .iter()
        .enumerate()
        .map(|(i, (_, addr))| TaskPeer {
            node: format!("n{i}"),
            address: Some(addr.clone()),
            first_rank: i as u32 * per,
            num_ranks: per,
        })
        .collect();
    let id = format!("a-1.{n}");
    let t0 = Instant::now();
    for (i, (t, _)) in agents.iter().enumerate() {
        t.start(TaskLaunch {
            launch_id: id.clone(),
            alloc: "a-1".into(),
            entrypoint: entrypoint.into(),
            env: vec![],
            world_size: ranks,
            node_index: i as u32,
            peers: peers.clone(),
            token: "t".into(),
            fence_timeout_s: Some(60.0),
        });
    }
    let mut ends = Vec::new();
    for (t, _) in agents {
        loop {
            if let Some(e) = t.take_ended().pop() {
                assert_eq!(e.reason, None, "{e:?}");
                assert!(e.ranks.iter().all(|r| r.code == 0), "{e:?}");
                ends.push(e);
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let whole = t0.elapsed();
    let timings: Vec<_> = agents.iter().flat_map(|(t, _)| t.take_timings()).collect();
    let connected = timings
        .iter()
        .filter_map(|t| t.all_connected)
        .max()
        .expect("every rank connected");
    let last_in = timings.iter().map(|t| t.fences[0].0).max().expect("a fence");
    let last_out = timings.iter().map(|t| t.fences[0].1).max().expect("a fence");
    Run {
        fan_out: connected - t0,
        fence: last_out - last_in,
        whole,
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let runs: u32 = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let dir = std::env::temp_dir().join(format!("lattice-bench-pmi-{}", std::process::id()));
    let mpi = dir.join("allreduce");
    std::fs::create_dir_all(&dir).unwrap();
    let have_mpi = std::process::Command::new("mpicc")
        .arg("-o")
        .arg(&mpi)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/allreduce.c"))
        .status()
        .is_ok_and(|s| s.success());
    println!("| program | nodes | ranks | fan-out ms | fence ms | whole launch ms |");
    println!("|---|---|---|---|---|---|");
    let mut n = 0;
    for (nodes, ranks) in [(2u32, 4u32), (2, 8), (2, 16), (4, 32), (4, 64), (8, 64)] {
        let agents: Vec<(Tasks, String)> = (0..nodes)
            .map(|i| {
                let t = Tasks::new(TasksConfig {
                    node: format!("n{i}"),
                    log_dir: dir.join(format!("logs-{nodes}-{ranks}-{i}")),
                    grace: Duration::from_secs(1),
                    fence_timeout: Duration::from_secs(60),
                    slurm_env: false,
                    alloc_wait: Duration::from_secs(1),
                });
                t.alloc_started(
                    "a-1",
                    AllocInfo {
                        pid: std::process::id(),
                        ..AllocInfo::default()
                    },
                );
                let addr = t.serve("127.0.0.1:0").unwrap().to_string();
                (t, addr)
            })
            .collect();
        let mut programs = vec![("PMI-1 sh ranks", RANK.to_string())];
        if have_mpi {
            programs.push(("MPICH allreduce", mpi.display().to_string()));
        }
        for (name, entry) in programs {
            let mut all = Vec::new();
            for _ in 0..runs {
                n += 1;
                all.push(launch(&agents, ranks, &entry, n));
            }
            println!(
                "| {name} | {nodes} | {ranks} | {:.1} | {:.2} | {:.1} |",
                median(all.iter().map(|r| r.fan_out).collect()),
                median(all.iter().map(|r| r.fence).collect()),
                median(all.iter().map(|r| r.whole).collect()),
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
