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

/// A usage window: the last `--days`, or `--since` [`--until`].
#[derive(clap::Args)]
pub struct Window {
    /// The last N days (default 90).
    #[arg(long, conflicts_with = "since")]
    pub days: Option<u32>,
    /// From this instant (`YYYY-MM-DD` or ms since the epoch)…
    #[arg(long)]
    pub since: Option<String>,
    /// …to this one (default: now).
    #[arg(long)]
    pub until: Option<String>,
}

impl Window {
    /// The window's query parameters.
    fn params(self) -> [(&'static str, Option<String>); 3] {
        [
            ("days", self.days.map(|d| d.to_string())),
            ("since", self.since),
            ("until", self.until),
        ]
    }
}

#[derive(clap::Args)]
pub struct HistoryArgs {
    #[arg(long)]
    pub user: Option<String>,
    #[command(flatten)]
    pub window: Window,
}

/// `lattice usage`.
#[derive(clap::Args)]
pub struct UsageArgs {
    /// A user's usage (default: yours, unless `--tenant` names a tenant).
    #[arg(long)]
    pub user: Option<String>,
    #[command(flatten)]
    pub window: Window,
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
    let HistoryArgs { user, window } = args;
    let scope = match (&user, &tenant) {
        (None, Some(t)) => ("tenant", Some(t.clone())),
        _ => ("user", user.clone()),
    };
    let [d, f, u] = window.params();
    let q = query(&[(scope.0, &scope.1), (d.0, &d.1), (f.0, &f.1), (u.0, &u.1)]);
    let path = format!("/v1/accounting{q}");
    let v = client.call("GET", &path, None)?;
    print_value(&v, output, crate::observe::history_view)?;
    Ok(())
}

/// `lattice usage`: the totals of a tenant (`--tenant` given on the command line) or a user (`--user`,
/// or the caller: the server knows who that is).
pub fn usage(client: &Client, output: Output, tenant: Option<String>, args: UsageArgs) -> Result<()> {
    let UsageArgs { user, window } = args;
    let [d, f, u] = window.params();
    let q = query(&[
        ("tenant", &tenant),
        ("user", &user),
        (d.0, &d.1),
        (f.0, &f.1),
        (u.0, &u.1),
    ]);
    let v = client.call("GET", &format!("/api/v1/usage{q}"), None)?;
    print_value(&v, output, |v| {
        let who = match (&tenant, &user) {
            (Some(t), _) => format!("tenant {t}"),
            (None, Some(u)) => format!("user {u}"),
            (None, None) => "you".to_string(),
        };
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        format!(
            "usage of {who}: {} allocations, {:.2} node-hours, {:.2} GPU-hours\n",
            v["allocations"].as_u64().unwrap_or(0),
            f("node_hours"),
            f("gpu_hours")
        )
    })
}
