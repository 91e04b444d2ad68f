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
    /// What to run instead of a login shell (`sh -c`); or the command after `--`.
    #[arg(long, conflicts_with = "argv")]
    pub command: Option<String>,
    /// `lattice attach ID -- CMD ARGS`: run this (quoted as typed) instead of a login shell.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

#[derive(clap::Args)]
pub struct SessionArgs {
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    #[arg(long, default_value = "4h")]
    pub walltime: String,
    /// A node feature, or `KEY=VALUE` / `KEY:VALUE` for gpu_type, gpu_count, cpu_cores, memory_gb,
    /// topology (repeatable; `--constraint=gpu_type:GH200`).
    #[arg(long)]
    pub constraint: Vec<String>,
    #[arg(long)]
    pub uenv: Option<String>,
    #[arg(long)]
    pub view: Option<String>,
}

/// `lattice attach ID`: exits with the remote exit status.
pub fn attach(client: &Client, args: AttachArgs) -> Result<()> {
    let AttachArgs {
        id,
        node,
        command,
        argv,
    } = args;
    let command = command.or_else(|| (!argv.is_empty()).then(|| crate::directives::shell_join(&argv)));
    let (rows, cols) = crate::terminal::size().unwrap_or((24, 80));
    let url = crate::terminal::url(client.base(), &id, node.as_deref(), command.as_deref(), rows, cols)?;
    let code = crate::terminal::run(&url, client.token().as_deref())?;
    std::process::exit(code.clamp(0, 255));
}

/// `lattice session`: exits with the terminal's exit status.
/// `vcluster`: the global `--vcluster`, else the config file's.
pub fn session(client: &Client, tenant: &Option<String>, vcluster: &Option<String>, args: SessionArgs) -> Result<()> {
    let SessionArgs {
        nodes,
        walltime,
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
        let mut f = crate::directives::SubmitFields::default();
        for c in &constraint {
            f.constraint(c).map_err(anyhow::Error::msg)?;
        }
        let mut c = json!({"features": f.features});
        for (k, v) in [
            ("gpu_type", f.gpu_type.map(|v| json!(v))),
            ("gpu_count", f.gpu_count.map(|v| json!(v))),
            ("cpu_cores", f.cpu_cores.map(|v| json!(v))),
            ("memory_gb", f.memory_gb.map(|v| json!(v))),
            ("topology", f.topology.map(|v| json!(v))),
        ] {
            if let Some(v) = v {
                c[k] = v;
            }
        }
        body["resources"]["constraints"] = c;
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
