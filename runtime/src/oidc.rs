//! Standard OIDC for the API's bearer tokens (book: "Authentication & Authorization"): the verifying
//! keys from the issuer's discovery document (`jwks_uri`), fetched again when a token names a key id
//! not yet known (the IdP rotated its keys); and who a token's holder is, derived from standard claims
//! by the site's rules — no custom token mapper needed.
//!
//! Role derivation, first match wins (the book's `derive_role`: "standard OIDC scopes take
//! precedence over role claims"): its OIDC scopes (`scope`, space-separated, or `scp`) in the order
//! of the book's table, whatever order the token lists them in; then a `roles` claim of the seed's
//! role names (the custom form, kept working; a `roles` claim in another vocabulary is ignored); then
//! the site's `role_rules` over any claim (`groups` membership, a claim path's value); then the
//! cross-system claims `pact_role` and `lattice_role`; then `default_role` (the book: any
//! authenticated user is a `User`). The user is a claim path (`sub` by default, often
//! `preferred_username`); the tenant is a claim path too — a string, or the first element of a list
//! (such as `groups`) that starts with `tenant_prefix`, the prefix removed.

use crate::principal::{Principal, Role};
use jsonwebtoken::{Algorithm, DecodingKey, jwk::JwkSet};
use serde::Deserialize;
use serde_json::Value;

/// One verifying key: its id, the key and the algorithm it verifies.
pub type Key = (Option<String>, DecodingKey, Algorithm);

/// How a token's claims name its holder (the `auth:` section's claim settings).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClaimRules {
    /// Claim path of the user name (dots descend into objects).
    #[serde(default = "default_user_claim")]
    pub user_claim: String,
    /// Claim path of the tenant: a string, or a list whose first element starting with
    /// `tenant_prefix` names it (the prefix removed).
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
    #[serde(default)]
    pub tenant_prefix: Option<String>,
    /// Site rules after the scopes: a claim (path) holding `value`, or containing it when a list,
    /// gives `role`.
    #[serde(default)]
    pub role_rules: Vec<RoleRule>,
    /// The role of an authenticated user no rule matched (`null`: such a token is refused).
    #[serde(default = "default_role")]
    pub default_role: Option<Role>,
}

fn default_user_claim() -> String {
    "sub".into()
}

fn default_tenant_claim() -> String {
    "tenant".into()
}

fn default_role() -> Option<Role> {
    Some(Role::User)
}

impl Default for ClaimRules {
    fn default() -> Self {
        ClaimRules {
            user_claim: default_user_claim(),
            tenant_claim: default_tenant_claim(),
            tenant_prefix: None,
            role_rules: Vec::new(),
            default_role: default_role(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RoleRule {
    pub claim: String,
    pub value: String,
    pub role: Role,
}

/// The claim at `path` (`a.b.c` descends into objects).
fn at<'a>(claims: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(claims, |v, k| v.get(k))
}

/// Does the claim hold `value` (equal, or an element of a list)?
fn holds(claim: Option<&Value>, value: &str) -> bool {
    match claim {
        Some(Value::String(s)) => s == value,
        Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(value)),
        _ => false,
    }
}

/// The book's scope table, in its order.
const SCOPE_ROLES: [(&str, Role); 6] = [
    ("admin", Role::SystemAdmin),
    ("system:admin", Role::SystemAdmin),
    ("tenant:admin", Role::TenantAdmin),
    ("operator", Role::Operator),
    ("sensitive:claim", Role::ClaimingUser),
    ("readonly", Role::ReadOnly),
];

/// The book's cross-system role claims (`pact_role`, `lattice_role`).
fn role_of_cross_claim(claim: &str, value: &str) -> Option<Role> {
    Some(match (claim, value) {
        ("pact_role", "pact-platform-admin") | (_, "system-admin") => Role::SystemAdmin,
        (_, "tenant-admin") => Role::TenantAdmin,
        (_, "operator") => Role::Operator,
        _ => return None,
    })
}

fn scopes(claims: &Value) -> Vec<&str> {
    match (claims.get("scope"), claims.get("scp")) {
        (Some(Value::String(s)), _) => s.split_whitespace().collect(),
        (_, Some(Value::Array(a))) => a.iter().filter_map(Value::as_str).collect(),
        (_, Some(Value::String(s))) => s.split_whitespace().collect(),
        _ => Vec::new(),
    }
}

impl ClaimRules {
    /// Who holds a token with these (verified) claims.
    pub fn principal(&self, claims: &Value) -> Result<Principal, String> {
        let user = at(claims, &self.user_claim)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the token has no `{}` claim naming its user", self.user_claim))?
            .to_string();
        let tenant = match at(claims, &self.tenant_claim) {
            Some(Value::String(s)) => match &self.tenant_prefix {
                Some(p) => s.strip_prefix(p.as_str()).map(str::to_string),
                None => Some(s.clone()),
            },
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .find_map(|g| match &self.tenant_prefix {
                    Some(p) => g.strip_prefix(p.as_str()),
                    None => Some(g),
                })
                .map(str::to_string),
            _ => None,
        }
        .filter(|t| !t.is_empty());
        Ok(Principal {
            user,
            tenant,
            roles: self.roles(claims)?,
            node: None,
            expires_at: claims.get("exp").and_then(Value::as_u64),
        })
    }

    fn roles(&self, claims: &Value) -> Result<Vec<Role>, String> {
        let scopes = scopes(claims);
        if let Some((_, r)) = SCOPE_ROLES.iter().find(|(s, _)| scopes.contains(s)) {
            return Ok(vec![*r]);
        }
        // The custom form: a `roles` claim of the seed's role names.
        if let Some(Value::Array(list)) = claims.get("roles")
            && !list.is_empty()
            && let Ok(roles) = serde_json::from_value::<Vec<Role>>(Value::Array(list.clone()))
        {
            return Ok(roles);
        }
        if let Some(rule) = self.role_rules.iter().find(|r| holds(at(claims, &r.claim), &r.value)) {
            return Ok(vec![rule.role]);
        }
        for claim in ["pact_role", "lattice_role"] {
            if let Some(v) = claims.get(claim).and_then(Value::as_str)
                && let Some(r) = role_of_cross_claim(claim, v)
            {
                return Ok(vec![r]);
            }
        }
        self.default_role
            .map(|r| vec![r])
            .ok_or_else(|| "the token maps to no role (and no default role is configured)".into())
    }
}

/// The verifying keys of a JSON Web Key Set: RSA keys verify RS256 unless the key names another
/// algorithm, EC P-256 keys ES256. Keys of other kinds are skipped.
pub fn keys_of(set: &JwkSet) -> Vec<Key> {
    use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm};
    set.keys
        .iter()
        .filter_map(|k| {
            let alg = match (&k.common.key_algorithm, &k.algorithm) {
                (Some(KeyAlgorithm::RS384), _) => Algorithm::RS384,
                (Some(KeyAlgorithm::RS512), _) => Algorithm::RS512,
                (Some(KeyAlgorithm::ES384), _) => Algorithm::ES384,
                (_, AlgorithmParameters::RSA(_)) => Algorithm::RS256,
                (_, AlgorithmParameters::EllipticCurve(p)) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
                _ => return None,
            };
            let key = DecodingKey::from_jwk(k).ok()?;
            Some((k.common.key_id.clone(), key, alg))
        })
        .collect()
}

/// A blocking HTTP GET of a JSON document, bounded in time.
fn get_json(url: &str) -> Result<Value, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(5)))
        .build()
        .into();
    let mut resp = agent.get(url).call().map_err(|e| format!("GET {url}: {e}"))?;
    resp.body_mut()
        .read_json::<Value>()
        .map_err(|e| format!("GET {url}: not JSON: {e}"))
}

/// The `jwks_uri` of `issuer`'s discovery document (`/.well-known/openid-configuration`).
pub fn discover_jwks_uri(issuer: &str) -> Result<String, String> {
    let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
    let doc = get_json(&url)?;
    // OpenID Connect Discovery 1.0 §4.3: the document must name the issuer it was fetched for.
    let named = doc.get("issuer").and_then(Value::as_str).unwrap_or_default();
    if named.trim_end_matches('/') != issuer.trim_end_matches('/') {
        return Err(format!(
            "{url}: the discovery document names issuer `{named}`, not `{issuer}`"
        ));
    }
    doc.get("jwks_uri")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("{url}: the discovery document has no `jwks_uri`"))
}

/// The keys published at `jwks_uri`.
pub fn fetch_keys(jwks_uri: &str) -> Result<Vec<Key>, String> {
    let doc = get_json(jwks_uri)?;
    let set: JwkSet = serde_json::from_value(doc).map_err(|e| format!("{jwks_uri}: not a JWKS: {e}"))?;
    Ok(keys_of(&set))
}

/// Runs `f`, a blocking network call, from wherever verification runs: on a multi-threaded Tokio
/// runtime the worker hands its other tasks off first.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn roles(rules: &ClaimRules, claims: Value) -> Result<Vec<Role>, String> {
        rules.principal(&claims).map(|p| p.roles)
    }

    #[test]
    fn scopes_first_then_site_rules_then_cross_system_claims_then_the_default() {
        let rules = ClaimRules {
            role_rules: vec![RoleRule {
                claim: "groups".into(),
                value: "/hpc-operators".into(),
                role: Role::Operator,
            }],
            ..ClaimRules::default()
        };
        let base = |extra: Value| {
            let mut c = json!({"sub": "u1"});
            c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            c
        };
        // Scopes win over everything else, in the book's table order whatever the token's order.
        let c = base(
            json!({"scope": "openid profile tenant:admin admin", "groups": ["/hpc-operators"], "pact_role": "pact-platform-admin", "roles": ["User"]}),
        );
        assert_eq!(roles(&rules, c), Ok(vec![Role::SystemAdmin]));
        assert_eq!(
            roles(&rules, base(json!({"scope": "readonly operator"}))),
            Ok(vec![Role::Operator])
        );
        assert_eq!(
            roles(&rules, base(json!({"scp": ["readonly"]}))),
            Ok(vec![Role::ReadOnly])
        );
        // Then the site's rules over standard claims.
        let c =
            base(json!({"scope": "openid", "groups": ["/x", "/hpc-operators"], "pact_role": "pact-platform-admin"}));
        assert_eq!(roles(&rules, c), Ok(vec![Role::Operator]));
        // Then the book's cross-system claims.
        assert_eq!(
            roles(&rules, base(json!({"pact_role": "pact-platform-admin"}))),
            Ok(vec![Role::SystemAdmin])
        );
        assert_eq!(
            roles(&rules, base(json!({"lattice_role": "tenant-admin"}))),
            Ok(vec![Role::TenantAdmin])
        );
        assert_eq!(
            roles(&rules, base(json!({"lattice_role": "pact-platform-admin"}))),
            Ok(vec![Role::User])
        );
        // Any other authenticated user is a User; without a default role the token is refused.
        assert_eq!(
            roles(&rules, base(json!({"scope": "openid email"}))),
            Ok(vec![Role::User])
        );
        let strict = ClaimRules {
            default_role: None,
            ..ClaimRules::default()
        };
        assert!(roles(&strict, base(json!({}))).unwrap_err().contains("no role"));
        // The custom form keeps working after the scopes; a `roles` claim in another vocabulary (an
        // IdP's own app roles) is ignored.
        assert_eq!(
            roles(&rules, base(json!({"roles": ["Operator", "User"], "scope": "openid"}))),
            Ok(vec![Role::Operator, Role::User])
        );
        assert_eq!(
            roles(&rules, base(json!({"roles": ["Task.Write"], "pact_role": "operator"}))),
            Ok(vec![Role::Operator])
        );
    }

    #[test]
    fn user_and_tenant_from_claim_paths_and_group_prefixes() {
        let rules = ClaimRules {
            user_claim: "preferred_username".into(),
            tenant_claim: "groups".into(),
            tenant_prefix: Some("/tenants/".into()),
            ..ClaimRules::default()
        };
        let p = rules
            .principal(&json!({"sub": "f81d4fae", "preferred_username": "alice", "groups": ["/staff", "/tenants/physics", "/tenants/bio"]}))
            .unwrap();
        assert_eq!((p.user.as_str(), p.tenant.as_deref()), ("alice", Some("physics")));
        assert!(
            rules
                .principal(&json!({"sub": "x"}))
                .unwrap_err()
                .contains("preferred_username")
        );
        // With a prefix, a group without it (or with nothing after it) names no tenant, list or string.
        let tenant = |c: Value| rules.principal(&c).unwrap().tenant;
        assert_eq!(tenant(json!({"preferred_username": "u", "groups": "/hpc-ops"})), None);
        assert_eq!(
            tenant(json!({"preferred_username": "u", "groups": ["/tenants/"]})),
            None
        );
        assert_eq!(
            tenant(json!({"preferred_username": "u", "groups": "/tenants/bio"})).as_deref(),
            Some("bio")
        );
        // A nested claim path, and a plain string tenant.
        let nested = ClaimRules {
            tenant_claim: "lattice.tenant".into(),
            ..ClaimRules::default()
        };
        let p = nested
            .principal(&json!({"sub": "bob", "lattice": {"tenant": "bio"}}))
            .unwrap();
        assert_eq!((p.user.as_str(), p.tenant.as_deref()), ("bob", Some("bio")));
        assert_eq!(nested.principal(&json!({"sub": "bob"})).unwrap().tenant, None);
    }

    #[test]
    fn jwks_keys_take_their_algorithm_from_the_key() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/test-jwks.json")).unwrap();
        let set: JwkSet = serde_json::from_str(&text).unwrap();
        let keys = keys_of(&set);
        assert_eq!(keys.len(), 1);
        assert_eq!((keys[0].0.as_deref(), keys[0].2), (Some("test-key"), Algorithm::RS256));
    }
}
