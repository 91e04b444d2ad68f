//! Taking over what a previous agent left behind at start: the lease of its last accepted heartbeat
//! (so fencing stays on time), the exits it had not got taken, and its processes — live ones watched
//! again, ended ones reported.

use super::config::AgentConfig;
use super::files::{read_exits, read_state};
use super::output::{flush_log, tail_of};
use crate::checkpoint::{Channel, Mechanism};
use crate::client::ExitKind;
use crate::protocol::{Exit, Session};
use crate::runner::{self, Ending};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// What a previous agent left that the new one keeps: the exits its exits file holds, the live
/// processes taken over, and their checkpoint channels.
#[derive(Default)]
pub(super) struct TakenOver {
    pub(super) recorded_exits: Vec<Exit>,
    pub(super) procs: BTreeMap<String, runner::Running>,
    pub(super) channels: BTreeMap<String, (Channel, bool)>,
}

/// The agent's services a taken-over process is handed to.
pub(super) struct Watchers<'a> {
    pub(super) fence: &'a crate::fence::Fence,
    pub(super) probes: &'a crate::probe::Probes,
    pub(super) tasks: &'a crate::tasks::Tasks,
}

/// Takes over from the files beside the state file `path`: the fence renewed with the previous
/// agent's lease, its unreported exits handed to the session, each recorded process attached again
/// (and handed to the task launches, the fence and its liveness probe) or, when it has ended, its log
/// flushed, its container removed and its exit handed to the session. An unreadable exits or state
/// file is an error naming it.
pub(super) fn take_over(
    cfg: &AgentConfig,
    path: &Path,
    w: &Watchers,
    session: &mut Session,
) -> anyhow::Result<TakenOver> {
    let mut taken = TakenOver::default();
    // The lease of the last heartbeat the previous agent had accepted.
    if let Some((sent_ms, lease_ms)) = std::fs::read_to_string(path.with_extension("lease"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| Some((v["sent_ms"].as_u64()?, v["lease_ms"].as_u64()?)))
    {
        let ago = Duration::from_millis(crate::runner::wall_ms().saturating_sub(sent_ms));
        let lease = Duration::from_millis(lease_ms);
        match Instant::now().checked_sub(ago) {
            Some(sent) => w.fence.renewed(sent, lease),
            // Longer ago than this machine's uptime: over.
            None => w.fence.renewed(Instant::now(), Duration::ZERO),
        }
    }
    taken.recorded_exits = read_exits(&path.with_extension("exits"))?;
    for e in taken.recorded_exits.iter().cloned() {
        session.ended(e);
    }
    for rec in read_state(path)? {
        let id = rec.id.clone();
        match runner::attach(rec.clone()) {
            Some(r) => {
                eprintln!("lattice-agent {}: took over {id} (pid {})", cfg.node, rec.pid);
                w.tasks.alloc_started(
                    &id,
                    crate::tasks::AllocInfo {
                        env: Vec::new(),
                        pid: rec.pid,
                        mounted: rec.has_namespace(),
                        token: rec.launch_token.clone(),
                    },
                );
                if let Some(c) = Channel::reopen(&cfg.shm_dir, &id, Mechanism::parse(&rec.checkpoint)) {
                    taken.channels.insert(id.clone(), (c, false));
                }
                w.fence.watch(&id, r.stopper());
                if let Some(spec) = rec.liveness.clone() {
                    let ran = crate::runner::wall_ms().saturating_sub(rec.started_ms);
                    w.probes
                        .watch(&id, spec, "127.0.0.1".into(), r.stopper(), Duration::from_millis(ran));
                }
                taken.procs.insert(id, r);
            }
            None => {
                flush_log(cfg, &rec);
                if let Some(c) = &rec.container {
                    crate::oci::ContainerRuntime::cleanup(&cfg.oci, c);
                }
                let out = runner::ended_unwatched(&rec);
                let code = match out.ending {
                    Ending::Exited(c) => c,
                    _ => -1,
                };
                session.ended(Exit {
                    id,
                    kind: ExitKind::Exited,
                    code,
                    tail: tail_of(&out.output),
                    err_tail: tail_of(&out.errors),
                });
            }
        }
    }
    Ok(taken)
}
