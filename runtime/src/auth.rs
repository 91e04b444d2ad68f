//! Authentication and authorization of the API (book: "Authentication & Authorization"): OIDC/JWT
//! bearer tokens — RS256/ES256 against the IdP's keys (from its discovery document's `jwks_uri`,
//! refetched when a token names a new key id, or from a JWKS file), or an HS256 secret for
//! development — whose holder, tenant and role come from standard claims by the site's rules
//! ([`crate::oidc`]); the seed's roles decide what each request may do,
//! with tenant scoping (a user sees only their own allocations, a tenant admin their tenant's); and a
//! per-user rate limit answering 429 with `Retry-After`. With `mode: none` (the minimal dev config)
//! every request acts as a system administrator.

use crate::oidc::{self, ClaimRules, Key};
pub use crate::principal::{Principal, Role};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header, jwk::JwkSet};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication (development): every request is a system administrator.
    #[default]
    None,
    /// Bearer JWTs are required on every `/v1` and `/api/v1` request.
    Jwt,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub mode: AuthMode,
    /// The IdP's JSON Web Key Set as a file (fixed keys).
    pub jwks_file: Option<PathBuf>,
    /// Where the IdP publishes its keys (default, without `jwks_file`: the `jwks_uri` of the
    /// issuer's `/.well-known/openid-configuration`). Fetched at start and again when a token names a
    /// key id not yet known (key rotation), at most once per `jwks_refresh_min_s`.
    pub jwks_uri: Option<String>,
    #[serde(default = "default_refresh")]
    pub jwks_refresh_min_s: u64,
    /// How standard claims name the user, the tenant and the role ([`ClaimRules`]).
    #[serde(default)]
    pub claims: ClaimRules,
    /// HS256 development secret (never in production).
    pub hs256_secret: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    /// The client id `lattice login` asks the IdP for tokens as (default: `audience`); published by
    /// the public `GET /api/v1/auth/discovery`.
    pub client_id: Option<String>,
    /// Where users' browsers and the CLI reach the IdP (default: `issuer`).
    pub idp_url: Option<String>,
    /// The redirect URI registered at the IdP for the `lattice` client's authorization code flow
    /// (`lattice login --flow manual`: the user pastes the address the browser was sent to); default
    /// the CLI's, `http://127.0.0.1/lattice/callback`.
    pub redirect_uri: Option<String>,
    /// Requests per user per minute before 429.
    #[serde(default = "default_rate")]
    pub rate_limit_per_minute: u32,
}

fn default_rate() -> u32 {
    600
}

fn default_refresh() -> u64 {
    10
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::None,
            jwks_file: None,
            jwks_uri: None,
            jwks_refresh_min_s: default_refresh(),
            claims: ClaimRules::default(),
            hs256_secret: None,
            issuer: None,
            audience: None,
            client_id: None,
            idp_url: None,
            redirect_uri: None,
            rate_limit_per_minute: default_rate(),
        }
    }
}

/// Why a request is refused before it reaches a handler.
#[derive(Debug, PartialEq)]
pub enum Refusal {
    /// 401: no or bad token.
    Unauthenticated(String),
    /// 429 with `Retry-After` seconds.
    RateLimited(u64),
}

pub struct Authenticator {
    cfg: AuthConfig,
    /// Fixed keys: the JWKS file's and the HS256 secret.
    keys: Vec<Key>,
    /// The issuer whose discovery document names where its keys are (when no URL is configured).
    discover: Option<String>,
    /// Where the IdP's current keys are fetched from (configured, or discovered), and the keys
    /// last fetched.
    jwks_uri: Mutex<Option<String>>,
    fetched: RwLock<Vec<Key>>,
    /// When the last fetch of the IdP's keys started (refetches are rate limited).
    last_fetch: Mutex<Option<tokio::time::Instant>>,
    /// user → (minute, requests in it).
    window: Mutex<BTreeMap<String, (u64, u32)>>,
    /// Rate-limit windows count from here on the monotonic clock (a system clock jump does not open
    /// or close a window).
    started: tokio::time::Instant,
}

#[derive(Debug, thiserror::Error)]
#[error("auth: {0}")]
pub struct AuthSetupError(String);

impl Authenticator {
    pub fn new(cfg: AuthConfig) -> Result<Authenticator, AuthSetupError> {
        let mut keys = Vec::new();
        let mut discover = None;
        if cfg.mode == AuthMode::Jwt {
            if let Some(path) = &cfg.jwks_file {
                let text =
                    std::fs::read_to_string(path).map_err(|e| AuthSetupError(format!("{}: {e}", path.display())))?;
                let set: JwkSet = serde_json::from_str(&text)
                    .map_err(|e| AuthSetupError(format!("{}: not a JWKS: {e}", path.display())))?;
                for k in &set.keys {
                    DecodingKey::from_jwk(k).map_err(|e| AuthSetupError(format!("{}: {e}", path.display())))?;
                }
                keys.extend(oidc::keys_of(&set));
            }
            if let Some(secret) = &cfg.hs256_secret {
                keys.push((None, DecodingKey::from_secret(secret.as_bytes()), Algorithm::HS256));
            }
            if cfg.jwks_uri.is_none() && cfg.jwks_file.is_none() {
                discover = cfg.issuer.clone();
            }
            if (cfg.jwks_uri.is_some() || discover.is_some()) && cfg.audience.is_none() {
                // Every client of the IdP gets tokens its keys sign: only the audience tells ours.
                return Err(AuthSetupError(
                    "keys from an OIDC provider (`issuer` or `jwks_uri`) need `audience`: the client id tokens for Lattice carry".into(),
                ));
            }
            if keys.is_empty() && cfg.jwks_uri.is_none() && discover.is_none() {
                return Err(AuthSetupError(
                    "mode jwt needs `issuer` (OIDC discovery), `jwks_uri`, `jwks_file` or `hs256_secret`".into(),
                ));
            }
        }
        let a = Authenticator {
            jwks_uri: Mutex::new(cfg.jwks_uri.clone()),
            cfg,
            keys,
            discover,
            fetched: RwLock::new(Vec::new()),
            last_fetch: Mutex::new(None),
            window: Mutex::new(BTreeMap::new()),
            started: tokio::time::Instant::now(),
        };
        // An IdP that is down at start is not fatal: the first token with an unknown key tries again.
        a.refresh_keys();
        Ok(a)
    }

    /// What `GET /api/v1/auth/discovery` publishes so `lattice login` can find the IdP: `mode`
    /// (`none` or `jwt`), and with JWTs `issuer`, `idp_url` (default: the issuer), `client_id`
    /// (default: the audience) and the `redirect_uri` of the manual flow when configured. Public: it
    /// holds no secret.
    pub fn discovery(&self) -> serde_json::Value {
        let c = &self.cfg;
        let mode = match c.mode {
            AuthMode::None => "none",
            AuthMode::Jwt => "jwt",
        };
        serde_json::json!({
            "mode": mode,
            "issuer": c.issuer,
            "idp_url": c.idp_url.as_ref().or(c.issuer.as_ref()),
            "client_id": c.client_id.as_ref().or(c.audience.as_ref()),
            "redirect_uri": c.redirect_uri,
        })
    }

    /// Authenticates the `Authorization` header's bearer token and applies the rate limit.
    pub fn check(&self, authorization: Option<&str>) -> Result<Principal, Refusal> {
        self.check_with(authorization, true)
    }

    /// [`Authenticator::check`] for the node-agent protocol (register, heartbeat, work, exit): the
    /// per-user rate limit is for people and their scripts, not for the machines that run the jobs
    /// (which share one identity in `mode: none`).
    ///
    /// mTLS takes priority (book: "Agent Authentication"): a client certificate's CN is the agent's
    /// identity, bound to that node; the bearer token (`LATTICE_AGENT_TOKEN`) is the fallback.
    pub fn check_agent(&self, authorization: Option<&str>, cert_cn: Option<&str>) -> Result<Principal, Refusal> {
        match cert_cn {
            Some(cn) => Ok(Principal {
                user: format!("node-agent:{cn}"),
                tenant: None,
                roles: Vec::new(),
                node: Some(cn.to_string()),
                expires_at: None,
            }),
            None => self.check_with(authorization, false),
        }
    }

    fn check_with(&self, authorization: Option<&str>, limited: bool) -> Result<Principal, Refusal> {
        let p = if self.cfg.mode == AuthMode::None {
            Principal::dev_admin()
        } else {
            let token = authorization
                .and_then(|h| h.strip_prefix("Bearer "))
                .ok_or_else(|| Refusal::Unauthenticated("missing bearer token".into()))?;
            self.verify(token).map_err(Refusal::Unauthenticated)?
        };
        if limited {
            self.rate(&p.user)?;
        }
        Ok(p)
    }

    fn verify(&self, token: &str) -> Result<Principal, String> {
        let header = decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        match self.verify_with_known_keys(token, &header) {
            Err(e) if self.unknown_kid(&header) && self.refresh_keys() => {
                // The IdP rotated its keys: verify against what it publishes now.
                self.verify_with_known_keys(token, &header).map_err(|_| e)
            }
            r => r,
        }
    }

    /// Does the token name a key id none of the known keys has (or name none while the IdP's keys
    /// could not be fetched yet)?
    fn unknown_kid(&self, header: &jsonwebtoken::Header) -> bool {
        let fetched = self.fetched.read().unwrap_or_else(|p| p.into_inner());
        match &header.kid {
            Some(kid) => !self
                .keys
                .iter()
                .chain(fetched.iter())
                .any(|k| k.0.as_ref() == Some(kid)),
            None => fetched.is_empty(),
        }
    }

    /// Fetches the IdP's keys again unless a fetch started less than `jwks_refresh_min_s` (at least
    /// 1 s) ago. Whether new keys were fetched. No lock is held during the network calls: other
    /// requests verify against the keys they have meanwhile (one with an unknown key id is refused).
    fn refresh_keys(&self) -> bool {
        if self.cfg.mode != AuthMode::Jwt || (self.cfg.jwks_uri.is_none() && self.discover.is_none()) {
            return false;
        }
        let min = std::time::Duration::from_secs(self.cfg.jwks_refresh_min_s.max(1));
        {
            let mut last = self.last_fetch.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < min) {
                return false;
            }
            *last = Some(tokio::time::Instant::now());
        }
        let known = self.jwks_uri.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let uri = match (known, &self.discover) {
            (Some(u), _) => u,
            (None, Some(iss)) => match oidc::blocking(|| oidc::discover_jwks_uri(iss)) {
                Ok(u) => {
                    *self.jwks_uri.lock().unwrap_or_else(|p| p.into_inner()) = Some(u.clone());
                    u
                }
                Err(e) => {
                    tracing::warn!("auth: OIDC discovery of {iss}: {e}");
                    return false;
                }
            },
            (None, None) => return false,
        };
        match oidc::blocking(|| oidc::fetch_keys(&uri)) {
            Ok(keys) => {
                *self.fetched.write().unwrap_or_else(|p| p.into_inner()) = keys;
                true
            }
            Err(e) => {
                tracing::warn!("auth: fetching the IdP's keys: {e}");
                false
            }
        }
    }

    fn verify_with_known_keys(&self, token: &str, header: &jsonwebtoken::Header) -> Result<Principal, String> {
        let fetched = self.fetched.read().unwrap_or_else(|p| p.into_inner());
        let mut last = "no key matches the token".to_string();
        for (kid, key, alg) in self.keys.iter().chain(fetched.iter()) {
            if *alg != header.alg || (header.kid.is_some() && kid.is_some() && header.kid != *kid) {
                continue;
            }
            let mut v = Validation::new(*alg);
            // A configured issuer or audience must be present, not only right when present.
            let mut required = vec!["exp"];
            if let Some(iss) = &self.cfg.issuer {
                v.set_issuer(&[iss]);
                required.push("iss");
            }
            match &self.cfg.audience {
                Some(aud) => {
                    v.set_audience(&[aud]);
                    required.push("aud");
                }
                None => v.validate_aud = false,
            }
            v.set_required_spec_claims(&required);
            match decode::<serde_json::Value>(token, key, &v) {
                Ok(data) => return self.cfg.claims.principal(&data.claims),
                Err(e) => last = format!("invalid token: {e}"),
            }
        }
        Err(last)
    }

    fn rate(&self, user: &str) -> Result<(), Refusal> {
        let now = self.started.elapsed().as_secs();
        let minute = now / 60;
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let e = w.entry(user.to_string()).or_insert((minute, 0));
        if e.0 != minute {
            *e = (minute, 0);
        }
        if e.1 >= self.cfg.rate_limit_per_minute {
            return Err(Refusal::RateLimited(60 - now % 60));
        }
        e.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};

    fn hs(secret: &str, claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    fn exp() -> u64 {
        jsonwebtoken::get_current_timestamp() + 600
    }

    #[test]
    fn hs256_tokens_roles_and_rate_limit() {
        let a = Authenticator::new(AuthConfig {
            mode: AuthMode::Jwt,
            hs256_secret: Some("dev-secret".into()),
            rate_limit_per_minute: 3,
            ..AuthConfig::default()
        })
        .unwrap();
        let t = hs(
            "dev-secret",
            serde_json::json!({"sub": "alice", "tenant": "physics", "roles": ["User"], "exp": exp()}),
        );
        let p = a.check(Some(&format!("Bearer {t}"))).unwrap();
        assert_eq!((p.user.as_str(), p.tenant.as_deref()), ("alice", Some("physics")));
        assert!(p.can_submit_for("physics") && !p.can_submit_for("bio"));
        assert!(p.can_see("physics", Some("alice")) && !p.can_see("physics", Some("bob")));
        assert!(!p.can_operate() && !p.is_admin());
        assert!(matches!(a.check(None), Err(Refusal::Unauthenticated(_))));
        let forged = hs(
            "other",
            serde_json::json!({"sub": "x", "roles": ["SystemAdmin"], "exp": exp()}),
        );
        assert!(matches!(
            a.check(Some(&format!("Bearer {forged}"))),
            Err(Refusal::Unauthenticated(_))
        ));
        let expired = hs(
            "dev-secret",
            serde_json::json!({"sub": "x", "roles": ["User"], "exp": 1}),
        );
        assert!(matches!(
            a.check(Some(&format!("Bearer {expired}"))),
            Err(Refusal::Unauthenticated(_))
        ));
        // Two more requests fit in alice's minute, the next is limited.
        a.check(Some(&format!("Bearer {t}"))).unwrap();
        a.check(Some(&format!("Bearer {t}"))).unwrap();
        match a.check(Some(&format!("Bearer {t}"))) {
            Err(Refusal::RateLimited(s)) => assert!((1..=60).contains(&s)),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn tenant_admin_and_readonly_scopes() {
        let p = |roles: Vec<Role>| Principal {
            user: "u".into(),
            tenant: Some("physics".into()),
            roles,
            node: None,
            expires_at: None,
        };
        let ta = p(vec![Role::TenantAdmin]);
        assert!(ta.can_see("physics", Some("someone")) && !ta.can_see("bio", None));
        assert!(ta.can_cancel("physics", Some("someone")) && !ta.can_cancel("bio", Some("u")));
        let ro = p(vec![Role::ReadOnly]);
        assert!(ro.can_see("bio", None) && !ro.can_submit_for("physics") && !ro.can_cancel("physics", Some("u")));
        assert!(p(vec![Role::Operator]).can_operate());
    }
}
