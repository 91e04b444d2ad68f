//! Who is asking: the seed's roles and the principal a request acts as, with what each role may do
//! (book: "Authentication & Authorization", RBAC). Derived from a token by [`crate::auth`] with the
//! claim rules of [`crate::oidc`].

use serde::Deserialize;

/// The seed's roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
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
    /// When its token expires (Unix seconds, the token's `exp`): long-lived streams opened with it
    /// end then.
    pub expires_at: Option<u64>,
}

impl Principal {
    pub fn dev_admin() -> Principal {
        Principal {
            user: "dev".into(),
            tenant: None,
            roles: vec![Role::SystemAdmin],
            node: None,
            expires_at: None,
        }
    }

    /// Resolves when the token expires (never, for a principal without one): a stream's `select!`
    /// branch that ends it.
    pub async fn token_expired(&self) {
        match self.stream_deadline() {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    }

    /// When a stream opened with this principal must end: its token's expiry on the monotonic clock.
    pub fn stream_deadline(&self) -> Option<tokio::time::Instant> {
        let exp = self.expires_at?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Some(tokio::time::Instant::now() + std::time::Duration::from_secs(exp.saturating_sub(now)))
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
