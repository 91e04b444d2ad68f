//! Per-allocation observability read back from the TSDB the agents push to (book: "User-Facing
//! Observability"): the metrics snapshot of `GET /v1/allocations/{id}/metrics` (`lattice top ID`),
//! the relative-time comparison of `GET /v1/compare` (`lattice compare`), and the network and
//! storage diagnostics of `GET /v1/allocations/{id}/diagnostics` (`lattice diag ID --network`,
//! `--storage`), which join what the control plane knows (nodes and their dragonfly groups, the
//! network domain and VNI, declared mounts and the storage QoS asked for) with what was measured.
//!
//! The metrics are the agents' own series (`lattice_alloc_*` by `alloc` and `node`,
//! `lattice_gpu_*` by `node` and `gpu`), queried with PromQL through [`lattice_adapters::tsdb`].

use lattice_adapters::tsdb::Tsdb;
use lattice_control::{AllocationView, DiagnosticsFacts};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// How a metric's per-node values make its allocation-wide value.
#[derive(Clone, Copy, PartialEq)]
enum Combine {
    Sum,
    Mean,
}

/// Where a metric's series are found: by the allocation's label, or by its nodes (GPU series).
#[derive(Clone, Copy, PartialEq)]
enum Scope {
    Alloc,
    Nodes,
}

/// One metric the API offers: its name, unit, the PromQL for one node's value (`{sel}` is the
/// series selector, `{w}` the window) and how nodes combine.
struct Def {
    name: &'static str,
    unit: &'static str,
    scope: Scope,
    per_node: &'static str,
    combine: Combine,
}

const DEFS: [Def; 8] = [
    Def {
        name: "cpu_cores",
        unit: "cores",
        scope: Scope::Alloc,
        per_node: "sum by (node) (rate(lattice_alloc_cpu_seconds_total{sel}[{w}]))",
        combine: Combine::Sum,
    },
    Def {
        name: "processes",
        unit: "processes",
        scope: Scope::Alloc,
        per_node: "sum by (node) (max_over_time(lattice_alloc_processes{sel}[{w}]))",
        combine: Combine::Sum,
    },
    Def {
        name: "io_read_bytes",
        unit: "bytes/s",
        scope: Scope::Alloc,
        per_node: "sum by (node) (rate(lattice_alloc_rchar_bytes_total{sel}[{w}]))",
        combine: Combine::Sum,
    },
    Def {
        name: "io_write_bytes",
        unit: "bytes/s",
        scope: Scope::Alloc,
        per_node: "sum by (node) (rate(lattice_alloc_wchar_bytes_total{sel}[{w}]))",
        combine: Combine::Sum,
    },
    Def {
        name: "block_read_bytes",
        unit: "bytes/s",
        scope: Scope::Alloc,
        per_node: "sum by (node) (rate(lattice_alloc_read_bytes_total{sel}[{w}]))",
        combine: Combine::Sum,
    },
    Def {
        name: "block_write_bytes",
        unit: "bytes/s",
        scope: Scope::Alloc,
        per_node: "sum by (node) (rate(lattice_alloc_write_bytes_total{sel}[{w}]))",
        combine: Combine::Sum,
    },
    Def {
        name: "gpu_utilization",
        unit: "percent",
        scope: Scope::Nodes,
        per_node: "avg by (node) (avg_over_time(lattice_gpu_utilization_percent{sel}[{w}]))",
        combine: Combine::Mean,
    },
    Def {
        name: "gpu_memory_used",
        unit: "bytes",
        scope: Scope::Nodes,
        per_node: "sum by (node) (avg_over_time(lattice_gpu_memory_used_bytes{sel}[{w}]))",
        combine: Combine::Sum,
    },
];

/// The metric names `metrics=` may name, with their units.
pub fn catalogue() -> Vec<(&'static str, &'static str)> {
    DEFS.iter().map(|d| (d.name, d.unit)).collect()
}

/// Why an observability request failed.
#[derive(Debug, PartialEq)]
pub enum ObserveError {
    /// 400: a parameter is wrong (its name, and why).
    Bad(&'static str, String),
    /// 503: the TSDB is not configured or did not answer.
    Unavailable(String),
}

/// A PromQL string literal's contents.
fn quoted(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A regular expression matching exactly one of `names` (RE2 metacharacters escaped).
fn one_of(names: &[String]) -> String {
    names
        .iter()
        .map(|n| {
            n.chars()
                .map(|c| {
                    if "\\.+*?()|[]{}^$".contains(c) {
                        format!("\\{c}")
                    } else {
                        c.to_string()
                    }
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The PromQL for `def` on allocation `alloc` (on `nodes` for node-scoped series) over `window_s`.
fn promql(def: &Def, alloc: &str, nodes: &[String], window_s: f64) -> Option<String> {
    let sel = match def.scope {
        Scope::Alloc => format!("{{alloc=\"{}\"}}", quoted(alloc)),
        Scope::Nodes if nodes.is_empty() => return None,
        Scope::Nodes => format!("{{node=~\"{}\"}}", quoted(&one_of(nodes))),
    };
    let w = format!("{}ms", (window_s * 1000.0).round().max(1000.0) as u64);
    Some(def.per_node.replace("{sel}", &sel).replace("{w}", &w))
}

fn unavailable(e: impl std::fmt::Display) -> ObserveError {
    ObserveError::Unavailable(format!("TSDB: {e}"))
}

/// The metrics named in `metrics=` (all when absent), refusing unknown names.
fn chosen(metrics: Option<&str>) -> Result<Vec<&'static Def>, ObserveError> {
    let Some(list) = metrics.filter(|m| !m.trim().is_empty()) else {
        return Ok(DEFS.iter().collect());
    };
    list.split(',')
        .map(|m| {
            let m = m.trim();
            DEFS.iter().find(|d| d.name == m).ok_or_else(|| {
                let known: Vec<&str> = DEFS.iter().map(|d| d.name).collect();
                ObserveError::Bad(
                    "metrics",
                    format!("`{m}`: unknown metric (known: {})", known.join(", ")),
                )
            })
        })
        .collect()
}

/// The nodes an allocation ran on: the control plane's list while it holds them, else the nodes its
/// own series name (an ended allocation no longer holds nodes).
async fn nodes_of(tsdb: &Tsdb, v: &AllocationView, at_s: f64, window_s: f64) -> Result<Vec<String>, ObserveError> {
    if !v.nodes.is_empty() {
        return Ok(v.nodes.clone());
    }
    let q = format!(
        "max by (node) (max_over_time(lattice_alloc_processes{{alloc=\"{}\"}}[{}ms]))",
        quoted(&v.id),
        (window_s * 1000.0).round().max(1000.0) as u64
    );
    let mut nodes: Vec<String> = tsdb
        .instant(&q, at_s)
        .await
        .map_err(unavailable)?
        .into_iter()
        .filter_map(|s| s.labels.get("node").cloned())
        .collect();
    nodes.sort();
    nodes.dedup();
    Ok(nodes)
}

/// The evaluation instant (its end, or `now_ms` while it runs) and the window: `duration_s`, but no
/// further back than its start.
fn window(v: &AllocationView, now_ms: u64, duration_s: f64) -> Result<(f64, f64), ObserveError> {
    let Some(start) = v.started_ms else {
        return Err(ObserveError::Bad(
            "id",
            format!("{} has not started: it has no metrics yet", v.id),
        ));
    };
    let end = v.ended_ms.unwrap_or(now_ms).max(start);
    let ran = (end - start) as f64 / 1000.0;
    Ok((end as f64 / 1000.0, duration_s.min(ran.max(1.0))))
}

/// `GET /v1/allocations/{id}/metrics?mode=summary|per-node|per-gpu&duration=5m&metrics=...`.
pub async fn snapshot(
    tsdb: &Tsdb,
    v: &AllocationView,
    now_ms: u64,
    mode: &str,
    duration_s: f64,
    metrics: Option<&str>,
) -> Result<Value, ObserveError> {
    if !matches!(mode, "summary" | "per-node" | "per-gpu") {
        return Err(ObserveError::Bad(
            "mode",
            format!("`{mode}`: expected summary, per-node or per-gpu"),
        ));
    }
    let defs = chosen(metrics)?;
    let (at, w) = window(v, now_ms, duration_s)?;
    let nodes = nodes_of(tsdb, v, at, w).await?;
    let mut out = json!({
        "id": v.id, "state": v.state, "mode": mode, "at_ms": (at * 1000.0) as u64,
        "window_s": w, "nodes": nodes, "source": "tsdb",
        "units": defs.iter().map(|d| (d.name, d.unit)).collect::<BTreeMap<_, _>>(),
    });
    if mode == "per-gpu" {
        let mut rows: BTreeMap<(String, String), BTreeMap<&str, f64>> = BTreeMap::new();
        if !nodes.is_empty() {
            let sel = format!("{{node=~\"{}\"}}", quoted(&one_of(&nodes)));
            let wms = (w * 1000.0).round().max(1000.0) as u64;
            for (name, metric) in [
                ("gpu_utilization", "lattice_gpu_utilization_percent"),
                ("gpu_memory_used", "lattice_gpu_memory_used_bytes"),
                ("gpu_power", "lattice_gpu_power_watts"),
            ] {
                let q = format!("avg_over_time({metric}{sel}[{wms}ms])");
                for s in tsdb.instant(&q, at).await.map_err(unavailable)? {
                    let key = (
                        s.labels.get("node").cloned().unwrap_or_default(),
                        s.labels.get("gpu").cloned().unwrap_or_default(),
                    );
                    rows.entry(key).or_default().insert(name, s.value);
                }
            }
        }
        out["gpus"] = rows
            .into_iter()
            .map(|((node, gpu), m)| {
                let mut r = json!({"node": node, "gpu": gpu});
                for (k, v) in m {
                    r[k] = json!(v);
                }
                r
            })
            .collect();
        return Ok(out);
    }
    let mut per_node: BTreeMap<String, BTreeMap<&str, f64>> = BTreeMap::new();
    let mut summary = BTreeMap::new();
    for d in defs {
        let Some(q) = promql(d, &v.id, &nodes, w) else { continue };
        let samples = tsdb.instant(&q, at).await.map_err(unavailable)?;
        if samples.is_empty() {
            continue;
        }
        let values: Vec<f64> = samples.iter().map(|s| s.value).collect();
        let total: f64 = values.iter().sum();
        summary.insert(
            d.name,
            match d.combine {
                Combine::Sum => total,
                Combine::Mean => total / values.len() as f64,
            },
        );
        for s in samples {
            let node = s.labels.get("node").cloned().unwrap_or_default();
            per_node.entry(node).or_default().insert(d.name, s.value);
        }
    }
    out["summary"] = json!(summary);
    if mode == "per-node" {
        out["per_node"] = per_node
            .into_iter()
            .map(|(node, m)| {
                let mut r = json!({"node": node});
                for (k, v) in m {
                    r[k] = json!(v);
                }
                r
            })
            .collect();
    }
    Ok(out)
}

/// The local alert rules firing on `nodes` at `at` (the agents' `lattice_gpu_alert{gpu,node,rule}`).
pub async fn alerts(tsdb: &Tsdb, nodes: &[String], at: f64) -> Result<Vec<Value>, ObserveError> {
    if nodes.is_empty() {
        return Ok(Vec::new());
    }
    let q = format!("lattice_gpu_alert{{node=~\"{}\"}} == 1", quoted(&one_of(nodes)));
    Ok(tsdb
        .instant(&q, at)
        .await
        .map_err(unavailable)?
        .into_iter()
        .map(|s| {
            let l = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            json!({"node": l("node"), "gpu": l("gpu"), "rule": l("rule")})
        })
        .collect())
}

/// `align=` of a comparison.
pub fn parse_align(a: Option<&str>) -> Result<bool, ObserveError> {
    match a.unwrap_or("relative") {
        "relative" => Ok(true),
        "absolute" => Ok(false),
        other => Err(ObserveError::Bad(
            "align",
            format!("`{other}`: expected relative or absolute"),
        )),
    }
}

/// At most this many allocations in one comparison.
pub const COMPARE_MAX: usize = 10;

/// `GET /v1/compare?ids=A,B&metrics=...&align=relative&step=5s`: each allocation's series of each
/// metric (summed or averaged over its nodes) from its start to its end, with times relative to its
/// start (`align=relative`, the book's default) or in unix seconds.
pub async fn compare(
    tsdb: &Tsdb,
    allocs: &[AllocationView],
    now_ms: u64,
    metrics: Option<&str>,
    relative: bool,
    step_s: Option<f64>,
) -> Result<Value, ObserveError> {
    let defs = chosen(metrics)?;
    let mut out = Vec::new();
    for v in allocs {
        let (end, ran) = window(v, now_ms, f64::INFINITY)?;
        let start = end - ran;
        let step = step_s.unwrap_or((ran / 120.0).max(1.0));
        let w = (2.0 * step).max(2.0);
        let nodes = nodes_of(tsdb, v, end, ran.max(w)).await?;
        let mut series = BTreeMap::new();
        for d in &defs {
            let Some(per_node) = promql(d, &v.id, &nodes, w) else {
                continue;
            };
            let q = match d.combine {
                Combine::Sum => format!("sum({per_node})"),
                Combine::Mean => format!("avg({per_node})"),
            };
            let r = tsdb.range(&q, start, end, step).await.map_err(unavailable)?;
            let points: Vec<[f64; 2]> = r
                .into_iter()
                .flat_map(|s| s.points)
                .map(|(t, x)| {
                    let t = if relative { t - start } else { t };
                    [(t * 1000.0).round() / 1000.0, x]
                })
                .collect();
            if !points.is_empty() {
                series.insert(d.name, points);
            }
        }
        out.push(json!({
            "id": v.id, "state": v.state, "started_ms": v.started_ms, "ended_ms": v.ended_ms,
            "step_s": step, "series": series,
        }));
    }
    Ok(json!({
        "align": if relative { "relative" } else { "absolute" },
        "metrics": defs.iter().map(|d| d.name).collect::<Vec<_>>(),
        "units": defs.iter().map(|d| (d.name, d.unit)).collect::<BTreeMap<_, _>>(),
        "allocations": out,
    }))
}

/// `GET /v1/allocations/{id}/diagnostics[/network|/storage]`: what the control plane knows, and,
/// with a TSDB, what was measured over the last `duration_s` (the storage throughput against the QoS
/// floor asked for). Congestion signals and NVLink throughput need the agents' Slingshot and NVML
/// counters in the TSDB; they are reported as not measured rather than guessed.
pub async fn diagnostics(
    tsdb: Option<&Tsdb>,
    v: &AllocationView,
    facts: Option<&DiagnosticsFacts>,
    now_ms: u64,
    duration_s: f64,
    part: Option<&str>,
) -> Result<Value, ObserveError> {
    let mut out = json!({"id": v.id, "state": v.state});
    let measured = match (tsdb, v.started_ms) {
        (Some(t), Some(_)) => Some(snapshot(t, v, now_ms, "summary", duration_s, None).await?),
        _ => None,
    };
    let summary = |k: &str| measured.as_ref().and_then(|m| m["summary"][k].as_f64());
    let no_tsdb = tsdb.is_none().then_some("no TSDB configured (services.tsdb)");
    if part != Some("storage") {
        let nodes: Vec<(String, u32)> = match facts {
            Some(f) if !f.nodes.is_empty() => f.nodes.clone(),
            _ => Vec::new(),
        };
        let mut groups: Vec<u32> = nodes.iter().map(|n| n.1).collect();
        groups.sort_unstable();
        groups.dedup();
        out["network"] = json!({
            "nodes": nodes.iter().map(|(n, g)| json!({"node": n, "group": g})).collect::<Vec<_>>(),
            "groups": groups,
            "group_span": groups.len(),
            "network_domain": facts.and_then(|f| f.network_domain.clone()),
            "vni": facts.and_then(|f| f.vni).or(v.vni),
            "csig_congestion": null,
            "not_measured": ["csig_congestion", "inter_node_bandwidth", "nvlink_throughput"],
        });
    }
    if part != Some("network") {
        let mounts: Vec<Value> = facts
            .and_then(|f| f.data.as_ref())
            .map(|d| {
                d.mounts
                    .iter()
                    .map(|m| {
                        json!({"source": m.source, "target": m.target,
                               "access": m.access.clone().unwrap_or_else(|| "read-write".into()),
                               "tier": m.tier, "size_gb": m.size_gb})
                    })
                    .collect()
            })
            .unwrap_or_default();
        let floor = facts.and_then(|f| f.storage_gbps);
        let read = summary("io_read_bytes");
        let write = summary("io_write_bytes");
        let gbps = match (read, write) {
            (None, None) => None,
            (r, w) => Some((r.unwrap_or(0.0) + w.unwrap_or(0.0)) / 1e9),
        };
        out["storage"] = json!({
            "mounts": mounts,
            "data_readiness": facts.and_then(|f| f.data_readiness).or(v.data_readiness),
            "qos_floor_gbps": floor,
            "measured_gbps": gbps,
            "io_read_bytes_per_s": read,
            "io_write_bytes_per_s": write,
            "block_read_bytes_per_s": summary("block_read_bytes"),
            "block_write_bytes_per_s": summary("block_write_bytes"),
            // Met when measured at or above the floor; unknown (null) without one or a measurement.
            "qos_met": match (floor, gbps) { (Some(f), Some(g)) => json!(g >= f), _ => Value::Null },
        });
    }
    if let Some(m) = &measured {
        out["window_s"] = m["window_s"].clone();
    }
    if let Some(n) = no_tsdb {
        out["note"] = json!(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_quote_and_escape_what_they_embed() {
        let d = &DEFS[0];
        let q = promql(d, "a\"1", &[], 30.0).unwrap();
        assert_eq!(
            q,
            "sum by (node) (rate(lattice_alloc_cpu_seconds_total{alloc=\"a\\\"1\"}[30000ms]))"
        );
        let g = DEFS.iter().find(|d| d.name == "gpu_utilization").unwrap();
        assert!(promql(g, "a-1", &[], 30.0).is_none(), "no nodes, no GPU query");
        let q = promql(g, "a-1", &["n.1".into(), "n2".into()], 0.2).unwrap();
        assert!(q.contains("{node=~\"n\\\\.1|n2\"}[1000ms]"), "{q}");
    }

    #[test]
    fn unknown_metrics_modes_and_alignments_name_their_parameter() {
        assert!(matches!(chosen(Some("cpu_cores,nope")), Err(ObserveError::Bad("metrics", m)) if m.contains("`nope`")));
        assert_eq!(chosen(Some("io_write_bytes")).unwrap().len(), 1);
        assert_eq!(chosen(None).unwrap().len(), DEFS.len());
        assert!(matches!(parse_align(Some("wall")), Err(ObserveError::Bad("align", _))));
        assert!(parse_align(None).unwrap());
    }
}
