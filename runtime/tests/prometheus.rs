//! Observability against the real tools: a real Prometheus (Debian's `prometheus`) scrapes a running
//! control plane and evaluates `runtime/monitoring/alerts.yml`, and the test asks Prometheus' HTTP API
//! for the seed's metric names; `promtool` checks the rules and runs their unit tests
//! (`alerts_test.yml`); every metric the dashboards and the rules use is one the runtime exports.

use lattice_runtime::{RuntimeConfig, start};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring")
}

fn http(method: &str, url: &str, body: Option<Value>) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut r = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        ("POST", Some(b)) => agent.post(url).send_json(b),
        _ => unreachable!(),
    }
    .expect("request reaches the server");
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
}

/// Kills Prometheus however the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The tool on PATH; `None` (the test skips, saying so) where it is missing outside CI.
fn tool(name: &str) -> Option<PathBuf> {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must install `{name}` (Debian package `prometheus`)"
    );
    eprintln!("skipped: `{name}` is not installed (Debian package `prometheus`)");
    None
}

/// The `lattice_*` names in a PromQL expression, histogram series reduced to their family.
fn names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("lattice_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let mut name = &tail[..end];
        for suffix in ["_bucket", "_count", "_sum"] {
            if let Some(base) = name.strip_suffix(suffix) {
                name = base;
            }
        }
        out.push(name.to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let Some(promtool) = tool("promtool") else { return };
    for args in [
        ["check", "rules", "alerts.yml"],
        ["check", "rules", "federation-alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(monitoring())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every rule has a firing case in the unit tests.
    let rules = ["alerts.yml", "federation-alerts.yml"]
        .map(|f| std::fs::read_to_string(monitoring().join(f)).unwrap())
        .concat();
    let tests = std::fs::read_to_string(monitoring().join("alerts_test.yml")).unwrap();
    for line in rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")) {
        assert!(
            tests.contains(&format!(
                "alertname: {line}\n        exp_alerts:\n          - exp_labels"
            )),
            "no firing case for {line}"
        );
    }
}

#[test]
fn a_real_prometheus_scrapes_the_seeds_metrics_and_evaluates_the_rules() {
    let Some(prometheus) = tool("prometheus") else { return };
    let dir = std::env::temp_dir().join(format!("lattice-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tenants.yaml"), "physics:\n  max_nodes: 3\n").unwrap();
    std::fs::create_dir_all(dir.join("checkpoints")).unwrap();
    let cfg = RuntimeConfig::parse(
        "t.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {d}/q\nsimulated_nodes: 4\nsimulate_agents: false\ncycle: 100ms\ntenants: {d}/tenants.yaml\nservices:\n  checkpoint_store: {{path: {d}/checkpoints, interval: 200ms, failures: 2}}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let running = rt.block_on(start(cfg, true)).unwrap();
    let base = format!("http://{}", running.rest_addr);
    let t0 = Instant::now();
    while !running.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(50));
    }
    // The nodes' agents (played by the test): registered, one heartbeat each with the round trip its
    // agent measured for the one before.
    for n in 0..4 {
        let node = format!("sim-{n:03}");
        let (status, body) = http("POST", &format!("{base}/v1/nodes/{node}/register"), Some(json!({})));
        assert_eq!(status, 200, "{body}");
        let (status, body) = http(
            "POST",
            &format!("{base}/v1/nodes/{node}/heartbeat"),
            Some(json!({"seq": 1, "rtt_ms": 3.5})),
        );
        assert_eq!(status, 200, "{body}");
    }
    // Work for the metrics: a running allocation, a pending one (over the tenant's quota), a 404.
    for (nodes, secs) in [(2, 60), (2, 60), (1, 0)] {
        let (status, body) = http(
            "POST",
            &format!("{base}/v1/allocations"),
            Some(json!({"tenant": "physics", "entrypoint": format!("sleep {secs}"),
                "resources": {"nodes": nodes}, "lifecycle": {"walltime": "10m"}})),
        );
        assert_eq!(status, 201, "{body}");
    }
    assert_eq!(http("GET", &format!("{base}/v1/allocations/a-999999"), None).0, 404);

    // The runtime's own exposition: every name the dashboards and rules use is there.
    let text = http("GET", &format!("{base}/metrics"), None).1;
    let exported = |name: &str| text.contains(&format!("# TYPE {name} "));
    let rules = std::fs::read_to_string(monitoring().join("alerts.yml")).unwrap();
    for name in names_in(&rules) {
        assert!(exported(&name), "alerts.yml uses {name}, not exported");
    }
    for d in std::fs::read_dir(monitoring().join("dashboards")).unwrap().flatten() {
        let v: Value = serde_json::from_slice(&std::fs::read(d.path()).unwrap()).unwrap();
        assert!(v["title"].is_string() && v["uid"].is_string(), "{}", d.path().display());
        let panels = v["panels"].as_array().unwrap();
        assert!(!panels.is_empty());
        for p in panels {
            for t in p["targets"].as_array().unwrap() {
                for name in names_in(t["expr"].as_str().unwrap()) {
                    assert!(exported(&name), "{} uses {name}, not exported", d.path().display());
                }
            }
        }
    }

    // A real Prometheus scraping it every second, with the rules loaded.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{rules}]\nscrape_configs:\n  - job_name: lattice\n    static_configs: [{{targets: ['{target}']}}]\n",
            rules = monitoring().join("alerts.yml").display(),
            target = running.rest_addr
        ),
    )
    .unwrap();
    let _prom = Killed(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let query = |q: &str| -> Vec<Value> {
        let encoded = lattice_util::url::component(q);
        let url = format!("{api}/query?query={encoded}");
        match ureq::get(&url).call() {
            Ok(mut r) => {
                let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
                v["data"]["result"].as_array().cloned().unwrap_or_default()
            }
            Err(_) => Vec::new(),
        }
    };
    // Scraped: the target is up.
    let t0 = Instant::now();
    while query("up{job=\"lattice\"} == 1").is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "Prometheus never scraped the runtime: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The seed's names, with the seed's labels, as Prometheus stored them.
    let t0 = Instant::now();
    let want = [
        "lattice_allocations_total{state=\"running\"}",
        "lattice_allocations_active",
        "lattice_nodes_total",
        "lattice_scheduling_queue_depth{vcluster=\"default\"}",
        "lattice_scheduling_placements_total",
        "lattice_scheduling_proposals_total{result=\"accepted\"}",
        "lattice_scheduling_cycle_duration_seconds_count",
        "lattice_raft_commit_latency_seconds_bucket{le=\"30\"}",
        "lattice_raft_leader{member_id=\"1\"} == 1",
        "lattice_raft_log_entries",
        "lattice_raft_disk_total_bytes",
        "lattice_raft_snapshot_size_bytes",
        "lattice_api_requests_total{method=\"GET\",status=\"404\"}",
        "lattice_api_requests_total{method=\"POST\",status=\"201\"}",
        "lattice_api_request_duration_seconds_count{method=\"POST\"}",
        "lattice_quota_used_nodes{tenant=\"physics\"}",
        "lattice_quota_max_nodes{tenant=\"physics\"} == 3",
        "lattice_network_vni_pool_total",
        "lattice_checkpoint_storage_unavailable == 0",
        "lattice_node_capability_mismatch == 0",
        "lattice_agent_last_heartbeat_timestamp{node_id=\"sim-003\"} > 1.7e9",
        "lattice_agent_heartbeat_latency_seconds_count{node_id=\"sim-000\"} == 1",
        "lattice_preemptions_total{vcluster=\"default\",reason=\"priority\"} == 0",
    ];
    let mut missing: Vec<&str> = want.to_vec();
    while !missing.is_empty() {
        missing.retain(|q| query(q).is_empty());
        assert!(t0.elapsed() < Duration::from_secs(30), "Prometheus has no {missing:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    // The rules load and evaluate without errors.
    let t0 = Instant::now();
    loop {
        let mut r = ureq::get(&format!("{api}/rules")).call().unwrap();
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        let rules: Vec<&Value> = v["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        let evaluated = rules.iter().all(|r| r["health"] == "ok");
        if rules.len() == rules_in(&monitoring().join("alerts.yml")) && evaluated {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{v}");
        std::thread::sleep(Duration::from_millis(250));
    }
    // The checkpoint store goes away: the probe finds it, the engine knows, the alert fires; it comes
    // back and the outage ends.
    std::fs::remove_dir_all(dir.join("checkpoints")).unwrap();
    let t0 = Instant::now();
    loop {
        let mut r = ureq::get(&format!("{api}/alerts")).call().unwrap();
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        let firing = v["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| a["labels"]["alertname"] == "LatticeCheckpointStorageUnavailable" && a["state"] == "firing");
        if firing {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no storage alert: {v}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        !rt.block_on(running.shared.control.lock())
            .checkpoint_storage_available()
    );
    std::fs::create_dir_all(dir.join("checkpoints")).unwrap();
    let t0 = Instant::now();
    while !rt
        .block_on(running.shared.control.lock())
        .checkpoint_storage_available()
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "the outage ends");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, metrics) = http("GET", &format!("{base}/metrics"), None);
    assert!(
        metrics.contains("lattice_checkpoint_storage_unavailable 0"),
        "{metrics}"
    );
    rt.block_on(running.shutdown());
}

fn rules_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| l.trim().starts_with("- alert: "))
        .count()
}
