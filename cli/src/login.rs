//! `lattice login` / `logout` (book: "Login"): the OAuth 2.0 device authorization grant (RFC 8628),
//! or the manual paste flow — the authorization code grant with PKCE (RFC 7636) whose redirect the
//! user copies from the browser's address bar back into the terminal — against the IdP the server
//! names at its public `GET /api/v1/auth/discovery`, found through the IdP's OpenID discovery
//! document; tokens cached per server in `~/.config/lattice/tokens.json` with
//! mode 0600 (a looser mode is warned about and fixed); an expired access token refreshed with the
//! refresh token before a request; logout forgets the server's tokens and revokes the refresh token
//! at the IdP (RFC 7009, best effort).

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What the server publishes for login.
#[derive(Clone, Debug, Deserialize)]
pub struct Discovery {
    pub mode: String,
    pub issuer: Option<String>,
    pub idp_url: Option<String>,
    pub client_id: Option<String>,
    /// The manual flow's redirect URI registered at the IdP (default [`DEFAULT_REDIRECT_URI`]).
    #[serde(default)]
    pub redirect_uri: Option<String>,
}

/// The manual flow's redirect URI when the server names none: a loopback address nothing needs to
/// listen on (the browser shows an error page; its address bar holds the code).
pub const DEFAULT_REDIRECT_URI: &str = "http://127.0.0.1/lattice/callback";

/// The IdP's endpoints (from `/.well-known/openid-configuration`).
#[derive(Clone, Debug, Deserialize)]
pub struct Endpoints {
    #[serde(default)]
    pub authorization_endpoint: Option<String>,
    pub device_authorization_endpoint: Option<String>,
    pub token_endpoint: String,
    pub revocation_endpoint: Option<String>,
}

/// One server's cached tokens.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Entry {
    pub access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// Unix seconds; absent when the IdP did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    pub token_endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_endpoint: Option<String>,
    pub client_id: String,
}

/// What the device authorization endpoint answered: what the user must do.
#[derive(Clone, Debug, Deserialize)]
pub struct DeviceCode {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri: String,
    #[serde(default)]
    pub verification_uri_complete: Option<String>,
    #[serde(default = "expires_default")]
    pub expires_in: u64,
    #[serde(default = "interval_default")]
    pub interval: u64,
}

fn expires_default() -> u64 {
    600
}
fn interval_default() -> u64 {
    5
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `~/.config/lattice/tokens.json`.
pub fn tokens_path() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/lattice/tokens.json"))
}

/// The token cache: server base URL → its tokens.
pub struct Store {
    path: PathBuf,
}

impl Store {
    pub fn new(path: PathBuf) -> Store {
        Store { path }
    }

    /// Every server's tokens (none when the file is absent). A file others can read is warned
    /// about on stderr and set back to 0600.
    pub fn load(&self) -> Result<BTreeMap<String, Entry>> {
        use std::os::unix::fs::PermissionsExt;
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode != 0o600 {
            eprintln!(
                "warning: {} had mode {mode:o}; set to 600 (it holds your tokens)",
                self.path.display()
            );
            std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("chmod 600 {}", self.path.display()))?;
        }
        let text = std::fs::read_to_string(&self.path).with_context(|| format!("reading {}", self.path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not a token cache", self.path.display()))
    }

    /// An exclusive lock on the cache (`tokens.json.lock` beside it), held until dropped.
    pub fn lock(&self) -> Result<std::fs::File> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = self.path.with_extension("json.lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        f.lock().with_context(|| format!("locking {}", path.display()))?;
        Ok(f)
    }

    /// Writes the cache whole (a temporary file made 0600 before any token is in it, then renamed).
    pub fn save(&self, all: &BTreeMap<String, Entry>) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = self.path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(serde_json::to_string_pretty(all)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path).with_context(|| format!("writing {}", self.path.display()))
    }
}

fn json_of(mut r: ureq::http::Response<ureq::Body>, what: &str) -> Result<(u16, Value)> {
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let v = serde_json::from_str(&text).with_context(|| format!("{what}: HTTP {status}, not JSON: {text:.200}"))?;
    Ok((status, v))
}

/// The server's auth discovery.
pub fn discover(agent: &ureq::Agent, base: &str) -> Result<Discovery> {
    let url = format!("{base}/api/v1/auth/discovery");
    let r = agent
        .get(&url)
        .call()
        .with_context(|| format!("cannot reach the Lattice API at {base}"))?;
    let (status, v) = json_of(r, &url)?;
    if status != 200 {
        bail!("{url}: HTTP {status}: {v}");
    }
    serde_json::from_value(v).with_context(|| format!("{url}: unexpected answer"))
}

/// The IdP's endpoints from its OpenID discovery document.
pub fn endpoints(agent: &ureq::Agent, idp_url: &str) -> Result<Endpoints> {
    let url = format!("{}/.well-known/openid-configuration", idp_url.trim_end_matches('/'));
    let r = agent
        .get(&url)
        .call()
        .with_context(|| format!("cannot reach the IdP at {url}"))?;
    let (status, v) = json_of(r, &url)?;
    if status != 200 {
        bail!("{url}: HTTP {status}: {v}");
    }
    serde_json::from_value(v).with_context(|| format!("{url}: not an OpenID discovery document"))
}

/// A token endpoint's answer as a cache entry (the old refresh token kept when no new one came).
fn entry_of(v: &Value, ep: &Endpoints, client_id: &str, old_refresh: Option<&str>) -> Result<Entry> {
    let access = v["access_token"]
        .as_str()
        .context("the IdP's answer has no access_token")?;
    Ok(Entry {
        access_token: access.to_string(),
        refresh_token: v["refresh_token"].as_str().or(old_refresh).map(str::to_string),
        expires_at: v["expires_in"].as_u64().map(|s| now() + s),
        token_endpoint: ep.token_endpoint.clone(),
        revocation_endpoint: ep.revocation_endpoint.clone(),
        client_id: client_id.to_string(),
    })
}

/// The device authorization grant: asks for a device code, shows the user what to do (`show`), and
/// polls the token endpoint at the IdP's interval (`sleep`; `slow_down` adds 5 s) until the user
/// approved, denied, or the code expired.
pub fn device_login(
    agent: &ureq::Agent,
    ep: &Endpoints,
    client_id: &str,
    scope: &str,
    show: impl Fn(&DeviceCode),
    sleep: impl Fn(Duration),
) -> Result<Entry> {
    let device = ep
        .device_authorization_endpoint
        .as_deref()
        .context("the IdP offers no device authorization endpoint (device_authorization_endpoint)")?;
    let r = agent
        .post(device)
        .send_form([("client_id", client_id), ("scope", scope)])
        .with_context(|| format!("cannot reach {device}"))?;
    let (status, v) = json_of(r, device)?;
    if status != 200 {
        bail!(
            "{device}: HTTP {status}: {}",
            v["error_description"]
                .as_str()
                .or(v["error"].as_str())
                .unwrap_or("refused")
        );
    }
    let code: DeviceCode = serde_json::from_value(v).with_context(|| format!("{device}: not a device code"))?;
    show(&code);
    let mut interval = code.interval.max(1);
    let deadline = now() + code.expires_in;
    loop {
        sleep(Duration::from_secs(interval));
        let r = agent
            .post(&ep.token_endpoint)
            .send_form([
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", code.device_code.as_str()),
                ("client_id", client_id),
            ])
            .with_context(|| format!("cannot reach {}", ep.token_endpoint))?;
        let (status, v) = json_of(r, &ep.token_endpoint)?;
        if status == 200 {
            return entry_of(&v, ep, client_id, None);
        }
        match v["error"].as_str() {
            Some("authorization_pending") => {}
            Some("slow_down") => interval += 5,
            Some("access_denied") => bail!("login refused at the IdP (access_denied)"),
            Some("expired_token") => bail!(
                "the code {} expired before it was approved; run `lattice login` again",
                code.user_code
            ),
            other => bail!(
                "{}: HTTP {status}: {}",
                ep.token_endpoint,
                v["error_description"].as_str().or(other).unwrap_or("refused")
            ),
        }
        if now() > deadline {
            bail!(
                "the code {} expired before it was approved; run `lattice login` again",
                code.user_code
            );
        }
    }
}

/// A manual login under way: the address the user opens, and what the exchange of its code needs.
#[derive(Clone, Debug)]
pub struct ManualLogin {
    pub url: String,
    pub redirect_uri: String,
    state: String,
    verifier: String,
}

/// Base64url without padding (PKCE and state values).
fn b64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Starts a manual login: a PKCE verifier and a state from `random` (64 bytes of the OS's entropy),
/// and the IdP's authorization address asking for `scope` with them.
pub fn manual_start(
    ep: &Endpoints,
    client_id: &str,
    scope: &str,
    redirect_uri: &str,
    random: &[u8; 64],
) -> Result<ManualLogin> {
    use sha2::Digest;
    let auth = ep
        .authorization_endpoint
        .as_deref()
        .context("the IdP offers no authorization endpoint (authorization_endpoint)")?;
    let verifier = b64url(&random[..32]);
    let state = b64url(&random[32..48]);
    let challenge = b64url(&sha2::Sha256::digest(verifier.as_bytes()));
    let sep = if auth.contains('?') { '&' } else { '?' };
    let mut query = form_urlencoded::Serializer::new(String::new());
    // A refresh token (`offline_access`) is granted only on a consent asked for (OpenID Connect
    // Core 11).
    if scope.split(' ').any(|s| s == "offline_access") {
        query.append_pair("prompt", "consent");
    }
    let query = query
        .append_pair("response_type", "code")
        .append_pair("client_id", client_id)
        .append_pair("redirect_uri", redirect_uri)
        .append_pair("scope", scope)
        .append_pair("state", &state)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256")
        .finish();
    let url = format!("{auth}{sep}{query}");
    Ok(ManualLogin {
        url,
        redirect_uri: redirect_uri.to_string(),
        state,
        verifier,
    })
}

/// The code in what the user pasted: the whole address the browser was sent to (its `state` must be
/// this login's; an `error` the IdP sent is the refusal), or the code alone.
pub fn pasted_code(m: &ManualLogin, pasted: &str) -> Result<String> {
    let pasted = pasted.trim();
    if pasted.is_empty() {
        bail!("nothing pasted: paste the address your browser was sent to (or the code)");
    }
    let Some((_, query)) = pasted.split_once('?') else {
        return Ok(pasted.to_string());
    };
    let query = query.split('#').next().unwrap_or_default();
    let params: BTreeMap<String, String> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    if let Some(e) = params.get("error") {
        bail!(
            "login refused at the IdP ({e}{})",
            params
                .get("error_description")
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        );
    }
    if params.get("state") != Some(&m.state) {
        bail!(
            "the pasted address belongs to another login (its state differs); run `lattice login --flow manual` again"
        );
    }
    params.get("code").cloned().context("the pasted address has no code")
}

/// Exchanges the authorization code (with the PKCE verifier) for tokens.
pub fn manual_finish(
    agent: &ureq::Agent,
    ep: &Endpoints,
    client_id: &str,
    m: &ManualLogin,
    code: &str,
) -> Result<Entry> {
    let r = agent
        .post(&ep.token_endpoint)
        .send_form([
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", m.redirect_uri.as_str()),
            ("client_id", client_id),
            ("code_verifier", m.verifier.as_str()),
        ])
        .with_context(|| format!("cannot reach {}", ep.token_endpoint))?;
    let (status, v) = json_of(r, &ep.token_endpoint)?;
    if status != 200 {
        bail!(
            "the IdP refused the code: HTTP {status}: {}",
            v["error_description"]
                .as_str()
                .or(v["error"].as_str())
                .unwrap_or("refused")
        );
    }
    entry_of(&v, ep, client_id, None)
}

/// A fresh access token for `e` from its refresh token.
pub fn refresh(agent: &ureq::Agent, e: &Entry) -> Result<Entry> {
    let rt = e.refresh_token.as_deref().context("no refresh token")?;
    let form = [
        ("grant_type", "refresh_token"),
        ("refresh_token", rt),
        ("client_id", e.client_id.as_str()),
    ];
    // A kept-alive connection the IdP closed meanwhile fails before the request is read: sent again
    // once, on a new connection.
    let r = match agent.post(&e.token_endpoint).send_form(form) {
        Err(ureq::Error::Io(io))
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ) =>
        {
            agent.post(&e.token_endpoint).send_form(form)
        }
        r => r,
    }
    .with_context(|| format!("cannot reach {}", e.token_endpoint))?;
    let (status, v) = json_of(r, &e.token_endpoint)?;
    if status != 200 {
        bail!(
            "refreshing the token: HTTP {status}: {}",
            v["error"].as_str().unwrap_or("refused")
        );
    }
    let ep = Endpoints {
        authorization_endpoint: None,
        device_authorization_endpoint: None,
        token_endpoint: e.token_endpoint.clone(),
        revocation_endpoint: e.revocation_endpoint.clone(),
    };
    entry_of(&v, &ep, &e.client_id, Some(rt))
}

/// Seconds before its expiry an access token is refreshed.
const EARLY: u64 = 30;

/// The cached access token for `server`: refreshed (and the cache rewritten) when it expires within
/// 30 s and there is a refresh token; `None` when there is none or it expired beyond repair.
///
/// The IdP may rotate refresh tokens (each one good for one refresh, a reused one revoking the
/// login): refreshes of the same cache, from threads or processes, take turns under a lock on
/// `tokens.json.lock`, and each reads the cache again once it holds the lock.
pub fn token_for(agent: &ureq::Agent, store: &Store, server: &str) -> Result<Option<String>> {
    let stale = |e: &Entry| e.expires_at.is_some_and(|t| t <= now() + EARLY);
    // Without a login, or with a fresh token, no lock (nothing is written).
    match store.load()?.get(server) {
        None => return Ok(None),
        Some(e) if !stale(e) => return Ok(Some(e.access_token.clone())),
        Some(_) => {}
    }
    let _turn = store.lock()?;
    let mut all = store.load()?;
    let Some(e) = all.get(server).cloned() else {
        return Ok(None);
    };
    // Another process may have refreshed it while this one waited for the lock.
    if !stale(&e) {
        return Ok(Some(e.access_token));
    }
    if e.refresh_token.is_none() {
        return Ok(e.expires_at.filter(|t| *t > now()).map(|_| e.access_token));
    }
    match refresh(agent, &e) {
        Ok(fresh) => {
            let token = fresh.access_token.clone();
            all.insert(server.to_string(), fresh);
            store.save(&all)?;
            Ok(Some(token))
        }
        Err(err) => {
            eprintln!("warning: {err:#}");
            Ok(e.expires_at.filter(|t| *t > now()).map(|_| e.access_token))
        }
    }
}

/// Forgets `server`'s tokens and revokes its refresh token (else its access token) at the IdP, best
/// effort. Whether there were any.
pub fn logout(agent: &ureq::Agent, store: &Store, server: &str) -> Result<bool> {
    let _turn = store.lock()?;
    let mut all = store.load()?;
    let Some(e) = all.remove(server) else {
        return Ok(false);
    };
    store.save(&all)?;
    if let Some(url) = &e.revocation_endpoint {
        let (token, hint) = match &e.refresh_token {
            Some(r) => (r.as_str(), "refresh_token"),
            None => (e.access_token.as_str(), "access_token"),
        };
        let r = agent.post(url).send_form([
            ("token", token),
            ("token_type_hint", hint),
            ("client_id", e.client_id.as_str()),
        ]);
        if let Err(err) = r.map_err(anyhow::Error::from).and_then(|r| {
            if r.status().is_success() {
                Ok(())
            } else {
                bail!("HTTP {}", r.status())
            }
        }) {
            eprintln!("warning: revoking the token at {url}: {err:#} (it is forgotten here anyway)");
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7636 Appendix B: its 32 octets give its verifier and S256 challenge; the address asks for
    /// them, the state and consent (for the refresh token); a pasted address is read for its code
    /// only with this login's state; an IdP's error is the refusal; a bare code is taken as is.
    #[test]
    fn the_manual_flow_uses_pkce_and_checks_the_pasted_state() {
        let mut random = [7u8; 64];
        random[..32].copy_from_slice(&[
            116, 24, 223, 180, 151, 153, 224, 37, 79, 250, 96, 125, 216, 173, 187, 186, 22, 212, 37, 77, 105, 214, 191,
            240, 91, 88, 5, 88, 83, 132, 141, 121,
        ]);
        let ep = Endpoints {
            authorization_endpoint: Some("https://idp.example/auth".into()),
            device_authorization_endpoint: None,
            token_endpoint: "https://idp.example/token".into(),
            revocation_endpoint: None,
        };
        let m = manual_start(&ep, "lattice", "openid offline_access", DEFAULT_REDIRECT_URI, &random).unwrap();
        assert_eq!(m.verifier, "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk");
        let q: BTreeMap<String, String> = form_urlencoded::parse(m.url.split_once('?').unwrap().1.as_bytes())
            .into_owned()
            .collect();
        assert_eq!(q["code_challenge"], "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["redirect_uri"], DEFAULT_REDIRECT_URI);
        assert_eq!(
            (q["prompt"].as_str(), q["state"].as_str()),
            ("consent", m.state.as_str())
        );
        let back = format!("{DEFAULT_REDIRECT_URI}?code=abc%2Fd&state={}&iss=x", m.state);
        assert_eq!(pasted_code(&m, &format!("  {back}\n")).unwrap(), "abc/d");
        assert_eq!(pasted_code(&m, "abc").unwrap(), "abc");
        let other = format!("{DEFAULT_REDIRECT_URI}?code=abc&state=other");
        assert!(
            pasted_code(&m, &other)
                .unwrap_err()
                .to_string()
                .contains("another login")
        );
        let denied = format!(
            "{DEFAULT_REDIRECT_URI}?error=access_denied&error_description=no+way&state={}",
            m.state
        );
        assert_eq!(
            pasted_code(&m, &denied).unwrap_err().to_string(),
            "login refused at the IdP (access_denied: no way)"
        );
        assert!(pasted_code(&m, " ").is_err());
        let none = Endpoints {
            authorization_endpoint: None,
            ..ep
        };
        assert!(manual_start(&none, "lattice", "openid", DEFAULT_REDIRECT_URI, &random).is_err());
    }

    #[test]
    fn the_cache_is_written_0600_and_a_loose_one_is_fixed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("lattice-tokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::new(dir.join("lattice/tokens.json"));
        assert!(store.load().unwrap().is_empty());
        let mut all = BTreeMap::new();
        all.insert(
            "http://a".to_string(),
            Entry {
                access_token: "t".into(),
                token_endpoint: "http://idp/token".into(),
                client_id: "lattice".into(),
                ..Entry::default()
            },
        );
        store.save(&all).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("lattice/tokens.json")), 0o600);
        std::fs::set_permissions(dir.join("lattice/tokens.json"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(store.load().unwrap(), all);
        assert_eq!(mode(&dir.join("lattice/tokens.json")), 0o600);
        std::fs::write(dir.join("lattice/tokens.json"), "[").unwrap();
        let e = store.load().unwrap_err().to_string();
        assert!(e.contains("tokens.json"), "{e}");
    }

    #[test]
    fn a_token_without_expiry_or_still_fresh_is_used_as_is() {
        let dir = std::env::temp_dir().join(format!("lattice-tokens-fresh-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::new(dir.join("tokens.json"));
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut all = BTreeMap::new();
        let e = |t: &str, exp: Option<u64>| Entry {
            access_token: t.into(),
            expires_at: exp,
            // Unreachable: a refresh would fail the test.
            token_endpoint: "http://127.0.0.1:1/token".into(),
            client_id: "c".into(),
            ..Entry::default()
        };
        all.insert("a".to_string(), e("ta", None));
        all.insert("b".to_string(), e("tb", Some(now() + 3600)));
        all.insert("c".to_string(), e("tc", Some(now() - 1)));
        store.save(&all).unwrap();
        assert_eq!(token_for(&agent, &store, "a").unwrap().as_deref(), Some("ta"));
        assert_eq!(token_for(&agent, &store, "b").unwrap().as_deref(), Some("tb"));
        assert_eq!(
            token_for(&agent, &store, "c").unwrap(),
            None,
            "expired, no refresh token"
        );
        assert_eq!(token_for(&agent, &store, "z").unwrap(), None);
    }
}
