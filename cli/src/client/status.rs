//! `lattice status` (allocations, `--watch`, forwarded ones with `--site`) and `lattice cancel`.

use super::{Client, Output, print_rows, print_value};
use anyhow::{Result, bail};
use serde_json::Value;

#[derive(clap::Args)]
pub struct StatusArgs {
    pub id: Option<String>,
    #[arg(long)]
    pub watch: bool,
    #[arg(long)]
    pub user: Option<String>,
    /// Every tenant's allocations.
    #[arg(long)]
    pub all: bool,
    /// Federation: allocations this site forwarded to that peer (`all`: to every peer).
    #[arg(long)]
    pub site: Option<String>,
}

#[derive(clap::Args)]
pub struct CancelArgs {
    pub ids: Vec<String>,
    #[arg(long)]
    pub site: Option<String>,
}

/// `lattice status [ID]`.
pub fn status(client: &Client, output: Output, tenant: &Option<String>, args: StatusArgs) -> Result<()> {
    match args {
        StatusArgs {
            id, site: Some(site), ..
        } => {
            let rows: Vec<Value> = match &id {
                Some(id) => vec![client.call("GET", &format!("/api/v1/federation/allocations/{site}/{id}"), None)?],
                None => {
                    let q = if site == "all" {
                        String::new()
                    } else {
                        format!("?site={site}")
                    };
                    let v = client.call("GET", &format!("/api/v1/federation/allocations{q}"), None)?;
                    for (peer, why) in v["unreachable"].as_object().into_iter().flatten() {
                        eprintln!("{peer}: not reachable: {}", why.as_str().unwrap_or_default());
                    }
                    v["allocations"].as_array().cloned().unwrap_or_default()
                }
            };
            print_rows(&rows, output, id.is_some(), "allocation")?;
        }
        StatusArgs {
            id, watch, user, all, ..
        } => loop {
            let mut rows: Vec<Value> = match &id {
                Some(id) => vec![client.call("GET", &format!("/v1/allocations/{id}"), None)?],
                None => {
                    let mut q = Vec::new();
                    if let (Some(t), false) = (&tenant, all) {
                        q.push(format!("tenant={t}"));
                    }
                    if let Some(u) = &user {
                        q.push(format!("user={u}"));
                    }
                    let path = format!("/v1/allocations{}{}", if q.is_empty() { "" } else { "?" }, q.join("&"));
                    client.call("GET", &path, None)?["allocations"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                }
            };
            if matches!(output, Output::Table | Output::Wide) {
                crate::status::with_reasons(&mut rows);
            }
            print_rows(&rows, output, id.is_some(), "allocation")?;
            if !watch {
                break;
            }
            std::thread::sleep(std::time::Duration::from_secs(2));
            println!();
        },
    }
    Ok(())
}

/// `lattice cancel ID...`.
pub fn cancel(client: &Client, output: Output, args: CancelArgs) -> Result<()> {
    let CancelArgs { ids, site } = args;
    if ids.is_empty() {
        bail!("which allocation? `lattice cancel ID...`");
    }
    for id in ids {
        let path = match &site {
            Some(s) => format!("/api/v1/federation/allocations/{s}/{id}"),
            None => format!("/v1/allocations/{id}"),
        };
        let v = client.call("DELETE", &path, None)?;
        print_value(&v, output, |_| format!("cancelled {id}\n"))?;
    }
    Ok(())
}
