//! `lattice nodes` (the nodes and their state) and `lattice node drain|undrain|disable|enable`.

use super::{Client, Output, print_rows, print_value};
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum NodeCmd {
    /// No new work; what runs finishes.
    Drain {
        node: String,
    },
    Undrain {
        node: String,
    },
    /// Out of service at once (its allocations are requeued or fail per their policy).
    Disable {
        node: String,
    },
    Enable {
        node: String,
    },
}

/// `lattice nodes [--state S] [--vcluster V] [--tenant T] [NODE]` (`--tenant` is the global flag).
#[derive(clap::Args)]
pub struct NodesArgs {
    /// Only nodes in this state (ready, allocated, draining, drained, down, booting, …).
    #[arg(long)]
    pub state: Option<String>,
    /// Only nodes running an allocation of this vCluster.
    #[arg(long)]
    pub vcluster: Option<String>,
    /// One node, in full.
    pub node: Option<String>,
}

/// `lattice nodes`; `tenant`: the `--tenant` given on the command line (only nodes running an
/// allocation of that tenant).
pub fn list(client: &Client, output: Output, tenant: Option<String>, args: NodesArgs) -> Result<()> {
    let NodesArgs { state, vcluster, node } = args;
    if let Some(n) = node {
        let v = client.call("GET", &format!("/v1/nodes/{}", lattice_util::url::component(&n)), None)?;
        return print_value(&v, output, |v| {
            serde_json::to_string_pretty(v).map(|s| s + "\n").unwrap_or_default()
        });
    }
    let q = super::query(&[("state", &state), ("vcluster", &vcluster), ("tenant", &tenant)]);
    let v = client.call("GET", &format!("/v1/nodes{q}"), None)?;
    print_rows(
        v["nodes"].as_array().map(Vec::as_slice).unwrap_or(&[]),
        output,
        false,
        "node",
    )?;
    Ok(())
}

/// `lattice node OP NODE`.
pub fn node(client: &Client, output: Output, cmd: NodeCmd) -> Result<()> {
    let (node, op) = match &cmd {
        NodeCmd::Drain { node } => (node, "drain"),
        NodeCmd::Undrain { node } => (node, "undrain"),
        NodeCmd::Disable { node } => (node, "disable"),
        NodeCmd::Enable { node } => (node, "enable"),
    };
    let v = client.call("POST", &format!("/v1/nodes/{node}/{op}"), None)?;
    print_value(&v, output, |v| {
        format!("{node}: {}\n", v["state"].as_str().unwrap_or_default())
    })?;
    Ok(())
}
