//! Services and reactive autoscaling (book: "Autoscaling").

mod common;
use common::*;
use lattice_sim::{SimConfig, SimResult, simulate};
use lattice_traces::parse_jsonl;

fn replay(text: &str, n: u32, cfg: SimConfig) -> SimResult {
    let w = parse_jsonl("t.jsonl", text);
    assert!(w.problems.is_empty(), "{:?}", w.problems);
    simulate(&w, &nodes(n), &cfg, &mut |_, _| {}).unwrap()
}

fn checked() -> SimConfig {
    SimConfig {
        check_invariants: true,
        ..SimConfig::default()
    }
}

const SERVICE: &str = r#"{"ts": 0, "type": "submit", "alloc": {"id": "svc", "nodes": 1, "lifecycle": {"type": "reactive", "scale_policy": {"min": 2, "max": 4, "metric": "gpu_utilization", "target": 0.8}}}}
"#;

fn metrics(samples: &[(u64, f64)]) -> String {
    samples
        .iter()
        .map(|(t, v)| format!("{{\"ts\": {t}, \"type\": \"metric\", \"alloc_id\": \"svc\", \"value\": {v}}}\n"))
        .collect()
}

/// Starts at min_nodes; metric above target for the 2-minute window → +1 node at the next evaluation;
/// cooldown (3 min) before the next step; capped at max_nodes.
#[test]
fn scales_up_one_node_at_a_time_with_cooldown_and_max() {
    let samples: Vec<(u64, f64)> = (0..40).map(|i| (i * 30, 0.95)).collect();
    let r = replay(&format!("{SERVICE}{}", metrics(&samples)), 8, checked());
    // 2 → 3 → 4, then max_nodes.
    assert_eq!(r.summary.scale_ups, 2);
    assert_eq!(r.summary.scale_downs, 0);
    assert_eq!(r.jobs[0].nodes, 4);
    assert_eq!(r.summary.services, 1);
    assert_eq!(r.summary.oscillation_alerts, 0, "monotone growth is no oscillation");
}

/// A load that swings every 10 minutes (4 min hot, 6 min idle) makes the service scale up and down in
/// turn; after more than five alternations in a row the autoscaler raises an oscillation alert.
#[test]
fn alternating_scale_events_raise_an_oscillation_alert() {
    let samples: Vec<(u64, f64)> = (0..200)
        .map(|i| {
            let t = i * 30;
            (t, if t % 600 < 240 { 0.95 } else { 0.1 })
        })
        .collect();
    let r = replay(&format!("{SERVICE}{}", metrics(&samples)), 8, checked());
    assert!(
        r.summary.scale_ups >= 5 && r.summary.scale_downs >= 5,
        "{:?}",
        (r.summary.scale_ups, r.summary.scale_downs)
    );
    assert!(r.summary.oscillation_alerts >= 1);
    // Fewer swings (the first 25 minutes: at most six events, five alternations) raise no alert.
    let r = replay(&format!("{SERVICE}{}", metrics(&samples[..50])), 8, checked());
    let events = r.summary.scale_ups + r.summary.scale_downs;
    assert!((4..=6).contains(&events), "{events}");
    assert_eq!(r.summary.oscillation_alerts, 0);
}

/// Low metric (< 0.5 × target) for the 5-minute window scales down, never below min_nodes.
#[test]
fn scales_down_to_min_only() {
    let mut samples: Vec<(u64, f64)> = (0..20).map(|i| (i * 30, 0.95)).collect();
    samples.extend((20..80).map(|i| (i * 30, 0.1)));
    let r = replay(&format!("{SERVICE}{}", metrics(&samples)), 8, checked());
    assert!(r.summary.scale_ups >= 1);
    assert_eq!(r.summary.scale_downs, r.summary.scale_ups, "back to min_nodes");
    assert_eq!(r.jobs[0].nodes, 2);
}

/// No metric, no action.
#[test]
fn no_metric_no_scaling() {
    let text = format!(
        "{SERVICE}{{\"ts\": 3600, \"type\": \"submit\", \"alloc\": {{\"id\": \"x\", \"nodes\": 1, \"walltime\": 10}}}}\n"
    );
    let r = replay(&text, 8, checked());
    assert_eq!((r.summary.scale_ups, r.summary.scale_downs), (0, 0));
    assert_eq!(r.jobs[0].nodes, 2);
    assert_eq!(r.summary.service_availability, 1.0);
}

/// A metric that stops coming (the TSDB down): the evaluations after it went stale decide nothing and
/// are counted (production's `lattice_autoscaling_metric_query_failures_total`); while it was fresh,
/// none were.
#[test]
fn a_metric_that_stops_is_counted_and_decides_nothing() {
    let samples: Vec<(u64, f64)> = (0..10).map(|i| (i * 30, 0.5)).collect();
    let text = format!(
        "{SERVICE}{}{{\"ts\": 3600, \"type\": \"submit\", \"alloc\": {{\"id\": \"x\", \"nodes\": 1, \"walltime\": 10}}}}\n",
        metrics(&samples)
    );
    let r = replay(&text, 8, checked());
    assert_eq!((r.summary.scale_ups, r.summary.scale_downs), (0, 0));
    // Samples to 270 s, stale 3 intervals (180 s) later: evaluations every 60 s from then to the end.
    assert!(
        (40..=60).contains(&r.summary.scale_metric_unavailable),
        "{}",
        r.summary.scale_metric_unavailable
    );
    let fresh = replay(&format!("{SERVICE}{}", metrics(&samples)), 8, checked());
    assert_eq!(
        fresh.summary.scale_metric_unavailable, 0,
        "a trace that ends with its metric"
    );
}

/// Scale-up respects the tenant's hard max_nodes: a no-op, not an error.
#[test]
fn scale_up_respects_tenant_max_nodes() {
    let samples: Vec<(u64, f64)> = (0..40).map(|i| (i * 30, 0.95)).collect();
    let mut cfg = checked();
    cfg.tenants = [(
        "default".to_string(),
        lattice_engine::TenantQuota {
            max_nodes: Some(3),
            ..Default::default()
        },
    )]
    .into();
    let r = replay(&format!("{SERVICE}{}", metrics(&samples)), 8, cfg);
    assert_eq!(r.jobs[0].nodes, 3);
    assert!(r.summary.scale_blocked >= 1);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Whatever the metric does, the service stays within [min_nodes, max_nodes] and under the
        /// tenant's hard max_nodes (the invariant checker recounts it at every event).
        #[test]
        fn scaling_stays_within_bounds(values in prop::collection::vec(0.0f64..1.5, 1..80), cap in 2u32..6) {
            let samples: Vec<(u64, f64)> = values.iter().enumerate().map(|(i, v)| (i as u64 * 45, *v)).collect();
            let mut cfg = checked();
            cfg.tenants = [("default".to_string(), lattice_engine::TenantQuota { max_nodes: Some(cap), ..Default::default() })].into();
            let r = replay(&format!("{SERVICE}{}", metrics(&samples)), 8, cfg);
            let n = r.jobs[0].nodes;
            prop_assert!((2..=4).contains(&n) && n <= cap.max(2), "{} nodes, cap {}", n, cap);
        }
    }
}

/// A synthetic load curve instead of metric samples: demand swings between 1 and 5 nodes over a 2-hour
/// period; the service (2..6 nodes) follows it up to the peak demand and back down to min_nodes, one
/// node per step, never beyond max. Same seed, same scaling; the noise draws from the seed.
#[test]
fn synthetic_load_curve_drives_scaling() {
    let svc = r#"{"ts": 0, "type": "submit", "alloc": {"id": "svc", "nodes": 1, "lifecycle": {"type": "reactive", "scale_policy": {"min": 2, "max": 6, "metric": "load", "target": 0.8}}}}
{"ts": 0, "type": "load_curve", "alloc_id": "svc", "base": 3, "amplitude": 2, "period": "2h", "interval": "30s", "duration": "4h", "noise": 0.2}
"#;
    let r = replay(svc, 8, checked());
    assert!(r.summary.scale_ups >= 2, "{}", r.summary.scale_ups);
    assert!(r.summary.scale_downs >= 2, "{}", r.summary.scale_downs);
    assert!(r.jobs[0].nodes <= 6);
    let again = replay(svc, 8, checked());
    assert_eq!(
        (again.summary.scale_ups, again.summary.scale_downs),
        (r.summary.scale_ups, r.summary.scale_downs)
    );
    // A flat demand of 2 nodes at the target never scales.
    let flat = svc
        .replace(r#""amplitude": 2"#, r#""amplitude": 0"#)
        .replace(r#""base": 3"#, r#""base": 2"#)
        .replace(r#""noise": 0.2"#, r#""noise": 0"#);
    let r = replay(&flat, 8, checked());
    assert_eq!((r.summary.scale_ups, r.summary.scale_downs), (0, 0));
}

/// A malformed load curve is reported with its line and field, and the rest of the trace still replays.
#[test]
fn malformed_load_curve_is_reported() {
    let text = format!(
        "{SERVICE}{{\"ts\": 0, \"type\": \"load_curve\", \"alloc_id\": \"svc\", \"base\": -1, \"duration\": \"1h\"}}\n{{\"ts\": 0, \"type\": \"load_curve\", \"alloc_id\": \"svc\", \"base\": 1}}\n"
    );
    let w = parse_jsonl("t.jsonl", &text);
    assert_eq!(w.problems.len(), 2, "{:?}", w.problems);
    let msgs: Vec<String> = w.problems.iter().map(|p| p.to_string()).collect();
    assert!(msgs[0].contains(":2:") && msgs[0].contains("base"), "{}", msgs[0]);
    assert!(msgs[1].contains(":3:") && msgs[1].contains("duration"), "{}", msgs[1]);
    assert_eq!(w.jobs.len(), 1);
}
