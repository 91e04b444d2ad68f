//! `GET /openapi.json` against the router: every route the router serves (read from `api/mod.rs`, the
//! source the server is built from) is in the document with the same methods, and every documented
//! operation exists on a live server (answered by its handler: never a 405, never the router's own
//! empty 404). Request bodies and answers refer to schemas the document defines.

mod common;
use common::http;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// `(method, path)` of every `.route("PATH", ...)` in `api/mod.rs`.
fn routed() -> BTreeSet<(String, String)> {
    let mut src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/api/mod.rs")).unwrap();
    // A federation build also serves the federation's routes (and documents them).
    if cfg!(feature = "federation") {
        src += &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/federation/api.rs")).unwrap();
    }
    let mut out = BTreeSet::new();
    // Each `.route(` call up to its closing parenthesis, on one line or as rustfmt wraps it.
    let mut calls = Vec::new();
    let mut from = 0;
    while let Some(i) = src[from..].find(".route(") {
        let start = from + i + ".route(".len();
        let mut depth = 1;
        let end = src[start..]
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map_or(src.len(), |(j, _)| start + j);
        calls.push(src[start..end].split_whitespace().collect::<Vec<_>>().join(" "));
        from = end;
    }
    for call in calls.iter().filter(|c| c.starts_with('"')) {
        let (path, handlers) = call[1..].split_once('"').unwrap();
        for m in ["get", "post", "put", "patch", "delete"] {
            // `get(h)`, `.post(h)`, `axum::routing::post(h)`: the method name right before a `(`.
            let mut from = 0;
            while let Some(i) = handlers[from..].find(&format!("{m}(")) {
                let at = from + i;
                let before = handlers[..at].chars().last();
                if before.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_') {
                    out.insert((m.to_string(), path.to_string()));
                }
                from = at + m.len();
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_covers_every_route_and_every_documented_route_exists() {
    let dir = std::env::temp_dir().join(format!("lattice-openapi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = lattice_runtime::RuntimeConfig::parse(
        "t.yaml",
        &format!(
            "rest_listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\ndata_dir: {}/q\nsimulated_nodes: 2\ncycle: 100ms\n",
            dir.display()
        ),
    )
    .unwrap();
    let rt = lattice_runtime::start(cfg, true).await.unwrap();
    let base = format!("http://{}", rt.rest_addr);
    let t0 = Instant::now();
    while !rt.shared.member.is_leader() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, doc) = http("GET", format!("{base}/openapi.json"), None).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["openapi"], "3.1.0");

    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| ops.as_object().unwrap().keys().map(|m| (m.clone(), path.clone())))
        .collect();
    let routes = routed();
    assert!(routes.len() > 40, "read {} routes from api/mod.rs", routes.len());
    let undocumented: Vec<_> = routes.difference(&documented).collect();
    assert!(undocumented.is_empty(), "served but not documented: {undocumented:?}");
    // The peers' signed routes (`/federation/v1/...`) are served by one wildcard route that dispatches
    // on the path (tests/federation.rs calls each of them).
    let wildcard = cfg!(feature = "federation")
        && std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/federation/api.rs"))
            .unwrap()
            .contains(r#""/federation/v1/{*rest}", any(inbound)"#);
    let unserved: Vec<_> = documented
        .difference(&routes)
        .filter(|(_, path)| !(wildcard && path.starts_with("/federation/v1/")))
        .collect();
    assert!(unserved.is_empty(), "documented but not served: {unserved:?}");

    // Every `$ref` resolves in the document's components.
    let text = doc.to_string();
    let mut from = 0;
    while let Some(i) = text[from..].find("\"$ref\":\"#/components/") {
        let start = from + i + "\"$ref\":\"#/components/".len();
        let end = start + text[start..].find('"').unwrap();
        let (kind, name) = text[start..end].split_once('/').unwrap();
        assert!(
            doc["components"][kind][name].is_object(),
            "{kind}/{name} is referenced, not defined"
        );
        from = end;
    }
    let submit = &doc["components"]["schemas"]["SubmitRequest"]["properties"];
    for field in [
        "tenant",
        "resources",
        "lifecycle",
        "environment",
        "data",
        "task_group",
        "depends_on",
    ] {
        assert!(submit[field].is_object(), "SubmitRequest.{field}: {submit}");
    }

    // Every documented operation reaches its handler on the live server.
    for (method, path) in &documented {
        let url = format!("{base}{}", path.replace("{id}", "x-1").replace("{launch}", "x-1.1"));
        let body = (method != "get" && method != "delete").then(|| serde_json::json!({}));
        let (status, answer) = match method.as_str() {
            "get" => http("GET", url, None).await,
            "delete" => http("DELETE", url, None).await,
            _ => http_with(method, url, body).await,
        };
        assert_ne!(status, 405, "{method} {path}: method not allowed");
        let unrouted = status == 404 && answer.as_str().is_some_and(str::is_empty);
        assert!(!unrouted, "{method} {path}: no route");
    }
    rt.shutdown().await;
}

/// PUT and PATCH (the common helper sends bodies as POST).
async fn http_with(method: &str, url: String, body: Option<Value>) -> (u16, Value) {
    let method = method.to_uppercase();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let body = body.unwrap_or(Value::Null);
        let mut r = match method.as_str() {
            "PUT" => agent.put(&url).send_json(body),
            "PATCH" => agent.patch(&url).send_json(body),
            _ => agent.post(&url).send_json(body),
        }
        .unwrap();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (
            r.status().as_u16(),
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
    .await
    .unwrap()
}
