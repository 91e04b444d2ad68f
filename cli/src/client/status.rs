//! `lattice status` (allocations, `--watch`, forwarded ones with `--site`) and `lattice cancel`.

use super::{Client, Output, print_rows, print_value, query};
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
    /// Only allocations in this state, or these (`pending,running`).
    #[arg(long)]
    pub state: Option<String>,
    /// Only how many there are (`lattice status --state=pending --count`).
    #[arg(long, conflicts_with_all = ["id", "watch"])]
    pub count: bool,
    /// Federation: allocations this site forwarded to that peer (`all`: to every peer).
    #[arg(long)]
    pub site: Option<String>,
}

#[derive(clap::Args)]
pub struct CancelArgs {
    pub ids: Vec<String>,
    #[arg(long, conflicts_with_all = ["state", "all_mine"])]
    pub site: Option<String>,
    /// With `--all-mine`: only your allocations in this state, or these (`pending,running`).
    #[arg(long, requires = "all_mine")]
    pub state: Option<String>,
    /// Every allocation of yours (still queued or running; `--state` narrows), instead of ids.
    #[arg(long, conflicts_with = "ids")]
    pub all_mine: bool,
}

/// `lattice status [ID]`.
/// `vcluster`: the `--vcluster` given on the command line (only allocations of that vCluster).
pub fn status(
    client: &Client,
    output: Output,
    tenant: &Option<String>,
    vcluster: Option<String>,
    args: StatusArgs,
) -> Result<()> {
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
            id,
            watch,
            user,
            all,
            state,
            count,
            ..
        } => loop {
            let mut rows: Vec<Value> = match &id {
                Some(id) => vec![client.call("GET", &format!("/v1/allocations/{id}"), None)?],
                None => {
                    let tenant = tenant.clone().filter(|_| !all);
                    let q = query(&[
                        ("tenant", &tenant),
                        ("user", &user),
                        ("state", &state),
                        ("vcluster", &vcluster),
                    ]);
                    client.call("GET", &format!("/v1/allocations{q}"), None)?["allocations"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                }
            };
            if count {
                let n = rows.len();
                print_value(&serde_json::json!({ "count": n }), output, |_| format!("{n}\n"))?;
                break;
            }
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

/// `lattice cancel ID...`, or `lattice cancel --all-mine [--state S]`.
pub fn cancel(client: &Client, output: Output, args: CancelArgs) -> Result<()> {
    let CancelArgs {
        ids,
        site,
        state,
        all_mine,
    } = args;
    if all_mine {
        // The caller's own (the server knows who that is), still queued or running unless
        // `--state` says which.
        let filter = lattice_client::ListFilter {
            state: state.or(Some("pending,running".into())),
            mine: true,
            ..Default::default()
        };
        let mine = client.allocations(&filter)?;
        for a in &mine {
            let state = client.cancel(&a.id)?;
            let v = serde_json::json!({"id": a.id, "state": state});
            print_value(&v, output, |_| format!("cancelled {}\n", a.id))?;
        }
        if mine.is_empty() && matches!(output, Output::Table | Output::Wide) {
            println!("nothing to cancel");
        }
        return Ok(());
    }
    if ids.is_empty() {
        bail!("which allocation? `lattice cancel ID...` or `lattice cancel --all-mine`");
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
