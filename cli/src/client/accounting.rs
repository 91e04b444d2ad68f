//! `lattice audit` (the sensitive audit log) and `lattice history` (usage, sacct).

use super::{Client, Output, print_rows, print_value, query};
use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct AuditArgs {
    /// `query` (the book's `lattice audit query …`; the same as without it); `export` (the entries
    /// the filters select as a bundle signed with the site's audit key, to `--out FILE` or stdout);
    /// `verify FILE` (checks an exported bundle offline and names the first entry that fails).
    #[arg(value_parser = ["query", "export", "verify"])]
    pub verb: Option<String>,
    /// `verify`: the bundle file.
    pub file: Option<std::path::PathBuf>,
    /// `export`: where to write the bundle (`-o/--output` is the output format).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// `verify`: the site's audit public key (hex; repeatable): entries and the bundle must be
    /// signed with one of them. Without it, the keys the bundle names are shown for you to compare.
    #[arg(long)]
    pub key: Vec<String>,
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
        verb,
        file: _,
        out,
        key: _,
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
    if verb.as_deref() == Some("export") {
        let bundle = client.call("GET", &format!("/v1/audit/export{q}"), None)?;
        let text = serde_json::to_string_pretty(&bundle)?;
        let n = bundle["entries"].as_array().map_or(0, Vec::len);
        match out {
            Some(path) => {
                std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
                eprintln!(
                    "{n} entries exported to {}, signed with key {}",
                    path.display(),
                    bundle["key"].as_str().unwrap_or_default()
                );
            }
            None => println!("{text}"),
        }
        return Ok(());
    }
    let v = client.call("GET", &format!("/v1/audit/logs{q}"), None)?;
    let rows = v["entries"].as_array().cloned().unwrap_or_default();
    print_rows(&rows, output, false, "audit entry")?;
    if matches!(output, Output::Table | Output::Wide) {
        let valid = v["chain_valid"].as_bool().unwrap_or(false);
        println!("hash chain: {}", if valid { "valid" } else { "BROKEN" });
    }
    Ok(())
}

/// `lattice audit verify FILE [--key HEX]…`: an exported bundle checked offline (no server, no
/// login): every entry's hash, signature and key, the links between consecutive entries, and the
/// bundle's own signature. Fails naming the first entry (or the bundle) that does not hold.
pub fn verify(args: &AuditArgs) -> Result<()> {
    let path = args.file.as_ref().context("lattice audit verify FILE: which bundle?")?;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let bundle: lattice_engine::audit::Bundle =
        serde_json::from_str(&text).with_context(|| format!("{}: not an audit bundle", path.display()))?;
    let trusted = (!args.key.is_empty()).then_some(args.key.as_slice());
    let n = lattice_engine::audit::verify_bundle(&bundle, trusted)
        .with_context(|| format!("{}: does not verify", path.display()))?;
    let keys: std::collections::BTreeSet<&str> = bundle
        .entries
        .iter()
        .map(|e| e.key.as_str())
        .chain([bundle.key.as_str()])
        .collect();
    println!(
        "{}: {n} entries verified (hashes, signatures, links), the bundle's signature verified; chain at export: {}",
        path.display(),
        if bundle.chain_valid { "valid" } else { "BROKEN" }
    );
    let keys = keys.into_iter().collect::<Vec<_>>().join(", ");
    match trusted {
        Some(_) => println!("signed with trusted key(s): {keys}"),
        None => println!("signed with key(s) {keys}: compare with your site's audit public key, or pass --key"),
    }
    if !bundle.chain_valid {
        anyhow::bail!("the quorum's audit chain was broken when this bundle was exported");
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
