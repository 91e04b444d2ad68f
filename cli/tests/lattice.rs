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

/// A member that is not the leader: every request answered 421 (nothing done). Its address and how
/// many requests it got.
fn not_the_leader() -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let mut r = std::io::BufReader::new(conn);
            let mut len = 0usize;
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = r#"{"error":"not the quorum leader","leader_id":1}"#;
            let _ = write!(
                r.get_mut(),
                "HTTP/1.1 421 Misdirected Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (addr, count)
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
    let (rt, running) = lattice_testkit::control_plane(&dir, 4, "");
    let ep = format!("http://{}", running.rest_addr);
    let run = |args: &[&str]| lattice(&ep, &dir, args);

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
    // Filters: by state, by the tenant (the global flag given) of what runs there; one node in full.
    let o = run(&["nodes", "--state", "down", "-o", "json"]);
    assert_eq!(out(&o).trim(), "[]", "{}{}", out(&o), err(&o));
    let o = run(&["nodes", "--tenant", "nobody", "-o", "json"]);
    assert_eq!(out(&o).trim(), "[]", "{}{}", out(&o), err(&o));
    let o = run(&["nodes", "sim-002", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["name"], "sim-002", "{v}");

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
    // Accounting is off by default; a reconcile says so and queues nothing.
    let o = run(&["admin", "accounting", "status"]);
    assert!(out(&o).contains("Accounting: off"), "{}{}", out(&o), err(&o));
    let o = run(&[
        "admin",
        "accounting",
        "reconcile",
        "--since",
        "2026-03-01",
        "--until",
        "2026-03-02",
    ]);
    assert!(
        !o.status.success() && err(&o).contains("accounting is not enabled"),
        "{}",
        err(&o)
    );
    // This site has no federation (built without the feature, or built with it and not enabled): the
    // CLI says so, nothing is submitted.
    for args in [
        &["admin", "federation", "status"][..],
        &["submit", "--site=site-b", "--nodes=1", "--", "echo", "federated-probe"][..],
    ] {
        let o = run(args);
        assert!(
            !o.status.success()
                && (err(&o).contains("has no federation")
                    || err(&o).contains("federation is not enabled on this site")),
            "{}",
            err(&o)
        );
    }
    let o = run(&["status", "-o", "json"]);
    assert!(
        o.status.success() && !out(&o).contains("federated-probe"),
        "nothing submitted: {}",
        out(&o)
    );
    let o = run(&[
        "admin",
        "vcluster",
        "set-weights",
        "default",
        "--weights",
        "priority=0.5,wait_time=0.5",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    // The weights in force, as the leader schedules with them.
    let o = run(&["admin", "vcluster", "show", "default"]);
    let shown = out(&o);
    assert!(
        o.status.success()
            && shown.lines().any(|l| l.split_whitespace().eq(["priority", "0.5"]))
            && shown.lines().any(|l| l.split_whitespace().eq(["fair_share", "0.0"])),
        "{shown}{}",
        err(&o)
    );

    // A vCluster created and configured at the quorum; a refused change names its key and changes
    // nothing.
    let o = run(&[
        "admin",
        "vcluster",
        "create",
        "--name=ml",
        "--policy=fcfs",
        "--cycle-interval=2s",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&["admin", "vcluster", "set-config", "ml", "--cycle-interval=5s"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&["admin", "vcluster", "set-config", "ml", "--lend-cap=2"]);
    assert!(!o.status.success() && err(&o).contains("lend_cap"), "{}", err(&o));
    let o = run(&["admin", "config", "set", "vclusters.ml.weights.priority=0.9"]);
    assert!(o.status.success(), "{}", err(&o));
    for (key, want) in [
        ("vclusters.ml.cycle_interval", "5.0"),
        ("vclusters.ml.policy", "\"fcfs\""),
        ("vclusters.ml.lend_cap", "0.5"),
        ("vclusters.ml.weights.priority", "0.9"),
    ] {
        let o = run(&["admin", "config", "get", key]);
        assert_eq!((out(&o).trim(), o.status.success()), (want, true), "{key}: {}", err(&o));
    }
    let o = run(&["admin", "config", "get", "accounting.enabled"]);
    assert!(!o.status.success() && err(&o).contains("config file"), "{}", err(&o));
    // The site settings decisions read: set at the quorum, read back in seconds; a bad one names it.
    let o = run(&["admin", "config", "set", "agents.boot_timeout_by_kind.H200=20m"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&["admin", "config", "get", "agents.boot_timeout_by_kind"]);
    assert_eq!(
        out(&o).trim(),
        "agents.boot_timeout_by_kind.H200 = 1200.0s",
        "{}",
        err(&o)
    );
    let o = run(&["admin", "config", "set", "agents.boot_timeout_by_kind.H200=unset"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&["admin", "config", "get", "agents.boot_timeout_by_kind"]);
    assert!(
        !o.status.success() && err(&o).contains("agents.boot_timeout,"),
        "{}",
        err(&o)
    );
    let o = run(&["admin", "config", "set", "agents.grace=soon"]);
    assert!(!o.status.success() && err(&o).contains("agents.grace"), "{}", err(&o));
    let o = run(&["admin", "config", "get", "agents.grace"]);
    assert_eq!(out(&o).trim(), "agents.grace = 60.0s", "{}", err(&o));

    // Several endpoints, as a quorum's members: a dead one and one that is not the leader (421,
    // nothing done) are passed over, once each, and the submission is made once.
    let (fake, misdirected) = not_the_leader();
    let members = format!("http://127.0.0.1:1, http://{fake}/,{ep}");
    let o = lattice(&members, &dir, &["submit", "--nodes=1", "--walltime=10m", "--", "true"]);
    assert!(o.status.success(), "{}", err(&o));
    let moved = out(&o).trim().to_string();
    assert_eq!(misdirected.load(std::sync::atomic::Ordering::SeqCst), 1);
    let o = lattice(&members, &dir, &["status", "-o", "json"]);
    let all: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    let entrypoints: Vec<&serde_json::Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["entrypoint"] == "true")
        .collect();
    assert_eq!(entrypoints.len(), 1, "submitted once: {all}");
    assert_eq!(entrypoints[0]["id"], moved.as_str());
    let o = lattice(&members, &dir, &["config"]);
    assert!(
        out(&o).contains(&format!("http://127.0.0.1:1,http://{fake},{ep}")),
        "{}",
        out(&o)
    );
    // Only dead members: the error names the last one tried and what the others said.
    let o = lattice("http://127.0.0.1:1,http://127.0.0.1:2", &dir, &["status"]);
    assert!(
        !o.status.success()
            && err(&o).contains("cannot reach the Lattice API at http://127.0.0.1:2 (after http://127.0.0.1:1"),
        "{}",
        err(&o)
    );

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
    let l = out(&run(&["dag", "list", "--state", "completed", "-o", "json"]));
    assert!(l.contains(&dag_id), "{l}");
    let l = out(&run(&["dag", "list", "--user", "nobody", "-o", "json"]));
    assert_eq!(l.trim(), "[]");
    let g = out(&run(&["dag", "graph", &dag_id]));
    assert!(
        g.lines()
            .any(|l| l.starts_with("train") && l.ends_with("prep (success)")),
        "{g}"
    );

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

    // `watch` follows one to its end, a line per state; `--depends-on` waits for another.
    let o = run(&["submit", "--nodes=1", "--walltime=10m", "--", "sleep", "0.3"]);
    let first = out(&o).trim().to_string();
    let o = run(&[
        "submit",
        "--nodes=1",
        "--walltime=10m",
        &format!("--depends-on={first}:success"),
        "--",
        "sleep",
        "0.1",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let second = out(&o).trim().to_string();
    let o = run(&["watch", &second, "--interval", "0.05"]);
    assert!(o.status.success(), "{}", err(&o));
    let lines: Vec<String> = out(&o).lines().map(str::to_string).collect();
    assert!(
        lines.first().is_some_and(|l| l.contains(&format!("{second} pending"))),
        "{lines:?}"
    );
    assert!(
        lines.last().is_some_and(|l| l.contains(&format!("{second} completed"))),
        "{lines:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&out(&run(&["status", &second, "-o", "json"]))).unwrap();
    let w: serde_json::Value = serde_json::from_str(&out(&run(&["status", &first, "-o", "json"]))).unwrap();
    assert!(v["started_ms"].as_u64() >= w["ended_ms"].as_u64(), "{v} {w}");
    let o = run(&["submit", "--nodes=1", "--depends-on=a-1:maybe", "--", "true"]);
    assert!(!o.status.success() && err(&o).contains("a-1:maybe"), "{}", err(&o));

    // `node drain|undrain|disable|enable`.
    for (op, state) in [
        ("drain", "draining"),
        ("undrain", "ready"),
        ("disable", "down"),
        ("enable", "ready"),
    ] {
        let o = run(&["node", op, "sim-003"]);
        assert!(o.status.success(), "{op}: {}", err(&o));
        let text = out(&o);
        assert!(
            text.starts_with("sim-003: ") && (text.contains(state) || op == "drain"),
            "{op}: {text}"
        );
    }
    // `telemetry`, `history`, `audit`, `config`, `completion`.
    let o = run(&["submit", "--nodes=1", "--walltime=10m", "--", "sleep", "30"]);
    let long = out(&o).trim().to_string();
    let o = run(&["telemetry", &long, "--mode", "debug", "--duration", "30m"]);
    assert!(
        o.status.success() && out(&o).contains("telemetry debug"),
        "{}{}",
        out(&o),
        err(&o)
    );
    assert!(run(&["cancel", &long]).status.success());
    let o = run(&["history", "-o", "json"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert!(v["total"]["allocations"].as_u64().unwrap_or(0) >= 3, "{v}");
    assert_eq!(
        v["records"].as_array().unwrap().len() as u64,
        v["total"]["allocations"].as_u64().unwrap(),
        "{v}"
    );
    // Tenants: the list, and one tenant's quotas, holdings and usage.
    assert!(out(&run(&["admin", "tenant"])).lines().any(|l| l == "physics"));
    let t = out(&run(&["admin", "tenant", "show", "physics"]));
    assert!(
        t.starts_with("Tenant physics") && t.contains("Hard quotas: none") && t.contains("Last 90 days: "),
        "{t}"
    );
    let o = run(&["admin", "tenant", "show", "physics", "-o", "json"]);
    let tv: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert!(tv["usage_90d"]["allocations"].as_u64().unwrap() >= 3, "{tv}");
    let o = run(&[
        "admin",
        "tenant",
        "create",
        "--name",
        "chem",
        "--max-nodes",
        "2",
        "--gpu-hours-budget",
        "10",
    ]);
    assert!(
        o.status.success() && out(&o).contains("Hard quotas: 2 nodes"),
        "{}{}",
        out(&o),
        err(&o)
    );
    let o = run(&[
        "admin",
        "tenant",
        "update",
        "chem",
        "--max-nodes",
        "3",
        "--clear",
        "gpu_hours_budget",
        "-o",
        "json",
    ]);
    let tv: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(
        (
            tv["quota"]["max_nodes"].as_u64(),
            tv["quota"]["gpu_hours_budget"].is_null()
        ),
        (Some(3), true),
        "{tv}"
    );
    let o = run(&["admin", "tenant", "create", "--name", "chem"]);
    assert!(!o.status.success() && err(&o).contains("exists"), "{}", err(&o));
    let o = run(&["admin", "tenant", "delete", "chem"]);
    assert!(
        o.status.success() && out(&o).contains("deleted tenant chem"),
        "{}",
        err(&o)
    );
    let o = run(&["admin", "tenant", "show", "nobody"]);
    assert!(
        !o.status.success() && err(&o).contains("no tenant nobody"),
        "{}",
        err(&o)
    );
    let h = out(&run(&["history"]));
    assert!(
        h.starts_with("ID") && h.contains("NODE-H") && h.contains("node-hours"),
        "{h}"
    );
    let o = run(&["audit"]);
    assert!(
        o.status.success() && out(&o).contains("hash chain: valid"),
        "{}{}",
        out(&o),
        err(&o)
    );
    // The book's form, with the filters: no wipe happened here.
    let o = run(&[
        "audit",
        "query",
        "--event",
        "wipe",
        "--data-path",
        "/scratch",
        "-o",
        "json",
    ]);
    assert_eq!(out(&o).trim(), "[]", "{}{}", out(&o), err(&o));
    let o = run(&["config"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        out(&o).contains(&format!("endpoint:    {ep} (LATTICE_ENDPOINT)")),
        "{}",
        out(&o)
    );
    assert!(out(&o).contains("tenant:      physics (LATTICE_TENANT)"), "{}", out(&o));
    for shell in ["bash", "zsh", "fish"] {
        let o = run(&["completion", shell]);
        assert!(
            o.status.success() && out(&o).contains("lattice") && out(&o).contains("submit"),
            "{shell}"
        );
    }
    let script = dir.join("complete.bash");
    std::fs::write(&script, out(&run(&["completion", "bash"]))).unwrap();
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(lattice sub); COMP_CWORD=1; _lattice lattice sub lattice; echo \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output()
        .unwrap();
    assert!(
        out(&o).split_whitespace().any(|w| w == "submit"),
        "{}{}",
        out(&o),
        err(&o)
    );

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
    let tls_yaml = format!(
        "tls:\n  cert: {}\n  key: {}\n  ca: {}\n  mtls: true\n",
        f("member.pem"),
        f("member.key"),
        f("ca.pem")
    );
    let (rt, running) = lattice_testkit::control_plane(&dir, 2, &tls_yaml);
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

/// `lattice top` in a real terminal (tmux): it shows the nodes and a running allocation, refreshes
/// when the allocation ends, and Ctrl-C ends it.
#[test]
fn lattice_top_refreshes_in_a_real_terminal() {
    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "CI must install tmux");
        eprintln!("skipped: needs tmux");
        return;
    }
    let dir = std::env::temp_dir().join(format!("lattice-cli-top-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (rt, running) = lattice_testkit::control_plane(&dir, 3, "");
    let ep = format!("http://{}", running.rest_addr);
    let o = lattice(
        &ep,
        &dir,
        &["submit", "--nodes=2", "--walltime=10m", "--", "sleep", "2"],
    );
    let id = out(&o).trim().to_string();
    let sock = format!("lattice-top-{}", std::process::id());
    struct Tmux(String);
    impl Drop for Tmux {
        fn drop(&mut self) {
            let _ = Command::new("tmux").args(["-L", &self.0, "kill-server"]).status();
        }
    }
    let _tmux = Tmux(sock.clone());
    let cmd = format!(
        "env LATTICE_ENDPOINT={ep} LATTICE_TENANT=physics HOME={} {} top --interval 0.2",
        dir.display(),
        env!("CARGO_BIN_EXE_lattice")
    );
    let ok = Command::new("tmux")
        .args([
            "-L",
            &sock,
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "110",
            "-y",
            "30",
            &cmd,
        ])
        .status()
        .unwrap();
    assert!(ok.success(), "tmux new-session");
    let screen = || {
        let o = Command::new("tmux")
            .args(["-L", &sock, "capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let shows = |want: &dyn Fn(&str) -> bool, what: &str| {
        let t0 = Instant::now();
        loop {
            let s = screen();
            if want(&s) {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(15), "{what} never showed:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let s = shows(
        &|s| s.lines().any(|l| l.starts_with(&id) && l.contains("running")),
        "the running allocation",
    );
    assert!(s.contains("nodes: 3 (3 ready), 2 in use"), "{s}");
    assert!(s.contains("allocations: 1 running, 0 waiting"), "{s}");
    // It ends (2 s): the screen refreshes by itself.
    let s = shows(&|s| s.contains("0 running, 0 waiting, 1 ended"), "the allocation's end");
    assert!(!s.lines().any(|l| l.starts_with(&id)), "{s}");
    // Ctrl-C ends it (and with it the tmux session).
    let ok = Command::new("tmux")
        .args(["-L", &sock, "send-keys", "-t", "t", "C-c"])
        .status()
        .unwrap();
    assert!(ok.success());
    let t0 = Instant::now();
    while Command::new("tmux")
        .args(["-L", &sock, "has-session", "-t", "t"])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(t0.elapsed() < Duration::from_secs(5), "top did not end on Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.block_on(running.shutdown());
}

/// A local OIDC IdP speaking the device authorization grant (RFC 8628), refresh and revocation
/// (RFC 7009); its access tokens are HS256 JWTs the runtime checks with the shared dev secret.
mod idp {
    use axum::extract::{Form, State};
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use serde_json::{Value, json};
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    pub const SECRET: &str = "idp-test-secret";

    #[derive(Default)]
    pub struct Seen {
        /// Token endpoint polls while the user had not approved yet.
        pub pending: u32,
        pub refreshes: u32,
        pub revoked: Vec<String>,
        pub scopes: Vec<String>,
    }

    type S = State<(String, Arc<Mutex<Seen>>)>;

    fn jwt(sub: &str) -> String {
        let claims = json!({"sub": sub, "tenant": "physics", "roles": ["User"],
                            "exp": jsonwebtoken::get_current_timestamp() + 600});
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    async fn discovery(State((base, _)): S) -> Json<Value> {
        Json(
            json!({"issuer": base, "device_authorization_endpoint": format!("{base}/device"),
                    "token_endpoint": format!("{base}/token"), "revocation_endpoint": format!("{base}/revoke")}),
        )
    }

    async fn device(State((base, seen)): S, Form(f): Form<BTreeMap<String, String>>) -> Json<Value> {
        assert_eq!(f["client_id"], "lattice");
        seen.lock().unwrap().scopes.push(f["scope"].clone());
        Json(
            json!({"device_code": "dev-1", "user_code": "WDJB-MJHT", "verification_uri": format!("{base}/activate"),
                    "expires_in": 60, "interval": 1}),
        )
    }

    async fn token(
        State((_, seen)): S,
        Form(f): Form<BTreeMap<String, String>>,
    ) -> (axum::http::StatusCode, Json<Value>) {
        let mut s = seen.lock().unwrap();
        match f["grant_type"].as_str() {
            "urn:ietf:params:oauth:grant-type:device_code" => {
                assert_eq!(f["device_code"], "dev-1");
                // The user approves after the first poll.
                if s.pending == 0 {
                    s.pending += 1;
                    return (
                        axum::http::StatusCode::BAD_REQUEST,
                        Json(json!({"error": "authorization_pending"})),
                    );
                }
                // Already expired by its `expires_in`: the client's next request must refresh first.
                (
                    axum::http::StatusCode::OK,
                    Json(json!({"access_token": jwt("alice"), "refresh_token": "refresh-1",
                                                      "token_type": "Bearer", "expires_in": 0})),
                )
            }
            "refresh_token" => {
                assert_eq!(f["refresh_token"], "refresh-1");
                s.refreshes += 1;
                (
                    axum::http::StatusCode::OK,
                    Json(json!({"access_token": jwt("alice"), "token_type": "Bearer",
                                                      "expires_in": 3600})),
                )
            }
            other => panic!("grant {other}"),
        }
    }

    async fn revoke(State((_, seen)): S, Form(f): Form<BTreeMap<String, String>>) {
        seen.lock().unwrap().revoked.push(f["token"].clone());
    }

    /// Starts the IdP on `rt`: its base URL and what it saw.
    pub fn start(rt: &tokio::runtime::Runtime) -> (String, Arc<Mutex<Seen>>) {
        let l = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/device", post(device))
            .route("/token", post(token))
            .route("/revoke", post(revoke))
            .with_state((base.clone(), seen.clone()));
        rt.spawn(async move { axum::serve(l, app).await.unwrap() });
        (base, seen)
    }
}

#[test]
fn lattice_login_uses_the_device_flow_caches_refreshes_and_logs_out() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("lattice-cli-login-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (idp_url, seen) = idp::start(&rt);
    let cfg = lattice_runtime::RuntimeConfig::parse(
        "t.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\ncycle: 100ms\nauth:\n  mode: jwt\n  hs256_secret: {}\n  idp_url: {idp_url}\n  client_id: lattice\n",
            dir.display(),
            idp::SECRET
        ),
    )
    .unwrap();
    let running = rt.block_on(lattice_runtime::start(cfg, true)).unwrap();
    let ep = format!("http://{}", running.rest_addr);
    let run = |args: &[&str]| lattice(&ep, &dir, args);
    let tokens = dir.join(".config/lattice/tokens.json");

    // Not logged in: the seed's message, and nothing cached.
    let o = run(&["status"]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("Not logged in. Run `lattice login` first."),
        "{}",
        err(&o)
    );
    assert!(!tokens.exists());

    // The device flow: the code shown, one pending poll, then the tokens cached 0600 for this server.
    let o = run(&["login"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        err(&o).contains("WDJB-MJHT") && err(&o).contains(&format!("{idp_url}/activate")),
        "{}",
        err(&o)
    );
    assert!(out(&o).contains(&format!("Logged in to {ep}")), "{}", out(&o));
    assert_eq!(seen.lock().unwrap().pending, 1);
    assert_eq!(seen.lock().unwrap().scopes, ["openid offline_access"]);
    assert_eq!(std::fs::metadata(&tokens).unwrap().permissions().mode() & 0o777, 0o600);
    let cached: serde_json::Value = serde_json::from_slice(&std::fs::read(&tokens).unwrap()).unwrap();
    assert_eq!(cached[&ep]["refresh_token"], "refresh-1", "{cached}");

    // The token came already expired: the next command refreshes it once, then uses the fresh one.
    let o = run(&["submit", "--nodes=1", "--walltime=10m", "--", "sleep", "0"]);
    assert!(o.status.success(), "{}", err(&o));
    let id = out(&o).trim().to_string();
    assert_eq!(seen.lock().unwrap().refreshes, 1);
    let o = run(&["status", &id, "-o", "json"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["user"], "alice", "the token's subject submitted it: {v}");
    assert_eq!(seen.lock().unwrap().refreshes, 1);

    // A cache others can read is warned about and fixed (lenient mode).
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run(&["status"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("set to 600"), "{}", err(&o));
    assert_eq!(std::fs::metadata(&tokens).unwrap().permissions().mode() & 0o777, 0o600);

    // Logout: forgotten here, revoked at the IdP; the next command is not logged in.
    let o = run(&["logout"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(seen.lock().unwrap().revoked, ["refresh-1"]);
    let cached: serde_json::Value = serde_json::from_slice(&std::fs::read(&tokens).unwrap()).unwrap();
    assert!(cached.get(&ep).is_none(), "{cached}");
    assert!(err(&run(&["status"])).contains("Not logged in"));
    rt.block_on(running.shutdown());
}

/// An HS256 token for `sub` of physics with `roles`.
fn physics_token(sub: &str, roles: &[&str]) -> String {
    let claims = serde_json::json!({"sub": sub, "tenant": "physics", "roles": roles,
                                    "exp": jsonwebtoken::get_current_timestamp() + 600});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"books-cli-secret"),
    )
    .unwrap()
}

/// `lattice` as `token`'s holder.
fn lattice_as(endpoint: &str, home: &std::path::Path, token: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lattice"))
        .args(args)
        .env("LATTICE_ENDPOINT", endpoint)
        .env("LATTICE_TENANT", "physics")
        .env("LATTICE_TOKEN", token)
        .env("HOME", home)
        .output()
        .expect("lattice runs")
}

fn json_of(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", err(o));
    serde_json::from_str(&out(o)).unwrap_or_else(|e| panic!("{e}: {}", out(o)))
}

/// The book's CLI beyond the basics, against a runtime with users: global `-q`, `-v`, `--vcluster`,
/// `--config`; `status --state --count`; `cancel --all-mine [--state]`; submit's `--sensitive`,
/// `--expose`, `--no-preempt`, `--constraint KEY:VALUE`; `node list|status|drain --urgent`;
/// `logs --since`; `history --since/--until`; `usage`; `metrics`, `diagnostics`. Then a Rust program
/// drives the same runtime through `lattice-client`.
#[test]
fn the_books_commands_and_flags() {
    let dir = std::env::temp_dir().join(format!("lattice-cli-book-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let auth = "auth:\n  mode: jwt\n  hs256_secret: books-cli-secret\n";
    let (_rt, running) = lattice_testkit::control_plane(&dir, 4, auth);
    let ep = format!("http://{}", running.rest_addr);
    let (alice, bob, olga) = (
        physics_token("alice", &["User"]),
        physics_token("bob", &["User"]),
        physics_token("olga", &["Operator"]),
    );
    let submit = |tok: &str, args: &[&str]| {
        let o = lattice_as(&ep, &dir, tok, &[&["-q", "submit"], args].concat());
        assert!(o.status.success(), "{}", err(&o));
        out(&o).trim().to_string()
    };
    let state = |id: &str| json_of(&lattice_as(&ep, &dir, &olga, &["status", id, "-o", "json"]))["state"].clone();
    // alice: one that runs, one that waits for it to succeed; bob: one that runs.
    let a_run = submit(&alice, &["--nodes=1", "--walltime=1h", "--", "sleep", "600"]);
    let after = format!("--depends-on={a_run}:success");
    let a_wait = submit(&alice, &["--nodes=1", "--walltime=1h", &after, "--", "sleep", "600"]);
    let b_run = submit(&bob, &["--nodes=1", "--walltime=1h", "--", "sleep", "600"]);
    lattice_testkit::http::wait_until("two running", Duration::from_secs(20), || {
        state(&a_run) == "running" && state(&b_run) == "running"
    });

    // status: `--state` (several), `--count`, `-q` ids, `--vcluster`.
    let count = lattice_as(&ep, &dir, &alice, &["status", "--state=pending", "--count"]);
    assert_eq!(out(&count).trim(), "1", "{}", err(&count));
    // (A User sees their own allocations; an Operator everyone's.)
    let counted = |tok: &str| {
        let args = ["status", "--state=running,pending", "--count", "-o", "json"];
        json_of(&lattice_as(&ep, &dir, tok, &args))["count"].clone()
    };
    assert_eq!((counted(&alice), counted(&olga)), (2.into(), 3.into()));
    let ids = lattice_as(&ep, &dir, &olga, &["-q", "status", "--state=running"]);
    let ids = out(&ids);
    let mut listed: Vec<&str> = ids.lines().collect();
    listed.sort();
    assert_eq!(listed, [a_run.as_str(), b_run.as_str()]);
    let none = lattice_as(&ep, &dir, &olga, &["--vcluster", "nope", "-q", "status"]);
    assert!(none.status.success() && out(&none).is_empty(), "{}", out(&none));
    let some = lattice_as(&ep, &dir, &olga, &["--vcluster", "default", "-q", "status"]);
    assert_eq!(out(&some).lines().count(), 3);

    // -v: each request on stderr.
    let v = lattice_as(&ep, &dir, &alice, &["-v", "status", &a_run]);
    assert!(
        err(&v).contains(&format!("lattice: GET {ep}/v1/allocations/{a_run} -> 200")),
        "{}",
        err(&v)
    );
    // --config: the file named, which must exist.
    let cfg = dir.join("other.yaml");
    std::fs::write(&cfg, "tenant: physics\nvcluster: default\n").unwrap();
    let c = lattice_as(&ep, &dir, &alice, &["--config", cfg.to_str().unwrap(), "config"]);
    assert!(
        out(&c).contains(&format!("config file: {}", cfg.display())),
        "{}",
        out(&c)
    );
    assert!(out(&c).contains("vcluster:    default"), "{}", out(&c));
    let c = lattice_as(&ep, &dir, &alice, &["--config", "/nonexistent/lattice.yaml", "status"]);
    assert!(!c.status.success() && err(&c).contains("no such file"), "{}", err(&c));

    // cancel --all-mine: only the caller's, only in the state asked for.
    let o = lattice_as(&ep, &dir, &alice, &["cancel", "--all-mine", "--state=pending"]);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o).trim(), format!("cancelled {a_wait}"));
    assert_eq!(state(&a_wait), "cancelled");
    assert_eq!((state(&a_run), state(&b_run)), ("running".into(), "running".into()));
    let o = lattice_as(&ep, &dir, &alice, &["-q", "cancel", "--all-mine"]);
    assert_eq!(out(&o).trim(), a_run, "{}", err(&o));
    lattice_testkit::http::wait_until("alice's cancelled", Duration::from_secs(10), || {
        state(&a_run) == "cancelled"
    });
    assert_eq!(state(&b_run), "running", "bob's is not alice's");
    let refused = lattice_as(&ep, &dir, &alice, &["cancel", "--all-mine", "a-000001"]);
    assert!(!refused.status.success());

    // submit's flags: refused ones queue nothing; the others reach the request.
    let before = json_of(&lattice_as(&ep, &dir, &olga, &["status", "--all", "-o", "json"]));
    let o = lattice_as(
        &ep,
        &dir,
        &alice,
        &["submit", "--sensitive", "--nodes=1", "--walltime=1h", "--", "true"],
    );
    assert!(!o.status.success() && err(&o).contains("403"), "{}", err(&o));
    let o = lattice_as(
        &ep,
        &dir,
        &alice,
        &["submit", "--no-preempt", "--preemption-class=3", "--", "true"],
    );
    assert!(
        !o.status.success() && err(&o).contains("--no-preempt needs"),
        "{}",
        err(&o)
    );
    let o = lattice_as(
        &ep,
        &dir,
        &alice,
        &["submit", "--expose", "api:99999", "--service", "--", "true"],
    );
    assert!(
        !o.status.success() && err(&o).contains("--expose api:99999"),
        "{}",
        err(&o)
    );
    let o = lattice_as(
        &ep,
        &dir,
        &alice,
        &[
            "submit",
            "--image=busybox:1",
            "--tools-uenv=profiling/2024.1",
            "--",
            "true",
        ],
    );
    assert!(
        !o.status.success() && err(&o).contains("field `environment.tools_uenv`"),
        "{}",
        err(&o)
    );
    let after = json_of(&lattice_as(&ep, &dir, &olga, &["status", "--all", "-o", "json"]));
    assert_eq!(
        before.as_array().unwrap().len(),
        after.as_array().unwrap().len(),
        "nothing queued"
    );
    // --tools-uenv beside --uenv (book: "Application Profiling Integration").
    let tools = submit(
        &alice,
        &[
            "--uenv=prgenv-gnu/24.11:v1",
            "--tools-uenv=profiling/2024.1",
            "--",
            "true",
        ],
    );
    let v = json_of(&lattice_as(&ep, &dir, &alice, &["status", &tools, "-o", "json"]));
    assert_eq!(
        v["environment"],
        serde_json::json!({"uenv": "prgenv-gnu/24.11:v1", "tools_uenv": "profiling/2024.1"}),
        "{v}"
    );
    lattice_as(&ep, &dir, &alice, &["cancel", &tools]);
    let np = submit(
        &alice,
        &["--no-preempt", "--nodes=1", "--walltime=1h", "--", "sleep", "600"],
    );
    let v = json_of(&lattice_as(&ep, &dir, &alice, &["status", &np, "-o", "json"]));
    assert_eq!(v["preemption_class"], 7, "{v}");
    // The book's Slurm table: `--qos=high` is `--priority=high`.
    let hi = submit(&alice, &["--priority=high", "--nodes=1", "--", "true"]);
    let v = json_of(&lattice_as(&ep, &dir, &alice, &["status", &hi, "-o", "json"]));
    assert_eq!(v["preemption_class"], 7, "{v}");
    lattice_as(&ep, &dir, &alice, &["cancel", &hi]);
    let o = lattice_as(&ep, &dir, &alice, &["submit", "--priority=11", "--", "true"]);
    assert!(
        !o.status.success() && err(&o).contains("expected a class 0-10"),
        "{}",
        err(&o)
    );
    // A checkpoint port belongs to the grpc mechanism.
    let o = lattice_as(
        &ep,
        &dir,
        &alice,
        &["submit", "--checkpoint=signal", "--checkpoint-port=9999", "--", "true"],
    );
    assert!(
        !o.status.success() && err(&o).contains("field `checkpoint.port`"),
        "{}",
        err(&o)
    );
    // `KEY:VALUE` is the constraint, not a feature: no node has a GH200 here.
    let o = lattice_as(
        &ep,
        &dir,
        &alice,
        &["submit", "--constraint=gpu_type:GH200", "--", "true"],
    );
    assert!(
        !o.status.success() && err(&o).contains("match its constraints"),
        "{}",
        err(&o)
    );
    let svc = submit(
        &alice,
        &[
            "--service",
            "--expose",
            "api:8443/https",
            "--nodes=1",
            "--",
            "sleep",
            "600",
        ],
    );
    lattice_testkit::http::wait_until("the service runs", Duration::from_secs(20), || state(&svc) == "running");
    let registry = lattice_client::Client::connect(&ep, Some(alice.clone()));
    let services = registry.call("GET", "/api/v1/services", None).unwrap();
    assert_eq!(services["services"], serde_json::json!(["api"]), "{services}");

    // node list|status, drain --urgent (Operator): the allocation on it is asked to checkpoint.
    let listed = json_of(&lattice_as(&ep, &dir, &olga, &["node", "list", "-o", "json"]));
    let busy = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["owner"] == np.as_str())
        .map(|n| n["name"].as_str().unwrap().to_string())
        .expect("the node the no-preempt job runs on");
    let shown = json_of(&lattice_as(&ep, &dir, &olga, &["node", "status", &busy, "-o", "json"]));
    assert_eq!(shown["owner"], np.as_str());
    let o = lattice_as(&ep, &dir, &alice, &["node", "drain", &busy, "--urgent"]);
    assert!(!o.status.success(), "a User drains nothing");
    let o = lattice_as(&ep, &dir, &olga, &["node", "drain", &busy, "--urgent"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains(&format!("{busy}: draining")), "{}", out(&o));
    assert!(out(&o).contains(&format!("{np}: not checkpointed")), "{}", out(&o));
    let n = json_of(&lattice_as(&ep, &dir, &olga, &["nodes", &busy, "-o", "json"]));
    assert_eq!(n["state"], "draining", "{n}");

    // logs --since, history --since/--until, usage, metrics, diagnostics.
    let o = lattice_as(&ep, &dir, &alice, &["logs", &a_run, "--since", "2026-01-01"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = lattice_as(&ep, &dir, &alice, &["logs", &a_run, "--since", "soon"]);
    assert!(!o.status.success() && err(&o).contains("field `since`"), "{}", err(&o));
    let h = json_of(&lattice_as(
        &ep,
        &dir,
        &alice,
        &["history", "--user", "alice", "--since", "2026-01-01", "-o", "json"],
    ));
    assert!(
        h["records"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == a_run.as_str()),
        "{h}"
    );
    let o = lattice_as(
        &ep,
        &dir,
        &alice,
        &[
            "history",
            "--user",
            "alice",
            "--since",
            "2030-01-02",
            "--until",
            "2030-01-01",
        ],
    );
    assert!(!o.status.success() && err(&o).contains("field `since`"), "{}", err(&o));
    let u = json_of(&lattice_as(&ep, &dir, &alice, &["usage", "-o", "json"]));
    assert!(u["allocations"].as_u64().unwrap() >= 2, "{u}");
    let o = lattice_as(&ep, &dir, &alice, &["usage", "--user", "bob"]);
    assert!(
        !o.status.success() && err(&o).contains("403"),
        "another user's usage: {}",
        err(&o)
    );
    let o = lattice_as(&ep, &dir, &alice, &["metrics", &np]);
    assert!(
        !o.status.success() && err(&o).contains("no TSDB configured"),
        "{}",
        err(&o)
    );
    let d = json_of(&lattice_as(
        &ep,
        &dir,
        &alice,
        &["diagnostics", &np, "--network", "-o", "json"],
    ));
    assert_eq!(d["id"], np.as_str(), "{d}");

    // admin network set-grace (SystemAdmin; the tenant from -t/LATTICE_TENANT) and domains.
    let root = physics_token("root", &["SystemAdmin"]);
    let o = lattice_as(
        &ep,
        &dir,
        &olga,
        &["admin", "network", "set-grace", "--domain=ml", "--grace=15m"],
    );
    assert!(!o.status.success() && err(&o).contains("403"), "{}", err(&o));
    let key = "network.grace_by_domain.physics/ml";
    let site = |tok: &str| {
        json_of(&lattice_as(
            &ep,
            &dir,
            tok,
            &["admin", "config", "get", "network", "-o", "json"],
        ))
    };
    assert!(site(&root).get(key).is_none(), "refused: nothing set");
    let set = &["admin", "network", "set-grace", "--domain=ml", "--grace=15m"];
    let o = lattice_as(&ep, &dir, &root, set);
    assert!(
        out(&o).contains("network domain ml of physics: grace period 900s"),
        "{}{}",
        out(&o),
        err(&o)
    );
    assert_eq!(site(&root)[key], 900.0);
    let o = lattice_as(
        &ep,
        &dir,
        &root,
        &["admin", "network", "set-grace", "--domain=ml", "--grace=soon"],
    );
    assert!(!o.status.success() && err(&o).contains(key), "{}", err(&o));
    assert_eq!(site(&root)[key], 900.0, "a refused change changes nothing");
    let o = lattice_as(
        &ep,
        &dir,
        &root,
        &["admin", "network", "set-grace", "--domain=ml", "--grace=default"],
    );
    assert!(out(&o).contains("the site's default"), "{}{}", out(&o), err(&o));
    assert!(site(&root).get(key).is_none(), "back to the default");
    let d = json_of(&lattice_as(
        &ep,
        &dir,
        &olga,
        &["admin", "network", "domains", "-o", "json"],
    ));
    assert_eq!(d["vni_pool"]["total"], 3096, "{d}");
    let table = lattice_as(&ep, &dir, &olga, &["admin", "network", "domains"]);
    assert!(out(&table).contains("VNI pool: "), "{}", out(&table));

    a_rust_program_uses_lattice_client(&ep, &bob, &b_run);
}

/// A Rust program's use of `lattice-client`: typed calls on the API's own types against the same
/// runtime, refusals as `Error::Api` naming the field.
fn a_rust_program_uses_lattice_client(ep: &str, bob: &str, running: &str) {
    use lattice_client::{Client, Error, ListFilter};
    let client = Client::connect(ep, Some(bob.to_string()));
    let request: lattice_client::SubmitRequest = serde_json::from_value(serde_json::json!({
        "tenant": "physics", "entrypoint": "sleep 1",
        "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "10m"}
    }))
    .unwrap();
    let id = client.submit(&request).unwrap().id;
    let ended = client
        .wait(&id, Duration::from_millis(100), Duration::from_secs(30))
        .unwrap();
    assert_eq!(ended.state, "completed");
    assert!(client.logs(&id, "stdout").is_ok());
    let mine = client
        .allocations(&ListFilter {
            mine: true,
            ..Default::default()
        })
        .unwrap();
    assert!(mine.iter().all(|a| a.user.as_deref() == Some("bob")), "{mine:?}");
    assert!(mine.iter().any(|a| a.id == running) && mine.iter().any(|a| a.id == id));
    assert!(!client.nodes().unwrap().is_empty());
    let mut bad = request.clone();
    bad.lifecycle = serde_json::from_value(serde_json::json!({"type": "bounded", "walltime": "-3h"})).unwrap();
    match client.submit(&bad) {
        Err(Error::Api { status: 400, field, .. }) => assert_eq!(field.as_deref(), Some("lifecycle.walltime")),
        other => panic!("{other:?}"),
    }
    assert_eq!(client.cancel(running).unwrap(), "cancelled");
    let other = Client::connect(ep, None);
    assert!(matches!(other.allocation(running), Err(Error::NotLoggedIn)));
}

/// The auditor's path (docs/operators.md): the site's Ed25519 audit key made with openssl, a
/// sensitive claim run and released (claim, release, wipe entries, each signed with that key), a
/// `lattice audit export` verified offline with `lattice audit verify --key` (no server: the member is
/// stopped first); then each kind of tampering is named: an entry's content (by its seq), an entry
/// removed (the bundle's signature), another key.
#[test]
fn an_audit_export_verifies_offline_and_names_what_was_tampered_with() {
    let dir = std::env::temp_dir().join(format!("lattice-cli-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("audit.pem");
    let ssl = |args: &[&str]| Command::new("openssl").args(args).output().expect("openssl runs");
    assert!(
        ssl(&["genpkey", "-algorithm", "ed25519", "-out", key.to_str().unwrap()])
            .status
            .success()
    );
    let der = ssl(&["pkey", "-in", key.to_str().unwrap(), "-pubout", "-outform", "DER"]).stdout;
    let public: String = der[der.len() - 32..].iter().map(|b| format!("{b:02x}")).collect();
    let extra = format!(
        "sensitive:\n  audit_signing_key_path: {}\nagents:\n  simulated_wipe: 200ms\n",
        key.display()
    );
    let (rt, running) = lattice_testkit::control_plane(&dir, 2, &extra);
    let ep = format!("http://{}", running.rest_addr);
    let run = |args: &[&str]| lattice(&ep, &dir, args);
    let o = run(&[
        "-q",
        "submit",
        "--sensitive",
        "--nodes=1",
        "--walltime=1h",
        "--",
        "sleep",
        "600",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let id = out(&o).trim().to_string();
    let entries = |event: &str| {
        let o = run(&["audit", "query", "--alloc", &id, "--event", event, "-o", "json"]);
        serde_json::from_str::<serde_json::Value>(&out(&o)).unwrap_or_default()
    };
    lattice_testkit::http::wait_until("the claim", Duration::from_secs(20), || {
        entries("claim").as_array().is_some_and(|a| !a.is_empty())
    });
    // A sensitive allocation's metrics are never compared with another's (while it runs, and after).
    let o = run(&["-q", "submit", "--nodes=1", "--walltime=1h", "--", "sleep", "600"]);
    let plain = out(&o).trim().to_string();
    let refused = |o: &Output| !o.status.success() && err(o).contains(&format!("{id} is sensitive"));
    let o = run(&["compare", &plain, &id]);
    assert!(refused(&o), "{}", err(&o));
    assert!(run(&["cancel", &id]).status.success());
    lattice_testkit::http::wait_until("the wipe", Duration::from_secs(20), || {
        entries("wipe").as_array().is_some_and(|a| !a.is_empty())
    });
    let o = run(&["compare", &id, &plain]);
    assert!(refused(&o), "ended, still refused: {}", err(&o));
    let bundle = dir.join("audit-report.json");
    let o = run(&["audit", "export", "--alloc", &id, "--out", bundle.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    rt.block_on(running.shutdown());

    // Offline: the member is gone.
    let verify = |file: &std::path::Path, key: &str| {
        lattice(&ep, &dir, &["audit", "verify", file.to_str().unwrap(), "--key", key])
    };
    let o = verify(&bundle, &public);
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    let b: serde_json::Value = serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    let actions: Vec<&str> = b["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(
        ["claim", "release", "wipe"].iter().all(|a| actions.contains(a)),
        "{actions:?}"
    );
    assert!(
        b["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["key"] == public.as_str()),
        "every entry signed with the site's key: {b}"
    );
    assert!(
        out(&o).contains(&format!("{} entries verified", actions.len())),
        "{}",
        out(&o)
    );
    let tampered = |name: &str, change: &dyn Fn(&mut serde_json::Value)| {
        let mut t = b.clone();
        change(&mut t);
        let path = dir.join(name);
        std::fs::write(&path, serde_json::to_vec_pretty(&t).unwrap()).unwrap();
        let o = verify(&path, &public);
        assert!(!o.status.success(), "{name} verified");
        err(&o)
    };
    let seq = b["entries"][1]["seq"].as_u64().unwrap();
    let e = tampered("edited.json", &|t| t["entries"][1]["user"] = "mallory".into());
    assert!(e.contains(&format!("entry {seq}: its hash does not match")), "{e}");
    let e = tampered("removed.json", &|t| {
        t["entries"].as_array_mut().unwrap().remove(1);
    });
    assert!(e.contains("the bundle: the signature does not verify"), "{e}");
    let other = "00".repeat(32);
    let o = verify(&bundle, &other);
    assert!(
        !o.status.success() && err(&o).contains("which is not trusted"),
        "{}",
        err(&o)
    );
}
