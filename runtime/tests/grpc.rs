//! The public gRPC API: submit and watch an allocation to completion, list, cancel, update,
//! checkpoint, DAGs, node operations (drain, disable/enable, agents), and the admin calls (raft
//! status, tenants, vClusters, queue, weights, backup/verify, audit, usage); errors as gRPC codes
//! naming the field; tokens in the `authorization` metadata.

use lattice_runtime::grpc::pb;
use lattice_runtime::{RuntimeConfig, start};
use std::time::{Duration, Instant};
use tonic::Code;

const SECRET: &str = "grpc-test-secret";

fn token(sub: &str, tenant: Option<&str>, roles: &[&str]) -> String {
    let claims = serde_json::json!({"sub": sub, "tenant": tenant, "roles": roles, "exp": jsonwebtoken::get_current_timestamp() + 600});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

fn authed<T>(msg: T, tok: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {tok}").parse().unwrap());
    r
}

fn request(tenant: &str, nodes: u32, walltime: &str, class: Option<i32>) -> pb::AllocationRequest {
    pb::AllocationRequest {
        tenant: tenant.into(),
        entrypoint: "sleep 0.3".into(),
        resources: Some(pb::Resources {
            nodes,
            ..Default::default()
        }),
        lifecycle: Some(pb::Lifecycle {
            r#type: "bounded".into(),
            walltime: walltime.into(),
            ..Default::default()
        }),
        preemption_class: class,
        ..Default::default()
    }
}

/// A DAG member of physics running `entrypoint` after `deps` succeeded.
fn dag_member(name: &str, deps: &[&str], entrypoint: &str) -> pb::DagMember {
    pb::DagMember {
        name: name.into(),
        request: Some(pb::AllocationRequest {
            entrypoint: entrypoint.into(),
            depends_on: deps
                .iter()
                .map(|d| pb::Dependency {
                    r#ref: d.to_string(),
                    condition: "success".into(),
                })
                .collect(),
            ..request("physics", 1, "10m", None)
        }),
    }
}

/// A single member with JWT authentication and 4 simulated nodes, once it leads; its data directory.
async fn leader(tag: &str) -> (lattice_runtime::Running, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 4\ncycle: 100ms\nauth:\n  mode: jwt\n  hs256_secret: {SECRET}\n",
        dir.display()
    );
    let rt = start(RuntimeConfig::parse("g.yaml", &text).unwrap(), true)
        .await
        .unwrap();
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (rt, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allocations_nodes_and_admin_over_grpc() {
    let (rt, _) = leader("lattice-grpc-test").await;
    let url = format!("http://{}", rt.grpc_addr);
    let mut allocs = pb::allocation_service_client::AllocationServiceClient::connect(url.clone())
        .await
        .unwrap();
    let mut nodes = pb::node_service_client::NodeServiceClient::connect(url.clone())
        .await
        .unwrap();
    let mut admin = pb::admin_service_client::AdminServiceClient::connect(url)
        .await
        .unwrap();
    let alice = token("alice", Some("physics"), &["User"]);
    let dave = token("dave", Some("bio"), &["User"]);
    let root = token("root", None, &["SystemAdmin"]);

    // Unauthenticated.
    let e = allocs.list(pb::ListAllocationsRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    // Submit, then watch it to the end: pending → running → completed.
    let id = allocs
        .submit(authed(request("physics", 2, "10m", Some(4)), &alice))
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut stream = allocs
        .watch(authed(pb::WatchRequest { id: id.clone() }, &alice))
        .await
        .unwrap()
        .into_inner();
    let mut states = Vec::new();
    while let Some(a) = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream advances")
        .unwrap()
    {
        states.push(a.state.clone());
        if a.state == "running" {
            assert_eq!(a.nodes.len(), 2);
        }
    }
    assert_eq!(states.last().map(String::as_str), Some("completed"), "{states:?}");
    assert!(states.contains(&"running".to_string()), "{states:?}");

    // Validation errors name the field; other tenants' allocations do not exist for the caller.
    let e = allocs
        .submit(authed(request("physics", 1, "10m", Some(11)), &alice))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("preemption_class"), "{}", e.message());
    let e = allocs
        .submit(authed(request("physics", 1, "soon", None), &alice))
        .await
        .unwrap_err();
    assert!(e.message().starts_with("lifecycle.walltime"), "{}", e.message());
    let e = allocs
        .submit(authed(request("bio", 1, "1m", None), &alice))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = allocs
        .get(authed(pb::GetAllocationRequest { id: id.clone() }, &dave))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let listed = allocs
        .list(authed(pb::ListAllocationsRequest::default(), &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.allocations.len(), 1);
    // The software environment: a bad uenv name is refused naming the field; a good one is kept.
    let with_env = |uenv: &str| pb::AllocationRequest {
        environment: Some(pb::Environment {
            uenv: uenv.into(),
            view: "default".into(),
            ..Default::default()
        }),
        ..request("physics", 1, "10m", None)
    };
    let e = allocs.submit(authed(with_env("../etc"), &alice)).await.unwrap_err();
    assert!(e.message().starts_with("environment.uenv"), "{}", e.message());
    let u = allocs
        .submit(authed(with_env("prgenv-gnu/24.11:v1"), &alice))
        .await
        .unwrap()
        .into_inner()
        .id;
    let got = allocs
        .get(authed(pb::GetAllocationRequest { id: u }, &alice))
        .await
        .unwrap()
        .into_inner();
    let env = got.environment.expect("the environment is shown");
    assert_eq!(
        (env.uenv.as_str(), env.view.as_str()),
        ("prgenv-gnu/24.11:v1", "default")
    );

    // Cancel.
    let long = allocs
        .submit(authed(
            pb::AllocationRequest {
                entrypoint: "sleep 100".into(),
                ..request("physics", 1, "1h", None)
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner()
        .id;
    let c = allocs
        .cancel(authed(pb::CancelRequest { id: long.clone() }, &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.state, "cancelled");

    // Every field a trace's submission can carry can be asked for over gRPC too.
    let asked = allocs
        .submit(authed(
            pb::AllocationRequest {
                requeue: "always".into(),
                max_requeues: Some(4),
                mutex: "nightly".into(),
                storage_gbps: Some(2.5),
                resources: Some(pb::Resources {
                    nodes: 1,
                    topology: "tight".into(),
                    ..Default::default()
                }),
                ..request("physics", 1, "10m", None)
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner()
        .id;
    {
        let c = rt.shared.control.lock().await;
        let id = c.id_of(&asked).unwrap();
        let spec = &c.ctl.engine.allocation(id).unwrap().spec;
        assert_eq!(
            (
                spec.requeue,
                spec.max_requeues,
                spec.mutex.as_deref(),
                spec.storage_gbps
            ),
            (lattice_engine::RequeuePolicy::Always, 4, Some("nightly"), Some(2.5))
        );
        assert_eq!(spec.constraints.topology, Some(lattice_engine::TopologyHint::Tight));
    }
    // And the gRPC view shows them as asked.
    let shown = allocs
        .get(authed(pb::GetAllocationRequest { id: asked.clone() }, &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            shown.requeue.as_str(),
            shown.max_requeues,
            shown.mutex.as_str(),
            shown.storage_gbps,
            shown.constraints.map(|c| c.topology)
        ),
        ("always", 4, "nightly", Some(2.5), Some("tight".to_string()))
    );

    // A task group: one allocation per index, one at a time; each knows its group and index.
    let group = allocs
        .submit(authed(
            pb::AllocationRequest {
                entrypoint: "sleep 0.1".into(),
                task_group: Some(pb::TaskGroup {
                    start: 0,
                    end: 2,
                    concurrency: 1,
                }),
                ..request("physics", 1, "10m", None)
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    let want: Vec<String> = (0..3).map(|i| format!("{}[{i}]", group.id)).collect();
    assert_eq!(group.elements, want);
    let mut stream = allocs
        .watch(authed(pb::WatchRequest { id: want[2].clone() }, &alice))
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(a) = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream advances")
        .unwrap()
    {
        last = Some(a);
    }
    let last = last.unwrap();
    assert_eq!(
        (last.state.as_str(), last.task_group.as_str(), last.task_index),
        ("completed", group.id.as_str(), Some(2))
    );
    let e = allocs
        .submit(authed(
            pb::AllocationRequest {
                task_group: Some(pb::TaskGroup {
                    start: 3,
                    end: 1,
                    concurrency: 0,
                }),
                ..request("physics", 1, "10m", None)
            },
            &alice,
        ))
        .await
        .unwrap_err();
    assert!(e.message().starts_with("task_group.range"), "{}", e.message());

    // Nodes: anyone reads, only operators/admins drain.
    let all = nodes
        .list(authed(pb::ListNodesRequest::default(), &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.nodes.len(), 4);
    // The REST filters: by state, and by the tenant of what runs there (nothing of `bio` does).
    let ready = pb::ListNodesRequest {
        state: "ready".into(),
        ..Default::default()
    };
    assert_eq!(
        nodes
            .list(authed(ready, &alice))
            .await
            .unwrap()
            .into_inner()
            .nodes
            .len(),
        4
    );
    let bio = pb::ListNodesRequest {
        tenant: "bio".into(),
        ..Default::default()
    };
    assert!(
        nodes
            .list(authed(bio, &alice))
            .await
            .unwrap()
            .into_inner()
            .nodes
            .is_empty()
    );
    let e = nodes
        .drain(authed(
            pb::NodeRequest {
                id: "sim-002".into(),
                urgent: false,
            },
            &alice,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let n = nodes
        .drain(authed(
            pb::NodeRequest {
                id: "sim-002".into(),
                urgent: false,
            },
            &root,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(n.state, "drained");
    let e = nodes
        .get(authed(
            pb::NodeRequest {
                id: "nope".into(),
                urgent: false,
            },
            &root,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Agents: register, then heartbeats with a strictly increasing sequence; replays are refused.
    let hb = |seq: u64| pb::HeartbeatRequest {
        id: "sim-001".into(),
        seq,
        buffered: Vec::new(),
    };
    let e = nodes.heartbeat(authed(hb(1), &root)).await.unwrap_err();
    assert!(e.message().contains("has not registered"), "{}", e.message());
    nodes
        .register(authed(
            pb::NodeRequest {
                id: "sim-001".into(),
                urgent: false,
            },
            &root,
        ))
        .await
        .unwrap();
    nodes.heartbeat(authed(hb(1), &root)).await.unwrap();
    nodes.heartbeat(authed(hb(5), &root)).await.unwrap();
    for replay in [5, 3] {
        let e = nodes.heartbeat(authed(hb(replay), &root)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("seq: replayed"), "{}", e.message());
    }
    // A restarted agent registers again and its sequence starts over.
    nodes
        .register(authed(
            pb::NodeRequest {
                id: "sim-001".into(),
                urgent: false,
            },
            &root,
        ))
        .await
        .unwrap();
    nodes.heartbeat(authed(hb(1), &root)).await.unwrap();
    let e = nodes.heartbeat(authed(hb(2), &alice)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // The long-lived stream: accepted heartbeats are counted; a replay ends it with an error.
    let stream = tokio_stream::iter([hb(2), hb(3), hb(7)]);
    let n = nodes
        .heartbeat_stream(authed(stream, &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(n.accepted, 3);
    let stream = tokio_stream::iter([hb(8), hb(8)]);
    let e = nodes.heartbeat_stream(authed(stream, &root)).await.unwrap_err();
    assert!(e.message().starts_with("seq: replayed"), "{}", e.message());
    let e = nodes
        .heartbeat_stream(authed(tokio_stream::iter([hb(9)]), &alice))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = nodes
        .register(authed(
            pb::NodeRequest {
                id: "nid999".into(),
                urgent: false,
            },
            &root,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // Raft status.
    let st = admin
        .raft_status(authed(pb::RaftStatusRequest {}, &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (st.state.as_str(), st.members.len(), st.audit_chain_valid),
        ("Leader", 1, true)
    );
    // The watched allocation's assignment (the cancelled one may have been cancelled before it started).
    assert!(st.commits >= 1, "{st:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dags_updates_nodes_and_admin_calls_over_grpc() {
    let (rt, _) = leader("lattice-grpc-admin").await;
    let url = format!("http://{}", rt.grpc_addr);
    let mut allocs = pb::allocation_service_client::AllocationServiceClient::connect(url.clone())
        .await
        .unwrap();
    let mut nodes = pb::node_service_client::NodeServiceClient::connect(url.clone())
        .await
        .unwrap();
    let mut admin = pb::admin_service_client::AdminServiceClient::connect(url)
        .await
        .unwrap();
    let alice = token("alice", Some("physics"), &["User"]);
    let carol = token("carol", Some("physics"), &["ClaimingUser"]);
    let root = token("root", None, &["SystemAdmin"]);

    // A DAG: train after prep; get, list, and it completes in order.
    let member = |name: &str, deps: &[&str]| dag_member(name, deps, "sleep 0.1");
    let dag = allocs
        .submit_dag(authed(
            pb::SubmitDagRequest {
                id: String::new(),
                allocations: vec![member("train", &["prep"]), member("prep", &[])],
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dag.allocations.len(), 2);
    let t0 = Instant::now();
    let done = loop {
        let d = allocs
            .get_dag(authed(pb::DagRequest { id: dag.id.clone() }, &alice))
            .await
            .unwrap()
            .into_inner();
        if d.state == "completed" {
            break d;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{d:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let at = |name: &str| {
        done.allocations
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.allocation.clone())
            .unwrap()
    };
    assert!(at("prep").ended_ms.unwrap() <= at("train").started_ms.unwrap());
    let listed = allocs
        .list_dags(authed(pb::ListDagsRequest::default(), &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.dags.len(), 1);
    assert_eq!(listed.dags[0].tenant, "physics");
    let of = |user: &str, state: &str| pb::ListDagsRequest {
        user: user.into(),
        state: state.into(),
        ..Default::default()
    };
    let d = allocs
        .list_dags(authed(of(&listed.dags[0].user, "completed"), &alice))
        .await
        .unwrap();
    assert_eq!(d.into_inner().dags.len(), 1);
    let d = allocs.list_dags(authed(of("nobody", ""), &alice)).await.unwrap();
    assert!(d.into_inner().dags.is_empty());
    let cyclic = allocs
        .submit_dag(authed(
            pb::SubmitDagRequest {
                id: String::new(),
                allocations: vec![member("a", &["b"]), member("b", &["a"])],
            },
            &alice,
        ))
        .await
        .unwrap_err();
    assert_eq!(cyclic.code(), Code::InvalidArgument);

    // Update (walltime extension, tags, telemetry) and checkpoint of a running allocation.
    let long = allocs
        .submit(authed(
            pb::AllocationRequest {
                entrypoint: "sleep 100".into(),
                ..request("physics", 1, "1h", None)
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner()
        .id;
    let t0 = Instant::now();
    let running = loop {
        let a = allocs
            .get(authed(pb::GetAllocationRequest { id: long.clone() }, &alice))
            .await
            .unwrap()
            .into_inner();
        if a.state == "running" {
            break a;
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let u = allocs
        .update(authed(
            pb::UpdateRequest {
                id: long.clone(),
                walltime: "2h".into(),
                tags: [("stage".to_string(), "2".to_string())].into(),
                telemetry_mode: "debug".into(),
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((u.walltime_s, u.telemetry.as_str()), (Some(7200.0), "debug"));
    assert_eq!(u.tags.get("stage").map(String::as_str), Some("2"));
    let e = allocs
        .update(authed(
            pb::UpdateRequest {
                id: long.clone(),
                walltime: "soon".into(),
                ..Default::default()
            },
            &alice,
        ))
        .await
        .unwrap_err();
    assert!(e.message().starts_with("walltime"), "{}", e.message());
    let cp = allocs
        .checkpoint(authed(pb::CheckpointRequest { id: long.clone() }, &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cp.checkpoints, 1);

    // Disable the node under it (operators only) → requeued; enable → ready.
    let node = running.nodes[0].clone();
    let e = nodes
        .disable(authed(
            pb::NodeRequest {
                id: node.clone(),
                urgent: false,
            },
            &alice,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let n = nodes
        .disable(authed(
            pb::NodeRequest {
                id: node.clone(),
                urgent: false,
            },
            &root,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(n.state, "down");
    let n = nodes
        .enable(authed(
            pb::NodeRequest {
                id: node.clone(),
                urgent: false,
            },
            &root,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(n.state, "ready");

    // Service discovery: a running allocation's exposed port, tenant-filtered by metadata.
    let mut svc = request("physics", 1, "10m", None);
    svc.entrypoint = "sleep 30".into();
    svc.expose = vec![pb::Expose {
        name: "api".into(),
        port: 8080,
        protocol: "http".into(),
    }];
    svc.liveness_probe = Some(pb::LivenessProbeSpec {
        probe_type: "tcp".into(),
        port: 8080,
        ..Default::default()
    });
    let sid = allocs.submit(authed(svc, &alice)).await.unwrap().into_inner().id;
    let t0 = Instant::now();
    loop {
        let a = allocs
            .get(authed(pb::GetAllocationRequest { id: sid.clone() }, &alice))
            .await
            .unwrap()
            .into_inner();
        if a.state == "running" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{a:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let names = admin
        .list_services(authed(pb::ListServicesRequest {}, &alice))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names.names, ["api"]);
    let found = admin
        .lookup_service(authed(pb::LookupServiceRequest { name: "api".into() }, &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.endpoints.len(), 1, "{found:?}");
    assert_eq!(
        (
            found.endpoints[0].allocation.as_str(),
            found.endpoints[0].port,
            found.endpoints[0].tenant.as_str()
        ),
        (sid.as_str(), 8080, "physics")
    );
    let mut other = authed(pb::ListServicesRequest {}, &root);
    other.metadata_mut().insert("x-lattice-tenant", "bio".parse().unwrap());
    assert!(admin.list_services(other).await.unwrap().into_inner().names.is_empty());
    let mut nosy = authed(pb::ListServicesRequest {}, &alice);
    nosy.metadata_mut().insert("x-lattice-tenant", "bio".parse().unwrap());
    assert_eq!(
        admin.list_services(nosy).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
    let mut bad = request("physics", 1, "10m", None);
    bad.liveness_probe = Some(pb::LivenessProbeSpec {
        probe_type: "udp".into(),
        port: 1,
        ..Default::default()
    });
    let e = allocs.submit(authed(bad, &alice)).await.unwrap_err();
    assert!(e.message().contains("liveness_probe.probe_type"), "{e:?}");
    allocs
        .cancel(authed(pb::CancelRequest { id: sid.clone() }, &alice))
        .await
        .unwrap();
    let gone = admin
        .lookup_service(authed(pb::LookupServiceRequest { name: "api".into() }, &root))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);

    // Admin: tenants, vClusters, queue, weights.
    let t = admin
        .list_tenants(authed(pb::ListTenantsRequest {}, &root))
        .await
        .unwrap()
        .into_inner();
    assert!(t.tenants.contains(&"physics".to_string()), "{t:?}");
    // Tenant and project administration (SystemAdmin): committed through the quorum.
    let quota = |max_nodes| pb::TenantQuota {
        max_nodes: Some(max_nodes),
        ..Default::default()
    };
    let created = admin
        .create_tenant(authed(
            pb::TenantWriteRequest {
                name: "chem".into(),
                quota: Some(quota(4)),
                clear: Vec::new(),
            },
            &root,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.quota.unwrap().max_nodes, Some(4));
    let write = |name: &str, q: Option<pb::TenantQuota>, clear: &[&str]| pb::ProjectWriteRequest {
        tenant: "chem".into(),
        name: name.into(),
        quota: q,
        clear: clear.iter().map(|c| c.to_string()).collect(),
    };
    let p = admin
        .create_project(authed(write("qcd", Some(quota(2)), &[]), &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (p.tenant.as_str(), p.name.as_str(), p.quota.unwrap().max_nodes),
        ("chem", "qcd", Some(2))
    );
    let e = admin
        .create_project(authed(write("qcd", Some(quota(2)), &[]), &alice))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = admin
        .create_project(authed(
            write(
                "astro",
                Some(pb::TenantQuota {
                    fair_share_target: Some(0.2),
                    ..Default::default()
                }),
                &[],
            ),
            &root,
        ))
        .await
        .unwrap_err();
    assert!(e.message().contains("fair_share_target"), "{e:?}");
    let p = admin
        .update_project(authed(write("qcd", None, &["max_nodes"]), &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.quota.unwrap().max_nodes, None);
    let listed = admin
        .list_projects(authed(pb::TenantRequest { name: "chem".into() }, &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.projects.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["qcd"]
    );
    admin
        .delete_project(authed(
            pb::ProjectRequest {
                tenant: "chem".into(),
                name: "qcd".into(),
            },
            &root,
        ))
        .await
        .unwrap();
    let e = admin
        .update_project(authed(write("qcd", Some(quota(1)), &[]), &root))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let v = admin
        .list_v_clusters(authed(pb::ListVClustersRequest {}, &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.vclusters, ["default"]);
    admin
        .queue(authed(
            pb::QueueRequest {
                vcluster: "default".into(),
            },
            &root,
        ))
        .await
        .unwrap();
    let e = admin
        .queue(authed(pb::QueueRequest { vcluster: "gpu".into() }, &root))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let w = pb::SetWeightsRequest {
        vcluster: "default".into(),
        weights: Some(pb::Weights {
            priority: 0.5,
            wait_time: 0.5,
            ..Default::default()
        }),
    };
    let e = admin.set_weights(authed(w.clone(), &alice)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    admin.set_weights(authed(w, &root)).await.unwrap();

    // A sensitive claim needs the ClaimingUser role; its claim is audited.
    let mut claim = request("physics", 1, "10m", None);
    claim.sensitive = true;
    let e = allocs.submit(authed(claim.clone(), &alice)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let c = allocs.submit(authed(claim, &carol)).await.unwrap().into_inner().id;
    let t0 = Instant::now();
    let log = loop {
        let q = pb::AuditQueryRequest {
            allocation: c.clone(),
            ..Default::default()
        };
        let log = admin.query_audit(authed(q, &root)).await.unwrap().into_inner();
        if !log.entries.is_empty() {
            break log;
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        (log.entries[0].action.as_str(), log.entries[0].user.as_str()),
        ("claim", "carol")
    );
    assert!(log.chain_valid);
    let by_event = |event: &str| pb::AuditQueryRequest {
        allocation: c.clone(),
        event: event.into(),
        ..Default::default()
    };
    let claims = admin
        .query_audit(authed(by_event("claim"), &root))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(claims.entries.len(), 1);
    let wipes = admin
        .query_audit(authed(by_event("wipe"), &root))
        .await
        .unwrap()
        .into_inner();
    assert!(wipes.entries.is_empty());
    let mine = admin
        .query_audit(authed(pb::AuditQueryRequest::default(), &alice))
        .await
        .unwrap()
        .into_inner();
    assert!(mine.entries.is_empty(), "alice sees only her own entries");
    // The tenant's compliance reviewer (its TenantAdmin) sees every entry about the tenant's
    // allocations; another tenant's admin sees none of them.
    let of_claim = || pb::AuditQueryRequest {
        allocation: c.clone(),
        ..Default::default()
    };
    let reviewer = token("rita", Some("physics"), &["TenantAdmin"]);
    let reviewed = admin
        .query_audit(authed(of_claim(), &reviewer))
        .await
        .unwrap()
        .into_inner();
    assert!(
        reviewed
            .entries
            .iter()
            .any(|e| e.action == "claim" && e.user == "carol"),
        "{reviewed:?}"
    );
    let outsider = token("otto", Some("bio"), &["TenantAdmin"]);
    let other = admin
        .query_audit(authed(of_claim(), &outsider))
        .await
        .unwrap()
        .into_inner();
    assert!(other.entries.is_empty(), "another tenant's admin: {other:?}");

    // Usage: alice may read hers, not another tenant's.
    let u = admin
        .usage(authed(
            pb::UsageRequest {
                user: "alice".into(),
                days: 7,
                ..Default::default()
            },
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(u.allocations >= 3 && u.node_hours > 0.0, "{u:?}");
    let e = admin
        .usage(authed(
            pb::UsageRequest {
                tenant: "bio".into(),
                ..Default::default()
            },
            &alice,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);

    // Backup and verify by name.
    let b = admin
        .backup(authed(pb::BackupRequest { name: "nightly".into() }, &root))
        .await
        .unwrap()
        .into_inner();
    assert!(b.path.ends_with("nightly.json") && b.last_applied > 0, "{b:?}");
    let ok = admin
        .verify_backup(authed(pb::VerifyBackupRequest { name: "nightly".into() }, &root))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.ok, "{ok:?}");
    let e = admin
        .backup(authed(pb::BackupRequest { name: "../x".into() }, &root))
        .await
        .unwrap_err();
    assert!(e.message().starts_with("name"), "{}", e.message());
    rt.shutdown().await;
}

/// A REST call with a bearer token (off the async runtime): (status, JSON answer).
async fn rest(
    method: &'static str,
    url: String,
    tok: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let tok = tok.to_string();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let auth = format!("Bearer {tok}");
        let mut r = match (method, body) {
            ("PATCH", Some(b)) => agent.patch(&url).header("authorization", &auth).send_json(b),
            (_, Some(b)) => agent.post(&url).header("authorization", &auth).send_json(b),
            ("DELETE", None) => agent.delete(&url).header("authorization", &auth).call(),
            _ => agent.get(&url).header("authorization", &auth).call(),
        }
        .unwrap();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (
            r.status().as_u16(),
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
        )
    })
    .await
    .unwrap()
}

/// A gRPC document as JSON.
fn doc(r: Result<tonic::Response<pb::Document>, tonic::Status>) -> serde_json::Value {
    let d = r.unwrap().into_inner().document.unwrap_or_default();
    lattice_runtime::grpc::json::from_struct(d)
}

/// A document with every number as a double (a Struct's numbers are) and without the windows that
/// move with the clock between two calls (`since_ms`, `until_ms`).
fn same(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) => serde_json::json!(n.as_f64()),
        Value::Array(a) => Value::Array(a.iter().map(same).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "since_ms" | "until_ms"))
                .map(|(k, v)| (k.clone(), same(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The gRPC code a REST refusal's status stands for.
fn code_of(status: u16) -> Code {
    match status {
        400 => Code::InvalidArgument,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::AlreadyExists,
        503 => Code::Unavailable,
        other => panic!("unexpected REST status {other}"),
    }
}

/// The operations added beyond the typed services (`operations.proto`): each answers over gRPC what
/// REST answers — the same document, or the same refusal — and the streams end as REST's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_operation_answers_over_grpc_as_over_rest() {
    let (rt, dir) = leader("lattice-grpc-ops").await;
    let url = format!("http://{}", rt.grpc_addr);
    let base = format!("http://{}", rt.rest_addr);
    let mut allocs = pb::allocation_service_client::AllocationServiceClient::connect(url.clone())
        .await
        .unwrap();
    let alice = token("alice", Some("physics"), &["User"]);
    let root = token("root", None, &["SystemAdmin"]);

    let id = observe_calls(&url, &base, &mut allocs, &alice).await;
    task_calls(&url, &base, &mut allocs, &alice, &id).await;
    site_calls(&url, &base, &dir, &alice, &root, &id).await;
    rt.shutdown().await;
}

/// Logs, metrics, diagnostics, comparisons and network domains of an allocation that ran; its id.
async fn observe_calls(
    url: &str,
    base: &str,
    allocs: &mut pb::allocation_service_client::AllocationServiceClient<tonic::transport::Channel>,
    alice: &str,
) -> String {
    let mut observe = pb::observe_service_client::ObserveServiceClient::connect(url.to_string())
        .await
        .unwrap();
    // An allocation that ran: its logs, live tail and graph-free documents match REST's.
    let id = allocs
        .submit(authed(request("physics", 1, "10m", None), alice))
        .await
        .unwrap()
        .into_inner()
        .id;
    let t0 = Instant::now();
    loop {
        let v = allocs
            .get(authed(pb::GetAllocationRequest { id: id.clone() }, alice))
            .await
            .unwrap()
            .into_inner();
        if v.state == "completed" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{v:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs = doc(observe
        .get_logs(authed(
            pb::LogsRequest {
                id: id.clone(),
                ..Default::default()
            },
            alice,
        ))
        .await);
    let (st, rest_logs) = rest("GET", format!("{base}/v1/allocations/{id}/logs"), alice, None).await;
    assert_eq!((st, same(&logs)), (200, same(&rest_logs)));
    assert_eq!(logs["stream"], "stdout");
    let live = doc(observe
        .live_logs(authed(
            pb::LiveLogsRequest {
                id: id.clone(),
                stream: "stderr".into(),
                ..Default::default()
            },
            alice,
        ))
        .await);
    let (_, rest_live) = rest(
        "GET",
        format!("{base}/v1/allocations/{id}/logs/live?stream=stderr"),
        alice,
        None,
    )
    .await;
    assert_eq!(same(&live), same(&rest_live));
    // The log stream of an ended allocation: its end, with the state.
    let mut events = observe
        .stream_logs(authed(
            pb::LiveLogsRequest {
                id: id.clone(),
                ..Default::default()
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("the stream ends")
        .unwrap()
    {
        last = Some(ev);
    }
    let last = last.expect("an end event");
    assert_eq!(last.event, "end");
    assert_eq!(
        lattice_runtime::grpc::json::from_struct(last.data.unwrap())["state"],
        "completed"
    );
    // Refusals as REST's: a bad parameter names its field; no TSDB is unavailable; another
    // tenant's allocation is not found.
    let e = observe
        .live_logs(authed(
            pb::LiveLogsRequest {
                id: id.clone(),
                after: "node-001".into(),
                ..Default::default()
            },
            alice,
        ))
        .await
        .unwrap_err();
    let (st, _) = rest(
        "GET",
        format!("{base}/v1/allocations/{id}/logs/live?after=node-001"),
        alice,
        None,
    )
    .await;
    assert_eq!((e.code(), code_of(st)), (Code::InvalidArgument, Code::InvalidArgument));
    assert!(e.message().starts_with("after:"), "{}", e.message());
    let metrics = pb::MetricsRequest {
        id: id.clone(),
        ..Default::default()
    };
    let e = observe.query_metrics(authed(metrics.clone(), alice)).await.unwrap_err();
    let (st, _) = rest("GET", format!("{base}/v1/allocations/{id}/metrics"), alice, None).await;
    assert_eq!((e.code(), code_of(st)), (Code::Unavailable, Code::Unavailable));
    assert!(observe.stream_metrics(authed(metrics.clone(), alice)).await.is_err());
    let dave = token("dave", Some("bio"), &["User"]);
    let e = observe
        .get_logs(authed(
            pb::LogsRequest {
                id: id.clone(),
                ..Default::default()
            },
            &dave,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let diag = doc(observe.diagnostics(authed(metrics.clone(), alice)).await);
    assert_eq!(diag["id"], id.as_str());
    let e = observe
        .diagnostics(authed(
            pb::MetricsRequest {
                part: "cpu".into(),
                ..metrics.clone()
            },
            alice,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = observe
        .compare(authed(pb::CompareRequest::default(), alice))
        .await
        .unwrap_err();
    assert!(e.message().starts_with("ids:"), "{}", e.message());
    let domains = doc(observe
        .network_domains(authed(pb::NetworkDomainsRequest {}, alice))
        .await);
    let (_, rest_domains) = rest("GET", format!("{base}/v1/network/domains"), alice, None).await;
    assert_eq!(same(&domains), same(&rest_domains));
    id
}

/// Task launches, sessions and a DAG's graph.
async fn task_calls(
    url: &str,
    base: &str,
    allocs: &mut pb::allocation_service_client::AllocationServiceClient<tonic::transport::Channel>,
    alice: &str,
    id: &str,
) {
    let id = id.to_string();
    let mut tasks = pb::task_service_client::TaskServiceClient::connect(url.to_string())
        .await
        .unwrap();
    // Task launches: none yet, and none in an ended allocation.
    let l = doc(tasks
        .list_tasks(authed(pb::AllocationRef { id: id.clone() }, alice))
        .await);
    assert_eq!(l, serde_json::json!({"launches": []}));
    let launch = pb::LaunchTasksRequest {
        id: id.clone(),
        entrypoint: "hostname".into(),
        ntasks: Some(2),
        ..Default::default()
    };
    let e = tasks.launch_tasks(authed(launch, alice)).await.unwrap_err();
    let (st, _) = rest(
        "POST",
        format!("{base}/v1/allocations/{id}/tasks"),
        alice,
        Some(serde_json::json!({"entrypoint": "hostname", "ntasks": 2})),
    )
    .await;
    assert_eq!(e.code(), code_of(st), "{e:?}");

    // A session: created, read (as REST reads it), ended.
    let s = tasks
        .create_session(authed(
            pb::AllocationRequest {
                tenant: "physics".into(),
                resources: Some(pb::Resources {
                    nodes: 1,
                    ..Default::default()
                }),
                ..Default::default()
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.session_id, s.allocation_id);
    let got = tasks
        .get_session(authed(
            pb::SessionRef {
                id: s.session_id.clone(),
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.tags.get("session").map(String::as_str), Some("true"), "{got:?}");
    let e = tasks
        .get_session(authed(pb::SessionRef { id: id.clone() }, alice))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "a batch allocation is not a session");
    let ended = tasks
        .delete_session(authed(
            pb::SessionRef {
                id: s.session_id.clone(),
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ended.state, "cancelled");

    // `mine`: only the caller's own, in the states asked for.
    let mine = allocs
        .list(authed(
            pb::ListAllocationsRequest {
                mine: true,
                state: "completed,cancelled".into(),
                ..Default::default()
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner()
        .allocations;
    let ids: Vec<&str> = mine.iter().map(|a| a.id.as_str()).collect();
    assert!(
        ids.contains(&id.as_str()) && ids.contains(&s.session_id.as_str()),
        "{ids:?}"
    );
    assert!(
        mine.iter()
            .all(|a| a.user == "alice" && (a.state == "completed" || a.state == "cancelled"))
    );

    // A DAG's graph, as REST draws it.
    let member = |name: &str, deps: &[&str]| dag_member(name, deps, "sleep 0.3");
    let dag = allocs
        .submit_dag(authed(
            pb::SubmitDagRequest {
                id: String::new(),
                allocations: vec![member("a", &[]), member("b", &["a"])],
            },
            alice,
        ))
        .await
        .unwrap()
        .into_inner();
    let graph = doc(tasks
        .dag_graph(authed(pb::DagRequest { id: dag.id.clone() }, alice))
        .await);
    let (_, rest_graph) = rest("GET", format!("{base}/v1/dags/{}/graph", dag.id), alice, None).await;
    assert_eq!(
        graph["edges"],
        serde_json::json!([{"from": "a", "to": "b", "condition": "success"}])
    );
    assert_eq!(graph["edges"], rest_graph["edges"]);
    let ids = |g: &serde_json::Value| {
        g["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["name"].clone(), a["id"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&graph), ids(&rest_graph));
}

/// The site's administration and the agents' calls.
async fn site_calls(url: &str, base: &str, dir: &std::path::Path, alice: &str, root: &str, id: &str) {
    let mut site = pb::site_service_client::SiteServiceClient::connect(url.to_string())
        .await
        .unwrap();
    // The site: health and discovery need no token; reads match REST's; writes need their role,
    // and a refused write changed nothing.
    let empty = || tonic::Request::new(pb::Empty {});
    assert_eq!(doc(site.health(empty()).await)["status"], "ok");
    assert_eq!(doc(site.auth_discovery(empty()).await)["mode"], "jwt");
    let tenant = doc(site
        .get_tenant(authed(pb::TenantRequest { name: "physics".into() }, alice))
        .await);
    let (_, rest_tenant) = rest("GET", format!("{base}/api/v1/tenants/physics"), alice, None).await;
    // (Its counts move as the DAG runs: the quotas and the projects' names are compared.)
    assert_eq!(
        (&tenant["name"], same(&tenant["quota"])),
        (&rest_tenant["name"], same(&rest_tenant["quota"]))
    );
    assert_eq!(tenant["projects"][0]["name"], rest_tenant["projects"][0]["name"]);
    let e = site
        .get_tenant(authed(pb::TenantRequest { name: "bio".into() }, alice))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let history = doc(site
        .accounting(authed(
            pb::UsageRequest {
                tenant: "physics".into(),
                ..Default::default()
            },
            root,
        ))
        .await);
    let (_, rest_history) = rest("GET", format!("{base}/v1/accounting?tenant=physics"), root, None).await;
    // (The running DAG's records grow between the two reads: the ended allocation's is compared.)
    let record = |h: &serde_json::Value| {
        h["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .map(same)
    };
    assert_eq!(record(&history), record(&rest_history));
    assert!(record(&history).is_some(), "{history}");
    assert!(
        history["records"].as_array().unwrap().iter().any(|r| r["id"] == id),
        "{history}"
    );
    let settings = doc(site.get_settings(authed(pb::Empty {}, alice)).await);
    let write = |who: &str, changes: serde_json::Value| {
        authed(
            pb::ConfigWrite {
                name: String::new(),
                config: Some(lattice_runtime::grpc::json::to_struct(changes)),
            },
            who,
        )
    };
    let (key, secs) = settings
        .as_object()
        .and_then(|m| m.iter().find(|(k, _)| k.starts_with("agents.")))
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .expect("an agents setting");
    let twice = serde_json::json!({ key.clone(): format!("{}s", (secs * 2.0).round() as u64) });
    let e = site.set_settings(write(alice, twice.clone())).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(doc(site.get_settings(authed(pb::Empty {}, alice)).await), settings);
    let changed = doc(site.set_settings(write(root, twice)).await);
    assert_eq!(changed[&key].as_f64(), Some((secs * 2.0).round()), "{changed}");
    let settings = changed;
    let (_, rest_settings) = rest("GET", format!("{base}/v1/config"), alice, None).await;
    assert_eq!(same(&settings), same(&rest_settings));
    // vClusters: created and configured by an administrator, read as REST reads them.
    let vc = |who: &str, name: &str, config: serde_json::Value| {
        authed(
            pb::ConfigWrite {
                name: name.into(),
                config: Some(lattice_runtime::grpc::json::to_struct(config)),
            },
            who,
        )
    };
    let e = site
        .create_v_cluster(vc(alice, "grpc-vc", serde_json::json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let (st, _) = rest("GET", format!("{base}/v1/vclusters/grpc-vc"), alice, None).await;
    assert_eq!(st, 404, "a refused create created nothing");
    doc(site.create_v_cluster(vc(root, "grpc-vc", serde_json::json!({}))).await);
    let e = site
        .create_v_cluster(vc(root, "grpc-vc", serde_json::json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    let before = doc(site
        .get_v_cluster(authed(pb::VClusterRef { name: "grpc-vc".into() }, alice))
        .await);
    let depth = before["backfill_depth"].as_u64().expect("a backfill depth") + 5;
    let changed = doc(site
        .configure_v_cluster(vc(root, "grpc-vc", serde_json::json!({ "backfill_depth": depth })))
        .await);
    let (_, rest_vc) = rest("GET", format!("{base}/v1/vclusters/grpc-vc"), alice, None).await;
    assert_eq!(same(&changed), same(&rest_vc));
    assert_eq!(changed["backfill_depth"].as_u64(), Some(depth), "{changed}");
    // The administrative log records it; a User may not read it.
    let log = doc(site.admin_log(authed(pb::Empty {}, root)).await);
    let (_, rest_log) = rest("GET", format!("{base}/api/v1/admin/log"), root, None).await;
    assert_eq!(same(&log), same(&rest_log));
    assert!(log.to_string().contains("grpc-vc"), "{log}");
    assert_eq!(
        site.admin_log(authed(pb::Empty {}, alice)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    // Restores and membership: SystemAdmin only; a missing backup is refused naming `path`, and
    // nothing is staged.
    let restore = |who: &str, path: &str| authed(pb::RestoreRequest { path: path.into() }, who);
    assert_eq!(
        site.restore(restore(alice, "/nope")).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let e = site.restore(restore(root, "/nope/backup.json")).await.unwrap_err();
    assert!(e.message().starts_with("path:"), "{}", e.message());
    assert!(!dir.join("q").join(lattice_runtime::context::RESTORE_PENDING).exists());
    let m = pb::MemberRequest {
        id: 9,
        addr: "127.0.0.1:1".into(),
    };
    assert_eq!(
        site.add_member(authed(m.clone(), alice)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    assert_eq!(
        site.remove_member(authed(m, alice)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let (_, listed) = rest("GET", format!("{base}/v1/nodes"), root, None).await;
    let node0 = listed["nodes"][0]["name"].as_str().unwrap().to_string();
    // Caches, fingerprints and wipes: operators'; the cache list as REST lists it.
    let caches = doc(site.list_cache(authed(pb::CacheListRequest::default(), root)).await);
    let (_, rest_caches) = rest("GET", format!("{base}/v1/cache"), root, None).await;
    assert_eq!(same(&caches), same(&rest_caches));
    let order = pb::CacheOrderRequest {
        image: "prgenv/24.1:v1".into(),
        nodes: vec![node0.clone()],
        ..Default::default()
    };
    assert_eq!(
        site.warm_cache(authed(order.clone(), alice)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let warmed = doc(site.warm_cache(authed(order, root)).await);
    assert_eq!(warmed["nodes"], serde_json::json!([node0.clone()]));
    let fp = authed(
        pb::NodeRequest {
            id: node0.clone(),
            urgent: false,
        },
        alice,
    );
    assert_eq!(
        site.request_fingerprint(fp).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let wipe = pb::WipeRequest {
        node: node0.clone(),
        force: false,
    };
    let e = site.retry_wipe(authed(wipe, root)).await.unwrap_err();
    let (st, _) = rest(
        "POST",
        format!("{base}/v1/nodes/{node0}/wipe"),
        root,
        Some(serde_json::json!({})),
    )
    .await;
    assert_eq!(e.code(), code_of(st), "{e:?}");
    // An urgent drain: the node drains and what runs there is asked to checkpoint (over REST the
    // answer names it); a User drains nothing.
    let mut nodes = pb::node_service_client::NodeServiceClient::connect(url.to_string())
        .await
        .unwrap();
    let urgent = |who: &str| {
        authed(
            pb::NodeRequest {
                id: node0.clone(),
                urgent: true,
            },
            who,
        )
    };
    assert_eq!(
        nodes.drain(urgent(alice)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let n = nodes.drain(urgent(root)).await.unwrap().into_inner();
    assert!(n.state == "draining" || n.state == "drained", "{n:?}");
    nodes
        .undrain(authed(
            pb::NodeRequest {
                id: node0.clone(),
                urgent: false,
            },
            root,
        ))
        .await
        .unwrap();
    // A usage window by dates; an empty one is refused naming `since`.
    let mut admin = pb::admin_service_client::AdminServiceClient::connect(url.to_string())
        .await
        .unwrap();
    let window = |since: &str, until: &str| {
        authed(
            pb::UsageRequest {
                tenant: "physics".into(),
                since: since.into(),
                until: until.into(),
                ..Default::default()
            },
            root,
        )
    };
    let u = admin.usage(window("2026-01-01", "")).await.unwrap().into_inner();
    assert!(u.allocations >= 1, "{u:?}");
    let e = admin.usage(window("2030-01-02", "2030-01-01")).await.unwrap_err();
    assert!(e.message().starts_with("since:"), "{}", e.message());

    // Agents' calls: a user's token is not an agent's.
    let call = pb::AgentCall {
        id: node0.clone(),
        body: Some(lattice_runtime::grpc::json::to_struct(
            serde_json::json!({"running": []}),
        )),
    };
    assert_eq!(
        site.work(authed(call, alice)).await.unwrap_err().code(),
        Code::PermissionDenied
    );
}
