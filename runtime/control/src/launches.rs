//! Task launches within running allocations, terminals (attach) and image cache orders.

use super::*;
use lattice_engine::AllocState;

impl Control {
    /// A task launch within running allocation `name` (`lattice launch`): laid out over its nodes.
    pub fn launch_tasks(
        &mut self,
        name: &str,
        req: &crate::tasks::TaskRequest,
        token: String,
    ) -> Result<crate::tasks::LaunchView, FieldError> {
        let (_, a) = self.allocation_named(name)?;
        if a.state != AllocState::Running {
            return Err(bad("id", format!("allocation {name} is not running")));
        }
        let nodes: Vec<(String, Option<String>)> = a
            .nodes
            .iter()
            .map(|n| {
                (
                    self.registry.node_names[n.index()].clone(),
                    self.fleet.peer_addr.get(&n.0).cloned(),
                )
            })
            .collect();
        let now_ms = self.now().0;
        self.launches
            .create(
                req,
                crate::tasks::NewLaunch {
                    alloc: name,
                    nodes,
                    token,
                    now_ms,
                },
            )
            .map_err(|(f, m)| bad(&f, m))
    }

    /// An agent's poll, for task launches: the parts of launches `node` should start (of allocations
    /// running on it), and which of the launches it runs (`running`) to stop — ended or unknown here.
    pub fn task_work(&mut self, node: &str, running: &[String]) -> (Vec<crate::tasks::TaskWork>, Vec<String>) {
        self.sweep_launches();
        let Some(nid) = self.node_index(node) else {
            return (Vec::new(), Vec::new());
        };
        let now = self.now().0;
        self.launches.reconcile(node, running, now);
        let engine = &self.ctl.engine;
        let by_name = &self.registry.by_name;
        let here = |alloc: &str| {
            by_name
                .get(alloc)
                .and_then(|id| engine.allocation(*id))
                .is_some_and(|a| a.state == AllocState::Running && a.nodes.contains(&nid))
        };
        let start = self.launches.hand_out(node, here);
        let stop = running.iter().filter(|l| !self.launches.is_live(l)).cloned().collect();
        (start, stop)
    }

    /// Launches of allocations that no longer run are ended (failed) first.
    pub(super) fn sweep_launches(&mut self) {
        let now = self.now().0;
        let mut launches = std::mem::take(&mut self.launches);
        launches.sweep(
            |alloc| {
                self.id_of(alloc)
                    .and_then(|id| self.ctl.engine.allocation(id))
                    .is_some_and(|a| a.state == AllocState::Running)
            },
            now,
        );
        self.launches = launches;
    }

    /// The task launches of allocation `name`.
    pub fn task_launches(&mut self, name: &str) -> Vec<crate::tasks::LaunchView> {
        self.sweep_launches();
        self.launches.list(name)
    }

    pub fn task_launch(&mut self, name: &str, launch: &str) -> Option<crate::tasks::LaunchView> {
        self.sweep_launches();
        self.launches.get(name, launch)
    }

    /// Where a terminal into running allocation `name` goes (`lattice attach`): the node (`node`, else
    /// the allocation's first), its agent's service address, the allocation's launch token, and
    /// whether it is a sensitive claim (attach is audited).
    pub fn attach_target(&self, name: &str, node: Option<&str>) -> Result<(String, String, String, bool), FieldError> {
        let (id, a) = self.allocation_named(name)?;
        if self.stops.preempting.contains_key(&id) {
            return Err(bad(
                "id",
                "allocation is being checkpointed — attach unavailable until rescheduled",
            ));
        }
        if a.state != AllocState::Running {
            return Err(bad("id", format!("allocation {name} is not running")));
        }
        let target = match node {
            None => *a
                .nodes
                .first()
                .ok_or_else(|| bad("id", "the allocation holds no nodes"))?,
            Some(n) => self
                .node_index(n)
                .filter(|nid| a.nodes.contains(nid))
                .ok_or_else(|| bad("node", format!("{n} is not a node of {name}")))?,
        };
        let node_name = self.registry.node_names[target.index()].clone();
        // Its agent must have started it there (or seen its part end there).
        let started_there = self
            .fleet
            .agent_running
            .get(&target.0)
            .is_some_and(|r| r.iter().any(|x| x == name))
            || self.fleet.exits.get(&id).is_some_and(|e| e.contains_key(&target.0));
        if !started_there {
            return Err(bad(
                "node",
                format!("{name} has not started on {node_name} yet; retry in a moment"),
            ));
        }
        let addr = self.fleet.peer_addr.get(&target.0).cloned().ok_or_else(|| {
            bad(
                "node",
                format!("the agent of {node_name} serves no terminals (its --peer-listen)"),
            )
        })?;
        let token = self.launch_token(name, a.started.map_or(0, |t| t.0));
        Ok((node_name, addr, token, a.spec.sensitive_claim))
    }

    /// Orders `op` (`warm`, `evict`) of `req.image` for the chosen nodes (every node by default, or a
    /// dragonfly group's); the node names.
    pub fn cache_order(&mut self, op: &str, req: &crate::cache::CacheRequest) -> Result<Vec<String>, FieldError> {
        if !valid_uenv_name(&req.image) {
            return Err(bad("image", format!("{:?}: expected name/version:tag", req.image)));
        }
        let nodes: Vec<String> = if !req.nodes.is_empty() {
            for n in &req.nodes {
                if self.node_index(n).is_none() {
                    return Err(bad("nodes", format!("no node {n} in the inventory")));
                }
            }
            req.nodes.clone()
        } else {
            (0..self.registry.node_names.len() as u32)
                .filter(|i| {
                    req.group.is_none_or(|g| {
                        self.ctl
                            .engine
                            .node(lattice_engine::NodeId(*i))
                            .is_some_and(|n| n.spec.group.0 == g)
                    })
                })
                .map(|i| self.registry.node_names[i as usize].clone())
                .collect()
        };
        if nodes.is_empty() {
            return Err(bad("group", "no node in that group"));
        }
        let order = crate::cache::CacheOrder {
            op: op.to_string(),
            image: req.image.clone(),
            sticky: req.sticky && op == "warm",
        };
        self.caches.order(&nodes, order);
        Ok(nodes)
    }
}
