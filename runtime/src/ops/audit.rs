//! The sensitive audit log's queries and exports (book: "Query Interface"): the quorum's held log
//! and, for a range reaching back, the S3 archive; scoped as the book's table says. The held log's
//! selection is a pure function of the state ([`select_held`]) and its chain is verified from where
//! this member last verified it ([`crate::audit_verified::Verified`]), so a query costs what it selects, not the log's size
//! (`lattice-runtime bench audit`).

use super::common::*;
use crate::auth::Principal;
use crate::context::Shared;
use crate::error::ApiError;
use lattice_adapters::{AuditEntry, QuorumState};
use std::collections::BTreeMap;

/// `lattice audit query`: filters of the quorum's audit log (empty = any).
#[derive(Clone, Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub user: Option<String>,
    pub allocation: Option<String>,
    pub node: Option<String>,
    /// `YYYY-MM-DD` (UTC midnight) or milliseconds since the epoch (`from`, the admin guide's name,
    /// is the same).
    #[serde(alias = "from")]
    pub since: Option<String>,
    pub until: Option<String>,
    /// The event types (`claim`, `release`, `wipe`, `quarantine`, `attach`, …), comma-separated.
    pub event: Option<String>,
    /// Entries of allocations whose data (a mount's source) is under this path, or that name it.
    pub data_path: Option<String>,
    /// Entries of this tenant's allocations.
    pub tenant: Option<String>,
    /// `sensitive` (the admin guide's `scope=sensitive`): the audit log holds sensitive workloads'
    /// entries only, so it is every entry; another scope is refused.
    pub scope: Option<String>,
}

/// What an audit query needs to know of each allocation its entries name: tenant and data paths.
fn audit_context(
    c: &lattice_control::Control,
    entries: &[lattice_adapters::AuditEntry],
) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    for e in entries {
        if !out.contains_key(&e.alloc) {
            let tenant = c.view_named(&e.alloc).map(|v| v.tenant).unwrap_or_default();
            out.insert(e.alloc.clone(), (tenant, c.data_sources(&e.alloc)));
        }
    }
    out
}

/// Whether `path` is `under` or below it (`under` with or without its trailing `/`).
fn path_under(path: &str, under: &str) -> bool {
    let base = under.trim_end_matches('/');
    path == base || path.strip_prefix(base).is_some_and(|rest| rest.starts_with('/'))
}

/// Whether an audit entry's detail names a path that is `under` or below it (whole words of the
/// detail, by whole path components: `/data/a` is not under `/data/ab`).
fn names_path(detail: &str, under: &str) -> bool {
    detail
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')' | '"' | '\'' | '=' | '[' | ']'))
        .any(|w| !w.is_empty() && path_under(w, under))
}

/// What a query selects of the log, once parsed and scoped.
pub struct Selection<'a> {
    /// The caller (sees its own entries when nothing wider applies).
    pub caller: &'a str,
    /// Every entry (SystemAdmin, Operator), or the caller's tenant as its compliance reviewer
    /// (`reviewer`: decided per allocation afterwards), or the caller's own.
    pub all: bool,
    pub reviewer: bool,
    pub user: Option<&'a str>,
    pub allocation: Option<&'a str>,
    pub node: Option<&'a str>,
    pub since: Option<u64>,
    pub until: Option<u64>,
    pub events: Option<Vec<&'a str>>,
}

impl Selection<'_> {
    pub fn keeps(&self, e: &AuditEntry) -> bool {
        (self.all || self.reviewer || e.user == self.caller)
            && self.user.is_none_or(|u| e.user == u)
            && self.allocation.is_none_or(|a| e.alloc == a)
            && self.node.is_none_or(|n| e.detail.split(',').any(|d| d == n))
            && self.since.is_none_or(|t| e.at_ms >= t)
            && self.until.is_none_or(|t| e.at_ms < t)
            && self.events.as_ref().is_none_or(|ev| ev.contains(&e.action.as_str()))
    }
}

/// The held log's entries `sel` keeps, in order, and the archive's segments its range reaches
/// (empty when the range starts within the held log).
pub fn select_held(
    st: &QuorumState,
    sel: &Selection,
) -> (Vec<AuditEntry>, Vec<lattice_adapters::audit_archive::ArchivedSegment>) {
    // A scan, not a bisection by time: entries are stamped by the proposing member's clock, and
    // members' clocks may disagree (a later entry stamped earlier must still be found).
    let held = st.audit.iter().filter(|e| sel.keeps(e)).cloned().collect();
    let reaches_archive = sel.since.is_none_or(|t| st.audit.first().is_none_or(|h| t < h.at_ms));
    let manifest = if reaches_archive {
        st.audit_archive.clone()
    } else {
        Vec::new()
    };
    (held, manifest)
}

/// The audit entries matching `q` and whether the whole chain verifies, scoped as the book's table
/// says: SystemAdmin (and Operator) see every entry, a TenantAdmin — the tenant's compliance
/// reviewer — every entry about its tenant's allocations, anyone else only their own.
pub async fn audit(s: &Shared, p: &Principal, q: &AuditQuery) -> Result<(Vec<AuditEntry>, bool), ApiError> {
    let since = q.since.as_deref().map(|v| parse_instant("since", v)).transpose()?;
    let until = q.until.as_deref().map(|v| parse_instant("until", v)).transpose()?;
    if let Some(scope) = q.scope.as_deref().filter(|s| !s.is_empty() && *s != "sensitive") {
        return Err(ApiError::BadRequest {
            field: "scope".into(),
            message: format!("`{scope}`: the audit log's one scope is `sensitive`"),
        });
    }
    let all = p.is_admin() || p.can_operate();
    // A compliance reviewer's scope is decided per allocation, below; the quorum read keeps every
    // entry it might see.
    let reviewer = p
        .tenant
        .as_deref()
        .filter(|_| !all && p.has(crate::principal::Role::TenantAdmin));
    let given = |v: &Option<String>| v.as_deref().filter(|v| !v.is_empty()).map(str::to_owned);
    let (user, allocation, node) = (given(&q.user), given(&q.allocation), given(&q.node));
    let sel = Selection {
        caller: &p.user,
        all,
        reviewer: reviewer.is_some(),
        user: user.as_deref(),
        allocation: allocation.as_deref(),
        node: node.as_deref(),
        since,
        until,
        events: q
            .event
            .as_deref()
            .filter(|e| !e.is_empty())
            .map(|e| e.split(',').map(str::trim).collect()),
    };
    let (mut entries, mut valid, manifest) = s
        .member
        .read(|st| {
            let (held, manifest) = select_held(st, &sel);
            (held, s.audit_verified.check(st), manifest)
        })
        .await;
    // A range reaching before the held log reads the archive back (book: "Queries spanning more
    // than 90 days may be served from cold tier"); an object missing or failing its checks makes
    // the answer's chain not valid.
    if !manifest.is_empty() {
        let read = match &s.archive {
            Some(a) => a.read(&manifest, since, until).await,
            None => crate::archive::ArchiveRead {
                problems: vec!["services.archive is not configured: the archived entries cannot be read".into()],
                ..Default::default()
            },
        };
        for m in &read.problems {
            tracing::warn!("audit query: {m}");
        }
        valid &= read.problems.is_empty();
        let mut old: Vec<_> = read.entries.into_iter().filter(|e| sel.keeps(e)).collect();
        old.append(&mut entries);
        entries = old;
    }
    let tenant = q.tenant.as_deref().filter(|t| !t.is_empty());
    let data_path = q.data_path.as_deref().filter(|d| !d.is_empty());
    if tenant.is_none() && data_path.is_none() && reviewer.is_none() {
        return Ok((entries, valid));
    }
    let context = audit_context(&*s.control.lock().await, &entries);
    let entries = entries
        .into_iter()
        .filter(|e| {
            let (t, paths) = &context[&e.alloc];
            reviewer.is_none_or(|r| r == t || e.user == p.user)
                && tenant.is_none_or(|w| w == t)
                && data_path.is_none_or(|d| names_path(&e.detail, d) || paths.iter().any(|p| path_under(p, d)))
        })
        .collect();
    Ok((entries, valid))
}

/// The filters of `q` as a query string (what an export records it selected).
fn query_string(q: &AuditQuery) -> String {
    [
        ("user", &q.user),
        ("allocation", &q.allocation),
        ("node", &q.node),
        ("since", &q.since),
        ("until", &q.until),
        ("event", &q.event),
        ("data_path", &q.data_path),
        ("tenant", &q.tenant),
    ]
    .iter()
    .filter_map(|(k, v)| v.as_deref().filter(|v| !v.is_empty()).map(|v| format!("{k}={v}")))
    .collect::<Vec<_>>()
    .join("&")
}

/// `GET /v1/audit/export` (`lattice audit export`): the entries `q` selects, scoped as [`audit`], as
/// a bundle signed with this member's audit key — for an auditor, verifiable offline.
pub async fn audit_export(
    s: &Shared,
    p: &Principal,
    q: &AuditQuery,
) -> Result<lattice_engine::audit::Bundle, ApiError> {
    let (entries, valid) = audit(s, p, q).await?;
    Ok(lattice_engine::audit::make_bundle(
        &s.audit_key,
        s.clock.now_ms(),
        &p.user,
        &query_string(q),
        valid,
        entries,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_paths_match_by_whole_components() {
        assert!(path_under(
            "s3://bucket/subject-001/scan.nii",
            "s3://bucket/subject-001/"
        ));
        assert!(path_under("s3://bucket/subject-001", "s3://bucket/subject-001"));
        assert!(!path_under("s3://bucket/subject-0010/x", "s3://bucket/subject-001"));
        assert!(names_path(
            "read s3://bucket/subject-001/a.csv (42 MB)",
            "s3://bucket/subject-001"
        ));
        assert!(names_path("mounts=[/data/p1,/data/p2]", "/data/p2"));
        assert!(!names_path(
            "read s3://bucket/subject-0010/a.csv",
            "s3://bucket/subject-001"
        ));
        assert!(!names_path("", "/data"));
    }
}
