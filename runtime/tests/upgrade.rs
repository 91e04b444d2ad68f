//! The rolling upgrade (docs/operators.md "Upgrades"): a 3-member quorum and two real agents, a
//! 2-node allocation running. Each member is stopped and started again in turn (followers first,
//! the leader last — a fail-over), waiting for it to catch up before the next; then each agent is
//! restarted. The allocation runs throughout, keeps its start, and each node started it once. Then
//! the leader is killed (SIGKILL) after weights and a configuration change were sent through a
//! follower (and a site setting): the new leader schedules with them (and its capture records them), the allocation keeps
//! its VNI, and `lattice` with the dead member first and a follower second submits, lists and
//! follows logs.

mod common;
use common::{Proc, agent_process, call, free_port, runtime_process_with, wait_until};
use serde_json::{Value, json};
use std::time::Duration;

/// The REST base of the leader once it serves (it says it leads and has taken the queue over; a
/// follower serves reads too, forwarding them), if any.
fn leader(bases: &[String]) -> Option<String> {
    bases
        .iter()
        .find(|b| {
            call("GET", &format!("{b}/healthz"), None).1["raft_state"] == "Leader"
                && call("GET", &format!("{b}/v1/allocations"), None).0 == 200
        })
        .cloned()
}

fn raft(base: &str) -> Value {
    call("GET", &format!("{base}/api/v1/raft/status"), None).1
}

fn get(bases: &[String], id: &str) -> Value {
    let t0 = std::time::Instant::now();
    loop {
        let mut last = Vec::new();
        for b in bases {
            let (code, v) = call("GET", &format!("{b}/v1/allocations/{id}"), None);
            if code == 200 {
                return v;
            }
            last.push((code, v));
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no member answers for {id}: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(p: Proc) {
    // A planned restart: SIGTERM, as `systemctl restart` sends.
    let mut p = p;
    assert_eq!(unsafe { libc::kill(p.0.id() as i32, libc::SIGTERM) }, 0);
    let _ = p.0.wait();
}

#[test]
fn members_then_agents_are_replaced_one_at_a_time_while_an_allocation_runs() {
    let dir = std::env::temp_dir().join(format!("lattice-upgrade-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nodes.yaml"), "nodes:\n  - name: node-a\n  - name: node-b\n").unwrap();
    let grpc: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let rest: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let bases: Vec<String> = rest.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let members: String = grpc
        .iter()
        .enumerate()
        .map(|(i, p)| format!("  {}: 127.0.0.1:{p}\n", i + 1))
        .collect();
    let configs: Vec<std::path::PathBuf> = (0..3)
        .map(|i| {
            let c = dir.join(format!("member-{}.yaml", i + 1));
            std::fs::write(
                &c,
                format!(
                    "node_id: {id}\nrest_listen: 127.0.0.1:{r}\ngrpc_listen: 127.0.0.1:{g}\ndata_dir: data-{id}\ninventory: nodes.yaml\ncycle: 100ms\nscheduler:\n  trace_capture: capture-{id}.jsonl\nmembers:\n{members}",
                    id = i + 1,
                    r = rest[i],
                    g = grpc[i]
                ),
            )
            .unwrap();
            c
        })
        .collect();
    let log = |i: usize| dir.join(format!("member-{}.log", i + 1));
    let mut procs: Vec<Option<Proc>> = (0..3)
        .map(|i| Some(runtime_process_with(&configs[i], &log(i), i == 0)))
        .collect();
    wait_until("a leader", Duration::from_secs(30), || leader(&bases).is_some());
    let endpoints = bases.join(",");
    let mut agents: Vec<Option<Proc>> = ["node-a", "node-b"]
        .iter()
        .map(|n| Some(agent_process(&endpoints, n, &dir, &[])))
        .collect();
    wait_until("both agents registered", Duration::from_secs(30), || {
        leader(&bases).is_some_and(|b| {
            let v = call("GET", &format!("{b}/v1/nodes"), None).1;
            v["nodes"]
                .as_array()
                .is_some_and(|n| n.iter().all(|n| n["state"] == "ready"))
        })
    });
    let starts = dir.join("starts");
    let lead = leader(&bases).unwrap();
    let (code, v) = call(
        "POST",
        &format!("{lead}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "resources": {"nodes": 2}, "lifecycle": {"walltime": "10m"},
                    "entrypoint": format!("echo \"$LATTICE_TASK_INDEX\" >> {}; sleep 60", starts.display())}),
        ),
    );
    assert_eq!(code, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    wait_until("it runs on both nodes", Duration::from_secs(20), || {
        std::fs::read_to_string(&starts).is_ok_and(|s| s.lines().count() == 2)
    });
    let before = get(&bases, &id);
    assert_eq!(before["state"], "running", "{before}");
    let started = before["started_ms"].as_u64().unwrap();
    let still_running = |when: &str| {
        let v = get(&bases, &id);
        assert_eq!(v["state"], "running", "{when}: {v}");
        let s = v["started_ms"].as_u64().unwrap();
        assert!(s.abs_diff(started) < 500, "{when}: started at {started}, now {s}");
        assert_eq!(v["nodes"], before["nodes"], "{when}");
    };

    // The members, followers first and the leader last.
    let lead_i = bases.iter().position(|b| *b == lead).unwrap();
    let order: Vec<usize> = (0..3).filter(|i| *i != lead_i).chain([lead_i]).collect();
    for i in order {
        stop(procs[i].take().unwrap());
        procs[i] = Some(runtime_process_with(&configs[i], &log(i), false));
        // Caught up: it applied what the leader has (a new one, after the leader's restart).
        wait_until(
            &format!("member {} back and caught up", i + 1),
            Duration::from_secs(30),
            || {
                let Some(l) = leader(&bases) else { return false };
                let want = raft(&l)["status"]["last_log_index"].as_u64().unwrap_or(u64::MAX);
                raft(&bases[i])["status"]["last_applied"]
                    .as_u64()
                    .is_some_and(|a| a >= want)
            },
        );
        still_running(&format!("after member {}", i + 1));
    }

    // The agents, one at a time: each takes its running process over from its state file.
    for (k, node) in ["node-a", "node-b"].iter().enumerate() {
        stop(agents[k].take().unwrap());
        agents[k] = Some(agent_process(&endpoints, node, &dir, &[]));
        std::thread::sleep(Duration::from_secs(1));
        still_running(&format!("after the agent of {node}"));
    }

    // A leader change changes nothing (SIGKILL, no goodbye): weights set through a follower (`lattice`
    // moves on to the leader it names), a configuration change, and the running allocation's VNI.
    let lattice = |endpoints: &str, args: &[&str]| {
        std::process::Command::new(lattice_testkit::process::bin("lattice"))
            .args(args)
            .env("LATTICE_ENDPOINT", endpoints)
            .env("LATTICE_TENANT", "physics")
            .env("HOME", &dir)
            .output()
            .expect("lattice runs")
    };
    let said = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let lead = leader(&bases).unwrap();
    let lead_i = bases.iter().position(|b| *b == lead).unwrap();
    let follower = bases[(lead_i + 1) % 3].clone();
    let through_follower = format!("{follower},{lead}");
    let weights = [
        "admin",
        "vcluster",
        "set-weights",
        "default",
        "--weights",
        "priority=0.7,wait_time=0.3",
    ];
    let o = lattice(&through_follower, &weights);
    assert!(o.status.success(), "{}", said(&o));
    let change = ["admin", "vcluster", "set-config", "default", "--reference-wait=2h"];
    let o = lattice(&through_follower, &change);
    assert!(o.status.success(), "{}", said(&o));
    let o = lattice(
        &through_follower,
        &["admin", "config", "set", "agents.boot_timeout=25m"],
    );
    assert!(o.status.success(), "{}", said(&o));
    let shown = call("GET", &format!("{lead}/v1/vclusters/default"), None).1;
    assert_eq!(
        (shown["weights"]["priority"].as_f64(), shown["reference_wait"].as_f64()),
        (Some(0.7), Some(7200.0))
    );
    let vni = get(&bases, &id)["vni"].clone();
    assert!(vni.is_u64(), "a 2-node allocation has a network domain of its own");
    let mut killed = procs[lead_i].take().unwrap();
    assert_eq!(unsafe { libc::kill(killed.0.id() as i32, libc::SIGKILL) }, 0);
    let _ = killed.0.wait();
    let live: Vec<String> = (0..3).filter(|i| *i != lead_i).map(|i| bases[i].clone()).collect();
    wait_until("a new leader serves", Duration::from_secs(30), || {
        leader(&live).is_some_and(|l| call("GET", &format!("{l}/v1/vclusters/default"), None).0 == 200)
    });
    let new_lead = leader(&live).unwrap();
    let now_shown = call("GET", &format!("{new_lead}/v1/vclusters/default"), None).1;
    assert_eq!(now_shown, shown, "the new leader schedules with what was acknowledged");
    still_running("after the leader's SIGKILL");
    assert_eq!(get(&live, &id)["vni"], vni, "its VNI outlived the leader");
    // The new leader's capture records the configuration it took over.
    let new_i = bases.iter().position(|b| *b == new_lead).unwrap();
    let capture = std::fs::read_to_string(dir.join(format!("capture-{}.jsonl", new_i + 1))).unwrap_or_default();
    let taken_over = capture
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|e| {
            e["type"] == "vcluster"
                && e["config"]["reference_wait"] == 7200.0
                && e["config"]["weights"]["priority"] == 0.7
        });
    assert!(taken_over, "{capture}");
    // And the site settings: in force at the new leader, recorded by its capture.
    let settings = call("GET", &format!("{new_lead}/v1/config"), None).1;
    assert_eq!(settings["agents.boot_timeout"], 1500.0, "{settings}");
    let recorded = capture
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|e| e["type"] == "settings" && e["settings"]["agents.boot_timeout"] == 1500.0);
    assert!(recorded, "{capture}");
    // `lattice` with the dead member first and a follower second: submits, lists, follows logs.
    let new_follower = live.iter().find(|b| **b != new_lead).unwrap();
    let dead_first = format!("{lead},{new_follower}");
    let o = lattice(
        &dead_first,
        &[
            "submit",
            "--nodes=1",
            "--walltime=5m",
            "--",
            "echo",
            "after-the-fail-over",
        ],
    );
    assert!(o.status.success(), "{}", said(&o));
    let echo = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let o = lattice(&dead_first, &["status", "-o", "json"]);
    assert!(o.status.success() && said(&o).contains(&echo), "{}", said(&o));
    let o = lattice(&dead_first, &["logs", "--follow", &echo]);
    let plain = lattice(&dead_first, &["logs", &echo]);
    let st = lattice(&dead_first, &["status", &echo, "-o", "json"]);
    assert!(
        o.status.success() && said(&o).contains("after-the-fail-over"),
        "{:?} [{}] plain [{}] status [{}]",
        o.status,
        said(&o),
        said(&plain),
        said(&st)
    );

    // It ends once, having started once on each node.
    wait_until("the allocation to end", Duration::from_secs(60), || {
        get(&bases, &id)["ended_ms"].is_u64()
    });
    let end = get(&bases, &id);
    assert_eq!(end["state"], "completed", "{end}");
    let mut lines: Vec<String> = std::fs::read_to_string(&starts)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(lines, ["0", "1"], "each node started it once");
    drop(agents);
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member's data folder as the previous version left it (`fixtures/previous-format`, written by
/// that version's binary and killed with SIGKILL; `make.sh` says how): this version starts on it and
/// keeps everything — every allocation under its id and state (the running one re-attached with its
/// start), the tenant created through the API, the audit chain — and hands out the next id.
#[test]
fn this_version_starts_on_the_previous_versions_data_folder() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/previous-format");
    let dir = std::env::temp_dir().join(format!("lattice-previous-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let untar = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(fixtures.join("data.tar.gz"))
        .arg("-C")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(untar.success());
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    std::fs::write(
        dir.join("runtime.yaml"),
        format!(
            "node_id: 1\nrest_listen: 127.0.0.1:{port}\ngrpc_listen: 127.0.0.1:{}\ndata_dir: data\nsimulated_nodes: 4\ncycle: 100ms\n",
            free_port()
        ),
    )
    .unwrap();
    let _rt = runtime_process_with(&dir.join("runtime.yaml"), &dir.join("runtime.log"), true);
    wait_until("the runtime to serve", Duration::from_secs(30), || {
        call("GET", &format!("{base}/v1/allocations"), None).0 == 200
    });
    let before: Value = serde_json::from_slice(&std::fs::read(fixtures.join("allocations.json")).unwrap()).unwrap();
    let (_, now) = call("GET", &format!("{base}/v1/allocations"), None);
    let by_id = |v: &Value| -> std::collections::BTreeMap<String, Value> {
        v["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["id"].as_str().unwrap().to_string(), a.clone()))
            .collect()
    };
    let (before, now) = (by_id(&before), by_id(&now));
    assert_eq!(before.keys().collect::<Vec<_>>(), now.keys().collect::<Vec<_>>());
    for (id, b) in &before {
        let n = &now[id];
        // What has ended stays as it ended. The live ones go on in wall time: the re-attached run
        // from its original start (once the hour it sleeps is over — the fixture is older — it has
        // ended, not run again), and the waiting one may start once it has.
        let live = b["ended_ms"].is_null();
        for k in [
            "tenant",
            "user",
            "state",
            "submitted_ms",
            "ended_ms",
            "end_reason",
            "nodes",
        ] {
            if live && matches!(k, "state" | "ended_ms" | "end_reason" | "nodes") {
                continue;
            }
            assert_eq!(b[k], n[k], "{id}.{k}");
        }
        if id == "a-000004" {
            // Not run before the upgrade: a start now is its first.
            assert!(b["started_ms"].is_null());
            continue;
        }
        // A re-attached run's start is the quorum's record of it: within the commit's latency.
        let (x, y) = (b["started_ms"].as_u64(), n["started_ms"].as_u64());
        assert!(
            x.zip(y).is_some_and(|(x, y)| x.abs_diff(y) < 500) || x == y,
            "{id}: {x:?} {y:?}"
        );
    }
    let s3 = now["a-000003"]["state"].as_str().unwrap();
    assert!(
        matches!(s3, "running" | "completed"),
        "re-attached, not run again: {s3}"
    );
    let (_, chem) = call("GET", &format!("{base}/v1/tenants/chem"), None);
    assert_eq!(chem["quota"]["max_nodes"], 3, "{chem}");
    let raft_before: Value = serde_json::from_slice(&std::fs::read(fixtures.join("raft.json")).unwrap()).unwrap();
    let raft_now = raft(&base);
    assert_eq!(raft_now["audit_entries"], raft_before["audit_entries"], "{raft_now}");
    assert_eq!(raft_now["audit_chain_valid"], true);
    let (code, v) = call(
        "POST",
        &format!("{base}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "entrypoint": "sleep 0", "resources": {"nodes": 1}, "lifecycle": {"walltime": "10m"}}),
        ),
    );
    assert_eq!((code, v["id"].as_str()), (201, Some("a-000005")), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}
