//! REST calls, stand-in services, free ports, and waiting on a condition.

use serde_json::Value;
use std::time::Duration;

/// A blocking REST call with a 5 s limit: GET, POST (with a body or none) or DELETE; (status, JSON
/// body or the text as a string; status 0 when no answer came).
pub fn call(method: &'static str, url: &str, body: Option<Value>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let r = match (method, body) {
        ("POST", Some(b)) => agent.post(url).send_json(b),
        ("POST", None) => agent.post(url).send_empty(),
        ("DELETE", _) => agent.delete(url).call(),
        _ => agent.get(url).call(),
    };
    match r {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
        }
        Err(e) => (0, Value::String(e.to_string())),
    }
}

/// A REST call off the async runtime (for tests whose members run in-process on tokio): POST when
/// there is a body (PUT or PATCH when `method` says so), else GET (or DELETE when `method` says so); (status, JSON body or the text as a
/// string). No time limit, and a call that gets no answer fails the test.
pub async fn http(method: &'static str, url: String, body: Option<Value>) -> (u16, Value) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut r = match (method, body) {
            ("PUT", Some(b)) => agent.put(&url).send_json(b),
            ("PATCH", Some(b)) => agent.patch(&url).send_json(b),
            (_, Some(b)) => agent.post(&url).send_json(b),
            ("DELETE", None) => agent.delete(&url).call(),
            _ => agent.get(&url).call(),
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

/// Polls `ok` every 100 ms; fails the test naming `what` after `within`.
pub fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !ok() {
        assert!(t0.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback port free at the time of asking, outside the range outgoing connections take
/// (see [`lattice_adapters::raft_net::loopback_port`]).
pub fn free_port() -> u16 {
    lattice_adapters::raft_net::loopback_port().unwrap()
}

/// Serves `app` (a stand-in for an external service) on a free loopback port of the current tokio
/// runtime: its base URL.
pub async fn serve_stand_in(app: axum::Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

/// Serves `app` on a free loopback port from its own thread and runtime, for tests whose runtime is
/// a separate process: its base URL.
pub fn serve_on_thread(app: axum::Router) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    url
}
