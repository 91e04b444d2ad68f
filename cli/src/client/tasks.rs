//! `lattice launch` (tasks within a running allocation) and its `srun` form.

use super::Client;
use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct LaunchArgs {
    #[arg(long)]
    pub alloc: Option<String>,
    /// Ranks in all (default: --tasks-per-node on every node, or one per node).
    #[arg(short = 'n', long = "ntasks")]
    pub ntasks: Option<u32>,
    #[arg(long)]
    pub tasks_per_node: Option<u32>,
    /// `NAME=VALUE` for every rank (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// `pmi2` (default; PMI-1 clients are served too) or `pmix`.
    #[arg(long)]
    pub pmi: Option<String>,
    /// Abort the launch when a PMI fence takes longer (default: the agents', 60s).
    #[arg(long)]
    pub fence_timeout: Option<String>,
    /// `RANK: ` before each line of output.
    #[arg(short, long)]
    pub label: bool,
    /// Interactively, in a terminal (`lattice launch --alloc=ID --pty bash`): the command runs on
    /// the allocation's first node (`--node`: another) with keys, Ctrl-C and window sizes passed
    /// through, as `lattice attach ID -- CMD` runs it; exits with its status.
    #[arg(long, conflicts_with_all = ["ntasks", "tasks_per_node", "pmi", "fence_timeout", "label", "env"])]
    pub pty: bool,
    /// With `--pty`: the node to run on.
    #[arg(long, requires = "pty")]
    pub node: Option<String>,
    #[arg(trailing_var_arg = true, required = true)]
    pub command: Vec<String>,
}

#[derive(clap::Args)]
pub struct SrunArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// `lattice launch --alloc=ID ... -- PROG ARGS`.
pub fn launch(client: &Client, args: LaunchArgs) -> Result<()> {
    let LaunchArgs {
        alloc,
        ntasks,
        tasks_per_node,
        env,
        pmi,
        fence_timeout,
        label,
        pty,
        node,
        command,
    } = args;
    if pty {
        let inside = std::env::var("LATTICE_ALLOC_ID").ok();
        let Some(id) = alloc.or(inside) else {
            bail!("--alloc: which allocation? (or run `lattice launch` inside one)");
        };
        let attach = super::interactive::AttachArgs {
            id,
            node,
            command: None,
            argv: command,
        };
        return super::interactive::attach(client, attach);
    }
    let args = crate::launch::LaunchArgs {
        ntasks,
        tasks_per_node,
        env: crate::launch::parse_env(&env).map_err(anyhow::Error::msg)?,
        pmi,
        fence_timeout,
        label,
        command,
    };
    launch_and_wait(client, alloc, &args)?;
    Ok(())
}

/// `lattice srun ...`.
pub fn srun(client: &Client, args: SrunArgs) -> Result<()> {
    let SrunArgs { args } = args;
    let args = crate::launch::from_srun(&args).map_err(anyhow::Error::msg)?;
    launch_and_wait(client, None, &args)?;
    Ok(())
}

/// Runs a task launch and waits for it; exits the process with its status.
fn launch_and_wait(client: &Client, alloc: Option<String>, args: &crate::launch::LaunchArgs) -> Result<()> {
    let inside = std::env::var("LATTICE_ALLOC_ID").ok();
    let Some(alloc) = alloc.or(inside.clone()) else {
        bail!("--alloc: which allocation? (or run `lattice launch` inside one)");
    };
    // A multi-node allocation's script runs on every node: node 0's launch spans them all.
    if inside.as_deref() == Some(alloc.as_str())
        && std::env::var("LATTICE_NODEID").is_ok_and(|n| n != "0")
        && std::env::var("LATTICE_LAUNCH_ID").is_err()
    {
        return Ok(());
    }
    let v = client.call("POST", &format!("/v1/allocations/{alloc}/tasks"), Some(&args.body()))?;
    let id = v["launch_id"].as_str().unwrap_or_default().to_string();
    let mut pause = std::time::Duration::from_millis(25);
    let view = loop {
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(500));
        let v = client.call("GET", &format!("/v1/allocations/{alloc}/tasks/{id}"), None)?;
        if matches!(v["state"].as_str(), Some("completed" | "failed")) {
            break v;
        }
    };
    let (out, err) = crate::launch::rank_output(&view, args.label);
    print!("{out}");
    eprint!("{err}");
    if let Some(r) = view["reason"].as_str() {
        eprintln!("lattice launch: {id} failed: {r}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(crate::launch::exit_status(&view));
}
