//! Which RPC serves each REST operation ([`COVERAGE`]): the book's "gRPC and REST for all
//! operations", checked by the test below against `/openapi.json`'s operations and the compiled
//! services. The few operations without an RPC say why, and the test of that reason is named.

/// How a REST operation is served over gRPC.
#[derive(Clone, Copy, Debug)]
pub enum Served {
    /// `(service, method)`, e.g. `("lattice.v1.AllocationService", "Submit")`.
    Rpc(&'static str, &'static str),
    /// Not over gRPC: why, and the test that shows it.
    RestOnly { why: &'static str, tested_by: &'static str },
}

use Served::*;

const ALLOC: &str = "lattice.v1.AllocationService";
const NODE: &str = "lattice.v1.NodeService";
const ADMIN: &str = "lattice.v1.AdminService";
const OBSERVE: &str = "lattice.v1.ObserveService";
const TASK: &str = "lattice.v1.TaskService";
const SITE: &str = "lattice.v1.SiteService";
#[cfg(feature = "federation")]
const FEDERATION: &str = "lattice.v1.FederationService";

/// Every REST operation (`method`, path) and how gRPC serves it.
pub const COVERAGE: &[(&str, &str, Served)] = &[
    ("get", "/healthz", Rpc(SITE, "Health")),
    (
        "get",
        "/metrics",
        RestOnly {
            why: "Prometheus scrapes its text exposition format over HTTP; there is no gRPC scrape",
            tested_by: "runtime/tests/observability.rs (promtool checks the scrape)",
        },
    ),
    (
        "get",
        "/openapi.json",
        RestOnly {
            why: "the REST API's own description; gRPC's is the .proto files, compiled into the server \
                  (pb::FILE_DESCRIPTOR_SET)",
            tested_by: "grpc::coverage::tests::every_rest_operation_has_an_rpc_or_a_reason (decodes it)",
        },
    ),
    ("get", "/api/v1/auth/discovery", Rpc(SITE, "AuthDiscovery")),
    ("get", "/v1/allocations", Rpc(ALLOC, "List")),
    ("post", "/v1/allocations", Rpc(ALLOC, "Submit")),
    ("get", "/v1/allocations/{id}", Rpc(ALLOC, "Get")),
    ("delete", "/v1/allocations/{id}", Rpc(ALLOC, "Cancel")),
    ("patch", "/v1/allocations/{id}", Rpc(ALLOC, "Update")),
    ("post", "/v1/allocations/{id}/checkpoint", Rpc(ALLOC, "Checkpoint")),
    ("get", "/v1/allocations/{id}/tasks", Rpc(TASK, "ListTasks")),
    ("post", "/v1/allocations/{id}/tasks", Rpc(TASK, "LaunchTasks")),
    ("get", "/v1/allocations/{id}/tasks/{launch}", Rpc(TASK, "GetTask")),
    ("get", "/v1/allocations/{id}/attach", Rpc(ALLOC, "Attach")),
    ("post", "/v1/allocations/{id}/attach", Rpc(ALLOC, "Attach")),
    ("post", "/v1/sessions", Rpc(TASK, "CreateSession")),
    ("get", "/v1/sessions/{id}", Rpc(TASK, "GetSession")),
    ("delete", "/v1/sessions/{id}", Rpc(TASK, "DeleteSession")),
    ("get", "/v1/sessions/{id}/terminal", Rpc(ALLOC, "Attach")),
    ("get", "/v1/dags", Rpc(ALLOC, "ListDags")),
    ("post", "/v1/dags", Rpc(ALLOC, "SubmitDag")),
    ("get", "/v1/dags/{id}", Rpc(ALLOC, "GetDag")),
    ("delete", "/v1/dags/{id}", Rpc(ALLOC, "CancelDag")),
    ("get", "/v1/dags/{id}/graph", Rpc(TASK, "DagGraph")),
    ("get", "/v1/accounting", Rpc(SITE, "Accounting")),
    ("get", "/v1/nodes", Rpc(NODE, "List")),
    ("get", "/v1/nodes/{id}", Rpc(NODE, "Get")),
    ("get", "/v1/cache", Rpc(SITE, "ListCache")),
    ("post", "/v1/cache/warm", Rpc(SITE, "WarmCache")),
    ("post", "/v1/cache/evict", Rpc(SITE, "EvictCache")),
    ("post", "/v1/nodes/{id}/register", Rpc(NODE, "Register")),
    ("post", "/v1/nodes/{id}/heartbeat", Rpc(NODE, "Heartbeat")),
    ("post", "/v1/nodes/{id}/drain", Rpc(NODE, "Drain")),
    ("post", "/v1/nodes/{id}/undrain", Rpc(NODE, "Undrain")),
    ("post", "/v1/nodes/{id}/work", Rpc(SITE, "Work")),
    ("post", "/v1/allocations/{id}/exit", Rpc(SITE, "ReportExit")),
    ("get", "/v1/allocations/{id}/logs", Rpc(OBSERVE, "GetLogs")),
    ("get", "/v1/allocations/{id}/logs/live", Rpc(OBSERVE, "LiveLogs")),
    ("get", "/v1/allocations/{id}/logs/stream", Rpc(OBSERVE, "StreamLogs")),
    ("get", "/v1/allocations/{id}/metrics", Rpc(OBSERVE, "QueryMetrics")),
    (
        "get",
        "/v1/allocations/{id}/metrics/stream",
        Rpc(OBSERVE, "StreamMetrics"),
    ),
    ("get", "/v1/allocations/{id}/diagnostics", Rpc(OBSERVE, "Diagnostics")),
    (
        "get",
        "/v1/allocations/{id}/diagnostics/{part}",
        Rpc(OBSERVE, "Diagnostics"),
    ),
    ("get", "/v1/compare", Rpc(OBSERVE, "Compare")),
    ("get", "/v1/network/domains", Rpc(OBSERVE, "NetworkDomains")),
    ("post", "/v1/nodes/{id}/fingerprint", Rpc(SITE, "RequestFingerprint")),
    ("post", "/v1/nodes/{id}/disable", Rpc(NODE, "Disable")),
    ("post", "/v1/nodes/{id}/enable", Rpc(NODE, "Enable")),
    ("post", "/v1/nodes/{id}/wipe", Rpc(SITE, "RetryWipe")),
    ("get", "/v1/audit/logs", Rpc(ADMIN, "QueryAudit")),
    ("get", "/v1/audit/export", Rpc(SITE, "ExportAudit")),
    ("get", "/api/v1/audit", Rpc(ADMIN, "QueryAudit")),
    ("get", "/api/v1/tenants/{id}/usage", Rpc(ADMIN, "Usage")),
    ("get", "/api/v1/usage", Rpc(ADMIN, "Usage")),
    ("get", "/v1/tenants", Rpc(ADMIN, "ListTenants")),
    ("get", "/v1/tenants/{id}", Rpc(SITE, "GetTenant")),
    ("post", "/api/v1/tenants", Rpc(ADMIN, "CreateTenant")),
    ("get", "/api/v1/tenants/{id}", Rpc(SITE, "GetTenant")),
    ("put", "/api/v1/tenants/{id}", Rpc(ADMIN, "UpdateTenant")),
    ("delete", "/api/v1/tenants/{id}", Rpc(ADMIN, "DeleteTenant")),
    ("get", "/api/v1/tenants/{id}/projects", Rpc(ADMIN, "ListProjects")),
    ("post", "/api/v1/tenants/{id}/projects", Rpc(ADMIN, "CreateProject")),
    (
        "get",
        "/api/v1/tenants/{id}/projects/{project}",
        Rpc(SITE, "GetProject"),
    ),
    (
        "put",
        "/api/v1/tenants/{id}/projects/{project}",
        Rpc(ADMIN, "UpdateProject"),
    ),
    (
        "delete",
        "/api/v1/tenants/{id}/projects/{project}",
        Rpc(ADMIN, "DeleteProject"),
    ),
    ("get", "/api/v1/admin/log", Rpc(SITE, "AdminLog")),
    ("get", "/api/v1/admin/accounting", Rpc(SITE, "AccountingStatus")),
    (
        "post",
        "/api/v1/admin/accounting/reconcile",
        Rpc(SITE, "ReconcileAccounting"),
    ),
    ("get", "/v1/config", Rpc(SITE, "GetSettings")),
    ("patch", "/v1/config", Rpc(SITE, "SetSettings")),
    ("get", "/v1/vclusters", Rpc(ADMIN, "ListVClusters")),
    ("post", "/v1/vclusters", Rpc(SITE, "CreateVCluster")),
    ("get", "/v1/vclusters/{id}", Rpc(SITE, "GetVCluster")),
    ("patch", "/v1/vclusters/{id}", Rpc(SITE, "ConfigureVCluster")),
    ("get", "/v1/vclusters/{id}/queue", Rpc(ADMIN, "Queue")),
    ("put", "/v1/vclusters/{id}/weights", Rpc(ADMIN, "SetWeights")),
    ("get", "/api/v1/services", Rpc(ADMIN, "ListServices")),
    ("get", "/api/v1/services/{name}", Rpc(ADMIN, "LookupService")),
    ("get", "/api/v1/raft/status", Rpc(ADMIN, "RaftStatus")),
    ("get", "/v1/admin/raft/status", Rpc(ADMIN, "RaftStatus")),
    ("post", "/api/v1/admin/backup", Rpc(ADMIN, "Backup")),
    ("get", "/api/v1/admin/backup/verify", Rpc(ADMIN, "VerifyBackup")),
    ("post", "/api/v1/admin/restore", Rpc(SITE, "Restore")),
    ("post", "/api/v1/admin/members", Rpc(SITE, "AddMember")),
    ("delete", "/api/v1/admin/members/{id}", Rpc(SITE, "RemoveMember")),
];

/// Why the calls between federated sites are HTTP only.
#[cfg(feature = "federation")]
const PEER_PROTOCOL: &str = "between sites, not a client's call: each request and answer is signed with the shared \
    workspace's key over its method, path, body, time and nonce (federation::sign), which this HTTP protocol carries";
#[cfg(feature = "federation")]
const PEER_TESTS: &str = "runtime/tests/federation.rs (signed calls served; a wrong key or a replayed nonce refused)";

/// The federation feature's operations: this site's users' and administrators' calls over gRPC, the
/// signed protocol between sites over HTTP.
#[cfg(feature = "federation")]
pub const FEDERATION_COVERAGE: &[(&str, &str, Served)] = &[
    (
        "get",
        "/federation/v1/catalog",
        RestOnly {
            why: PEER_PROTOCOL,
            tested_by: PEER_TESTS,
        },
    ),
    (
        "post",
        "/federation/v1/allocations",
        RestOnly {
            why: PEER_PROTOCOL,
            tested_by: PEER_TESTS,
        },
    ),
    (
        "get",
        "/federation/v1/allocations",
        RestOnly {
            why: PEER_PROTOCOL,
            tested_by: PEER_TESTS,
        },
    ),
    (
        "get",
        "/federation/v1/allocations/{id}",
        RestOnly {
            why: PEER_PROTOCOL,
            tested_by: PEER_TESTS,
        },
    ),
    (
        "delete",
        "/federation/v1/allocations/{id}",
        RestOnly {
            why: PEER_PROTOCOL,
            tested_by: PEER_TESTS,
        },
    ),
    (
        "get",
        "/federation/v1/allocations/{id}/logs",
        RestOnly {
            why: PEER_PROTOCOL,
            tested_by: PEER_TESTS,
        },
    ),
    (
        "post",
        "/federation/v1/ended",
        RestOnly {
            why: PEER_PROTOCOL,
            tested_by: PEER_TESTS,
        },
    ),
    ("get", "/api/v1/federation/ended", Rpc(FEDERATION, "Ended")),
    ("post", "/api/v1/federation/allocations", Rpc(FEDERATION, "Submit")),
    ("get", "/api/v1/federation/allocations", Rpc(FEDERATION, "ListRemote")),
    (
        "get",
        "/api/v1/federation/allocations/{site}/{id}",
        Rpc(FEDERATION, "GetRemote"),
    ),
    (
        "delete",
        "/api/v1/federation/allocations/{site}/{id}",
        Rpc(FEDERATION, "CancelRemote"),
    ),
    (
        "get",
        "/api/v1/federation/allocations/{site}/{id}/logs",
        Rpc(FEDERATION, "RemoteLogs"),
    ),
    ("get", "/api/v1/admin/federation", Rpc(FEDERATION, "Status")),
    ("post", "/api/v1/admin/federation/peers", Rpc(FEDERATION, "AddPeer")),
    (
        "delete",
        "/api/v1/admin/federation/peers/{name}",
        Rpc(FEDERATION, "RemovePeer"),
    ),
    (
        "post",
        "/api/v1/admin/federation/workspaces/{ws}/revoke",
        Rpc(FEDERATION, "RevokeWorkspace"),
    ),
];
#[cfg(not(feature = "federation"))]
pub const FEDERATION_COVERAGE: &[(&str, &str, Served)] = &[];

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::collections::BTreeSet;

    /// Every `(service, method)` the compiled protos declare.
    fn rpcs() -> BTreeSet<(String, String)> {
        let set = prost_types::FileDescriptorSet::decode(crate::pb::FILE_DESCRIPTOR_SET).expect("descriptors decode");
        let mut out = BTreeSet::new();
        for f in set.file {
            let package = f.package().to_string();
            for s in &f.service {
                for m in &s.method {
                    out.insert((format!("{package}.{}", s.name()), m.name().to_string()));
                }
            }
        }
        out
    }

    #[test]
    fn every_rest_operation_has_an_rpc_or_a_reason() {
        let rpcs = rpcs();
        assert!(rpcs.contains(&(ALLOC.into(), "Submit".into())), "{rpcs:?}");
        let documented: BTreeSet<(String, String)> = crate::api::documented()
            .iter()
            .map(|o| (o.method.to_string(), o.path.to_string()))
            .collect();
        let covered: BTreeSet<(String, String)> = COVERAGE
            .iter()
            .chain(FEDERATION_COVERAGE)
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        let missing: Vec<_> = documented.difference(&covered).collect();
        assert!(
            missing.is_empty(),
            "REST operations without an RPC or a reason: {missing:?}"
        );
        let stale: Vec<_> = covered.difference(&documented).collect();
        assert!(
            stale.is_empty(),
            "the table names operations REST does not serve: {stale:?}"
        );
        for (method, path, served) in COVERAGE.iter().chain(FEDERATION_COVERAGE) {
            match served {
                Rpc(service, rpc) => assert!(
                    rpcs.contains(&(service.to_string(), rpc.to_string())),
                    "{method} {path}: no RPC {service}/{rpc}"
                ),
                RestOnly { why, tested_by } => {
                    assert!(!why.is_empty() && !tested_by.is_empty(), "{method} {path}")
                }
            }
        }
    }
}
