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
        "pending" => text("last_rejection"),
        _ => text("end_reason"),
    };
    why.map_or(Value::Null, Value::String)
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
        let mut rows = vec![preempted];
        with_reasons(&mut rows);
        assert_eq!(rows[0]["reason"], "preempted: priority for a-000009");
    }
}
