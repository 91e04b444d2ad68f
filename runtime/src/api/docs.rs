//! Every route [`super::router`] serves, documented ([`documented`]), for `GET /openapi.json`.

use super::admin::*;
use super::nodes::*;
use crate::openapi::Op;
use crate::ops;
use lattice_control::tasks::{LaunchView, TaskRequest, TerminalRequest};
use lattice_control::{AllocationView, NodeView, SubmitRequest, UpdateRequest};
use std::collections::BTreeMap;

/// Every route [`super::router`] serves, documented: `GET /openapi.json` (a test checks that the two
/// agree, both ways).
pub fn documented() -> Vec<Op> {
    let ops = [meta(), allocations(), sessions_and_dags(), nodes(), administration()].concat();
    #[cfg(feature = "federation")]
    let ops = [ops, crate::federation::api::documented()].concat();
    ops
}

/// Health, metrics, this document and the IdP discovery: open to everyone.
fn meta() -> Vec<Op> {
    vec![
        Op::get("/healthz", "meta", "Liveness and this member's Raft state").open(),
        Op::get("/metrics", "meta", "Prometheus metrics (text exposition format)")
            .open()
            .text(),
        Op::get("/openapi.json", "meta", "This document").open(),
        Op::get(
            "/api/v1/auth/discovery",
            "meta",
            "Where `lattice login` finds the IdP: mode, issuer, idp_url, client_id, redirect_uri",
        )
        .open(),
    ]
}

/// Allocations, their tasks, logs, metrics and diagnostics.
fn allocations() -> Vec<Op> {
    let a = "allocations";
    vec![
        Op::get("/v1/allocations", a, "List allocations (a user sees their tenant's)")
            .query::<ops::ListFilter>()
            .answer_list::<AllocationView>("allocations"),
        Op::post(
            "/v1/allocations",
            a,
            "Submit an allocation, or a task group (its elements in `elements`)",
        )
        .body::<SubmitRequest>()
        .status(201),
        Op::get("/v1/allocations/{id}", a, "An allocation").answer::<AllocationView>(),
        Op::delete(
            "/v1/allocations/{id}",
            a,
            "Cancel an allocation (a task group: every element)",
        ),
        Op::patch(
            "/v1/allocations/{id}",
            a,
            "Extend the walltime, set tags, switch the telemetry mode",
        )
        .body::<UpdateRequest>()
        .answer::<AllocationView>(),
        Op::post(
            "/v1/allocations/{id}/checkpoint",
            a,
            "Ask the application to checkpoint",
        )
        .status(202),
        Op::get("/v1/allocations/{id}/tasks", a, "Its task launches").answer_list::<LaunchView>("launches"),
        Op::post(
            "/v1/allocations/{id}/tasks",
            a,
            "Launch tasks (ranks with a PMI server) in a running allocation",
        )
        .body::<TaskRequest>()
        .answer::<LaunchView>()
        .status(201),
        Op::get(
            "/v1/allocations/{id}/tasks/{launch}",
            a,
            "A task launch: its ranks' exit codes and output",
        )
        .answer::<LaunchView>(),
        Op::get(
            "/v1/allocations/{id}/attach",
            a,
            "A terminal in the allocation (WebSocket upgrade)",
        )
        .query::<TerminalRequest>()
        .status(101),
        Op::post(
            "/v1/allocations/{id}/attach",
            a,
            "A terminal in the allocation (WebSocket upgrade)",
        )
        .query::<TerminalRequest>()
        .status(101),
        Op::post(
            "/v1/allocations/{id}/exit",
            "agents",
            "An agent reports its process's end (agents only)",
        ),
        Op::get("/v1/allocations/{id}/logs", a, "Stored output of one stream, by node").query::<ops::LogsQuery>(),
        Op::get(
            "/v1/allocations/{id}/logs/live",
            a,
            "Live tail of one stream after the given offsets",
        )
        .query::<ops::LiveQuery>(),
        Op::get(
            "/v1/allocations/{id}/logs/stream",
            a,
            "Live log tail as Server-Sent Events: `output` events ({node, offset, data, next}) until \
         it ended and its agents' output has arrived, then one `end` event ({state})",
        )
        .query::<ops::LiveQuery>()
        .text(),
        Op::get(
            "/v1/allocations/{id}/metrics",
            a,
            "Its metrics from the TSDB: summary, per node or per GPU, over `duration` (default 5m)",
        )
        .query::<ops::MetricsQuery>(),
        Op::get(
            "/v1/allocations/{id}/metrics/stream",
            a,
            "Live metrics as Server-Sent Events at its telemetry mode's resolution (prod 30 s, debug \
         1 s): `metrics` events (per node), `alert` events, then `end` ({state}) once it ended",
        )
        .query::<ops::MetricsQuery>()
        .text(),
        Op::get(
            "/v1/allocations/{id}/diagnostics",
            a,
            "Network (nodes, dragonfly groups, VNI) and storage (mounts, QoS floor vs measured) diagnostics",
        )
        .query::<ops::MetricsQuery>(),
        Op::get(
            "/v1/allocations/{id}/diagnostics/{part}",
            a,
            "One part of the diagnostics: `network` or `storage`",
        )
        .query::<ops::MetricsQuery>(),
        Op::get(
            "/v1/compare",
            "allocations",
            "Allocations' metric series side by side, aligned to their starts",
        )
        .query::<ops::CompareQuery>(),
    ]
}

/// Interactive sessions and DAGs.
fn sessions_and_dags() -> Vec<Op> {
    vec![
        Op::post(
            "/v1/sessions",
            "sessions",
            "Create an interactive session: an allocation (default 1 node, 4 h) whose work is a terminal",
        )
        .body::<ops::SessionRequest>()
        .status(201),
        Op::get("/v1/sessions/{id}", "sessions", "A session: its allocation's state").answer::<AllocationView>(),
        Op::delete(
            "/v1/sessions/{id}",
            "sessions",
            "End a session (cancels its allocation)",
        ),
        Op::get(
            "/v1/sessions/{id}/terminal",
            "sessions",
            "The session's terminal on its first node (WebSocket upgrade; as attach)",
        )
        .query::<TerminalRequest>()
        .status(101),
        Op::get("/v1/dags", "dags", "List DAGs").query::<ops::DagQuery>(),
        Op::post("/v1/dags", "dags", "Submit a DAG")
            .body::<ops::DagRequest>()
            .status(201),
        Op::get("/v1/dags/{id}", "dags", "A DAG: its state and members"),
        Op::delete("/v1/dags/{id}", "dags", "Cancel every allocation of a DAG"),
        Op::get(
            "/v1/dags/{id}/graph",
            "dags",
            "A DAG's structure: its allocations and the dependency edges between them",
        ),
        Op::get(
            "/v1/accounting",
            "accounting",
            "Usage records (node-hours, GPU-hours) of each allocation in the window, and the totals",
        )
        .query::<ops::UsageQuery>()
        .answer_list::<lattice_control::UsageRecord>("records"),
    ]
}

/// Nodes, their agents, the image cache and network domains.
fn nodes() -> Vec<Op> {
    let n = "nodes";
    vec![
        Op::get("/v1/nodes", n, "List nodes")
            .query::<ops::NodeQuery>()
            .answer_list::<NodeView>("nodes"),
        Op::get("/v1/nodes/{id}", n, "A node").answer::<NodeView>(),
        Op::post(
            "/v1/nodes/{id}/register",
            "agents",
            "An agent registers its node (agents only)",
        ),
        Op::post(
            "/v1/nodes/{id}/heartbeat",
            "agents",
            "An agent's heartbeat (agents only)",
        ),
        Op::post("/v1/nodes/{id}/work", "agents", "An agent polls for work (agents only)"),
        Op::post(
            "/v1/nodes/{id}/drain",
            n,
            "Drain a node (Operator); `urgent`: its allocation is asked to checkpoint now",
        )
        .query::<DrainQuery>(),
        Op::post("/v1/nodes/{id}/undrain", n, "Undrain a node (Operator)"),
        Op::post("/v1/nodes/{id}/disable", n, "Take a node out of service (Operator)"),
        Op::post("/v1/nodes/{id}/enable", n, "Return a node to service (Operator)"),
        Op::post(
            "/v1/nodes/{id}/wipe",
            n,
            "Retry a quarantined node's secure wipe: `{\"force\": true}` (Operator); wiped, it returns to the pool",
        )
        .body::<WipeIn>()
        .status(202),
        Op::post(
            "/v1/nodes/{id}/fingerprint",
            n,
            "Ask the node's agent for a fresh conformance fingerprint",
        )
        .status(202),
        Op::get("/v1/cache", "cache", "Each node's image cache (Operator)").query::<CacheQuery>(),
        Op::post(
            "/v1/cache/warm",
            "cache",
            "Pull an image into nodes' caches, sticky (Operator)",
        )
        .body::<lattice_control::cache::CacheRequest>()
        .status(202),
        Op::post(
            "/v1/cache/evict",
            "cache",
            "Remove an image from nodes' caches (Operator)",
        )
        .body::<lattice_control::cache::CacheRequest>()
        .status(202),
        Op::get("/v1/network/domains", "network", "Network domains and the VNI pool"),
        Op::get(
            "/v1/audit/logs",
            "audit",
            "The sensitive audit log and whether its hash chain holds",
        )
        .query::<ops::AuditQuery>(),
        Op::get(
            "/v1/audit/export",
            "audit",
            "The entries the query selects as a bundle signed with the site's audit key (lattice audit export)",
        )
        .query::<ops::AuditQuery>(),
        Op::get(
            "/api/v1/audit",
            "audit",
            "The audit log (the admin guide's path: tenant, from, scope=sensitive)",
        )
        .query::<ops::AuditQuery>(),
    ]
}

/// Usage, tenants and projects, vClusters, accounting, the audit log and the quorum.
fn administration() -> Vec<Op> {
    vec![
        Op::get("/api/v1/tenants/{id}/usage", "accounting", "A tenant's usage").query::<DaysIn>(),
        Op::get("/api/v1/usage", "accounting", "Usage by tenant or user").query::<ops::UsageQuery>(),
        Op::get("/v1/tenants", "tenants", "Tenant names"),
        Op::get(
            "/v1/tenants/{id}",
            "tenants",
            "A tenant: its quotas, nodes held, running and pending allocations, 90-day usage",
        ),
        Op::post(
            "/api/v1/tenants",
            "tenants",
            "Create a tenant with its quotas, committed through the quorum (SystemAdmin)",
        )
        .body::<TenantIn>()
        .status(201),
        Op::get("/api/v1/tenants/{id}", "tenants", "A tenant (as GET /v1/tenants/{id})"),
        Op::put(
            "/api/v1/tenants/{id}",
            "tenants",
            "Change a tenant's quotas: only the keys given, null clears one (SystemAdmin; Raft-committed)",
        )
        .body::<TenantIn>(),
        Op::delete(
            "/api/v1/tenants/{id}",
            "tenants",
            "Delete a tenant with nothing queued or running (SystemAdmin)",
        ),
        Op::get(
            "/api/v1/tenants/{id}/projects",
            "tenants",
            "A tenant's projects: each one's quotas, nodes held, running and pending allocations",
        ),
        Op::post(
            "/api/v1/tenants/{id}/projects",
            "tenants",
            "Create a project in a tenant with its own hard quotas and soft budgets (SystemAdmin; Raft-committed)",
        )
        .body::<ProjectIn>()
        .status(201),
        Op::get(
            "/api/v1/tenants/{id}/projects/{project}",
            "tenants",
            "A project of a tenant",
        ),
        Op::put(
            "/api/v1/tenants/{id}/projects/{project}",
            "tenants",
            "Change a project's quotas: only the keys given, null clears one (SystemAdmin; Raft-committed)",
        )
        .body::<ProjectIn>(),
        Op::delete(
            "/api/v1/tenants/{id}/projects/{project}",
            "tenants",
            "Delete a project with nothing queued or running (SystemAdmin)",
        ),
        Op::get(
            "/api/v1/admin/log",
            "quorum",
            "The administrative log: every tenant change, who made it and when",
        ),
        Op::get(
            "/api/v1/admin/accounting",
            "accounting",
            "The accounting pipeline: Waldur reachable, events buffered in memory and on disk, dropped, the mark",
        )
        .answer::<crate::accounting::AccountingStatus>(),
        Op::post(
            "/api/v1/admin/accounting/reconcile",
            "accounting",
            "Regenerate a window's accounting events from the allocation records and the audit log (SystemAdmin)",
        )
        .body::<crate::accounting::ReconcileIn>()
        .answer::<crate::accounting::Reconciled>(),
        Op::get(
            "/v1/config",
            "config",
            "The site settings decisions read, in force (the quorum's): heartbeat grace, drift, boot, wipe and preemption-report timeouts, seconds by key",
        ),
        Op::patch(
            "/v1/config",
            "config",
            "Change site settings (SystemAdmin): the keys given, seconds or a duration (e.g. `{\"agents.boot_timeout\": \"15m\"}`; `null` removes an `agents.boot_timeout_by_kind.KIND`); committed at the quorum",
        )
        .body::<serde_json::Map<String, serde_json::Value>>(),
        Op::get("/v1/vclusters", "vclusters", "vCluster names"),
        Op::post(
            "/v1/vclusters",
            "vclusters",
            "Create a vCluster (SystemAdmin): `name` and any configuration keys (policy, backfill_depth, cycle_interval, reference_wait, slo_wait_target, gpu_hours_budget, preemption, lend_cap, weights); committed at the quorum",
        )
        .body::<serde_json::Map<String, serde_json::Value>>(),
        Op::get(
            "/v1/vclusters/{id}",
            "vclusters",
            "A vCluster's scheduler configuration and the weights in force (the quorum's), as the keys PATCH takes",
        ),
        Op::patch(
            "/v1/vclusters/{id}",
            "vclusters",
            "Change a vCluster's scheduler configuration (SystemAdmin): the keys given (e.g. `{\"cycle_interval\": \"15s\"}`); committed at the quorum",
        )
        .body::<serde_json::Map<String, serde_json::Value>>(),
        Op::get(
            "/v1/vclusters/{id}/queue",
            "vclusters",
            "A vCluster's queue in score order",
        ),
        Op::put(
            "/v1/vclusters/{id}/weights",
            "vclusters",
            "Set a vCluster's cost-function weights (SystemAdmin)",
        )
        .body::<BTreeMap<String, f64>>(),
        Op::get(
            "/api/v1/services",
            "services",
            "Registered service names (a tenant's: `x-lattice-tenant`, or the caller's own)",
        ),
        Op::get(
            "/api/v1/services/{name}",
            "services",
            "A service's endpoints: allocation, node, host, port, protocol",
        )
        .answer_list::<lattice_control::ServiceEndpoint>("endpoints"),
        Op::get("/api/v1/raft/status", "quorum", "The quorum's Raft status"),
        Op::get("/v1/admin/raft/status", "quorum", "The quorum's Raft status"),
        Op::post(
            "/api/v1/admin/backup",
            "quorum",
            "Write a backup of the quorum's state (SystemAdmin)",
        ),
        Op::get("/api/v1/admin/backup/verify", "quorum", "Verify a backup file").query::<PathQuery>(),
        Op::post(
            "/api/v1/admin/restore",
            "quorum",
            "Stage a backup for restore at the next start",
        )
        .body::<PathQuery>(),
        Op::post("/api/v1/admin/members", "quorum", "Add a quorum member").body::<MemberIn>(),
        Op::delete("/api/v1/admin/members/{id}", "quorum", "Remove a quorum member"),
    ]
}
