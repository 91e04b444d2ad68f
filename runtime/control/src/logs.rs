//! Allocation output: the stored tail, followed allocations' live output, and who may read it. What
//! is kept is [`Output`]'s; this resolves names and the clock.

use super::*;
use lattice_agent_protocol::Output as OutputIn;
use lattice_agent_protocol::Stream;
use std::collections::BTreeMap;

impl Control {
    /// Keeps the output tail (one stream) an agent reported for `name` on `node`.
    pub fn add_log(&mut self, name: &str, node: &str, stream: Stream, tail: &str) {
        if let Some(&id) = self.registry.by_name.get(name) {
            self.output.keep_tail(id, node, stream, tail);
        }
    }

    /// Someone follows `name`'s output: for the next [`FOLLOW_MS`] its agents stream it. Returns the
    /// live output of `stream` after `after` (node → offset; from the oldest kept when a node is
    /// absent).
    pub fn follow(
        &mut self,
        name: &str,
        stream: Stream,
        after: &BTreeMap<String, u64>,
    ) -> Option<BTreeMap<String, LiveOutput>> {
        let id = *self.registry.by_name.get(name)?;
        let until = self.now().0 + FOLLOW_MS;
        Some(self.output.follow(id, until, stream, after))
    }

    /// New output from `node`'s agent (kept while followed, the newest [`LIVE_BYTES`] per node).
    pub fn add_output(&mut self, node: &str, output: Vec<OutputIn>) {
        for o in output {
            if let Some(&id) = self.registry.by_name.get(&o.id) {
                self.output.add_live(id, node, o);
            }
        }
    }

    /// Where the allocation's stored logs are: (tenant, project).
    pub fn log_owner(&self, name: &str) -> Option<(String, Option<String>)> {
        let (id, a) = self.allocation_named(name).ok()?;
        let tenant = self.tenant_name(a.spec.tenant);
        Some((tenant, self.registry.meta[id.index()].project.clone()))
    }

    /// The output tails (of `stream`) reported for `name`, by node.
    pub fn logs(&self, name: &str, stream: Stream) -> Option<BTreeMap<String, String>> {
        let id = self.registry.by_name.get(name)?;
        Some(self.output.tails(*id, stream))
    }
}
