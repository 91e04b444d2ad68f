//! Fuzzing the runtime's outside input with seeded structure-aware mutations (the same mutator as
//! `rm-replay fuzz`): submission bodies through the REST request type and the control plane's
//! validation, then a scheduling pass; and the runtime config. Nothing may panic; a refused
//! submission names its field, a refused config names its file.

mod common;
use lattice_control::{Control, SubmitRequest};
use lattice_runtime::RuntimeConfig;
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

/// The first case of a run: `FUZZ_FROM=K` starts at case K (default 0), so a long run of a target
/// whose member state grows with every case (the REST listing) is split into slices, each on a fresh
/// member, that together cover the same cases.
fn fuzz_from() -> u64 {
    std::env::var("FUZZ_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A single-member quorum on `nodes` simulated nodes for a fuzz target, its store under a fresh
/// temporary folder (returned, to remove afterwards) and no rate limit (the fuzz sends thousands of
/// requests a second).
async fn fuzzed_leader(name: &str, nodes: u32) -> (lattice_runtime::Running, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("lattice-fuzz-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = common::start_leader(&format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: {nodes}\ncycle: 50ms\nauth:\n  rate_limit_per_minute: 4000000000\n",
        dir.display()
    ))
    .await;
    (rt, dir)
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
        let b = lattice_traces::fuzz::mutate_bytes(&valid, &mut rng);
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

/// One REST route the fuzz drives: method, path (`{A}` an allocation id, `{N}` a node name) and a
/// valid body to mutate (`None`: no body; the query string is mutated instead when the path has one).
struct Route {
    method: &'static str,
    path: &'static str,
    body: Option<&'static str>,
}

const ROUTES: [Route; 16] = [
    Route {
        method: "POST",
        path: "/v1/allocations",
        body: Some(BODIES[3]),
    },
    Route {
        method: "POST",
        path: "/v1/allocations",
        body: Some(BODIES[2]),
    },
    Route {
        method: "PATCH",
        path: "/v1/allocations/{A}",
        body: Some(
            r#"{"walltime": "5s", "tags": {"team": "b", "old": ""}, "telemetry": {"mode": "debug", "duration": "10m"}}"#,
        ),
    },
    Route {
        method: "POST",
        path: "/v1/allocations/{A}/checkpoint",
        body: None,
    },
    Route {
        method: "DELETE",
        path: "/v1/allocations/{A}",
        body: None,
    },
    Route {
        method: "POST",
        path: "/v1/dags",
        body: Some(
            r#"{"id": "d1", "allocations": [{"name": "prep", "tenant": "bio", "entrypoint": "sleep 0.1", "resources": {"nodes": 1}, "lifecycle": {"walltime": "10m"}}, {"name": "train", "tenant": "bio", "resources": {"nodes": 2}, "lifecycle": {"walltime": "1h"}, "depends_on": [{"ref": "prep", "condition": "afterok"}]}, {"name": "eval", "tenant": "bio", "resources": {"nodes": 1}, "lifecycle": {"walltime": "5m"}, "depends_on": [{"ref": "train", "condition": "success"}]}]}"#,
        ),
    },
    Route {
        method: "POST",
        path: "/v1/nodes/{N}/register",
        body: Some(
            r#"{"fingerprint": "sha256:ab12", "capabilities": {"cpu_cores": 72, "memory_gib": 480.5, "gpu_count": 4, "gpu_model": "GH200", "features": ["nvme_scratch"]}}"#,
        ),
    },
    Route {
        method: "POST",
        path: "/v1/nodes/{N}/heartbeat",
        body: Some(r#"{"seq": 900000, "buffered": [{"seq": 899998, "at_ms": 1000}, {"seq": 899999, "at_ms": 2000}]}"#),
    },
    Route {
        method: "POST",
        path: "/v1/nodes/{N}/work",
        body: Some(
            r#"{"running": ["a-000001"], "output": [{"id": "a-000001", "offset": 0, "next": 5, "data": "hello"}], "checkpointed": [{"id": "a-000001", "ok": true}], "wiped": [{"id": "a-000002", "ok": false}], "metrics": [{"id": "a-000001", "name": "queue_depth", "value": 3.5}]}"#,
        ),
    },
    Route {
        method: "POST",
        path: "/v1/allocations/{A}/exit",
        body: Some(r#"{"node": "sim-001", "kind": "exited", "exit_code": 0, "log_tail": "done\n"}"#),
    },
    Route {
        method: "PUT",
        path: "/v1/vclusters/default/weights",
        body: Some(r#"{"priority": 0.5, "wait_time": 0.3, "fair_share": 0.2}"#),
    },
    Route {
        method: "POST",
        path: "/api/v1/admin/restore",
        body: Some(r#"{"path": "/nonexistent/lattice-backup.tar"}"#),
    },
    Route {
        method: "GET",
        path: "/v1/allocations?tenant=bio&state=running&vcluster=default&user=alice",
        body: None,
    },
    Route {
        method: "GET",
        path: "/v1/audit/logs?user=alice&allocation=a-000001&since=2026-03-01&until=1767225600000",
        body: None,
    },
    Route {
        method: "GET",
        path: "/api/v1/usage?tenant=physics&days=30",
        body: None,
    },
    Route {
        method: "GET",
        path: "/v1/allocations/{A}/logs?node=sim-001&offset=0",
        body: None,
    },
];

/// Every REST route that takes a body (or a query string) through the real router of a running
/// single-member quorum: seeded mutations of a valid body, of the query string and of the ids in the
/// path. Nothing panics or hangs, nothing answers 500, every 400 is JSON naming its field, and
/// afterwards the member still serves: a valid submission is acknowledged and runs, and no node is
/// held by two allocations. (Membership changes are left out: a mutated body that adds a voter would
/// take the single member's majority away; their validation has its own tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_bodies_never_panic_or_break_the_member() {
    use tower::ServiceExt;
    let (rt, dir) = fuzzed_leader("rest", 8).await;
    let app = lattice_runtime::api::router(rt.shared.clone());
    let call = |method: &str, uri: &str, body: Vec<u8>| {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body));
        let app = app.clone();
        async move {
            let req = req.ok()?;
            // A hang is a finding: every request answers within 20 s (a proposal's bound is 10 s).
            let resp = tokio::time::timeout(std::time::Duration::from_secs(20), tokio::spawn(app.oneshot(req)))
                .await
                .expect("a request hung")
                .expect("a handler panicked")
                .unwrap();
            let status = resp.status().as_u16();
            // Unbounded: after a long run the listing holds every accepted task group's elements.
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
            Some((status, bytes))
        }
    };
    // Some ids the mutated requests can name.
    let mut ids = Vec::new();
    for b in [BODIES[3], BODIES[4]] {
        let (status, v) = call("POST", "/v1/allocations", b.as_bytes().to_vec()).await.unwrap();
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&v));
        let v: serde_json::Value = serde_json::from_slice(&v).unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let cases = fuzz_cases(3_000);
    let from = fuzz_from();
    let mut by_status: std::collections::BTreeMap<u16, u64> = Default::default();
    for case in from..from + cases {
        let mut rng = ChaCha8Rng::seed_from_u64(11_000_000 + case);
        let route = &ROUTES[(case % ROUTES.len() as u64) as usize];
        let alloc = match lattice_traces::fuzz::below(&mut rng, 4) {
            0 => mutate(&ids[0], &mut rng),
            _ => ids[lattice_traces::fuzz::below(&mut rng, ids.len())].clone(),
        };
        let node = match lattice_traces::fuzz::below(&mut rng, 4) {
            0 => mutate("sim-001", &mut rng),
            _ => format!("sim-00{}", 1 + lattice_traces::fuzz::below(&mut rng, 8)),
        };
        let escape = lattice_util::url::component;

        let mut uri = route
            .path
            .replace("{A}", &escape(&alloc))
            .replace("{N}", &escape(&node));
        let body = match route.body {
            Some(b) => mutate(b, &mut rng).into_bytes(),
            None => {
                if let Some((path, query)) = uri.split_once('?') {
                    uri = format!("{path}?{}", mutate(query, &mut rng).replace(['\n', ' ', '#'], "&"));
                }
                Vec::new()
            }
        };
        if uri.parse::<axum::http::Uri>().is_err() {
            continue; // not a URI: the HTTP layer refuses it before the router
        }
        let Some((status, answer)) = call(route.method, &uri, body.clone()).await else {
            continue;
        };
        *by_status.entry(status).or_default() += 1;
        let shown = || {
            format!(
                "case {case}: {} {uri}\n{}\n=> {status} {}",
                route.method,
                String::from_utf8_lossy(&body),
                String::from_utf8_lossy(&answer)
            )
        };
        assert!(status < 500 || status == 503, "{}", shown());
        if status == 400 {
            let v: serde_json::Value =
                serde_json::from_slice(&answer).unwrap_or_else(|_| panic!("a 400 that is not JSON: {}", shown()));
            assert!(
                v["field"].as_str().is_some_and(|f| !f.is_empty()),
                "a 400 without a field: {}",
                shown()
            );
        }
    }
    eprintln!("fuzz rest cases={cases} from={from} answers={by_status:?}");
    let ok = by_status.range(200..300).map(|(_, n)| n).sum::<u64>();
    let refused = by_status.get(&400).copied().unwrap_or(0);
    assert!(ok > cases / 10 && refused > cases / 10, "{by_status:?}");

    // The member still serves: a valid submission is acknowledged and runs to its end.
    let (status, v) = call(
        "POST",
        "/v1/allocations",
        br#"{"tenant": "after", "entrypoint": "sleep 0.1", "resources": {"nodes": 1}, "lifecycle": {"walltime": "1m"}}"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&v));
    // No node is held by two allocations.
    let (_, list) = call("GET", "/v1/allocations", Vec::new()).await.unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list).unwrap();
    let mut held = std::collections::BTreeMap::new();
    for a in list["allocations"].as_array().unwrap() {
        if a["state"] == "running" {
            for n in a["nodes"].as_array().into_iter().flatten() {
                if let Some(other) = held.insert(n.to_string(), a["id"].to_string()) {
                    panic!("node {n} held by {other} and {}", a["id"]);
                }
            }
        }
    }
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One fuzzed call's answer: counted by code; never INTERNAL or UNKNOWN; an INVALID_ARGUMENT names
/// its field (`field: why`).
fn judge(case: u64, by_code: &mut std::collections::BTreeMap<String, u64>, r: Option<(Option<tonic::Status>, String)>) {
    let Some((status, shown)) = r else {
        *by_code.entry("undecodable".into()).or_default() += 1;
        return;
    };
    let code = status.as_ref().map_or(tonic::Code::Ok, |s| s.code());
    *by_code.entry(format!("{code:?}")).or_default() += 1;
    let s = status.map(|s| s.message().to_string()).unwrap_or_default();
    assert!(
        !matches!(code, tonic::Code::Internal | tonic::Code::Unknown),
        "case {case}: {code:?} {s}\n{shown}"
    );
    if code == tonic::Code::InvalidArgument {
        let field = s.split_once(": ").map_or("", |(f, _)| f);
        assert!(
            !field.is_empty() && !field.contains(' '),
            "case {case}: a refusal without its field: {s}\n{shown}"
        );
    }
}

/// A fuzz run reached both sides: enough accepted calls and enough refused ones.
fn enough(by_code: &std::collections::BTreeMap<String, u64>, cases: u64) {
    assert!(
        by_code.get("Ok").copied().unwrap_or(0) > cases / 50
            && by_code.get("InvalidArgument").copied().unwrap_or(0) > cases / 50,
        "{by_code:?}"
    );
}

/// Nothing was written beside the member's data directory.
fn nothing_beside(dir: &std::path::Path) {
    let beside: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, vec![std::ffi::OsString::from("q")]);
}

/// Every gRPC request message the member serves (the public API's three services and the queue
/// mirror's peer calls): a valid message's protobuf bytes with seeded byte mutations through prost's
/// decoder and the service's handler on a running single-member quorum. Nothing panics or hangs,
/// nothing answers INTERNAL or UNKNOWN, every INVALID_ARGUMENT names its field (`field: why`), and no
/// file is written outside the member's data directory (backup names come from the client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_messages_never_panic_or_break_the_member() {
    use lattice_runtime::grpc::{Api, pb};
    use pb::admin_service_server::AdminService;
    use pb::allocation_service_server::AllocationService;
    use pb::node_service_server::NodeService;
    use prost::Message;
    let (rt, dir) = fuzzed_leader("grpc", 8).await;
    let api = Api {
        shared: rt.shared.clone(),
    };
    let request = pb::AllocationRequest {
        tenant: "bio".into(),
        user: "alice".into(),
        entrypoint: "sleep 0.2".into(),
        resources: Some(pb::Resources {
            nodes: 1,
            max_nodes: 2,
            features: vec!["nvme".into()],
            ..Default::default()
        }),
        lifecycle: Some(pb::Lifecycle {
            r#type: "bounded".into(),
            walltime: "10m".into(),
            ..Default::default()
        }),
        tags: [("team".to_string(), "b".to_string())].into(),
        depends_on: vec![pb::Dependency {
            r#ref: "a-000001".into(),
            condition: "afterok".into(),
        }],
        idempotency_key: "k-1".into(),
        ..Default::default()
    };
    let mut plain = request.clone();
    plain.depends_on.clear();
    plain.idempotency_key.clear();
    if let Some(r) = plain.resources.as_mut() {
        r.features.clear();
    }
    let first = api
        .submit(tonic::Request::new(plain.clone()))
        .await
        .unwrap()
        .into_inner()
        .id;
    let id = || first.clone();
    let node = || pb::NodeRequest {
        id: "sim-003".into(),
        urgent: false,
    };
    let dag = pb::SubmitDagRequest {
        id: "d1".into(),
        allocations: vec![
            pb::DagMember {
                name: "prep".into(),
                request: Some(plain.clone()),
            },
            pb::DagMember {
                name: "train".into(),
                request: Some(pb::AllocationRequest {
                    depends_on: vec![pb::Dependency {
                        r#ref: "prep".into(),
                        condition: "afterok".into(),
                    }],
                    ..plain.clone()
                }),
            },
        ],
    };
    let mirror_submit = format!(
        r#"{{"Submit": {{"items": [["a-000900", {}]], "submitted_ms": 1000, "dag": null}}}}"#,
        BODIES[3]
    );
    let mirror_update = r#"{"Update": {"id": "a-000001", "walltime": "2h", "tags": {"x": "y"}}}"#;
    let mirror = lattice_runtime::mirror::net::MirrorService {
        shared: rt.shared.clone(),
    };
    use lattice_runtime::grpc::pb as mpb;
    use mpb::queue_mirror_server::QueueMirror;

    // Decodes the mutated bytes as `$ty` and runs `$call` on the message in its own task: (the
    // status when refused, or None when the bytes did not decode).
    macro_rules! fuzz {
        ($rng:expr, $ty:ty, $valid:expr, |$api:ident, $m:ident| $call:expr) => {{
            let bytes = lattice_traces::fuzz::mutate_bytes(&$valid.encode_to_vec(), $rng);
            match <$ty>::decode(bytes.as_slice()) {
                Err(_) => None,
                Ok($m) => {
                    let $api = api.clone();
                    let shown = format!("{:?}", $m);
                    let task = tokio::spawn(async move { $call.await.map(|_| ()) });
                    let r = tokio::time::timeout(std::time::Duration::from_secs(20), task)
                        .await
                        .unwrap_or_else(|_| panic!("a call hung: {shown}"))
                        .unwrap_or_else(|_| panic!("a handler panicked: {shown}"));
                    Some((r.err(), shown))
                }
            }
        }};
    }
    let cases = fuzz_cases(20_000);
    let mut by_code: std::collections::BTreeMap<String, u64> = Default::default();
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(13_000_000 + case);
        let rng = &mut rng;
        let r = match case % 24 {
            0..=2 => fuzz!(rng, pb::AllocationRequest, request, |a, m| a
                .submit(tonic::Request::new(m))),
            3 => fuzz!(
                rng,
                pb::GetAllocationRequest,
                pb::GetAllocationRequest { id: id() },
                |a, m| { AllocationService::get(&a, tonic::Request::new(m)) }
            ),
            4 => fuzz!(
                rng,
                pb::ListAllocationsRequest,
                pb::ListAllocationsRequest {
                    tenant: "bio".into(),
                    user: "alice".into(),
                    state: "running,pending".into(),
                    vcluster: "default".into(),
                    mine: true
                },
                |a, m| AllocationService::list(&a, tonic::Request::new(m))
            ),
            5 => fuzz!(rng, pb::CancelRequest, pb::CancelRequest { id: id() }, |a, m| a
                .cancel(tonic::Request::new(m))),
            6 => fuzz!(rng, pb::WatchRequest, pb::WatchRequest { id: id() }, |a, m| a
                .watch(tonic::Request::new(m))),
            7 | 8 => fuzz!(
                rng,
                pb::UpdateRequest,
                pb::UpdateRequest {
                    id: id(),
                    walltime: "20m".into(),
                    tags: [("team".to_string(), String::new())].into(),
                    telemetry_mode: "debug".into()
                },
                |a, m| a.update(tonic::Request::new(m))
            ),
            9 => fuzz!(
                rng,
                pb::CheckpointRequest,
                pb::CheckpointRequest { id: id() },
                |a, m| a.checkpoint(tonic::Request::new(m))
            ),
            10 | 11 => fuzz!(rng, pb::SubmitDagRequest, dag, |a, m| a
                .submit_dag(tonic::Request::new(m))),
            12 => fuzz!(rng, pb::DagRequest, pb::DagRequest { id: "d1".into() }, |a, m| a
                .get_dag(tonic::Request::new(m))),
            13 => fuzz!(rng, pb::DagRequest, pb::DagRequest { id: "d1".into() }, |a, m| a
                .cancel_dag(tonic::Request::new(m))),
            14 => fuzz!(rng, pb::NodeRequest, node(), |a, m| NodeService::get(
                &a,
                tonic::Request::new(m)
            )),
            15 => fuzz!(rng, pb::NodeRequest, node(), |a, m| a.register(tonic::Request::new(m))),
            16 => fuzz!(
                rng,
                pb::HeartbeatRequest,
                pb::HeartbeatRequest {
                    id: "sim-003".into(),
                    seq: 900_000,
                    buffered: vec![pb::BufferedHeartbeat {
                        seq: 899_999,
                        at_ms: 1000
                    }]
                },
                |a, m| a.heartbeat(tonic::Request::new(m))
            ),
            17 => fuzz!(
                rng,
                pb::QueueRequest,
                pb::QueueRequest {
                    vcluster: "default".into()
                },
                |a, m| a.queue(tonic::Request::new(m))
            ),
            18 => fuzz!(
                rng,
                pb::SetWeightsRequest,
                pb::SetWeightsRequest {
                    vcluster: "default".into(),
                    weights: Some(pb::Weights {
                        priority: 0.5,
                        wait_time: 0.3,
                        fair_share: 0.2,
                        ..Default::default()
                    })
                },
                |a, m| a.set_weights(tonic::Request::new(m))
            ),
            19 => fuzz!(
                rng,
                pb::BackupRequest,
                pb::BackupRequest { name: "nightly".into() },
                |a, m| a.backup(tonic::Request::new(m))
            ),
            20 => fuzz!(
                rng,
                pb::VerifyBackupRequest,
                pb::VerifyBackupRequest { name: "nightly".into() },
                |a, m| a.verify_backup(tonic::Request::new(m))
            ),
            21 => fuzz!(
                rng,
                pb::AuditQueryRequest,
                pb::AuditQueryRequest {
                    user: "alice".into(),
                    allocation: id(),
                    node: "sim-001".into(),
                    since: "2026-03-01".into(),
                    until: "1767225600000".into(),
                    event: "claim,release".into(),
                    data_path: "s3://sensitive-data/subject-001/".into(),
                    tenant: "bio".into()
                },
                |a, m| a.query_audit(tonic::Request::new(m))
            ),
            22 => fuzz!(
                rng,
                pb::UsageRequest,
                pb::UsageRequest {
                    tenant: "bio".into(),
                    user: "alice".into(),
                    days: 30,
                    since: "2026-03-01".into(),
                    until: "1767225600000".into()
                },
                |a, m| a.usage(tonic::Request::new(m))
            ),
            _ => {
                // A peer's queue-mirror operation: the op is JSON inside the protobuf; mutate both.
                let term = rt.shared.member.current_term();
                let op = if case % 2 == 0 {
                    mirror_submit.as_str()
                } else {
                    mirror_update
                };
                // Every third case a round of several operations (`ops`).
                let valid = if case % 3 == 0 {
                    mpb::MirrorRequest {
                        from: 2,
                        op: Vec::new(),
                        term,
                        ops: vec![mutate(op, rng).into_bytes(), mutate(mirror_update, rng).into_bytes()],
                    }
                } else {
                    mpb::MirrorRequest {
                        from: 2,
                        op: mutate(op, rng).into_bytes(),
                        term,
                        ops: Vec::new(),
                    }
                };
                let bytes = lattice_traces::fuzz::mutate_bytes(&valid.encode_to_vec(), rng);
                match mpb::MirrorRequest::decode(bytes.as_slice()) {
                    Err(_) => None,
                    Ok(m) => {
                        let shown = format!("{m:?}");
                        let r = tokio::time::timeout(
                            std::time::Duration::from_secs(20),
                            mirror.apply(tonic::Request::new(m)),
                        )
                        .await
                        .unwrap_or_else(|_| panic!("a mirror op hung: {shown}"));
                        Some((r.err(), shown))
                    }
                }
            }
        };
        judge(case, &mut by_code, r);
    }
    eprintln!("fuzz grpc-messages cases={cases} answers={by_code:?}");
    enough(&by_code, cases);
    nothing_beside(&dir);
    // The member still serves.
    api.submit(tonic::Request::new(plain)).await.unwrap();
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decodes `valid`'s protobuf bytes after seeded byte mutations and runs `call` on the message in
/// a task of its own: (the status when refused, and the message shown), or None when the bytes did
/// not decode. A call that hangs or panics fails the test.
async fn fuzz_one<M, F, Fut>(rng: &mut ChaCha8Rng, valid: &M, call: F) -> Option<(Option<tonic::Status>, String)>
where
    M: prost::Message + Default + std::fmt::Debug + 'static,
    F: FnOnce(M) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>> + Send + 'static,
{
    let bytes = lattice_traces::fuzz::mutate_bytes(&valid.encode_to_vec(), rng);
    let m = M::decode(bytes.as_slice()).ok()?;
    let shown = format!("{m:?}");
    let task = tokio::spawn(call(m));
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), task)
        .await
        .unwrap_or_else(|_| panic!("a call hung: {shown}"))
        .unwrap_or_else(|_| panic!("a handler panicked: {shown}"));
    Some((r.err(), shown))
}

/// The request messages of `operations.proto` (logs, metrics, diagnostics, comparisons, task
/// launches, sessions, DAG graphs, the site's administration and the agents' calls, their Struct
/// bodies included), fuzzed as [`grpc_messages_never_panic_or_break_the_member`] fuzzes the typed
/// services': nothing panics or hangs, nothing answers INTERNAL or UNKNOWN, every INVALID_ARGUMENT
/// names its field, nothing is written beside the data directory, and the member still serves.
/// (Membership changes and site settings are left out: a valid one is meant to change the quorum.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_messages_never_panic_or_break_the_member() {
    use lattice_runtime::grpc::json::to_struct;
    use lattice_runtime::grpc::{Api, pb};
    use pb::allocation_service_server::AllocationService;
    use pb::observe_service_server::ObserveService;
    use pb::site_service_server::SiteService;
    use pb::task_service_server::TaskService;
    let (rt, dir) = fuzzed_leader("ops", 4).await;
    let api = Api {
        shared: rt.shared.clone(),
    };
    let plain = pb::AllocationRequest {
        tenant: "bio".into(),
        user: "alice".into(),
        entrypoint: "sleep 0.2".into(),
        resources: Some(pb::Resources {
            nodes: 1,
            ..Default::default()
        }),
        lifecycle: Some(pb::Lifecycle {
            r#type: "bounded".into(),
            walltime: "10m".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = api
        .submit(tonic::Request::new(plain.clone()))
        .await
        .unwrap()
        .into_inner()
        .id;
    let metrics = pb::MetricsRequest {
        id: id.clone(),
        mode: "per-node".into(),
        duration: "5m".into(),
        metrics: "gpu_utilization".into(),
        part: "network".into(),
    };
    let config = |name: &str, v: serde_json::Value| pb::ConfigWrite {
        name: name.into(),
        config: Some(to_struct(v)),
    };
    let work = pb::AgentCall {
        id: "sim-002".into(),
        body: Some(to_struct(
            serde_json::json!({"running": [], "wiped": [], "checkpointed": []}),
        )),
    };
    let exit = pb::AgentCall {
        id: id.clone(),
        body: Some(to_struct(
            serde_json::json!({"node": "sim-001", "kind": "exited", "exit_code": 0}),
        )),
    };
    let cases = fuzz_cases(4_000);
    let mut by_code: std::collections::BTreeMap<String, u64> = Default::default();
    for case in 0..cases {
        let mut rng = ChaCha8Rng::seed_from_u64(17_000_000 + case);
        let rng = &mut rng;
        let a = api.clone();
        let done = |r: Result<tonic::Response<pb::Document>, tonic::Status>| r.map(|_| ());
        let r = match case % 16 {
            0 => {
                let m = pb::LogsRequest {
                    id: id.clone(),
                    node: "sim-001".into(),
                    stream: "stderr".into(),
                    offset: Some(3),
                    limit: Some(10),
                    since: "2026-03-01".into(),
                    until: "1767225600000".into(),
                };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.get_logs(tonic::Request::new(m)).await) },
                )
                .await
            }
            1 => {
                let m = pb::LiveLogsRequest {
                    id: id.clone(),
                    after: "sim-001:4,sim-002:0".into(),
                    stream: "stdout".into(),
                };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.live_logs(tonic::Request::new(m)).await) },
                )
                .await
            }
            2 => {
                fuzz_one(rng, &metrics, |m| async move {
                    done(a.query_metrics(tonic::Request::new(m)).await)
                })
                .await
            }
            3 => {
                fuzz_one(rng, &metrics, |m| async move {
                    done(a.diagnostics(tonic::Request::new(m)).await)
                })
                .await
            }
            4 => {
                let m = pb::CompareRequest {
                    ids: vec![id.clone(), "a-000002".into()],
                    metrics: "gpu_utilization".into(),
                    align: "absolute".into(),
                    step: "5s".into(),
                };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.compare(tonic::Request::new(m)).await) },
                )
                .await
            }
            5 => {
                let m = pb::LaunchTasksRequest {
                    id: id.clone(),
                    entrypoint: "hostname".into(),
                    ntasks: Some(4),
                    tasks_per_node: Some(2),
                    env: [("K".to_string(), "v".to_string())].into(),
                    pmi: "pmix".into(),
                    fence_timeout: "30s".into(),
                };
                fuzz_one(rng, &m, |m| async move {
                    done(a.launch_tasks(tonic::Request::new(m)).await)
                })
                .await
            }
            6 => {
                let m = pb::TaskRef {
                    id: id.clone(),
                    launch: "l-1".into(),
                };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.get_task(tonic::Request::new(m)).await) },
                )
                .await
            }
            7 => {
                fuzz_one(rng, &plain, |m| async move {
                    a.create_session(tonic::Request::new(m)).await.map(|_| ())
                })
                .await
            }
            8 => {
                let m = pb::DagRequest { id: "d1".into() };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.dag_graph(tonic::Request::new(m)).await) },
                )
                .await
            }
            9 => {
                let m = config(
                    "fuzz-vc",
                    serde_json::json!({"backfill_depth": 12, "policy": "backfill"}),
                );
                fuzz_one(rng, &m, |m| async move {
                    done(a.create_v_cluster(tonic::Request::new(m)).await)
                })
                .await
            }
            10 => {
                let m = config(
                    "default",
                    serde_json::json!({"backfill_depth": 20, "cycle_interval": "200ms"}),
                );
                fuzz_one(rng, &m, |m| async move {
                    done(a.configure_v_cluster(tonic::Request::new(m)).await)
                })
                .await
            }
            11 => {
                let m = pb::RestoreRequest {
                    path: "/nonexistent/backup.json".into(),
                };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.restore(tonic::Request::new(m)).await) },
                )
                .await
            }
            12 => {
                let m = pb::CacheOrderRequest {
                    image: "prgenv/24.1:v1".into(),
                    nodes: vec!["sim-001".into()],
                    group: Some(0),
                    sticky: true,
                };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.warm_cache(tonic::Request::new(m)).await) },
                )
                .await
            }
            13 => {
                let m = pb::WipeRequest {
                    node: "sim-003".into(),
                    force: true,
                };
                fuzz_one(
                    rng,
                    &m,
                    |m| async move { done(a.retry_wipe(tonic::Request::new(m)).await) },
                )
                .await
            }
            14 => {
                fuzz_one(
                    rng,
                    &work,
                    |m| async move { done(a.work(tonic::Request::new(m)).await) },
                )
                .await
            }
            _ => {
                fuzz_one(rng, &exit, |m| async move {
                    done(a.report_exit(tonic::Request::new(m)).await)
                })
                .await
            }
        };
        judge(case, &mut by_code, r);
    }
    eprintln!("fuzz operation-messages cases={cases} answers={by_code:?}");
    enough(&by_code, cases);
    nothing_beside(&dir);
    api.submit(tonic::Request::new(plain)).await.unwrap();
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Found by the gRPC fuzz (1,000,000 cases): a peer's mirror message with a term this member's Raft
/// never saw (a mutated 127 under a term-1 leader) fenced the member's own copy, and the leader could
/// acknowledge nothing from then on. Such a term is refused, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_message_from_a_term_raft_never_saw_is_refused() {
    use lattice_runtime::grpc::pb;
    use pb::allocation_service_server::AllocationService;
    use pb::queue_mirror_server::QueueMirror;
    let (rt, dir) = fuzzed_leader("term", 2).await;
    let term = rt.shared.member.current_term();
    let mirror = lattice_runtime::mirror::net::MirrorService {
        shared: rt.shared.clone(),
    };
    let ahead = term + 126;
    let fetched = mirror
        .fetch(tonic::Request::new(pb::MirrorRequest {
            from: 2,
            op: Vec::new(),
            term: ahead,
            ops: Vec::new(),
        }))
        .await;
    assert_eq!(fetched.unwrap_err().code(), tonic::Code::Unavailable);
    let op = format!(
        r#"{{"Submit": {{"items": [["a-000900", {}]], "submitted_ms": 1000, "dag": null}}}}"#,
        BODIES[3]
    );
    let applied = mirror
        .apply(tonic::Request::new(pb::MirrorRequest {
            from: 2,
            op: op.into_bytes(),
            term: ahead,
            ops: Vec::new(),
        }))
        .await;
    assert_eq!(applied.unwrap_err().code(), tonic::Code::Unavailable);
    {
        let m = rt.shared.mirror.lock().unwrap();
        assert!(m.fence <= term, "fenced at {}", m.fence);
        assert!(!m.entries.contains_key(&900), "the op was not applied");
    }
    let api = lattice_runtime::grpc::Api {
        shared: rt.shared.clone(),
    };
    let req = pb::AllocationRequest {
        tenant: "bio".into(),
        entrypoint: "sleep 0.1".into(),
        resources: Some(pb::Resources {
            nodes: 1,
            ..Default::default()
        }),
        lifecycle: Some(pb::Lifecycle {
            r#type: "bounded".into(),
            walltime: "1m".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    api.submit(tonic::Request::new(req))
        .await
        .expect("the leader still acknowledges");
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
