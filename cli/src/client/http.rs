//! The REST client of `lattice-runtime`'s API: requests (retried after a rate limit) and Server-Sent
//! Events.

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub struct Client {
    pub base: String,
    pub agent: ureq::Agent,
    /// `Authorization: Bearer` token (LATTICE_TOKEN or the config file's `token:`).
    pub token: Option<String>,
}

impl Client {
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        macro_rules! authed {
            ($req:expr) => {{
                let r = $req;
                match &auth {
                    Some(a) => r.header("Authorization", a),
                    None => r,
                }
            }};
        }
        // A request refused by the rate limit (429) was not processed: it is sent again after the
        // server's Retry-After (a few times).
        let mut tries = 0;
        let (mut resp, status) = loop {
            let resp = match (method, body) {
                ("GET", _) => authed!(self.agent.get(&url)).call(),
                ("DELETE", _) => authed!(self.agent.delete(&url)).call(),
                ("POST", Some(b)) => authed!(self.agent.post(&url)).send_json(b),
                ("POST", None) => authed!(self.agent.post(&url)).send_empty(),
                ("PUT", Some(b)) => authed!(self.agent.put(&url)).send_json(b),
                ("PATCH", Some(b)) => authed!(self.agent.patch(&url)).send_json(b),
                _ => bail!("unsupported request {method} {path}"),
            };
            let resp = resp.with_context(|| format!("cannot reach the Lattice API at {}", self.base))?;
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
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status == 401 && self.token.is_none() {
            bail!("Not logged in. Run `lattice login` first.");
        }
        if status == 404 && v.as_str() == Some("") && path.contains("/federation") {
            bail!(
                "this site has no federation: its lattice-runtime is built without the `federation` feature (HTTP 404)"
            );
        }
        if status >= 400 {
            let msg = v["error"].as_str().unwrap_or("request failed");
            match v["field"].as_str() {
                Some(f) => bail!("{msg} (field `{f}`, HTTP {status})"),
                None => bail!("{msg} (HTTP {status})"),
            }
        }
        Ok(v)
    }
}

impl Client {
    /// Reads the Server-Sent Events of `GET path`, handing each (event, JSON data) to `each` until it
    /// returns false or the server closes the stream.
    pub fn events(&self, path: &str, mut each: impl FnMut(&str, &Value) -> bool) -> Result<()> {
        use std::io::BufRead;
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.get(&url).header("Accept", "text/event-stream");
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req
            .call()
            .with_context(|| format!("cannot reach the Lattice API at {}", self.base))?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            if status == 401 && self.token.is_none() {
                bail!("Not logged in. Run `lattice login` first.");
            }
            let msg = v["error"].as_str().unwrap_or("request failed");
            match v["field"].as_str() {
                Some(f) => bail!("{msg} (field `{f}`, HTTP {status})"),
                None => bail!("{msg} (HTTP {status})"),
            }
        }
        let reader = std::io::BufReader::new(resp.into_body().into_reader());
        let mut event = String::from("message");
        for line in reader.lines() {
            let line = line.with_context(|| format!("reading the stream {url}"))?;
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
