//! Administration: tenants and projects, their names and ids, weights, node orders (drain, disable)
//! and the standing orders the quorum keeps.

use super::*;
use lattice_engine::{AllocState, Input, TenantId, Time};

impl Control {
    /// Tenants the engine already has (a replay registers the trace's up front).
    pub fn known_tenants(&mut self, tenants: &[(String, TenantId)]) {
        self.registry.tenants.extend(tenants.iter().cloned());
    }

    /// Projects the engine already has: (tenant, project, id) (a replay's, up front).
    pub fn known_projects(&mut self, projects: &[(String, String, lattice_engine::ProjectId)]) {
        for (t, p, id) in projects {
            self.registry.name_project(t, p, *id);
        }
    }

    pub(super) fn tenant_id(&mut self, name: &str) -> TenantId {
        if let Some(id) = self.registry.tenants.get(name) {
            return *id;
        }
        let id = self.ctl.engine.add_tenant(name);
        self.registry.tenants.insert(name.to_string(), id);
        id
    }

    /// A tenant's name (empty for an unknown id).
    pub(super) fn tenant_name(&self, t: TenantId) -> String {
        self.ctl.engine.tenant(t).map(|t| t.name).unwrap_or_default()
    }

    /// A node by name (O(log n): heartbeats of thousands of agents look nodes up constantly).
    pub fn node_index(&self, name: &str) -> Option<lattice_engine::NodeId> {
        self.registry.node_by_name.get(name).map(|&i| lattice_engine::NodeId(i))
    }

    /// Drain (`true`) or undrain a node; the node's state afterwards.
    pub fn drain(&mut self, node: &str, drain: bool) -> Result<String, FieldError> {
        let op = if drain { NodeOp::Drain } else { NodeOp::Undrain };
        self.node_op(node, op).map(|(state, _)| state)
    }

    /// Whether `op` may be applied to `node` now (the node exists and its state allows it): checked
    /// before the order is recorded at the quorum, so a refused operation changes nothing.
    pub fn check_node_op(&self, node: &str, op: NodeOp) -> Result<(), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        let ev = node_op_event(op);
        let n = self
            .ctl
            .engine
            .node(id)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        if lattice_engine::node::next_node_state(n.state, ev, n.owner.is_some()).is_none() {
            return Err(bad(
                "id",
                format!(
                    "node {node}: event {ev:?} is not allowed in state {}",
                    self.node_state(id)
                ),
            ));
        }
        Ok(())
    }

    /// The quorum's standing order for `node` (drained, disabled), as recorded there: the
    /// controller holds the node to it from now on (a drained node that is up drains, a disabled
    /// one goes Down); a lifted order brings it back (undrained, enabled). Returns the allocations that lost their nodes to it (a disable requeues or
    /// fails what ran there; their nodes must be released at the quorum).
    pub fn set_admin(&mut self, node: &str, drained: bool, disabled: bool) -> Vec<String> {
        let Some(id) = self.node_index(node) else {
            return Vec::new();
        };
        let order = lattice_engine::NodeOrder { drained, disabled };
        let was = self.ctl.order(id);
        if order == was {
            return Vec::new();
        }
        let owner = self.ctl.engine.node(id).and_then(|n| n.owner).map(|o| o.alloc);
        if let Err(e) = self.input(Input::Order(id, order)) {
            tracing::warn!("node {node}: standing order not applied: {e}");
        }
        // The capture shows a drain order and its lifting as the trace's `drain` and `undrain`, a
        // disable as a hardware failure and its lifting as a recovery.
        let ts = self.now().0 as f64 / 1000.0;
        if drained != was.drained {
            let kind = if drained { "drain" } else { "undrain" };
            self.capture_line(serde_json::json!({"ts": ts, "type": kind, "node": node}));
        }
        if disabled && !was.disabled {
            self.capture_line(serde_json::json!({"ts": ts, "type": "node_fail", "node": node, "mode": "hardware"}));
        }
        if !disabled && was.disabled {
            self.capture_line(serde_json::json!({"ts": ts, "type": "node_recover", "node": node}));
        }
        owner
            .filter(|a| self.ctl.engine.allocation(*a).is_none_or(|a| !a.nodes.contains(&id)))
            .map(|a| self.name_of(a))
            .into_iter()
            .collect()
    }

    /// A node operation; the node's state afterwards and the allocations that lost their nodes
    /// (requeued or failed by a disable: their nodes must be released at the quorum).
    pub fn node_op(&mut self, node: &str, op: NodeOp) -> Result<(String, Vec<String>), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node}")))?;
        let ev = node_op_event(op);
        let owner = self.ctl.engine.node(id).and_then(|n| n.owner).map(|o| o.alloc);
        // (An `enable` of a node an operator drained brings it up drained: the controller holds
        // the node to its standing order.)
        self.input(Input::Node(id, ev)).map_err(|e| bad("id", e.to_string()))?;
        let lost = owner
            .filter(|a| self.ctl.engine.allocation(*a).is_none_or(|a| !a.nodes.contains(&id)))
            .map(|a| self.name_of(a))
            .into_iter()
            .collect();
        Ok((self.node_state(id), lost))
    }

    /// Hot-reloads a vCluster's weights: they take effect at its next pass.
    pub fn set_weights(&mut self, vcluster: &str, weights: lattice_engine::CostWeights) -> Result<(), FieldError> {
        let id = *self
            .registry
            .vclusters
            .get(vcluster)
            .ok_or_else(|| bad("vcluster", format!("vCluster \"{vcluster}\" not found")))?;
        self.input(Input::Weights(id, weights))
            .map_err(|e| bad("weights", e.to_string()))
    }

    /// A vCluster's scheduler configuration as the quorum committed it: created here when new (it
    /// schedules the shared pool), it schedules with this configuration from its next pass.
    pub fn put_vcluster(&mut self, name: &str, config: VClusterConfig) -> Result<(), FieldError> {
        let id = match self.registry.vclusters.get(name) {
            Some(&id) => id,
            None => {
                let id = self.ctl.engine.add_vcluster(name);
                self.registry.vclusters.insert(name.to_string(), id);
                id
            }
        };
        self.input(Input::VCluster(id, config))
            .map_err(|e| bad("config", e.to_string()))
    }

    /// A vCluster's scheduler configuration in force (`None`: no such vCluster).
    pub fn vcluster_config(&self, name: &str) -> Option<VClusterConfig> {
        let id = *self.registry.vclusters.get(name)?;
        self.ctl.engine.vcluster_config(id).copied()
    }

    /// Every vCluster's configuration in force, by name (what the quorum is seeded with).
    pub fn vcluster_configs(&self) -> BTreeMap<String, VClusterConfig> {
        self.registry
            .vclusters
            .keys()
            .filter_map(|n| Some((n.clone(), self.vcluster_config(n)?)))
            .collect()
    }

    pub fn tenant_names(&self) -> Vec<String> {
        self.registry.tenants.keys().cloned().collect()
    }

    /// A tenant's contract as the quorum committed it: the engine scores and admits with it from its
    /// next pass (a new tenant is known from now on).
    pub fn set_tenant(&mut self, name: &str, quota: lattice_engine::TenantQuota) {
        let id = self.tenant_id(name);
        if let Err(e) = self.input(Input::TenantQuota(id, quota)) {
            tracing::warn!("tenant {name}: quota not applied: {e}");
        }
    }

    /// A deleted tenant: its quotas are gone and it is no longer listed (its past allocations keep
    /// their tenant's name; a tenant created again under the name starts afresh).
    pub fn remove_tenant(&mut self, name: &str) {
        let Some(&id) = self.registry.tenants.get(name) else {
            return;
        };
        for p in self.project_names(name) {
            self.remove_project(name, &p);
        }
        if let Err(e) = self.input(Input::TenantQuota(id, lattice_engine::TenantQuota::default())) {
            tracing::warn!("tenant {name}: quota not cleared: {e}");
        }
        self.registry.tenants.remove(name);
    }

    /// A project's contract as the quorum committed it (as a tenant's: from the next pass).
    pub fn set_project(&mut self, tenant: &str, project: &str, quota: lattice_engine::ProjectQuota) {
        let (t, p) = (self.tenant_id(tenant), self.registry.project_id(tenant, project));
        if let Err(e) = self.input(Input::ProjectQuota(p, t, quota)) {
            tracing::warn!("project {tenant}/{project}: quota not applied: {e}");
        }
    }

    /// A deleted project: its quotas are gone (its allocations keep their project's name).
    pub fn remove_project(&mut self, tenant: &str, project: &str) {
        let key = (tenant.to_string(), project.to_string());
        let (Some(&t), Some(&p)) = (self.registry.tenants.get(tenant), self.registry.projects.get(&key)) else {
            return;
        };
        if let Err(e) = self.input(Input::ProjectQuota(p, t, lattice_engine::ProjectQuota::default())) {
            tracing::warn!("project {tenant}/{project}: quota not cleared: {e}");
        }
    }

    /// Allocations of `tenant`'s project still queued or running.
    pub fn project_live_allocations(&self, tenant: &str, project: &str) -> usize {
        let Some(&id) = self.registry.projects.get(&(tenant.to_string(), project.to_string())) else {
            return 0;
        };
        self.ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.project == id && !a.state.is_terminal())
            .count()
    }

    /// One project of a tenant: its contract, what its hard quotas count now, how many of its
    /// allocations wait. `None` when the tenant has never used it and it has no contract.
    pub fn project_view(&self, tenant: &str, project: &str) -> Option<serde_json::Value> {
        let id = *self.registry.projects.get(&(tenant.to_string(), project.to_string()))?;
        let (nodes, running) = self.ctl.engine.project_committed(id);
        let pending = self
            .ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.project == id && a.state == AllocState::Pending)
            .count();
        Some(serde_json::json!({
            "tenant": tenant,
            "name": project,
            "quota": self.ctl.engine.project_quota(id).copied().unwrap_or_default(),
            "nodes_held": nodes,
            "running": running,
            "pending": pending,
        }))
    }

    /// The projects a tenant has used or given a contract, by name.
    pub fn project_names(&self, tenant: &str) -> Vec<String> {
        self.registry
            .projects
            .keys()
            .filter(|(t, _)| t == tenant)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Allocations of `name` still queued or running (a tenant is deleted only when there are none).
    pub fn tenant_live_allocations(&self, name: &str) -> usize {
        let Some(&id) = self.registry.tenants.get(name) else {
            return 0;
        };
        self.ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.tenant == id && !a.state.is_terminal())
            .count()
    }

    /// One tenant (`GET /v1/tenants/{id}`): its contract (hard and soft quotas), what the hard quotas
    /// count now (nodes held, running allocations), how many wait, and its usage over the last 90 days
    /// (the budget period).
    pub fn tenant_view(&self, name: &str) -> Option<serde_json::Value> {
        let id = *self.registry.tenants.get(name)?;
        let (nodes, running) = self.ctl.engine.tenant_committed(id);
        let pending = self
            .ctl
            .engine
            .allocations()
            .iter()
            .filter(|a| a.spec.tenant == id && a.state == AllocState::Pending)
            .count();
        let until = self.now();
        let since = Time(until.0.saturating_sub(90 * 86_400_000));
        Some(serde_json::json!({
            "name": name,
            "quota": self.ctl.engine.tenant_quota(id).copied().unwrap_or_default(),
            "nodes_held": nodes,
            "running": running,
            "pending": pending,
            "usage_90d": self.usage(Some(name), None, since, until),
            "projects": self
                .project_names(name)
                .iter()
                .filter_map(|p| self.project_view(name, p))
                .collect::<Vec<_>>(),
        }))
    }
}
