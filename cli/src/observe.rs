//! How `lattice` shows the observability answers: `top ID` (an allocation's metrics: summary, per
//! node, per GPU), `compare` (allocations side by side), `diag ID --network/--storage` (the
//! diagnostics), `history` (usage records) and `dag graph` — plain-text tables from the API's JSON.

use serde_json::Value;

/// A left-aligned table: upper-case headers, columns two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_uppercase()).collect());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.clone()));
        out.push('\n');
    }
    out
}

/// A value in its unit for people: bytes (and bytes/s) with binary prefixes, percent, cores.
pub fn human(v: f64, unit: &str) -> String {
    match unit {
        "bytes" | "bytes/s" => {
            let mut x = v;
            let mut p = 0;
            let prefixes = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
            while x.abs() >= 1024.0 && p + 1 < prefixes.len() {
                x /= 1024.0;
                p += 1;
            }
            let suffix = if unit == "bytes/s" { "/s" } else { "" };
            if p == 0 {
                format!("{x:.0} {}{suffix}", prefixes[p])
            } else {
                format!("{x:.1} {}{suffix}", prefixes[p])
            }
        }
        "percent" => format!("{v:.0}%"),
        "cores" => format!("{v:.2}"),
        _ => format!("{v:.0}"),
    }
}

fn unit_of(v: &Value, metric: &str) -> String {
    v["units"][metric].as_str().unwrap_or("").to_string()
}

/// `lattice top ID`: the summary (metric, value), or one row per node or per GPU.
pub fn metrics_view(v: &Value) -> String {
    let mut out = format!(
        "{} ({}) over the last {:.0} s on {}\n",
        v["id"].as_str().unwrap_or_default(),
        v["state"].as_str().unwrap_or_default(),
        v["window_s"].as_f64().unwrap_or(0.0),
        v["nodes"]
            .as_array()
            .map(|n| n.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "no nodes".into())
    );
    if let Some(gpus) = v["gpus"].as_array() {
        let rows: Vec<Vec<String>> = gpus
            .iter()
            .map(|g| {
                let f = |k: &str, u: &str| g[k].as_f64().map_or("-".into(), |x| human(x, u));
                vec![
                    g["node"].as_str().unwrap_or_default().to_string(),
                    g["gpu"].as_str().unwrap_or_default().to_string(),
                    f("gpu_utilization", "percent"),
                    f("gpu_memory_used", "bytes"),
                    g["gpu_power"].as_f64().map_or("-".into(), |x| format!("{x:.0} W")),
                ]
            })
            .collect();
        if rows.is_empty() {
            out.push_str("no GPU series for its nodes\n");
        } else {
            out.push_str(&table(&["node", "gpu", "util", "memory", "power"], &rows));
        }
        return out;
    }
    let metrics: Vec<String> = v["units"]
        .as_object()
        .map(|u| u.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(per) = v["per_node"].as_array() {
        let shown: Vec<&String> = metrics
            .iter()
            .filter(|m| per.iter().any(|r| r[m.as_str()].is_number()))
            .collect();
        let mut header = vec!["node"];
        header.extend(shown.iter().map(|m| m.as_str()));
        let rows: Vec<Vec<String>> = per
            .iter()
            .map(|r| {
                let mut row = vec![r["node"].as_str().unwrap_or_default().to_string()];
                row.extend(
                    shown
                        .iter()
                        .map(|m| r[m.as_str()].as_f64().map_or("-".into(), |x| human(x, &unit_of(v, m)))),
                );
                row
            })
            .collect();
        out.push_str(&table(&header, &rows));
        return out;
    }
    let rows: Vec<Vec<String>> = metrics
        .iter()
        .filter_map(|m| {
            let x = v["summary"][m.as_str()].as_f64()?;
            Some(vec![m.clone(), human(x, &unit_of(v, m))])
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no samples in the TSDB for this window\n");
    } else {
        out.push_str(&table(&["metric", "value"], &rows));
    }
    out
}

/// One `metrics` event of the live stream as a line: the time, then each metric in its unit.
pub fn metrics_line(v: &Value) -> String {
    let mut parts = vec![v["at_ms"].as_u64().map_or("-".into(), |ms| utc(ms)[11..].to_string())];
    if let Some(s) = v["summary"].as_object() {
        for (k, x) in s {
            if let Some(x) = x.as_f64() {
                parts.push(format!("{k}={}", human(x, &unit_of(v, k))));
            }
        }
    }
    parts.join(" ")
}

/// `lattice compare A B`: per metric, each allocation's mean, peak and last value and how long its
/// series runs (relative to its start).
pub fn compare_view(v: &Value) -> String {
    let mut rows = Vec::new();
    let allocs = v["allocations"].as_array().cloned().unwrap_or_default();
    for m in v["metrics"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let unit = unit_of(v, m);
        for a in &allocs {
            let Some(points) = a["series"][m].as_array().filter(|p| !p.is_empty()) else {
                continue;
            };
            let xs: Vec<f64> = points.iter().filter_map(|p| p[1].as_f64()).collect();
            let mean = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
            let peak = xs.iter().copied().fold(f64::MIN, f64::max);
            let span = points.last().and_then(|p| p[0].as_f64()).unwrap_or(0.0)
                - points.first().and_then(|p| p[0].as_f64()).unwrap_or(0.0);
            rows.push(vec![
                m.to_string(),
                a["id"].as_str().unwrap_or_default().to_string(),
                human(mean, &unit),
                human(peak, &unit),
                human(*xs.last().unwrap_or(&0.0), &unit),
                format!("{span:.0} s"),
                xs.len().to_string(),
            ]);
        }
    }
    if rows.is_empty() {
        return "no samples in the TSDB for these allocations\n".into();
    }
    table(
        &["metric", "allocation", "mean", "peak", "last", "span", "points"],
        &rows,
    )
}

/// `lattice diag ID --network/--storage`: the diagnostics' sections.
pub fn diagnostics_view(v: &Value) -> String {
    let mut out = String::new();
    if let Some(n) = v.get("network").filter(|n| n.is_object()) {
        out.push_str("Network:\n");
        let groups: Vec<String> = n["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| format!("g{g}"))
            .collect();
        out.push_str(&format!(
            "  Group span: {} group(s) ({})\n",
            n["group_span"].as_u64().unwrap_or(0),
            groups.join(", ")
        ));
        if let Some(d) = n["network_domain"].as_str() {
            out.push_str(&format!("  Network domain: {d}"));
            match n["vni"].as_u64() {
                Some(vni) => out.push_str(&format!(" (VNI {vni})\n")),
                None => out.push('\n'),
            }
        }
        if let Some(nm) = n["not_measured"].as_array().filter(|a| !a.is_empty()) {
            let names: Vec<&str> = nm.iter().filter_map(Value::as_str).collect();
            out.push_str(&format!("  Not measured: {}\n", names.join(", ")));
        }
    }
    if let Some(s) = v.get("storage").filter(|s| s.is_object()) {
        out.push_str("Storage:\n");
        for m in s["mounts"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  {} <- {} ({}{})\n",
                m["target"].as_str().unwrap_or("(staged only)"),
                m["source"].as_str().unwrap_or_default(),
                m["access"].as_str().unwrap_or("read-write"),
                m["tier"].as_str().map(|t| format!(", {t} tier")).unwrap_or_default()
            ));
        }
        if let Some(r) = s["data_readiness"].as_f64() {
            out.push_str(&format!("  Input data on the hot tier: {:.0}%\n", r * 100.0));
        }
        let rate = |k: &str| s[k].as_f64().map(|x| human(x, "bytes/s"));
        if let (Some(r), Some(w)) = (rate("io_read_bytes_per_s"), rate("io_write_bytes_per_s")) {
            out.push_str(&format!("  I/O: {r} read, {w} write"));
            match (s["qos_floor_gbps"].as_f64(), s["qos_met"].as_bool()) {
                (Some(f), Some(met)) => {
                    out.push_str(&format!(" (QoS floor {f} GB/s) {}\n", if met { "✓" } else { "✗" }))
                }
                _ => out.push('\n'),
            }
        }
    }
    if let Some(n) = v["note"].as_str() {
        out.push_str(&format!("  ({n})\n"));
    }
    out
}

/// When (ms since the epoch) as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn utc(ms: u64) -> String {
    let s = ms / 1000;
    let (days, rem) = (s / 86_400, s % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `lattice history`: one row per usage record, then the totals.
pub fn history_view(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["records"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
            vec![
                s("id"),
                s("tenant"),
                s("user"),
                s("state"),
                r["nodes"].as_u64().unwrap_or(0).to_string(),
                r["started_ms"].as_u64().map_or("-".into(), utc),
                r["ended_ms"].as_u64().map_or("-".into(), utc),
                format!("{:.3}", r["node_hours"].as_f64().unwrap_or(0.0)),
                format!("{:.3}", r["gpu_hours"].as_f64().unwrap_or(0.0)),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "id", "tenant", "user", "state", "nodes", "start", "end", "node-h", "gpu-h",
        ],
        &rows,
    );
    let t = &v["total"];
    out.push_str(&format!(
        "{} allocation(s), {:.3} node-hours, {:.3} GPU-hours\n",
        t["allocations"].as_u64().unwrap_or(0),
        t["node_hours"].as_f64().unwrap_or(0.0),
        t["gpu_hours"].as_f64().unwrap_or(0.0)
    ));
    out
}

/// `lattice admin accounting status`: whether Waldur takes the events, what waits, what was lost.
/// `lattice submit --site=…`: where it went (`SITE/ID`) and why, one line per site's score.
pub fn federated_submit(v: &Value) -> String {
    let mut out = format!(
        "{}/{}\n",
        v["site"].as_str().unwrap_or("?"),
        v["id"].as_str().unwrap_or("?")
    );
    for s in v["routing"]["scores"].as_array().into_iter().flatten() {
        let line = match s["excluded"].as_str() {
            Some(why) => format!("  {:<12} excluded: {why}\n", s["site"].as_str().unwrap_or("?")),
            None => format!(
                "  {:<12} score {:.2} (data {:.2}, capacity {:.2}, energy {:.2}; {})\n",
                s["site"].as_str().unwrap_or("?"),
                s["total"].as_f64().unwrap_or(0.0),
                s["data_gravity"].as_f64().unwrap_or(0.0),
                s["capacity"].as_f64().unwrap_or(0.0),
                s["energy"].as_f64().unwrap_or(0.0),
                s["status"].as_str().unwrap_or("?"),
            ),
        };
        out.push_str(&line);
    }
    out
}

/// `lattice admin federation status` (and the answers of its changes).
pub fn federation_status(v: &Value) -> String {
    if let Some(ok) = v["ok"].as_str() {
        return format!("{ok}\n");
    }
    let l = &v["local"];
    let mut out = format!(
        "Site {}: {} nodes ({} free), energy price {}, catalog every {}\n",
        v["site"].as_str().unwrap_or("?"),
        l["nodes"],
        l["available_nodes"],
        l["energy_price"],
        v["sync_interval"].as_str().unwrap_or("?")
    );
    let peers = v["peers"].as_array().cloned().unwrap_or_default();
    if peers.is_empty() {
        out.push_str("  no peers (lattice admin federation add-peer --name … --endpoint … --workspace …)\n");
    }
    for p in peers {
        let c = &p["catalog"];
        out.push_str(&format!(
            "  {:<12} {:<11} workspace {}{}  {}\n",
            p["name"].as_str().unwrap_or("?"),
            p["status"].as_str().unwrap_or("?"),
            p["workspace"].as_str().unwrap_or("?"),
            if p["revoked"] == true { " (REVOKED)" } else { "" },
            p["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ));
        if c.is_object() {
            out.push_str(&format!(
                "               {} nodes ({} free), energy price {}, synced {}\n",
                c["nodes"],
                c["available_nodes"],
                c["energy_price"],
                p["synced_ms"].as_u64().map(utc).unwrap_or_else(|| "never".into())
            ));
        }
        if let Some(e) = p["last_error"].as_str() {
            out.push_str(&format!("               last error: {e}\n"));
        }
    }
    out
}

pub fn accounting_status(v: &Value) -> String {
    if v["enabled"] != true {
        return "Accounting: off (accounting.enabled in the runtime's config)\n".into();
    }
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let mut out = format!(
        "Accounting: {} at {}, every {} s\n",
        v["provider"].as_str().unwrap_or("?"),
        v["api_url"].as_str().unwrap_or("?"),
        n("push_interval_seconds")
    );
    out.push_str(&match v["reachable"].as_bool() {
        Some(true) => "  Reachable: yes\n".to_string(),
        Some(false) => format!("  Reachable: NO — {}\n", v["last_error"].as_str().unwrap_or("")),
        None => "  Reachable: not tried yet\n".to_string(),
    });
    if let Some(t) = v["last_success_ms"].as_u64() {
        out.push_str(&format!("  Last delivery: {}\n", utc(t)));
    }
    out.push_str(&format!(
        "  Buffered: {} in memory, {} on disk\n  Delivered: {} ({} already known to the service)\n",
        n("buffered"),
        n("on_disk"),
        n("delivered_total"),
        n("duplicates_total")
    ));
    if n("dropped_total") > 0 {
        out.push_str(&format!(
            "  DROPPED: {} (buffers full) — recover with `lattice admin accounting reconcile --since … --until …`\n",
            n("dropped_total")
        ));
    }
    if n("mark_ms") > 0 {
        out.push_str(&format!("  Delivered up to: {}\n", utc(n("mark_ms"))));
    }
    out
}

/// `lattice admin tenant show NAME`: its quotas (unset ones omitted), what it holds and its usage.
pub fn tenant_view(v: &Value) -> String {
    let mut out = format!("Tenant {}\n", v["name"].as_str().unwrap_or_default());
    out.push_str(&quota_and_use(v));
    let u = &v["usage_90d"];
    out.push_str(&format!(
        "  Last 90 days: {} allocation(s), {:.3} node-hours, {:.3} GPU-hours\n",
        u["allocations"].as_u64().unwrap_or(0),
        u["node_hours"].as_f64().unwrap_or(0.0),
        u["gpu_hours"].as_f64().unwrap_or(0.0)
    ));
    for p in v["projects"].as_array().into_iter().flatten() {
        out.push_str(project_view(p).replace('\n', "\n  ").trim_end_matches(' '));
    }
    out
}

/// `lattice admin project show`: a project's quotas and what it holds (indented under its tenant's).
pub fn project_view(v: &Value) -> String {
    let mut out = format!(
        "  Project {}/{}\n",
        v["tenant"].as_str().unwrap_or_default(),
        v["name"].as_str().unwrap_or_default()
    );
    out.push_str(&quota_and_use(v));
    out
}

/// A view's hard and soft quotas (unset ones omitted) and what it holds now.
fn quota_and_use(v: &Value) -> String {
    let mut out = String::new();
    let q = &v["quota"];
    let hard: Vec<String> = [
        ("max_nodes", "nodes"),
        ("max_concurrent_allocations", "running allocations"),
    ]
    .iter()
    .filter_map(|(k, what)| Some(format!("{} {what}", q[*k].as_u64()?)))
    .collect();
    out.push_str(&format!(
        "  Hard quotas: {}\n",
        if hard.is_empty() {
            "none".into()
        } else {
            hard.join(", ")
        }
    ));
    let soft: Vec<String> = [
        ("gpu_hours_budget", "GPU-hours budget"),
        ("node_hours_budget", "node-hours budget"),
        ("fair_share_target", "fair-share target"),
        ("burst_allowance", "burst allowance"),
    ]
    .iter()
    .filter_map(|(k, what)| Some(format!("{what} {}", q[*k].as_f64()?)))
    .collect();
    out.push_str(&format!(
        "  Soft quotas: {}\n",
        if soft.is_empty() {
            "none".into()
        } else {
            soft.join(", ")
        }
    ));
    out.push_str(&format!(
        "  Now: {} node(s) held, {} running, {} pending\n",
        v["nodes_held"].as_u64().unwrap_or(0),
        v["running"].as_u64().unwrap_or(0),
        v["pending"].as_u64().unwrap_or(0)
    ));
    out
}

/// `lattice dag graph ID`: the members and the edges between them.
pub fn graph_view(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["allocations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let name = a["name"].as_str().unwrap_or_default();
            let after: Vec<String> = v["edges"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["to"].as_str() == Some(name))
                .map(|e| {
                    format!(
                        "{} ({})",
                        e["from"].as_str().unwrap_or_default(),
                        e["condition"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            vec![
                name.to_string(),
                a["id"].as_str().unwrap_or_default().to_string(),
                a["state"].as_str().unwrap_or_default().to_string(),
                if after.is_empty() { "-".into() } else { after.join(", ") },
            ]
        })
        .collect();
    format!(
        "DAG {} ({})\n{}",
        v["id"].as_str().unwrap_or_default(),
        v["state"].as_str().unwrap_or_default(),
        table(&["name", "id", "state", "after"], &rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accounting_status_says_what_waits_and_what_was_lost() {
        assert!(accounting_status(&json!({"enabled": false})).contains("off"));
        let down = json!({"enabled": true, "provider": "waldur", "api_url": "https://w/api/",
            "push_interval_seconds": 60, "reachable": false, "last_error": "HTTP 503",
            "buffered": 10000, "on_disk": 250, "dropped_total": 3, "delivered_total": 7,
            "duplicates_total": 1, "mark_ms": 0});
        let t = accounting_status(&down);
        assert!(t.contains("Reachable: NO — HTTP 503"), "{t}");
        assert!(t.contains("10000 in memory, 250 on disk"), "{t}");
        assert!(t.contains("DROPPED: 3") && t.contains("reconcile"), "{t}");
        let up = json!({"enabled": true, "reachable": true, "buffered": 0, "on_disk": 0, "dropped_total": 0});
        assert!(!accounting_status(&up).contains("DROPPED"));
    }

    #[test]
    fn units_read_as_people_read_them() {
        assert_eq!(human(512.0, "bytes"), "512 B");
        assert_eq!(human(3.5 * 1024.0 * 1024.0, "bytes/s"), "3.5 MiB/s");
        assert_eq!(human(87.4, "percent"), "87%");
        assert_eq!(human(1.234, "cores"), "1.23");
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_795_000_000_000), "2026-11-18 11:06:40");
    }

    #[test]
    fn the_views_show_what_the_api_answered() {
        let m = json!({"id": "a-1", "state": "running", "window_s": 30.0, "nodes": ["n1"],
            "units": {"cpu_cores": "cores", "io_write_bytes": "bytes/s"},
            "summary": {"cpu_cores": 1.5, "io_write_bytes": 2048.0}});
        let line =
            metrics_line(&json!({"at_ms": 3_723_000, "summary": {"cpu_cores": 1.0}, "units": {"cpu_cores": "cores"}}));
        assert_eq!(line, "01:02:03 cpu_cores=1.00");
        let s = metrics_view(&m);
        assert!(s.contains("cpu_cores       1.50") && s.contains("2.0 KiB/s"), "{s}");
        let c = json!({"metrics": ["cpu_cores"], "units": {"cpu_cores": "cores"}, "allocations": [
            {"id": "a-1", "series": {"cpu_cores": [[0.0, 1.0], [10.0, 3.0]]}},
            {"id": "a-2", "series": {}}]});
        let s = compare_view(&c);
        assert!(s.contains("cpu_cores  a-1         2.00  3.00  3.00  10 s  2"), "{s}");
        assert!(!s.contains("a-2"), "{s}");
        let g = json!({"id": "d-1", "state": "running", "allocations": [
            {"name": "prep", "id": "a-1", "state": "completed"}, {"name": "train", "id": "a-2", "state": "running"}],
            "edges": [{"from": "prep", "to": "train", "condition": "success"}]});
        let s = graph_view(&g);
        assert!(s.contains("train  a-2  running    prep (success)"), "{s}");
        let d = json!({"network": {"groups": [3, 7], "group_span": 2, "network_domain": "physics-a-1", "vni": 1001,
            "not_measured": ["csig_congestion"]},
            "storage": {"mounts": [{"source": "s3://d/x", "target": "/data", "access": "read-only", "tier": "hot"}],
            "io_read_bytes_per_s": 1024.0, "io_write_bytes_per_s": 0.0, "qos_floor_gbps": 10.0, "qos_met": false}});
        let s = diagnostics_view(&d);
        assert!(
            s.contains("Group span: 2 group(s) (g3, g7)") && s.contains("(VNI 1001)"),
            "{s}"
        );
        assert!(
            s.contains("/data <- s3://d/x (read-only, hot tier)") && s.contains("✗"),
            "{s}"
        );
    }
}
