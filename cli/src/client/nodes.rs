//! `lattice nodes` (the nodes and their state) and `lattice node list|status|drain|undrain|disable|enable`.

use super::{Client, Output, print_rows, print_value};
use anyhow::Result;
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand)]
pub enum NodeCmd {
    /// The nodes and their state (as `lattice nodes`).
    List {
        /// Only nodes in this state (ready, allocated, draining, drained, down, degraded, …).
        #[arg(long)]
        state: Option<String>,
    },
    /// One node: its state, the allocation on it, its agent's health and conformance.
    Status {
        node: String,
    },
    /// No new work; what runs finishes (`--urgent`: it is asked to checkpoint now).
    Drain {
        node: String,
        /// Ask the allocation on it to checkpoint now, so it can leave sooner.
        #[arg(long)]
        urgent: bool,
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

/// `lattice nodes [--state S] [--vcluster V] [--tenant T] [NODE]` (`--tenant` and `--vcluster` are
/// the global flags).
#[derive(clap::Args)]
pub struct NodesArgs {
    /// Only nodes in this state (ready, allocated, draining, drained, down, booting, …).
    #[arg(long)]
    pub state: Option<String>,
    /// One node, in full.
    pub node: Option<String>,
}

/// `lattice nodes`; `tenant`, `vcluster`: the `--tenant` and `--vcluster` given on the command
/// line (only nodes running an allocation of that tenant, of that vCluster).
pub fn list(
    client: &Client,
    output: Output,
    tenant: Option<String>,
    vcluster: Option<String>,
    args: NodesArgs,
) -> Result<()> {
    let NodesArgs { state, node } = args;
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
pub fn node(
    client: &Client,
    output: Output,
    tenant: Option<String>,
    vcluster: Option<String>,
    cmd: NodeCmd,
) -> Result<()> {
    let (node, op) = match &cmd {
        NodeCmd::List { state } => {
            let args = NodesArgs {
                state: state.clone(),
                node: None,
            };
            return list(client, output, tenant, vcluster, args);
        }
        NodeCmd::Status { node } => {
            let args = NodesArgs {
                state: None,
                node: Some(node.clone()),
            };
            return list(client, output, tenant, vcluster, args);
        }
        NodeCmd::Drain { node, urgent: true } => (node, "drain?urgent=true"),
        NodeCmd::Drain { node, .. } => (node, "drain"),
        NodeCmd::Undrain { node } => (node, "undrain"),
        NodeCmd::Disable { node } => (node, "disable"),
        NodeCmd::Enable { node } => (node, "enable"),
    };
    let v = client.call(
        "POST",
        &format!("/v1/nodes/{}/{op}", lattice_util::url::component(node)),
        None,
    )?;
    print_value(&v, output, |v| {
        let mut text = format!("{node}: {}\n", v["state"].as_str().unwrap_or_default());
        for id in v["checkpointed"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            text.push_str(&format!("{id}: asked to checkpoint\n"));
        }
        for (id, why) in v["not_checkpointed"].as_object().into_iter().flatten() {
            text.push_str(&format!(
                "{id}: not checkpointed: {}\n",
                why.as_str().unwrap_or_default()
            ));
        }
        text
    })?;
    Ok(())
}
