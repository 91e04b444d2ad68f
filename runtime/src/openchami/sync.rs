//! Keeping the nodes in step with SMD ([`refresh`]) and joining the nodes SMD gained to a control
//! plane ([`join`], [`join_named`]).

use super::{CACHE, OpenChamiConfig, Smd, entries};
use crate::context::{Shared, sleep_unless_stopped};
use crate::effects::execute;
use lattice_adapters::openchami::Component;
use lattice_adapters::openchami::OpenChami;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Keeps the nodes in step with SMD's component states (see the module's doc).
/// `down_at_start`: the nodes SMD did not report usable when the inventory was read (they start
/// Down, and come up when SMD says so).
pub async fn refresh(
    s: Arc<Shared>,
    oc: Arc<OpenChami>,
    cfg: OpenChamiConfig,
    down_at_start: BTreeSet<String>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let period = cfg.refresh_period();
    // Nodes out of service because of SMD (only those are brought back by it).
    let mut taken: BTreeSet<String> = down_at_start;
    // Joined nodes already looked at here.
    let mut seen = 0;
    while sleep_unless_stopped(&mut stopped, period).await {
        let comps = match oc.nodes().await {
            Ok(c) => c,
            Err(e) => {
                // Book: "OpenCHAMI Unavailable": scheduling goes on with what it knows.
                tracing::warn!("OpenCHAMI SMD: {e}; node states kept as they are");
                continue;
            }
        };
        // Nodes SMD gained join on every member (one that leads later schedules on them too).
        let known = known_nodes(&s).await;
        if comps
            .iter()
            .any(|x| (x.kind.is_empty() || x.kind == "Node") && !known.contains(&x.id))
        {
            match oc.groups().await {
                Ok(groups) => learn(
                    &s,
                    &cfg,
                    &Smd {
                        components: comps.clone(),
                        groups,
                    },
                    &known,
                ),
                Err(e) => tracing::warn!("OpenCHAMI SMD groups: {e}; new nodes join at the next refresh"),
            }
        }
        // One SMD did not report usable joined Down: it is SMD's to bring back.
        {
            let joined = s.joined.lock().unwrap_or_else(|e| e.into_inner());
            taken.extend(joined[seen..].iter().filter(|e| !e.usable).map(|e| e.name.clone()));
            seen = joined.len();
        }
        if s.leading.lock().await.is_none() {
            continue;
        }
        let by_id: BTreeMap<&str, &Component> = comps.iter().map(|c| (c.id.as_str(), c)).collect();
        let mut c = s.control.lock().await;
        join(&s, &mut c, true);
        let names: Vec<String> = c.node_names().to_vec();
        for name in &names {
            let usable = by_id.get(name.as_str()).is_some_and(|x| x.usable());
            let state = c.node_state_of(name);
            if !usable && !taken.contains(name) && !matches!(state.as_deref(), Some("down" | "failed")) {
                let why = by_id.get(name.as_str()).map_or("gone from SMD".to_string(), |x| {
                    format!("SMD state {} flag {}", x.state, x.flag)
                });
                tracing::warn!("{name}: {why}: out of service");
                if c.node_op(name, lattice_control::NodeOp::Disable).is_ok() {
                    taken.insert(name.clone());
                }
            } else if usable && taken.remove(name) {
                tracing::info!("{name}: SMD reports it usable again");
                let _ = c.node_op(name, lattice_control::NodeOp::Enable);
            }
        }
        let actions = c.take_actions();
        drop(c);
        s.wake.notify_one();
        execute(s.clone(), actions).await;
    }
}

/// This member's nodes: its control plane's and those that joined since it was made.
async fn known_nodes(s: &Shared) -> BTreeSet<String> {
    let mut known: BTreeSet<String> = s.control.lock().await.node_names().iter().cloned().collect();
    let joined = s.joined.lock().unwrap_or_else(|e| e.into_inner());
    known.extend(joined.iter().map(|e| e.name.clone()));
    known
}

/// SMD's compute nodes not in `known` join this member (see [`join`]); the inventory copy in the
/// data folder is rewritten, so a restart while SMD is down starts with them.
fn learn(s: &Shared, cfg: &OpenChamiConfig, smd: &Smd, known: &BTreeSet<String>) {
    let fresh = entries(cfg, smd, known);
    if fresh.is_empty() {
        return;
    }
    for e in &fresh {
        tracing::info!("{}: joined from SMD", e.name);
    }
    s.joined.lock().unwrap_or_else(|e| e.into_inner()).extend(fresh);
    if let Ok(b) = serde_json::to_vec_pretty(smd) {
        let _ = std::fs::write(s.data_dir.join(CACHE), b);
    }
}

/// A member taking over whose quorum gives nodes it does not know to allocations (SMD gained them
/// and an earlier leader scheduled on them before this member's refresh read SMD) reads SMD at once,
/// so it re-attaches those allocations instead of running them again; `c` gets the nodes.
pub async fn join_named(s: &Shared, c: &mut lattice_control::Control, named: &BTreeSet<String>) {
    let (Some(oc), Some(cfg)) = (&s.openchami, &s.openchami_cfg) else {
        return;
    };
    if named.iter().all(|n| c.node_index(n).is_some()) {
        return;
    }
    let mut known: BTreeSet<String> = c.node_names().iter().cloned().collect();
    known.extend(
        s.joined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|e| e.name.clone()),
    );
    let smd = async {
        Ok::<_, lattice_adapters::http::HttpError>(Smd {
            components: oc.nodes().await?,
            groups: oc.groups().await?,
        })
    }
    .await;
    match smd {
        Ok(smd) => learn(s, cfg, &smd, &known),
        Err(e) => tracing::warn!("OpenCHAMI SMD: {e}; allocations on nodes this member does not know run again"),
    }
    join(s, c, false);
}

/// Adds the nodes that joined from SMD since this member started and that `c` lacks (a control
/// plane made at a leadership change starts from the inventory read at start); with `capture`,
/// they go to the trace capture.
/// A node refused here (its home vCluster has no pool of its own, or the site lacks it) is refused by
/// every later control plane of this member too: it is warned about once.
pub fn join(s: &Shared, c: &mut lattice_control::Control, capture: bool) {
    let mut joined = s.joined.lock().unwrap_or_else(|e| e.into_inner());
    for e in joined.iter_mut().filter(|e| !e.refused) {
        if c.node_index(&e.name).is_some() {
            continue;
        }
        if let Err(m) = c.add_nodes(&e.entry, e.baseline.as_deref(), capture) {
            tracing::warn!("{}: in SMD but not added: {m}", e.name);
            e.refused = true;
        }
    }
}
