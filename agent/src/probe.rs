//! Liveness probes (book: "Service Failure Detection"): for an allocation submitted with a
//! `liveness_probe`, the agent of each of its nodes connects to the service's port (`tcp`) or asks
//! for a path (`http`: any 2xx or 3xx answer is alive) on this node, after `initial_delay_secs` and
//! then every `period_secs`, each within `timeout_secs`. After `failure_threshold` failures in a row
//! it stops the process (as a cancellation does) and reports the run as a liveness failure; the
//! control plane ends it as failed and requeues it per its policy. Each probe runs on its own
//! thread, so a slow service never holds up the agent's loop.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The seed's `LivenessProbeSpec` (a wire type: `lattice-agent-protocol`).
pub use lattice_agent_protocol::ProbeSpec;

/// One probe of `spec` against `host`: `Ok` when alive, else why not.
pub fn check(spec: &ProbeSpec, host: &str) -> Result<(), String> {
    let timeout = Duration::from_secs(u64::from(spec.timeout_secs.max(1)));
    let addr = (host, spec.port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}:{}: {e}", spec.port))?
        .next()
        .ok_or_else(|| format!("{host}:{}: no address", spec.port))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("tcp {addr}: {e}"))?;
    if spec.probe_type != "http" {
        return Ok(());
    }
    let path = spec.path.as_deref().unwrap_or("/");
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: lattice-agent-probe\r\nConnection: close\r\n\r\n",
        spec.port
    )
    .map_err(|e| format!("http {addr}{path}: {e}"))?;
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            // A server that answers and closes at once may reset the connection after its answer.
            Err(_) if n > 0 => break,
            Err(e) => return Err(format!("http {addr}{path}: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&head[..n]);
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("http {addr}{path}: not an HTTP answer"))?;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("http {addr}{path}: status {status}"))
    }
}

/// The probes of the allocations running on this node.
#[derive(Default)]
pub struct Probes {
    /// Each probed allocation's "stop probing" flag.
    running: Mutex<BTreeMap<String, Arc<AtomicBool>>>,
    /// Allocations whose probe failed past its threshold (and why), until the loop reports them.
    failed: Arc<Mutex<BTreeMap<String, String>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Probes {
    /// Starts probing `id`'s service on `host` (this node); `stop` is its process's stop handle.
    /// `elapsed` is how long it has run already (an agent that took it over after a restart does not
    /// wait the initial delay again).
    pub fn watch(&self, id: &str, spec: ProbeSpec, host: String, stop: Arc<AtomicBool>, elapsed: Duration) {
        let done = Arc::new(AtomicBool::new(false));
        if let Some(old) = lock(&self.running).insert(id.to_string(), done.clone()) {
            old.store(true, Ordering::SeqCst);
        }
        let (failed, id) = (self.failed.clone(), id.to_string());
        std::thread::spawn(move || {
            let wait = |d: Duration| {
                // In small steps, to notice `done` soon.
                let until = std::time::Instant::now() + d;
                while std::time::Instant::now() < until {
                    if done.load(Ordering::SeqCst) {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(50).min(until - std::time::Instant::now()));
                }
                !done.load(Ordering::SeqCst)
            };
            let delay = Duration::from_secs(u64::from(spec.initial_delay_secs)).saturating_sub(elapsed);
            if !wait(delay) {
                return;
            }
            let mut failures = 0;
            loop {
                match check(&spec, &host) {
                    Ok(()) => failures = 0,
                    Err(why) => {
                        failures += 1;
                        if failures >= spec.failure_threshold.max(1) {
                            let reason = format!("liveness probe failed {failures} time(s) in a row: {why}");
                            if !done.load(Ordering::SeqCst) {
                                lock(&failed).insert(id.clone(), reason);
                                stop.store(true, Ordering::SeqCst);
                            }
                            return;
                        }
                    }
                }
                if !wait(Duration::from_secs(u64::from(spec.period_secs.max(1)))) {
                    return;
                }
            }
        });
    }

    /// Stops probing `id` (its process ended or is being stopped for another reason).
    pub fn forget(&self, id: &str) {
        if let Some(done) = lock(&self.running).remove(id) {
            done.store(true, Ordering::SeqCst);
        }
    }

    /// Why `id`'s probe stopped it, if it did (asked once, when it has ended).
    pub fn take_failed(&self, id: &str) -> Option<String> {
        lock(&self.failed).remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: &str, port: u16) -> ProbeSpec {
        ProbeSpec {
            probe_type: kind.into(),
            port,
            path: Some("/healthz".into()),
            period_secs: 1,
            initial_delay_secs: 0,
            failure_threshold: 2,
            timeout_secs: 1,
        }
    }

    /// A one-shot HTTP server answering `status` to each connection.
    fn http_server(status: u16) -> (u16, std::thread::JoinHandle<Vec<String>>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            // The whole request first (answering and closing before it is read resets the
            // connection, and the client may lose the answer).
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "the request ended early");
                req.extend_from_slice(&buf[..n]);
            }
            write!(c, "HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n").unwrap();
            vec![
                String::from_utf8_lossy(&req)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            ]
        });
        (port, h)
    }

    #[test]
    fn tcp_and_http_probes_tell_alive_from_dead() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(check(&spec("tcp", port), "127.0.0.1"), Ok(()));
        drop(l);
        assert!(check(&spec("tcp", port), "127.0.0.1").unwrap_err().contains("tcp"));
        let (port, h) = http_server(200);
        assert_eq!(check(&spec("http", port), "127.0.0.1"), Ok(()));
        assert_eq!(h.join().unwrap(), ["GET /healthz HTTP/1.1"]);
        let (port, _h) = http_server(503);
        assert!(
            check(&spec("http", port), "127.0.0.1")
                .unwrap_err()
                .contains("status 503")
        );
    }

    #[test]
    fn the_threshold_stops_the_process_once_and_says_why() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let probes = Probes::default();
        let stop = Arc::new(AtomicBool::new(false));
        probes.watch(
            "a-1",
            spec("tcp", port),
            "127.0.0.1".into(),
            stop.clone(),
            Duration::ZERO,
        );
        let t0 = std::time::Instant::now();
        while !stop.load(Ordering::SeqCst) {
            assert!(t0.elapsed() < Duration::from_secs(10), "never stopped");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Two failures a period apart: not before the second.
        assert!(t0.elapsed() >= Duration::from_millis(900), "{:?}", t0.elapsed());
        let why = probes.take_failed("a-1").unwrap();
        assert!(why.contains("2 time(s) in a row"), "{why}");
        assert_eq!(probes.take_failed("a-1"), None);
        // A forgotten probe never stops anything.
        let stop = Arc::new(AtomicBool::new(false));
        probes.watch(
            "a-2",
            spec("tcp", port),
            "127.0.0.1".into(),
            stop.clone(),
            Duration::ZERO,
        );
        probes.forget("a-2");
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!stop.load(Ordering::SeqCst) && probes.take_failed("a-2").is_none());
    }
}
