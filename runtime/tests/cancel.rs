//! A cancel that arrives while the allocation's start is at the quorum is not lost: it is carried
//! out once the quorum answers (committed: stopped and its nodes released; rejected: ended there).

mod common;
use lattice_control::world::Action;
use lattice_control::{Control, SubmitRequest};
use serde_json::json;

fn proposed(c: &mut Control, t: &mut u64) -> (String, lattice_engine::AllocId) {
    let req: SubmitRequest = serde_json::from_value(json!({"tenant": "t", "user": "u", "entrypoint": "sleep 600",
        "resources": {"nodes": 1}, "lifecycle": {"type": "bounded", "walltime": "1h"}}))
    .unwrap();
    let name = c.submit(req).unwrap();
    for _ in 0..100 {
        c.set_clock(lattice_engine::Time(*t));
        c.schedule();
        for a in c.take_actions() {
            if let Action::Propose(p) = a {
                return (name, p.alloc);
            }
        }
        *t += 1_000;
    }
    panic!("no proposal");
}

#[test]
fn a_cancel_during_a_proposal_is_carried_out_when_the_quorum_answers() {
    let mut c = common::balanced_control(2);
    let mut t = 1_000_000u64;
    c.set_clock(lattice_engine::Time(t));

    // Committed after the cancel: it is stopped and its node released at once.
    let (name, id) = proposed(&mut c, &mut t);
    assert_eq!(c.cancel(&name), Some(false));
    assert_eq!(
        c.view_named(&name).unwrap().state,
        "pending",
        "its start is still at the quorum"
    );
    c.committed(id);
    assert_eq!(c.view_named(&name).unwrap().state, "cancelled");
    let actions = c.take_actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Release { name: n, .. } if *n == name)),
        "{actions:?}"
    );

    // Rejected after the cancel: it ends there, and is not proposed again.
    let (name, id) = proposed(&mut c, &mut t);
    assert_eq!(c.cancel(&name), Some(false));
    c.rejected(id, "conflict".into());
    assert_eq!(c.view_named(&name).unwrap().state, "cancelled");
    t += 10_000;
    c.set_clock(lattice_engine::Time(t));
    c.schedule();
    assert!(!c.take_actions().iter().any(|a| matches!(a, Action::Propose(_))));
}
