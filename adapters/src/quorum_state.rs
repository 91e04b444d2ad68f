//! The replicated state of the quorum — exactly the seed's two strong-consistency domains:
//!
//! 1. **Node ownership**: which allocation holds which node, validated at apply time: a node has one
//!    owner, and hard quotas (`max_nodes`, `max_concurrent_allocations` per tenant and per project,
//!    `sensitive_pool_size` system-wide) are never exceeded — a violating assignment is rejected with the seed's message and
//!    the scheduler retries next cycle.
//! 2. **The sensitive audit log**: append-only, every entry carrying the SHA-256 of the previous one.
//!
//! Tenants' and their projects' contracts live here too (book: "Quota Update Flow"): created, updated and deleted through
//! the API as Raft-committed commands, so a hard-quota change takes effect at once on every member and
//! survives fail-overs; each change is recorded in the administrative log ([`AdminEntry`]).
//!
//! Queues, capacity and telemetry are eventually consistent and stay out of Raft. The state is a pure
//! value ([`QuorumState::apply`] is deterministic), so every member that applies the same log reaches
//! the same state, and snapshots are its serialised form.

use lattice_engine::{
    HardQuota, ProjectQuota, QuotaScope, QuotaViolation, TenantQuota, quota::check_hard, quota::check_project,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A command proposed to the quorum (the Raft log's application data).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum QuorumCommand {
    /// Several commands in one log entry (group commit: one append, one fsync and one replication
    /// for all), applied in order as if each were its own entry; answered with
    /// [`QuorumResponse::Batch`], one answer each. A batch inside a batch is rejected.
    Batch { commands: Vec<QuorumCommand> },
    /// Hard quotas of a tenant (replaces earlier ones).
    SetQuota {
        tenant: String,
        max_nodes: Option<u32>,
        max_concurrent_allocations: Option<u32>,
    },
    /// System-wide: nodes sensitive allocations may hold.
    SetSensitivePool { size: Option<u32> },
    /// A scheduler proposes that `alloc` (of `tenant`) takes `nodes`.
    Assign {
        alloc: String,
        tenant: String,
        nodes: Vec<String>,
        sensitive: bool,
        /// When it starts (ms since the epoch, the leader's clock): a control plane that restarts
        /// re-attaches a running allocation with its original start.
        #[serde(default)]
        at_ms: u64,
        /// Its project within the tenant (`None`: `default`); a project's hard quotas are checked
        /// with the tenant's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        project: Option<String>,
        /// Its network domain and the domain's VNI (an allocation on a VNI): a new leader keeps
        /// them for it, and no two domains ever hold one VNI.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<NetworkGrant>,
    },
    /// The fabric manager created the running allocation's CXI service (book: "Network Domains"):
    /// its tasks launch once this is recorded, and a new leader keeps (and at the end revokes) it
    /// rather than creating another. Ignored for an allocation that holds no nodes.
    CxiService { alloc: String, service: String },
    /// The allocation ended, was cancelled or preempted: its nodes are free again.
    Release { alloc: String },
    /// A reactive allocation grew by `node` (`added`) or gave it back. Growing onto a node someone
    /// owns, or beyond the tenant's `max_nodes`, is rejected.
    Scale { alloc: String, node: String, added: bool },
    /// An operator's standing order for a node: drained (no new work) and/or disabled (out of
    /// service). Recorded before the leader acts on it, so a new leader keeps it (a drain is not
    /// forgotten by a fail-over); both false clears it.
    NodeAdmin {
        node: String,
        drained: bool,
        disabled: bool,
    },
    /// What `node`'s agent discovered for the capabilities its inventory leaves unset (GPUs, cores,
    /// memory): every leader schedules the node with them (replaces an earlier record).
    Discovered {
        node: String,
        capabilities: lattice_engine::DiscoveredCapabilities,
    },
    /// Where member `id` serves its REST API: recorded by each leader when it takes over, so a
    /// member that is not the leader names the leader's URL in its 421 answers.
    MemberUrl { id: u64, url: String },
    /// Changes nothing: a new leader's first write, which commits (and applies here) everything
    /// earlier leaders committed before it reads the state.
    Barrier,
    /// An event of a sensitive allocation (claim, release, wipe, attach, ...), signed by the member
    /// that proposed it with the site's audit key (none in an old log, or without a key).
    Audit {
        at_ms: u64,
        user: String,
        alloc: String,
        action: String,
        detail: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signed: Option<lattice_engine::audit::Signed>,
    },
    /// The held audit log's oldest entries are in the S3 archive now, in this object: they leave the
    /// state (rejected, changing nothing, unless they are exactly the held log's start).
    AuditArchived {
        segment: crate::audit_archive::ArchivedSegment,
    },
    /// A tenant's contract (hard and soft quotas): created, replaced, or — `Seed`, the runtime's
    /// tenants file at start — created only when the quorum does not know the tenant yet.
    PutTenant {
        name: String,
        quota: TenantQuota,
        write: TenantWrite,
        at_ms: u64,
        by: String,
    },
    /// Removes a tenant that holds no nodes (and its projects).
    DeleteTenant { name: String, at_ms: u64, by: String },
    /// A project's contract within its tenant (which must exist): created, replaced, or seeded, as
    /// [`QuorumCommand::PutTenant`].
    PutProject {
        tenant: String,
        name: String,
        quota: ProjectQuota,
        write: TenantWrite,
        at_ms: u64,
        by: String,
    },
    /// Removes a project that holds no nodes (its allocations' names stay in their records).
    DeleteProject {
        tenant: String,
        name: String,
        at_ms: u64,
        by: String,
    },
    /// The accounting pipeline delivered every event that happened before `ms` (ms since the
    /// epoch): a new leader's pipeline regenerates events from there (it never moves back).
    AccountingMark { ms: u64 },
    /// An operator's cost-function weights for a vCluster (`PUT /v1/vclusters/{id}/weights`): every
    /// leader schedules the vCluster with them from the commit on, a new one too.
    SetWeights {
        vcluster: String,
        weights: lattice_engine::CostWeights,
        at_ms: u64,
        by: String,
    },
    /// A vCluster's whole scheduler configuration (`POST /v1/vclusters`, `PATCH
    /// /v1/vclusters/{id}`; the profile seeds it): created, replaced, or seeded as
    /// [`QuorumCommand::PutTenant`]. Every leader schedules the vCluster with it from the commit on.
    PutVCluster {
        name: String,
        config: lattice_engine::VClusterConfig,
        write: TenantWrite,
        at_ms: u64,
        by: String,
    },
    /// Site settings decisions read (the controller's timeouts, by key, in ms; `None` removes a key
    /// that may be absent, such as one node kind's boot timeout): updated by an operator, or seeded
    /// from a member's config file — only while the quorum holds no settings at all. Every leader
    /// applies what the quorum holds.
    PutSettings {
        settings: BTreeMap<String, Option<u64>>,
        write: TenantWrite,
        at_ms: u64,
        by: String,
    },
    /// Federation (book: "Adding a Federation Peer"): a peer site's broker endpoints and the shared
    /// workspace its requests are signed under (replaces the peer's earlier entry). The workspace's
    /// key is exchanged out of band and stays in each member's config, never in the log.
    PutFederationPeer {
        name: String,
        endpoints: Vec<String>,
        workspace: String,
        at_ms: u64,
        by: String,
    },
    /// Removes a federation peer: no new requests to or from it.
    RemoveFederationPeer { name: String, at_ms: u64, by: String },
    /// Revokes a shared workspace: every request signed under it is refused from now on (instant
    /// defederation of every peer in it).
    RevokeWorkspace { workspace: String, at_ms: u64, by: String },
    /// Federation (book: "Federated Allocation Flow", step 7: "On completion: Site B reports
    /// results, Site A's user notified"): a peer reported that an allocation this site forwarded
    /// there ended. Kept for its user (the newest [`FEDERATED_ENDS_KEPT`]); a repeat changes nothing.
    FederatedEnd(FederatedEnd),
}

/// A running allocation's network domain (its API name, within its tenant) and the domain's VNI.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkGrant {
    pub domain: String,
    pub vni: u32,
}

/// The federated ends a site keeps (older ones are dropped first).
pub const FEDERATED_ENDS_KEPT: usize = 10_000;

/// An allocation that ran at a peer site and ended there, as the peer reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FederatedEnd {
    /// The peer it ran at, and its id there.
    pub site: String,
    pub id: String,
    /// Who submitted it here, and the tenant here.
    pub user: String,
    pub tenant: String,
    /// `completed`, `failed`, `cancelled`.
    pub state: String,
    #[serde(default)]
    pub end_reason: Option<String>,
    pub ended_ms: u64,
    /// When this site recorded it.
    pub at_ms: u64,
}

/// A federation peer as the quorum holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FederationPeer {
    /// The peer broker's base URLs (its members' REST addresses; tried in order).
    pub endpoints: Vec<String>,
    /// The shared workspace both sites sign with.
    pub workspace: String,
    pub added_ms: u64,
}

/// How [`QuorumCommand::PutTenant`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TenantWrite {
    /// A new tenant (rejected when it exists).
    Create,
    /// An existing tenant's contract, replaced (rejected when it does not exist).
    Update,
    /// Created when absent, else nothing (the tenants file never overrides the API's changes).
    Seed,
}

/// One administrative change, as committed (who, when, what, to what).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdminEntry {
    pub at_ms: u64,
    pub user: String,
    /// `tenant.create`, `tenant.update`, `tenant.seed`, `tenant.delete`, `project.*`, `federation.*`.
    pub action: String,
    pub target: String,
    pub detail: String,
}

/// The administrative log's action of a contract write (`tenant.create`, `project.seed`, ...);
/// `Ok(None)`: a seed of what exists changes nothing; `Err`: refused (creating what exists, updating
/// what does not).
fn write_action(kind: &str, target: &str, write: TenantWrite, exists: bool) -> Result<Option<String>, QuorumResponse> {
    let verb = match (write, exists) {
        (TenantWrite::Create, true) => {
            return Err(rejected(&format!("{kind}_exists"), format!("{kind} {target} exists")));
        }
        (TenantWrite::Update, false) => return Err(rejected(&format!("no_{kind}"), format!("no {kind} {target}"))),
        (TenantWrite::Seed, true) => return Ok(None),
        (TenantWrite::Create, false) => "create",
        (TenantWrite::Update, true) => "update",
        (TenantWrite::Seed, false) => "seed",
    };
    Ok(Some(format!("{kind}.{verb}")))
}

/// A contract write's log detail: the contract, and a note when it holds more nodes than the new
/// limit.
fn contract_detail(quota: &impl Serialize, held: u64, max_nodes: Option<u32>) -> String {
    let mut detail = serde_json::to_string(quota).unwrap_or_default();
    if let Some(max) = max_nodes.filter(|m| held > u64::from(*m)) {
        detail.push_str(&format!(
            "; holds {held} nodes, above the new limit {max}: new assignments wait until it is under"
        ));
    }
    detail
}

/// A rejection that does not count as a refused assignment.
fn rejected(reason: &str, message: String) -> QuorumResponse {
    QuorumResponse::Rejected {
        reason: reason.to_string(),
        message,
    }
}

/// What applying a command did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum QuorumResponse {
    /// Applied (also the response to Raft's own blank and membership entries).
    #[default]
    Applied,
    /// Rejected at apply time; `reason` is stable (`node_conflict`, `max_nodes`, ...), `message` is the
    /// seed's wording.
    Rejected { reason: String, message: String },
    /// A [`QuorumCommand::Batch`]'s answers, in its commands' order.
    Batch(Vec<QuorumResponse>),
}

pub use lattice_engine::audit::AuditEntry;

/// An operator's standing order for one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAdmin {
    /// Drained: it takes no new work (what runs there finishes).
    pub drained: bool,
    /// Disabled: out of service until enabled.
    pub disabled: bool,
}

/// A committed assignment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub tenant: String,
    pub nodes: Vec<String>,
    pub sensitive: bool,
    /// When it started (ms since the epoch; 0 when not recorded).
    #[serde(default)]
    pub since_ms: u64,
    /// Its project (`None`: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Its network domain and VNI, when it is on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkGrant>,
    /// Its CXI service at the fabric manager, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cxi_service: Option<String>,
    /// A sensitive claim whose `claim` entry is in the audit log (a second one is refused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub claim_audited: bool,
}

impl Assignment {
    /// Its project's name (`default` when none was given).
    pub fn project(&self) -> &str {
        self.project.as_deref().unwrap_or("default")
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QuorumState {
    /// node → owning allocation.
    pub owners: BTreeMap<String, String>,
    pub assignments: BTreeMap<String, Assignment>,
    pub quotas: BTreeMap<String, (Option<u32>, Option<u32>)>,
    pub sensitive_pool_size: Option<u32>,
    pub audit: Vec<AuditEntry>,
    /// Operators' standing orders by node ([`QuorumCommand::NodeAdmin`]); absent = none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_admin: BTreeMap<String, NodeAdmin>,
    /// Assignments committed and rejected so far (for `/metrics` and raft status).
    pub commits: u64,
    pub rejections: u64,
    /// Tenants' contracts ([`QuorumCommand::PutTenant`]); their hard part is also in `quotas`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, TenantQuota>,
    /// Projects' contracts ([`QuorumCommand::PutProject`]) by tenant, then project name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub projects: BTreeMap<String, BTreeMap<String, ProjectQuota>>,
    /// The administrative log: every tenant change, in commit order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin_log: Vec<AdminEntry>,
    /// [`QuorumCommand::AccountingMark`] (0: none yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accounting_mark: u64,
    /// Operators' weights by vCluster ([`QuorumCommand::SetWeights`]), over the profile's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, lattice_engine::CostWeights>,
    /// vClusters' scheduler configurations ([`QuorumCommand::PutVCluster`], with the weights of
    /// later [`QuorumCommand::SetWeights`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vclusters: BTreeMap<String, lattice_engine::VClusterConfig>,
    /// Site settings decisions read, by key, in ms ([`QuorumCommand::PutSettings`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, u64>,
    /// What agents discovered where the inventory leaves capabilities unset, by node
    /// ([`QuorumCommand::Discovered`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub discovered: BTreeMap<String, lattice_engine::DiscoveredCapabilities>,
    /// Members' REST URLs by member id ([`QuorumCommand::MemberUrl`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub member_urls: BTreeMap<u64, String>,
    /// Federation peers by site name ([`QuorumCommand::PutFederationPeer`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub federation_peers: BTreeMap<String, FederationPeer>,
    /// Shared workspaces revoked ([`QuorumCommand::RevokeWorkspace`]): never trusted again.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub revoked_workspaces: std::collections::BTreeSet<String>,
    /// Allocations forwarded to peers that ended there, by `site/id`
    /// ([`QuorumCommand::FederatedEnd`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub federated_ends: BTreeMap<String, FederatedEnd>,
    /// Where the held audit log starts: entries before it are in the archive ([`Self::audit_archive`]).
    #[serde(default, skip_serializing_if = "lattice_engine::audit::Anchor::is_start")]
    pub audit_base: lattice_engine::audit::Anchor,
    /// The archived runs of the audit chain, oldest first ([`QuorumCommand::AuditArchived`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit_archive: Vec<crate::audit_archive::ArchivedSegment>,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl QuorumState {
    /// Applies one command; deterministic.
    pub fn apply(&mut self, cmd: &QuorumCommand) -> QuorumResponse {
        match cmd {
            QuorumCommand::Batch { commands } => QuorumResponse::Batch(
                commands
                    .iter()
                    .map(|c| match c {
                        QuorumCommand::Batch { .. } => rejected("nested_batch", "a batch inside a batch".to_string()),
                        c => self.apply(c),
                    })
                    .collect(),
            ),
            QuorumCommand::SetQuota {
                tenant,
                max_nodes,
                max_concurrent_allocations,
            } => {
                self.quotas
                    .insert(tenant.clone(), (*max_nodes, *max_concurrent_allocations));
                QuorumResponse::Applied
            }
            QuorumCommand::PutTenant {
                name,
                quota,
                write,
                at_ms,
                by,
            } => self.put_tenant(name, quota, *write, *at_ms, by),
            QuorumCommand::DeleteTenant { name, at_ms, by } => {
                if !self.tenants.contains_key(name) {
                    return rejected("no_tenant", format!("no tenant {name}"));
                }
                let holding = self.assignments.values().filter(|a| a.tenant == *name).count();
                if holding > 0 {
                    return rejected(
                        "tenant_in_use",
                        format!("tenant {name} holds nodes for {holding} allocation(s); delete it once they end"),
                    );
                }
                self.tenants.remove(name);
                self.quotas.remove(name);
                let projects = self.projects.remove(name).map(|p| p.into_keys().collect::<Vec<_>>());
                let detail = projects.map(|p| format!("with its projects {p:?}")).unwrap_or_default();
                self.admin(*at_ms, by, "tenant.delete", name, &detail);
                QuorumResponse::Applied
            }
            QuorumCommand::PutProject {
                tenant,
                name,
                quota,
                write,
                at_ms,
                by,
            } => self.put_project(tenant, name, quota, *write, *at_ms, by),
            QuorumCommand::DeleteProject {
                tenant,
                name,
                at_ms,
                by,
            } => {
                if !self.projects.get(tenant).is_some_and(|p| p.contains_key(name)) {
                    return rejected("no_project", format!("no project {name} in tenant {tenant}"));
                }
                let holding = self
                    .assignments
                    .values()
                    .filter(|a| a.tenant == *tenant && a.project() == name)
                    .count();
                if holding > 0 {
                    return rejected(
                        "project_in_use",
                        format!(
                            "project {tenant}/{name} holds nodes for {holding} allocation(s); delete it once they end"
                        ),
                    );
                }
                if let Some(p) = self.projects.get_mut(tenant) {
                    p.remove(name);
                    if p.is_empty() {
                        self.projects.remove(tenant);
                    }
                }
                self.admin(*at_ms, by, "project.delete", &format!("{tenant}/{name}"), "");
                QuorumResponse::Applied
            }
            QuorumCommand::SetSensitivePool { size } => {
                self.sensitive_pool_size = *size;
                QuorumResponse::Applied
            }
            QuorumCommand::Assign { .. } => self.assign(cmd),
            QuorumCommand::CxiService { alloc, service } => {
                if let Some(a) = self.assignments.get_mut(alloc) {
                    a.cxi_service = Some(service.clone());
                }
                QuorumResponse::Applied
            }
            QuorumCommand::Release { alloc } => {
                if let Some(a) = self.assignments.remove(alloc) {
                    for n in &a.nodes {
                        if self.owners.get(n) == Some(alloc) {
                            self.owners.remove(n);
                        }
                    }
                }
                QuorumResponse::Applied
            }
            QuorumCommand::Scale { alloc, node, added } => self.scale(alloc, node, *added),
            QuorumCommand::Barrier => QuorumResponse::Applied,
            QuorumCommand::Discovered { node, capabilities } => {
                self.discovered.insert(node.clone(), capabilities.clone());
                QuorumResponse::Applied
            }
            QuorumCommand::MemberUrl { id, url } => {
                self.member_urls.insert(*id, url.clone());
                QuorumResponse::Applied
            }
            QuorumCommand::NodeAdmin {
                node,
                drained,
                disabled,
            } => {
                if *drained || *disabled {
                    self.node_admin.insert(
                        node.clone(),
                        NodeAdmin {
                            drained: *drained,
                            disabled: *disabled,
                        },
                    );
                } else {
                    self.node_admin.remove(node);
                }
                QuorumResponse::Applied
            }
            QuorumCommand::Audit {
                at_ms,
                user,
                alloc,
                action,
                detail,
                signed,
            } => self.apply_audit(*at_ms, user, alloc, action, detail, signed.as_ref()),
            QuorumCommand::AuditArchived { segment } => self.apply_audit_archived(segment),
            QuorumCommand::SetWeights {
                vcluster,
                weights,
                at_ms,
                by,
            } => {
                self.weights.insert(vcluster.clone(), *weights);
                if let Some(c) = self.vclusters.get_mut(vcluster) {
                    c.weights = Some(*weights);
                }
                let detail = serde_json::to_string(weights).unwrap_or_default();
                self.admin(*at_ms, by, "vcluster.weights", vcluster, &detail);
                QuorumResponse::Applied
            }
            QuorumCommand::PutSettings {
                settings,
                write,
                at_ms,
                by,
            } => self.put_settings(settings, *write, *at_ms, by),
            QuorumCommand::PutVCluster {
                name,
                config,
                write,
                at_ms,
                by,
            } => self.put_vcluster(name, *config, *write, *at_ms, by),
            QuorumCommand::AccountingMark { ms } => {
                self.accounting_mark = self.accounting_mark.max(*ms);
                QuorumResponse::Applied
            }
            QuorumCommand::PutFederationPeer {
                name,
                endpoints,
                workspace,
                at_ms,
                by,
            } => {
                if self.revoked_workspaces.contains(workspace) {
                    return rejected("revoked", format!("workspace {workspace} is revoked"));
                }
                self.federation_peers.insert(
                    name.clone(),
                    FederationPeer {
                        endpoints: endpoints.clone(),
                        workspace: workspace.clone(),
                        added_ms: *at_ms,
                    },
                );
                self.admin(
                    *at_ms,
                    by,
                    "federation.add_peer",
                    name,
                    &format!("{endpoints:?} workspace={workspace}"),
                );
                QuorumResponse::Applied
            }
            QuorumCommand::RemoveFederationPeer { name, at_ms, by } => {
                if self.federation_peers.remove(name).is_none() {
                    return rejected("no_peer", format!("no federation peer {name}"));
                }
                self.admin(*at_ms, by, "federation.remove_peer", name, "");
                QuorumResponse::Applied
            }
            QuorumCommand::RevokeWorkspace { workspace, at_ms, by } => {
                self.revoked_workspaces.insert(workspace.clone());
                let peers: Vec<&String> = self
                    .federation_peers
                    .iter()
                    .filter(|(_, p)| p.workspace == *workspace)
                    .map(|(n, _)| n)
                    .collect();
                let detail = format!("peers {peers:?}");
                self.admin(*at_ms, by, "federation.revoke_workspace", workspace, &detail);
                QuorumResponse::Applied
            }
            QuorumCommand::FederatedEnd(end) => {
                let key = format!("{}/{}", end.site, end.id);
                if self.federated_ends.contains_key(&key) {
                    return QuorumResponse::Applied;
                }
                self.federated_ends.insert(key, end.clone());
                if self.federated_ends.len() > FEDERATED_ENDS_KEPT {
                    // The oldest record (by when it was recorded, then key) goes.
                    if let Some(k) = self
                        .federated_ends
                        .iter()
                        .min_by_key(|(k, e)| (e.at_ms, (*k).clone()))
                        .map(|(k, _)| k.clone())
                    {
                        self.federated_ends.remove(&k);
                    }
                }
                QuorumResponse::Applied
            }
        }
    }

    fn scale(&mut self, alloc: &str, node: &str, added: bool) -> QuorumResponse {
        let Some(a) = self.assignments.get(alloc) else {
            return self.reject("unknown", format!("scale rejected: {alloc} holds no nodes"));
        };
        if !added {
            if let Some(a) = self.assignments.get_mut(alloc) {
                a.nodes.retain(|n| n != node);
            }
            if self.owners.get(node).map(String::as_str) == Some(alloc) {
                self.owners.remove(node);
            }
            return QuorumResponse::Applied;
        }
        if self.owners.contains_key(node) {
            return self.reject(
                "node_conflict",
                format!("scale rejected: node {node} is already owned or not available"),
            );
        }
        let (tenant, project) = (a.tenant.clone(), a.project().to_string());
        let held: u64 = self
            .assignments
            .values()
            .filter(|x| x.tenant == tenant)
            .map(|x| x.nodes.len() as u64)
            .sum();
        let (max_nodes, _) = self.quotas.get(&tenant).copied().unwrap_or_default();
        if let Some(m) = max_nodes
            && held + 1 > m as u64
        {
            let v = QuotaViolation {
                quota: HardQuota::MaxNodes,
                scope: QuotaScope::Tenant,
                tenant,
                current: held,
                requested: 1,
                limit: m as u64,
            };
            return self.reject(v.quota.as_str(), v.to_string());
        }
        if let Some(q) = self.project_quota(&tenant, &project) {
            let (held, _) = self.project_usage(&tenant, &project);
            // Scaling adds a node, not an allocation: only max_nodes applies.
            let nodes_only = ProjectQuota {
                max_concurrent_allocations: None,
                ..q
            };
            if let Err(v) = check_project(&tenant, &project, &nodes_only, held, 0, 1) {
                return self.reject(v.quota.as_str(), v.to_string());
            }
        }
        self.owners.insert(node.to_string(), alloc.to_string());
        if let Some(a) = self.assignments.get_mut(alloc) {
            a.nodes.push(node.to_string());
        }
        QuorumResponse::Applied
    }

    /// [`QuorumCommand::PutTenant`]. A hard quota below what the tenant holds now is accepted: its
    /// running allocations go on, and its new assignments are rejected until it is back under.
    fn put_tenant(
        &mut self,
        name: &str,
        quota: &TenantQuota,
        write: TenantWrite,
        at_ms: u64,
        by: &str,
    ) -> QuorumResponse {
        let action = match write_action("tenant", name, write, self.tenants.contains_key(name)) {
            Ok(Some(action)) => action,
            Ok(None) => return QuorumResponse::Applied,
            Err(r) => return r,
        };
        let held: u64 = self
            .assignments
            .values()
            .filter(|a| a.tenant == name)
            .map(|a| a.nodes.len() as u64)
            .sum();
        let detail = contract_detail(quota, held, quota.max_nodes);
        self.tenants.insert(name.to_string(), *quota);
        self.quotas
            .insert(name.to_string(), (quota.max_nodes, quota.max_concurrent_allocations));
        self.admin(at_ms, by, &action, name, &detail);
        QuorumResponse::Applied
    }

    /// [`QuorumCommand::PutProject`]: as a tenant's (a limit below the project's use is accepted).
    fn put_project(
        &mut self,
        tenant: &str,
        name: &str,
        quota: &ProjectQuota,
        write: TenantWrite,
        at_ms: u64,
        by: &str,
    ) -> QuorumResponse {
        if !self.tenants.contains_key(tenant) {
            return rejected("no_tenant", format!("no tenant {tenant}"));
        }
        let target = format!("{tenant}/{name}");
        let action = match write_action("project", &target, write, self.project_quota(tenant, name).is_some()) {
            Ok(Some(action)) => action,
            Ok(None) => return QuorumResponse::Applied,
            Err(r) => return r,
        };
        let (held, _) = self.project_usage(tenant, name);
        let detail = contract_detail(quota, held, quota.max_nodes);
        self.projects
            .entry(tenant.to_string())
            .or_default()
            .insert(name.to_string(), *quota);
        self.admin(at_ms, by, &action, &target, &detail);
        QuorumResponse::Applied
    }

    /// A project's contract, if it has one.
    pub fn project_quota(&self, tenant: &str, project: &str) -> Option<ProjectQuota> {
        self.projects.get(tenant)?.get(project).copied()
    }

    /// Nodes held and allocations running of a tenant's project.
    pub fn project_usage(&self, tenant: &str, project: &str) -> (u64, u64) {
        self.assignments
            .values()
            .filter(|a| a.tenant == tenant && a.project() == project)
            .fold((0, 0), |(h, r), a| (h + a.nodes.len() as u64, r + 1))
    }

    /// [`QuorumCommand::PutVCluster`].
    fn put_vcluster(
        &mut self,
        name: &str,
        mut config: lattice_engine::VClusterConfig,
        write: TenantWrite,
        at_ms: u64,
        by: &str,
    ) -> QuorumResponse {
        let action = match write_action("vcluster", name, write, self.vclusters.contains_key(name)) {
            Ok(Some(action)) => action,
            Ok(None) => return QuorumResponse::Applied,
            Err(r) => return r,
        };
        if write == TenantWrite::Seed
            && let Some(w) = self.weights.get(name)
        {
            // Weights an operator set before configurations were kept here win over the
            // profile's.
            config.weights = Some(*w);
        }
        self.vclusters.insert(name.to_string(), config);
        // The weights in force are this configuration's from now on.
        match config.weights {
            Some(w) => self.weights.insert(name.to_string(), w),
            None => self.weights.remove(name),
        };
        let detail = serde_json::to_string(&config).unwrap_or_default();
        self.admin(at_ms, by, &action, name, &detail);
        QuorumResponse::Applied
    }

    /// [`QuorumCommand::PutSettings`].
    fn put_settings(
        &mut self,
        settings: &BTreeMap<String, Option<u64>>,
        write: TenantWrite,
        at_ms: u64,
        by: &str,
    ) -> QuorumResponse {
        let action = match write {
            TenantWrite::Seed if !self.settings.is_empty() => return QuorumResponse::Applied,
            TenantWrite::Seed => "settings.seed",
            TenantWrite::Create | TenantWrite::Update => "settings.update",
        };
        for (key, value) in settings {
            match value {
                Some(ms) => self.settings.insert(key.clone(), *ms),
                None => self.settings.remove(key),
            };
        }
        let detail = serde_json::to_string(settings).unwrap_or_default();
        self.admin(at_ms, by, action, "site", &detail);
        QuorumResponse::Applied
    }

    /// An entry in the administrative log.
    fn admin(&mut self, at_ms: u64, by: &str, action: &str, target: &str, detail: &str) {
        self.admin_log.push(AdminEntry {
            at_ms,
            user: by.to_string(),
            action: action.into(),
            target: target.to_string(),
            detail: detail.to_string(),
        });
    }

    fn reject(&mut self, reason: &str, message: String) -> QuorumResponse {
        self.rejections += 1;
        QuorumResponse::Rejected {
            reason: reason.to_string(),
            message,
        }
    }

    fn assign(&mut self, cmd: &QuorumCommand) -> QuorumResponse {
        let QuorumCommand::Assign {
            alloc,
            tenant,
            nodes,
            sensitive,
            at_ms: since_ms,
            project,
            network,
        } = cmd
        else {
            return QuorumResponse::Applied;
        };
        let (sensitive, since_ms, project) = (*sensitive, *since_ms, project.as_deref());
        if self.assignments.contains_key(alloc) {
            return self.reject("duplicate", format!("allocation rejected: {alloc} already holds nodes"));
        }
        if let Some(n) = nodes.iter().find(|n| self.owners.contains_key(*n)) {
            return self.reject(
                "node_conflict",
                format!("allocation rejected: node {n} is already owned or not available"),
            );
        }
        let (held, running) = self
            .assignments
            .values()
            .filter(|a| a.tenant == *tenant)
            .fold((0u64, 0u64), |(h, r), a| (h + a.nodes.len() as u64, r + 1));
        let (max_nodes, max_concurrent) = self.quotas.get(tenant).copied().unwrap_or_default();
        let quota = TenantQuota {
            max_nodes,
            max_concurrent_allocations: max_concurrent,
            ..TenantQuota::default()
        };
        let k = nodes.len() as u64;
        if let Err(v) = check_hard(tenant, &quota, held, running, k) {
            return self.reject(v.quota.as_str(), v.to_string());
        }
        let project_name = project.unwrap_or("default");
        if let Some(q) = self.project_quota(tenant, project_name) {
            let (held, running) = self.project_usage(tenant, project_name);
            if let Err(v) = check_project(tenant, project_name, &q, held, running, k) {
                return self.reject(v.quota.as_str(), v.to_string());
            }
        }
        if sensitive && let Some(size) = self.sensitive_pool_size {
            let held: u64 = self
                .assignments
                .values()
                .filter(|a| a.sensitive)
                .map(|a| a.nodes.len() as u64)
                .sum();
            if held + k > size as u64 {
                let v = QuotaViolation {
                    quota: HardQuota::SensitivePoolSize,
                    scope: QuotaScope::Tenant,
                    tenant: tenant.to_string(),
                    current: held,
                    requested: k,
                    limit: size as u64,
                };
                return self.reject(v.quota.as_str(), v.to_string());
            }
        }
        if let Some(g) = network
            && let Some((other, a)) = self.assignments.iter().find_map(|(id, a)| {
                let h = a.network.as_ref()?;
                let same_domain = a.tenant == *tenant && h.domain == g.domain;
                (same_domain != (h.vni == g.vni)).then_some((id, h))
            })
        {
            return self.reject(
                "vni_conflict",
                format!(
                    "allocation rejected: network domain {} on VNI {} conflicts with {other}'s domain {} on VNI {}",
                    g.domain, g.vni, a.domain, a.vni
                ),
            );
        }
        for n in nodes {
            self.owners.insert(n.clone(), alloc.to_string());
        }
        self.assignments.insert(
            alloc.to_string(),
            Assignment {
                tenant: tenant.to_string(),
                nodes: nodes.to_vec(),
                sensitive,
                since_ms,
                project: project.map(str::to_string),
                network: network.clone(),
                cxi_service: None,
                claim_audited: false,
            },
        );
        self.commits += 1;
        QuorumResponse::Applied
    }

    /// An audit entry, appended in log order; a second `attach` of a sensitive allocation while one
    /// is open is rejected.
    fn apply_audit(
        &mut self,
        at_ms: u64,
        user: &str,
        alloc: &str,
        action: &str,
        detail: &str,
        signed: Option<&lattice_engine::audit::Signed>,
    ) -> QuorumResponse {
        // Book ("Observability Constraints"): one terminal session at a time on a sensitive
        // allocation — decided here, in log order, so of two opened at once exactly one is.
        // (Signed entries only: a log written before the rule replays as it applied then.)
        if action == "attach"
            && signed.is_some()
            && let Some(open) = self.open_session(alloc)
        {
            return QuorumResponse::Rejected {
                reason: "session_open".into(),
                message: format!(
                    "{alloc} already has a terminal session open ({} by {}, since {} ms): one at a time for a sensitive allocation",
                    open.detail, open.user, open.at_ms
                ),
            };
        }
        // A claim is written once: a deposed leader's late entry for a claim the next leader
        // already recorded (at its take-over) is refused.
        if action == "claim"
            && signed.is_some()
            && let Some(a) = self.assignments.get_mut(alloc)
        {
            if a.claim_audited {
                return QuorumResponse::Rejected {
                    reason: "claim_recorded".into(),
                    message: format!("{alloc}'s claim is already in the audit log"),
                };
            }
            a.claim_audited = true;
        }
        lattice_engine::audit::append_after(
            &mut self.audit,
            &self.audit_base,
            at_ms,
            user,
            alloc,
            action,
            detail,
            signed,
        );
        QuorumResponse::Applied
    }

    /// The `attach` entry of `alloc`'s terminal session still open (no `attach_end` after it).
    pub fn open_session(&self, alloc: &str) -> Option<&AuditEntry> {
        self.audit
            .iter()
            .rev()
            .filter(|e| e.alloc == alloc)
            .find(|e| e.action == "attach" || e.action.starts_with("attach_end"))
            .filter(|e| e.action == "attach")
    }

    /// The open terminal sessions: each allocation with its `attach` entry's detail.
    pub fn open_sessions(&self) -> Vec<(String, String)> {
        let mut allocs: Vec<&str> = self
            .audit
            .iter()
            .filter(|e| e.action == "attach")
            .map(|e| e.alloc.as_str())
            .collect();
        allocs.sort_unstable();
        allocs.dedup();
        allocs
            .into_iter()
            .filter_map(|a| self.open_session(a))
            .map(|e| (e.alloc.clone(), e.detail.clone()))
            .collect()
    }

    /// Re-derives every held audit hash from where the held log starts (the archive's end), and
    /// checks the archive's manifest leads there: `Err(seq)` names the first entry that does not chain.
    pub fn verify_audit(&self) -> Result<(), u64> {
        crate::audit_archive::check_manifest(&self.audit_archive, &self.audit_base).map_err(|_| self.audit_base.seq)?;
        lattice_engine::audit::verify_from(&self.audit, &self.audit_base)
    }
}

/// The audit log's cold tier, as the state records it ([`crate::audit_archive`]).
impl QuorumState {
    /// How many entries the chain holds, archived ones included.
    pub fn audit_total(&self) -> u64 {
        self.audit_base.seq + self.audit.len() as u64
    }

    /// The entries the archive may take now: the oldest held ones with `at_ms` before `before_ms`,
    /// at most `max`, stopping at an open terminal session's `attach` (the one-session rule reads
    /// it from the held log).
    pub fn archive_cut(&self, before_ms: u64, max: usize) -> &[AuditEntry] {
        let open: Vec<u64> = self
            .open_sessions()
            .iter()
            .filter_map(|(a, _)| self.open_session(a).map(|e| e.seq))
            .collect();
        let n = self
            .audit
            .iter()
            .take(max)
            .take_while(|e| e.at_ms < before_ms && !open.contains(&e.seq))
            .count();
        &self.audit[..n]
    }

    /// [`QuorumCommand::AuditArchived`]: the held log's first
    /// entries are in the archive's object now — drops them and records the segment, when the
    /// segment is exactly the log's start; otherwise rejected and nothing changes.
    pub(crate) fn apply_audit_archived(&mut self, seg: &crate::audit_archive::ArchivedSegment) -> QuorumResponse {
        let fits = seg.first_seq == self.audit_base.seq
            && seg.prev == self.audit_base.prev
            && seg.last_seq >= seg.first_seq
            && ((seg.last_seq - seg.first_seq) as usize) < self.audit.len()
            && self.audit[(seg.last_seq - seg.first_seq) as usize].hash == seg.last_hash;
        if !fits {
            return QuorumResponse::Rejected {
                reason: "archive_stale".into(),
                message: format!(
                    "{}: entries {}..={} are not the held log's start (entry {})",
                    seg.key, seg.first_seq, seg.last_seq, self.audit_base.seq
                ),
            };
        }
        let n = (seg.last_seq - seg.first_seq + 1) as usize;
        let last = self.audit.drain(..n).next_back().expect("n >= 1");
        self.audit_base = lattice_engine::audit::Anchor::after(&last);
        self.audit_archive.push(seg.clone());
        QuorumResponse::Applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assign(alloc: &str, tenant: &str, nodes: &[&str]) -> QuorumCommand {
        assign_to(alloc, tenant, None, nodes)
    }

    /// A batch applies its commands in order, as separate entries would, and answers each: a start
    /// on a node an earlier command of the same batch took is refused, a release frees it for a
    /// later one; a batch inside a batch is refused, and changes nothing.
    #[test]
    fn a_batch_applies_each_command_in_order_and_answers_each() {
        let mut s = QuorumState::default();
        let r = s.apply(&QuorumCommand::Batch {
            commands: vec![
                assign("a1", "t", &["n1"]),
                assign("a2", "t", &["n1"]),
                QuorumCommand::Release { alloc: "a1".into() },
                assign("a3", "t", &["n1"]),
                QuorumCommand::Batch {
                    commands: vec![assign("a4", "t", &["n2"])],
                },
            ],
        });
        let QuorumResponse::Batch(answers) = r else {
            panic!("{r:?}")
        };
        assert_eq!(answers.len(), 5);
        assert_eq!(answers[0], QuorumResponse::Applied);
        assert!(
            matches!(&answers[1], QuorumResponse::Rejected { .. }),
            "{:?}",
            answers[1]
        );
        assert_eq!(answers[2], QuorumResponse::Applied);
        assert_eq!(answers[3], QuorumResponse::Applied);
        assert!(matches!(&answers[4], QuorumResponse::Rejected { reason, .. } if reason == "nested_batch"));
        assert_eq!(s.assignments.keys().collect::<Vec<_>>(), ["a3"]);
    }

    fn assign_in(alloc: &str, tenant: &str, project: &str, nodes: &[&str]) -> QuorumCommand {
        assign_to(alloc, tenant, Some(project), nodes)
    }

    fn assign_to(alloc: &str, tenant: &str, project: Option<&str>, nodes: &[&str]) -> QuorumCommand {
        QuorumCommand::Assign {
            alloc: alloc.into(),
            tenant: tenant.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            sensitive: false,
            at_ms: 7,
            project: project.map(Into::into),
            network: None,
        }
    }

    fn put_project(tenant: &str, name: &str, quota: ProjectQuota, write: TenantWrite) -> QuorumCommand {
        QuorumCommand::PutProject {
            tenant: tenant.into(),
            name: name.into(),
            quota,
            write,
            at_ms: 9,
            by: "root".into(),
        }
    }

    fn reason(r: QuorumResponse) -> String {
        match r {
            QuorumResponse::Rejected { reason, .. } => reason,
            QuorumResponse::Applied => "applied".into(),
            QuorumResponse::Batch(_) => "batch".into(),
        }
    }

    /// A vCluster's configuration: created once, updated when it exists, seeded only when absent;
    /// the weights in force follow the configuration and later weight changes, in log order.
    #[test]
    fn vcluster_configurations_are_created_updated_and_seeded_in_log_order() {
        let mut s = QuorumState::default();
        let mut cfg = lattice_engine::VClusterConfig::new(lattice_engine::Policy::Fcfs);
        let put = |config: lattice_engine::VClusterConfig, write| QuorumCommand::PutVCluster {
            name: "ml".into(),
            config,
            write,
            at_ms: 3,
            by: "root".into(),
        };
        assert_eq!(reason(s.apply(&put(cfg, TenantWrite::Update))), "no_vcluster");
        assert_eq!(s.apply(&put(cfg, TenantWrite::Create)), QuorumResponse::Applied);
        assert_eq!(reason(s.apply(&put(cfg, TenantWrite::Create))), "vcluster_exists");
        cfg.cycle_interval = lattice_engine::Duration::from_secs(15);
        cfg.weights = Some(lattice_engine::CostWeights::default());
        assert_eq!(s.apply(&put(cfg, TenantWrite::Update)), QuorumResponse::Applied);
        let seeded = lattice_engine::VClusterConfig::new(lattice_engine::Policy::EASY);
        assert_eq!(s.apply(&put(seeded, TenantWrite::Seed)), QuorumResponse::Applied);
        assert_eq!(s.vclusters["ml"], cfg, "a seed never overrides");
        assert_eq!(s.weights.get("ml"), cfg.weights.as_ref());
        let w = lattice_engine::CostWeights {
            priority: 0.9,
            ..Default::default()
        };
        s.apply(&QuorumCommand::SetWeights {
            vcluster: "ml".into(),
            weights: w,
            at_ms: 4,
            by: "root".into(),
        });
        assert_eq!(s.vclusters["ml"].weights, Some(w));
        assert_eq!(s.vclusters["ml"].cycle_interval, cfg.cycle_interval);
        let actions: Vec<&str> = s.admin_log.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(actions, ["vcluster.create", "vcluster.update", "vcluster.weights"]);
    }

    /// Site settings: seeded once (a later seed changes nothing), updated key by key, a key
    /// removed by `None`; every write is in the admin log.
    #[test]
    fn settings_are_seeded_once_and_updated_key_by_key() {
        let mut s = QuorumState::default();
        let put = |pairs: &[(&str, Option<u64>)], write| QuorumCommand::PutSettings {
            settings: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            write,
            at_ms: 5,
            by: "root".into(),
        };
        s.apply(&put(&[("a", Some(1)), ("b", Some(2))], TenantWrite::Seed));
        s.apply(&put(&[("a", Some(9)), ("c", Some(3))], TenantWrite::Seed));
        assert_eq!(s.settings, BTreeMap::from([("a".into(), 1), ("b".into(), 2)]));
        s.apply(&put(&[("b", None), ("c", Some(4))], TenantWrite::Update));
        assert_eq!(s.settings, BTreeMap::from([("a".into(), 1), ("c".into(), 4)]));
        let actions: Vec<&str> = s.admin_log.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(actions, ["settings.seed", "settings.update"]);
    }

    /// A start is recorded with its network domain's VNI and the CXI service created for it; no
    /// two domains hold one VNI, and a domain has one VNI; the release frees both.
    #[test]
    fn starts_record_their_vni_and_no_two_domains_share_one() {
        let mut s = QuorumState::default();
        let on = |alloc: &str, tenant: &str, node: &str, domain: &str, vni: u32| {
            let mut c = assign(alloc, tenant, &[node]);
            if let QuorumCommand::Assign { network, .. } = &mut c {
                *network = Some(NetworkGrant {
                    domain: domain.into(),
                    vni,
                });
            }
            c
        };
        assert_eq!(s.apply(&on("a1", "t", "n1", "ml", 1000)), QuorumResponse::Applied);
        assert_eq!(
            s.apply(&on("a2", "t", "n2", "ml", 1000)),
            QuorumResponse::Applied,
            "joins"
        );
        assert_eq!(
            reason(s.apply(&on("a3", "u", "n3", "ml", 1000))),
            "vni_conflict",
            "another tenant's"
        );
        assert_eq!(
            reason(s.apply(&on("a3", "t", "n3", "ml", 1001))),
            "vni_conflict",
            "ml has 1000"
        );
        assert!(!s.owners.contains_key("n3"), "a rejected start holds nothing");
        assert_eq!(s.apply(&on("a3", "u", "n3", "ml", 1001)), QuorumResponse::Applied);
        let cxi = QuorumCommand::CxiService {
            alloc: "a1".into(),
            service: "svc-1".into(),
        };
        s.apply(&cxi);
        assert_eq!(s.assignments["a1"].cxi_service.as_deref(), Some("svc-1"));
        assert_eq!(s.assignments["a1"].network.as_ref().map(|g| g.vni), Some(1000));
        s.apply(&QuorumCommand::Release { alloc: "a1".into() });
        s.apply(&QuorumCommand::Release { alloc: "a2".into() });
        assert_eq!(
            s.apply(&on("a4", "t", "n4", "other", 1000)),
            QuorumResponse::Applied,
            "free again"
        );
    }

    /// A project's hard limits apply with its tenant's, counted over the project's assignments only;
    /// a lowered limit blocks new work without touching what runs; a project in use is not deleted.
    #[test]
    fn project_quotas_are_enforced_at_apply_within_the_tenants() {
        let mut s = QuorumState::default();
        let two = ProjectQuota {
            max_nodes: Some(2),
            ..Default::default()
        };
        assert_eq!(
            reason(s.apply(&put_project("physics", "qcd", two, TenantWrite::Create))),
            "no_tenant",
            "a project needs its tenant"
        );
        let tenant = QuorumCommand::PutTenant {
            name: "physics".into(),
            quota: TenantQuota {
                max_nodes: Some(4),
                ..TenantQuota::default()
            },
            write: TenantWrite::Create,
            at_ms: 1,
            by: "root".into(),
        };
        s.apply(&tenant);
        assert_eq!(
            s.apply(&put_project("physics", "qcd", two, TenantWrite::Create)),
            QuorumResponse::Applied
        );
        assert_eq!(
            reason(s.apply(&put_project("physics", "qcd", two, TenantWrite::Create))),
            "project_exists"
        );
        assert_eq!(
            reason(s.apply(&put_project("physics", "astro", two, TenantWrite::Update))),
            "no_project"
        );
        assert_eq!(
            s.apply(&assign_in("a", "physics", "qcd", &["n1", "n2"])),
            QuorumResponse::Applied
        );
        let QuorumResponse::Rejected { reason: r, message } = s.apply(&assign_in("b", "physics", "qcd", &["n3"]))
        else {
            panic!("the project is full")
        };
        assert_eq!(r, "max_nodes");
        assert_eq!(
            message,
            "allocation rejected: project \"physics/qcd\" would exceed max_nodes quota (current: 2, requested: 1, limit: 2)"
        );
        assert!(
            !s.owners.contains_key("n3"),
            "nothing recorded for a rejected assignment"
        );
        // Another project of the tenant (and its default project) only meet the tenant's limit.
        assert_eq!(s.apply(&assign("c", "physics", &["n3"])), QuorumResponse::Applied);
        assert_eq!(
            reason(s.apply(&assign_in("d", "physics", "astro", &["n4", "n5"]))),
            "max_nodes"
        );
        // Scaling a project's allocation past its max_nodes is refused.
        assert_eq!(
            reason(s.apply(&QuorumCommand::Scale {
                alloc: "a".into(),
                node: "n9".into(),
                added: true
            })),
            "max_nodes"
        );
        // Lowered below use: accepted and noted; the running allocation keeps its nodes.
        let one = ProjectQuota {
            max_nodes: Some(1),
            ..Default::default()
        };
        assert_eq!(
            s.apply(&put_project("physics", "qcd", one, TenantWrite::Update)),
            QuorumResponse::Applied
        );
        assert!(s.admin_log.last().unwrap().detail.contains("above the new limit 1"));
        assert_eq!(s.assignments["a"].nodes.len(), 2);
        assert_eq!(
            reason(s.apply(&QuorumCommand::DeleteProject {
                tenant: "physics".into(),
                name: "qcd".into(),
                at_ms: 10,
                by: "root".into()
            })),
            "project_in_use"
        );
        s.apply(&QuorumCommand::Release { alloc: "a".into() });
        assert_eq!(
            s.apply(&QuorumCommand::DeleteProject {
                tenant: "physics".into(),
                name: "qcd".into(),
                at_ms: 10,
                by: "root".into()
            }),
            QuorumResponse::Applied
        );
        assert!(s.projects.is_empty());
        let actions: Vec<&str> = s.admin_log.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(
            actions,
            ["tenant.create", "project.create", "project.update", "project.delete"]
        );
        // A snapshot keeps projects; a deleted tenant takes its projects along.
        s.apply(&put_project("physics", "astro", one, TenantWrite::Seed));
        let again: QuorumState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(again, s);
        s.apply(&QuorumCommand::Release { alloc: "c".into() });
        s.apply(&QuorumCommand::DeleteTenant {
            name: "physics".into(),
            at_ms: 11,
            by: "root".into(),
        });
        assert!(s.projects.is_empty());
    }

    #[test]
    fn node_admin_orders_are_kept_replaced_and_cleared_and_survive_a_snapshot() {
        let mut s = QuorumState::default();
        let admin = |drained, disabled| QuorumCommand::NodeAdmin {
            node: "n1".into(),
            drained,
            disabled,
        };
        s.apply(&admin(true, false));
        assert_eq!(
            s.node_admin["n1"],
            NodeAdmin {
                drained: true,
                disabled: false
            }
        );
        s.apply(&admin(true, true));
        assert_eq!(
            s.node_admin["n1"],
            NodeAdmin {
                drained: true,
                disabled: true
            }
        );
        let again: QuorumState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(again, s, "a snapshot keeps the orders");
        s.apply(&admin(false, false));
        assert!(s.node_admin.is_empty(), "both false clears the node's order");
        let old: QuorumState = serde_json::from_str(r#"{"owners":{},"assignments":{},"quotas":{},"sensitive_pool_size":null,"audit":[],"commits":0,"rejections":0}"#).unwrap();
        assert!(
            old.node_admin.is_empty(),
            "a snapshot from before orders were kept still reads"
        );
    }

    /// A peer's report of a forwarded allocation's end is kept once (a repeat, e.g. from the peer's
    /// next leader, changes nothing); past the cap the oldest goes.
    #[test]
    fn federated_ends_are_kept_once_and_capped() {
        let end = |id: u64, state: &str| {
            QuorumCommand::FederatedEnd(FederatedEnd {
                site: "site-b".into(),
                id: format!("a-{id}"),
                user: "alice".into(),
                tenant: "physics".into(),
                state: state.into(),
                end_reason: None,
                ended_ms: id,
                at_ms: id,
            })
        };
        let mut s = QuorumState::default();
        assert_eq!(s.apply(&end(0, "completed")), QuorumResponse::Applied);
        assert_eq!(s.apply(&end(0, "failed")), QuorumResponse::Applied);
        assert_eq!(
            s.federated_ends["site-b/a-0"].state, "completed",
            "the first report stays"
        );
        for id in 1..=FEDERATED_ENDS_KEPT as u64 {
            s.apply(&end(id, "completed"));
        }
        assert_eq!(s.federated_ends.len(), FEDERATED_ENDS_KEPT);
        assert!(!s.federated_ends.contains_key("site-b/a-0"), "the oldest went");
        assert!(s.federated_ends.contains_key("site-b/a-10000"));
    }

    #[test]
    fn federation_peers_are_kept_and_a_revoked_workspace_is_never_trusted_again() {
        let mut s = QuorumState::default();
        let peer = |name: &str, ws: &str| QuorumCommand::PutFederationPeer {
            name: name.into(),
            endpoints: vec![format!("https://{name}.example")],
            workspace: ws.into(),
            at_ms: 1,
            by: "admin".into(),
        };
        assert_eq!(s.apply(&peer("site-b", "hpc")), QuorumResponse::Applied);
        assert_eq!(s.apply(&peer("site-c", "hpc")), QuorumResponse::Applied);
        let revoke = QuorumCommand::RevokeWorkspace {
            workspace: "hpc".into(),
            at_ms: 2,
            by: "admin".into(),
        };
        assert_eq!(s.apply(&revoke), QuorumResponse::Applied);
        assert!(s.revoked_workspaces.contains("hpc"));
        // Re-adding a peer under the revoked workspace is refused.
        assert!(
            matches!(s.apply(&peer("site-d", "hpc")), QuorumResponse::Rejected { ref reason, .. } if reason == "revoked")
        );
        let remove = |name: &str| QuorumCommand::RemoveFederationPeer {
            name: name.into(),
            at_ms: 3,
            by: "admin".into(),
        };
        assert_eq!(s.apply(&remove("site-b")), QuorumResponse::Applied);
        assert!(
            matches!(s.apply(&remove("site-b")), QuorumResponse::Rejected { ref reason, .. } if reason == "no_peer")
        );
        assert_eq!(s.federation_peers.keys().collect::<Vec<_>>(), vec!["site-c"]);
        let actions: Vec<&str> = s.admin_log.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(
            actions,
            vec![
                "federation.add_peer",
                "federation.add_peer",
                "federation.revoke_workspace",
                "federation.remove_peer"
            ]
        );
        // A snapshot keeps them; a state without them reads as before (empty).
        let back: QuorumState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let old: QuorumState = serde_json::from_str(&serde_json::to_string(&QuorumState::default()).unwrap()).unwrap();
        assert!(old.federation_peers.is_empty() && old.revoked_workspaces.is_empty());
    }

    #[test]
    fn one_owner_per_node_and_release() {
        let mut s = QuorumState::default();
        assert_eq!(s.apply(&assign("a", "t", &["n1", "n2"])), QuorumResponse::Applied);
        let r = s.apply(&assign("b", "t", &["n2", "n3"]));
        assert!(
            matches!(r, QuorumResponse::Rejected { ref reason, .. } if reason == "node_conflict"),
            "{r:?}"
        );
        s.apply(&QuorumCommand::Release { alloc: "a".into() });
        assert_eq!(s.apply(&assign("b", "t", &["n2", "n3"])), QuorumResponse::Applied);
        assert_eq!(s.owners.get("n2").map(String::as_str), Some("b"));
        assert_eq!(
            s.assignments["b"].since_ms, 7,
            "the start time is replicated with the nodes"
        );
        assert_eq!((s.commits, s.rejections), (2, 1));
    }

    #[test]
    fn hard_quotas_reject_with_the_seed_message() {
        let mut s = QuorumState::default();
        s.apply(&QuorumCommand::SetQuota {
            tenant: "physics".into(),
            max_nodes: Some(3),
            max_concurrent_allocations: Some(2),
        });
        assert_eq!(s.apply(&assign("a", "physics", &["n1", "n2"])), QuorumResponse::Applied);
        let QuorumResponse::Rejected { reason, message } = s.apply(&assign("b", "physics", &["n3", "n4"])) else {
            panic!("max_nodes must reject")
        };
        assert_eq!(reason, "max_nodes");
        assert!(message.contains("physics") && message.contains('3'), "{message}");
        assert_eq!(s.apply(&assign("c", "physics", &["n3"])), QuorumResponse::Applied);
        let QuorumResponse::Rejected { reason, .. } = s.apply(&assign("d", "physics", &["n5"])) else {
            panic!("max_concurrent_allocations must reject")
        };
        assert_eq!(reason, "max_nodes", "4 nodes would exceed 3 first");
        s.apply(&QuorumCommand::SetQuota {
            tenant: "physics".into(),
            max_nodes: None,
            max_concurrent_allocations: Some(2),
        });
        let QuorumResponse::Rejected { reason, .. } = s.apply(&assign("d", "physics", &["n5"])) else {
            panic!("max_concurrent_allocations must reject")
        };
        assert_eq!(reason, "max_concurrent_allocations");
        // Other tenants are not affected.
        assert_eq!(s.apply(&assign("e", "bio", &["n6"])), QuorumResponse::Applied);
    }

    #[test]
    fn sensitive_pool_is_system_wide() {
        let mut s = QuorumState::default();
        s.apply(&QuorumCommand::SetSensitivePool { size: Some(2) });
        let claim = |a: &str, n: &str| QuorumCommand::Assign {
            alloc: a.into(),
            tenant: "hospital".into(),
            nodes: vec![n.into()],
            sensitive: true,
            at_ms: 0,
            project: None,
            network: None,
        };
        assert_eq!(s.apply(&claim("c1", "n1")), QuorumResponse::Applied);
        assert_eq!(s.apply(&claim("c2", "n2")), QuorumResponse::Applied);
        assert!(
            matches!(s.apply(&claim("c3", "n3")), QuorumResponse::Rejected { ref reason, .. } if reason == "sensitive_pool_size")
        );
    }

    /// One terminal session at a time on a sensitive allocation: a second `attach` while one is open
    /// is rejected (nothing appended); after its `attach_end` the next opens; other allocations are
    /// not held up; the open sessions are listed (a new leader ends them).
    #[test]
    fn one_terminal_session_at_a_time_on_a_sensitive_allocation() {
        let mut s = QuorumState::default();
        let key = lattice_engine::audit::SigningKey::from_bytes(&[3; 32]);
        let attach = |alloc: &str, action: &str, via: u64| {
            let detail = format!("terminal on n1 via m{via}");
            QuorumCommand::Audit {
                at_ms: 1,
                user: "dr-x".into(),
                alloc: alloc.into(),
                action: action.into(),
                signed: Some(lattice_engine::audit::sign(&key, 1, "dr-x", alloc, action, &detail)),
                detail,
            }
        };
        assert_eq!(s.apply(&attach("c1", "attach", 1)), QuorumResponse::Applied);
        let r = s.apply(&attach("c1", "attach", 2));
        assert!(
            matches!(r, QuorumResponse::Rejected { ref reason, .. } if reason == "session_open"),
            "{r:?}"
        );
        assert_eq!(s.audit.len(), 1, "nothing appended");
        assert_eq!(s.apply(&attach("c2", "attach", 11)), QuorumResponse::Applied);
        assert_eq!(
            s.open_sessions(),
            [
                ("c1".to_string(), "terminal on n1 via m1".to_string()),
                ("c2".to_string(), "terminal on n1 via m11".to_string())
            ]
        );
        assert_eq!(
            s.apply(&attach("c1", "attach_end (client left)", 1)),
            QuorumResponse::Applied
        );
        assert_eq!(s.open_sessions().len(), 1);
        assert_eq!(s.apply(&attach("c1", "attach", 2)), QuorumResponse::Applied); // An unsigned entry (a log from before the rule) applies as it did then.
        let old = QuorumCommand::Audit {
            at_ms: 1,
            user: "dr-x".into(),
            alloc: "c1".into(),
            action: "attach".into(),
            detail: String::new(),
            signed: None,
        };
        assert_eq!(s.apply(&old), QuorumResponse::Applied);
        assert_eq!(s.verify_audit(), Ok(()));
    }

    #[test]
    fn audit_log_chains_and_detects_tampering() {
        let mut s = QuorumState::default();
        for (i, action) in ["claim", "attach", "release"].iter().enumerate() {
            s.apply(&QuorumCommand::Audit {
                at_ms: i as u64,
                user: "dr-x".into(),
                alloc: "c1".into(),
                action: action.to_string(),
                detail: String::new(),
                signed: None,
            });
        }
        assert_eq!(s.verify_audit(), Ok(()));
        assert_eq!(s.audit[1].prev, s.audit[0].hash);
        let mut t = s.clone();
        t.audit[1].user = "mallory".into();
        assert_eq!(t.verify_audit(), Err(1));
        let mut t = s.clone();
        t.audit.remove(1);
        assert!(t.verify_audit().is_err());
    }

    #[test]
    fn tenants_are_created_updated_seeded_and_deleted_with_their_log() {
        let mut s = QuorumState::default();
        let put = |name: &str, max: Option<u32>, write| QuorumCommand::PutTenant {
            name: name.into(),
            quota: TenantQuota {
                max_nodes: max,
                gpu_hours_budget: Some(100.0),
                ..TenantQuota::default()
            },
            write,
            at_ms: 5,
            by: "root".into(),
        };
        assert_eq!(
            s.apply(&put("physics", Some(2), TenantWrite::Update)),
            rejected("no_tenant", "no tenant physics".into())
        );
        assert_eq!(
            s.apply(&put("physics", Some(2), TenantWrite::Create)),
            QuorumResponse::Applied
        );
        assert!(
            matches!(s.apply(&put("physics", Some(9), TenantWrite::Create)), QuorumResponse::Rejected { ref reason, .. } if reason == "tenant_exists")
        );
        // The tenants file never overrides what the API set.
        assert_eq!(
            s.apply(&put("physics", Some(9), TenantWrite::Seed)),
            QuorumResponse::Applied
        );
        assert_eq!(s.tenants["physics"].max_nodes, Some(2));
        // The hard quota is enforced at assignment.
        assert_eq!(s.apply(&assign("a", "physics", &["n1", "n2"])), QuorumResponse::Applied);
        assert!(
            matches!(s.apply(&assign("b", "physics", &["n3"])), QuorumResponse::Rejected { ref reason, .. } if reason == "max_nodes")
        );
        // Lowered below what it holds: accepted, said in the log; raised: the next assignment fits.
        assert_eq!(
            s.apply(&put("physics", Some(1), TenantWrite::Update)),
            QuorumResponse::Applied
        );
        assert!(
            s.admin_log
                .last()
                .unwrap()
                .detail
                .contains("holds 2 nodes, above the new limit 1")
        );
        assert_eq!(
            s.apply(&put("physics", Some(3), TenantWrite::Update)),
            QuorumResponse::Applied
        );
        assert_eq!(s.apply(&assign("b", "physics", &["n3"])), QuorumResponse::Applied);
        // Not deleted while it holds nodes.
        let del = QuorumCommand::DeleteTenant {
            name: "physics".into(),
            at_ms: 6,
            by: "root".into(),
        };
        assert!(matches!(s.apply(&del), QuorumResponse::Rejected { ref reason, .. } if reason == "tenant_in_use"));
        s.apply(&QuorumCommand::Release { alloc: "a".into() });
        s.apply(&QuorumCommand::Release { alloc: "b".into() });
        assert_eq!(s.apply(&del), QuorumResponse::Applied);
        assert!(!s.tenants.contains_key("physics") && !s.quotas.contains_key("physics"));
        let actions: Vec<&str> = s.admin_log.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(
            actions,
            ["tenant.create", "tenant.update", "tenant.update", "tenant.delete"]
        );
        // Refused tenant writes are not refused assignments.
        assert_eq!(s.rejections, 1);
        // A state from before tenants were replicated still reads.
        let old: QuorumState = serde_json::from_str(r#"{"owners":{},"assignments":{},"quotas":{},"sensitive_pool_size":null,"audit":[],"commits":0,"rejections":0}"#).unwrap();
        assert!(old.tenants.is_empty() && old.admin_log.is_empty());
    }

    #[test]
    fn scaling_keeps_one_owner_per_node_and_the_tenant_quota() {
        let mut s = QuorumState::default();
        s.apply(&QuorumCommand::SetQuota {
            tenant: "t".into(),
            max_nodes: Some(3),
            max_concurrent_allocations: None,
        });
        s.apply(&assign("a", "t", &["n1", "n2"]));
        s.apply(&assign("b", "u", &["n4"]));
        let scale = |node: &str, added: bool| QuorumCommand::Scale {
            alloc: "a".into(),
            node: node.into(),
            added,
        };
        let r = s.apply(&scale("n4", true));
        assert!(
            matches!(r, QuorumResponse::Rejected { ref reason, .. } if reason == "node_conflict"),
            "{r:?}"
        );
        assert_eq!(s.apply(&scale("n3", true)), QuorumResponse::Applied);
        assert_eq!(s.owners.get("n3").map(String::as_str), Some("a"));
        let r = s.apply(&scale("n5", true));
        assert!(
            matches!(r, QuorumResponse::Rejected { ref reason, .. } if reason == "max_nodes"),
            "{r:?}"
        );
        assert_eq!(s.apply(&scale("n1", false)), QuorumResponse::Applied);
        assert!(!s.owners.contains_key("n1"));
        assert_eq!(s.assignments["a"].nodes, vec!["n2".to_string(), "n3".to_string()]);
        s.apply(&QuorumCommand::Release { alloc: "a".into() });
        assert!(!s.owners.contains_key("n3"), "a release frees the nodes it grew onto");
    }

    fn state_with(n: u64) -> QuorumState {
        let mut s = QuorumState::default();
        for i in 0..n {
            s.apply(&QuorumCommand::Audit {
                at_ms: 1000 + i,
                user: "dr-x".into(),
                alloc: format!("a-{}", i % 3),
                action: "claim".into(),
                detail: "n1".into(),
                signed: None,
            });
        }
        s
    }

    fn archive(
        s: &mut QuorumState,
        key: &str,
        before_ms: u64,
        max: usize,
    ) -> (crate::audit_archive::ArchivedSegment, Vec<u8>) {
        let cut = s.archive_cut(before_ms, max).to_vec();
        let bytes = crate::audit_archive::encode(&cut);
        let seg = crate::audit_archive::ArchivedSegment::of(key, &cut, &bytes).unwrap();
        assert_eq!(
            s.apply(&QuorumCommand::AuditArchived { segment: seg.clone() }),
            QuorumResponse::Applied
        );
        (seg, bytes)
    }

    #[test]
    fn archived_segments_and_the_held_log_verify_as_one_chain() {
        let mut s = state_with(10);
        let whole = s.audit.clone();
        let (a, a_bytes) = archive(&mut s, "k/0", 1004, 100);
        assert_eq!((a.first_seq, a.last_seq), (0, 3));
        let (b, b_bytes) = archive(&mut s, "k/1", 2000, 3);
        assert_eq!((b.first_seq, b.last_seq), (4, 6));
        assert_eq!(s.audit.len(), 3);
        assert_eq!(s.audit_total(), 10);
        assert_eq!(s.verify_audit(), Ok(()));
        assert_eq!(
            crate::audit_archive::check_manifest(&s.audit_archive, &s.audit_base),
            Ok(())
        );
        // Appends go on the same chain the whole log would have.
        s.apply(&QuorumCommand::Audit {
            at_ms: 3000,
            user: "dr-x".into(),
            alloc: "a-0".into(),
            action: "release".into(),
            detail: "n1".into(),
            signed: None,
        });
        let mut all = crate::audit_archive::decode(&a, &a_bytes).unwrap();
        all.extend(crate::audit_archive::decode(&b, &b_bytes).unwrap());
        all.extend(s.audit.iter().cloned());
        assert_eq!(&all[..10], &whole[..]);
        assert_eq!(lattice_engine::audit::verify(&all), Ok(()));
    }

    #[test]
    fn a_stale_or_wrong_segment_changes_nothing() {
        let mut s = state_with(6);
        let cut = s.archive_cut(1003, 100).to_vec();
        let bytes = crate::audit_archive::encode(&cut);
        let seg = crate::audit_archive::ArchivedSegment::of("k/0", &cut, &bytes).unwrap();
        let before = s.clone();
        // Not ending where the log says.
        let mut wrong = seg.clone();
        wrong.last_hash = "00".into();
        assert!(matches!(
            s.apply(&QuorumCommand::AuditArchived { segment: wrong }),
            QuorumResponse::Rejected { .. }
        ));
        assert_eq!(s, before);
        assert_eq!(
            s.apply(&QuorumCommand::AuditArchived { segment: seg.clone() }),
            QuorumResponse::Applied
        );
        // The same segment again (a second leader's): no longer the log's start.
        let after = s.clone();
        assert!(matches!(
            s.apply(&QuorumCommand::AuditArchived { segment: seg }),
            QuorumResponse::Rejected { .. }
        ));
        assert_eq!(s, after);
    }

    #[test]
    fn an_open_session_stays_held() {
        let mut s = state_with(2);
        let attach = |s: &mut QuorumState, action: &str, at_ms: u64| {
            s.apply(&QuorumCommand::Audit {
                at_ms,
                user: "dr-x".into(),
                alloc: "a-9".into(),
                action: action.into(),
                detail: "n1".into(),
                signed: None,
            })
        };
        attach(&mut s, "attach", 1002);
        s.apply(&QuorumCommand::Audit {
            at_ms: 1003,
            user: "dr-x".into(),
            alloc: "a-1".into(),
            action: "release".into(),
            detail: "n1".into(),
            signed: None,
        });
        assert_eq!(s.archive_cut(5000, 100).len(), 2, "stops at the open attach");
        attach(&mut s, "attach_end", 1004);
        assert_eq!(s.archive_cut(5000, 100).len(), 5);
    }
}
