//! `lattice admin`: nodes, the quorum (status, backups), tenants and their projects, vClusters'
//! weights, the accounting pipeline and federation.

use super::{Client, Output, print_value};
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use serde_json::{Value, json};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum AdminCmd {
    Drain {
        node: String,
    },
    Undrain {
        node: String,
    },
    /// Node administration: `wipe NODE --force` retries a quarantined node's secure wipe (after
    /// investigating it); wiped, it returns to the pool.
    Node {
        #[command(subcommand)]
        cmd: AdminNodeCmd,
    },
    /// The quorum's status (leader, term, members, commits, audit chain).
    RaftStatus,
    /// Tenants: `list` (the default), or `show NAME`: its quotas, what it holds, its 90-day usage.
    Tenant {
        #[command(subcommand)]
        cmd: Option<TenantCmd>,
    },
    /// Back up the quorum's state (written on the server, under its data folder), or `--verify` the
    /// latest backup (or `--path`).
    Backup {
        #[arg(long)]
        verify: bool,
        #[arg(long)]
        path: Option<String>,
    },
    /// vCluster administration.
    Vcluster {
        #[command(subcommand)]
        cmd: VclusterCmd,
    },
    /// The accounting pipeline (Waldur): `status`, or `reconcile --since 2026-03-01 --until
    /// 2026-03-02` to send a window's events again from the allocation records (after drops).
    Accounting {
        #[command(subcommand)]
        cmd: AccountingCmd,
    },
    /// A tenant's projects (Waldur's projects): `list --tenant T`, `show --tenant T NAME`, `create
    /// --tenant T --name N --max-nodes 50 …`, `update --tenant T NAME …`, `delete --tenant T NAME`.
    /// A project's hard quotas apply with its tenant's; the worse budget penalty of the two applies.
    Project {
        #[command(subcommand)]
        cmd: ProjectCmd,
    },
    /// Federation (SystemAdmin): `status`, `add-peer --name B --endpoint URL --workspace WS`,
    /// `remove-peer NAME`, `revoke-workspace WS` (every peer in it defederated at once).
    Federation {
        #[command(subcommand)]
        cmd: FederationCmd,
    },
}

#[derive(Subcommand)]
pub enum FederationCmd {
    Status,
    AddPeer {
        /// The peer's site name.
        #[arg(long)]
        name: String,
        /// Its broker's URL (each of its members: repeat).
        #[arg(long, required = true)]
        endpoint: Vec<String>,
        /// The shared workspace (its key in both sites' `federation.workspaces`).
        #[arg(long)]
        workspace: String,
    },
    RemovePeer {
        name: String,
    },
    RevokeWorkspace {
        workspace: String,
    },
}

#[derive(Subcommand)]
pub enum AdminNodeCmd {
    Wipe {
        node: String,
        /// Required: the node is wiped again.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub enum ProjectCmd {
    List {
        #[arg(long)]
        tenant: String,
    },
    Show {
        #[arg(long)]
        tenant: String,
        name: String,
    },
    /// Create a project (SystemAdmin): `--tenant physics --name qcd --max-nodes 50 …`.
    Create {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        name: String,
        #[command(flatten)]
        quota: QuotaFlags,
    },
    /// Change a project's quotas (only those given; `--clear max_nodes` removes one).
    Update {
        #[arg(long)]
        tenant: String,
        name: String,
        #[command(flatten)]
        quota: QuotaFlags,
    },
    /// Delete a project with nothing queued or running.
    Delete {
        #[arg(long)]
        tenant: String,
        name: String,
    },
}

#[derive(Subcommand)]
pub enum AccountingCmd {
    Status,
    Reconcile {
        /// A date (midnight UTC) or an RFC 3339 time.
        #[arg(long)]
        since: String,
        #[arg(long)]
        until: String,
    },
}

#[derive(Subcommand)]
pub enum TenantCmd {
    List,
    Show {
        name: String,
    },
    /// Create a tenant (SystemAdmin): `--name physics --max-nodes 100 …`.
    Create {
        #[arg(long)]
        name: String,
        #[command(flatten)]
        quota: QuotaFlags,
    },
    /// Change a tenant's quotas (only those given; `--clear max_nodes` removes one).
    Update {
        name: String,
        #[command(flatten)]
        quota: QuotaFlags,
    },
    /// `update` with the tenant as `--name` (the seed's other spelling).
    SetQuota {
        #[arg(long)]
        name: String,
        #[command(flatten)]
        quota: QuotaFlags,
    },
    /// Delete a tenant with nothing queued or running.
    Delete {
        name: String,
    },
}

/// A tenant's quota flags (hard: nodes, running allocations; soft: budgets, share, burst).
#[derive(clap::Args)]
pub struct QuotaFlags {
    #[arg(long)]
    max_nodes: Option<u32>,
    #[arg(long)]
    max_concurrent_allocations: Option<u32>,
    #[arg(long)]
    gpu_hours_budget: Option<f64>,
    #[arg(long)]
    node_hours_budget: Option<f64>,
    #[arg(long)]
    fair_share_target: Option<f64>,
    #[arg(long)]
    burst_allowance: Option<f64>,
    /// Quota keys to remove (e.g. `--clear max_nodes`).
    #[arg(long, value_delimiter = ',')]
    clear: Vec<String>,
}

impl QuotaFlags {
    pub fn body(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("max_nodes", self.max_nodes.map(|x| json!(x)));
        put(
            "max_concurrent_allocations",
            self.max_concurrent_allocations.map(|x| json!(x)),
        );
        put("gpu_hours_budget", self.gpu_hours_budget.map(|x| json!(x)));
        put("node_hours_budget", self.node_hours_budget.map(|x| json!(x)));
        put("fair_share_target", self.fair_share_target.map(|x| json!(x)));
        put("burst_allowance", self.burst_allowance.map(|x| json!(x)));
        for k in &self.clear {
            m.insert(k.clone(), Value::Null);
        }
        m
    }
}

#[derive(Subcommand)]
pub enum VclusterCmd {
    /// A vCluster's scheduler configuration and the weights in force (the quorum's, as the leader
    /// schedules with them).
    Show { vcluster: String },
    /// Replace a vCluster's weights (`--weights priority=0.3,wait_time=0.2,...` or a profile YAML's
    /// entry with `--profile FILE`); they take effect at its next cycle.
    SetWeights {
        vcluster: String,
        #[arg(long)]
        weights: Option<String>,
        #[arg(long)]
        profile: Option<PathBuf>,
    },
}

/// `lattice admin ...`.
pub fn run(client: &Client, output: Output, cmd: AdminCmd) -> Result<()> {
    match cmd {
        AdminCmd::Drain { node } => {
            let v = client.call("POST", &format!("/v1/nodes/{node}/drain"), None)?;
            print_value(&v, output, |v| {
                format!("{node}: {}\n", v["state"].as_str().unwrap_or_default())
            })?;
        }
        AdminCmd::Undrain { node } => {
            let v = client.call("POST", &format!("/v1/nodes/{node}/undrain"), None)?;
            print_value(&v, output, |v| {
                format!("{node}: {}\n", v["state"].as_str().unwrap_or_default())
            })?;
        }
        AdminCmd::RaftStatus => {
            // Structured either way: JSON unless YAML is asked for.
            let v = client.call("GET", "/api/v1/raft/status", None)?;
            let as_json = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
            print_value(&v, output, as_json)?;
        }
        AdminCmd::Backup { verify, path } => {
            let v = if verify {
                let q = path.map(|p| format!("?path={p}")).unwrap_or_default();
                client.call("GET", &format!("/api/v1/admin/backup/verify{q}"), None)?
            } else {
                client.call("POST", "/api/v1/admin/backup", None)?
            };
            let as_json = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
            print_value(&v, output, as_json)?;
        }
        AdminCmd::Federation { cmd } => federation(client, output, cmd)?,
        AdminCmd::Accounting { cmd } => accounting(client, output, cmd)?,
        AdminCmd::Tenant { cmd } => tenant(client, output, cmd)?,
        AdminCmd::Node {
            cmd: AdminNodeCmd::Wipe { node, force },
        } => {
            let body = json!({"force": force});
            let v = client.call("POST", &format!("/v1/nodes/{node}/wipe"), Some(&body))?;
            print_value(&v, output, |v| {
                format!(
                    "{node}: wiping again (quarantined by the wipe of {}); it returns to the pool once wiped\n",
                    v["claim"].as_str().unwrap_or_default()
                )
            })?;
        }
        AdminCmd::Project { cmd } => project(client, output, cmd)?,
        AdminCmd::Vcluster {
            cmd: VclusterCmd::Show { vcluster },
        } => show_vcluster(client, output, &vcluster)?,
        AdminCmd::Vcluster { cmd } => set_weights(client, output, cmd)?,
    }
    Ok(())
}

/// `lattice admin federation ...`.
fn federation(client: &Client, output: Output, cmd: FederationCmd) -> Result<()> {
    let v = match cmd {
        FederationCmd::Status => client.call("GET", "/api/v1/admin/federation", None)?,
        FederationCmd::AddPeer {
            name,
            endpoint,
            workspace,
        } => client.call(
            "POST",
            "/api/v1/admin/federation/peers",
            Some(&json!({"name": name, "endpoints": endpoint, "workspace": workspace})),
        )?,
        FederationCmd::RemovePeer { name } => {
            client.call("DELETE", &format!("/api/v1/admin/federation/peers/{name}"), None)?
        }
        FederationCmd::RevokeWorkspace { workspace } => client.call(
            "POST",
            &format!("/api/v1/admin/federation/workspaces/{workspace}/revoke"),
            None,
        )?,
    };
    print_value(&v, output, crate::observe::federation_status)?;
    Ok(())
}

/// `lattice admin accounting status|reconcile`.
fn accounting(client: &Client, output: Output, cmd: AccountingCmd) -> Result<()> {
    match cmd {
        AccountingCmd::Status => {
            let v = client.call("GET", "/api/v1/admin/accounting", None)?;
            print_value(&v, output, crate::observe::accounting_status)?;
        }
        AccountingCmd::Reconcile { since, until } => {
            let body = json!({"since": since, "until": until});
            let v = client.call("POST", "/api/v1/admin/accounting/reconcile", Some(&body))?;
            print_value(&v, output, |v| {
                format!(
                    "queued {} event(s) from {since} to {until} ({} dropped: buffers full)\n",
                    v["queued"], v["dropped"]
                )
            })?;
        }
    }
    Ok(())
}

/// `lattice admin tenant [list|show|create|update|set-quota|delete]`.
fn tenant(client: &Client, output: Output, cmd: Option<TenantCmd>) -> Result<()> {
    match cmd {
        None | Some(TenantCmd::List) => {
            let v = client.call("GET", "/v1/tenants", None)?;
            print_value(&v, output, |v| {
                v["tenants"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| format!("{}\n", t.as_str().unwrap_or_default()))
                    .collect()
            })?;
        }
        Some(TenantCmd::Create { name, quota }) => {
            let mut body = quota.body();
            body.insert("name".into(), json!(name));
            let v = client.call("POST", "/api/v1/tenants", Some(&Value::Object(body)))?;
            print_value(&v, output, |v| {
                format!("created tenant {name}\n{}", crate::observe::tenant_view(v))
            })?;
        }
        Some(TenantCmd::Update { name, quota } | TenantCmd::SetQuota { name, quota }) => {
            let body = Value::Object(quota.body());
            let v = client.call("PUT", &format!("/api/v1/tenants/{name}"), Some(&body))?;
            if let Some(w) = v["warning"].as_str() {
                eprintln!("warning: {w}");
            }
            print_value(&v, output, |v| {
                format!("updated tenant {name}\n{}", crate::observe::tenant_view(v))
            })?;
        }
        Some(TenantCmd::Delete { name }) => {
            let v = client.call("DELETE", &format!("/api/v1/tenants/{name}"), None)?;
            print_value(&v, output, |_| format!("deleted tenant {name}\n"))?;
        }
        Some(TenantCmd::Show { name }) => {
            let v = client.call("GET", &format!("/v1/tenants/{name}"), None)?;
            print_value(&v, output, crate::observe::tenant_view)?;
        }
    }
    Ok(())
}

/// `lattice admin project list|show|create|update|delete`.
fn project(client: &Client, output: Output, cmd: ProjectCmd) -> Result<()> {
    match cmd {
        ProjectCmd::List { tenant } => {
            let v = client.call("GET", &format!("/api/v1/tenants/{tenant}/projects"), None)?;
            print_value(&v, output, |v| {
                v["projects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(crate::observe::project_view)
                    .collect()
            })?;
        }
        ProjectCmd::Show { tenant, name } => {
            let v = client.call("GET", &format!("/api/v1/tenants/{tenant}/projects/{name}"), None)?;
            print_value(&v, output, crate::observe::project_view)?;
        }
        ProjectCmd::Create { tenant, name, quota } => {
            let mut body = quota.body();
            body.insert("name".into(), json!(name));
            let path = format!("/api/v1/tenants/{tenant}/projects");
            let v = client.call("POST", &path, Some(&Value::Object(body)))?;
            print_value(&v, output, |v| {
                format!("created project {tenant}/{name}\n{}", crate::observe::project_view(v))
            })?;
        }
        ProjectCmd::Update { tenant, name, quota } => {
            let body = Value::Object(quota.body());
            let path = format!("/api/v1/tenants/{tenant}/projects/{name}");
            let v = client.call("PUT", &path, Some(&body))?;
            if let Some(w) = v["warning"].as_str() {
                eprintln!("warning: {w}");
            }
            print_value(&v, output, |v| {
                format!("updated project {tenant}/{name}\n{}", crate::observe::project_view(v))
            })?;
        }
        ProjectCmd::Delete { tenant, name } => {
            let v = client.call("DELETE", &format!("/api/v1/tenants/{tenant}/projects/{name}"), None)?;
            print_value(&v, output, |_| format!("deleted project {tenant}/{name}\n"))?;
        }
    }
    Ok(())
}

/// `lattice admin vcluster show VCLUSTER`.
fn show_vcluster(client: &Client, output: Output, vcluster: &str) -> Result<()> {
    let v = client.call("GET", &format!("/v1/vclusters/{vcluster}"), None)?;
    print_value(&v, output, |v| {
        let mut out = format!(
            "{vcluster}: {} (cycle {} s, preemption {}, lend cap {})\n",
            v["policy"].as_str().unwrap_or_default(),
            v["cycle_interval_s"],
            v["preemption"],
            v["lend_cap"]
        );
        match v["weights"].as_object() {
            Some(w) => {
                for (k, x) in w {
                    out.push_str(&format!("  {k:<15} {x}\n"));
                }
            }
            None => out.push_str("  no weights: the queue is in arrival order\n"),
        }
        out
    })?;
    Ok(())
}

/// `lattice admin vcluster set-weights VCLUSTER`.
fn set_weights(client: &Client, output: Output, cmd: VclusterCmd) -> Result<()> {
    let VclusterCmd::SetWeights {
        vcluster,
        weights,
        profile,
    } = cmd
    else {
        bail!("not a weights change");
    };
    let body: serde_json::Map<String, Value> = match (weights, profile) {
        (Some(w), None) => w
            .split(',')
            .map(|kv| {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("`{kv}`: expected NAME=VALUE"))?;
                let v: f64 = v.trim().parse().with_context(|| format!("`{kv}`: not a number"))?;
                Ok((k.trim().to_string(), json!(v)))
            })
            .collect::<Result<_>>()?,
        (None, Some(p)) => {
            let prof = lattice_traces::read_profile(&p)?;
            let entry = prof
                .vclusters
                .get(&vcluster)
                .or_else(|| prof.vclusters.values().next().filter(|_| prof.vclusters.len() == 1))
                .with_context(|| format!("{}: no entry for vCluster `{vcluster}`", p.display()))?;
            let w = entry.weights;
            [
                ("priority", w.priority),
                ("wait_time", w.wait_time),
                ("fair_share", w.fair_share),
                ("topology", w.topology),
                ("data_readiness", w.data_readiness),
                ("backlog", w.backlog),
                ("energy", w.energy),
                ("checkpoint", w.checkpoint),
                ("conformance", w.conformance),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect()
        }
        _ => bail!("give exactly one of --weights NAME=VALUE,... and --profile FILE"),
    };
    let v = client.call(
        "PUT",
        &format!("/v1/vclusters/{vcluster}/weights"),
        Some(&Value::Object(body)),
    )?;
    print_value(&v, output, |_| {
        format!("weights of {vcluster} set; they apply from its next cycle\n")
    })?;
    Ok(())
}
