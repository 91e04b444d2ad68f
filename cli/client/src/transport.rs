//! The REST transport: requests to the quorum's members in turn (past one that is down or not the
//! leader, to the leader a member names), retried after a rate limit, and Server-Sent Events.

use crate::error::{Error, Result};
use serde_json::Value;

pub struct Client {
    /// The members' REST endpoints (`LATTICE_ENDPOINT=A,B,C`, the config file's `endpoints:`), in
    /// the order given; a request moves on from one that is down or not the leader.
    pub endpoints: Vec<String>,
    /// The endpoint that answered last (where the next request goes first).
    current: std::sync::atomic::AtomicUsize,
    /// A leader a member named (its 421's `leader_url`) that is not among the endpoints, once it
    /// answered: tried first.
    named: std::sync::Mutex<Option<String>>,
    pub agent: ureq::Agent,
    /// `Authorization: Bearer` token (LATTICE_TOKEN, the config file's `token:`, or `lattice login`'s
    /// cached one).
    token: std::sync::RwLock<Option<String>>,
    /// How a fresh token is had when the server ends a stream because its token expired (`lattice
    /// login`'s refresh); `None`: the token cannot be renewed.
    renew: Option<Renew>,
    renewing: std::sync::Mutex<()>,
    /// Each request on stderr (`lattice -v`): method, URL, status and time taken.
    trace: bool,
}

/// Why an endpoint gave no answer.
type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A source of fresh access tokens.
pub type Renew = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// One endpoint's answer, or why there was none.
enum Attempt {
    Answer(u16, Value),
    /// Not reached: nothing was sent (refused, unknown host) — any request may go elsewhere.
    NotConnected(Cause),
    /// Sent, but no answer came back: only a read may be sent elsewhere.
    Lost(Cause),
}

/// The leader's REST URL a 421 names.
fn leader_url(v: &Value) -> Option<String> {
    v["leader_url"]
        .as_str()
        .map(|u| u.trim_end_matches('/').to_string())
        .filter(|u| !u.is_empty())
}

/// The endpoints in `spec` ("A,B,C"; spaces and trailing slashes dropped).
pub fn endpoints(spec: &str) -> Vec<String> {
    spec.split(',')
        .map(|e| e.trim().trim_end_matches('/').to_string())
        .filter(|e| !e.is_empty())
        .collect()
}

impl Client {
    /// A client of `endpoints` ("A,B,C": the quorum's members) with its own HTTP agent (the system's
    /// roots for `https://`), and a bearer token when the API wants one.
    pub fn connect(endpoints: &str, token: Option<String>) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        Client::new(self::endpoints(endpoints), agent, token)
    }

    /// A client of `endpoints` (at least one), over `agent` (which must not turn HTTP statuses into
    /// errors: refusals are read from the answer).
    pub fn new(endpoints: Vec<String>, agent: ureq::Agent, token: Option<String>) -> Client {
        Client {
            endpoints,
            current: std::sync::atomic::AtomicUsize::new(0),
            named: std::sync::Mutex::new(None),
            agent,
            token: std::sync::RwLock::new(token),
            renew: None,
            renewing: std::sync::Mutex::new(()),
            trace: false,
        }
    }

    /// With `on`, each request is written to stderr: `lattice: GET URL -> 200 (3 ms)`.
    pub fn with_trace(mut self, on: bool) -> Client {
        self.trace = on;
        self
    }

    /// The client renews its token with `renew` when a stream ends because its token expired.
    pub fn with_renewal(mut self, renew: Renew) -> Client {
        self.renew = Some(renew);
        self
    }

    /// The access token requests carry.
    pub fn token(&self) -> Option<String> {
        self.token.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces `expired`, the token a stream was opened with, by a fresh one from the renewal
    /// source: whether the token now differs from it (a stream ended for its token's expiry is then
    /// opened again from where it was). Streams of one client renew one at a time, and one whose
    /// token another already replaced takes that one.
    pub fn renew_token(&self, expired: Option<&str>) -> bool {
        let Some(renew) = &self.renew else {
            return false;
        };
        let _turn = self.renewing.lock().unwrap_or_else(|e| e.into_inner());
        if self.token().as_deref() != expired {
            return true;
        }
        let Some(fresh) = renew() else {
            return false;
        };
        let mut t = self.token.write().unwrap_or_else(|e| e.into_inner());
        let changed = t.as_deref() != Some(fresh.as_str());
        *t = Some(fresh);
        changed
    }

    /// The endpoint requests go to first (the one that answered last).
    pub fn base(&self) -> &str {
        &self.endpoints[self
            .current
            .load(std::sync::atomic::Ordering::Relaxed)
            .min(self.endpoints.len() - 1)]
    }

    /// Where a request goes, in order: the leader a member named (when it answered), then the
    /// endpoints from the one that answered last.
    fn candidates(&self) -> std::collections::VecDeque<String> {
        let n = self.endpoints.len();
        let first = self.current.load(std::sync::atomic::Ordering::Relaxed) % n;
        let named = self.named.lock().unwrap_or_else(|e| e.into_inner()).clone();
        named
            .into_iter()
            .chain((0..n).map(|k| self.endpoints[(first + k) % n].clone()))
            .collect()
    }

    /// `base` answered: the next request goes there first.
    fn answered(&self, base: &str) {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        match self.endpoints.iter().position(|e| e == base) {
            Some(i) => {
                self.current.store(i, std::sync::atomic::Ordering::Relaxed);
                *named = None;
            }
            None => *named = Some(base.to_string()),
        }
    }

    /// Sends the request to the endpoints in turn, from the one that answered last: a member that is
    /// down (nothing sent) or not the leader (HTTP 421, nothing done) passes it on — to the leader
    /// it names (`leader_url`) first, else to the next; a read also moves on from one that took it
    /// and never answered.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let mut queue = self.candidates();
        let mut seen = std::collections::BTreeSet::new();
        let mut tried = Vec::new();
        while let Some(base) = queue.pop_front() {
            if !seen.insert(base.clone()) {
                continue;
            }
            let last = queue.iter().all(|b| seen.contains(b));
            match self.send(&base, method, path, body) {
                Attempt::Answer(421, v) if !last || leader_url(&v).is_some_and(|u| !seen.contains(&u)) => {
                    tried.push(format!("{base}: not the leader"));
                    if let Some(u) = leader_url(&v) {
                        queue.push_front(u);
                    }
                }
                Attempt::Answer(status, v) => {
                    if status != 421 {
                        self.answered(&base);
                    }
                    return self.answer(status, v, path);
                }
                Attempt::NotConnected(e) if !last => tried.push(format!("{base}: {e}")),
                Attempt::Lost(e) if !last && method == "GET" => tried.push(format!("{base}: {e}")),
                Attempt::NotConnected(e) | Attempt::Lost(e) => {
                    let tried = if tried.is_empty() {
                        String::new()
                    } else {
                        format!(" (after {})", tried.join("; "))
                    };
                    return Err(Error::Unreachable {
                        endpoint: base,
                        tried,
                        source: e,
                    });
                }
            }
        }
        unreachable!("the last endpoint always answers or fails")
    }

    /// One endpoint's answer (a request refused by the rate limit, 429, was not processed: it is
    /// sent again after the server's Retry-After, a few times).
    fn send(&self, base: &str, method: &str, path: &str, body: Option<&Value>) -> Attempt {
        let url = format!("{base}{path}");
        let auth = self.token().map(|t| format!("Bearer {t}"));
        macro_rules! authed {
            ($req:expr) => {{
                let r = $req;
                match &auth {
                    Some(a) => r.header("Authorization", a),
                    None => r,
                }
            }};
        }
        let mut tries = 0;
        let t0 = std::time::Instant::now();
        let (mut resp, status) = loop {
            let resp = match (method, body) {
                ("GET", _) => authed!(self.agent.get(&url)).call(),
                ("DELETE", _) => authed!(self.agent.delete(&url)).call(),
                ("POST", Some(b)) => authed!(self.agent.post(&url)).send_json(b),
                ("POST", None) => authed!(self.agent.post(&url)).send_empty(),
                ("PUT", Some(b)) => authed!(self.agent.put(&url)).send_json(b),
                ("PATCH", Some(b)) => authed!(self.agent.patch(&url)).send_json(b),
                _ => return Attempt::NotConnected(format!("unsupported request {method} {path}").into()),
            };
            if self.trace {
                let what = resp
                    .as_ref()
                    .map_or_else(|e| e.to_string(), |r| r.status().as_u16().to_string());
                eprintln!("lattice: {method} {url} -> {what} ({} ms)", t0.elapsed().as_millis());
            }
            let resp = match resp {
                Ok(r) => r,
                Err(e @ (ureq::Error::ConnectionFailed | ureq::Error::HostNotFound | ureq::Error::BadUri(_))) => {
                    return Attempt::NotConnected(e.into());
                }
                Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Attempt::NotConnected(e.into());
                }
                Err(e) => return Attempt::Lost(e.into()),
            };
            let status = resp.status().as_u16();
            tries += 1;
            if status != 429 || tries > 5 {
                break (resp, status);
            }
            let wait = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .unwrap_or(1.0)
                .min(30.0);
            std::thread::sleep(std::time::Duration::from_secs_f64(wait));
        };
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Attempt::Answer(status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// The answer's JSON, or the refusal it says.
    fn answer(&self, status: u16, v: Value, path: &str) -> Result<Value> {
        if status == 401 && self.token().is_none() {
            return Err(Error::NotLoggedIn);
        }
        if status == 404 && v.as_str() == Some("") && path.contains("/federation") {
            return Err(Error::NoFederation);
        }
        if status >= 400 {
            return Err(Error::api(status, v));
        }
        Ok(v)
    }
}

impl Client {
    /// Reads the Server-Sent Events of `GET path`, handing each (event, JSON data) to `each` until it
    /// returns false or the server closes the stream.
    pub fn events(&self, path: &str, mut each: impl FnMut(&str, &Value) -> bool) -> Result<()> {
        use std::io::BufRead;
        // From the member that answered last, moving on from one that is down or not the leader
        // (to the leader it names first).
        let mut queue = self.candidates();
        let mut seen = std::collections::BTreeSet::new();
        let (mut resp, url) = loop {
            let Some(base) = queue.pop_front() else {
                return Err(Error::Request("no Lattice API endpoint answered".into()));
            };
            if !seen.insert(base.clone()) {
                continue;
            }
            let more = queue.iter().any(|b| !seen.contains(b));
            let url = format!("{base}{path}");
            let mut req = self.agent.get(&url).header("Accept", "text/event-stream");
            if let Some(t) = self.token() {
                req = req.header("Authorization", format!("Bearer {t}"));
            }
            let answer = req.call();
            if self.trace {
                let what = answer
                    .as_ref()
                    .map_or_else(|e| e.to_string(), |r| r.status().as_u16().to_string());
                eprintln!("lattice: GET {url} (stream) -> {what}");
            }
            match answer {
                Ok(mut r) if r.status().as_u16() == 421 => {
                    let text = r.body_mut().read_to_string().unwrap_or_default();
                    let named = serde_json::from_str(&text).ok().and_then(|v| leader_url(&v));
                    match named.filter(|u| !seen.contains(u)) {
                        Some(u) => queue.push_front(u),
                        None if more => {}
                        None => {
                            return Err(Error::api(
                                421,
                                serde_json::json!({"error": format!("not the quorum leader at {base}")}),
                            ));
                        }
                    }
                }
                Ok(r) => {
                    self.answered(&base);
                    break (r, url);
                }
                Err(_) if more => continue,
                Err(e) => {
                    return Err(Error::Unreachable {
                        endpoint: base,
                        tried: String::new(),
                        source: e.into(),
                    });
                }
            }
        };
        let status = resp.status().as_u16();
        if status >= 400 {
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            if status == 401 && self.token().is_none() {
                return Err(Error::NotLoggedIn);
            }
            return Err(Error::api(status, v));
        }
        let reader = std::io::BufReader::new(resp.into_body().into_reader());
        let mut event = String::from("message");
        for line in reader.lines() {
            let line = line.map_err(|source| Error::Stream {
                url: url.clone(),
                source,
            })?;
            if let Some(e) = line.strip_prefix("event:") {
                event = e.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                let v: Value = serde_json::from_str(d.trim()).unwrap_or(Value::String(d.trim().to_string()));
                if !each(&event, &v) {
                    break;
                }
            } else if line.is_empty() {
                event = "message".into();
            }
        }
        Ok(())
    }
}
