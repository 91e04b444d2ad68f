//! Read-only answers: allocation and node views, DAGs, services, diagnostics facts, usage records
//! and accounting rows.

use super::*;
use lattice_engine::{AllocId, AllocState, Time};
use std::collections::BTreeMap;

impl Control {
    /// Every node's name, in inventory order.
    pub fn node_names(&self) -> &[String] {
        &self.registry.node_names
    }

    /// A node's state by name (`ready`, `drained`, ...).
    pub fn node_state_of(&self, name: &str) -> Option<String> {
        self.node_index(name).map(|id| self.node_state(id))
    }

    pub(super) fn node_state(&self, id: lattice_engine::NodeId) -> String {
        self.ctl
            .engine
            .node(id)
            .map(|n| format!("{:?}", n.state).to_lowercase())
            .unwrap_or_default()
    }

    /// The DAGs any of `ids` belongs to, with their members.
    pub fn dags_of(&self, ids: &[String]) -> Vec<(String, Vec<(String, String)>)> {
        self.registry
            .dags
            .iter()
            .filter(|(_, members)| members.iter().any(|(_, id)| ids.contains(id)))
            .map(|(d, members)| (d.clone(), members.clone()))
            .collect()
    }

    pub fn dag_ids(&self) -> Vec<String> {
        self.registry.dags.keys().cloned().collect()
    }

    pub fn dag(&self, id: &str) -> Option<&Vec<(String, String)>> {
        self.registry.dags.get(id)
    }

    pub fn id_of(&self, name: &str) -> Option<AllocId> {
        self.registry.by_name.get(name).copied()
    }

    pub fn name_of(&self, id: AllocId) -> String {
        self.registry.name_of(id)
    }

    /// The data paths `name` declared (its mounts' sources; none once it is only history).
    pub fn data_sources(&self, name: &str) -> Vec<String> {
        self.id_of(name)
            .and_then(|id| self.registry.meta.get(id.index()))
            .and_then(|m| m.data.as_ref())
            .map(|d| d.mounts.iter().map(|m| m.source.clone()).collect())
            .unwrap_or_default()
    }

    /// Whether `name` is a sensitive claim the engine still holds.
    pub fn is_sensitive_named(&self, name: &str) -> bool {
        self.registry
            .by_name
            .get(name)
            .is_some_and(|&id| self.ctl.engine.is_sensitive(id))
    }

    /// Whether `name` runs a uenv whose signature its agents check (`environment.uenv` with
    /// `sign_required`).
    pub fn runs_signed_uenv(&self, name: &str) -> bool {
        self.id_of(name)
            .and_then(|id| self.registry.meta.get(id.index()))
            .and_then(|m| m.environment.as_ref())
            .is_some_and(|e| e.sign_required && e.uenv.is_some())
    }

    /// What became of sensitive claim `name` (claims are immediate or refused): `None` while its
    /// pool's pass has not yet placed or refused it; `Ok` once its nodes are coming (proposed,
    /// committed, or freed by victims it preempts) or it ended otherwise; `Err` with the refusal
    /// (the `OwnershipConflict` naming nodes and holders) when it was refused.
    /// An ended claim this control plane only has the final record of is decided by that record;
    /// one it does not know at all (a leadership change replaced it) is `None`.
    pub fn claim_outcome(&self, name: &str) -> Option<Result<(), String>> {
        let Some(&id) = self.registry.by_name.get(name) else {
            let v = self.registry.history.get(name)?;
            return Some(match v.end_reason.as_deref() {
                Some("claim_refused") => Err(v.last_rejection.clone().unwrap_or_else(|| "claim refused".into())),
                _ => Ok(()),
            });
        };
        let a = self.ctl.engine.allocation(id)?;
        if a.end_reason == Some(lattice_engine::EndReason::ClaimRefused) {
            let why = self
                .registry
                .meta
                .get(id.index())
                .and_then(|m| m.last_rejection.clone());
            return Some(Err(why.unwrap_or_else(|| "claim refused".into())));
        }
        let undecided = a.state == lattice_engine::AllocState::Pending && !self.ctl.engine.claim_in_hand(id);
        (!undecided).then_some(Ok(()))
    }

    /// What the API shows of `name`: a live allocation, or the final record of one that ended
    /// before this control plane took over.
    pub fn view_named(&self, name: &str) -> Option<AllocationView> {
        match self.registry.by_name.get(name) {
            Some(&id) => self.view(id),
            None => self.registry.history.get(name).cloned(),
        }
    }

    /// What the control plane knows for an allocation's diagnostics (`GET .../diagnostics`): its
    /// nodes with their dragonfly groups, network domain and VNI, its declared data, the storage
    /// bandwidth it asked for and its data readiness. `None` for an unknown or forgotten one.
    pub fn diagnostics_facts(&self, name: &str) -> Option<DiagnosticsFacts> {
        let id = *self.registry.by_name.get(name)?;
        let a = self.ctl.engine.allocation(id)?;
        let m = self.registry.meta.get(id.index())?;
        Some(DiagnosticsFacts {
            nodes: a
                .nodes
                .iter()
                .filter_map(|n| {
                    Some((
                        self.registry.node_names[n.index()].clone(),
                        self.ctl.engine.node(*n)?.spec.group.0,
                    ))
                })
                .collect(),
            network_domain: a.spec.network_domain.clone(),
            vni: self.ctl.vni_of(id),
            data: m.data.clone(),
            storage_gbps: a.spec.storage_gbps,
            data_readiness: self.ctl.engine.data_readiness(id),
        })
    }

    /// The service registry (book: "Service Discovery"): each exposed port of each running allocation
    /// (of `tenant`, when given) on each of its nodes, by service name. Derived from the allocations'
    /// specs and the nodes they hold, it has the same consistency as node ownership: an allocation that
    /// ends or is requeued leaves it at once.
    pub fn services(&self, tenant: Option<&str>) -> BTreeMap<String, Vec<ServiceEndpoint>> {
        let mut out: BTreeMap<String, Vec<ServiceEndpoint>> = BTreeMap::new();
        for a in self.ctl.engine.allocations() {
            let Some(m) = self.registry.meta.get(a.id.index()) else {
                continue;
            };
            if a.state != AllocState::Running || m.expose.is_empty() {
                continue;
            }
            let t = self.tenant_name(a.spec.tenant);
            if tenant.is_some_and(|w| w != t) {
                continue;
            }
            for n in &a.nodes {
                let node = self.registry.node_names[n.index()].clone();
                let host = self
                    .fleet
                    .peer_addr
                    .get(&n.0)
                    .and_then(|addr| addr.parse::<std::net::SocketAddr>().ok())
                    .map_or_else(|| node.clone(), |sa| sa.ip().to_string());
                for e in &m.expose {
                    out.entry(e.name.clone()).or_default().push(ServiceEndpoint {
                        allocation: m.name.clone(),
                        tenant: t.clone(),
                        node: node.clone(),
                        host: host.clone(),
                        port: e.port as u16,
                        protocol: e.protocol.clone().unwrap_or_else(|| "tcp".into()),
                    });
                }
            }
        }
        out
    }

    /// The final records of allocations that ended before this control plane took over.
    pub fn history(&self) -> impl Iterator<Item = &AllocationView> + '_ {
        self.registry.history.values()
    }

    /// The state the API names. A preempted allocation waits again: `suspended` when it resumes
    /// from its checkpoint, `preempted` when it restarts; `suspending` while its agents stop it.
    pub(super) fn state_name(&self, id: AllocId, a: &lattice_engine::Allocation) -> &'static str {
        if self.stops.preempting.contains_key(&id) {
            "suspending"
        } else if a.state == AllocState::Pending && a.preempted > 0 {
            if a.resume_from_checkpoint {
                "suspended"
            } else {
                "preempted"
            }
        } else {
            a.state.as_str()
        }
    }

    /// What [`Control::view_named`] says of `name`'s state, end and nodes, without building the
    /// whole view (the simulation's checker reads it for every allocation after every step).
    pub fn brief(&self, name: &str) -> Option<Brief<'_>> {
        match self.registry.by_name.get(name) {
            Some(&id) => {
                let a = self.ctl.engine.allocation(id)?;
                self.registry.meta.get(id.index())?;
                Some(Brief {
                    state: self.state_name(id, a),
                    end_reason: a.end_reason.map(|r| r.as_str()),
                    ended_ms: a.ended.map(|t| t.0),
                    holds_nodes: !a.nodes.is_empty(),
                    run: a.started.map(|t| (t.0, self.ctl.vni_of(id))),
                })
            }
            None => self.registry.history.get(name).map(|v| Brief {
                state: &v.state,
                end_reason: v.end_reason.as_deref(),
                ended_ms: v.ended_ms,
                holds_nodes: !v.nodes.is_empty(),
                run: None,
            }),
        }
    }

    pub fn view(&self, id: AllocId) -> Option<AllocationView> {
        let a = self.ctl.engine.allocation(id)?;
        let m = self.registry.meta.get(id.index())?;
        Some(AllocationView {
            id: m.name.clone(),
            tenant: self.tenant_name(a.spec.tenant),
            vcluster: self
                .ctl
                .engine
                .vcluster(a.spec.vcluster)
                .map(|v| v.name)
                .unwrap_or_default(),
            user: m.user.clone(),
            project: m.project.clone(),
            state: self.state_name(id, a).to_string(),
            nodes: a
                .nodes
                .iter()
                .map(|n| self.registry.node_names[n.index()].clone())
                .collect(),
            requested_nodes: a.spec.nodes.min,
            walltime_s: a.spec.lifecycle.walltime().map(|w| w.as_secs_f64()),
            preemption_class: a.spec.preemption_class.get(),
            submitted_ms: a.submitted.0,
            started_ms: a.started.map(|t| t.0),
            ended_ms: a.ended.map(|t| t.0),
            end_reason: a.end_reason.map(|r| r.as_str().to_string()),
            entrypoint: m.entrypoint.clone(),
            environment: m.environment.clone(),
            tags: m.tags.clone(),
            last_rejection: m.last_rejection.clone(),
            vni: self.ctl.vni_of(id),
            data_readiness: self.ctl.engine.data_readiness(id),
            telemetry: m.telemetry.clone(),
            checkpoints: m.checkpoints,
            last_checkpoint_ms: m.last_checkpoint_ms,
            preempted: a.preempted,
            preemption: m.preempted_for.clone(),
            task_group: self.group_view(a),
            waiting: self.waiting_view(id),
            depends_on: a
                .spec
                .depends_on
                .iter()
                .map(|d| DependsIn {
                    reference: self.name_of(d.on),
                    condition: match d.condition {
                        lattice_engine::DependencyCondition::Success => "success",
                        lattice_engine::DependencyCondition::Failure => "failure",
                        lattice_engine::DependencyCondition::Any => "any",
                    }
                    .to_string(),
                })
                .collect(),
            constraints: (!a.spec.constraints.is_empty()).then(|| {
                let c = &a.spec.constraints;
                ConstraintsIn {
                    gpu_type: c.gpu_type.clone(),
                    gpu_count: c.gpu_count,
                    features: c.features.iter().cloned().collect(),
                    topology: c.topology.map(|t| t.as_str().to_string()),
                    cpu_cores: c.cpu_cores,
                    memory_gb: c.memory_gb,
                    require_unified_memory: c.require_unified_memory,
                }
            }),
            requeue: match a.spec.requeue {
                lattice_engine::RequeuePolicy::Never => "never",
                lattice_engine::RequeuePolicy::OnNodeFailure => "on_node_failure",
                lattice_engine::RequeuePolicy::Always => "always",
            }
            .to_string(),
            max_requeues: a.spec.max_requeues,
            mutex: a.spec.mutex.clone(),
            storage_gbps: a.spec.storage_gbps,
        })
    }

    /// Why `id` waits (see [`AllocationView::waiting`]).
    pub(super) fn waiting_view(&self, id: AllocId) -> Option<serde_json::Value> {
        let w = self.ctl.engine.waiting(id)?;
        let mut v = serde_json::to_value(w).ok()?;
        if let lattice_engine::waiting::Waiting::BehindHead { head } = w {
            v["head"] = serde_json::json!(self.name_of(head));
        }
        v["summary"] = serde_json::json!(w.describe(|a| self.name_of(a), self.now()));
        Some(v)
    }

    /// Every allocation: those that ended before this control plane took over first, then the live
    /// ones in submission order.
    pub fn list(&self) -> Vec<AllocationView> {
        let mut out: Vec<AllocationView> = self.registry.history.values().cloned().collect();
        out.sort_by_key(|v| id_number(&v.id));
        out.extend(self.ctl.engine.allocations().iter().filter_map(|a| self.view(a.id)));
        out
    }

    pub fn nodes(&self) -> Vec<NodeView> {
        (0..self.registry.node_names.len())
            .filter_map(|i| self.node_view(lattice_engine::NodeId(i as u32)))
            .collect()
    }

    pub fn node_view(&self, id: lattice_engine::NodeId) -> Option<NodeView> {
        let n = self.ctl.engine.node(id)?;
        let held = n.owner.and_then(|o| self.ctl.engine.allocation(o.alloc));
        Some(NodeView {
            name: self.registry.node_names[id.index()].clone(),
            state: format!("{:?}", n.state).to_lowercase(),
            owner: n.owner.map(|o| self.name_of(o.alloc)),
            vcluster: held.and_then(|a| self.ctl.engine.vcluster(a.spec.vcluster).map(|v| v.name)),
            tenant: held.map(|a| self.tenant_name(a.spec.tenant)),
            gpu_type: n.spec.capabilities.gpu_type.clone(),
            gpu_count: n.spec.capabilities.gpu_count,
            cpu_cores: n.spec.capabilities.cpu_cores,
            memory_gb: n.spec.capabilities.memory_gb,
            group: n.spec.group.0,
            discovered: self.fleet.discovered.get(&id.0).cloned(),
            fingerprint: self.fleet.agent_info.get(&id.0).and_then(|a| a.0.clone()),
            agent_capabilities: self.fleet.agent_info.get(&id.0).and_then(|a| a.1.clone()),
            fingerprint_ms: self.conformance.fingerprint_ms.get(&id.0).copied(),
            drifted: self.ctl.is_drifted(id),
            last_partition: self.fleet.partitions.get(&id.0).copied(),
            capability_mismatch: self.capability_mismatch(id),
        })
    }

    /// Where the capabilities the node's agent reported disagree with the inventory's: GPU count and
    /// model, and — where the inventory sets them — CPU cores and memory (discovered memory below
    /// 90 % of the inventory's; usable memory is a little under what is installed).
    pub fn capability_mismatch(&self, id: lattice_engine::NodeId) -> Vec<String> {
        let (Some(n), Some(found)) = (
            self.ctl.engine.node(id),
            self.fleet.agent_info.get(&id.0).and_then(|a| a.1.as_ref()),
        ) else {
            return Vec::new();
        };
        let want = &n.spec.capabilities;
        let mut out = Vec::new();
        let gpus = found["gpu_count"].as_u64().unwrap_or(0);
        if gpus != u64::from(want.gpu_count) {
            out.push(format!("gpu_count: inventory {}, agent {gpus}", want.gpu_count));
        }
        let model = found["gpu_model"].as_str();
        match (&want.gpu_type, model) {
            (Some(t), Some(m)) if !m.to_lowercase().contains(&t.to_lowercase()) => {
                out.push(format!("gpu_type: inventory {t}, agent {m}"));
            }
            (Some(t), None) if gpus == 0 => out.push(format!("gpu_type: inventory {t}, agent none")),
            (None, Some(m)) => out.push(format!("gpu_type: inventory none, agent {m}")),
            _ => {}
        }
        let cores = found["cpu_cores"].as_u64().unwrap_or(0);
        if want.cpu_cores > 0 && cores != u64::from(want.cpu_cores) {
            out.push(format!("cpu_cores: inventory {}, agent {cores}", want.cpu_cores));
        }
        let gb = found["memory_gib"].as_f64().unwrap_or(0.0) * 1.073_741_824;
        if want.memory_gb > 0 && gb < 0.9 * f64::from(want.memory_gb) {
            out.push(format!("memory_gb: inventory {}, agent {gb:.1}", want.memory_gb));
        }
        out
    }

    /// Nodes whose agents' capabilities disagree with the inventory.
    pub fn capability_mismatches(&self) -> usize {
        (0..self.registry.node_names.len())
            .filter(|&i| !self.capability_mismatch(lattice_engine::NodeId(i as u32)).is_empty())
            .count()
    }

    /// Node-hours and GPU-hours held in `[since, until)` by allocations matching the filters.
    pub fn usage(&self, tenant: Option<&str>, user: Option<&str>, since: Time, until: Time) -> Usage {
        let mut u = Usage {
            since_ms: since.0,
            until_ms: until.0,
            ..Usage::default()
        };
        for r in self.usage_records(tenant, user, since, until) {
            u.allocations += 1;
            u.node_hours += r.node_hours;
            u.gpu_hours += r.gpu_hours;
        }
        u
    }

    /// Each allocation matching the filters that held nodes in `[since, until)`, in submission order,
    /// with what it used inside the window.
    pub fn usage_records(
        &self,
        tenant: Option<&str>,
        user: Option<&str>,
        since: Time,
        until: Time,
    ) -> Vec<UsageRecord> {
        let mut out = Vec::new();
        for a in self.ctl.engine.allocations() {
            let Some(started) = a.started else { continue };
            let end = a.ended.unwrap_or(until).min(until);
            let start = started.max(since);
            if end <= start {
                continue;
            }
            let t = self.tenant_name(a.spec.tenant);
            let m = &self.registry.meta[a.id.index()];
            if tenant.is_some_and(|w| w != t) || user.is_some_and(|w| Some(w) != m.user.as_deref()) {
                continue;
            }
            let hours = end.since(start).as_secs_f64() / 3600.0;
            let gpus: u32 = a
                .nodes
                .iter()
                .filter_map(|n| self.ctl.engine.node(*n))
                .map(|n| n.spec.capabilities.gpu_count)
                .sum();
            out.push(UsageRecord {
                id: m.name.clone(),
                tenant: t,
                project: m.project.clone().unwrap_or_else(|| "default".into()),
                user: m.user.clone(),
                vcluster: self
                    .ctl
                    .engine
                    .vcluster(a.spec.vcluster)
                    .map(|v| v.name)
                    .unwrap_or_default(),
                state: self.state_name(a.id, a).to_string(),
                nodes: a.nodes.len() as u32,
                gpus,
                started_ms: started.0,
                ended_ms: a.ended.map(|t| t.0),
                node_hours: hours * a.nodes.len() as f64,
                gpu_hours: hours * gpus as f64,
            });
        }
        out
    }

    /// What the accounting pipeline reports ([`crate::accounting`]): every allocation that ran and has
    /// something at or after `since_ms` (its start, end or last checkpoint, or it still runs), with
    /// its GPUs and their type.
    pub fn accounting_rows(&self, since_ms: u64) -> Vec<AccountingRow> {
        let live = self.ctl.engine.allocations().iter().filter(|a| {
            a.started.is_some() && a.ended.is_none_or(|e| e.0 >= since_ms)
                || self.registry.meta[a.id.index()]
                    .last_checkpoint_ms
                    .is_some_and(|c| c >= since_ms)
        });
        let live = live.filter_map(|a| self.view(a.id).map(|v| (v, a.spec.sensitive_claim)));
        let ended = self
            .registry
            .history
            .values()
            .filter(|v| v.started_ms.is_some() && v.ended_ms.is_none_or(|e| e >= since_ms))
            .map(|v| (v.clone(), false));
        ended
            .chain(live)
            .map(|(view, sensitive)| {
                let nodes = view.nodes.iter().filter_map(|n| self.node_index(n));
                let specs: Vec<_> = nodes.filter_map(|n| self.ctl.engine.node(n)).collect();
                AccountingRow {
                    gpus: specs.iter().map(|n| n.spec.capabilities.gpu_count).sum(),
                    gpu_type: specs.iter().find_map(|n| n.spec.capabilities.gpu_type.clone()),
                    sensitive,
                    view,
                }
            })
            .collect()
    }

    /// A vCluster's scheduler configuration and weights in force (`None`: no such vCluster): its
    /// name and the keys `PATCH /v1/vclusters/{id}` takes ([`lattice_traces::config_json`]).
    pub fn vcluster_view(&self, name: &str) -> Option<serde_json::Value> {
        let c = self.vcluster_config(name)?;
        let mut m = serde_json::Map::new();
        m.insert("name".into(), name.into());
        m.extend(lattice_traces::config_json(&c));
        Some(serde_json::Value::Object(m))
    }

    pub fn vcluster_names(&self) -> Vec<String> {
        self.registry.vclusters.keys().cloned().collect()
    }

    /// Hard node quotas, by tenant name (tenants that have one).
    pub fn node_quotas(&self) -> Vec<(String, u32)> {
        self.registry
            .tenants
            .iter()
            .filter_map(|(name, id)| Some((name.clone(), self.ctl.engine.tenant_quota(*id)?.max_nodes?)))
            .collect()
    }

    /// When each registered node's agent was last heard from (ms since the epoch), by node name.
    pub fn last_heard(&self) -> Vec<(String, u64)> {
        self.fleet
            .agents
            .iter()
            .enumerate()
            .filter_map(|(i, a)| Some((self.registry.node_names.get(i)?.clone(), a.as_ref()?.1)))
            .collect()
    }

    /// Whether checkpoint storage is up (as last reported).
    /// The electricity price now, from the profile's price series (f7); `None` without one.
    pub fn energy_price_now(&self) -> Option<f64> {
        let now = self.now();
        self.ctl
            .engine
            .config()
            .energy_prices
            .iter()
            .take_while(|(from, _)| *from <= now)
            .last()
            .or(self.ctl.engine.config().energy_prices.first())
            .map(|(_, p)| *p)
    }

    pub fn checkpoint_storage_available(&self) -> bool {
        self.ctl.engine.storage_available()
    }

    /// The checkpoint store's write bandwidth as the probe measured it (GB/s): the broker's from
    /// now on when it differs from what the broker uses by more than a tenth (a probe's small
    /// jitter changes nothing); whether it did.
    pub fn probed_bandwidth(&mut self, gbps: f64) -> bool {
        let used = self.ctl.engine.checkpoint_bandwidth();
        (gbps - used).abs() > 0.1 * used && self.checkpoint_bandwidth(gbps)
    }

    /// The checkpoint store's write bandwidth (GB/s): the broker's from now on (a value that is
    /// not a positive number, or the one in use, changes nothing); whether it did.
    pub fn checkpoint_bandwidth(&mut self, gbps: f64) -> bool {
        let used = self.ctl.engine.checkpoint_bandwidth();
        if !(gbps.is_finite() && gbps > 0.0) || gbps == used {
            return false;
        }
        if let Err(e) = self.input(lattice_engine::Input::CheckpointBandwidth(gbps)) {
            tracing::warn!("checkpoint bandwidth {gbps} GB/s: not applied: {e}");
            return false;
        }
        true
    }

    /// The checkpoint store's health as probed: an outage (or its end) is the engine's storage
    /// input when it changes what the engine believes; whether it did.
    pub fn storage_health(&mut self, up: bool) -> bool {
        if self.ctl.engine.storage_available() == up {
            return false;
        }
        if let Err(e) = self.input(lattice_engine::Input::Storage(up)) {
            tracing::warn!(
                "checkpoint storage {}: not applied: {e}",
                if up { "up" } else { "down" }
            );
            return false;
        }
        true
    }
}
