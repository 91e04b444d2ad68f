//! The `lattice` client against a real control plane (single-member quorum, simulated agents) started
//! in-process: submit with flags and with an `#SBATCH` script, status in every format, nodes, drain,
//! cancel, raft status, weights, and errors that name the field.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn lattice(endpoint: &str, home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lattice"))
        .args(args)
        .env("LATTICE_ENDPOINT", endpoint)
        .env("LATTICE_TENANT", "physics")
        .env("HOME", home)
        .output()
        .expect("lattice runs")
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn lattice_cli_drives_the_runtime() {
    let dir = std::env::temp_dir().join(format!("lattice-cli-rt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = lattice_runtime::RuntimeConfig::parse(
        "t.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 4\ncycle: 100ms\n",
            dir.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let running = rt.block_on(lattice_runtime::start(cfg, true)).unwrap();
    let ep = format!("http://{}", running.rest_addr);
    let run = |args: &[&str]| lattice(&ep, &dir, args);
    // Wait for the member to lead.
    let t0 = Instant::now();
    while !running.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(50));
    }

    // `lattice submit --nodes=1 --walltime=10m -- CMD...` prints the new id.
    let o = run(&["submit", "--nodes=1", "--walltime=10m", "--", "sleep", "0.2"]);
    assert!(o.status.success(), "{}", err(&o));
    let id = out(&o).trim().to_string();
    assert_eq!(id, "a-000001");
    let t0 = Instant::now();
    loop {
        let o = run(&["status", &id, "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
        if v["state"] == "completed" {
            assert_eq!(v["tenant"], "physics");
            assert_eq!(v["entrypoint"], "sleep 0.2");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{v}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // `lattice logs`: simulated agents report no output; an unknown id is an error.
    let o = run(&["logs", &id]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("no output reported yet"), "{}", err(&o));
    assert!(!run(&["logs", "a-999999"]).status.success());

    // A Slurm script: directives map, unsupported ones warn.
    let script = dir.join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --time=00:30:00\n#SBATCH --job-name=sim\n#SBATCH --mem=64G\n#SBATCH --qos=high\n#LATTICE --uenv=prgenv-gnu/24.11:v1\n#LATTICE --view=default\nsrun ./a.out\n",
    )
    .unwrap();
    let o = run(&["submit", script.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("--mem=64G ignored"), "{}", err(&o));
    let sid = out(&o).trim().to_string();
    let o = run(&["status", &sid, "-o", "yaml"]);
    let y = out(&o);
    assert!(
        y.contains("requested_nodes: 2") && y.contains("walltime_s: 1800") && y.contains("preemption_class: 7"),
        "{y}"
    );
    assert!(y.contains("name: sim"), "{y}");
    assert!(
        y.contains("uenv: prgenv-gnu/24.11:v1") && y.contains("view: default"),
        "{y}"
    );

    // Tables.
    let o = run(&["status"]);
    let t = out(&o);
    assert!(
        t.starts_with("ID") && t.contains("a-000001") && t.contains("completed"),
        "{t}"
    );
    assert!(t.lines().next().unwrap().ends_with("REASON"), "{t}");
    let done = t.lines().find(|l| l.starts_with("a-000001")).unwrap();
    assert!(done.ends_with("success"), "how it ended: {t}");
    let o = run(&["status", "-o", "wide"]);
    assert!(out(&o).contains("VCLUSTER"), "{}", out(&o));
    let o = run(&["nodes"]);
    assert!(out(&o).contains("sim-003"), "{}", out(&o));

    // Admin: drain, raft status, weights.
    let o = run(&["admin", "drain", "sim-003"]);
    assert_eq!(out(&o).trim(), "sim-003: drained", "{}", err(&o));
    let o = run(&["admin", "undrain", "sim-003"]);
    assert_eq!(out(&o).trim(), "sim-003: ready", "{}", err(&o));
    let o = run(&["admin", "backup"]);
    assert!(out(&o).contains("\"sha256\""), "{}{}", out(&o), err(&o));
    let o = run(&["admin", "backup", "--verify"]);
    assert!(out(&o).contains("\"valid\": true"), "{}{}", out(&o), err(&o));
    let o = run(&["admin", "raft-status"]);
    assert!(out(&o).contains("\"audit_chain_valid\": true"), "{}", out(&o));
    let o = run(&[
        "admin",
        "vcluster",
        "set-weights",
        "default",
        "--weights",
        "priority=0.5,wait_time=0.5",
    ]);
    assert!(o.status.success(), "{}", err(&o));

    // Cancel a long one.
    let o = run(&["submit", "--nodes=1", "--walltime=1h", "--", "sleep", "100"]);
    let long = out(&o).trim().to_string();
    let o = run(&["cancel", &long]);
    assert_eq!(out(&o).trim(), format!("cancelled {long}"));

    // A DAG from YAML: prep → train; status lists both.
    let dag = dir.join("dag.yaml");
    std::fs::write(
        &dag,
        "allocations:\n  - {name: prep, entrypoint: sleep 0.1, resources: {nodes: 1}, lifecycle: {walltime: 10m}}\n  - {name: train, entrypoint: sleep 0.1, resources: {nodes: 1}, lifecycle: {walltime: 10m}, depends_on: [{ref: prep}]}\n",
    )
    .unwrap();
    let o = run(&["dag", "submit", dag.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    let dag_id = out(&o).trim().to_string();
    let t0 = Instant::now();
    loop {
        let s = out(&run(&["dag", "status", &dag_id]));
        if s.starts_with(&format!("{dag_id}: completed")) {
            assert!(s.contains("prep") && s.contains("train"), "{s}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{s}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Arguments after `--` are quoted for the agent's `/bin/sh -c`: the job runs them as typed.
    for (args, entry, printed) in [
        (&["echo", "a  b"][..], "echo 'a  b'", "a  b\n"),
        (&["sh", "-c", "echo a b"][..], "sh -c 'echo a b'", "a b\n"),
    ] {
        let mut cmd = vec!["submit", "--nodes=1", "--walltime=10m", "--"];
        cmd.extend_from_slice(args);
        let o = run(&cmd);
        assert!(o.status.success(), "{}", err(&o));
        let quoted = out(&o).trim().to_string();
        let o = run(&["status", &quoted, "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
        let entrypoint = v["entrypoint"].as_str().unwrap().to_string();
        assert_eq!(entrypoint, entry);
        let ran = Command::new("/bin/sh").arg("-c").arg(&entrypoint).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&ran.stdout), printed);
    }

    // Errors name the field and exit non-zero.
    let o = run(&["submit", "--nodes=1", "--walltime=soon", "--", "x"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("lifecycle.walltime"), "{}", err(&o));
    let o = run(&["status", "a-999999"]);
    assert!(!o.status.success() && err(&o).contains("no allocation"), "{}", err(&o));
    let o = lattice("http://127.0.0.1:1", &dir, &["status"]);
    assert!(err(&o).contains("cannot reach the Lattice API"), "{}", err(&o));
    // A refused request is a user error: `error: <message>`, exit 1, no Rust backtrace even with
    // RUST_BACKTRACE=1 (common on developer machines).
    let o = Command::new(env!("CARGO_BIN_EXE_lattice"))
        .args(["submit", "--nodes=5", "--walltime=10m", "--", "true"])
        .env("LATTICE_ENDPOINT", &ep)
        .env("LATTICE_TENANT", "physics")
        .env("HOME", &dir)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).starts_with("error: "), "{}", err(&o));
    assert!(err(&o).contains("resources.nodes"), "{}", err(&o));
    assert!(!err(&o).to_lowercase().contains("backtrace"), "{}", err(&o));
    assert!(err(&o).lines().count() <= 3, "{}", err(&o));
    // A usage error is clap's: exit 2.
    assert_eq!(run(&["submit", "--nodes=many"]).status.code(), Some(2));

    rt.block_on(running.shutdown());
}

/// `lattice` against a member serving mTLS: the site CA and client certificate from the config file
/// submit and read; without the client certificate the call fails; a broken config file is an error.
#[test]
fn lattice_cli_over_mtls() {
    let dir = std::env::temp_dir().join(format!("lattice-cli-mtls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join(".config/lattice")).unwrap();
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/tests/fixtures/tls");
    let f = |n: &str| tls.join(n).display().to_string();
    let cfg = lattice_runtime::RuntimeConfig::parse(
        "t.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\ncycle: 100ms\ntls:\n  cert: {}\n  key: {}\n  ca: {}\n  mtls: true\n",
            dir.display(),
            f("member.pem"),
            f("member.key"),
            f("ca.pem")
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let running = rt.block_on(lattice_runtime::start(cfg, true)).unwrap();
    let t0 = Instant::now();
    while !running.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(50));
    }
    let ep = format!("https://{}", running.rest_addr);
    let config = dir.join(".config/lattice/config.yaml");
    std::fs::write(&config, format!("ca: {}\n", f("ca.pem"))).unwrap();
    let o = lattice(&ep, &dir, &["nodes"]);
    assert!(!o.status.success(), "served without a client certificate: {}", out(&o));
    std::fs::write(
        &config,
        format!(
            "ca: {}\nclient_cert: {}\nclient_key: {}\n",
            f("ca.pem"),
            f("client.pem"),
            f("client.key")
        ),
    )
    .unwrap();
    let o = lattice(
        &ep,
        &dir,
        &["submit", "--nodes=1", "--walltime=10m", "--", "sleep", "0.1"],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), "a-000001");
    std::fs::write(&config, "endpoint: [not, a, string]\n").unwrap();
    let o = lattice(&ep, &dir, &["nodes"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("config.yaml"), "{}", err(&o));
    rt.block_on(running.shutdown());
}
