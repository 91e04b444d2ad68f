//! The API can ask for everything a trace can: every field of the JSONL submit event
//! (`traces/jsonl-schema.json`) has a field in the REST submission ([`SubmitRequest`], the schema
//! `/openapi.json` publishes; gRPC and the CLI build the same request). Derived from the two schemas,
//! so a new trace field without an API field fails here.

use lattice_control::SubmitRequest;
use serde_json::Value;
use std::collections::BTreeSet;

/// Where a trace field is asked for in the API, when not at the same path.
const MOVED: [(&str, &str); 5] = [
    ("nodes", "resources.nodes"),
    ("gpu_type", "resources.constraints.gpu_type"),
    ("constraints", "resources.constraints"),
    ("walltime", "lifecycle.walltime"),
    // The trace's alias of `preemption_class` (the seed's example calls it `priority`).
    ("priority", "preemption_class"),
];

/// Trace fields no request carries, and why.
const NOT_ASKED: [(&str, &str); 1] = [(
    "id",
    "the API names allocations itself; a capture writes the names it gave",
)];

/// The object paths a schema's node describes (`a`, `a.b`, ...): through `$ref`s into `defs`,
/// `anyOf`/`oneOf`/`allOf` branches, not into array items. A node that takes any object (no
/// `properties`, e.g. a free-form JSON value) is recorded in `open`.
fn walk(node: &Value, defs: &Value, prefix: &str, out: &mut BTreeSet<String>, open: &mut BTreeSet<String>) {
    if let Some(r) = node.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or_default();
        return walk(&defs[name], defs, prefix, out, open);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for branch in node.get(key).and_then(Value::as_array).into_iter().flatten() {
            walk(branch, defs, prefix, out, open);
        }
    }
    let Some(props) = node.get("properties").and_then(Value::as_object) else {
        let typed = node.get("type");
        let any = node.as_bool() == Some(true)
            || typed.is_none()
                && node.get("anyOf").is_none()
                && node.get("oneOf").is_none()
                && node.get("$ref").is_none()
            || typed.and_then(Value::as_str) == Some("object");
        if any && !prefix.is_empty() {
            open.insert(prefix.to_string());
        }
        return;
    };
    for (k, v) in props {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        out.insert(path.clone());
        walk(v, defs, &path, out, open);
    }
}

fn trace_fields() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/jsonl-schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (mut out, mut open) = (BTreeSet::new(), BTreeSet::new());
    walk(&schema["$defs"]["alloc"], &schema["$defs"], "", &mut out, &mut open);
    out
}

fn api_fields() -> (BTreeSet<String>, BTreeSet<String>) {
    let schema = serde_json::to_value(schemars::schema_for!(SubmitRequest)).unwrap();
    let (mut out, mut open) = (BTreeSet::new(), BTreeSet::new());
    walk(&schema, &schema["$defs"], "", &mut out, &mut open);
    (out, open)
}

/// A trace field's path in the API.
fn in_api(field: &str) -> String {
    for (from, to) in MOVED {
        if field == from {
            return to.to_string();
        }
        if let Some(rest) = field.strip_prefix(&format!("{from}.")) {
            return format!("{to}.{rest}");
        }
    }
    field.to_string()
}

#[test]
fn every_trace_field_can_be_submitted_through_the_api() {
    let trace = trace_fields();
    assert!(trace.len() > 30, "the trace schema's submit fields: {trace:?}");
    let (api, open) = api_fields();
    let missing: Vec<String> = trace
        .iter()
        .filter(|f| !NOT_ASKED.iter().any(|(n, _)| *n == f.as_str()))
        .map(|f| (f, in_api(f)))
        .filter(|(_, a)| !api.contains(a) && !open.iter().any(|o| a.starts_with(&format!("{o}."))))
        .map(|(f, a)| format!("{f} (as {a})"))
        .collect();
    assert!(
        missing.is_empty(),
        "trace fields the API cannot ask for: {missing:?}\nthe API's: {api:?}"
    );
}

/// The check itself: a trace field the API lacks is found.
#[test]
fn a_trace_field_without_an_api_field_is_found() {
    let (api, _) = api_fields();
    assert!(api.contains("resources.constraints.memory_gb"), "{api:?}");
    assert!(!api.contains(&in_api("launch_window")));
}
