//! Carrying out the controller's decisions in the real world ([`execute`]: one exhaustive `match`
//! on [`Action`]): quorum proposals and their answers, releases (once an end is on a majority's
//! disks), launches, preemptions, checkpoints, wipes and hardened boots, VAST prefetches, the fabric
//! manager, and the simulated agents' runs.

use crate::context::{Shared, audit, propose_retried};
use crate::openchami::boot;
use lattice_adapters::{QuorumCommand, QuorumResponse};
use lattice_control::PendingProposal;
use lattice_control::world::Action;
use lattice_engine::{AllocId, AllocState, EndReason, PreemptHow, Time};
use std::sync::Arc;

/// Carries out the controller's decisions in order (one exhaustive `match`): quorum proposals
/// (whose answers go back to the controller, and what those cause is carried out next), releases,
/// scale changes, audit entries, launches, preemptions, checkpoint hints and wipes.
pub fn execute(
    shared: Arc<Shared>,
    actions: Vec<Action>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let mut queue: std::collections::VecDeque<Action> = actions.into();
        while let Some(a) = queue.pop_front() {
            match a {
                Action::Propose(p) => {
                    // Consecutive starts go to the quorum together, in one log entry.
                    let mut starts = vec![p];
                    while starts.len() < START_BATCH {
                        match queue.pop_front() {
                            Some(Action::Propose(p)) => starts.push(p),
                            Some(other) => {
                                queue.push_front(other);
                                break;
                            }
                            None => break,
                        }
                    }
                    queue.extend(propose_starts(&shared, starts).await)
                }
                // The owner reads why in the allocation's `last_rejection` (set by the control plane).
                Action::Refuse { name, message, .. } => tracing::debug!("{name}: {message}"),
                // The loop's `settle_ends` records it on a majority: wake it for that.
                Action::Persist { name, .. } => {
                    tracing::trace!("{name}: its end is to be put on a majority");
                    shared.wake.notify_one();
                }
                Action::Release { name, .. } => {
                    release(&shared, name).await;
                    shared.wake.notify_one();
                }
                Action::Scale { name, node, added, .. } => {
                    let cmd = QuorumCommand::Scale {
                        alloc: name.clone(),
                        node: node.clone(),
                        added,
                    };
                    match shared.member.propose(cmd).await {
                        Ok(QuorumResponse::Applied | QuorumResponse::Batch(_)) => {}
                        Ok(QuorumResponse::Rejected { message, .. }) => {
                            tracing::warn!("{name}: scaling by {node} rejected: {message}")
                        }
                        Err(e) => tracing::warn!("{name}: scaling by {node}: {e}"),
                    }
                }
                Action::Audit {
                    user,
                    name,
                    event,
                    nodes,
                    note,
                    ..
                } => {
                    if shared.bugs.audit_drops_release && event == lattice_engine::AuditEvent::Release {
                        continue;
                    }
                    let mut detail = nodes.join(",");
                    if !note.is_empty() {
                        detail = format!("{detail}; {note}");
                    }
                    audit(&shared, &user, &name, event.as_str(), detail).await
                }
                Action::Launch {
                    alloc,
                    name,
                    nodes,
                    vni,
                    resume_from,
                    staging_remaining_s: _,
                } => {
                    if let (Some(vni), Some(_)) = (vni, &shared.fabric) {
                        tokio::spawn(setup_fabric(shared.clone(), name.clone(), vni, nodes));
                    }
                    if shared.simulate_agents {
                        let run = shared.control.lock().await.simulated_run(alloc, resume_from);
                        tokio::spawn(simulated_run(shared.clone(), alloc, run));
                    }
                    // Real agents get the launch (with its resume point) at their next poll.
                }
                // Real agents see at their next poll that the run is no longer theirs; a simulated
                // run sees it is over.
                Action::Stop { name, why, .. } => tracing::debug!("{name}: its agents stop it ({why:?})"),
                // The deadline is kept by the control plane (`check_agents` applies it).
                Action::Watch { .. } => {}
                Action::Drift {
                    name,
                    drifted,
                    sensitive,
                    message,
                    claim,
                    ..
                } => {
                    if drifted {
                        tracing::warn!("{name}: conformance drift ({message}): drained, remediation asked");
                    } else {
                        tracing::info!("{name}: conforms to its baseline again");
                    }
                    if sensitive {
                        let action = if drifted { "drift" } else { "conformant" };
                        let detail = format!("{name} {message}");
                        audit(&shared, "lattice", claim.as_deref().unwrap_or(""), action, detail).await;
                    }
                    if let Some(oc) = &shared.openchami {
                        let flag = boot::flag_drift(shared.clone(), oc.clone(), name, drifted, message);
                        tokio::spawn(flag);
                    }
                }
                Action::Preempt { name, order } => {
                    let (alloc, how, at) = (order.alloc, order.how, order.at);
                    if shared.simulate_agents {
                        tokio::spawn(simulated_preempt(shared.clone(), alloc, how, at));
                    } else {
                        // Real agents get it at their next poll (from `at`): they checkpoint by the
                        // allocation's mechanism and stop it, or stop it, and report how it stopped.
                        tracing::debug!("{name}: its agents preempt it ({how:?})");
                    }
                }
                Action::Checkpoint { alloc, name } => {
                    if shared.simulate_agents {
                        // A simulated application writes its checkpoint at once.
                        let mut c = shared.control.lock().await;
                        c.checkpointed(alloc, true);
                        queue.extend(c.take_actions());
                    } else {
                        tracing::debug!("{name}: checkpoint hint for its agents (they report its outcome)");
                    }
                }
                Action::Wipe { alloc, name, nodes } => {
                    if let (Some(oc), Some(w), false) =
                        (&shared.openchami, &shared.openchami_wipe, shared.simulate_agents)
                    {
                        for node in nodes {
                            let (s, wipe) = (
                                shared.clone(),
                                boot::wipe(shared.clone(), oc.clone(), w.clone(), name.clone(), node),
                            );
                            tokio::spawn(async move { execute(s, wipe.await).await });
                        }
                    } else if shared.simulate_agents {
                        tokio::spawn(simulated_wipe(shared.clone(), alloc, nodes, shared.wipe_time));
                    } else {
                        // Each node's agent runs the site's wipe command at its next poll and reports:
                        // told only now, after the actions before this one (the release's audit entry).
                        shared.control.lock().await.wipe_orders_out(alloc);
                        tracing::info!("{name}: its agents wipe {}", nodes.join(","));
                    }
                }
                Action::Boot { name, nodes, .. } => match (&shared.openchami, &shared.openchami_hardened) {
                    (Some(oc), Some(image)) => {
                        for node in nodes {
                            let (s, booting) = (
                                shared.clone(),
                                boot::harden(shared.clone(), oc.clone(), image.clone(), name.clone(), node),
                            );
                            tokio::spawn(async move { execute(s, booting.await).await });
                        }
                    }
                    // The controller only boots with a hardened image configured.
                    _ => tracing::warn!("{name}: a hardened boot without OpenCHAMI's hardened image"),
                },
            }
        }
    })
}

/// A simulated agent stops a preempted allocation when its sequence starts: a simulated application
/// writes its checkpoint at once and stops; one without checkpoints honours the SIGTERM at once; one
/// that cannot write its checkpoint (storage down) is killed.
async fn simulated_preempt(shared: Arc<Shared>, alloc: AllocId, how: PreemptHow, at: Time) {
    let wait = {
        let c = shared.control.lock().await;
        at.0.saturating_sub(c.now().0)
    };
    let mut stopped = shared.stopped.clone();
    tokio::select! {
        _ = tokio::time::sleep(std::time::Duration::from_millis(wait)) => {}
        _ = stopped.changed() => return,
    }
    let actions = {
        let mut c = shared.control.lock().await;
        match how {
            PreemptHow::CheckpointThenStop { .. } => {
                c.suspended(alloc, true);
            }
            PreemptHow::Stop { .. } => {
                c.suspended(alloc, false);
            }
            PreemptHow::Kill { .. } => {
                c.completed(alloc, EndReason::PreemptionKilled);
            }
        }
        c.take_actions()
    };
    execute(shared.clone(), actions).await;
    shared.wake.notify_one();
}

/// A simulated secure wipe: the nodes come back after `took`.
async fn simulated_wipe(shared: Arc<Shared>, alloc: AllocId, nodes: Vec<String>, took: std::time::Duration) {
    let mut stopped = shared.stopped.clone();
    tokio::select! {
        _ = tokio::time::sleep(took) => {}
        _ = stopped.changed() => return,
    }
    let actions = {
        let mut c = shared.control.lock().await;
        c.simulated_wiped(alloc, &nodes);
        c.take_actions()
    };
    execute(shared.clone(), actions).await;
    shared.wake.notify_one();
}

/// Records `ended` in the mirrors and waits until a majority holds it (up to `attempts` tries of
/// a second each, while this member leads).
async fn record_ended_on_majority(shared: &Arc<Shared>, ended: Vec<String>, attempts: u32) -> bool {
    for _ in 0..attempts {
        if shared.member.leader_term().is_none() {
            return false;
        }
        let Some(op) = ended_op(shared, ended.clone()).await else {
            return false;
        };
        let (op, term, durable) = crate::mirror::net::record(shared, op);
        let (disk, peers) = tokio::join!(
            durable.wait(),
            crate::mirror::net::replicate(shared, &op, term, std::time::Duration::from_secs(1))
        );
        if disk.is_ok() && peers {
            let ids = ended_ids(&op);
            shared.control.lock().await.ends_settled(&ids);
            return true;
        }
        tracing::debug!("recording the end of {ended:?} in term {term}: own disk {disk:?}, a majority: {peers}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    false
}

/// The mirror op recording `ended` with their final records — only from the control plane that
/// adopted the queue in the term this member leads, and only allocations it knows: one it does not
/// know (a control plane replaced by a leadership change meanwhile) is no reason to touch the
/// record, which may be another leader's acknowledged allocation.
async fn ended_op(shared: &Arc<Shared>, ended: Vec<String>) -> Option<crate::mirror::MirrorOp> {
    let c = shared.control.lock().await;
    if c.adopted_term.is_none() || c.adopted_term != shared.member.leader_term() {
        return None;
    }
    // Only ended ones: a retried recording may find one running again (re-attached in a new term).
    let views: Vec<_> = ended
        .iter()
        .filter_map(|id| c.view_named(id))
        .filter(|v| matches!(v.state.as_str(), "completed" | "failed" | "cancelled"))
        .collect();
    let entries = shared
        .mirror
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ended_entries(views);
    (!entries.is_empty()).then_some(crate::mirror::MirrorOp::Entries {
        entries,
        dags: Vec::new(),
    })
}

/// Records `ended` (allocations that ended, or that this control plane does not know) in the mirrors
/// with their final state: this member's durably before it returns, the others' in the background.
pub(crate) async fn record_ended(shared: &Arc<Shared>, ended: Vec<String>) {
    if ended.is_empty() {
        return;
    }
    let Some(op) = ended_op(shared, ended).await else {
        return;
    };
    let (op, term, durable) = crate::mirror::net::record(shared, op);
    if let Err(e) = durable.wait().await {
        tracing::error!("recording ended allocations: {e}");
        return;
    }
    let s = shared.clone();
    tokio::spawn(async move {
        if crate::mirror::net::replicate(&s, &op, term, std::time::Duration::from_secs(1)).await {
            let ids = ended_ids(&op);
            s.control.lock().await.ends_settled(&ids);
        }
    });
}

/// The allocations a mirrored end record names.
fn ended_ids(op: &crate::mirror::MirrorOp) -> Vec<String> {
    match op {
        crate::mirror::MirrorOp::Entries { entries, .. } => entries.iter().map(|e| e.id.clone()).collect(),
        _ => Vec::new(),
    }
}

/// Records on a majority the ends dependents wait for (ends adopted from this member's own copy, or
/// recorded in the background and not yet confirmed).
pub(crate) async fn settle_ends(shared: &Arc<Shared>) {
    let wanted = shared.control.lock().await.take_settle_wanted();
    if wanted.is_empty() {
        return;
    }
    if record_ended_on_majority(shared, wanted.clone(), 1).await {
        shared.control.lock().await.ends_settled(&wanted);
        shared.wake.notify_one();
    }
}

/// Starts proposed in one quorum log entry at most (a pass's starts, group-committed).
const START_BATCH: usize = 512;

/// Proposes starts to the quorum — several as one [`QuorumCommand::Batch`], one commit for all —
/// and tells the controller each answer in order; what those cause (launches, a claim's audit
/// entry) is returned to be carried out next.
async fn propose_starts(shared: &Arc<Shared>, starts: Vec<PendingProposal>) -> Vec<Action> {
    let at_ms = shared.control.lock().await.now().0;
    let mut cmds: Vec<QuorumCommand> = starts
        .iter()
        .map(|p| QuorumCommand::Assign {
            alloc: p.name.clone(),
            tenant: p.tenant.clone(),
            nodes: p.nodes.clone(),
            sensitive: p.sensitive,
            at_ms,
            project: p.project.clone(),
            network: p
                .network
                .clone()
                .map(|(domain, vni)| lattice_adapters::NetworkGrant { domain, vni }),
        })
        .collect();
    let n = cmds.len();
    let t0 = std::time::Instant::now();
    let answers: Vec<Result<QuorumResponse, String>> = if n == 1 {
        vec![shared.member.propose(cmds.remove(0)).await.map_err(|e| e.to_string())]
    } else {
        match shared.member.propose(QuorumCommand::Batch { commands: cmds }).await {
            Ok(QuorumResponse::Batch(rs)) if rs.len() == n => rs.into_iter().map(Ok).collect(),
            Ok(other) => vec![Err(format!("the quorum answered a batch of {n} starts with {other:?}")); n],
            Err(e) => vec![Err(e.to_string()); n],
        }
    };
    shared.metrics.commit(t0.elapsed());
    let mut next = Vec::new();
    for (p, r) in starts.into_iter().zip(answers) {
        next.extend(start_answered(shared, p, r).await);
    }
    next
}

/// Tells the controller the quorum's answer `r` to the start `p`; what that causes.
async fn start_answered(shared: &Arc<Shared>, p: PendingProposal, r: Result<QuorumResponse, String>) -> Vec<Action> {
    let mut c = shared.control.lock().await;
    tracing::trace!(
        "m{}: start of {} on {:?}: {r:?} (incarnation {} now {})",
        shared.member.id,
        p.name,
        p.nodes,
        p.incarnation,
        c.incarnation
    );
    if c.incarnation != p.incarnation {
        // The control plane that proposed it is gone (a leadership change). A start that committed
        // anyway is undone unless the new one took it over (it adopted after the commit and runs it).
        let runs_here = c
            .view_named(&p.name)
            .is_some_and(|v| v.state == "running" && v.nodes == p.nodes);
        drop(c);
        if matches!(r, Ok(QuorumResponse::Applied)) && !runs_here {
            release_stale(shared, &p.name).await;
        }
        return Vec::new();
    }
    match r {
        Ok(QuorumResponse::Applied) => {
            shared.metrics.placements.inc();
            shared.metrics.proposals.with_label_values(&["accepted"]).inc();
            c.committed(p.alloc);
        }
        Ok(QuorumResponse::Batch(_)) => c.rejected(p.alloc, "the quorum answered a start with a batch".into()),
        Ok(QuorumResponse::Rejected { reason, message }) => {
            shared.metrics.proposals.with_label_values(&["rejected"]).inc();
            tracing::info!("quorum rejected {} ({reason}): {message}", p.name);
            c.rejected(p.alloc, message);
            if reason == "duplicate" {
                // The quorum still holds nodes for it from a start whose answer was lost (or that
                // committed only after a leadership change): it runs nowhere, so those are freed and
                // it is proposed again.
                drop(c);
                release_stale(shared, &p.name).await;
                return shared.control.lock().await.take_actions();
            }
        }
        Err(e) => c.rejected(p.alloc, e),
    }
    c.take_actions()
}

/// Asks VAST to bring a staging allocation's data to the hot tier; a failure is a staging failure
/// (asked again next cycle, up to the retry limit).
pub(crate) async fn prefetch(shared: Arc<Shared>, name: String, sources: Vec<String>) {
    let Some(vast) = &shared.vast else { return };
    for src in sources {
        if let Err(e) = vast.prefetch(&src).await {
            let again = shared.control.lock().await.prefetch_failed(&name);
            let next = if again { "retrying" } else { "giving up (alert)" };
            tracing::warn!("{name}: VAST prefetch of {src}: {e}; {next}");
            shared.metrics.staging_failures.inc();
            return;
        }
    }
}

/// Creates the allocation's CXI service on its VNI and fetches its auth key; its tasks start once
/// both are there. A failure (after the client's retries) is a prologue failure: the allocation is
/// retried on other nodes.
async fn setup_fabric(shared: Arc<Shared>, name: String, vni: u32, nodes: Vec<String>) {
    let Some(fabric) = &shared.fabric else { return };
    let r = async {
        let s = fabric.create_service(&name, vni, &nodes).await?;
        let key = fabric.auth_key(&s.id).await?;
        Ok::<_, lattice_adapters::http::HttpError>((s.id, key))
    }
    .await;
    // Recorded at the quorum before its tasks launch: a new leader keeps (and revokes) this one.
    let r = match r {
        Ok((service, key)) => {
            let cmd = QuorumCommand::CxiService {
                alloc: name.clone(),
                service: service.clone(),
            };
            match shared.member.propose(cmd).await {
                Ok(_) => Ok((service, key)),
                Err(e) => {
                    // Not recorded: revoked again, and the start fails as any fabric failure does.
                    if let Err(e) = fabric.revoke(&service).await {
                        tracing::warn!("{name}: revoking CXI service {service}: {e}");
                    }
                    Err(format!("recording its CXI service at the quorum: {e}"))
                }
            }
        }
        Err(e) => Err(e.to_string()),
    };
    match r {
        Ok((service, key)) => shared.control.lock().await.cxi_ready(&name, service, key),
        Err(e) => {
            tracing::warn!("{name}: fabric manager: {e}; retrying the allocation elsewhere");
            shared.metrics.fabric_errors.inc();
            let actions = {
                let mut c = shared.control.lock().await;
                c.cxi_failed(&name);
                c.take_actions()
            };
            execute(shared.clone(), actions).await;
            shared.wake.notify_one();
        }
    }
}

/// A new leader reads the auth keys of the CXI services it took over from the quorum (their
/// allocations keep running on them); one the fabric manager no longer has is left to the end of
/// its allocation (its revoke is then a no-op).
pub(crate) async fn take_over_fabric(shared: Arc<Shared>, services: Vec<(String, String)>) {
    let Some(fabric) = &shared.fabric else { return };
    for (name, service) in services {
        match fabric.auth_key(&service).await {
            Ok(key) => shared.control.lock().await.cxi_ready(&name, service, key),
            Err(e) => tracing::warn!("{name}: CXI service {service} taken over: {e}"),
        }
    }
}

/// A simulated agent: the allocation runs for its duration (killed at its walltime, read again as
/// it runs so a `PATCH` extension counts), then completes and its nodes are released at the quorum.
/// A run whose allocation lost its nodes meanwhile (disabled node, cancel) just stops.
pub(crate) async fn simulated_run(shared: Arc<Shared>, alloc: lattice_engine::AllocId, run: std::time::Duration) {
    let started = {
        let c = shared.control.lock().await;
        c.ctl.engine.allocation(alloc).and_then(|a| a.started)
    };
    let Some(started) = started else { return };
    let mut stopped = shared.stopped.clone();
    let reason = loop {
        let (now, walltime, same_run) = {
            let c = shared.control.lock().await;
            let a = c.ctl.engine.allocation(alloc);
            (
                c.now(),
                a.and_then(|a| a.spec.lifecycle.walltime())
                    .map(|w| std::time::Duration::from_millis(w.0)),
                a.is_some_and(|a| a.state == AllocState::Running && a.started == Some(started)),
            )
        };
        if !same_run {
            return;
        }
        let (end, reason) = match walltime {
            Some(w) if w < run => (w, EndReason::WalltimeExceeded),
            _ => (run, EndReason::Success),
        };
        let elapsed = std::time::Duration::from_millis(now.0.saturating_sub(started.0));
        if elapsed >= end {
            break reason;
        }
        // Wake at the end, or within a second to see a walltime change.
        let wait = (end - elapsed).min(std::time::Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped.changed() => return,
        }
    };
    let actions = {
        let mut c = shared.control.lock().await;
        c.completed(alloc, reason);
        c.take_actions()
    };
    execute(shared.clone(), actions).await;
    shared.wake.notify_one();
}

/// Frees an allocation's nodes at the quorum (retried until a leader takes it). A sensitive claim's
/// release is audited by the controller (with its wipe).
pub async fn release(shared: &Arc<Shared>, name: String) {
    // Its end is on a majority's disks first: a restart or a fail-over between the two never runs it
    // again (a requeued one is not ended: it stays queued in the record). Until then the quorum keeps
    // its nodes, so a new leader re-attaches it (its agents report the exit again) instead of running
    // it a second time.
    let ended = shared.control.lock().await.ended_among(std::iter::once(&name));
    if !ended.is_empty() && !record_ended_on_majority(shared, ended.clone(), 10).await {
        tracing::warn!("{name}: its end is not on a majority of the members yet; its nodes stay held meanwhile");
        let shared = shared.clone();
        tokio::spawn(async move {
            // Until a majority holds it, or this member stops leading (its successor re-attaches
            // the allocation and hears of its end again).
            while !*shared.stopped.borrow() && shared.member.leader_term().is_some() {
                if record_ended_on_majority(&shared, ended.clone(), 1).await {
                    release_nodes(&shared, name).await;
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        return;
    }
    release_nodes(shared, name).await;
}

/// Frees an ended or stopped allocation's network domain, CXI service and nodes at the quorum.
async fn release_nodes(shared: &Arc<Shared>, name: String) {
    // Out of its network domain; its CXI service revoked.
    let service = shared.control.lock().await.left_network(&name);
    if let (Some(service), Some(fabric)) = (service, &shared.fabric)
        && let Err(e) = fabric.revoke(&service).await
    {
        tracing::warn!("{name}: revoking CXI service {service}: {e}");
    }
    if !propose_retried(shared, QuorumCommand::Release { alloc: name.clone() }).await {
        tracing::warn!("could not release {name} at the quorum");
    }
}

/// Frees nodes the quorum still holds for allocations this control plane knows ended (a release
/// whose proposals all failed during a leadership change would otherwise keep them forever).
pub(crate) async fn release_ended_holdings(shared: &Arc<Shared>) {
    let Some(held) = shared
        .member
        .try_read(|q| q.assignments.keys().cloned().collect::<Vec<_>>())
    else {
        return;
    };
    let ended: Vec<String> = {
        let c = shared.control.lock().await;
        let now = c.now().0;
        // Ended a while ago: its own release has had its chance.
        held.into_iter()
            .filter(|a| {
                c.view_named(a).is_some_and(|v| {
                    matches!(v.state.as_str(), "completed" | "failed" | "cancelled")
                        && v.ended_ms.is_some_and(|e| now.saturating_sub(e) > 5_000)
                })
            })
            .collect()
    };
    for name in ended {
        tracing::info!("{name}: ended, yet the quorum still holds nodes for it; releasing them");
        release_nodes(shared, name).await;
    }
}

/// Frees nodes the quorum holds for `name` from a start this control plane does not run.
async fn release_stale(shared: &Arc<Shared>, name: &str) {
    tracing::info!("{name}: freeing the nodes the quorum holds for it from a start it does not run");
    // That start's agents may run it there: its next start waits until they show it stopped.
    let nodes = shared
        .member
        .read(|q| q.assignments.get(name).map(|a| a.nodes.clone()))
        .await
        .unwrap_or_default();
    shared.control.lock().await.stopping_on_nodes(name, &nodes);
    if !propose_retried(
        shared,
        QuorumCommand::Release {
            alloc: name.to_string(),
        },
    )
    .await
    {
        tracing::warn!("could not free the stale nodes of {name} at the quorum");
    }
}
