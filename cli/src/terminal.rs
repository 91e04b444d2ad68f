//! `lattice attach` and `lattice session`'s terminal: the local terminal in raw mode (every key,
//! Ctrl-C included, goes to the remote terminal), its size sent at the start and on every SIGWINCH,
//! relayed over the runtime's WebSocket `GET /v1/allocations/{id}/attach` (book: "Attach to Running
//! Allocation"). The remote terminal's exit status is the caller's.

use anyhow::{Context, Result, bail};
use lattice_util::url;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// The size of the local terminal (rows, cols), when stdout is one.
pub fn size() -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ writes a winsize.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        (libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_row > 0).then_some((ws.ws_row, ws.ws_col))
    }
}

/// The local terminal in raw mode until dropped (when stdin is a terminal).
struct Raw(Option<libc::termios>);

impl Raw {
    fn enter() -> Raw {
        // SAFETY: termios calls on stdin; the saved state is restored on drop.
        unsafe {
            if libc::isatty(0) != 1 {
                return Raw(None);
            }
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return Raw(None);
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            libc::tcsetattr(0, libc::TCSANOW, &t);
            Raw(Some(saved))
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            // SAFETY: restores the state saved at entry.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, t);
            }
        }
    }
}

static RESIZED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_winch(_: libc::c_int) {
    RESIZED.store(true, Ordering::SeqCst);
}

/// `ws://` or `wss://` for an `http(s)://` endpoint, with the terminal's query.
pub fn url(base: &str, id: &str, node: Option<&str>, command: Option<&str>, rows: u16, cols: u16) -> Result<String> {
    at(
        base,
        &format!("/v1/allocations/{}/attach", url::segment(id)),
        node,
        command,
        rows,
        cols,
    )
}

/// A session's terminal (`GET /v1/sessions/{id}/terminal`).
pub fn session_url(base: &str, id: &str, rows: u16, cols: u16) -> Result<String> {
    at(
        base,
        &format!("/v1/sessions/{}/terminal", url::segment(id)),
        None,
        None,
        rows,
        cols,
    )
}

fn at(base: &str, path: &str, node: Option<&str>, command: Option<&str>, rows: u16, cols: u16) -> Result<String> {
    let ws = if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else {
        bail!("{base}: the endpoint must be http:// or https://");
    };
    let mut q = vec![format!("rows={rows}"), format!("cols={cols}")];
    if let Ok(t) = std::env::var("TERM") {
        q.push(format!("term={}", url::component(&t)));
    }
    if let Some(n) = node {
        q.push(format!("node={}", url::component(n)));
    }
    if let Some(c) = command {
        q.push(format!("command={}", url::component(c)));
    }
    Ok(format!("{ws}{path}?{}", q.join("&")))
}

fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
    )
}

/// Sends `m`, finishing the write when a signal (SIGWINCH) interrupted it; whether it went.
fn deliver(ws: &mut tungstenite::WebSocket<std::net::TcpStream>, m: tungstenite::Message) -> bool {
    match ws.send(m) {
        Ok(()) => true,
        Err(tungstenite::Error::Io(e)) if transient(&e) => {
            for _ in 0..1000 {
                match ws.flush() {
                    Ok(()) => return true,
                    Err(tungstenite::Error::Io(e)) if transient(&e) => {}
                    Err(_) => return false,
                }
            }
            false
        }
        Err(_) => false,
    }
}

/// Runs a terminal session against `url` until the remote side ends; its exit status.
pub fn run(url: &str, token: Option<&str>) -> Result<i32> {
    use tungstenite::Message;
    use tungstenite::client::IntoClientRequest;
    if url.starts_with("wss://") {
        bail!("attach over https is not supported by this client yet; use the gRPC Attach or an http:// endpoint");
    }
    let mut req = url.into_client_request().context("the attach URL")?;
    if let Some(t) = token {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().context("LATTICE_TOKEN")?);
    }
    let host = req.uri().host().unwrap_or("127.0.0.1").to_string();
    let port = req.uri().port_u16().unwrap_or(80);
    let stream = std::net::TcpStream::connect((host.as_str(), port))
        .with_context(|| format!("cannot reach the Lattice API at {host}:{port}"))?;
    let (mut ws, _) = match tungstenite::client(req, stream) {
        Ok(x) => x,
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
            let body = resp.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let msg = v["error"].as_str().unwrap_or("refused");
            match v["field"].as_str() {
                Some(f) => bail!("{msg} (field `{f}`, HTTP {})", resp.status().as_u16()),
                None => bail!("{msg} (HTTP {})", resp.status().as_u16()),
            }
        }
        Err(e) => bail!("attach: {e}"),
    };
    ws.get_mut()
        .set_read_timeout(Some(std::time::Duration::from_millis(10)))
        .context("socket")?;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGWINCH, on_winch as *const () as libc::sighandler_t);
    }
    let raw = Raw::enter();
    let mut stdin_open = true;
    let mut out = std::io::stdout();
    let code = loop {
        if RESIZED.swap(false, Ordering::SeqCst)
            && let Some((rows, cols)) = size()
        {
            let _ = deliver(
                &mut ws,
                Message::Text(json!({"resize": {"rows": rows, "cols": cols}}).to_string().into()),
            );
        }
        if stdin_open {
            let mut pfd = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one descriptor for 10 ms.
            let ready = unsafe { libc::poll(&mut pfd, 1, 10) } > 0;
            if ready {
                let mut buf = [0u8; 4096];
                match std::io::stdin().read(&mut buf) {
                    // A signal (SIGWINCH) interrupted the read: nothing was read.
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Ok(0) | Err(_) => {
                        // End of input (not a terminal): the remote terminal's end-of-file.
                        stdin_open = false;
                        let _ = deliver(&mut ws, Message::Binary(vec![4u8].into()));
                    }
                    Ok(n) => {
                        if !deliver(&mut ws, Message::Binary(buf[..n].to_vec().into())) {
                            break 255;
                        }
                    }
                }
            }
        } else {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        match ws.read() {
            Ok(Message::Binary(b)) => {
                let _ = out.write_all(&b);
                let _ = out.flush();
            }
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                if let Some(c) = v["exit_code"].as_i64() {
                    break c as i32;
                }
                if let Some(e) = v["error"].as_str() {
                    drop(raw);
                    eprintln!("\r\nlattice attach: {e}");
                    return Ok(255);
                }
            }
            Ok(Message::Close(_)) => break 255,
            Ok(_) => {}
            // Nothing yet, or a signal (SIGWINCH) interrupted the wait: try again.
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                drop(raw);
                eprintln!("\r\nlattice attach: connection lost — attach session ended ({e})");
                return Ok(255);
            }
        }
    };
    let _ = ws.close(None);
    drop(raw);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attach_url_carries_the_terminal() {
        let u = url("http://h:8080", "a-000001", Some("n 1"), Some("top -b"), 40, 120).unwrap();
        assert!(
            u.starts_with("ws://h:8080/v1/allocations/a-000001/attach?rows=40&cols=120"),
            "{u}"
        );
        assert!(u.contains("&node=n%201") && u.ends_with("&command=top%20-b"), "{u}");
        assert!(url("https://h", "a", None, None, 1, 1).unwrap().starts_with("wss://h/"));
        assert!(url("ftp://h", "a", None, None, 1, 1).is_err());
    }
}
