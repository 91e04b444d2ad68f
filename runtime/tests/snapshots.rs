//! A damaged snapshot is survived (the book's quorum state: node ownership and the sensitive audit
//! log live in the Raft state machine, made durable by snapshots). Three real `lattice-runtime`
//! processes snapshot every 10 entries; a follower is SIGKILLed and its latest snapshot file
//! overwritten with garbage: it starts from the previous snapshot and the log. Killed again with
//! both snapshot files damaged, it takes a verified snapshot from a peer. Each time its own applied
//! state — every node owner and audit entry — is the leader's again, and its audit chain verifies.

mod common;
use common::{Proc, call, free_port, runtime_process_with, wait_until};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn leader_of(bases: &[String]) -> Option<String> {
    bases
        .iter()
        .find(|b| call("GET", &format!("{b}/healthz"), None).1["raft_state"] == "Leader")
        .cloned()
}

/// The member's own view of its applied state (`/v1/admin/raft/status` is served locally).
fn raft_status(base: &str) -> Value {
    call("GET", &format!("{base}/v1/admin/raft/status"), None).1
}

/// Overwrites the middle half of `file` with garbage.
fn damage(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = bytes.len();
    assert!(n > 0, "{} is empty", file.display());
    for b in &mut bytes[n / 4..3 * n / 4] {
        *b = 0x5a;
    }
    std::fs::write(file, bytes).unwrap();
}

/// The member's two snapshot files, the latest written first.
fn snapshot_files(data: &Path) -> Vec<PathBuf> {
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = ["snapshot-a.redb", "snapshot-b.redb"]
        .iter()
        .map(|n| data.join(n))
        .filter(|p| p.exists())
        .map(|p| (std::fs::metadata(&p).unwrap().modified().unwrap(), p))
        .collect();
    files.sort();
    files.reverse();
    files.into_iter().map(|(_, p)| p).collect()
}

#[test]
fn a_member_whose_snapshots_are_damaged_recovers_from_the_previous_one_or_a_peer() {
    let dir = std::env::temp_dir().join(format!("lattice-snapshots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let grpc: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let rest: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let bases: Vec<String> = rest.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let members: String = grpc
        .iter()
        .enumerate()
        .map(|(i, p)| format!("  {}: 127.0.0.1:{p}\n", i + 1))
        .collect();
    let data = |i: usize| dir.join(format!("m{}", i + 1));
    let configs: Vec<PathBuf> = (0..3)
        .map(|i| {
            let c = dir.join(format!("m{}.yaml", i + 1));
            std::fs::write(
                &c,
                format!(
                    "node_id: {id}\nrest_listen: 127.0.0.1:{r}\ngrpc_listen: 127.0.0.1:{g}\ndata_dir: {d}\n\
                     simulated_nodes: 4\ncycle: 100ms\nraft_snapshot_every: 10\n\
                     agents:\n  simulated_wipe: 100ms\nmembers:\n{members}",
                    id = i + 1,
                    r = rest[i],
                    g = grpc[i],
                    d = data(i).display()
                ),
            )
            .unwrap();
            c
        })
        .collect();
    let logs: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("m{}.log", i + 1))).collect();
    // Member 1 forms the quorum; the others join it.
    let start = |i: usize| -> Proc { runtime_process_with(&configs[i], &logs[i], i == 0) };
    let mut procs: Vec<Proc> = (0..3).map(start).collect();
    wait_until("a leader", Duration::from_secs(30), || leader_of(&bases).is_some());
    let leader = leader_of(&bases).unwrap();

    // Work that leaves node ownership and audit entries in the quorum's state: short jobs, and
    // sensitive claims (claim, release and wipe entries each).
    let mut ids = Vec::new();
    for i in 0..24 {
        let mut body = json!({"tenant": "physics", "user": "dr-x", "entrypoint": "sleep 0.1",
            "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "10m"}});
        if i % 6 == 0 {
            body["sensitive"] = json!(true);
        }
        let (status, v) = call("POST", &format!("{leader}/v1/allocations"), Some(body));
        assert_eq!(status, 201, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    // One stays running: its nodes stay owned.
    let (status, v) = call(
        "POST",
        &format!("{leader}/v1/allocations"),
        Some(
            json!({"tenant": "physics", "entrypoint": "sleep 600", "resources": {"nodes": 1},
                    "lifecycle": {"type": "bounded", "walltime": "20m"}}),
        ),
    );
    assert_eq!(status, 201, "{v}");
    let long = v["id"].as_str().unwrap().to_string();
    wait_until(
        "the work to end and the wipes to be audited",
        Duration::from_secs(60),
        || {
            let st = raft_status(&leader);
            st["audit_entries"].as_u64() >= Some(12)
                && ids
                    .iter()
                    .all(|id| call("GET", &format!("{leader}/v1/allocations/{id}"), None).1["state"] == "completed")
                && call("GET", &format!("{leader}/v1/allocations/{long}"), None).1["state"] == "running"
        },
    );
    let follower = (0..3).find(|&i| bases[i] != leader).unwrap();
    let same_as_leader = |what: &str| {
        wait_until(what, Duration::from_secs(30), || {
            let (mine, lead) = (raft_status(&bases[follower]), raft_status(&leader));
            mine["status"]["last_applied"].is_u64()
                && mine["status"]["last_applied"] == lead["status"]["last_applied"]
                && mine["state_sha256"] == lead["state_sha256"]
        });
        let mine = raft_status(&bases[follower]);
        assert_eq!(mine["audit_chain_valid"], true, "{mine}");
        assert!(mine["audit_entries"].as_u64() >= Some(12), "{mine}");
        assert!(mine["owners"].as_u64() >= Some(1), "the running job's node: {mine}");
    };
    same_as_leader("the follower to catch up");

    // Its latest snapshot damaged: it starts from the previous one and re-applies the log.
    procs[follower].0.kill().unwrap();
    procs[follower].0.wait().unwrap();
    let files = snapshot_files(&data(follower));
    assert_eq!(files.len(), 2, "two snapshots taken: {files:?}");
    damage(&files[0]);
    procs[follower] = start(follower);
    same_as_leader("the follower, from its previous snapshot, to hold the leader's state");
    let log = std::fs::read_to_string(&logs[follower]).unwrap();
    assert!(log.contains("started from an earlier snapshot"), "{log}");

    // Both damaged: its state comes from a peer's verified snapshot; the log after it re-applies.
    procs[follower].0.kill().unwrap();
    procs[follower].0.wait().unwrap();
    for f in snapshot_files(&data(follower)) {
        damage(&f);
    }
    procs[follower] = start(follower);
    same_as_leader("the follower, from a peer's snapshot, to hold the leader's state");
    let log = std::fs::read_to_string(&logs[follower]).unwrap();
    assert!(log.contains("from peer"), "{log}");

    // Every acknowledged allocation is still there, and the running one still owns its node.
    for id in ids.iter().chain([&long]) {
        let (status, v) = call("GET", &format!("{leader}/v1/allocations/{id}"), None);
        assert_eq!(status, 200, "{id}: {v}");
    }
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
