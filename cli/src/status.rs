//! `lattice status` tables: the REASON column says why an allocation is where it is — how it ended,
//! why it was preempted (while it is stopping, suspended or waiting to restart), or why its last
//! start was refused.

use serde_json::Value;

/// Why the allocation in `row` (an API allocation view) is in its state, if the view says.
pub fn reason(row: &Value) -> Value {
    let text = |k: &str| row[k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
    let state = row["state"].as_str().unwrap_or_default();
    let why = match state {
        "suspending" | "suspended" | "preempted" => text("preemption").map(|p| format!("preempted: {p}")),
        "pending" | "staging" => row["waiting"]["summary"]
            .as_str()
            .map(str::to_string)
            .or_else(|| text("last_rejection")),
        _ => text("end_reason"),
    };
    why.map_or(Value::Null, Value::String)
}

/// Milliseconds since the epoch now.
pub fn now_ms() -> u64 {
    lattice_util::clock::epoch_ms()
}

/// `lattice watch`'s line for an allocation view seen at `now_ms`: the time (UTC), the state, its
/// nodes and why it is there.
pub fn watch_line(row: &Value, now_ms: u64) -> String {
    let secs = now_ms / 1000;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let mut line = format!(
        "{h:02}:{m:02}:{s:02}Z {} {}",
        row["id"].as_str().unwrap_or_default(),
        row["state"].as_str().unwrap_or_default()
    );
    let nodes: Vec<&str> = row["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !nodes.is_empty() {
        line.push_str(&format!(" on {}", nodes.join(",")));
    }
    if let Some(why) = reason(row).as_str() {
        line.push_str(&format!(" ({why})"));
    }
    line
}

/// `lattice diag`: why an allocation is where it is, from its view and its vCluster's queue.
pub fn diagnose(row: &Value, queue: Option<&Value>) -> String {
    let mut out = Vec::new();
    let s = |k: &str| row[k].as_str().unwrap_or_default().to_string();
    out.push(format!("{}: {}", s("id"), s("state")));
    if let Some(w) = row["waiting"].as_object() {
        out.push(format!(
            "  waiting: {} ({})",
            w.get("summary").and_then(Value::as_str).unwrap_or_default(),
            w.get("reason").and_then(Value::as_str).unwrap_or_default()
        ));
    }
    if let Some(r) = row["last_rejection"].as_str() {
        out.push(format!("  last start refused by the quorum: {r}"));
    }
    if let Some(d) = row["data_readiness"].as_f64() {
        out.push(format!("  input data staged: {:.0}%", d * 100.0));
    }
    if let Some(q) = queue.and_then(|q| q["queue"].as_array()) {
        let id = s("id");
        match q
            .iter()
            .position(|e| e["id"].as_str() == Some(id.as_str()) || e.as_str() == Some(id.as_str()))
        {
            Some(i) => out.push(format!(
                "  queue position: {} of {} in vCluster {}",
                i + 1,
                q.len(),
                s("vcluster")
            )),
            None if row["ended_ms"].is_null() && row["started_ms"].is_null() => {
                out.push(format!("  not in vCluster {}'s queue yet", s("vcluster")))
            }
            None => {}
        }
    }
    if let Some(why) = reason(row).as_str()
        && row["waiting"].is_null()
    {
        out.push(format!("  reason: {why}"));
    }
    if let Some(n) = row["nodes"].as_array().filter(|n| !n.is_empty()) {
        let names: Vec<&str> = n.iter().filter_map(Value::as_str).collect();
        out.push(format!("  nodes: {}", names.join(",")));
    }
    out.join("\n") + "\n"
}

/// `lattice top`'s screen: the nodes by state, then the running allocations (longest-running first)
/// and the waiting ones (in submission order) with why they wait, at most `rows` lines of them.
pub fn top_screen(allocs: &[Value], nodes: &[Value], now_ms: u64, rows: usize) -> String {
    use std::collections::BTreeMap;
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    for n in nodes {
        *by_state.entry(n["state"].as_str().unwrap_or("?")).or_default() += 1;
    }
    let states: Vec<String> = by_state.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let busy = nodes.iter().filter(|n| !n["owner"].is_null()).count();
    let running: Vec<&Value> = {
        let mut r: Vec<&Value> = allocs.iter().filter(|a| a["state"] == "running").collect();
        r.sort_by_key(|a| {
            (
                a["started_ms"].as_u64().unwrap_or(u64::MAX),
                a["id"].as_str().unwrap_or("").to_string(),
            )
        });
        r
    };
    let waiting: Vec<&Value> = allocs
        .iter()
        .filter(|a| a["ended_ms"].is_null() && a["state"] != "running")
        .collect();
    let ended = allocs.iter().filter(|a| !a["ended_ms"].is_null()).count();
    let secs = now_ms / 1000;
    let mut out = format!(
        "lattice top — {:02}:{:02}:{:02}Z   nodes: {} ({}), {} in use\nallocations: {} running, {} waiting, {} ended\n\n",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        nodes.len(),
        if states.is_empty() {
            "none".into()
        } else {
            states.join(", ")
        },
        busy,
        running.len(),
        waiting.len(),
        ended
    );
    out.push_str(&format!(
        "{:<14} {:<12} {:<10} {:>5} {:>9}  {}\n",
        "ID", "TENANT", "STATE", "NODES", "TIME", "NODELIST / REASON"
    ));
    let age = |from: Option<u64>| {
        let s = from.map_or(0, |f| now_ms.saturating_sub(f) / 1000);
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    };
    for (a, time, detail) in running
        .iter()
        .map(|a| {
            let nodes: Vec<&str> = a["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            (*a, age(a["started_ms"].as_u64()), nodes.join(","))
        })
        .chain(waiting.iter().map(|a| {
            let why = reason(a).as_str().unwrap_or_default().to_string();
            (*a, age(a["submitted_ms"].as_u64()), why)
        }))
        .take(rows)
    {
        let nodes = a["nodes"]
            .as_array()
            .map_or(0, Vec::len)
            .max(a["requested_nodes"].as_u64().unwrap_or(0) as usize);
        out.push_str(&format!(
            "{:<14} {:<12} {:<10} {:>5} {:>9}  {}\n",
            a["id"].as_str().unwrap_or_default(),
            a["tenant"].as_str().unwrap_or_default(),
            a["state"].as_str().unwrap_or_default(),
            nodes,
            time,
            detail
        ));
    }
    let shown = running.len() + waiting.len();
    if shown > rows {
        out.push_str(&format!("… {} more\n", shown - rows));
    }
    out
}

/// Adds the `reason` column to each row.
pub fn with_reasons(rows: &mut [Value]) {
    for r in rows {
        let why = reason(r);
        if let Some(o) = r.as_object_mut() {
            o.insert("reason".into(), why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_reason_follows_the_state() {
        let preempted = json!({"state": "preempted", "preemption": "priority for a-000009", "preempted": 1});
        assert_eq!(reason(&preempted), "preempted: priority for a-000009");
        let suspended = json!({"state": "suspended", "preemption": "reclaim for a-000002"});
        assert_eq!(reason(&suspended), "preempted: reclaim for a-000002");
        assert_eq!(
            reason(&json!({"state": "completed", "end_reason": "walltime_exceeded"})),
            "walltime_exceeded"
        );
        assert_eq!(
            reason(&json!({"state": "pending", "last_rejection": "max_nodes", "end_reason": null})),
            "max_nodes"
        );
        assert_eq!(reason(&json!({"state": "running", "end_reason": null})), Value::Null);
        assert_eq!(
            watch_line(
                &json!({"id": "a-1", "state": "running", "nodes": ["n1", "n2"], "end_reason": null}),
                3_723_000
            ),
            "01:02:03Z a-1 running on n1,n2"
        );
        assert_eq!(
            watch_line(
                &json!({"id": "a-1", "state": "failed", "nodes": [], "end_reason": "exit_failure"}),
                0
            ),
            "00:00:00Z a-1 failed (exit_failure)"
        );
        let waiting = json!({"id": "a-2", "state": "pending", "vcluster": "hpc", "nodes": [], "ended_ms": null,
            "started_ms": null, "last_rejection": null,
            "waiting": {"reason": "behind_head", "head": "a-1", "summary": "behind a-1 at the head of the queue"}});
        assert_eq!(reason(&waiting), "behind a-1 at the head of the queue");
        let q = json!({"queue": [{"id": "a-1"}, {"id": "a-2"}]});
        assert_eq!(
            diagnose(&waiting, Some(&q)),
            "a-2: pending\n  waiting: behind a-1 at the head of the queue (behind_head)\n  queue position: 2 of 2 in vCluster hpc\n"
        );
        let screen = top_screen(
            &[
                json!({"id": "a-1", "tenant": "physics", "state": "running", "nodes": ["n1", "n2"], "requested_nodes": 2,
                       "started_ms": 1_000, "submitted_ms": 0, "ended_ms": null}),
                waiting.clone(),
                json!({"id": "a-3", "tenant": "bio", "state": "completed", "nodes": [], "ended_ms": 5}),
            ],
            &[
                json!({"state": "ready", "owner": "a-1"}),
                json!({"state": "ready", "owner": "a-1"}),
                json!({"state": "draining", "owner": null}),
            ],
            61_000,
            10,
        );
        assert!(screen.contains("nodes: 3 (1 draining, 2 ready), 2 in use"), "{screen}");
        assert!(
            screen.contains("allocations: 1 running, 1 waiting, 1 ended"),
            "{screen}"
        );
        assert!(
            screen.contains("a-1            physics      running        2   0:01:00  n1,n2"),
            "{screen}"
        );
        assert!(screen.contains("behind a-1 at the head of the queue"), "{screen}");
        assert!(!screen.contains("a-3"), "{screen}");
        let mut rows = vec![preempted];
        with_reasons(&mut rows);
        assert_eq!(rows[0]["reason"], "preempted: priority for a-000009");
    }
}
