//! Preemption in the real runtime, end to end: with `runtime/config/minimal.yaml` as shipped (only its
//! ports and data folder moved), every node runs a class-1 allocation, a class-9 allocation arrives and
//! runs within two scheduling cycles (the profile's 15 s); its victims show `preempted` (restarting) or `suspended`
//! (resuming from their checkpoint) with the reason in the API, and run again once it has ended.

mod common;

use common::{free_port, http};
use serde_json::{Value, json};
use std::time::Duration;

/// One allocation. The config as shipped rate-limits each user (600 requests a minute): a 429 is
/// waited out rather than read as the allocation.
async fn get(base: &str, id: &str) -> Value {
    loop {
        let (code, v) = http("GET", format!("{base}/v1/allocations/{id}"), None).await;
        if code != 429 {
            assert_eq!(code, 200, "{id}: {v}");
            return v;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn wait_for(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond().await {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_9_allocation_preempts_class_1_work_which_runs_again_afterwards() {
    let dir = std::env::temp_dir().join(format!("lattice-preempt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/minimal.yaml")).unwrap();
    let text = shipped
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:50051", &format!("127.0.0.1:{}", free_port()))
        .replace("../../lattice-data/node-1", &dir.join("data").display().to_string())
        .replace("../../profiles/", concat!(env!("CARGO_MANIFEST_DIR"), "/../profiles/"));
    let config = dir.join("minimal.yaml");
    std::fs::write(&config, text).unwrap();
    let rt = lattice_runtime::start(lattice_runtime::RuntimeConfig::read(&config).unwrap(), true)
        .await
        .unwrap();
    let base = format!("http://{}", rt.rest_addr);
    wait_for("a leader", Duration::from_secs(10), async || {
        rt.shared.member.is_leader()
    })
    .await;

    let submit = async |body: Value| -> String {
        let (code, v) = http("POST", format!("{base}/v1/allocations"), Some(body)).await;
        assert_eq!(code, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    };
    // Eight class-1 allocations fill the eight simulated nodes; half of them checkpoint.
    let mut low = Vec::new();
    for i in 0..8 {
        let mut body = json!({"tenant": "physics", "entrypoint": "sleep 600", "resources": {"nodes": 1},
                              "lifecycle": {"type": "bounded", "walltime": "1h"}, "preemption_class": 1});
        if i % 2 == 0 {
            body["checkpoint"] = json!({"strategy": "auto", "estimated_minutes": 1});
        }
        low.push(submit(body).await);
    }
    for id in &low {
        wait_for("the class-1 work to run", Duration::from_secs(60), async || {
            get(&base, id).await["state"] == "running"
        })
        .await;
    }
    let high = submit(
        json!({"tenant": "climate", "entrypoint": "sleep 2", "resources": {"nodes": 2},
                             "lifecycle": {"type": "bounded", "walltime": "30m"}, "preemption_class": 9}),
    )
    .await;
    wait_for("the class-9 allocation to run", Duration::from_secs(60), async || {
        get(&base, &high).await["started_ms"].is_number()
    })
    .await;
    // Within two scheduling cycles (the profile's 15 s) of its submission, by the engine's clock. (Passes
    // are not the measure: each victim's suspension is an input that may run a pass of its own.)
    let v = get(&base, &high).await;
    let waited = v["started_ms"].as_u64().unwrap() - v["submitted_ms"].as_u64().unwrap();
    assert!(waited <= 2 * 15_000, "it started {waited} ms after its submission: {v}");

    // Its victims: stopped through their (simulated) agents, waiting again with the reason.
    let mut victims = Vec::new();
    for id in &low {
        let v = get(&base, id).await;
        if v["preempted"].as_u64() == Some(1) {
            let reason = v["preemption"].as_str().unwrap_or_default().to_string();
            assert_eq!(reason, format!("priority for {high}"), "{v}");
            victims.push((id.clone(), v));
        }
    }
    assert_eq!(victims.len(), 2, "two nodes were needed: two victims");
    for (id, v) in &victims {
        let n: usize = id.trim_start_matches("a-").parse().unwrap();
        // Even-numbered submissions (a-000001, a-000003, ...) checkpoint: they resume, the others restart.
        let checkpoints = (n - 1).is_multiple_of(2);
        let state = v["state"].as_str().unwrap();
        assert!(
            state == if checkpoints { "suspended" } else { "preempted" } || state == "running",
            "{id}: {v}"
        );
    }
    // The metrics saw it: two preemptions for priority in the victims' vCluster, each victim back in
    // the queue once it stopped (a checkpointing one with its checkpoint's time).
    wait_for("the victims to be requeued", Duration::from_secs(30), async || {
        let (_, m) = http("GET", format!("{base}/metrics"), None).await;
        let m = m.as_str().unwrap_or_default().to_string();
        m.contains("lattice_preemptions_total{reason=\"priority\",vcluster=\"balanced\"} 2")
            && m.contains("lattice_scheduling_preemptions_total 2")
            && m.contains("lattice_preemption_victim_requeue_total 2")
    })
    .await;
    // Nothing else was touched.
    for id in &low {
        if victims.iter().all(|(v, _)| v != id) {
            assert_eq!(get(&base, id).await["state"], "running", "{id} is no victim");
        }
    }
    // The class-9 allocation ends (2 s); the victims run again.
    wait_for("the class-9 allocation to end", Duration::from_secs(60), async || {
        get(&base, &high).await["state"] == "completed"
    })
    .await;
    for (id, _) in &victims {
        wait_for("a victim to run again", Duration::from_secs(60), async || {
            get(&base, id).await["state"] == "running"
        })
        .await;
    }
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A preemption its agents never answer (the runtime's own deadline), on the control plane's
/// virtual clock: two real-agent nodes run class-1 work that does not checkpoint, a class-9
/// allocation arrives, one victim is ordered to stop (30 s SIGTERM grace). Nobody reports. Until
/// the grace plus `agents.preemption_report_grace` (60 s) it is `suspending` and the preemptor
/// waits; after it the victim is taken as stopped without a checkpoint (`preempted`, its node
/// released) and the preemptor starts there at the next pass.
#[test]
fn a_preemption_no_agent_answers_ends_at_the_deadline() {
    use lattice_control::world::Action;
    use lattice_control::{Control, SubmitRequest};
    let mut c = common::balanced_control(2);
    c.real_agents = true;
    // The controller waits for the agents' report 60 s past the order's own limit.
    c.ctl.preemption_report_grace = Some(lattice_engine::Duration(60_000));
    let mut t = 1_000_000u64;
    c.set_clock(lattice_engine::Time(t));
    for n in c.nodes().iter().map(|n| n.name.clone()).collect::<Vec<_>>() {
        c.register_agent(&n).unwrap();
    }
    let req = |class: u8| -> SubmitRequest {
        serde_json::from_value(json!({"tenant": "t", "user": "u", "entrypoint": "sleep 600",
            "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "1h"},
            "preemption_class": class}))
        .unwrap()
    };
    // One pass: proposals are committed at once (a quorum that agrees); what else it decided.
    let pass = |c: &mut Control, t: u64| -> Vec<Action> {
        c.set_clock(lattice_engine::Time(t));
        c.schedule();
        let mut out = Vec::new();
        let mut queue = c.take_actions();
        while !queue.is_empty() {
            for a in std::mem::take(&mut queue) {
                if let Action::Propose(p) = &a {
                    c.committed(p.alloc);
                }
                out.push(a);
            }
            queue = c.take_actions();
        }
        out
    };
    let low = [c.submit(req(1)).unwrap(), c.submit(req(1)).unwrap()];
    // Passes run at the vCluster's cycle ticks.
    for _ in 0..100 {
        pass(&mut c, t);
        if low.iter().all(|id| c.view_named(id).unwrap().state == "running") {
            break;
        }
        t += 1_000;
    }
    for id in &low {
        assert_eq!(c.view_named(id).unwrap().state, "running");
    }
    t += 1_000;
    c.set_clock(lattice_engine::Time(t));
    let high = c.submit(req(9)).unwrap();
    // Passes until the preemption order goes out (the next cycle tick).
    let mut victim = None;
    for _ in 0..100 {
        t += 1_000;
        for a in pass(&mut c, t) {
            if let Action::Preempt { name, .. } = a {
                victim = Some(name);
            }
        }
        if victim.is_some() {
            break;
        }
    }
    let victim = victim.expect("a victim is ordered to stop");
    let ordered = t;
    let state = |c: &Control, id: &str| c.view_named(id).unwrap().state;
    // Nobody reports: still stopping just before the limit, the preemptor still waiting.
    let before = pass(&mut c, ordered + 30_000 + 60_000 - 1);
    assert!(
        !before.iter().any(|a| matches!(a, Action::Release { .. })),
        "{before:?}"
    );
    assert_eq!(state(&c, &victim), "suspending");
    assert_eq!(state(&c, &high), "pending");
    // Past it: taken as stopped without a checkpoint; its node goes to the preemptor.
    t = ordered + 30_000 + 60_000;
    let released = pass(&mut c, t);
    assert!(
        released
            .iter()
            .any(|a| matches!(a, Action::Release { name, .. } if *name == victim)),
        "{released:?}"
    );
    let v = c.view_named(&victim).unwrap();
    assert_eq!((v.state.as_str(), v.preempted), ("preempted", 1), "{v:?}");
    assert_eq!(v.preemption.as_deref(), Some(format!("priority for {high}").as_str()));
    for _ in 0..100 {
        t += 1_000;
        pass(&mut c, t);
        if state(&c, &high) == "running" {
            break;
        }
    }
    assert_eq!(state(&c, &high), "running");
}
