//! What the replay loop drives: the [`Controller`] itself (`rm-replay`), or a control plane that
//! holds one — the runtime's, on the replay's virtual clock, so one trace goes through both worlds'
//! code down to the same fake world (the parity test).

use lattice_engine::{
    AllocId, AllocSpec, ControlError, Controller, Input, NodeId, PassStats, SubmitError, TenantId, Time, VClusterId,
    World,
};
use lattice_traces::TraceJob;
use std::sync::Arc;

/// The site's names as the replay registered them in the engine (node i is `NodeId(i)`).
#[derive(Clone, Debug, Default)]
pub struct SiteNames {
    pub nodes: Vec<String>,
    pub tenants: Vec<(String, TenantId)>,
    /// (tenant, project within it, id), for every project the trace uses.
    pub projects: Vec<(String, String, lattice_engine::ProjectId)>,
    pub vclusters: Vec<(String, VClusterId)>,
}

/// A controller's host. Inputs and passes go through it; what they decide reaches `world`.
pub trait Host {
    fn controller(&self) -> &Controller;
    fn controller_mut(&mut self) -> &mut Controller;
    /// A trace job arrives (its spec with the engine's tenant, vCluster and dependency ids).
    fn submit(&mut self, now: Time, job: &TraceJob, spec: Arc<AllocSpec>) -> Result<AllocId, SubmitError>;
    /// A node joins the site (a `node_added` event; `node.spec` has its home vCluster's id set).
    fn add_node(&mut self, now: Time, node: &lattice_traces::JoiningNode) -> Result<NodeId, String>;
    /// What a node's agent discovered where the inventory leaves its capabilities unset (a
    /// `node_capabilities` event): the node is scheduled with them (a held node once released).
    fn set_capabilities(
        &mut self,
        now: Time,
        node: NodeId,
        found: &lattice_engine::DiscoveredCapabilities,
    ) -> Result<(), String>;
    /// The site settings in force from `now` on (a `settings` event): the controller decides with
    /// them ([`Controller::apply_settings`]).
    fn settings(&mut self, now: Time, settings: &lattice_engine::controller::settings::Settings) {
        let _ = now;
        self.controller_mut().apply_settings(settings);
    }
    /// Applies one input at `now`; what it caused reaches `world`.
    fn apply(&mut self, now: Time, input: Input, world: &mut dyn World) -> Result<(), ControlError>;
    /// A scheduling pass at `now` (then [`Host::dispatch`]).
    fn schedule(&mut self, now: Time) -> PassStats;
    /// Carries out what the pass decided.
    fn dispatch(&mut self, now: Time, world: &mut dyn World) -> Result<(), ControlError>;
}

impl Host for Controller {
    fn controller(&self) -> &Controller {
        self
    }
    fn controller_mut(&mut self) -> &mut Controller {
        self
    }
    fn submit(&mut self, now: Time, _job: &TraceJob, spec: Arc<AllocSpec>) -> Result<AllocId, SubmitError> {
        Controller::submit(self, now, spec)
    }
    fn add_node(&mut self, now: Time, node: &lattice_traces::JoiningNode) -> Result<NodeId, String> {
        Controller::add_node(self, now, node.spec.clone()).map_err(|e| e.to_string())
    }
    fn set_capabilities(
        &mut self,
        now: Time,
        node: NodeId,
        found: &lattice_engine::DiscoveredCapabilities,
    ) -> Result<(), String> {
        let caps = found.filled(&self.engine.node(node).ok_or("unknown node")?.spec.capabilities);
        Controller::set_capabilities(self, now, node, caps)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    fn apply(&mut self, now: Time, input: Input, world: &mut dyn World) -> Result<(), ControlError> {
        Controller::apply(self, now, input, world)
    }
    fn schedule(&mut self, now: Time) -> PassStats {
        Controller::schedule(self, now)
    }
    fn dispatch(&mut self, now: Time, world: &mut dyn World) -> Result<(), ControlError> {
        Controller::dispatch(self, now, world)
    }
}
