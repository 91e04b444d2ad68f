//! Allocation output: the stored tail, followed allocations' live output, and who may read it.

use super::*;
use lattice_agent_protocol::Output as OutputIn;
use lattice_agent_protocol::Stream;
use std::collections::BTreeMap;

impl Control {
    /// An agent reports the end of an allocation's process on its node. The allocation ends when one
    /// node fails or is killed at walltime, or when every node exited 0; returns whether it ended now
    /// (so its nodes are released at the quorum).
    /// Keeps the output tail (one stream) an agent reported for `name` on `node`.
    pub fn add_log(&mut self, name: &str, node: &str, stream: Stream, tail: &str) {
        let Some(&id) = self.by_name.get(name) else { return };
        let start = tail.len().saturating_sub(LOG_TAIL_BYTES);
        let start = (start..=tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(tail.len());
        self.logs
            .entry(id)
            .or_default()
            .insert((node.to_string(), stream), tail[start..].to_string());
        while self.logs.len() > LOGS_KEPT {
            self.logs.pop_first();
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
        let id = *self.by_name.get(name)?;
        let until = self.now().0 + FOLLOW_MS;
        self.followed.insert(id, until);
        let mut out = BTreeMap::new();
        let of_stream = self
            .live
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|((_, s), _)| *s == stream);
        for ((node, _), segs) in of_stream {
            let from = after.get(node).copied().unwrap_or(0);
            let mut o = LiveOutput {
                offset: u64::MAX,
                data: String::new(),
                next: from,
            };
            for s in segs.iter().filter(|s| s.next > from) {
                o.offset = o.offset.min(s.offset.max(from));
                // A segment that straddles `from` contributes its part after it (offsets are bytes).
                let skip = from.saturating_sub(s.offset) as usize;
                let start = (skip.min(s.data.len())..=s.data.len())
                    .find(|i| s.data.is_char_boundary(*i))
                    .unwrap_or(s.data.len());
                o.data.push_str(&s.data[start..]);
                o.next = s.next;
            }
            if o.offset == u64::MAX {
                o.offset = from;
            }
            out.insert(node.clone(), o);
        }
        Some(out)
    }

    /// New output from `node`'s agent (kept while followed, the newest [`LIVE_BYTES`] per node).
    pub fn add_output(&mut self, node: &str, output: Vec<OutputIn>) {
        for o in output {
            let Some(&id) = self.by_name.get(&o.id) else { continue };
            let segs = self
                .live
                .entry(id)
                .or_default()
                .entry((node.to_string(), o.stream))
                .or_default();
            if segs.back().is_some_and(|last| o.offset < last.next) {
                continue; // already have it (a resend)
            }
            segs.push_back(o);
            let mut kept: usize = segs.iter().map(|s| s.data.len()).sum();
            while kept > LIVE_BYTES && segs.len() > 1 {
                kept -= segs.pop_front().map_or(0, |s| s.data.len());
            }
        }
        while self.live.len() > LOGS_KEPT {
            self.live.pop_first();
        }
    }

    /// Where the allocation's stored logs are: (tenant, project).
    pub fn log_owner(&self, name: &str) -> Option<(String, Option<String>)> {
        let (id, a) = self.allocation_named(name).ok()?;
        let tenant = self.tenant_name(a.spec.tenant);
        Some((tenant, self.meta[id.index()].project.clone()))
    }

    /// The output tails (of `stream`) reported for `name`, by node.
    pub fn logs(&self, name: &str, stream: Stream) -> Option<BTreeMap<String, String>> {
        let id = self.by_name.get(name)?;
        Some(
            self.logs
                .get(id)
                .into_iter()
                .flatten()
                .filter(|((_, s), _)| *s == stream)
                .map(|((n, _), t)| (n.clone(), t.clone()))
                .collect(),
        )
    }
}
