//! Authentication and authorization of the API (book: "Authentication & Authorization"): OIDC/JWT
//! bearer tokens — RS256 against a JWKS file (the IdP's keys), or an HS256 secret for development —
//! carrying `sub` (the user), `tenant` and `roles`; the seed's roles decide what each request may do,
//! with tenant scoping (a user sees only their own allocations, a tenant admin their tenant's); and a
//! per-user rate limit answering 429 with `Retry-After`. With `mode: none` (the minimal dev config)
//! every request acts as a system administrator.

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header, jwk::JwkSet};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

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
    /// RS256: the IdP's JSON Web Key Set (a file; fetch it from the IdP's `jwks_uri`).
    pub jwks_file: Option<PathBuf>,
    /// HS256 development secret (never in production).
    pub hs256_secret: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    /// The client id `lattice login` asks the IdP for tokens as (default: `audience`); published by
    /// the public `GET /api/v1/auth/discovery`.
    pub client_id: Option<String>,
    /// Where users' browsers and the CLI reach the IdP (default: `issuer`).
    pub idp_url: Option<String>,
    /// Requests per user per minute before 429.
    #[serde(default = "default_rate")]
    pub rate_limit_per_minute: u32,
}

fn default_rate() -> u32 {
    600
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::None,
            jwks_file: None,
            hs256_secret: None,
            issuer: None,
            audience: None,
            client_id: None,
            idp_url: None,
            rate_limit_per_minute: default_rate(),
        }
    }
}

/// The seed's roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Role {
    SystemAdmin,
    TenantAdmin,
    Operator,
    ClaimingUser,
    ReadOnly,
    User,
}

/// Who is asking.
#[derive(Clone, Debug)]
pub struct Principal {
    pub user: String,
    pub tenant: Option<String>,
    pub roles: Vec<Role>,
    /// A node agent authenticated by its mTLS certificate: the node its CN names (it may act for
    /// that node only, and nothing else).
    pub node: Option<String>,
}

impl Principal {
    pub fn dev_admin() -> Principal {
        Principal {
            user: "dev".into(),
            tenant: None,
            roles: vec![Role::SystemAdmin],
            node: None,
        }
    }

    pub fn has(&self, r: Role) -> bool {
        self.roles.contains(&r)
    }

    pub fn is_admin(&self) -> bool {
        self.has(Role::SystemAdmin)
    }

    /// May submit allocations for `tenant` (own tenant only, unless system admin).
    pub fn can_submit_for(&self, tenant: &str) -> bool {
        if self.is_admin() {
            return true;
        }
        let writes = self.has(Role::User) || self.has(Role::ClaimingUser) || self.has(Role::TenantAdmin);
        writes && self.tenant.as_deref() == Some(tenant)
    }

    /// May see an allocation of `tenant` submitted by `user`.
    pub fn can_see(&self, tenant: &str, user: Option<&str>) -> bool {
        if self.is_admin() || self.has(Role::Operator) || self.has(Role::ReadOnly) {
            return true;
        }
        if self.tenant.as_deref() != Some(tenant) {
            return false;
        }
        self.has(Role::TenantAdmin) || user == Some(self.user.as_str())
    }

    /// May cancel it: its submitter, its tenant's admin, a system admin.
    pub fn can_cancel(&self, tenant: &str, user: Option<&str>) -> bool {
        if self.is_admin() {
            return true;
        }
        if self.tenant.as_deref() != Some(tenant) {
            return false;
        }
        self.has(Role::TenantAdmin)
            || ((self.has(Role::User) || self.has(Role::ClaimingUser)) && user == Some(&self.user))
    }

    /// Node operations (drain, undrain).
    pub fn can_operate(&self) -> bool {
        self.is_admin() || self.has(Role::Operator)
    }
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    roles: Vec<Role>,
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
    keys: Vec<(Option<String>, DecodingKey, Algorithm)>,
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
        if cfg.mode == AuthMode::Jwt {
            if let Some(path) = &cfg.jwks_file {
                let text =
                    std::fs::read_to_string(path).map_err(|e| AuthSetupError(format!("{}: {e}", path.display())))?;
                let set: JwkSet = serde_json::from_str(&text)
                    .map_err(|e| AuthSetupError(format!("{}: not a JWKS: {e}", path.display())))?;
                for k in &set.keys {
                    let key =
                        DecodingKey::from_jwk(k).map_err(|e| AuthSetupError(format!("{}: {e}", path.display())))?;
                    keys.push((k.common.key_id.clone(), key, Algorithm::RS256));
                }
            }
            if let Some(secret) = &cfg.hs256_secret {
                keys.push((None, DecodingKey::from_secret(secret.as_bytes()), Algorithm::HS256));
            }
            if keys.is_empty() {
                return Err(AuthSetupError("mode jwt needs `jwks_file` or `hs256_secret`".into()));
            }
        }
        Ok(Authenticator {
            cfg,
            keys,
            window: Mutex::new(BTreeMap::new()),
            started: tokio::time::Instant::now(),
        })
    }

    /// What `GET /api/v1/auth/discovery` publishes so `lattice login` can find the IdP: `mode`
    /// (`none` or `jwt`), and with JWTs `issuer`, `idp_url` (default: the issuer) and `client_id`
    /// (default: the audience). Public: it holds no secret.
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
        let mut last = "no key matches the token".to_string();
        for (kid, key, alg) in &self.keys {
            if *alg != header.alg || (header.kid.is_some() && kid.is_some() && header.kid != *kid) {
                continue;
            }
            let mut v = Validation::new(*alg);
            if let Some(iss) = &self.cfg.issuer {
                v.set_issuer(&[iss]);
            }
            match &self.cfg.audience {
                Some(aud) => v.set_audience(&[aud]),
                None => v.validate_aud = false,
            }
            match decode::<Claims>(token, key, &v) {
                Ok(data) => {
                    let c = data.claims;
                    if c.roles.is_empty() {
                        return Err("the token carries no roles".into());
                    }
                    return Ok(Principal {
                        user: c.sub,
                        tenant: c.tenant,
                        roles: c.roles,
                        node: None,
                    });
                }
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
        };
        let ta = p(vec![Role::TenantAdmin]);
        assert!(ta.can_see("physics", Some("someone")) && !ta.can_see("bio", None));
        assert!(ta.can_cancel("physics", Some("someone")) && !ta.can_cancel("bio", Some("u")));
        let ro = p(vec![Role::ReadOnly]);
        assert!(ro.can_see("bio", None) && !ro.can_submit_for("physics") && !ro.can_cancel("physics", Some("u")));
        assert!(p(vec![Role::Operator]).can_operate());
    }
}
