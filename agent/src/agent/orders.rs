//! Carrying out what the control plane orders beyond launches: checkpoint hints by each task's
//! mechanism, image cache orders, wipes by the site's command, and prologue failures reported.

use crate::checkpoint::{Channel, GrpcResult, Mechanism};
use crate::client::ExitKind;
use crate::protocol::{Exit, Session};
use crate::runner;
use std::collections::BTreeMap;
use std::time::Instant;

/// A checkpoint in flight on this node: until when to wait, and whether a preemption waits for it
/// (then the task is stopped when it completes or times out).
pub(super) struct InFlight {
    pub(super) until: Instant,
    pub(super) preempt: bool,
}

/// Asks `id`'s task to checkpoint by its mechanism (its completion is watched by the caller): a shmem
/// flag, the gRPC callback (on its own thread; `answered` gets the id when the application completed),
/// or SIGUSR1 — the fallback of the others.
pub(super) fn request_checkpoint(
    node: &str,
    id: &str,
    p: &runner::Running,
    channels: &mut BTreeMap<String, (Channel, bool)>,
    t: crate::checkpoint::CallbackTimeouts,
    answered: &std::sync::mpsc::Sender<String>,
) {
    if let Some((c, _)) = channels.get(id) {
        c.clear_sentinel();
    }
    match channels.get_mut(id) {
        Some((c, pending)) if c.mechanism == Mechanism::Shmem => match c.request() {
            Ok(()) => *pending = true,
            Err(e) => {
                eprintln!("lattice-agent {node}: shmem hint to {id}: {e}; signalling");
                p.signal(libc::SIGUSR1);
            }
        },
        Some((c, _)) if c.mechanism == Mechanism::Grpc => {
            let (c, pgid, node, tx) = (c.clone(), p.pid, node.to_string(), answered.clone());
            std::thread::spawn(move || match crate::checkpoint::deliver_grpc(&c, pgid, t) {
                GrpcResult::Completed { deferred_s, updates } => {
                    eprintln!(
                        "lattice-agent {node}: {} checkpointed over its callback (deferred {deferred_s} s, {updates} updates)",
                        c.alloc
                    );
                    let _ = tx.send(c.alloc.clone());
                }
                GrpcResult::FellBack(why) => {
                    eprintln!("lattice-agent {node}: {}: {why}; sent SIGUSR1 instead", c.alloc)
                }
            });
        }
        _ => p.signal(libc::SIGUSR1),
    }
}

/// An allocation that could not be prepared here (its uenv or OCI image): a prologue failure, the
/// reason as its output (the control plane retries it on other nodes).
pub(super) fn prologue_failed(node: &str, session: &mut Session, id: &str, why: &str) {
    eprintln!("lattice-agent {node}: start {id}: {why}");
    session.ended(Exit {
        id: id.to_string(),
        kind: ExitKind::Prologue,
        code: 127,
        tail: String::new(),
        err_tail: why.to_string(),
    });
}

/// Carries out an image cache order: `warm` pulls the uenv into the cache (verified; `sticky` marks it
/// never to be evicted), `evict` removes it unless a running allocation has it mounted.
pub(super) fn cache_order(
    cfg: &crate::uenv::UenvConfig,
    cache: &mut crate::cache::ImageCache,
    pinned: &std::collections::BTreeSet<String>,
    o: &crate::client::CacheOrder,
) -> Result<(), String> {
    let (_, file) = crate::uenv::layout(&o.image).map_err(|e| e.to_string())?;
    match o.op.as_str() {
        "warm" => {
            crate::uenv::pull(cfg, cache, pinned, &o.image, runner::wall_ms(), false).map_err(|e| e.to_string())?;
            if o.sticky {
                cache.set_sticky(&file, true);
            }
            Ok(())
        }
        "evict" if pinned.contains(&file) => Err(format!("{} is mounted by a running allocation", o.image)),
        "evict" if !cache.entries().contains_key(&file) => Err(format!("{} is not cached here", o.image)),
        "evict" => {
            cache.evict(&file, pinned);
            Ok(())
        }
        other => Err(format!("unknown cache order {other:?}")),
    }
}

/// Runs the site's wipe command for a released claim's node; whether it succeeded.
pub(super) fn wipe(node: &str, alloc: &str, command: Option<&str>) -> bool {
    let Some(command) = command else {
        eprintln!("lattice-agent {node}: wipe after {alloc}: no --wipe-command configured; the node is quarantined");
        return false;
    };
    match std::process::Command::new("sh")
        .args(["-c", command])
        .env("LATTICE_ALLOC_ID", alloc)
        .env("LATTICE_NODE", node)
        .status()
    {
        Ok(st) if st.success() => {
            eprintln!("lattice-agent {node}: wiped after {alloc}");
            true
        }
        Ok(st) => {
            eprintln!("lattice-agent {node}: wipe after {alloc} failed ({st})");
            false
        }
        Err(e) => {
            eprintln!("lattice-agent {node}: wipe after {alloc}: {e}");
            false
        }
    }
}
