//! Prometheus `/metrics` (the text exposition format) with the seed's metric names and labels
//! (book: "Key Metrics", "Scheduler Self-Monitoring", "Preemption Metrics"), on the `prometheus`
//! crate's registry. Events are counted where they happen (API requests by a middleware, cycles and
//! commits by the scheduling loop, preemptions and checkpoints from the control plane's tally);
//! state — allocations, nodes, queues, quotas, the quorum — is read when Prometheus scrapes.
//! The alerting rules and dashboards built on these names are in `runtime/monitoring/`.

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Bucket upper bounds, seconds: from half a millisecond to past the alerting rules' 30 s (a cycle)
/// and 5 s (a commit) thresholds, so their p99 can be told from the buckets.
pub const BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Every metric the runtime exports.
pub struct Metrics {
    registry: Registry,
    // Events.
    pub cycles: Histogram,
    pub commits: Histogram,
    pub api_requests: IntCounterVec,
    pub api_duration: HistogramVec,
    pub api_streams: IntGaugeVec,
    pub submitted: IntCounter,
    pub placements: IntCounter,
    pub proposals: IntCounterVec,
    pub backfilled: IntCounter,
    pub scheduling_preemptions: IntCounter,
    pub preemptions: IntCounterVec,
    pub victim_requeues: IntCounter,
    pub failed_checkpoints: IntCounter,
    pub preemption_checkpoint: Histogram,
    pub checkpoint_outcomes: IntCounterVec,
    pub checkpoint_duration: Histogram,
    pub wipe_failures: IntCounter,
    pub drift_timeouts: IntCounter,
    pub boot_failures: IntCounter,
    pub walltime_conflicts: IntCounter,
    pub autoscaling_query_failures: IntCounter,
    pub cost_function: HistogramVec,
    pub agent_overhead: GaugeVec,
    pub fabric_errors: IntCounter,
    pub staging_failures: IntCounter,
    pub heartbeat_latency: HistogramVec,
    pub agent_startup: HistogramVec,
    pub snapshot_duration: HistogramVec,
    pub audit_entries: IntCounter,
    // State, set at each scrape.
    pub allocations: GaugeVec,
    pub allocations_active: IntGauge,
    pub tenant_allocations: GaugeVec,
    pub nodes: GaugeVec,
    pub queue_depth: GaugeVec,
    pub last_heartbeat: GaugeVec,
    pub quota_used: GaugeVec,
    pub quota_max: GaugeVec,
    pub vni_total: IntGauge,
    pub vni_available: IntGauge,
    pub checkpoint_storage_unavailable: IntGauge,
    pub checkpoint_storage_write_gbps: prometheus::Gauge,
    pub node_capability_mismatch: IntGauge,
    pub raft_leader: IntGaugeVec,
    pub raft_term: IntGauge,
    pub accounting_buffered: IntGauge,
    pub accounting_on_disk: IntGauge,
    pub accounting_dropped: IntCounter,
    pub accounting_delivered: IntCounter,
    pub raft_log_entries: IntGaugeVec,
    pub raft_disk_used: GaugeVec,
    pub raft_disk_total: GaugeVec,
    pub raft_snapshot_size: GaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("a valid metric definition");
                registry
                    .register(Box::new(m.clone()))
                    .expect("each metric name once");
                m
            }};
        }
        let counter = |name: &str, help: &str| IntCounter::new(name, help);
        let counters = |name: &str, help: &str, labels: &[&str]| IntCounterVec::new(Opts::new(name, help), labels);
        let gauges = |name: &str, help: &str, labels: &[&str]| GaugeVec::new(Opts::new(name, help), labels);
        let int_gauges = |name: &str, help: &str, labels: &[&str]| IntGaugeVec::new(Opts::new(name, help), labels);
        let histogram =
            |name: &str, help: &str| Histogram::with_opts(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()));
        let histograms = |name: &str, help: &str, labels: &[&str]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), labels)
        };
        Metrics {
            cycles: reg!(histogram(
                "lattice_scheduling_cycle_duration_seconds",
                "Wall time of one scheduling pass."
            )),
            commits: reg!(histogram(
                "lattice_raft_commit_latency_seconds",
                "Time from proposing an ownership change to its commit."
            )),
            api_requests: reg!(counters(
                "lattice_api_requests_total",
                "API requests by method and HTTP status.",
                &["method", "status"]
            )),
            api_duration: reg!(histograms(
                "lattice_api_request_duration_seconds",
                "API request latency by method.",
                &["method"]
            )),
            api_streams: reg!(int_gauges(
                "lattice_api_active_streams",
                "Open streaming connections (attach terminals).",
                &["stream_type"]
            )),
            submitted: reg!(counter(
                "lattice_allocations_submitted_total",
                "Allocations accepted by the API."
            )),
            placements: reg!(counter(
                "lattice_scheduling_placements_total",
                "Allocations whose nodes the quorum committed."
            )),
            proposals: reg!(counters(
                "lattice_scheduling_proposals_total",
                "Node ownership proposals sent to the quorum, by result.",
                &["result"]
            )),
            backfilled: reg!(counter(
                "lattice_scheduling_backfill_jobs_total",
                "Allocations started by backfill."
            )),
            scheduling_preemptions: reg!(counter(
                "lattice_scheduling_preemptions_total",
                "Preemption commands the scheduler issued."
            )),
            preemptions: reg!(counters(
                "lattice_preemptions_total",
                "Preemptions by the victim's vCluster and the reason (priority, reclaim, sensitive).",
                &["vcluster", "reason"]
            )),
            victim_requeues: reg!(counter(
                "lattice_preemption_victim_requeue_total",
                "Preempted allocations that went back to the queue (suspended)."
            )),
            failed_checkpoints: reg!(counter(
                "lattice_preemption_failed_checkpoint_total",
                "Preemptions whose checkpoint did not complete (the victim was killed)."
            )),
            preemption_checkpoint: reg!(histogram(
                "lattice_preemption_checkpoint_duration_seconds",
                "From a preemption's checkpoint hint to the victim's checkpoint on every node."
            )),
            checkpoint_outcomes: reg!(counters(
                "lattice_checkpoint_outcomes_total",
                "Checkpoints asked for (broker, preemption) by result: ok or failed.",
                &["result"]
            )),
            checkpoint_duration: reg!(histogram(
                "lattice_checkpoint_duration_seconds",
                "From a checkpoint hint to its completion."
            )),
            agent_overhead: reg!(gauges(
                "lattice_agent_ebpf_overhead_percent",
                "Each agent's telemetry collection (eBPF map reads, or /proc sampling without eBPF): its CPU time over the period, percent of one core.",
                &["node_id"]
            )),
            cost_function: reg!(histograms(
                "lattice_scheduling_cost_function_duration_seconds",
                "Time to evaluate the cost function for all candidates of a vCluster's pool in one pass.",
                &["vcluster"]
            )),
            autoscaling_query_failures: reg!(counter(
                "lattice_autoscaling_metric_query_failures_total",
                "Evaluations of a reactive allocation without a fresh scaling metric (nothing decided)."
            )),
            walltime_conflicts: reg!(counter(
                "lattice_checkpoint_walltime_conflict_total",
                "Runs killed at their walltime while a checkpoint was in progress (walltime wins)."
            )),
            wipe_failures: reg!(counter(
                "lattice_sensitive_wipe_failure_total",
                "Secure wipes of released sensitive nodes that failed (the node is quarantined)."
            )),
            drift_timeouts: reg!(counter(
                "lattice_node_drift_timeouts_total",
                "Drifted nodes not remediated within the drift remediation timeout (taken Down)."
            )),
            boot_failures: reg!(counter(
                "lattice_sensitive_boot_failures_total",
                "Claimed sensitive nodes whose hardened-image boot failed or timed out (the node is out, the claim failed)."
            )),
            fabric_errors: reg!(counter(
                "lattice_fabric_errors_total",
                "Fabric manager calls that failed after their retries (the allocation was retried)."
            )),
            staging_failures: reg!(counter(
                "lattice_staging_failures_total",
                "VAST prefetches that failed (the staging restarts, up to 3 retries)."
            )),
            heartbeat_latency: reg!(histograms(
                "lattice_agent_heartbeat_latency_seconds",
                "Heartbeat round trip as the agent measured its previous one.",
                &["node_id"]
            )),
            agent_startup: reg!(histograms(
                "lattice_agent_allocation_startup_seconds",
                "Time from an allocation's assignment to its process start on a node (uenv pull and mount included).",
                &["node_id"]
            )),
            snapshot_duration: reg!(histograms(
                "lattice_raft_snapshot_duration_seconds",
                "Time to build a Raft snapshot.",
                &["member_id"]
            )),
            audit_entries: reg!(counter(
                "lattice_raft_sensitive_audit_entries_total",
                "Entries in the quorum's sensitive audit log."
            )),
            allocations: reg!(gauges(
                "lattice_allocations_total",
                "Allocations this control plane knows, by state.",
                &["state"]
            )),
            allocations_active: reg!(IntGauge::new("lattice_allocations_active", "Allocations running now.")),
            tenant_allocations: reg!(gauges(
                "lattice_tenant_allocations",
                "Allocations by tenant and state.",
                &["tenant", "state"]
            )),
            nodes: reg!(gauges("lattice_nodes_total", "Nodes by state.", &["state"])),
            queue_depth: reg!(gauges(
                "lattice_scheduling_queue_depth",
                "Allocations waiting to start (pending or staging), by vCluster.",
                &["vcluster"]
            )),
            last_heartbeat: reg!(gauges(
                "lattice_agent_last_heartbeat_timestamp",
                "When each node's agent was last heard from (seconds since the epoch).",
                &["node_id"]
            )),
            quota_used: reg!(gauges(
                "lattice_quota_used_nodes",
                "Nodes a tenant's running allocations hold.",
                &["tenant"]
            )),
            quota_max: reg!(gauges(
                "lattice_quota_max_nodes",
                "A tenant's hard node quota (tenants with one).",
                &["tenant"]
            )),
            vni_total: reg!(IntGauge::new("lattice_network_vni_pool_total", "VNIs in the pool.")),
            vni_available: reg!(IntGauge::new(
                "lattice_network_vni_pool_available",
                "VNIs not held by a network domain."
            )),
            checkpoint_storage_unavailable: reg!(IntGauge::new(
                "lattice_checkpoint_storage_unavailable",
                "1 while checkpoint storage is down (preemptions kill instead of checkpointing)."
            )),
            checkpoint_storage_write_gbps: reg!(prometheus::Gauge::new(
                "lattice_checkpoint_storage_write_gbps",
                "The checkpoint store's write bandwidth as last probed, GB/s (the checkpoint broker's write-time estimate)."
            )),
            node_capability_mismatch: reg!(IntGauge::new(
                "lattice_node_capability_mismatch",
                "Nodes whose agent's discovered capabilities (GPUs, cores, memory) disagree with the inventory."
            )),
            raft_leader: reg!(int_gauges(
                "lattice_raft_leader",
                "1 on the quorum's leader, 0 on a follower.",
                &["member_id"]
            )),
            raft_term: reg!(IntGauge::new("lattice_raft_term", "Current Raft term.")),
            accounting_buffered: reg!(IntGauge::new(
                "lattice_accounting_events_buffered",
                "Events in the in-memory accounting buffer."
            )),
            accounting_on_disk: reg!(IntGauge::new(
                "lattice_accounting_events_disk_buffered",
                "Accounting events in the disk buffer not yet delivered."
            )),
            accounting_dropped: reg!(counter(
                "lattice_accounting_events_dropped_total",
                "Accounting events dropped because the memory and disk buffers were full."
            )),
            accounting_delivered: reg!(counter(
                "lattice_accounting_events_delivered_total",
                "Accounting events the accounting service took."
            )),
            raft_log_entries: reg!(int_gauges(
                "lattice_raft_log_entries",
                "Entries in this member's Raft log (since its last compaction).",
                &["member_id"]
            )),
            raft_disk_used: reg!(gauges(
                "lattice_raft_disk_used_bytes",
                "Bytes used on the file system of this member's data directory.",
                &["member_id"]
            )),
            raft_disk_total: reg!(gauges(
                "lattice_raft_disk_total_bytes",
                "Size of the file system of this member's data directory.",
                &["member_id"]
            )),
            raft_snapshot_size: reg!(gauges(
                "lattice_raft_snapshot_size_bytes",
                "Size of this member's latest Raft snapshot.",
                &["member_id"]
            )),
            registry,
        }
        .zeroes()
    }

    /// Series that exist at zero from the start, so that a rate over them is 0 rather than no data
    /// (a labelled family shows only the label sets it has seen).
    fn zeroes(self) -> Metrics {
        for r in ["accepted", "rejected"] {
            self.proposals.with_label_values(&[r]);
        }
        for r in ["ok", "failed"] {
            self.checkpoint_outcomes.with_label_values(&[r]);
        }
        self.api_streams.with_label_values(&["attach"]);
        self
    }

    /// The label sets of what exists now: every vCluster's preemption reasons, every heard node's
    /// heartbeat latency, this member's snapshot durations (at zero until something happens).
    pub fn known(&self, vclusters: &[String], nodes: &[String], member: &str) {
        for v in vclusters {
            self.cost_function.with_label_values(&[v.as_str()]);
            for r in lattice_engine::PreemptReason::ALL {
                self.preemptions.with_label_values(&[v.as_str(), r.as_str()]);
            }
        }
        for n in nodes {
            self.heartbeat_latency.with_label_values(&[n.as_str()]);
            self.agent_startup.with_label_values(&[n.as_str()]);
        }
        self.snapshot_duration.with_label_values(&[member]);
    }

    pub fn cycle(&self, d: std::time::Duration) {
        self.cycles.observe(d.as_secs_f64());
    }

    pub fn commit(&self, d: std::time::Duration) {
        self.commits.observe(d.as_secs_f64());
    }

    /// Adds a control plane's tally (what happened since the last one was taken).
    pub fn add(&self, t: &lattice_control::Tally) {
        for ((vcluster, reason), n) in &t.preemptions {
            self.preemptions
                .with_label_values(&[vcluster.as_str(), reason.as_str()])
                .inc_by(*n);
        }
        self.victim_requeues.inc_by(t.victim_requeues);
        self.failed_checkpoints.inc_by(t.failed_checkpoints);
        self.wipe_failures.inc_by(t.wipe_failures);
        self.drift_timeouts.inc_by(t.drift_timeouts);
        self.boot_failures.inc_by(t.boot_failures);
        self.walltime_conflicts.inc_by(t.walltime_conflicts);
        for s in &t.preemption_checkpoint_s {
            self.preemption_checkpoint.observe(*s);
        }
        for s in &t.checkpoint_s {
            self.checkpoint_duration.observe(*s);
        }
        self.checkpoint_outcomes
            .with_label_values(&["ok"])
            .inc_by(t.checkpoints_ok);
        self.checkpoint_outcomes
            .with_label_values(&["failed"])
            .inc_by(t.checkpoints_failed);
        for (node, s) in &t.heartbeat_rtt_s {
            self.heartbeat_latency.with_label_values(&[node.as_str()]).observe(*s);
        }
    }

    /// The exposition text.
    /// Adds an optional component's metrics (e.g. federation's) to the same `/metrics`.
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) {
        if let Err(e) = self.registry.register(c) {
            tracing::warn!("metrics: {e}");
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!("encoding the metrics: {e}");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// An open stream counted in `lattice_api_active_streams{stream_type}` until dropped.
pub struct StreamGuard(IntGauge);

impl StreamGuard {
    pub fn open(m: &Metrics, stream_type: &str) -> StreamGuard {
        let g = m.api_streams.with_label_values(&[stream_type]);
        g.inc();
        StreamGuard(g)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Sets a labelled gauge family to exactly `values` (label values → value): series gone since the last
/// scrape disappear.
pub fn set_all<'a>(g: &GaugeVec, values: impl IntoIterator<Item = (Vec<&'a str>, f64)>) {
    g.reset();
    for (labels, v) in values {
        g.with_label_values(&labels).set(v);
    }
}

/// The size and use of the file system holding `path` (bytes): `(used, total)`.
pub fn disk_usage(path: &std::path::Path) -> Option<(f64, f64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the struct it is given from a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as f64;
    let total = st.f_blocks as f64 * frsize;
    let free = st.f_bfree as f64 * frsize;
    Some((total - free, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_reach_past_the_alert_thresholds() {
        let m = Metrics::new();
        m.cycle(std::time::Duration::from_millis(3));
        m.cycle(std::time::Duration::from_secs(45));
        set_all(&m.nodes, [(vec!["ready"], 4.0)]);
        let text = m.render();
        assert!(
            text.contains("lattice_scheduling_cycle_duration_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("lattice_scheduling_cycle_duration_seconds_bucket{le=\"30\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("lattice_scheduling_cycle_duration_seconds_bucket{le=\"60\"} 2"),
            "{text}"
        );
        assert!(text.contains("lattice_scheduling_cycle_duration_seconds_count 2"));
        assert!(text.contains("lattice_nodes_total{state=\"ready\"} 4"));
        // A series gone from the state is gone from the next scrape.
        set_all(&m.nodes, [(vec!["down"], 1.0)]);
        let text = m.render();
        assert!(!text.contains("state=\"ready\"") && text.contains("lattice_nodes_total{state=\"down\"} 1"));
    }

    #[test]
    fn a_tally_adds_up() {
        let m = Metrics::new();
        let mut t = lattice_control::Tally::default();
        t.preemptions.insert(("hpc".into(), "priority".into()), 2);
        t.checkpoints_failed = 1;
        m.add(&t);
        m.add(&t);
        let text = m.render();
        assert!(
            text.contains("lattice_preemptions_total{reason=\"priority\",vcluster=\"hpc\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("lattice_checkpoint_outcomes_total{result=\"failed\"} 2"),
            "{text}"
        );
    }
}
