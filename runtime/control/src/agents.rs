//! The node agents: registration, heartbeats and leases, conformance fingerprints and drift, work
//! polls, their reports and exits, and preemptions they carry out.

use super::*;
use lattice_agent_protocol::{Buffered as BufferedBeat, ExitKind, Launch, PreemptWork, Work};
use lattice_engine::PreemptHow;
use lattice_engine::{AllocId, AllocState, EndReason, Input};
use std::collections::BTreeMap;

impl Control {
    /// An agent (re)registers its node: its heartbeat sequence restarts. Returns the node's state.
    pub fn register_agent(&mut self, node: &str) -> Result<String, FieldError> {
        self.register_agent_with(node, None, None)
    }

    /// [`Control::register_agent`] with what the agent reports about its node.
    pub fn register_agent_with(
        &mut self,
        node: &str,
        fingerprint: Option<String>,
        capabilities: Option<serde_json::Value>,
    ) -> Result<String, FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        if let Some(f) = &fingerprint
            && (f.len() != 64 || !f.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad("fingerprint", "a SHA-256 in hex (64 characters)"));
        }
        let now = self.now();
        self.fleet.agents[id.index()] = Some((0, now.0));
        if fingerprint.is_some() {
            self.conformance.fingerprint_ms.insert(id.0, now.0);
        }
        // Each GPU's memory as the agent reports it: the broker's checkpoint size there.
        let gpu_gib = capabilities
            .as_ref()
            .and_then(|c| c["gpu_memory_gib"].as_f64())
            .filter(|g| g.is_finite() && *g > 0.0);
        self.fleet.agent_info.insert(id.0, (fingerprint.clone(), capabilities));
        if let Some(gib) = gpu_gib {
            let _ = self.input(Input::GpuMemory(id, gib * 1.073_741_824));
        }
        if self
            .ctl
            .engine
            .node(id)
            .is_some_and(|n| n.state == lattice_engine::NodeState::Booting)
        {
            // Up again (an operator's standing drain drains it at once: the controller's order).
            let _ = self.input(Input::Node(id, lattice_engine::NodeEvent::HealthOk));
        }
        if let Some(f) = fingerprint {
            self.conformance
                .first_fingerprint
                .entry(id.0)
                .or_insert_with(|| f.clone());
            self.check_conformance(id, &f);
        }
        Ok(self.node_state(id))
    }

    /// Sets the conformance baselines (node name → SHA-256); a node without one is held to the
    /// majority of its node class's reported fingerprints, or else to its first.
    /// Nodes join the running site (book: "Bootstrap Sequence": nodes registered in SMD, which is
    /// read periodically): `entry` is an inventory node entry (one node by `name`, or `count` by
    /// `prefix`), `baseline` their conformance baseline. Each is scheduled from the next pass; with
    /// real agents it is `Booting` until its agent registers (book: a node "in inventory but has never
    /// reported" is not schedulable). With `capture`, each is written to the trace capture as
    /// `node_added`. Returns the names added; an entry that does not parse, names a node already
    /// here or a vCluster this site does not have adds nothing.
    pub fn add_nodes(
        &mut self,
        entry: &serde_json::Value,
        baseline: Option<&str>,
        capture: bool,
    ) -> Result<Vec<String>, String> {
        let mut nodes = lattice_traces::parse_node_entry(entry)?;
        for n in &mut nodes {
            if let Some(v) = &n.vcluster {
                n.spec.home_vcluster =
                    Some(*self.registry.vclusters.get(v.as_str()).ok_or_else(|| {
                        format!("{}: vcluster `{v}` is not one of this site's vClusters", n.spec.name)
                    })?);
            }
        }
        if let Some(n) = nodes
            .iter()
            .find(|n| self.registry.node_by_name.contains_key(&n.spec.name))
        {
            return Err(lattice_engine::EngineError::DuplicateNode(n.spec.name.clone()).to_string());
        }
        let now = self.now();
        let mut added = Vec::new();
        for lattice_traces::JoiningNode {
            mut spec, entry, unset, ..
        } in nodes
        {
            let name = spec.name.clone();
            if self.real_agents && spec.state == lattice_engine::NodeState::Ready {
                spec.state = lattice_engine::NodeState::Booting;
            }
            let id = self.ctl.add_node(now, spec).map_err(|e| e.to_string())?;
            self.registry.node_by_name.insert(name.clone(), id.0);
            self.registry.node_names.push(name.clone());
            self.fleet.agents.push(None);
            self.leave_to_discovery(id, unset);
            if let Some(b) = baseline {
                self.conformance.baselines.insert(id.0, b.to_ascii_lowercase());
            }
            if capture {
                let ts = now.0 as f64 / 1000.0;
                self.capture_line(serde_json::json!({"ts": ts, "type": "node_added", "node": entry}));
            }
            added.push(name);
        }
        Ok(added)
    }

    pub fn set_baselines(&mut self, baselines: &BTreeMap<String, String>) {
        self.conformance.baselines = baselines
            .iter()
            .filter_map(|(n, f)| Some((self.node_index(n)?.0, f.to_ascii_lowercase())))
            .collect();
    }

    /// What `node`'s fingerprint should be (book: "Drift Response": changed, or diverged from the
    /// majority of its group): its configured baseline; else the fingerprint more than half of the
    /// other reporting nodes of its class share (at least two of them); else the first it reported.
    pub(super) fn expected_fingerprint(&self, node: lattice_engine::NodeId) -> Option<String> {
        if let Some(b) = self.conformance.baselines.get(&node.0) {
            return Some(b.clone());
        }
        let class = self.ctl.engine.class_of(node);
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        let mut reporting = 0;
        for (n, (f, _)) in &self.fleet.agent_info {
            if *n == node.0 || self.ctl.engine.class_of(lattice_engine::NodeId(*n)) != class {
                continue;
            }
            if let Some(f) = f {
                reporting += 1;
                *counts.entry(f.as_str()).or_default() += 1;
            }
        }
        let top = counts.iter().max_by_key(|(_, c)| **c);
        match top {
            Some((f, c)) if reporting >= 2 && 2 * c > reporting => Some(f.to_string()),
            _ => self.conformance.first_fingerprint.get(&node.0).cloned(),
        }
    }

    /// Compares a reported fingerprint with the node's expected one: a change of verdict is the
    /// controller's `Conformance` input (drain and remediation, or back to the pool).
    pub(super) fn check_conformance(&mut self, node: lattice_engine::NodeId, actual: &str) {
        let Some(expected) = self.expected_fingerprint(node) else {
            return;
        };
        let drifted = expected != actual;
        if drifted {
            self.conformance
                .drift_seen
                .insert(node.0, (expected, actual.to_string()));
        }
        if drifted == self.ctl.is_drifted(node) {
            return;
        }
        let name = self.registry.node_names[node.index()].clone();
        // (The trace capture writes it as a `drift` or `conform` event.)
        if let Err(e) = self.input(Input::Conformance(node, drifted)) {
            tracing::warn!("node {name}: conformance not applied: {e}");
        }
    }

    /// `expected=…, actual=…` for a node's last drift (empty if none).
    pub fn drift_message(&self, node: u32) -> String {
        self.conformance
            .drift_seen
            .get(&node)
            .map(|(e, a)| format!("conformance_drift: expected={e}, actual={a}"))
            .unwrap_or_default()
    }

    /// Is the node drifted from its conformance baseline?
    pub fn drifted(&self, node: &str) -> bool {
        self.node_index(node).is_some_and(|n| self.ctl.is_drifted(n))
    }

    /// Where `node`'s agent serves the agents' service (reported at registration).
    pub fn set_agent_service(&mut self, node: &str, addr: Option<String>) -> Result<(), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        if let Some(a) = &addr
            && (a.is_empty() || a.len() > 255 || a.contains(['/', ' ', '\0']) || !a.contains(':'))
        {
            return Err(bad("peer", "host:port of the agent's service"));
        }
        match addr {
            Some(a) => self.fleet.peer_addr.insert(id.0, a),
            None => self.fleet.peer_addr.remove(&id.0),
        };
        Ok(())
    }

    /// The token `lattice-mpi-launcher` presents to run processes in allocation `name`'s current run.
    pub(super) fn launch_token(&self, name: &str, started_ms: u64) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.launch_secret);
        h.update(name.as_bytes());
        h.update(started_ms.to_le_bytes());
        h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// With real agents: idle nodes whose agent has not registered are Booting — nothing is placed on
    /// a node nobody would run it on; its agent's registration makes it Ready (the seed's node
    /// lifecycle: Booting → HealthOk → Ready). Nodes that hold a (re-attached) allocation keep it and
    /// time out as usual if their agent does not come back.
    pub fn await_agents(&mut self) {
        use lattice_engine::{NodeEvent, NodeState};
        if !self.real_agents {
            return;
        }
        // Until each agent polls (or its lease is surely over), it may run an earlier start.
        self.fleet.unheard = (0..self.registry.node_names.len() as u32).collect();
        self.fleet.took_over_ms = self.now().0;
        self.fleet.taken_over = self.registry.by_name.values().copied().collect();
        for i in 0..self.registry.node_names.len() {
            let id = lattice_engine::NodeId(i as u32);
            let idle_ready = self
                .ctl
                .engine
                .node(id)
                .is_some_and(|n| n.owner.is_none() && n.state == NodeState::Ready);
            if self.fleet.agents[i].is_none() && idle_ready {
                let _ = self.input(Input::Node(id, NodeEvent::HardwareFailure));
                let _ = self.input(Input::Node(id, NodeEvent::Boot));
            }
        }
    }

    /// Asks `node`'s agent to recompute and report its conformance fingerprint (at its next poll).
    pub fn ask_fingerprint(&mut self, node: &str) -> Result<(), FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        self.conformance.fingerprint_asked.insert(id.0);
        Ok(())
    }

    /// A heartbeat with the agent's monotonic sequence number: a replayed or reordered one (not above
    /// the last) is refused; a heartbeat of a Degraded node brings it back (HeartbeatResume).
    pub fn heartbeat(&mut self, node: &str, seq: u64) -> Result<String, FieldError> {
        self.heartbeat_with(node, &[], seq)
    }

    /// [`Control::heartbeat`] after a partition: the agent replays the heartbeats it buffered, in
    /// strictly increasing order and below `seq` (else the batch is refused whole). Buffered ones at or
    /// below the last accepted sequence were delivered already (their answer was lost with the link)
    /// and are skipped; `seq` itself must be new, so a replayed request is still refused. The node's
    /// `last_partition` records the ones replayed.
    /// How long `node`'s agent may keep running its work without an accepted heartbeat (counted
    /// from when it sent the last one accepted): the heartbeat timeout plus the grace the
    /// controller would give the node now. After that the control plane may have requeued its
    /// allocation elsewhere, so the agent stops it first (fencing: never two runs at once).
    pub fn lease_ms(&self, node: &str) -> u64 {
        let grace = self
            .node_index(node)
            .map_or(self.ctl.grace.default, |n| self.ctl.node_grace(n));
        self.ctl.heartbeat_timeout.0 + grace.0
    }

    pub fn heartbeat_with(&mut self, node: &str, buffered: &[BufferedBeat], seq: u64) -> Result<String, FieldError> {
        let id = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        let Some((last, _)) = self.fleet.agents[id.index()].filter(|(seq, _)| *seq != SEQ_UNKNOWN) else {
            return Err(bad("id", format!("node {node}: the agent has not registered")));
        };
        for (i, w) in buffered.windows(2).enumerate() {
            if w[1].seq <= w[0].seq {
                return Err(bad(
                    &format!("buffered[{}].seq", i + 1),
                    format!("out-of-order buffered heartbeat: seq {} after {}", w[1].seq, w[0].seq),
                ));
            }
        }
        let top = buffered.last().map_or(last, |b| b.seq.max(last));
        if seq <= top {
            return Err(bad(
                "seq",
                format!("replayed or out-of-order heartbeat: seq {seq}, last accepted {top}"),
            ));
        }
        let fresh: Vec<&BufferedBeat> = buffered.iter().filter(|b| b.seq > last).collect();
        if let (Some(first), Some(lastb)) = (fresh.first(), fresh.last()) {
            self.fleet.partitions.insert(
                id.0,
                Partition {
                    from_ms: first.at_ms,
                    to_ms: lastb.at_ms,
                    heartbeats: fresh.len() as u64,
                },
            );
        }
        let now = self.now();
        self.fleet.agents[id.index()] = Some((seq, now.0));
        if self
            .ctl
            .engine
            .node(id)
            .is_some_and(|n| n.state == lattice_engine::NodeState::Degraded)
        {
            let _ = self.input(Input::Node(id, lattice_engine::NodeEvent::HeartbeatResume));
            self.fleet.grace_until.remove(&id.0);
        }
        Ok(self.node_state(id))
    }

    /// Registered agents that went quiet: Ready → Degraded after `agents.heartbeat_timeout` without a heartbeat,
    /// Degraded → Down after `grace_ms` more (its allocation requeued or failed by the engine). Returns
    /// the allocations that lost their nodes (to release at the quorum).
    pub fn check_agents(&mut self) {
        use lattice_engine::NodeState;
        let timeout_ms = self.ctl.heartbeat_timeout.0;
        let now = self.now();
        for i in 0..self.fleet.agents.len() {
            let Some((_, last)) = self.fleet.agents[i] else {
                continue;
            };
            let id = lattice_engine::NodeId(i as u32);
            let Some(state) = self.ctl.engine.node(id).map(|n| n.state) else {
                continue;
            };
            let quiet = now.0.saturating_sub(last);
            let input = match state {
                NodeState::Ready if quiet >= timeout_ms => {
                    Some(Input::Node(id, lattice_engine::NodeEvent::HeartbeatMiss))
                }
                // The grace the controller gave it (by what it runs) is over.
                NodeState::Degraded if self.fleet.grace_until.get(&id.0).is_none_or(|&t| now.0 >= t) => {
                    Some(Input::GraceExpired(id))
                }
                _ => None,
            };
            if let Some(input) = input
                && let Err(e) = self.input(input)
            {
                tracing::warn!("node {}: {e}", self.registry.node_names[i]);
            }
        }
    }

    /// An agent's poll: allocations running on `node` that its agent has neither started (`running`)
    /// nor reported, and ones it runs that no longer run there.
    pub fn work(&mut self, node: &str, running: &[String]) -> Result<Work, FieldError> {
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        let mut w = Work {
            refresh_fingerprint: self.conformance.fingerprint_asked.remove(&nid.0),
            ..Work::default()
        };
        // What this node's agent runs now (where each allocation runs, for the start gate below).
        self.fleet.unheard.remove(&nid.0);
        let before = self
            .fleet
            .agent_running
            .insert(nid.0, running.to_vec())
            .unwrap_or_default();
        for gone in before.iter().filter(|a| !running.contains(a)) {
            if let Some(on) = self.fleet.running_where.get_mut(gone) {
                on.remove(&nid.0);
                if on.is_empty() {
                    self.fleet.running_where.remove(gone);
                }
            }
        }
        for a in running {
            self.fleet.running_where.entry(a.clone()).or_default().insert(nid.0);
        }
        // This node's agent no longer runs these: their stop here is confirmed.
        let names = &self.registry.meta;
        self.fleet.stopping_on.retain(|a, on| {
            let runs_here = names.get(a.index()).is_some_and(|m| running.contains(&m.name));
            if !runs_here {
                on.remove(&nid.0);
            }
            !on.is_empty()
        });
        w.cache = self.caches.take(node);
        let mine = self.ctl.engine.node(nid).and_then(|n| n.owner).map(|o| o.alloc);
        if let Some(id) = mine
            && let Some(a) = self.ctl.engine.allocation(id)
            && a.state == AllocState::Running
        {
            let name = self.name_of(id);
            let reported = self.fleet.exits.get(&id).is_some_and(|e| e.contains_key(&nid.0));
            let vni = self.ctl.vni_of(id);
            // With a fabric manager, a job on a VNI starts once its CXI service exists.
            let fabric_ready = !self.fabric || vni.is_none() || self.services.cxi.contains_key(&name);
            let cxi_auth_key = self.services.cxi.get(&name).map(|c| c.1.clone());
            // A victim being preempted is not started where it does not run yet; a claim whose nodes
            // boot the hardened image starts once they all have.
            let stopping = self.stops.preempting.contains_key(&id) || self.ctl.is_booting(id);
            if self.fleet.fresh_starts.contains(&(nid.0, id)) {
                if running.contains(&name) {
                    // An earlier start's process: stopped before this start runs here (else the
                    // node would run the old run as part of the new one, with the old nodes).
                    w.kill.push(name.clone());
                } else if !reported && fabric_ready && !stopping {
                    self.fleet.fresh_starts.remove(&(nid.0, id));
                }
            }
            // An earlier run still to be stopped elsewhere (its nodes' agents have not polled since):
            // this start waits for it.
            let down = |n: u32| {
                self.ctl
                    .engine
                    .node(lattice_engine::NodeId(n))
                    .is_some_and(|x| x.state == lattice_engine::NodeState::Down)
            };
            // (A Down node's agent stopped it by its lease.)
            let since = self.now().0.saturating_sub(self.fleet.took_over_ms);
            let within_lease =
                |n: u32| since < self.ctl.heartbeat_timeout.0 + self.ctl.node_grace(lattice_engine::NodeId(n)).0;
            let stale = self.fleet.fresh_starts.contains(&(nid.0, id))
                || self
                    .fleet.stopping_on
                    .get(&id)
                    .is_some_and(|on| on.iter().any(|n| *n != nid.0 && !down(*n)))
                // A node outside this start still runs it (an earlier start)...
                || self.fleet.running_where.get(&name).is_some_and(|on| {
                    on.iter()
                        .any(|n| !a.nodes.contains(&lattice_engine::NodeId(*n)) && !down(*n))
                })
                // ...or may, not having polled since the take-over, within a predecessor's lease.
                || (self.fleet.taken_over.contains(&id)
                    && self.fleet.unheard.iter().any(|n| *n != nid.0 && !down(*n) && within_lease(*n)));
            if !reported && !stale && !running.contains(&name) && fabric_ready && !stopping {
                let m = &self.registry.meta[id.index()];
                w.launch.push(Launch {
                    id: name,
                    entrypoint: m.entrypoint.clone().unwrap_or_default(),
                    nodes: a
                        .nodes
                        .iter()
                        .map(|n| self.registry.node_names[n.index()].clone())
                        .collect(),
                    task_index: a.nodes.iter().position(|n| *n == nid).unwrap_or(0) as u32,
                    walltime_s: a.spec.lifecycle.walltime().map(|d| d.as_secs_f64()),
                    tenant: self.tenant_name(a.spec.tenant),
                    user: m.user.clone(),
                    project: m.project.clone(),
                    checkpoint: a.spec.checkpoint.mechanism.as_str().into(),
                    checkpoint_port: m.checkpoint_port,
                    vni,
                    cxi_auth_key,
                    restart_from_s: Some(self.ctl.resume_point(id).as_secs_f64()).filter(|s| *s > 0.0),
                    task_group: self.group_view(a),
                    uenv: m.environment.as_ref().and_then(|e| e.uenv.clone()),
                    uenv_view: m.environment.as_ref().and_then(|e| e.view.clone()),
                    tools_uenv: m.environment.as_ref().and_then(|e| e.tools_uenv.clone()),
                    uenv_sign_required: m.environment.as_ref().is_some_and(|e| e.sign_required),
                    sensitive: self.ctl.engine.is_sensitive(id),
                    image: m.environment.as_ref().and_then(|e| e.image.clone()),
                    launch_token: Some(self.launch_token(&self.name_of(id), a.started.map_or(0, |t| t.0))),
                    agents: a
                        .nodes
                        .iter()
                        .filter_map(|n| {
                            Some((
                                self.registry.node_names[n.index()].clone(),
                                self.fleet.peer_addr.get(&n.0)?.clone(),
                            ))
                        })
                        .collect(),
                    mounts: m
                        .data
                        .iter()
                        .flat_map(|d| d.mounts.iter())
                        .filter_map(|x| {
                            Some(lattice_agent_protocol::DataMount {
                                source: x.source.clone(),
                                target: x.target.clone()?,
                                read_only: x.access.as_deref() == Some("read-only"),
                            })
                        })
                        .collect(),
                    data_defaults: m.data.as_ref().and_then(|d| d.defaults).unwrap_or(true),
                    checkpoints: a.spec.checkpoint.kind != lattice_engine::CheckpointKind::None,
                    liveness_probe: m.liveness.clone(),
                });
            }
            // Someone follows its output: the agent sends what is new with its next polls.
            let name = self.name_of(id);
            if running.contains(&name) && self.output.followed.get(&id).is_some_and(|until| *until > self.now().0) {
                w.tail.push(name);
            }
        }
        let mine_name = mine.map(|m| self.name_of(m));
        // A checkpoint hint is handed out once per node (a hint, not a guarantee: the application
        // decides whether and when to checkpoint).
        if let Some(id) = mine
            && let Some(nodes) = self.stops.checkpoint_hints.get_mut(&id)
            && nodes.remove(&nid.0)
        {
            if nodes.is_empty() {
                self.stops.checkpoint_hints.remove(&id);
            }
            if let Some(n) = &mine_name
                && running.contains(n)
            {
                w.checkpoint.push(n.clone());
            }
        }
        // A preemption is handed out once per node, from its start (a reclaim leaves the borrower its
        // grace period first).
        let now = self.now();
        if let Some(id) = mine
            && let Some(name) = mine_name.clone()
            && let Some(how) = self
                .stops
                .preempting
                .get(&id)
                .filter(|p| p.at <= now && p.to_tell.contains(&nid.0))
                .map(|p| p.how)
        {
            if let Some(p) = self.stops.preempting.get_mut(&id) {
                p.to_tell.remove(&nid.0);
            }
            let wants_checkpoint = matches!(how, PreemptHow::CheckpointThenStop { .. });
            if running.contains(&name) {
                let (how, deadline_s, grace_s) = match how {
                    PreemptHow::CheckpointThenStop { deadline } => ("checkpoint", deadline.as_secs_f64(), 0.0),
                    PreemptHow::Stop { grace } => ("stop", 0.0, grace.as_secs_f64()),
                    PreemptHow::Kill { grace } => ("kill", 0.0, grace.as_secs_f64()),
                };
                w.preempt.push(PreemptWork {
                    id: name,
                    how: how.to_string(),
                    deadline_s,
                    grace_s,
                });
            } else if !self.fleet.exits.get(&id).is_some_and(|e| e.contains_key(&nid.0)) {
                // It does not run here (never started): nothing to stop on this node.
                let n = self.ctl.engine.allocation(id).map_or(0, |a| a.nodes.len());
                self.preempted_on(id, nid.0, n, wants_checkpoint);
            }
        }
        // A released claim's node: the agent wipes it with the site's command.
        for (id, wipe) in self.wipes.wiping.iter_mut() {
            if wipe.to_tell.remove(&nid.0) {
                w.wipe.push(
                    self.registry
                        .meta
                        .get(id.index())
                        .map(|m| m.name.clone())
                        .unwrap_or_default(),
                );
            }
        }
        w.kill
            .extend(running.iter().filter(|r| Some(*r) != mine_name.as_ref()).cloned());
        Ok(w)
    }

    /// What an agent reports with its poll: the outcome of checkpoint hints (broker or operator) on
    /// its node, and of wipes it ran. A hint's outcome reaches the controller once every node of the
    /// allocation reported (or one failed); a wipe's once every wiped node did (any failure
    /// quarantines the claim's nodes).
    pub fn agent_reports(&mut self, node: &str, reports: &AgentReports) -> Result<(), FieldError> {
        let AgentReports {
            checkpointed,
            wiped,
            metrics,
            task_ends,
            tasks_running: _,
            cache_done,
            cache,
        } = reports;
        self.caches.reported(node, cache_done, cache.as_deref());
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("id", format!("no node {node} in the inventory")))?;
        let now = self.now().0;
        for e in task_ends {
            self.launches.ended(node, e.clone(), now);
        }
        // A reactive allocation's metric: the mean of its nodes' latest samples goes to the
        // autoscaler (which keeps the evaluation windows).
        for m in metrics {
            let Some(id) = self.id_of(&m.id) else { continue };
            if !m.value.is_finite()
                || self.registry.meta.get(id.index()).and_then(|x| x.metric.as_deref()) != Some(m.name.as_str())
            {
                continue;
            }
            let Some(a) = self.ctl.engine.allocation(id) else {
                continue;
            };
            if a.state != AllocState::Running || !a.nodes.contains(&nid) {
                continue;
            }
            let held: Vec<u32> = a.nodes.iter().map(|n| n.0).collect();
            let samples = self.metric_samples.entry(id).or_default();
            samples.insert(nid.0, m.value);
            samples.retain(|n, _| held.contains(n));
            let mean = samples.values().sum::<f64>() / samples.len() as f64;
            if let Err(e) = self.input(Input::Metric(id, mean)) {
                tracing::warn!("{}: metric not applied: {e}", m.id);
            }
        }
        for o in checkpointed {
            let Some(id) = self.id_of(&o.id) else { continue };
            let Some(a) = self.ctl.engine.allocation(id) else {
                continue;
            };
            if a.state != AllocState::Running || !a.nodes.contains(&nid) {
                continue; // a late report of a run that ended
            }
            let n = a.nodes.len();
            let r = self.stops.hint_reports.entry(id).or_default();
            r.insert(nid.0, o.ok);
            if !o.ok || r.len() == n {
                let ok = r.values().all(|v| *v);
                self.stops.hint_reports.remove(&id);
                self.checkpointed(id, ok);
            }
        }
        // Each node's own outcome: a wiped node returns to the pool, a failed one is quarantined.
        for o in wiped {
            let Some(id) = self.id_of(&o.id) else { continue };
            let reason = (!o.ok).then(|| "the site's wipe command failed".to_string());
            self.wipe_outcome(id, nid, o.ok, reason);
        }
        Ok(())
    }

    pub fn agent_exit(&mut self, name: &str, node: &str, kind: ExitKind, code: i32) -> Result<bool, FieldError> {
        let nid = self
            .node_index(node)
            .ok_or_else(|| bad("node", format!("no node {node} in the inventory")))?;
        let (id, a) = self.allocation_named(name)?;
        if a.state != AllocState::Running || !a.nodes.contains(&nid) {
            // A late report of a run that already ended or moved: nothing to do.
            return Ok(false);
        }
        let n = a.nodes.len();
        let nodes: Vec<u32> = a.nodes.iter().map(|x| x.0).collect();
        if matches!(kind, ExitKind::Checkpointed | ExitKind::Preempted) {
            return Ok(self.preempted_on(id, nid.0, n, kind == ExitKind::Checkpointed));
        }
        if kind == ExitKind::Prologue {
            // The run ends on every node (the others are told to stop theirs); the engine requeues it
            // away from this node, or fails it once its retries are spent.
            self.fleet.exits.remove(&id);
            if let Err(e) = self.input(Input::PrologueFailed(id, nid)) {
                tracing::warn!("{name}: prologue failure not applied: {e}");
                return Ok(false);
            }
            return Ok(true);
        }
        let e = self.fleet.exits.entry(id).or_default();
        e.insert(nid.0, code);
        let reason = match kind {
            ExitKind::Fenced => Some(EndReason::NodeFailure),
            // The service stopped answering: an application failure (requeued per its policy).
            ExitKind::Liveness => Some(EndReason::ExitFailure),
            ExitKind::Walltime => Some(EndReason::WalltimeExceeded),
            ExitKind::WalltimeCheckpoint => {
                self.tally.walltime_conflicts += 1;
                Some(EndReason::WalltimeExceeded)
            }
            ExitKind::Exited if code != 0 => Some(EndReason::ExitFailure),
            // Every node of this run exited (exits of other nodes are an earlier run's).
            ExitKind::Exited if nodes.iter().all(|x| e.contains_key(x)) => Some(EndReason::Success),
            ExitKind::Exited | ExitKind::Checkpointed | ExitKind::Preempted | ExitKind::Prologue => None,
        };
        let Some(reason) = reason else { return Ok(false) };
        self.fleet.exits.remove(&id);
        Ok(self.completed(id, reason))
    }

    /// A victim's agent stopped it on one node of `n` (`checkpointed`: after its checkpoint was
    /// written). A checkpoint that did not complete fails the victim at once (book: an unresponsive
    /// application is killed and marked failed, not suspended; requeued if its policy allows), as does
    /// a kill; otherwise it is suspended once every node stopped — resuming from the checkpoint when
    /// every node wrote it. Returns whether the allocation ended its run now.
    pub(super) fn preempted_on(&mut self, id: AllocId, node: u32, n: usize, checkpointed: bool) -> bool {
        let Some(p) = self.stops.preempting.get(&id) else {
            return false; // not being preempted: a late or stray report
        };
        let wants_checkpoint = matches!(p.how, PreemptHow::CheckpointThenStop { .. });
        if matches!(p.how, PreemptHow::Kill { .. }) || (wants_checkpoint && !checkpointed) {
            if wants_checkpoint {
                self.tally.failed_checkpoints += 1;
                self.tally.checkpoints_failed += 1;
            }
            self.fleet.exits.remove(&id);
            return self.completed(id, EndReason::PreemptionKilled);
        }
        let e = self.fleet.exits.entry(id).or_default();
        e.insert(node, if checkpointed { 0 } else { 1 });
        if e.len() < n {
            return false;
        }
        self.fleet.exits.remove(&id);
        self.suspended(id, wants_checkpoint)
    }
}
