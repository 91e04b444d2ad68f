//! Fuzzing the runtime's outside input with seeded structure-aware mutations (the same mutator as
//! `rm-replay fuzz`): submission bodies through the REST request type and the control plane's
//! validation, then a scheduling pass; and the runtime config. Nothing may panic; a refused
//! submission names its field, a refused config names its file.

mod common;
use lattice_runtime::RuntimeConfig;
use lattice_runtime::control::{Control, SubmitRequest};
use lattice_traces::fuzz::mutate;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

const BODIES: [&str; 6] = [
    r#"{"tenant": "physics", "user": "alice", "entrypoint": "sleep 1", "resources": {"nodes": 2, "constraints": {"gpu_type": "GH200", "gpu_count": 4, "features": ["nvme"]}}, "lifecycle": {"type": "bounded", "walltime": "2h"}, "preemption_class": 4, "tags": {"name": "x"}}"#,
    r#"{"tenant": "bio", "resources": {"nodes": {"min": 1, "max": 4}}, "lifecycle": {"type": "reactive", "metric": "queue_depth", "target": 10, "scale_policy": {"min": 1, "max": 4, "evaluation_interval": "60s", "cooldown": "3m", "scale_down_threshold": 0.5}}}"#,
    r#"{"tenant": "bio", "entrypoint": "./sweep ${INDEX}", "resources": {"nodes": 1}, "lifecycle": {"walltime": "10m"}, "task_group": {"range": {"start": 0, "end": 20}, "concurrency": 3}}"#,
    r#"{"tenant": "chem", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1h"}, "checkpoint": {"strategy": "auto", "estimated_minutes": 2.5, "mechanism": "shmem"}, "data": {"mounts": [{"source": "/data/x", "size_gb": 12.5, "tier": "warm", "tier_hint": "hot"}]}, "connectivity": {"network_domain": "d1"}}"#,
    r#"{"tenant": "hospital", "user": "dr-x", "sensitive": true, "resources": {"nodes": 2}, "lifecycle": {"type": "unbounded"}, "duration": "30s"}"#,
    r#"{"tenant": "physics", "resources": {"nodes": 1}, "lifecycle": {"walltime": "00:30:00"}, "depends_on": [{"ref": "a-000001", "condition": "afterok"}]}"#,
];

/// Cases per target: `default` (CI's budget), or `FUZZ_CASES=N` for a longer run.
fn fuzz_cases(default: u64) -> u64 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn submission_bodies_never_panic_the_control_plane() {
    let mut c = common::balanced_control(8);
    let mut t = 1_000_000u64;
    let (mut parsed, mut accepted) = (0, 0);
    // 10,000 cases in CI; FUZZ_CASES=N for a longer run.
    let cases = fuzz_cases(10_000);
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(20261124 + case);
        let base = BODIES[(case % BODIES.len() as u64) as usize];
        let body = mutate(base, &mut rng);
        let Ok(req) = serde_json::from_str::<SubmitRequest>(&body) else {
            continue; // refused by the API's body parser (400 naming the serde error)
        };
        parsed += 1;
        t += 1_000;
        c.set_clock(lattice_engine::Time(t));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.submit_all(req, None)));
        match outcome {
            Ok(Ok(_)) => accepted += 1,
            Ok(Err(e)) => assert!(
                !e.field.is_empty(),
                "case {case}: a refusal without a field: {e:?}\n{body}"
            ),
            Err(_) => panic!("case {case} panicked the control plane:\n{body}"),
        }
        if case % 25 == 0 {
            // What was accepted schedules without a panic.
            let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                c.schedule();
                c.take_actions()
            }));
            assert!(pass.is_ok(), "case {case}: the pass after it panicked:\n{body}");
        }
    }
    // The mutations reach validation, and some of them get through it.
    eprintln!("fuzz submissions cases={cases} parsed={parsed} accepted={accepted}");
    assert!(parsed > 500 && accepted > 100, "parsed {parsed}, accepted {accepted}");
}

/// gRPC submissions: a valid `AllocationRequest`'s protobuf bytes with seeded byte mutations
/// (flipped, replaced with boundary bytes, deleted, duplicated, truncated) through prost's decoder,
/// the conversion to the REST request type and the control plane's validation. Nothing panics; what
/// decodes but is refused names its field.
#[test]
fn grpc_submissions_never_panic_the_control_plane() {
    use lattice_runtime::grpc::pb;
    use prost::Message;
    let valid = pb::AllocationRequest {
        tenant: "physics".into(),
        entrypoint: "./sweep ${INDEX}".into(),
        resources: Some(pb::Resources {
            nodes: 2,
            max_nodes: 4,
            ..Default::default()
        }),
        lifecycle: Some(pb::Lifecycle {
            r#type: "bounded".into(),
            walltime: "2h".into(),
            ..Default::default()
        }),
        preemption_class: Some(4),
        duration: "30s".into(),
        task_group: Some(pb::TaskGroup {
            start: 0,
            end: 5,
            concurrency: 2,
        }),
        idempotency_key: "k-1".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let mut c = common::balanced_control(8);
    // The unmutated message is accepted.
    let first = lattice_runtime::grpc::from_pb(pb::AllocationRequest::decode(valid.as_slice()).unwrap()).unwrap();
    c.submit_all(first, None).unwrap();
    let cases = fuzz_cases(10_000);
    let (mut decoded, mut accepted) = (0, 0);
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(7_000_000 + case);
        let mut b = valid.clone();
        for _ in 0..=lattice_traces::fuzz::below(&mut rng, 3) {
            if b.is_empty() {
                break;
            }
            let at = lattice_traces::fuzz::below(&mut rng, b.len());
            match lattice_traces::fuzz::below(&mut rng, 5) {
                0 => {
                    let bit = lattice_traces::fuzz::below(&mut rng, 8);
                    b[at] ^= 1 << bit;
                }
                1 => {
                    let v = [0x00, 0x7f, 0x80, 0xff][lattice_traces::fuzz::below(&mut rng, 4)];
                    b[at] = v;
                }
                2 => {
                    b.remove(at);
                }
                3 => {
                    let chunk: Vec<u8> = b[at..].iter().take(8).copied().collect();
                    b.splice(at..at, chunk);
                }
                _ => b.truncate(at),
            }
        }
        let Ok(msg) = pb::AllocationRequest::decode(b.as_slice()) else {
            continue; // refused by the gRPC layer (INVALID_ARGUMENT)
        };
        decoded += 1;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let req = lattice_runtime::grpc::from_pb(msg)?;
            c.submit_all(req, None).map_err(|e| {
                assert!(!e.field.is_empty(), "case {case}: a refusal without a field: {e:?}");
                tonic::Status::invalid_argument(e.message)
            })
        }));
        match outcome {
            Ok(Ok(_)) => accepted += 1,
            Ok(Err(_)) => {}
            Err(_) => panic!("case {case} panicked: {b:?}"),
        }
    }
    eprintln!("fuzz grpc submissions cases={cases} decoded={decoded} accepted={accepted}");
    assert!(
        decoded > 1000 && accepted > 100,
        "decoded {decoded}, accepted {accepted}"
    );
}

/// REST query strings: the audit, usage and list filters with seeded mutations, through axum's query
/// extractor (what a handler gets, or its 400) and the instants `since`/`until` the audit and log
/// queries parse. Nothing panics; a refused instant names its field.
#[test]
fn rest_query_strings_never_panic() {
    use axum::extract::Query;
    use lattice_runtime::ops::{AuditQuery, ListFilter, UsageQuery, parse_instant};
    const QUERIES: [&str; 3] = [
        "user=alice&allocation=a-000001&node=n1&since=2026-03-01&until=1767225600000",
        "tenant=physics&user=bob&days=30",
        "tenant=physics&state=running&vcluster=default&user=alice",
    ];
    let cases = fuzz_cases(10_000);
    let (mut parsed, mut instants) = (0, 0);
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(9_000_000 + case);
        let base = QUERIES[(case % QUERIES.len() as u64) as usize];
        let q = mutate(base, &mut rng).replace(['\n', ' '], "&");
        let Ok(uri) = format!("http://x/v1/audit?{q}").parse::<axum::http::Uri>() else {
            continue; // not a URI: the HTTP layer refuses it
        };
        let outcome = std::panic::catch_unwind(|| {
            let mut n = 0;
            if let Ok(Query(a)) = Query::<AuditQuery>::try_from_uri(&uri) {
                for (f, v) in [("since", &a.since), ("until", &a.until)] {
                    if let Some(v) = v {
                        n += 1;
                        if let Err(e) = parse_instant(f, v) {
                            assert_eq!(e.field(), Some(f), "case {case}: {e:?}");
                        }
                    }
                }
            }
            let u = Query::<UsageQuery>::try_from_uri(&uri).is_ok();
            let l = Query::<ListFilter>::try_from_uri(&uri).is_ok();
            (n, u || l)
        });
        match outcome {
            Ok((n, any)) => {
                instants += n;
                parsed += u64::from(any);
            }
            Err(_) => panic!("case {case} panicked: {q}"),
        }
    }
    // Boundary values reach the instant parser.
    for v in [
        "9223372036854775807-01-01",
        "-1-01-01",
        "2026-13-01",
        "99999-12-31",
        "18446744073709551615",
    ] {
        let _ = parse_instant("since", v);
    }
    eprintln!("fuzz rest-queries cases={cases} parsed={parsed} instants={instants}");
    assert!(parsed > 1000 && instants > 1000, "parsed {parsed}, instants {instants}");
}

#[test]
fn runtime_configs_never_panic() {
    let seeds = [
        include_str!("../config/minimal.yaml"),
        include_str!("../config/production.yaml"),
        include_str!("../config/dev-agents.yaml"),
    ];
    let mut refused = 0;
    let cases = fuzz_cases(3_000);
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(7 + case);
        let text = mutate(seeds[(case % 3) as usize], &mut rng);
        match std::panic::catch_unwind(|| RuntimeConfig::parse("fuzz.yaml", &text)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                refused += 1;
                assert!(e.to_string().starts_with("fuzz.yaml"), "case {case}: {e}");
            }
            Err(_) => panic!("case {case} panicked the config parser:\n{text}"),
        }
    }
    eprintln!("fuzz runtime-config cases={cases} refused={refused}");
    assert!(refused > 100, "{refused}");
}

/// Found by the submission fuzz (case 39,684 of seed 20261124): `sleep -1e308` as the entrypoint
/// panicked the control plane while it guessed the simulated run time. It is queued like any other.
#[test]
fn a_negative_sleep_is_just_an_entrypoint() {
    let inv = lattice_traces::homogeneous(2);
    let mut c = Control::new(&inv, Default::default(), &Default::default(), None).unwrap();
    for e in ["sleep -1e308", "sleep -1", "sleep NaN", "sleep 1e308"] {
        let req: SubmitRequest = serde_json::from_value(serde_json::json!({
            "tenant": "t", "entrypoint": e, "resources": {"nodes": 1}, "lifecycle": {"walltime": "1h"}
        }))
        .unwrap();
        let id = c.submit(req).unwrap();
        assert_eq!(c.view_named(&id).unwrap().state, "pending");
    }
}
