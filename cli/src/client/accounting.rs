//! `lattice audit` (the sensitive audit log) and `lattice history` (usage, sacct).

use super::{Client, Output, print_rows, print_value, query};
use anyhow::Result;

#[derive(clap::Args)]
pub struct AuditArgs {
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub allocation: Option<String>,
    #[arg(long)]
    pub node: Option<String>,
    /// `YYYY-MM-DD` or ms since the epoch.
    #[arg(long)]
    pub since: Option<String>,
    #[arg(long)]
    pub until: Option<String>,
}

#[derive(clap::Args)]
pub struct HistoryArgs {
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub days: Option<u32>,
}

/// `lattice audit`: the entries and whether the hash chain holds.
pub fn audit(client: &Client, output: Output, args: AuditArgs) -> Result<()> {
    let AuditArgs {
        user,
        allocation,
        node,
        since,
        until,
    } = args;
    let q = query(&[
        ("user", &user),
        ("allocation", &allocation),
        ("node", &node),
        ("since", &since),
        ("until", &until),
    ]);
    let v = client.call("GET", &format!("/v1/audit/logs{q}"), None)?;
    let rows = v["entries"].as_array().cloned().unwrap_or_default();
    print_rows(&rows, output, false, "audit entry")?;
    if matches!(output, Output::Table | Output::Wide) {
        let valid = v["chain_valid"].as_bool().unwrap_or(false);
        println!("hash chain: {}", if valid { "valid" } else { "BROKEN" });
    }
    Ok(())
}

/// `lattice history`.
pub fn history(client: &Client, output: Output, tenant: &Option<String>, args: HistoryArgs) -> Result<()> {
    let HistoryArgs { user, days } = args;
    let days = days.map(|d| d.to_string());
    let scope = match (&user, &tenant) {
        (None, Some(t)) => ("tenant", Some(t.clone())),
        _ => ("user", user.clone()),
    };
    let path = format!("/v1/accounting{}", query(&[(scope.0, &scope.1), ("days", &days)]));
    let v = client.call("GET", &path, None)?;
    print_value(&v, output, crate::observe::history_view)?;
    Ok(())
}
