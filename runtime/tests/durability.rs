//! The control plane holds a start until its submission is on a majority of the members' disks,
//! also when the submission was recorded as unacknowledged before it was queued (a take-over
//! adopting keyed records does so), and proposes it once it is acknowledged.

mod common;
use lattice_control::SubmitRequest;
use lattice_control::world::Action;
use serde_json::json;

#[test]
fn an_adopted_unacknowledged_submission_starts_only_once_acknowledged() {
    let mut c = common::balanced_control(2);
    let mut t = 1_000_000u64;
    c.set_clock(lattice_engine::Time(t));
    let req: SubmitRequest = serde_json::from_value(json!({"tenant": "t", "user": "u", "entrypoint": "sleep 600",
        "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "1h"}, "idempotency_key": "k"}))
    .unwrap();
    // As a take-over adopts a keyed record: unacknowledged first, then queued under its id.
    c.unacked("a-000007", false);
    let name = c.submit_named(req, Some("a-000007")).unwrap();
    assert_eq!(name, "a-000007");
    let proposed = |c: &mut lattice_control::Control, t: u64| {
        c.set_clock(lattice_engine::Time(t));
        c.schedule();
        c.take_actions()
            .iter()
            .any(|a| matches!(a, Action::Propose(p) if p.name == name))
    };
    for _ in 0..5 {
        assert!(!proposed(&mut c, t), "not before it is acknowledged");
        t += 30_000;
    }
    let why = c.view_named("a-000007").unwrap().last_rejection;
    assert!(why.as_deref().is_some_and(|w| w.contains("majority")), "{why:?}");
    c.acked("a-000007");
    assert!(proposed(&mut c, t), "proposed once acknowledged");
}
