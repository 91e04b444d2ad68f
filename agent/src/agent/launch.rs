//! What an allocation handed to this node needs before its process starts: its software environment
//! (a uenv image), its data mounts, the seed's environment, a fresh scratch directory, its checkpoint
//! channel and, for an OCI image, its container. Whatever cannot be prepared is a prologue failure
//! (the control plane retries the allocation on other nodes).

use super::config::AgentConfig;
use crate::checkpoint::{Channel, Mechanism};
use crate::client::{Client, Launch};
use crate::runner::{self, RunSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The allocation's scratch directory under `root`, when its id is a plain name (never a path).
pub fn scratch_of(root: &std::path::Path, id: &str) -> Option<PathBuf> {
    let plain = !id.is_empty() && id != "." && id != ".." && !id.contains(['/', '\\', '\0']);
    plain.then(|| root.join(id))
}

/// The seed's environment for one task of an allocation. `LATTICE_NODEID` is this node's place in
/// the allocation; `LATTICE_TASK_INDEX` is a task group element's index (the seed's
/// `SLURM_ARRAY_TASK_ID`), and the node's place for an allocation outside a task group.
pub fn environment(l: &Launch, slurm: bool) -> Vec<(String, String)> {
    let task_index = l.task_group.as_ref().map_or(l.task_index, |g| g.index);
    let mut env = vec![
        ("LATTICE_ALLOC_ID".to_string(), l.id.clone()),
        ("LATTICE_NODELIST".to_string(), l.nodes.join(",")),
        ("LATTICE_NNODES".to_string(), l.nodes.len().to_string()),
        ("LATTICE_NODEID".to_string(), l.task_index.to_string()),
        ("LATTICE_TASK_INDEX".to_string(), task_index.to_string()),
        ("LATTICE_TENANT".to_string(), l.tenant.clone()),
    ];
    if let Some(g) = &l.task_group {
        env.push(("LATTICE_TASK_GROUP_ID".to_string(), g.group.clone()));
    }
    // The network domain (book: "Network Domains"): libfabric's CXI provider reads these.
    if let Some(vni) = l.vni {
        env.push(("LATTICE_VNI".to_string(), vni.to_string()));
        env.push(("SLINGSHOT_VNIS".to_string(), vni.to_string()));
    }
    if let Some(k) = &l.cxi_auth_key {
        env.push(("FI_CXI_AUTH_KEY".to_string(), k.clone()));
    }
    // Requeued after a checkpoint: the task restores its latest checkpoint (the work it kept, s).
    if let Some(s) = l.restart_from_s.filter(|s| *s > 0.0) {
        env.push(("LATTICE_RESTART_FROM".to_string(), format!("{s:.3}")));
    }
    if slurm {
        env.extend([
            ("SLURM_JOB_ID".to_string(), l.id.clone()),
            ("SLURM_JOB_NODELIST".to_string(), l.nodes.join(",")),
            ("SLURM_JOB_NUM_NODES".to_string(), l.nodes.len().to_string()),
            ("SLURM_NODEID".to_string(), l.task_index.to_string()),
            ("SLURM_PROCID".to_string(), l.task_index.to_string()),
        ]);
        if let Some(g) = &l.task_group {
            env.push(("SLURM_ARRAY_TASK_ID".to_string(), g.index.to_string()));
            env.push(("SLURM_ARRAY_JOB_ID".to_string(), g.group.clone()));
        }
    }
    env
}

/// Environment variables, in the order they are set.
type Env = Vec<(String, String)>;

/// What [`prepare`] needs of the agent besides the launch.
pub(super) struct Context<'a> {
    pub(super) cfg: &'a AgentConfig,
    pub(super) client: &'a Client,
    /// The directory of the Slurm compatibility `srun`, first on the allocations' PATH.
    pub(super) compat_path: Option<&'a Path>,
    /// The address other agents (and `lattice-mpi-launcher`) reach this agent's service at.
    pub(super) peer_addr: Option<&'a str>,
}

/// A launch ready to start: its process, its container (an OCI image's) and its checkpoint channel.
pub(super) struct Prepared {
    pub(super) spec: RunSpec,
    pub(super) container: Option<String>,
    pub(super) channel: Option<Channel>,
    /// The images its prologue mounted (reported with its start).
    pub(super) images: Vec<crate::client::ImageUse>,
}

/// Prepares `l` in the order its parts depend on each other: the uenv, the data, the checkpoint
/// channel, the environment, the scratch directory, the container. A part that cannot be prepared
/// is the prologue failure's reason (`Err`), the checkpoint channel already created removed again.
pub(super) fn prepare(
    ctx: &Context,
    images: &mut Option<crate::cache::ImageCache>,
    procs: &BTreeMap<String, runner::Running>,
    l: &Launch,
) -> Result<Prepared, String> {
    let cfg = ctx.cfg;
    // Its software environment first: a uenv that cannot be pulled or read is a prologue
    // failure (the control plane retries it on other nodes), the reason as its output.
    let (mut mounts, uenv_env, used) = uenv(cfg, images, procs, l)?;
    // Its data: declared mounts and the defaults (a source this node cannot provide is
    // a prologue failure too).
    let data = crate::data::plan(
        &cfg.data_roots,
        &crate::data::Request {
            alloc: &l.id,
            tenant: &l.tenant,
            project: l.project.as_deref(),
            user: l.user.as_deref(),
            mounts: &l.mounts,
            defaults: l.data_defaults,
            checkpoints: l.checkpoints,
        },
    );
    let data = data.map_err(|e| e.to_string())?;
    let channel = open_channel(cfg, &l.id, &l.checkpoint, l.checkpoint_port);
    let mut env = environment(l, cfg.slurm_env);
    env.extend(uenv_env);
    env.extend(data.env.iter().cloned());
    agent_env(ctx, l, &mut env);
    fresh_scratch(ctx, l, &mut env);
    if let Some(c) = &channel {
        env.extend(c.env());
    }
    // An OCI image: the wrapper runs the container (a prologue failure when it cannot be
    // prepared: retried on other nodes).
    let mut entrypoint = l.entrypoint.clone();
    let mut container = None;
    if let Some(image) = &l.image {
        match oci_container(cfg, l, image, &env, &data) {
            Ok(p) => {
                entrypoint = p.command;
                container = Some(p.container);
            }
            Err(e) => {
                if let Some(c) = channel {
                    c.remove();
                }
                return Err(e.to_string());
            }
        }
    }
    let spec = RunSpec {
        id: l.id.clone(),
        entrypoint,
        env,
        checkpoint: l.checkpoint.clone(),
        tenant: l.tenant.clone(),
        project: l.project.clone(),
        walltime: l.walltime_s.map(Duration::from_secs_f64),
        grace: cfg.grace,
        log_dir: cfg.log_dir.clone(),
        ring_bytes: cfg.ring_bytes,
        // Audit mode's cgroup, when the agent watches it ([`super::Agent::start`]).
        cgroup: None,
        // In a container the data mounts are the container's.
        mounts: if container.is_some() {
            mounts
        } else {
            mounts.extend(data.binds.iter().map(|b| runner::Mount::Bind {
                from: b.from.clone(),
                at: b.at.clone(),
                read_only: b.read_only,
            }));
            mounts
        },
    };
    Ok(Prepared {
        spec,
        container,
        channel,
        images: used,
    })
}

/// The launch's uenv, pulled into the node-local cache (opened now if not yet) and mounted at the
/// uenv mount point, with its view's variables, and its tools uenv mounted at the tools mount point;
/// none without either. `Err`: the prologue failure.
fn uenv(
    cfg: &AgentConfig,
    images: &mut Option<crate::cache::ImageCache>,
    procs: &BTreeMap<String, runner::Running>,
    l: &Launch,
) -> Result<(Vec<runner::Mount>, Env, Vec<crate::client::ImageUse>), String> {
    let mut mounts = Vec::new();
    let mut uenv_env = Vec::new();
    let mut used = Vec::new();
    if l.uenv.is_none() && l.tools_uenv.is_none() {
        return Ok((mounts, uenv_env, used));
    }
    // Images mounted by what runs here (also what a restart took over) stay.
    let mut pinned: std::collections::BTreeSet<String> =
        procs.values().flat_map(|r| r.record.images().cloned()).collect();
    let cache = images.get_or_insert_with(|| crate::uenv::open_cache(&cfg.uenv));
    if let Some(u) = &l.uenv {
        let p = crate::uenv::prepare(
            &cfg.uenv,
            cache,
            &pinned,
            u,
            l.uenv_view.as_deref(),
            l.uenv_sign_required,
        )
        .map_err(|e| e.to_string())?;
        // Making room for the tools image must not evict this one.
        if let Some(f) = p.image.file_name() {
            pinned.insert(f.to_string_lossy().into_owned());
        }
        mounts.push(runner::Mount::Squashfs {
            image: p.image,
            at: cfg.uenv.mount_point.clone(),
        });
        uenv_env = p.env;
        used.push(p.used);
    }
    if let Some(t) = &l.tools_uenv {
        let (image, tools) = crate::uenv::prepare_tools(&cfg.uenv, cache, &pinned, t, l.uenv_sign_required)
            .map_err(|e| e.to_string())?;
        used.push(tools);
        mounts.push(runner::Mount::Squashfs {
            image,
            at: cfg.uenv.tools_mount_point.clone(),
        });
        uenv_env.push(("LATTICE_TOOLS_UENV".to_string(), t.clone()));
    }
    Ok((mounts, uenv_env, used))
}

/// The allocation's checkpoint channel by its declared mechanism (`None`, said, when it cannot be
/// created: its hints will be signals).
fn open_channel(cfg: &AgentConfig, id: &str, mechanism: &str, port: Option<u16>) -> Option<Channel> {
    match Channel::create(&cfg.shm_dir, id, Mechanism::parse(mechanism)) {
        Ok(c) => {
            if let Some(p) = port
                && let Err(e) = c.declare_port(p)
            {
                eprintln!("lattice-agent {}: checkpoint port of {id}: {e}", cfg.node);
            }
            Some(c)
        }
        Err(e) => {
            eprintln!(
                "lattice-agent {}: checkpoint channel of {id} in {}: {e}; hints will be signals",
                cfg.node,
                cfg.shm_dir.display()
            );
            None
        }
    }
}

/// The variables that lead the allocation's processes back to the control plane and the agents:
/// `LATTICE_ENDPOINT`, the `srun` shim on the PATH, and what `lattice-mpi-launcher` needs.
fn agent_env(ctx: &Context, l: &Launch, env: &mut Vec<(String, String)>) {
    // The `lattice` client inside the allocation (`lattice launch`) talks to this control plane.
    if std::env::var_os("LATTICE_ENDPOINT").is_none() {
        env.push(("LATTICE_ENDPOINT".to_string(), ctx.client.first_endpoint().to_string()));
    }
    if let Some(dir) = &ctx.compat_path {
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
        env.push(("PATH".to_string(), format!("{}:{path}", dir.display())));
    }
    // `lattice-mpi-launcher` (mpirun's way to start processes without SSH) asks this
    // node's agent, presenting the allocation's token.
    if let (Some(t), Some(addr)) = (&l.launch_token, &ctx.peer_addr) {
        env.push(("LATTICE_LAUNCH_TOKEN".to_string(), t.clone()));
        env.push(("LATTICE_AGENT_ADDR".to_string(), addr.to_string()));
        let agents: Vec<String> = l.agents.iter().map(|(n, a)| format!("{n}={a}")).collect();
        env.push(("LATTICE_AGENTS".to_string(), agents.join(",")));
        if let Some(launcher) = &ctx.cfg.launcher {
            // mpirun (Hydra) starts its proxies on the allocation's nodes through the
            // agents instead of SSH.
            env.push(("HYDRA_LAUNCHER".to_string(), "ssh".to_string()));
            env.push(("HYDRA_LAUNCHER_EXEC".to_string(), launcher.display().to_string()));
        }
    }
}

/// A fresh scratch directory (a requeued run on this node does not see the last one's), in `env` as
/// `LATTICE_SCRATCH` and `TMPDIR`, with mpirun's host file when the launcher is in use.
fn fresh_scratch(ctx: &Context, l: &Launch, env: &mut Vec<(String, String)>) {
    let cfg = ctx.cfg;
    if let Some(dir) = cfg.scratch_dir.as_deref().and_then(|root| scratch_of(root, &l.id)) {
        let _ = std::fs::remove_dir_all(&dir);
        match std::fs::create_dir_all(&dir) {
            Ok(()) => {
                let d = dir.display().to_string();
                env.push(("LATTICE_SCRATCH".to_string(), d.clone()));
                env.push(("TMPDIR".to_string(), d));
                // mpirun's hosts: the allocation's nodes.
                if cfg.launcher.is_some() && l.launch_token.is_some() && ctx.peer_addr.is_some() {
                    let hosts = dir.join(".lattice-hosts");
                    if std::fs::write(&hosts, l.nodes.join("\n") + "\n").is_ok() {
                        env.push(("HYDRA_HOST_FILE".to_string(), hosts.display().to_string()));
                    }
                }
            }
            Err(e) => eprintln!("lattice-agent {}: scratch {}: {e}", cfg.node, dir.display()),
        }
    }
}

/// The container of the allocation's OCI `image`, with its scratch at its own path and the data
/// mounts at their targets.
fn oci_container(
    cfg: &AgentConfig,
    l: &Launch,
    image: &str,
    env: &[(String, String)],
    data: &crate::data::Plan,
) -> Result<crate::oci::Prepared, crate::oci::OciError> {
    // Scratch at its own path, the data mounts at their targets.
    let mut binds: Vec<crate::data::Bind> = cfg
        .scratch_dir
        .as_deref()
        .and_then(|root| scratch_of(root, &l.id))
        .filter(|d| d.is_dir())
        .map(|d| crate::data::Bind {
            from: d.clone(),
            at: d,
            read_only: false,
        })
        .into_iter()
        .collect();
    binds.extend(data.binds.iter().cloned());
    crate::oci::ContainerRuntime::prepare(&cfg.oci, &l.id, image, &l.entrypoint, env, &binds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_a_directory_per_plain_id_only() {
        let root = std::path::Path::new("/scratch/local");
        assert_eq!(scratch_of(root, "a-000007"), Some(root.join("a-000007")));
        assert_eq!(scratch_of(root, "a-000007[3]"), Some(root.join("a-000007[3]")));
        for bad in ["", ".", "..", "../etc", "a/b", "a\\b"] {
            assert_eq!(scratch_of(root, bad), None, "{bad}");
        }
    }

    #[test]
    fn the_environment_names_the_allocation_its_nodes_and_the_task() {
        let l = Launch {
            id: "a-000007".into(),
            entrypoint: "hostname".into(),
            nodes: vec!["n1".into(), "n2".into()],
            task_index: 1,
            walltime_s: Some(60.0),
            tenant: "physics".into(),
            user: None,
            project: None,
            checkpoint: "signal".into(),
            checkpoint_port: None,
            vni: Some(1042),
            cxi_auth_key: Some("k-1".into()),
            restart_from_s: None,
            task_group: None,
            uenv: None,
            uenv_view: None,
            tools_uenv: None,
            uenv_sign_required: false,
            sensitive: false,
            launch_token: None,
            agents: Default::default(),
            image: None,
            mounts: Vec::new(),
            data_defaults: true,
            checkpoints: false,
            liveness_probe: None,
        };
        let env: BTreeMap<String, String> = environment(&l, true).into_iter().collect();
        assert_eq!(env["LATTICE_ALLOC_ID"], "a-000007");
        assert_eq!(env["LATTICE_NODELIST"], "n1,n2");
        assert_eq!(env["LATTICE_NNODES"], "2");
        assert_eq!(env["LATTICE_TASK_INDEX"], "1");
        assert_eq!(env["SLURM_JOB_NUM_NODES"], "2");
        assert_eq!(
            (env["LATTICE_VNI"].as_str(), env["SLINGSHOT_VNIS"].as_str()),
            ("1042", "1042")
        );
        assert_eq!(env["FI_CXI_AUTH_KEY"], "k-1");
        assert!(!environment(&l, false).iter().any(|(k, _)| k.starts_with("SLURM_")));
        // A first run has no restart point; a requeued one resumes from its checkpoint's work.
        assert!(!env.contains_key("LATTICE_RESTART_FROM"));
        let again = Launch {
            restart_from_s: Some(600.0),
            ..l
        };
        let env: BTreeMap<String, String> = environment(&again, false).into_iter().collect();
        assert_eq!(env["LATTICE_RESTART_FROM"], "600.000");
        assert!(!env.contains_key("LATTICE_TASK_GROUP_ID"));
        // A task group element: its index, not the node's place, is the task index.
        let element = Launch {
            id: "a-000009[3]".into(),
            task_group: Some(crate::client::TaskGroup {
                group: "a-000009".into(),
                index: 3,
                concurrency: None,
            }),
            ..again
        };
        let env: BTreeMap<String, String> = environment(&element, true).into_iter().collect();
        assert_eq!(env["LATTICE_TASK_INDEX"], "3");
        assert_eq!(env["LATTICE_NODEID"], "1");
        assert_eq!(env["LATTICE_TASK_GROUP_ID"], "a-000009");
        assert_eq!(
            (env["SLURM_ARRAY_TASK_ID"].as_str(), env["SLURM_ARRAY_JOB_ID"].as_str()),
            ("3", "a-000009")
        );
    }
}
