//! Submissions: idempotency keys and acknowledgements, task groups, a request turned into the
//! engine's allocation, and the trace capture of what was submitted.

use super::*;
use lattice_agent_protocol::TaskGroup as TaskGroupView;
use lattice_engine::{AllocId, AllocSpec, TaskGroupRef};
use lattice_traces::request::Origin;
use std::io::Write;

impl Control {
    /// Validates a request and queues it; returns the new allocation's id.
    pub fn submit(&mut self, req: SubmitRequest) -> Result<String, FieldError> {
        self.submit_named(req, None)
    }

    /// [`Control::submit`] under a given id (a mirrored submission adopted after a fail-over keeps
    /// the id its submitter was given); later ids continue above it.
    pub fn submit_named(&mut self, req: SubmitRequest, name: Option<&str>) -> Result<String, FieldError> {
        self.submit_all(req, name).map(|s| s.id)
    }

    /// Validates a request and queues it — a task group as one allocation per index, `ID[i]`, all
    /// or none. Returns the id and what was queued under which id (what the mirror keeps: one
    /// element's request names only its own index, so an adopted element is that element again).
    pub fn submit_all(&mut self, req: SubmitRequest, name: Option<&str>) -> Result<Submitted, FieldError> {
        if let Some(k) = &req.idempotency_key
            && (k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY)
        {
            return Err(bad(
                "idempotency_key",
                format!("{} characters; 1 to {MAX_IDEMPOTENCY_KEY}", k.len()),
            ));
        }
        let Some(tg) = req.task_group.clone() else {
            let id = self.submit_one(req.clone(), name, None)?;
            self.remember_key(&req, &id);
            return Ok(Submitted {
                id: id.clone(),
                elements: vec![(id, req)],
            });
        };
        let IndexRange { start, end } = tg.range;
        if end < start {
            return Err(bad("task_group.range", format!("end {end} < start {start}")));
        }
        if end - start >= MAX_TASK_GROUP {
            return Err(bad(
                "task_group.range",
                format!(
                    "{} elements; a task group has at most {MAX_TASK_GROUP}",
                    end - start + 1
                ),
            ));
        }
        if tg.concurrency == Some(0) {
            return Err(bad("task_group.concurrency", "must be at least 1"));
        }
        let base = match name {
            Some(n) => group_element(n).map_or(n, |(b, _)| b).to_string(),
            None => format!("a-{:06}", self.registry.next),
        };
        let group = id_number(&base).ok_or_else(|| bad("id", format!("`{base}` is not an allocation id")))?;
        self.registry.next = self.registry.next.max(group + 1);
        let mut elements = Vec::new();
        for index in start..=end {
            let mut r = req.clone();
            r.task_group = Some(TaskGroupIn {
                range: IndexRange {
                    start: index,
                    end: index,
                },
                concurrency: tg.concurrency,
            });
            r.entrypoint = r.entrypoint.map(|e| e.replace("${INDEX}", &index.to_string()));
            let tref = TaskGroupRef {
                group,
                index,
                concurrency: tg.concurrency,
            };
            let id = self.submit_one(r.clone(), Some(&format!("{base}[{index}]")), Some(tref))?;
            elements.push((id, r));
        }
        if let Some((first, _)) = elements.first()
            && let Some(&id) = self.registry.by_name.get(first)
        {
            self.capture_submit(id, &base, Some(&tg));
        }
        self.remember_key(&req, &base);
        Ok(Submitted { id: base, elements })
    }

    /// Remembers `req`'s idempotency key (if any) for `id` (a task group's base id), unless the key
    /// already names an allocation.
    pub fn remember_key(&mut self, req: &SubmitRequest, id: &str) {
        if let Some(k) = &req.idempotency_key {
            let base = group_element(id).map_or(id, |(b, _)| b);
            self.registry
                .keys
                .entry((req.tenant.clone(), k.clone()))
                .or_insert_with(|| base.to_string());
        }
    }

    /// The key names `id` from now on (the one kept of duplicates).
    pub fn set_key(&mut self, tenant: &str, key: &str, id: &str) {
        self.registry
            .keys
            .insert((tenant.to_string(), key.to_string()), id.to_string());
    }

    /// The id the first submission with this tenant and key got.
    pub fn by_key(&self, tenant: &str, key: &str) -> Option<&String> {
        self.registry.keys.get(&(tenant.to_string(), key.to_string()))
    }

    /// `id` is queued but not known to be on a majority's disks; `in_flight`: a request is
    /// mirroring it now.
    /// Until it is acknowledged, it does not start (the controller holds it: a retry after a lost
    /// answer could otherwise make it run twice).
    pub fn unacked(&mut self, id: &str, in_flight: bool) {
        if self.acks.unacked.insert(id.to_string(), in_flight).is_none() {
            self.submission_durable(id, false);
        }
    }

    /// `id` is on a majority's disks (acknowledged).
    pub fn acked(&mut self, id: &str) {
        if self.acks.unacked.remove(id).is_some() {
            self.submission_durable(id, true);
        }
    }

    /// Tells the controller whether the submission `id` (a task group's base: all its elements) is
    /// on a majority's disks.
    fn submission_durable(&mut self, id: &str, durable: bool) {
        let members = self.group_members(id);
        let names = if members.is_empty() {
            vec![id.to_string()]
        } else {
            members
        };
        for n in names {
            if let Some(&a) = self.registry.by_name.get(&n) {
                let record = lattice_engine::Durable::Submission(a);
                let input = if durable {
                    Input::Durable(record)
                } else {
                    Input::NotDurable(record)
                };
                let _ = self.input(input);
            }
        }
    }

    /// `None`: acknowledged (or unknown); `Some(in_flight)`: not yet.
    pub fn ack_state(&self, id: &str) -> Option<bool> {
        self.acks.unacked.get(id).copied()
    }

    /// Up to `n` unacknowledged submissions no request is mirroring now.
    pub fn unacked_idle(&self, n: usize) -> Vec<String> {
        self.acks
            .unacked
            .iter()
            .filter(|(_, in_flight)| !**in_flight)
            .map(|(id, _)| id.clone())
            .take(n)
            .collect()
    }

    /// The elements of task group `base` still known here, in index order.
    pub fn group_members(&self, base: &str) -> Vec<String> {
        let prefix = format!("{base}[");
        let mut out: Vec<(u32, String)> = self
            .registry
            .by_name
            .range(prefix.clone()..)
            .take_while(|(n, _)| n.starts_with(&prefix))
            .filter_map(|(n, _)| Some((group_element(n)?.1, n.clone())))
            .collect();
        out.sort();
        out.into_iter().map(|(_, n)| n).collect()
    }

    pub(super) fn group_view(&self, a: &lattice_engine::Allocation) -> Option<TaskGroupView> {
        a.spec.task_group.map(|g| TaskGroupView {
            group: format!("a-{:06}", g.group),
            index: g.index,
            concurrency: g.concurrency,
        })
    }

    pub(super) fn submit_one(
        &mut self,
        req: SubmitRequest,
        name: Option<&str>,
        group: Option<TaskGroupRef>,
    ) -> Result<String, FieldError> {
        if req.tenant.trim().is_empty() {
            return Err(bad("tenant", "must not be empty"));
        }
        if let Some(e) = &req.environment {
            check_environment(e)?;
        }
        // What only the control plane needs of a request: the metric a reactive allocation scales
        // on, where its mounts appear, the services it exposes, its liveness probe, how long a
        // simulated run takes. The rest is the one request model's.
        let lc = req.lifecycle.clone().unwrap_or_default();
        if lc.kind == "reactive" && lc.metric.as_deref().is_none_or(|m| m.trim().is_empty()) {
            return Err(bad(
                "lifecycle.metric",
                "a reactive allocation scales on a metric: gpu_utilization, cpu_utilization, or one its tasks report (e.g. queue_depth)",
            ));
        }
        check_mount_targets(req.data.as_ref())?;
        let expose = req.connectivity.as_ref().map(|c| c.expose.clone()).unwrap_or_default();
        check_expose(&expose)?;
        let liveness = req.liveness_probe.as_ref().map(LivenessProbeIn::spec).transpose()?;
        let run = match req.duration.as_deref() {
            Some(d) => {
                let d = lattice_traces::parse_duration(d).map_err(|m| bad("duration", m))?;
                std::time::Duration::from_millis(d.0)
            }
            None => sleep_seconds(req.entrypoint.as_deref()).unwrap_or(std::time::Duration::from_secs(1)),
        };
        let request = req.request()?;
        let checkpoint_port = match req.checkpoint.as_ref().and_then(|c| c.port.map(|p| (c, p))) {
            None => None,
            Some((_, 0)) => return Err(bad("checkpoint.port", "a port from 1 to 65535")),
            Some((c, p)) if c.mechanism.as_deref() == Some("grpc") => Some(p),
            Some(_) => {
                return Err(bad(
                    "checkpoint.port",
                    "the callback port of the `grpc` mechanism: set `mechanism: grpc`",
                ));
            }
        };
        let mut names = ControlNames {
            c: self,
            prior: Vec::new(),
        };
        let mut spec = lattice_traces::request::alloc_spec(&request, Origin::Request, &mut names).map_err(api_field)?;
        let prior = names.prior;
        spec.task_group = group;
        let scale = spec.scale.as_deref().cloned();
        let lifecycle = spec.lifecycle;
        let now = self.now();
        let id = self
            .ctl
            .submit(now, spec)
            .map_err(|e| bad("resources", e.to_string()))?;
        for p in prior {
            let key = self.prior_end(&p);
            let _ = self.input(Input::AwaitsPrior(id, key));
        }
        let name = match name {
            Some(n) => {
                self.registry.next = self.registry.next.max(id_number(n).map_or(0, |k| k + 1));
                n.to_string()
            }
            None => {
                self.registry.next += 1;
                format!("a-{:06}", self.registry.next - 1)
            }
        };
        let meta = Meta {
            user: req.user.clone(),
            project: req.project.clone(),
            entrypoint: req.entrypoint.clone(),
            tags: req.tags.clone(),
            environment: req.environment.clone(),
            data: req.data.clone(),
            expose,
            liveness,
            checkpoint_port,
            metric: (lifecycle.walltime().is_none() && scale.is_some())
                .then(|| lc.metric.clone())
                .flatten(),
            ..Meta::new(name.clone(), run)
        };
        self.enqueued(id, meta);
        if group.is_none() {
            self.capture_submit(id, &name, None);
        }
        Ok(name)
    }

    /// Queues an allocation whose spec is already built — a replayed trace job, on the replay's
    /// clock — under `name`, through the same bookkeeping as a request.
    pub fn submit_spec(
        &mut self,
        spec: AllocSpec,
        name: &str,
        user: Option<String>,
        run: std::time::Duration,
    ) -> Result<AllocId, lattice_engine::SubmitError> {
        let now = self.now();
        let project = self
            .registry
            .project_of_id
            .get(spec.project.index())
            .filter(|p| !p.is_empty() && *p != "default")
            .cloned();
        let id = self.ctl.submit(now, spec)?;
        self.registry.next = self.registry.next.max(id_number(name).map_or(0, |k| k + 1));
        self.enqueued(
            id,
            Meta {
                user,
                project,
                ..Meta::new(name.to_string(), run)
            },
        );
        self.capture_submit(id, name, None);
        Ok(id)
    }

    pub(super) fn enqueued(&mut self, id: AllocId, meta: Meta) {
        while self.registry.meta.len() <= id.index() {
            self.registry.meta.push(Meta::new(String::new(), meta.run));
        }
        self.registry.by_name.insert(meta.name.clone(), id);
        // A submission recorded as unacknowledged before it was queued here (a take-over adopts
        // keyed records so) is held from the start, as one that becomes so later.
        let base = group_element(&meta.name).map_or(meta.name.as_str(), |(b, _)| b);
        let unacknowledged = self.acks.unacked.contains_key(base);
        self.registry.meta[id.index()] = meta;
        if unacknowledged {
            let _ = self.input(Input::NotDurable(lattice_engine::Durable::Submission(id)));
        }
    }

    /// The capture's submit line (a task group once, under its id, with its range).
    pub(super) fn capture_submit(&mut self, id: AllocId, name: &str, tg: Option<&TaskGroupIn>) {
        if self.capture.is_none() {
            return;
        }
        let Some(a) = self.ctl.engine.allocation(id) else {
            return;
        };
        let vcluster = self
            .ctl
            .engine
            .vcluster(a.spec.vcluster)
            .map(|v| v.name)
            .unwrap_or_default();
        let tenant = self.tenant_name(a.spec.tenant);
        let m = self.registry.meta.get(id.index());
        let names = lattice_traces::SpecNames {
            tenant: &tenant,
            project: m.and_then(|m| m.project.as_deref()).unwrap_or("default"),
            vcluster: &vcluster,
            user: m.and_then(|m| m.user.as_deref()),
            deps: a
                .spec
                .depends_on
                .iter()
                .map(|d| (self.name_of(d.on), d.condition))
                .collect(),
        };
        let mut body = lattice_traces::alloc_json(name, &a.spec, &names);
        if let Some(tg) = tg {
            body.insert("task_group".into(), serde_json::json!(tg));
        }
        let ts = a.submitted.0 as f64 / 1000.0;
        // A sensitive claim is the trace format's `claim` event.
        let line = if a.spec.sensitive_claim {
            serde_json::json!({"ts": ts, "type": "claim", "claim": body})
        } else {
            serde_json::json!({"ts": ts, "type": "submit", "alloc": body})
        };
        self.capture_line(line);
    }

    pub(super) fn capture_line(&mut self, mut v: serde_json::Value) {
        // Drop null fields: the JSONL reader takes absent, not null, optional fields.
        for key in ["alloc", "claim"] {
            if let Some(a) = v.get_mut(key).and_then(|a| a.as_object_mut()) {
                a.retain(|_, x| !x.is_null());
            }
        }
        if let Some(f) = self.capture.as_mut() {
            let _ = writeln!(f, "{v}");
            let _ = f.flush();
        }
    }
}

/// A request's exposed service ports: DNS-safe names, ports 1-65535, known protocols.
fn check_expose(expose: &[ExposeIn]) -> Result<(), FieldError> {
    for (i, e) in expose.iter().enumerate() {
        let f = |x: &str| format!("connectivity.expose[{i}].{x}");
        if e.name.is_empty()
            || e.name.len() > 63
            || !e
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(bad(
                &f("name"),
                format!("`{}`: lowercase letters, digits and -, at most 63", e.name),
            ));
        }
        if e.port == 0 || e.port > 65_535 {
            return Err(bad(&f("port"), format!("{}: 1-65535", e.port)));
        }
        if let Some(p) = &e.protocol
            && !["tcp", "http", "https", "grpc"].contains(&p.as_str())
        {
            return Err(bad(&f("protocol"), format!("`{p}`: tcp, http, https or grpc")));
        }
    }
    Ok(())
}

/// Where a request's mounts appear to its processes: a target path the agents accept, a source
/// they can mount, an access mode. (Their sizes and tiers are the one request model's.)
fn check_mount_targets(data: Option<&DataIn>) -> Result<(), FieldError> {
    for (i, m) in data.iter().flat_map(|d| d.mounts.iter()).enumerate() {
        let f = |x: &str| format!("data.mounts[{i}].{x}");
        if let Some(t) = &m.target {
            lattice_agent_protocol::valid_target(t).map_err(|e| bad(&f("target"), format!("`{t}`: {e}")))?;
            if !m.source.contains("://") {
                return Err(bad(
                    &f("source"),
                    format!(
                        "`{}`: a mounted source is SCHEME://PATH (nfs://home/alice, s3://bucket/key)",
                        m.source
                    ),
                ));
            }
        }
        match m.access.as_deref() {
            None | Some("read-only" | "read-write") => {}
            Some(a) => return Err(bad(&f("access"), format!("`{a}`: read-only or read-write"))),
        }
    }
    Ok(())
}

/// The control plane's names for the one request model: its tenants, projects and vClusters (a
/// vCluster must exist), its node count, its allocations by name, and — without a VAST service to
/// ask — data taken to be where it is wanted.
struct ControlNames<'a> {
    c: &'a mut Control,
    /// Dependencies that ended before this control plane took over, their condition met: the start
    /// waits only for their ends to be durable.
    prior: Vec<String>,
}

impl lattice_traces::request::Names for ControlNames<'_> {
    fn tenant(&mut self, name: &str) -> lattice_engine::TenantId {
        self.c.tenant_id(name)
    }

    fn project(&mut self, tenant: &str, name: &str) -> lattice_engine::ProjectId {
        self.c.registry.project_id(tenant, name)
    }

    fn vcluster(&mut self, name: Option<&str>) -> Result<lattice_engine::VClusterId, String> {
        let name = name.unwrap_or(&self.c.registry.default_vcluster);
        self.c.registry.vclusters.get(name).copied().ok_or_else(|| {
            format!(
                "vCluster \"{name}\" not found. Available: {}",
                self.c.registry.vclusters.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }

    fn cluster_nodes(&self) -> Option<u32> {
        Some(self.c.registry.node_names.len() as u32)
    }

    /// A reference that ended before this control plane took over is decided by its outcome now
    /// (met: no dependency, the start waits for its end to be durable; never met: refused).
    fn dependency(
        &mut self,
        reference: &str,
        condition: lattice_traces::request::Condition,
    ) -> Result<Option<lattice_engine::Dependency>, String> {
        let Some(condition) = condition.engine() else {
            return Err(format!(
                "ref `{reference}`: `corresponding` relates two task groups of a trace; name each element"
            ));
        };
        if !self.c.registry.by_name.contains_key(reference)
            && let Some(v) = self.c.registry.history.get(reference)
        {
            let ok = v.end_reason.as_deref() == Some("success");
            let met = match condition {
                lattice_engine::DependencyCondition::Success => ok,
                lattice_engine::DependencyCondition::Failure => !ok,
                lattice_engine::DependencyCondition::Any => true,
            };
            if met {
                self.prior.push(reference.to_string());
                return Ok(None);
            }
            let named = match condition {
                lattice_engine::DependencyCondition::Success => "success",
                lattice_engine::DependencyCondition::Failure => "failure",
                lattice_engine::DependencyCondition::Any => "any",
            };
            return Err(format!(
                "ref `{reference}` already ended ({}): condition `{named}` can never be met",
                v.state
            ));
        }
        let on = *self
            .c
            .registry
            .by_name
            .get(reference)
            .ok_or_else(|| format!("ref `{reference}`: no such allocation"))?;
        Ok(Some(lattice_engine::Dependency { on, condition }))
    }

    fn located(&mut self, _source: &str, hint: Option<lattice_engine::Tier>) -> lattice_engine::Tier {
        hint.unwrap_or(lattice_engine::Tier::Hot)
    }
}
