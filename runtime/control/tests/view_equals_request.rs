//! What the API accepts is what it stores: for generated requests (sent as the JSON a client
//! sends), the allocation's view shows every field as it was submitted.

use lattice_control::{Control, SubmitRequest};
use proptest::prelude::*;
use serde_json::{Value, json};

fn control() -> Control {
    let nodes = (0..8)
        .map(|i| {
            let mut n = lattice_engine::NodeSpec::plain(format!("n{i}"));
            let c = &mut n.capabilities;
            c.gpu_type = Some("H100".into());
            c.gpu_count = 4;
            c.cpu_cores = 64;
            c.memory_gb = 512;
            c.unified_memory = true;
            c.features = ["nvme_scratch".to_string()].into();
            n
        })
        .collect();
    let inv = lattice_traces::Inventory {
        nodes,
        ..Default::default()
    };
    Control::new(&inv, Default::default(), &Default::default(), None).unwrap()
}

fn request() -> impl Strategy<Value = Value> {
    (
        1u32..=8,
        1u64..=86_400,
        0i64..=9,
        prop_oneof![Just("never"), Just("on_node_failure"), Just("always")],
        0i64..=100,
        proptest::option::of("[a-z]{1,8}"),
        proptest::option::of(0u32..=4000).prop_map(|g| g.map(|x| f64::from(x) / 4.0)),
        (
            proptest::option::of(1u32..=4),
            proptest::option::of(1u32..=64),
            proptest::option::of(1u32..=512),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(prop_oneof![Just("tight"), Just("any")]),
        ),
        proptest::collection::btree_map("[a-z]{1,6}", "[a-z0-9]{1,6}", 0..3),
    )
        .prop_map(|(nodes, secs, class, requeue, max_requeues, mutex, gbps, c, tags)| {
            let (gpu_count, cpu_cores, memory_gb, nvme, unified, topology) = c;
            let mut constraints = json!({"gpu_type": "H100"});
            if let Some(g) = gpu_count {
                constraints["gpu_count"] = json!(g);
            }
            if let Some(x) = cpu_cores {
                constraints["cpu_cores"] = json!(x);
            }
            if let Some(m) = memory_gb {
                constraints["memory_gb"] = json!(m);
            }
            if nvme {
                constraints["features"] = json!(["nvme_scratch"]);
            }
            if unified {
                constraints["require_unified_memory"] = json!(true);
            }
            if let Some(t) = topology {
                constraints["topology"] = json!(t);
            }
            let mut r = json!({
                "tenant": "physics",
                "entrypoint": "true",
                "resources": {"nodes": nodes, "constraints": constraints},
                "lifecycle": {"walltime": secs.to_string()},
                "preemption_class": class,
                "requeue": requeue,
                "max_requeues": max_requeues,
                "tags": tags,
            });
            if let Some(m) = mutex {
                r["mutex"] = json!(m);
            }
            if let Some(g) = gbps {
                r["storage_gbps"] = json!(g);
            }
            r
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_view_shows_what_was_submitted(body in request()) {
        let mut c = control();
        let req: SubmitRequest = serde_json::from_value(body.clone()).unwrap();
        let id = c.submit(req).unwrap();
        let v = serde_json::to_value(c.view_named(&id).unwrap()).unwrap();
        prop_assert_eq!(&v["requested_nodes"], &body["resources"]["nodes"]);
        let secs: f64 = body["lifecycle"]["walltime"].as_str().unwrap().parse().unwrap();
        prop_assert_eq!(v["walltime_s"].as_f64(), Some(secs));
        prop_assert_eq!(&v["preemption_class"], &body["preemption_class"]);
        prop_assert_eq!(&v["requeue"], &body["requeue"]);
        prop_assert_eq!(&v["max_requeues"], &body["max_requeues"]);
        prop_assert_eq!(&v["mutex"], &body.get("mutex").cloned().unwrap_or(Value::Null));
        prop_assert_eq!(&v["storage_gbps"], &body.get("storage_gbps").cloned().unwrap_or(Value::Null));
        prop_assert_eq!(&v["tags"], &body["tags"]);
        // The constraints as sent (keys not sent are absent or at their empty value).
        let sent = body["resources"]["constraints"].as_object().unwrap();
        let shown = v["constraints"].as_object().unwrap();
        for (k, x) in sent {
            prop_assert_eq!(&shown[k], x, "{}", k);
        }
        for (k, x) in shown.iter().filter(|(k, _)| !sent.contains_key(*k)) {
            prop_assert!(x.is_null() || *x == json!([]) || *x == json!(false), "{} = {}", k, x);
        }
    }
}

/// A topology hint other than `tight` or `any` is refused naming the field, and nothing is queued.
#[test]
fn an_unknown_topology_hint_is_refused_naming_it() {
    let mut c = control();
    let body = json!({"tenant": "physics", "entrypoint": "true", "lifecycle": {"walltime": "60"},
                      "resources": {"nodes": 1, "constraints": {"topology": "compact"}}});
    let req: SubmitRequest = serde_json::from_value(body).unwrap();
    let e = c.submit(req).unwrap_err();
    assert_eq!(e.field, "resources.constraints.topology", "{}", e.message);
    assert!(e.message.contains("`tight` or `any`"), "{}", e.message);
    assert!(c.list().is_empty(), "nothing queued");
}
