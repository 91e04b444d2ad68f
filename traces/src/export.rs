//! An allocation as the JSONL event log's `alloc` object — the inverse of the reader's submission
//! parsing, for every field a scheduling decision depends on. `workload_to_jsonl` and the runtime's
//! trace capture write submissions with it, so a captured submission replays as the allocation the
//! control plane queued (a property test parses what it writes back to the same spec).

use lattice_engine::{
    AllocSpec, CheckpointKind, CheckpointMechanism, DependencyCondition, Lifecycle, RequeuePolicy, Tier,
};
use serde_json::{Map, Value, json};

/// What a spec's ids stand for, and its other identities.
#[derive(Clone, Debug, Default)]
pub struct SpecNames<'a> {
    pub tenant: &'a str,
    pub project: &'a str,
    pub vcluster: &'a str,
    pub user: Option<&'a str>,
    /// Its dependencies: the ids they refer to, with their conditions.
    pub deps: Vec<(String, DependencyCondition)>,
}

fn tier(t: Tier) -> &'static str {
    match t {
        Tier::Hot => "hot",
        Tier::Warm => "warm",
        Tier::Cold => "cold",
    }
}

fn secs(d: lattice_engine::Duration) -> Value {
    Value::from(d.as_secs_f64())
}

/// The `alloc` object of a `submit` (or the `claim` object of a sensitive claim) for `spec` under
/// `id`. Fields at their defaults are left out. A task group's range is the caller's to add.
pub fn alloc_json(id: &str, spec: &AllocSpec, names: &SpecNames) -> Map<String, Value> {
    let s = spec;
    let mut a = Map::new();
    a.insert("id".into(), Value::from(id));
    a.insert("tenant".into(), Value::from(names.tenant));
    if names.project != "default" {
        a.insert("project".into(), Value::from(names.project));
    }
    if names.vcluster != "default" {
        a.insert("vcluster".into(), Value::from(names.vcluster));
    }
    a.insert(
        "nodes".into(),
        if s.nodes.min == s.nodes.max {
            Value::from(s.nodes.min)
        } else {
            json!({"min": s.nodes.min, "max": s.nodes.max})
        },
    );
    match s.lifecycle {
        Lifecycle::Bounded { walltime } => {
            a.insert("walltime".into(), secs(walltime));
        }
        // A claim without a walltime holds its nodes until released.
        Lifecycle::Unbounded if s.sensitive_claim => {}
        Lifecycle::Unbounded => {
            a.insert("lifecycle".into(), json!({"type": "unbounded"}));
        }
        Lifecycle::Reactive { min_nodes, max_nodes } => {
            let mut l = json!({"type": "reactive", "min_nodes": min_nodes, "max_nodes": max_nodes});
            if let Some(p) = &s.scale {
                l["target"] = Value::from(p.target);
                l["scale_policy"] = json!({
                    "evaluation_interval": secs(p.evaluation_interval),
                    "scale_up_window": secs(p.scale_up_window),
                    "scale_down_window": secs(p.scale_down_window),
                    "cooldown": secs(p.cooldown),
                    "scale_down_threshold": p.scale_down_threshold,
                });
            }
            a.insert("lifecycle".into(), l);
        }
    }
    if s.preemption_class != lattice_engine::PreemptionClass::default() {
        a.insert("priority".into(), Value::from(s.preemption_class.get()));
    }
    if let Some(u) = names.user {
        a.insert("user".into(), Value::from(u));
    }
    let c = &s.constraints;
    if !c.is_empty() || c.require_unified_memory {
        let mut m = Map::new();
        if let Some(t) = &c.gpu_type {
            m.insert("gpu_type".into(), Value::from(t.as_str()));
        }
        for (k, v) in [
            ("gpu_count", c.gpu_count),
            ("cpu_cores", c.cpu_cores),
            ("memory_gb", c.memory_gb),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), Value::from(v));
            }
        }
        if !c.features.is_empty() {
            m.insert(
                "features".into(),
                Value::from(c.features.iter().cloned().collect::<Vec<_>>()),
            );
        }
        if c.require_unified_memory {
            m.insert("require_unified_memory".into(), Value::from(true));
        }
        if let Some(t) = c.topology {
            m.insert("topology".into(), Value::from(t.as_str()));
        }
        a.insert("constraints".into(), Value::Object(m));
    }
    let k = &s.checkpoint;
    if k.kind != CheckpointKind::None || k.estimated_minutes.is_some() || k.mechanism != CheckpointMechanism::Signal {
        let mut m = Map::new();
        let strategy = match k.kind {
            CheckpointKind::Auto => "auto",
            CheckpointKind::Manual => "manual",
            CheckpointKind::None => "none",
        };
        m.insert("strategy".into(), Value::from(strategy));
        if let Some(x) = k.estimated_minutes {
            m.insert("estimated_minutes".into(), Value::from(x));
        }
        if k.mechanism != CheckpointMechanism::Signal {
            let mech = match k.mechanism {
                CheckpointMechanism::Signal => "signal",
                CheckpointMechanism::Shmem => "shmem",
                CheckpointMechanism::Grpc => "grpc",
                CheckpointMechanism::Dmtcp => "dmtcp",
            };
            m.insert("mechanism".into(), Value::from(mech));
        }
        a.insert("checkpoint".into(), Value::Object(m));
    }
    if !names.deps.is_empty() {
        let deps: Vec<Value> = names
            .deps
            .iter()
            .map(|(r, cond)| {
                let c = match cond {
                    DependencyCondition::Success => "success",
                    DependencyCondition::Failure => "failure",
                    DependencyCondition::Any => "any",
                };
                json!({"ref": r, "condition": c})
            })
            .collect();
        a.insert("depends_on".into(), Value::from(deps));
    }
    if let Some(g) = s.storage_gbps {
        a.insert("storage_gbps".into(), Value::from(g));
    }
    if s.requeue != RequeuePolicy::default() {
        let r = match s.requeue {
            RequeuePolicy::Never => "never",
            RequeuePolicy::OnNodeFailure => "on_node_failure",
            RequeuePolicy::Always => "always",
        };
        a.insert("requeue".into(), Value::from(r));
    }
    if s.max_requeues != lattice_engine::alloc::DEFAULT_MAX_REQUEUES {
        a.insert("max_requeues".into(), Value::from(s.max_requeues));
    }
    if let Some(m) = &s.mutex {
        a.insert("mutex".into(), Value::from(m.as_str()));
    }
    if let Some(d) = &s.network_domain {
        a.insert("connectivity".into(), json!({"network_domain": d}));
    }
    if !s.data.is_empty() {
        let mounts: Vec<Value> = s
            .data
            .iter()
            .map(|m| {
                json!({"source": m.source, "size_gb": m.size_gb, "tier": tier(m.tier), "tier_hint": tier(m.tier_hint)})
            })
            .collect();
        a.insert("data".into(), json!({ "mounts": mounts }));
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_engine::{
        CheckpointSpec, Constraints, DataMount, Duration, NodeRange, PreemptionClass, ProjectId, ScalePolicy, TenantId,
        VClusterId,
    };
    use proptest::prelude::*;

    fn tier() -> impl Strategy<Value = Tier> {
        prop_oneof![Just(Tier::Hot), Just(Tier::Warm), Just(Tier::Cold)]
    }

    /// Any spec a submission can ask for (with the registries' first ids: tenant `t`, project `p`,
    /// vCluster `v`).
    fn spec() -> impl Strategy<Value = AllocSpec> {
        let lifecycle = prop_oneof![
            (1u64..31_622_400_000).prop_map(|w| (Lifecycle::Bounded { walltime: Duration(w) }, None)),
            Just((Lifecycle::Unbounded, None)),
            (
                1u32..8,
                0u32..8,
                1u32..10_000,
                1u64..3_600,
                1u64..3_600,
                1u64..3_600,
                1u64..3_600,
                1u32..100
            )
                .prop_map(|(min, extra, target, e, up, down, cool, thr)| {
                    let mut p = ScalePolicy::with_target(target as f64 / 10.0);
                    p.evaluation_interval = Duration(e * 1000);
                    p.scale_up_window = Duration(up * 1000);
                    p.scale_down_window = Duration(down * 500);
                    p.cooldown = Duration(cool * 250);
                    p.scale_down_threshold = thr as f64 / 100.0;
                    (
                        Lifecycle::Reactive {
                            min_nodes: min,
                            max_nodes: min + extra,
                        },
                        Some(p),
                    )
                }),
        ];
        let checkpoint = (0u8..3, proptest::option::of(1u32..600), 0u8..4).prop_map(|(k, m, mech)| CheckpointSpec {
            kind: [CheckpointKind::None, CheckpointKind::Auto, CheckpointKind::Manual][k as usize],
            estimated_minutes: m.map(|m| m as f64 / 4.0),
            mechanism: [
                CheckpointMechanism::Signal,
                CheckpointMechanism::Shmem,
                CheckpointMechanism::Grpc,
                CheckpointMechanism::Dmtcp,
            ][mech as usize],
        });
        let constraints = (
            proptest::option::of("[A-Z][A-Z0-9]{1,5}"),
            proptest::option::of(1u32..9),
            proptest::option::of(1u32..256),
            proptest::option::of(1u32..2048),
            proptest::collection::btree_set("[a-z]{2,6}", 0..3),
            any::<bool>(),
            proptest::option::of(prop_oneof![
                Just(lattice_engine::TopologyHint::Tight),
                Just(lattice_engine::TopologyHint::Any)
            ]),
        )
            .prop_map(
                |(gpu_type, gpu_count, cpu_cores, memory_gb, features, um, topology)| Constraints {
                    gpu_type,
                    gpu_count,
                    cpu_cores,
                    memory_gb,
                    features,
                    require_unified_memory: um,
                    topology,
                },
            );
        let data = proptest::collection::vec(
            ("[a-z/]{1,12}", 0u32..100_000, tier(), tier()).prop_map(|(source, gb, t, h)| DataMount {
                source,
                size_gb: gb as f64 / 8.0,
                tier: t,
                tier_hint: h,
            }),
            0..3,
        );
        (
            (1u32..64, 0u32..4, lifecycle, 0u8..=10, checkpoint, constraints),
            (
                proptest::option::of(1u32..400),
                0u8..3,
                0u32..=100,
                proptest::option::of("[a-z]{1,8}"),
                data,
                any::<bool>(),
            ),
        )
            .prop_map(
                |(
                    (min, extra, (lifecycle, scale), class, checkpoint, constraints),
                    (gbps, rq, maxrq, mutex, data, claim),
                )| {
                    let nodes = match lifecycle {
                        Lifecycle::Reactive { min_nodes, max_nodes } => NodeRange {
                            min: min_nodes,
                            max: max_nodes,
                        },
                        _ => NodeRange { min, max: min + extra },
                    };
                    AllocSpec {
                        tenant: TenantId(0),
                        project: ProjectId(0),
                        vcluster: VClusterId(0),
                        nodes,
                        constraints,
                        lifecycle,
                        preemption_class: PreemptionClass::new(class).unwrap(),
                        checkpoint,
                        depends_on: Vec::new(),
                        task_group: None,
                        storage_gbps: gbps.map(|g| g as f64 / 4.0),
                        sensitive_claim: claim,
                        requeue: [
                            RequeuePolicy::Never,
                            RequeuePolicy::OnNodeFailure,
                            RequeuePolicy::Always,
                        ][rq as usize],
                        max_requeues: maxrq,
                        // Some requests name a network domain (derived: the strategy tuple is full).
                        network_domain: mutex.as_ref().map(|m| format!("net-{m}")),
                        mutex,
                        scale: scale.map(Box::new),
                        data,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// What `alloc_json` writes, the reader reads back as the same spec.
        #[test]
        fn a_written_allocation_reads_back_as_the_same_spec(spec in spec(), project in any::<bool>()) {
            let names = SpecNames {
                tenant: "t",
                project: if project { "p" } else { "default" },
                vcluster: "v",
                user: Some("u"),
                deps: Vec::new(),
            };
            let a = alloc_json("x", &spec, &names);
            let line = if spec.sensitive_claim {
                json!({"ts": 0, "type": "claim", "claim": a})
            } else {
                json!({"ts": 0, "type": "submit", "alloc": a})
            };
            let w = crate::parse_jsonl("w.jsonl", &line.to_string());
            prop_assert_eq!(w.skipped_total(), 0, "{:?} from {}", w.problems, line);
            let j = &w.jobs[0];
            prop_assert_eq!(&*j.spec, &spec, "{}", line);
            prop_assert_eq!(j.user(), Some("u"));
            prop_assert_eq!(w.project_name(&j.spec), names.project);
        }
    }

    #[test]
    fn dependencies_name_their_allocations() {
        let mut spec = AllocSpec::simple(TenantId(0), VClusterId(0), 2, Duration::from_hours(1));
        spec.checkpoint = CheckpointSpec::default();
        let text = [
            json!({"ts": 0, "type": "submit", "alloc": alloc_json("a", &spec, &SpecNames { tenant: "t", project: "default", vcluster: "default", ..Default::default() })}),
            json!({"ts": 1, "type": "submit", "alloc": alloc_json("b", &spec, &SpecNames {
                tenant: "t", project: "default", vcluster: "default",
                deps: vec![("a".into(), DependencyCondition::Failure)], ..Default::default()
            })}),
        ]
        .map(|v| v.to_string())
        .join("\n");
        let w = crate::parse_jsonl("w.jsonl", &text);
        assert_eq!(w.jobs[1].deps, [(0, DependencyCondition::Failure)]);
    }
}
