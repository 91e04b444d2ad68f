//! `lattice admin`: nodes, the quorum (status, backups), tenants and their projects, vClusters'
//! configuration ([`super::vcluster`]), network domains, the accounting pipeline and federation.

use super::{Client, Output, print_value};
use anyhow::Result;
use clap::Subcommand;
use serde_json::{Value, json};

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
    /// vCluster administration: `show`, `create`, `set-config`, `set-weights` (committed at the
    /// quorum; every leader schedules with them).
    Vcluster {
        #[command(subcommand)]
        cmd: super::vcluster::VclusterCmd,
    },
    /// Runtime configuration by key: `get vclusters.NAME[.KEY]`, `set vclusters.NAME.KEY=VALUE`.
    Config {
        #[command(subcommand)]
        cmd: super::vcluster::ConfigCmd,
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
    /// Network domains: `domains` (each with its VNI, members and grace period, and the VNI pool),
    /// `set-grace --domain NAME --grace 15m` (the tenant's domain, `-t`, keeps its VNI that long
    /// once empty; `--grace default` goes back to the site's; quorum state, SystemAdmin).
    Network {
        #[command(subcommand)]
        cmd: NetworkCmd,
    },
    /// Federation (SystemAdmin): `status`, `add-peer --name B --endpoint URL --workspace WS`,
    /// `remove-peer NAME`, `revoke-workspace WS` (every peer in it defederated at once).
    Federation {
        #[command(subcommand)]
        cmd: FederationCmd,
    },
}

#[derive(Subcommand)]
pub enum NetworkCmd {
    /// The network domains (every tenant's for operators) and the VNI pool.
    Domains,
    /// How long the tenant's (`-t`) domain NAME keeps its VNI once its last allocation ended, so
    /// DAG stages with longer gaps rejoin it (the timer restarts whenever one joins).
    SetGrace {
        /// The domain's name (`connectivity.network_domain`).
        #[arg(long)]
        domain: String,
        /// A duration (`15m`, `2h`, seconds), or `default` for the site's grace period.
        #[arg(long)]
        grace: String,
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

/// `lattice admin ...` (`tenant`: the tenant the global flags select).
pub fn run(client: &Client, output: Output, selected: &Option<String>, cmd: AdminCmd) -> Result<()> {
    match cmd {
        AdminCmd::Network { cmd } => network(client, output, selected, cmd)?,
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
        AdminCmd::Vcluster { cmd } => super::vcluster::vcluster(client, output, cmd)?,
        AdminCmd::Config { cmd } => super::vcluster::config(client, output, cmd)?,
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

/// `lattice admin network domains|set-grace`: the domains' view, and a domain's own grace period as
/// the site setting `network.grace_by_domain.TENANT/NAME` (committed at the quorum).
fn network(client: &Client, output: Output, tenant: &Option<String>, cmd: NetworkCmd) -> Result<()> {
    match cmd {
        NetworkCmd::Domains => {
            let v = client.call("GET", "/v1/network/domains", None)?;
            print_value(&v, output, |v| {
                let rows: Vec<Vec<String>> = v["domains"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| {
                        let members: Vec<&str> = d["allocations"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        vec![
                            d["tenant"].as_str().unwrap_or_default().to_string(),
                            d["name"].as_str().unwrap_or_default().to_string(),
                            d["vni"].to_string(),
                            if d["draining"] == true { "draining" } else { "active" }.to_string(),
                            format!("{}s", d["grace_s"]),
                            members.join(","),
                        ]
                    })
                    .collect();
                let table = crate::observe::table(&["tenant", "name", "vni", "state", "grace", "allocations"], &rows);
                format!(
                    "{table}VNI pool: {} of {} in use\n",
                    v["vni_pool"]["in_use"], v["vni_pool"]["total"]
                )
            })
        }
        NetworkCmd::SetGrace { domain, grace } => {
            anyhow::ensure!(!domain.is_empty(), "--domain: a domain name is needed");
            let Some(tenant) = tenant.as_deref().filter(|t| !t.is_empty()) else {
                anyhow::bail!(
                    "no tenant: network domains are scoped to a tenant; pass --tenant, set LATTICE_TENANT, or `tenant:` in ~/.config/lattice/config.yaml"
                );
            };
            anyhow::ensure!(!tenant.contains('/'), "--tenant: `{tenant}` is not a tenant name");
            let key = lattice_engine::controller::settings::grace_key(tenant, &domain);
            let value = if grace == "default" {
                Value::Null
            } else {
                super::vcluster::value_of(&grace)
            };
            let v = client.call("PATCH", "/v1/config", Some(&json!({ key.clone(): value })))?;
            let now = v[&key]
                .as_f64()
                .map_or("the site's default".to_string(), |s| format!("{s}s"));
            print_value(&v, output, |_| {
                format!("network domain {domain} of {tenant}: grace period {now}; in force at the quorum\n")
            })
        }
    }
}
