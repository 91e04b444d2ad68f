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

/// `lattice nodes`.
pub fn list(client: &Client, output: Output) -> Result<()> {
    let v = client.call("GET", "/v1/nodes", None)?;
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
