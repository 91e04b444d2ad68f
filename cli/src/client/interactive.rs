//! `lattice attach` (a terminal inside a running allocation) and `lattice session` (an interactive
//! allocation).

use super::Client;
use anyhow::{Result, bail};
use serde_json::json;

#[derive(clap::Args)]
pub struct AttachArgs {
    pub id: String,
    #[arg(long)]
    pub node: Option<String>,
    #[arg(long)]
    pub command: Option<String>,
}

#[derive(clap::Args)]
pub struct SessionArgs {
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    #[arg(long, default_value = "4h")]
    pub walltime: String,
    #[arg(long)]
    pub vcluster: Option<String>,
    #[arg(long)]
    pub constraint: Vec<String>,
    #[arg(long)]
    pub uenv: Option<String>,
    #[arg(long)]
    pub view: Option<String>,
}

/// `lattice attach ID`: exits with the remote exit status.
pub fn attach(client: &Client, args: AttachArgs) -> Result<()> {
    let AttachArgs { id, node, command } = args;
    let (rows, cols) = crate::terminal::size().unwrap_or((24, 80));
    let url = crate::terminal::url(client.base(), &id, node.as_deref(), command.as_deref(), rows, cols)?;
    let code = crate::terminal::run(&url, client.token().as_deref())?;
    std::process::exit(code.clamp(0, 255));
}

/// `lattice session`: exits with the terminal's exit status.
pub fn session(client: &Client, tenant: &Option<String>, args: SessionArgs) -> Result<()> {
    let SessionArgs {
        nodes,
        walltime,
        vcluster,
        constraint,
        uenv,
        view,
    } = args;
    let mut body = json!({
        "resources": {"nodes": nodes},
        "lifecycle": {"type": "bounded", "walltime": walltime},
    });
    if let Some(t) = &tenant {
        body["tenant"] = json!(t);
    }
    if let Some(v) = vcluster {
        body["vcluster"] = json!(v);
    }
    if !constraint.is_empty() {
        body["resources"]["constraints"] = json!({"features": constraint});
    }
    if let Some(u) = uenv {
        body["environment"] = json!({"uenv": u});
        if let Some(v) = view {
            body["environment"]["view"] = json!(v);
        }
    }
    let v = client.call("POST", "/v1/sessions", Some(&body))?;
    let id = v["session_id"].as_str().unwrap_or_default().to_string();
    eprintln!("lattice session: {id} waiting for its nodes…");
    let code = loop {
        let a = client.call("GET", &format!("/v1/sessions/{id}"), None)?;
        match a["state"].as_str() {
            Some("running") => {
                let (rows, cols) = crate::terminal::size().unwrap_or((24, 80));
                let url = crate::terminal::session_url(client.base(), &id, rows, cols)?;
                break crate::terminal::run(&url, client.token().as_deref());
            }
            Some("completed" | "failed" | "cancelled") => {
                bail!("session {id} ended before it started: {}", a["end_reason"])
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(250)),
        }
    };
    // Leaving the terminal ends the session.
    let _ = client.call("DELETE", &format!("/v1/sessions/{id}"), None);
    eprintln!("lattice session: {id} ended");
    std::process::exit(code?.clamp(0, 255));
}
