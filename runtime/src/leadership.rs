//! Leadership: a member that gains it adopts the queue (the majority's mirrored copies, the quorum's
//! assignments) into a fresh control plane; one that loses it drops its engine state. Also the
//! leader's upkeep of its mirror: submissions mirrored again until a majority holds them, idempotency
//! keys settled, ended records pruned.

use crate::context::{Shared, propose_retried};
use crate::effects::record_ended;
use anyhow::Result;
use lattice_adapters::QuorumCommand;
use lattice_control::Control;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Brings this member's control plane in line with its Raft role (adopting the mirror when it has just
/// become the leader); whether it leads.
pub async fn sync_leadership(shared: &Shared) -> bool {
    let mut leading = shared.leading.lock().await;
    let term = shared.member.leader_term();
    // A new term is a new leadership, also when this member leads again: another leader may have
    // acknowledged work in between, and what this one could not record must be taken over again.
    if term != *leading {
        if let Err(e) = leadership_changed(shared, term.is_some()).await {
            // Not serving until the queue is adopted (tried again at the next pass or request).
            tracing::warn!("taking over the queue: {e:#}");
            return false;
        }
        *leading = shared.control.lock().await.adopted_term;
        return leading.is_some() && *leading == shared.member.leader_term();
    }
    term.is_some()
}

/// A member that gains leadership merges the other members' copies of the queue into its own, then
/// starts from a fresh engine and adopts the result ([`crate::mirror`]): ended allocations as their
/// final records, the others queued again under their ids — re-attached to the nodes the quorum still
/// gives them (their agents kept running them), or run again when that fails. Nodes the quorum gives
/// to allocations nobody runs any more are freed. One that loses leadership drops its engine state
/// (the new leader owns the queue now).
async fn leadership_changed(shared: &Shared, leader: bool) -> Result<()> {
    let mut control = (shared.fresh_control)()?;
    crate::openchami::sync::join(shared, &mut control, false);
    if !leader {
        *shared.control.lock().await = control;
        tracing::info!("no longer the leader: the queue is the new leader's");
        return Ok(());
    }
    // What the others hold that this member missed (e.g. while it was down): a majority's copies,
    // each fenced against the leaders before this term first.
    let term = shared
        .member
        .leader_term()
        .ok_or_else(|| anyhow::anyhow!("lost leadership while taking over"))?;
    let promised = shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).promise(term);
    promised.wait().await.map_err(anyhow::Error::msg)?;
    // Everything earlier leaders committed is applied here first (a start they proposed may
    // commit only now, with this term's first entry): the node ownership read below is then whole.
    shared
        .member
        .confirm_leader()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // A member that leads again after a restart, in the term it led before, may not have applied
    // what it committed then (its committed index is a hint it can lose): a write now commits and
    // applies everything before it (found by DST: a drain was read as absent after a cluster crash).
    shared
        .member
        .propose(QuorumCommand::Barrier)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Where clients reach this leader: the others name it in their 421 answers.
    let known = shared
        .member
        .read(|q| q.member_urls.get(&shared.member.id).cloned())
        .await;
    if known.as_deref() != Some(shared.rest_url.as_str()) {
        let cmd = QuorumCommand::MemberUrl {
            id: shared.member.id,
            url: shared.rest_url.clone(),
        };
        shared.member.propose(cmd).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    end_open_sessions(shared).await;
    let copies = crate::mirror::net::fetch_all(shared, term, std::time::Duration::from_secs(1))
        .await
        .map_err(anyhow::Error::msg)?;
    tracing::debug!(
        "member {} takes over in term {term}: its copy's max id {}; the others' {:?}",
        shared.member.id,
        shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).max_id,
        copies.iter().map(|c| c.max_id).collect::<Vec<_>>()
    );
    for snap in copies {
        tracing::trace!(
            "m{} term {term}: a copy's records: {:?}",
            shared.member.id,
            snap.entries
                .values()
                .map(|e| (
                    e.id.clone(),
                    e.term,
                    e.origin,
                    e.submitted_ms,
                    e.ended.as_ref().map(|v| v.state.clone())
                ))
                .collect::<Vec<_>>()
        );
        let durable = shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).merge(snap);
        durable.wait().await.map_err(anyhow::Error::msg)?;
    }
    // Hold the control lock while adopting: a submission either lands before (and is in the mirror)
    // or after (in the new engine).
    let mut current = shared.control.lock().await;
    let snap = shared.mirror.lock().unwrap_or_else(|e| e.into_inner()).snapshot();
    tracing::debug!(
        "member {} adopts term {term}: max id {}, entries {:?}",
        shared.member.id,
        snap.max_id,
        snap.entries.keys().collect::<Vec<_>>()
    );
    control.ids_above(snap.max_id);
    tracing::trace!(
        "m{} term {term}: adopting {:?}",
        shared.member.id,
        snap.entries
            .values()
            .map(|e| (e.id.clone(), e.term, e.kept, e.ended.as_ref().map(|v| v.state.clone())))
            .collect::<Vec<_>>()
    );
    let held = shared.member.read(|q| q.assignments.clone()).await;
    // Nodes the quorum gives to allocations: all of them known here (SMD may have gained some).
    let named: std::collections::BTreeSet<String> = held.values().flat_map(|a| a.nodes.iter().cloned()).collect();
    crate::openchami::sync::join_named(shared, &mut control, &named).await;
    let mut attached = std::collections::BTreeSet::new();
    let (mut adopted, mut ended, mut rerun) = (0, 0, 0);
    // Submissions by idempotency key (tenant, key) → base ids, each with the newest term that kept
    // it (see `Entry::kept`).
    let mut keyed: BTreeMap<(String, String), Vec<(String, u64)>> = BTreeMap::new();
    // Members of a DAG attempt a later leader overwrote in part were never acknowledged: they are
    // cancelled, and their keys are the retry's to take.
    let stranded = snap.stranded_dag_members();
    for e in snap.entries.into_values() {
        let stranded_here = stranded.contains(&e.id);
        // A retry with an adopted submission's idempotency key still gets its id — once its record
        // is mirrored again (this copy may be the only one that has it).
        if !stranded_here {
            control.remember_key(&e.req, &e.id);
        }
        if e.req.idempotency_key.is_some() && !stranded_here {
            control.unacked(
                lattice_control::group_element(&e.id).map_or(e.id.as_str(), |(b, _)| b),
                false,
            );
        }
        // Ended ones count too: a retry may have run (and ended) while an earlier attempt waited
        // in a copy this member had not read; that attempt must not run now.
        if let Some(k) = e.req.idempotency_key.as_ref().filter(|_| !stranded_here) {
            let base = lattice_control::group_element(&e.id)
                .map_or(e.id.as_str(), |(b, _)| b)
                .to_string();
            let ids = keyed.entry((e.req.tenant.clone(), k.clone())).or_default();
            match ids.iter_mut().find(|(b, _)| *b == base) {
                Some((_, t)) => *t = (*t).max(e.kept_term()),
                None => ids.push((base, e.kept_term())),
            }
        }
        if let Some(v) = e.ended {
            control.add_ended(v);
            ended += 1;
            continue;
        }
        let mut req = e.req;
        // Dependencies that ended before are judged by their final records (at submission);
        // unknown ones (forgotten) count as satisfied.
        req.depends_on
            .retain(|d| control.id_of(&d.reference).is_some() || control.view_named(&d.reference).is_some());
        let mut unmet = false;
        match control.submit_named(req.clone(), Some(&e.id)) {
            Ok(_) => adopted += 1,
            Err(err) if err.field.starts_with("depends_on") && err.message.contains("can never be met") => {
                // A dependency ended so that it can never run, and its own end (cancelled, as the
                // engine ends such a dependent) was not recorded before the fail-over: it is adopted
                // and ends so now — an acknowledged allocation is never dropped (found by DST).
                req.depends_on.retain(|d| control.id_of(&d.reference).is_some());
                if let Err(err) = control.submit_named(req, Some(&e.id)) {
                    tracing::warn!("could not adopt {}: {err}", e.id);
                    continue;
                }
                adopted += 1;
                unmet = true;
            }
            Err(err) => {
                tracing::warn!("could not adopt {}: {err}", e.id);
                continue;
            }
        }
        control.resubmitted(&e.id, e.submitted_ms);
        if unmet || stranded_here {
            control.cancel(&e.id);
            if stranded_here {
                tracing::info!(
                    "{}: its DAG attempt was never acknowledged (a later leader reused its numbers); cancelled",
                    e.id
                );
            } else {
                tracing::info!("{}: a dependency ended unmet; cancelled", e.id);
            }
            continue;
        }
        if let Some(a) = held.get(&e.id) {
            // Exits of an earlier run (before a requeue) do not count for this one.
            let exits = if e.exits_run == a.since_ms {
                e.exits.clone()
            } else {
                BTreeMap::new()
            };
            let vni = a.network.as_ref().map(|g| g.vni);
            match control.reattach(&e.id, &a.nodes, (a.since_ms, e.submitted_ms), &exits, vni) {
                Ok(()) => {
                    attached.insert(e.id.clone());
                    if let Some(service) = &a.cxi_service {
                        control.cxi_recorded(&e.id, service);
                    }
                }
                Err(err) => {
                    tracing::warn!("{err}; it runs again");
                    rerun += 1;
                }
            }
        }
    }
    for (id, members) in snap.dags {
        control.add_dag(&id, members);
    }
    // Allocations whose held nodes are freed here (run again, or not adopted): their agents may
    // still run them there; a next start waits until those show they stopped.
    for (alloc, a) in held.iter().filter(|(a, _)| !attached.contains(*a)) {
        control.stopping_on_nodes(alloc, &a.nodes);
    }
    settle_keys(&mut control, &keyed);
    control.await_agents();
    adopt_decision_state(shared, &mut control).await;
    record_missing_claims(shared, &control, &held, &attached).await;
    control.adopted_term = Some(term);
    // Nodes held for allocations that are not running here any more are freed (not `release`: that
    // reads the control plane, whose lock is held here).
    for alloc in held.keys().filter(|a| !attached.contains(*a)) {
        propose_retried(shared, QuorumCommand::Release { alloc: alloc.clone() }).await;
    }
    *current = control;
    drop(current);
    shared.wake.notify_one();
    tracing::info!(
        "leader: adopted {adopted} allocation(s) from the durable queue ({} re-attached to their nodes, {rerun} run again) and {ended} ended record(s)",
        attached.len()
    );
    Ok(())
}

/// What decisions read that the quorum holds, into a new leader's control plane: operators'
/// standing orders, tenants' and projects' contracts, vClusters' weights and configurations, the
/// site settings, and the capabilities agents discovered.
/// At a take-over: the sensitive terminal sessions still open in the audit log are ended there
/// (`attach_end (leader changed)`). Sensitive sessions are opened at the leader and end when their
/// member stops leading, so none of them still runs; the allocations can be attached to again.
async fn end_open_sessions(s: &Shared) {
    let open = s.member.read(|q| q.open_sessions()).await;
    for (alloc, detail) in open {
        let cmd = crate::context::audit_command(s, "lattice", &alloc, "attach_end (leader changed)", detail);
        if let Err(e) = s.member.propose(cmd).await {
            tracing::warn!("could not end {alloc}'s terminal session in the audit log: {e}");
        }
    }
}

/// At a take-over: a sensitive claim running on its nodes whose `claim` entry is not in the audit
/// log yet (the leader that placed it stopped leading before the entry committed) gets it now,
/// stamped with when the quorum gave it its nodes — before this leader can audit its release, so
/// the trail reads claim before release (found by DST). The old leader's entry, should it still
/// arrive, is refused by the quorum as a second claim.
async fn record_missing_claims(
    shared: &Shared,
    control: &Control,
    held: &BTreeMap<String, lattice_adapters::quorum_state::Assignment>,
    attached: &std::collections::BTreeSet<String>,
) {
    let claims: Vec<(&String, &lattice_adapters::quorum_state::Assignment)> = held
        .iter()
        .filter(|(id, a)| a.sensitive && !a.claim_audited && attached.contains(*id))
        .collect();
    if claims.is_empty() {
        return;
    }
    let missing: Vec<(String, u64, String)> = shared
        .member
        .read(|q| {
            // Entries older than the held log are in the archive: a claim that old was written.
            let held_from = if q.audit_archive.is_empty() {
                0
            } else {
                q.audit.first().map_or(u64::MAX, |e| e.at_ms)
            };
            claims
                .iter()
                .filter(|(id, a)| {
                    a.since_ms >= held_from && !q.audit.iter().any(|e| &e.alloc == *id && e.action == "claim")
                })
                .map(|(id, a)| ((*id).clone(), a.since_ms, a.nodes.join(",")))
                .collect()
        })
        .await;
    for (id, since_ms, nodes) in missing {
        let user = control.view_named(&id).and_then(|v| v.user).unwrap_or_default();
        let signed = lattice_engine::audit::sign(&shared.audit_key, since_ms, &user, &id, "claim", &nodes);
        let cmd = QuorumCommand::Audit {
            at_ms: since_ms,
            user,
            alloc: id.clone(),
            action: "claim".into(),
            detail: nodes,
            signed: Some(signed),
        };
        if !propose_retried(shared, cmd).await {
            tracing::error!("could not record {id}'s claim in the audit log");
        }
    }
}

async fn adopt_decision_state(shared: &Shared, control: &mut Control) {
    // Operators' standing orders (drains, disables) live at the quorum: a fail-over keeps them.
    let orders = shared.member.read(|q| q.node_admin.clone()).await;
    tracing::trace!("m{}: standing orders at adoption: {orders:?}", shared.member.id);
    for (node, o) in &orders {
        control.set_admin(node, o.drained, o.disabled);
    }
    // Tenants' contracts as the quorum committed them (the API's changes outlive fail-overs and
    // restarts; the tenants file only seeds the quorum).
    let tenants = shared.member.read(|q| q.tenants.clone()).await;
    for (name, quota) in &tenants {
        control.set_tenant(name, *quota);
    }
    let projects = shared.member.read(|q| q.projects.clone()).await;
    for (tenant, ps) in &projects {
        for (name, quota) in ps {
            control.set_project(tenant, name, *quota);
        }
    }
    // Operators' weights as the quorum committed them (over the profile's).
    let weights = shared.member.read(|q| q.weights.clone()).await;
    for (vcluster, w) in &weights {
        if let Err(e) = control.set_weights(vcluster, *w) {
            tracing::warn!("weights committed for vCluster {vcluster} not applied: {}", e.message);
        }
    }
    // What agents discovered where the inventory leaves capabilities unset (a held node takes
    // them once free).
    let discovered = shared.member.read(|q| q.discovered.clone()).await;
    for (node, fill) in discovered {
        if let Err(e) = control.apply_discovered(&node, fill) {
            tracing::warn!("capabilities recorded for node {node} not applied: {}", e.message);
        }
    }
    // The site settings decisions read, as the quorum holds them (over this member's config file).
    let held = shared.member.read(|q| q.settings.clone()).await;
    if !held.is_empty() {
        let differ = lattice_control::settings::differences(&control.settings(), &held);
        if !differ.is_empty() {
            tracing::warn!(
                "this member's config file differs from the site settings the quorum holds (in force): {}",
                differ.join("; ")
            );
        }
        control.apply_settings(&held);
    }
    // vClusters' configurations as the quorum holds them (created here when the API created them).
    let vclusters = shared.member.read(|q| q.vclusters.clone()).await;
    for (vcluster, config) in vclusters {
        if let Err(e) = control.put_vcluster(&vcluster, config) {
            tracing::warn!(
                "configuration committed for vCluster {vcluster} not applied: {}",
                e.message
            );
        }
    }
}

/// Mirrors again, whole, submissions that are not yet on a majority's disks (a retry that could not
/// be made durable, or a record adopted from a copy others may lack); each is acknowledged — and may
/// start — once a majority holds it.
pub(crate) async fn remirror_unacked(shared: &Arc<Shared>) {
    let ids = shared.control.lock().await.unacked_idle(64);
    if ids.is_empty() {
        return;
    }
    let (entries, dags) = {
        let c = shared.control.lock().await;
        let m = shared.mirror.lock().unwrap_or_else(|e| e.into_inner());
        let entries: Vec<crate::mirror::Entry> = ids
            .iter()
            .flat_map(|id| {
                let members = c.group_members(id);
                if members.is_empty() { vec![id.clone()] } else { members }
            })
            .filter_map(|n| m.entries.get(&lattice_control::id_number(&n)?).cloned())
            .collect();
        // The DAGs they belong to: their records may be on as few copies as the members'.
        (entries, c.dags_of(&ids))
    };
    {
        let mut c = shared.control.lock().await;
        for id in &ids {
            c.unacked(id, true);
        }
    }
    let (op, term, durable) = crate::mirror::net::record(shared, crate::mirror::MirrorOp::Entries { entries, dags });
    let (disk, peers) = tokio::join!(
        durable.wait(),
        crate::mirror::net::replicate(shared, &op, term, std::time::Duration::from_secs(1))
    );
    tracing::trace!(
        "m{}: mirrored {ids:?} again: disk {disk:?}, a majority {peers}",
        shared.member.id
    );
    let mut c = shared.control.lock().await;
    for id in &ids {
        if disk.is_ok() && peers {
            c.acked(id);
        } else {
            c.unacked(id, false);
        }
    }
    if disk.is_ok() && peers {
        shared.wake.notify_one();
    }
}

/// After adoption: one allocation per idempotency key, and each still to be acknowledged. Two
/// queued under one key means a retry reached a leader that had not seen the first attempt; the
/// first was then never on a majority's disks (a majority's copies are read before a leader serves,
/// and older leaders are fenced), so it was never acknowledged: the one the newest term mirrored is
/// kept, the others are cancelled. The kept one is mirrored again when its client retries (it may be on fewer than a
/// majority's disks).
fn settle_keys(control: &mut Control, keyed: &BTreeMap<(String, String), Vec<(String, u64)>>) {
    for ((tenant, key), ids) in keyed {
        let mut ids = ids.clone();
        // The attempt a newer term kept is the one that can have been acknowledged: a leader
        // reads a majority's copies before it acknowledges anything, so it saw every attempt
        // acknowledged before its term and kept (and re-mirrored) that one; an attempt only an
        // isolated leader's copy holds was never on a majority. Isolated leaders hand out numbers
        // independently, so the highest number proves nothing (found by DST: seed 89 of
        // isolate-leader without agents), and the term that recorded an attempt's end proves
        // nothing either: it may have cancelled it as never acknowledged (seed 59). One term keeps
        // at most one attempt per key; the number breaks ties between records written before
        // terms were kept.
        ids.sort_by_key(|(i, t)| (*t, lattice_control::id_number(i).unwrap_or(0)));
        if ids.len() > 1 {
            tracing::debug!("key {key} of {tenant}: attempts (id, term) {ids:?}");
        }
        let Some((keep, _)) = ids.pop() else { continue };
        for (dup, _) in ids {
            let members = control.group_members(&dup);
            let names = if members.is_empty() { vec![dup.clone()] } else { members };
            for n in names {
                control.cancel(&n);
            }
            tracing::warn!(
                "{dup}: superseded by {keep}, a retry with the same idempotency key of {tenant} ({key}); cancelled"
            );
        }
        control.set_key(tenant, key, &keep);
        control.unacked(&keep, false);
    }
}

/// Records allocations that ended in the mirrors, with their final state (this member's durably,
/// before it returns; the others' in the background).
pub(crate) async fn prune_mirror(shared: &Arc<Shared>) {
    let ended = {
        let c = shared.control.lock().await;
        let m = shared.mirror.lock().unwrap_or_else(|e| e.into_inner());
        c.ended_among(m.active())
    };
    record_ended(shared, ended).await;
}
