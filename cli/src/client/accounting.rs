//! `lattice audit` (the sensitive audit log) and `lattice history` (usage, sacct).

use super::{Client, Output, print_rows, print_value, query};
use anyhow::Result;

#[derive(clap::Args)]
pub struct AuditArgs {
    /// `query` (the book's `lattice audit query …`; the same as without it).
    #[arg(value_parser = ["query"], hide_possible_values = true)]
    pub verb: Option<String>,
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long, alias = "alloc")]
    pub allocation: Option<String>,
    #[arg(long)]
    pub node: Option<String>,
    /// Event types, comma-separated: claim, release, wipe, quarantine, attach, …
    #[arg(long)]
    pub event: Option<String>,
    /// Entries of allocations whose data (a mount's source) is under this path.
    #[arg(long)]
    pub data_path: Option<String>,
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
/// `tenant`: the `--tenant` given on the command line (entries of that tenant's allocations).
pub fn audit(client: &Client, output: Output, tenant: Option<String>, args: AuditArgs) -> Result<()> {
    let AuditArgs {
        verb: _,
        user,
        allocation,
        node,
        event,
        data_path,
        since,
        until,
    } = args;
    let q = query(&[
        ("user", &user),
        ("allocation", &allocation),
        ("node", &node),
        ("event", &event),
        ("data_path", &data_path),
        ("tenant", &tenant),
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
