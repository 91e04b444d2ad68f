//! The wire as both sides see it: the JSON a control plane sends and an agent reads (and back) is
//! pinned byte for byte, so changing an attribute of a shared type is seen here; what either side
//! must refuse or tolerate is checked too.

use lattice_agent_protocol::*;
use serde_json::json;

fn launch() -> Launch {
    Launch {
        id: "a-000007[2]".into(),
        entrypoint: "sleep 5".into(),
        nodes: vec!["n1".into(), "n2".into()],
        task_index: 1,
        walltime_s: Some(60.0),
        tenant: "physics".into(),
        user: None,
        project: Some("qcd".into()),
        checkpoint: "grpc".into(),
        checkpoint_port: Some(9999),
        vni: None,
        cxi_auth_key: None,
        restart_from_s: None,
        task_group: Some(TaskGroup {
            group: "a-000007".into(),
            index: 2,
            concurrency: Some(4),
        }),
        uenv: None,
        uenv_view: None,
        tools_uenv: None,
        uenv_sign_required: false,
        sensitive: false,
        image: Some("busybox:1.36".into()),
        launch_token: None,
        agents: Default::default(),
        mounts: vec![DataMount {
            source: "/vast/p".into(),
            target: "/data".into(),
            read_only: true,
        }],
        data_defaults: true,
        checkpoints: false,
        liveness_probe: None,
    }
}

#[test]
fn a_poll_answer_is_pinned_byte_for_byte() {
    let work = Work {
        launch: vec![launch()],
        kill: vec!["a-000001".into()],
        tasks: vec![TaskLaunch {
            launch_id: "l-1".into(),
            alloc: "a-000007".into(),
            entrypoint: "./app".into(),
            env: vec![],
            world_size: 2,
            node_index: 0,
            peers: vec![TaskPeer {
                node: "n1".into(),
                address: None,
                first_rank: 0,
                num_ranks: 2,
            }],
            token: "t".into(),
            fence_timeout_s: None,
        }],
        ..Work::default()
    };
    let text = serde_json::to_string(&work).unwrap();
    assert_eq!(
        text,
        r#"{"launch":[{"id":"a-000007[2]","entrypoint":"sleep 5","nodes":["n1","n2"],"task_index":1,"walltime_s":60.0,"tenant":"physics","user":null,"project":"qcd","checkpoint":"grpc","checkpoint_port":9999,"vni":null,"cxi_auth_key":null,"restart_from_s":null,"task_group":{"group":"a-000007","index":2,"concurrency":4},"image":"busybox:1.36","mounts":[{"source":"/vast/p","target":"/data","read_only":true}],"data_defaults":true,"checkpoints":false}],"kill":["a-000001"],"checkpoint":[],"preempt":[],"wipe":[],"tail":[],"refresh_fingerprint":false,"tasks":[{"launch_id":"l-1","alloc":"a-000007","entrypoint":"./app","env":[],"world_size":2,"node_index":0,"peers":[{"node":"n1","address":null,"first_rank":0,"num_ranks":2}],"token":"t"}]}"#
    );
    assert_eq!(serde_json::from_str::<Work>(&text).unwrap(), work);
}

#[test]
fn an_agent_reads_a_minimal_launch_with_the_defaults() {
    let l: Launch = serde_json::from_value(json!({
        "id": "a-1", "entrypoint": "true", "nodes": ["n"], "task_index": 0,
        "walltime_s": null, "tenant": "t", "user": null,
        // A mechanism this agent does not know does not refuse the whole poll.
        "checkpoint": "criu-next",
        "some_future_field": 1,
    }))
    .unwrap();
    assert_eq!(l.checkpoint, "criu-next");
    assert!(l.data_defaults, "default mounts unless refused");
    assert!(l.mounts.is_empty() && l.task_group.is_none() && l.liveness_probe.is_none());
    let l: Launch = serde_json::from_value(json!({
        "id": "a-1", "entrypoint": "true", "nodes": ["n"], "task_index": 0,
        "walltime_s": null, "tenant": "t", "user": null,
    }))
    .unwrap();
    assert_eq!(l.checkpoint, "signal");
}

#[test]
fn reports_omit_what_is_absent_and_refuse_unknown_fields() {
    let end = TaskEnd {
        launch_id: "l-1".into(),
        alloc: "a-1".into(),
        ranks: vec![RankEnd {
            rank: 0,
            code: 0,
            ..RankEnd::default()
        }],
        reason: None,
    };
    assert_eq!(
        serde_json::to_string(&end).unwrap(),
        r#"{"launch_id":"l-1","alloc":"a-1","ranks":[{"rank":0,"code":0,"stdout":"","stderr":""}]}"#
    );
    let out: Output = serde_json::from_value(json!({"id": "a-1", "offset": 0, "next": 3, "data": "abc"})).unwrap();
    assert_eq!(out.stream, Stream::Stdout);
    for bad in [
        json!({"id": "a-1", "offset": 0, "next": 3, "data": "abc", "x": 1}),
        json!({"id": "a-1", "stream": "stdlog", "offset": 0, "next": 3, "data": "abc"}),
    ] {
        assert!(serde_json::from_value::<Output>(bad.clone()).is_err(), "{bad}");
    }
    assert!(serde_json::from_value::<Outcome>(json!({"id": "a", "ok": true, "why": ""})).is_err());
    assert_eq!(
        serde_json::to_string(&ExitKind::WalltimeCheckpoint).unwrap(),
        r#""walltime_checkpoint""#
    );
    assert_eq!(
        serde_json::to_string(&Buffered { seq: 3, at_ms: 9 }).unwrap(),
        r#"{"seq":3,"at_ms":9}"#
    );
}

#[test]
fn names_follow_the_rules_both_sides_apply() {
    let (rel, file) = uenv_layout("prgenv-gnu/24.11:v1").unwrap();
    assert_eq!(rel, std::path::Path::new("prgenv-gnu/24.11/v1"));
    assert_eq!(file, "prgenv-gnu_24.11_v1.squashfs");
    assert_eq!(uenv_layout("tool/1").unwrap().1, "tool_1_latest.squashfs");
    for bad in ["", "../etc/x", "a//b", "a/.b", "a/b:", "a b/c"] {
        assert_eq!(uenv_layout(bad), Err(BadUenvName(bad.into())), "{bad}");
    }
    assert_eq!(parse_image_ref("busybox").unwrap(), ("busybox".into(), "latest".into()));
    assert_eq!(
        parse_image_ref("busybox:1.36").unwrap(),
        ("busybox".into(), "1.36".into())
    );
    for bad in ["", "..", "a/b", "x:", ":y", "a:b:c"] {
        let e = parse_image_ref(bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("image {bad:?}: expected NAME[:TAG] (letters, digits, . _ -)")
        );
    }
    assert_eq!(valid_target("/data/in"), Ok(()));
    for bad in ["data", "/", "/data/../etc", "/./data", "/etc/x", "/proc", "/usr/local"] {
        assert!(valid_target(bad).is_err(), "{bad}");
    }
}

/// The bodies an agent sends, as JSON values (keys sorted: the bytes agents have always sent).
#[test]
fn the_bodies_an_agent_sends_are_pinned_and_read_back() {
    let text = |v: &dyn erased::Ser| v.json();
    let poll = WorkPoll {
        running: vec!["a-1".into()],
        output: vec![Output {
            id: "a-1".into(),
            stream: Stream::Stderr,
            offset: 0,
            next: 2,
            data: "hi".into(),
        }],
        cache: Some(vec![]),
        collection_overhead_pct: Some(0.5),
        ..WorkPoll::default()
    };
    assert_eq!(
        text(&poll),
        r#"{"cache":[],"collection_overhead_pct":0.5,"output":[{"data":"hi","id":"a-1","next":2,"offset":0,"stream":"stderr"}],"running":["a-1"]}"#
    );
    assert_eq!(text(&WorkPoll::default()), r#"{"running":[]}"#);
    assert_eq!(
        text(&HeartbeatBody {
            seq: 7,
            buffered: vec![],
            rtt_ms: None
        }),
        r#"{"seq":7}"#
    );
    let exit = ExitReport {
        node: "n1".into(),
        kind: ExitKind::Exited,
        exit_code: 3,
        log_tail: Some(String::new()),
        err_tail: Some("boom".into()),
    };
    assert_eq!(
        text(&exit),
        r#"{"err_tail":"boom","exit_code":3,"kind":"exited","log_tail":"","node":"n1"}"#
    );
    assert_eq!(
        text(&RegisterBody::default()),
        r#"{"capabilities":null,"fingerprint":null}"#
    );
    // The control plane reads them back, and refuses what it does not know.
    let back: WorkPoll = serde_json::from_str(&text(&poll)).unwrap();
    assert_eq!(back, poll);
    assert!(serde_json::from_str::<HeartbeatBody>(r#"{"seq":1,"beats":[]}"#).is_err());
    assert!(serde_json::from_str::<ExitReport>(r#"{"node":"n","kind":"vanished"}"#).is_err());
    let minimal: ExitReport = serde_json::from_str(r#"{"node":"n","kind":"fenced"}"#).unwrap();
    assert_eq!((minimal.exit_code, minimal.log_tail), (0, None));
}

mod erased {
    /// A body as the agent sends it: through `serde_json::Value` (whose map sorts its keys).
    pub trait Ser {
        fn json(&self) -> String;
    }

    impl<T: serde::Serialize> Ser for T {
        fn json(&self) -> String {
            serde_json::to_value(self).unwrap().to_string()
        }
    }
}
