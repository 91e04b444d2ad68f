//! `lattice dag submit|status|graph|cancel`: DAGs of allocations.

use super::{Client, Output, print_value};
use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::{Value, json};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum DagCmd {
    Submit {
        file: PathBuf,
    },
    Status {
        id: String,
    },
    /// Its structure: each member and what it runs after.
    Graph {
        id: String,
    },
    Cancel {
        id: String,
    },
    /// DAGs, selected by their members' user (and tenant: the global `--tenant`, when given) and
    /// by their overall state.
    List {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        state: Option<String>,
    },
}

/// `lattice dag ...`.
/// `tenant`: the client's tenant (members without one submit as it); `tenant_flag`: the `--tenant`
/// given on the command line (what `list` selects).
pub fn run(
    client: &Client,
    output: Output,
    tenant: &Option<String>,
    tenant_flag: Option<String>,
    cmd: DagCmd,
) -> Result<()> {
    match cmd {
        DagCmd::Submit { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let mut body: Value =
                yaml_serde::from_str(&text).with_context(|| format!("{}: not YAML/JSON", file.display()))?;
            // Members without a tenant submit as the client's tenant.
            if let (Some(t), Some(members)) = (&tenant, body["allocations"].as_array_mut()) {
                for m in members {
                    if m.get("tenant").is_none() {
                        m["tenant"] = json!(t);
                    }
                }
            }
            let v = client.call("POST", "/v1/dags", Some(&body))?;
            print_value(&v, output, |v| format!("{}\n", v["id"].as_str().unwrap_or_default()))?;
            if let (Some(m), Output::Table | Output::Wide) = (v["allocations"].as_object(), output) {
                for (name, id) in m {
                    eprintln!("  {name}: {}", id.as_str().unwrap_or_default());
                }
            }
        }
        DagCmd::Status { id } => {
            let v = client.call("GET", &format!("/v1/dags/{id}"), None)?;
            print_value(&v, output, |v| {
                let mut s = format!("{id}: {}\n", v["state"].as_str().unwrap_or_default());
                for m in v["allocations"].as_array().cloned().unwrap_or_default() {
                    s.push_str(&format!(
                        "  {:<16} {:<10} {}\n",
                        m["name"].as_str().unwrap_or_default(),
                        m["id"].as_str().unwrap_or_default(),
                        m["state"].as_str().unwrap_or_default()
                    ));
                }
                s
            })?;
        }
        DagCmd::Graph { id } => {
            let v = client.call("GET", &format!("/v1/dags/{id}/graph"), None)?;
            print_value(&v, output, crate::observe::graph_view)?;
        }
        DagCmd::List { user, state } => {
            let q = super::query(&[("tenant", &tenant_flag), ("user", &user), ("state", &state)]);
            let v = client.call("GET", &format!("/v1/dags{q}"), None)?;
            super::print_rows(
                v["dags"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                output,
                false,
                "dag",
            )?;
        }
        DagCmd::Cancel { id } => {
            let v = client.call("DELETE", &format!("/v1/dags/{id}"), None)?;
            print_value(&v, output, |v| {
                format!("{id}: cancelled {}\n", v["cancelled"].as_u64().unwrap_or(0))
            })?;
        }
    }
    Ok(())
}
