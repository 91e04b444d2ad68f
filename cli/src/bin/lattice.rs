//! `lattice` — the command-line client of `lattice-runtime` (REST): submit (flags, or a script's
//! `#LATTICE`/`#SBATCH` directives), status, cancel, nodes and admin. The endpoint and tenant come from
//! `--endpoint`/`--tenant`, else `LATTICE_ENDPOINT`/`LATTICE_TENANT`, else
//! `~/.config/lattice/config.yaml` (`endpoint:`, `tenant:`), else `http://127.0.0.1:8080`; the bearer
//! token from `LATTICE_TOKEN`, the file's `token:`, or what `lattice login` cached for the endpoint
//! (`~/.config/lattice/tokens.json`, refreshed when it expires). For an `https://` endpoint the site CA comes from
//! `LATTICE_CA` or `ca:` (PEM; default: the system's roots), and under mTLS the client certificate from
//! `LATTICE_CLIENT_CERT`/`LATTICE_CLIENT_KEY` or `client_cert:`/`client_key:`.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use lattice_cli::directives::{SubmitFields, parse_script};
use serde_json::{Value, json};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "lattice", version, about = "Lattice client: submit and manage allocations")]
struct Cli {
    /// Runtime REST endpoint (default: LATTICE_ENDPOINT, the config file, http://127.0.0.1:8080).
    #[arg(long, global = true)]
    endpoint: Option<String>,
    /// Output format: table (the default), wide, json or yaml — for every command (json and yaml
    /// print the API's answer).
    #[arg(short, long, global = true, value_enum)]
    output: Option<Output>,
    /// Tenant to submit as (default: LATTICE_TENANT or the config file).
    #[arg(long, global = true)]
    tenant: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

/// (Parsed once per run: the size of its largest variant does not matter.)
#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Cmd {
    /// Submit an allocation: `lattice submit --nodes=2 --walltime=1h -- CMD ARGS` or
    /// `lattice submit job.sh` (directives in the script; flags override them). Prints its id.
    Submit {
        #[arg(long)]
        nodes: Option<u32>,
        #[arg(long)]
        walltime: Option<String>,
        #[arg(long)]
        vcluster: Option<String>,
        #[arg(long)]
        preemption_class: Option<i64>,
        #[arg(long)]
        gpu_type: Option<String>,
        #[arg(long)]
        gpus: Option<u32>,
        #[arg(long)]
        constraint: Vec<String>,
        #[arg(long)]
        name: Option<String>,
        /// Simulated agents only: how long the run takes.
        #[arg(long)]
        duration: Option<String>,
        /// A task group (job array): `0-99%20` = indices 0..99, at most 20 running at once
        /// (`$LATTICE_TASK_INDEX` in each; `${INDEX}` in the command is replaced by it).
        #[arg(long, value_parser = lattice_cli::directives::TaskGroupSpec::parse)]
        task_group: Option<lattice_cli::directives::TaskGroupSpec>,
        /// The software environment: a uenv, `name/version:tag` (mounted at /user-environment for the
        /// job's processes).
        #[arg(long)]
        uenv: Option<String>,
        /// The uenv view to activate (its environment variables).
        #[arg(long)]
        view: Option<String>,
        /// An OCI image instead of a uenv, `NAME[:TAG]` from the nodes' image store (a container).
        #[arg(long)]
        image: Option<String>,
        /// A data mount, `SOURCE:TARGET[:ro]` (`s3://bucket/dataset:/data`), repeatable: the agents
        /// mount it from the site's storage for the job's processes alone.
        #[arg(long = "data-mount", value_parser = lattice_cli::directives::DataMountSpec::parse)]
        data_mount: Vec<lattice_cli::directives::DataMountSpec>,
        /// Start only after these end: `ID:success|failure|any,...` (`#SBATCH --dependency=afterok:ID`).
        #[arg(long = "depends-on")]
        depends_on: Option<String>,
        /// Federation: run it at this peer site, or `auto` (the federation broker picks by data
        /// gravity, capacity, energy price and authorization; sensitive work never leaves). Prints
        /// `SITE/ID` when it went elsewhere.
        #[arg(long)]
        site: Option<String>,
        /// A batch script (its directives are read), or the command after `--`.
        #[arg(trailing_var_arg = true)]
        command: Vec<String>,
    },
    /// Allocations (all of the tenant's, or one): `-o table|wide|json|yaml`, `--watch` to refresh.
    Status {
        id: Option<String>,
        #[arg(long)]
        watch: bool,
        #[arg(long)]
        user: Option<String>,
        /// Every tenant's allocations.
        #[arg(long)]
        all: bool,
        /// Federation: allocations this site forwarded to that peer (`all`: to every peer).
        #[arg(long)]
        site: Option<String>,
    },
    /// Cancel allocations (`--site`: ones forwarded to that peer).
    Cancel {
        ids: Vec<String>,
        #[arg(long)]
        site: Option<String>,
    },
    /// The output of an allocation's processes: from the log store (or the tail each node's agent
    /// reported when it ended); `--follow` streams it live while it runs.
    Logs {
        /// An allocation (`a-000012`) or a task launch in it (`a-000012.1`).
        id: String,
        /// Live tail: print new output as the agents send it, until the allocation ends.
        #[arg(short, long)]
        follow: bool,
        /// Only this node's output.
        #[arg(long)]
        node: Option<String>,
        /// Only the last N lines (of each node's, or each rank's, output).
        #[arg(long)]
        tail: Option<usize>,
        /// Only stderr (printed to stdout). Without it both streams are shown: the processes' stdout
        /// on stdout, their stderr on stderr (a task launch, `a-000012.1`: each rank's stdout).
        #[arg(long)]
        stderr: bool,
        /// A task launch: only this rank's output.
        #[arg(long)]
        rank: Option<u32>,
        /// Federation: an allocation forwarded to that peer (its stdout, as the peer has it).
        #[arg(long)]
        site: Option<String>,
    },
    /// Run tasks within a running allocation (srun's counterpart): `lattice launch --alloc=ID -n 4
    /// [--tasks-per-node=K] [--env K=V] -- PROG ARGS`. The ranks get a PMI server (MPI without SSH or
    /// mpiexec) and the seed's rank environment; each rank's stdout and stderr are printed apart when
    /// the launch ends. Exits 0 when every rank did, else with the first failing rank's code.
    /// Inside an allocation `--alloc` defaults to it; a multi-node script calls it on node 0 only
    /// (on the others it returns 0 at once: node 0's launch already spans them).
    Launch {
        #[arg(long)]
        alloc: Option<String>,
        /// Ranks in all (default: --tasks-per-node on every node, or one per node).
        #[arg(short = 'n', long = "ntasks")]
        ntasks: Option<u32>,
        #[arg(long)]
        tasks_per_node: Option<u32>,
        /// `NAME=VALUE` for every rank (repeatable).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// `pmi2` (default; PMI-1 clients are served too) or `pmix`.
        #[arg(long)]
        pmi: Option<String>,
        /// Abort the launch when a PMI fence takes longer (default: the agents', 60s).
        #[arg(long)]
        fence_timeout: Option<String>,
        /// `RANK: ` before each line of output.
        #[arg(short, long)]
        label: bool,
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Slurm's `srun` inside an allocation, as `lattice launch` (`-n`, `--ntasks-per-node`,
    /// `--export`, `-l`, `--mpi`); the agents put an `srun` that calls this on the allocation's PATH.
    Srun {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A terminal inside a running allocation (its owner or an admin): a login shell on its first node
    /// (or `--node`), or `--command`. Keys, Ctrl-C and window sizes go through; exits with the remote
    /// exit status.
    Attach {
        id: String,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        command: Option<String>,
    },
    /// An interactive session: an allocation that holds its nodes until you leave. Waits for it to
    /// start, opens a terminal on its first node, and ends the allocation when the terminal ends.
    Session {
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        #[arg(long, default_value = "4h")]
        walltime: String,
        #[arg(long)]
        vcluster: Option<String>,
        #[arg(long)]
        constraint: Vec<String>,
        #[arg(long)]
        uenv: Option<String>,
        #[arg(long)]
        view: Option<String>,
    },
    /// The nodes' image caches (warm and evict need the Operator role): `warm --image U [--nodes A,B |
    /// --group G] [--sticky]`, `list [--node N]`, `evict --image U [--nodes A,B | --group G]`.
    Cache {
        #[command(subcommand)]
        cmd: CacheCmd,
    },
    /// Nodes and their state.
    Nodes,
    /// DAGs of allocations: `submit FILE` (YAML or JSON: `allocations:` with `name` and `depends_on`),
    /// `status ID`, `cancel ID`.
    Dag {
        #[command(subcommand)]
        cmd: DagCmd,
    },
    /// Administration.
    Admin {
        #[command(subcommand)]
        cmd: AdminCmd,
    },
    /// Follow an allocation until it ends: a line for each change of state (time, state, nodes,
    /// reason); exits 0 when it completed, 1 when it failed or was cancelled.
    Watch {
        id: String,
        /// The live metrics instead (all, or these, comma-separated): a line per period of its
        /// telemetry mode (30 s prod, 1 s debug), from the TSDB.
        #[arg(long, num_args = 0..=1, default_missing_value = "")]
        metrics: Option<String>,
        /// Only the alerts of the live metrics stream.
        #[arg(long)]
        alerts_only: bool,
        /// Seconds between looks.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Why an allocation is where it is: what the scheduler's last pass found (dependencies, staging,
    /// quota, budget, energy window, topology, a reservation, the head of the queue), its place in
    /// its vCluster's queue, a refused start.
    /// With `--network` / `--storage` (or once it runs): the network diagnostics (nodes, dragonfly
    /// groups, network domain) and the storage ones (mounts, throughput against its QoS floor).
    Diag {
        id: String,
        #[arg(long)]
        network: bool,
        #[arg(long)]
        storage: bool,
    },
    /// Allocations' metrics side by side, aligned to each one's start (from the TSDB):
    /// `lattice compare ID ID [--metric gpu_utilization,io_write_bytes]`.
    Compare {
        #[arg(required = true, num_args = 1..)]
        ids: Vec<String>,
        /// Comma-separated metrics (default: all).
        #[arg(long)]
        metric: Option<String>,
        /// `relative` (from each start) or `absolute` (unix seconds).
        #[arg(long, default_value = "relative")]
        align: String,
        /// Seconds between points, e.g. `5s`.
        #[arg(long)]
        step: Option<String>,
    },
    /// A live view of the cluster in the terminal: nodes by state, running allocations and the waiting
    /// ones with why they wait; refreshes every `--interval` seconds until Ctrl-C (`--once`: print once).
    /// `lattice top ID`: that allocation's metrics from the TSDB (`--per-node`, `--per-gpu`,
    /// `--duration 1h`).
    Top {
        /// One allocation's metrics instead of the cluster view.
        id: Option<String>,
        #[arg(long)]
        per_node: bool,
        #[arg(long)]
        per_gpu: bool,
        /// Every metric, per node.
        #[arg(long)]
        wide: bool,
        /// The window (default 5m).
        #[arg(long)]
        duration: Option<String>,
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        #[arg(long)]
        once: bool,
        /// Every tenant's allocations (default: the configured tenant's).
        #[arg(long)]
        all: bool,
    },
    /// Node administration (the Operator role): `drain|undrain|disable|enable NODE`.
    Node {
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// The quorum's sensitive audit log, and whether its hash chain holds.
    Audit {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        allocation: Option<String>,
        #[arg(long)]
        node: Option<String>,
        /// `YYYY-MM-DD` or ms since the epoch.
        #[arg(long)]
        since: Option<String>,
        #[arg(long)]
        until: Option<String>,
    },
    /// Usage history (sacct): each allocation's node-hours and GPU-hours, and the totals, of a tenant
    /// (`--tenant`) or a user (`--user`) over the last `--days` (90).
    History {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        days: Option<u32>,
    },
    /// Switch an allocation's telemetry mode: `lattice telemetry ID --mode debug --duration 30m`
    /// (prod | debug | audit; debug reverts to prod after its duration).
    Telemetry {
        id: String,
        #[arg(long)]
        mode: String,
        #[arg(long)]
        duration: Option<String>,
    },
    /// Log in to the server (OIDC device code flow): the IdP comes from the server's auth discovery;
    /// open the address shown, enter the code, and the token is cached for this server (0600).
    Login {
        /// `device` (the only flow: works over SSH, no browser on this machine needed).
        #[arg(long, value_enum, default_value = "device")]
        flow: Flow,
        /// OAuth scopes to ask for.
        #[arg(long, default_value = "openid offline_access")]
        scope: String,
    },
    /// Forget this server's cached token and revoke it at the IdP (best effort).
    Logout,
    /// The client's effective configuration: each setting and where it comes from.
    Config,
    /// A shell completion script: `lattice completion bash > /etc/bash_completion.d/lattice`.
    Completion { shell: clap_complete::Shell },
}

#[derive(Clone, Copy, ValueEnum)]
enum Flow {
    Device,
}

#[derive(Subcommand)]
enum NodeCmd {
    /// No new work; what runs finishes.
    Drain {
        node: String,
    },
    Undrain {
        node: String,
    },
    /// Out of service at once (its allocations are requeued or fail per their policy).
    Disable {
        node: String,
    },
    Enable {
        node: String,
    },
}

#[derive(Subcommand)]
enum CacheCmd {
    /// Pull a uenv into the nodes' caches ahead of the jobs that need it.
    Warm {
        #[arg(long)]
        image: String,
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// The nodes of this dragonfly group.
        #[arg(long)]
        group: Option<u32>,
        /// Never evict it afterwards.
        #[arg(long)]
        sticky: bool,
    },
    /// What each node has cached, orders not yet carried out, and recent outcomes.
    List {
        #[arg(long)]
        node: Option<String>,
    },
    /// Remove a uenv from the nodes' caches (not while a running allocation has it mounted).
    Evict {
        #[arg(long)]
        image: String,
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        #[arg(long)]
        group: Option<u32>,
    },
}

#[derive(Subcommand)]
enum DagCmd {
    Submit {
        file: PathBuf,
    },
    Status {
        id: String,
    },
    /// Its structure: each member and what it runs after.
    Graph {
        id: String,
    },
    Cancel {
        id: String,
    },
}

#[derive(Subcommand)]
enum AdminCmd {
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
enum FederationCmd {
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
enum AdminNodeCmd {
    Wipe {
        node: String,
        /// Required: the node is wiped again.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
enum ProjectCmd {
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
enum AccountingCmd {
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
enum TenantCmd {
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
struct QuotaFlags {
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
    fn body(&self) -> serde_json::Map<String, Value> {
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
enum VclusterCmd {
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

struct Client {
    base: String,
    agent: ureq::Agent,
    /// `Authorization: Bearer` token (LATTICE_TOKEN or the config file's `token:`).
    token: Option<String>,
}

impl Client {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        macro_rules! authed {
            ($req:expr) => {{
                let r = $req;
                match &auth {
                    Some(a) => r.header("Authorization", a),
                    None => r,
                }
            }};
        }
        // A request refused by the rate limit (429) was not processed: it is sent again after the
        // server's Retry-After (a few times).
        let mut tries = 0;
        let (mut resp, status) = loop {
            let resp = match (method, body) {
                ("GET", _) => authed!(self.agent.get(&url)).call(),
                ("DELETE", _) => authed!(self.agent.delete(&url)).call(),
                ("POST", Some(b)) => authed!(self.agent.post(&url)).send_json(b),
                ("POST", None) => authed!(self.agent.post(&url)).send_empty(),
                ("PUT", Some(b)) => authed!(self.agent.put(&url)).send_json(b),
                ("PATCH", Some(b)) => authed!(self.agent.patch(&url)).send_json(b),
                _ => bail!("unsupported request {method} {path}"),
            };
            let resp = resp.with_context(|| format!("cannot reach the Lattice API at {}", self.base))?;
            let status = resp.status().as_u16();
            tries += 1;
            if status != 429 || tries > 5 {
                break (resp, status);
            }
            let wait = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .unwrap_or(1.0)
                .min(30.0);
            std::thread::sleep(std::time::Duration::from_secs_f64(wait));
        };
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status == 401 && self.token.is_none() {
            bail!("Not logged in. Run `lattice login` first.");
        }
        if status == 404 && v.as_str() == Some("") && path.contains("/federation") {
            bail!(
                "this site has no federation: its lattice-runtime is built without the `federation` feature (HTTP 404)"
            );
        }
        if status >= 400 {
            let msg = v["error"].as_str().unwrap_or("request failed");
            match v["field"].as_str() {
                Some(f) => bail!("{msg} (field `{f}`, HTTP {status})"),
                None => bail!("{msg} (HTTP {status})"),
            }
        }
        Ok(v)
    }
}

impl Client {
    /// Reads the Server-Sent Events of `GET path`, handing each (event, JSON data) to `each` until it
    /// returns false or the server closes the stream.
    fn events(&self, path: &str, mut each: impl FnMut(&str, &Value) -> bool) -> Result<()> {
        use std::io::BufRead;
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.get(&url).header("Accept", "text/event-stream");
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let mut resp = req
            .call()
            .with_context(|| format!("cannot reach the Lattice API at {}", self.base))?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            if status == 401 && self.token.is_none() {
                bail!("Not logged in. Run `lattice login` first.");
            }
            let msg = v["error"].as_str().unwrap_or("request failed");
            match v["field"].as_str() {
                Some(f) => bail!("{msg} (field `{f}`, HTTP {status})"),
                None => bail!("{msg} (HTTP {status})"),
            }
        }
        let reader = std::io::BufReader::new(resp.into_body().into_reader());
        let mut event = String::from("message");
        for line in reader.lines() {
            let line = line.with_context(|| format!("reading the stream {url}"))?;
            if let Some(e) = line.strip_prefix("event:") {
                event = e.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                let v: Value = serde_json::from_str(d.trim()).unwrap_or(Value::String(d.trim().to_string()));
                if !each(&event, &v) {
                    break;
                }
            } else if line.is_empty() {
                event = "message".into();
            }
        }
        Ok(())
    }
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    endpoint: Option<String>,
    tenant: Option<String>,
    /// The vCluster submissions go to when `--vcluster` is not given.
    vcluster: Option<String>,
    token: Option<String>,
    ca: Option<PathBuf>,
    client_cert: Option<PathBuf>,
    client_key: Option<PathBuf>,
}

/// `~/.config/lattice/config.yaml`; absent is fine, unreadable or invalid is an error naming it.
fn file_config() -> Result<FileConfig> {
    let Some(home) = std::env::var_os("HOME") else {
        return Ok(FileConfig::default());
    };
    let path = PathBuf::from(home).join(".config/lattice/config.yaml");
    if !path.exists() {
        return Ok(FileConfig::default());
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    yaml_serde::from_str(&text).with_context(|| format!("{}", path.display()))
}

/// The HTTP agent: the site CA and client certificate when configured (rustls, ring).
fn http_agent(fc: &FileConfig) -> Result<ureq::Agent> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let path = |env: &str, file: &Option<PathBuf>| std::env::var_os(env).map(PathBuf::from).or(file.clone());
    let read = |what: &str, p: &PathBuf| std::fs::read(p).with_context(|| format!("{what}: reading {}", p.display()));
    let mut tls = TlsConfig::builder().provider(TlsProvider::Rustls);
    if let Some(ca) = path("LATTICE_CA", &fc.ca) {
        let pem = read("ca", &ca)?;
        let certs = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("ca: {}", ca.display()))?;
        tls = tls.root_certs(RootCerts::new_with_certs(&certs));
    }
    match (
        path("LATTICE_CLIENT_CERT", &fc.client_cert),
        path("LATTICE_CLIENT_KEY", &fc.client_key),
    ) {
        (Some(c), Some(k)) => {
            let cert = Certificate::from_pem(&read("client_cert", &c)?)
                .with_context(|| format!("client_cert: {}", c.display()))?;
            let key = PrivateKey::from_pem(&read("client_key", &k)?)
                .with_context(|| format!("client_key: {}", k.display()))?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&[cert], key)));
        }
        (None, None) => {}
        _ => {
            bail!("a client certificate needs both client_cert and client_key (LATTICE_CLIENT_CERT/LATTICE_CLIENT_KEY)")
        }
    }
    Ok(ureq::Agent::config_builder()
        .tls_config(tls.build())
        .http_status_as_error(false)
        .build()
        .into())
}

/// User errors print `error: <message>` and their causes (exit 1), never a backtrace: those are for
/// panics. Usage errors are clap's (exit 2).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", lattice_engine::user_error_report(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let fc = file_config()?;
    let agent = http_agent(&fc)?;
    let base = cli
        .endpoint
        .clone()
        .or_else(|| std::env::var("LATTICE_ENDPOINT").ok())
        .or(fc.endpoint)
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let tenant = cli
        .tenant
        .clone()
        .or_else(|| std::env::var("LATTICE_TENANT").ok())
        .or(fc.tenant);
    let default_vcluster = fc.vcluster.clone();
    let base = base.trim_end_matches('/').to_string();
    let store = lattice_cli::login::tokens_path().map(lattice_cli::login::Store::new);
    match &cli.cmd {
        Cmd::Login {
            flow: Flow::Device,
            scope,
        } => {
            let d = lattice_cli::login::discover(&agent, &base)?;
            if d.mode == "none" {
                println!("{base} does not ask for authentication: nothing to log in to");
                return Ok(());
            }
            let (Some(idp), Some(client_id)) = (d.idp_url.or(d.issuer), d.client_id) else {
                bail!("{base}'s auth discovery names no IdP or client id (auth.idp_url, auth.client_id)");
            };
            let ep = lattice_cli::login::endpoints(&agent, &idp)?;
            let entry = lattice_cli::login::device_login(
                &agent,
                &ep,
                &client_id,
                scope,
                |c| {
                    eprintln!(
                        "To log in, open {} and enter the code {}",
                        c.verification_uri, c.user_code
                    );
                    if let Some(u) = &c.verification_uri_complete {
                        eprintln!("(or open {u})");
                    }
                },
                std::thread::sleep,
            )?;
            let store = store.context("HOME is not set: nowhere to keep the token")?;
            let mut all = store.load()?;
            all.insert(base.clone(), entry);
            store.save(&all)?;
            println!("Logged in to {base}");
            return Ok(());
        }
        Cmd::Logout => {
            let store = store.context("HOME is not set: no token cache")?;
            if lattice_cli::login::logout(&agent, &store, &base)? {
                println!("Logged out of {base}");
            } else {
                println!("Not logged in to {base}");
            }
            return Ok(());
        }
        _ => {}
    }
    let token = match std::env::var("LATTICE_TOKEN").ok().or(fc.token.clone()) {
        Some(t) => Some(t),
        None => match &store {
            Some(s) => lattice_cli::login::token_for(&agent, s, &base)?,
            None => None,
        },
    };
    let client = Client { base, agent, token };
    let output = cli.output.unwrap_or(Output::Table);
    match cli.cmd {
        Cmd::Login { .. } | Cmd::Logout => unreachable!("handled above"),
        Cmd::Submit {
            nodes,
            walltime,
            vcluster,
            preemption_class,
            gpu_type,
            gpus,
            constraint,
            name,
            duration,
            task_group,
            uenv,
            view,
            image,
            data_mount,
            depends_on,
            site,
            command,
        } => {
            // A script file: its directives, then the flags on top.
            let mut fields = SubmitFields::default();
            // Quoted for `/bin/sh -c`: the job runs exactly the arguments typed after `--`.
            let mut entrypoint = lattice_cli::directives::shell_join(&command);
            if let [script] = command.as_slice()
                && std::path::Path::new(script).is_file()
            {
                let text = std::fs::read_to_string(script).with_context(|| format!("reading {script}"))?;
                let (f, warnings) = parse_script(&text);
                for w in warnings {
                    eprintln!("{w}");
                }
                fields = f;
                entrypoint = format!("bash {}", lattice_cli::directives::shell_join(&[script]));
            }
            let flags = SubmitFields {
                nodes,
                walltime,
                tenant: tenant.clone(),
                vcluster,
                preemption_class,
                gpu_type,
                gpu_count: gpus,
                features: constraint,
                tags: name
                    .map(|n| [("name".to_string(), n)].into_iter().collect())
                    .unwrap_or_default(),
                ntasks: None,
                ntasks_per_node: None,
                task_group,
                uenv,
                view,
                image,
                data_mounts: data_mount,
                depends_on: match &depends_on {
                    Some(d) => lattice_cli::directives::parse_depends_on(d).map_err(anyhow::Error::msg)?,
                    None => Vec::new(),
                },
            };
            let f = fields.overlay(&flags);
            let Some(tenant) = f.tenant.clone() else {
                bail!("no tenant: pass --tenant, set LATTICE_TENANT, or `tenant:` in ~/.config/lattice/config.yaml");
            };
            if entrypoint.is_empty() {
                bail!("nothing to run: `lattice submit [flags] -- COMMAND` or `lattice submit SCRIPT`");
            }
            let mut body = json!({
                "tenant": tenant,
                "user": std::env::var("USER").unwrap_or_else(|_| "unknown".into()),
                "entrypoint": entrypoint,
                "resources": {"nodes": f.node_count()},
                "lifecycle": {"type": "bounded", "walltime": f.walltime.clone().unwrap_or_else(|| "1h".into())},
                "tags": f.tags,
            });
            if !f.depends_on.is_empty() {
                body["depends_on"] = json!(
                    f.depends_on
                        .iter()
                        .map(|(r, c)| json!({"ref": r, "condition": c}))
                        .collect::<Vec<_>>()
                );
            }
            if let Some(v) = f.vcluster.as_ref().or(default_vcluster.as_ref()) {
                body["vcluster"] = json!(v);
            }
            if let Some(c) = f.preemption_class {
                body["preemption_class"] = json!(c);
            }
            if f.gpu_type.is_some() || f.gpu_count.is_some() || !f.features.is_empty() {
                body["resources"]["constraints"] =
                    json!({"gpu_type": f.gpu_type, "gpu_count": f.gpu_count, "features": f.features});
            }
            if let Some(d) = duration {
                body["duration"] = json!(d);
            }
            if f.image.is_some() {
                body["environment"] = json!({"image": f.image, "uenv": f.uenv});
            } else if f.uenv.is_some() || f.view.is_some() {
                body["environment"] = json!({"uenv": f.uenv, "view": f.view});
            }
            if let Some(t) = f.task_group {
                body["task_group"] = t.to_json();
            }
            if !f.data_mounts.is_empty() {
                body["data"] = json!({"mounts": f.data_mounts.iter().map(|m| m.to_json()).collect::<Vec<_>>()});
            }
            if let Some(site) = site {
                let v = client.call(
                    "POST",
                    "/api/v1/federation/allocations",
                    Some(&json!({"site": site, "request": body})),
                )?;
                for w in v["routing"]["warnings"].as_array().into_iter().flatten() {
                    eprintln!("warning: {}", w.as_str().unwrap_or_default());
                }
                print_value(&v, output, lattice_cli::observe::federated_submit)?;
                return Ok(());
            }
            let v = client.call("POST", "/v1/allocations", Some(&body))?;
            print_value(&v, output, |v| format!("{}\n", v["id"].as_str().unwrap_or_default()))?;
        }
        Cmd::Status {
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
        Cmd::Status {
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
                lattice_cli::status::with_reasons(&mut rows);
            }
            print_rows(&rows, output, id.is_some(), "allocation")?;
            if !watch {
                break;
            }
            std::thread::sleep(std::time::Duration::from_secs(2));
            println!();
        },
        Cmd::Logs {
            id,
            site: Some(site),
            tail,
            ..
        } => {
            let v = client.call("GET", &format!("/api/v1/federation/allocations/{site}/{id}/logs"), None)?;
            let nodes = v["nodes"].as_object().cloned().unwrap_or_default();
            let many = nodes.len() > 1;
            for (node, text) in &nodes {
                if many {
                    println!("==> {node} <==");
                }
                print!(
                    "{}",
                    lattice_cli::launch::last_lines(text.as_str().unwrap_or_default(), tail)
                );
            }
            if nodes.is_empty() {
                eprintln!("{site}/{id}: no output reported yet");
            }
        }
        Cmd::Logs {
            id,
            follow: false,
            tail,
            stderr,
            rank,
            ..
        } if lattice_cli::launch::launch_of(&id).is_some() => {
            // A task launch: each rank's stdout (or stderr), kept apart, in rank order.
            let (alloc, _) = lattice_cli::launch::launch_of(&id).expect("matched");
            let v = client.call("GET", &format!("/v1/allocations/{alloc}/tasks/{id}"), None)?;
            print!("{}", lattice_cli::launch::rank_logs(&v, stderr, rank, tail));
        }
        Cmd::Logs {
            id,
            follow: true,
            node,
            stderr,
            ..
        } => {
            // Each stream pushed on its own (Server-Sent Events; offsets are per stream) until the
            // allocation ended and its agents' last output arrived; the job's stderr goes to ours.
            let streams: &[&str] = if stderr { &["stderr"] } else { &["stdout", "stderr"] };
            let out = std::sync::Mutex::new(());
            std::thread::scope(|scope| -> Result<()> {
                let handles: Vec<_> = streams
                    .iter()
                    .map(|&stream| {
                        let (client, node, out, id) = (&client, &node, &out, &id);
                        scope.spawn(move || -> Result<()> {
                            // Where each node's output is up to: a stream that closes before its
                            // `end` is opened again from there (nothing twice, nothing lost).
                            let mut after: std::collections::BTreeMap<String, u64> = Default::default();
                            for _ in 0..20 {
                                let q: Vec<String> = after.iter().map(|(n, o)| format!("{n}:{o}")).collect();
                                let path =
                                    format!("/v1/allocations/{id}/logs/stream?stream={stream}&after={}", q.join(","));
                                let (mut ended, mut failed) = (false, None);
                                client.events(&path, |event, data| {
                                    match event {
                                        "output" => {
                                            let n = data["node"].as_str().unwrap_or_default().to_string();
                                            if node.as_ref().is_none_or(|x| *x == n) {
                                                let _held = out.lock();
                                                print_stream(
                                                    stream == "stderr" && !stderr,
                                                    data["data"].as_str().unwrap_or_default(),
                                                );
                                            }
                                            after.insert(n, data["next"].as_u64().unwrap_or(0));
                                        }
                                        "end" => ended = true,
                                        "error" => failed = data["error"].as_str().map(str::to_string),
                                        _ => {}
                                    }
                                    !ended && failed.is_none()
                                })?;
                                if let Some(f) = failed {
                                    bail!("{id}: the log stream ended: {f}");
                                }
                                if ended {
                                    return Ok(());
                                }
                                std::thread::sleep(std::time::Duration::from_millis(500));
                            }
                            bail!("{id}: the log stream kept closing before the allocation's end")
                        })
                    })
                    .collect();
                for h in handles {
                    h.join()
                        .map_err(|_| anyhow::anyhow!("a log stream's reader panicked"))??;
                }
                Ok(())
            })?;
        }
        Cmd::Logs {
            id,
            follow: false,
            node,
            tail,
            stderr,
            ..
        } => {
            // Both streams by default: the job's stdout to ours, its stderr to ours; `--stderr`: only
            // its stderr, to our stdout (to page or grep it).
            let streams: &[&str] = if stderr { &["stderr"] } else { &["stdout", "stderr"] };
            let mut any = false;
            for &stream in streams {
                let mut path = format!("/v1/allocations/{id}/logs?stream={stream}");
                if let Some(n) = &node {
                    path.push_str(&format!("&node={n}"));
                }
                let v = client.call("GET", &path, None)?;
                let nodes = v["nodes"].as_object().cloned().unwrap_or_default();
                any |= !nodes.is_empty();
                let many = nodes.len() > 1;
                for (node, text) in nodes {
                    let text = lattice_cli::launch::last_lines(text.as_str().unwrap_or_default(), tail);
                    if text.is_empty() {
                        continue;
                    }
                    let to_stderr = stream == "stderr" && !stderr;
                    if many {
                        print_stream(to_stderr, &format!("==> {node} <==\n"));
                    }
                    print_stream(to_stderr, &text);
                }
            }
            if !any {
                eprintln!("{id}: no output reported yet (agents report it when the processes end)");
            }
        }
        Cmd::Launch {
            alloc,
            ntasks,
            tasks_per_node,
            env,
            pmi,
            fence_timeout,
            label,
            command,
        } => {
            let args = lattice_cli::launch::LaunchArgs {
                ntasks,
                tasks_per_node,
                env: lattice_cli::launch::parse_env(&env).map_err(anyhow::Error::msg)?,
                pmi,
                fence_timeout,
                label,
                command,
            };
            launch(&client, alloc, &args)?;
        }
        Cmd::Srun { args } => {
            let args = lattice_cli::launch::from_srun(&args).map_err(anyhow::Error::msg)?;
            launch(&client, None, &args)?;
        }
        Cmd::Attach { id, node, command } => {
            let (rows, cols) = lattice_cli::terminal::size().unwrap_or((24, 80));
            let url = lattice_cli::terminal::url(&client.base, &id, node.as_deref(), command.as_deref(), rows, cols)?;
            let code = lattice_cli::terminal::run(&url, client.token.as_deref())?;
            std::process::exit(code.clamp(0, 255));
        }
        Cmd::Session {
            nodes,
            walltime,
            vcluster,
            constraint,
            uenv,
            view,
        } => {
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
                        let (rows, cols) = lattice_cli::terminal::size().unwrap_or((24, 80));
                        let url = lattice_cli::terminal::session_url(&client.base, &id, rows, cols)?;
                        break lattice_cli::terminal::run(&url, client.token.as_deref());
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
        Cmd::Cache { cmd } => match cmd {
            CacheCmd::Warm {
                image,
                nodes,
                group,
                sticky,
            } => {
                let body = json!({"image": image, "nodes": nodes, "group": group, "sticky": sticky});
                let v = client.call("POST", "/v1/cache/warm", Some(&body))?;
                print_value(&v, output, |v| {
                    format!("warming {image} on {}\n", v["nodes"].as_array().map_or(0, Vec::len))
                })?;
            }
            CacheCmd::Evict { image, nodes, group } => {
                let body = json!({"image": image, "nodes": nodes, "group": group});
                let v = client.call("POST", "/v1/cache/evict", Some(&body))?;
                print_value(&v, output, |v| {
                    format!("evicting {image} on {}\n", v["nodes"].as_array().map_or(0, Vec::len))
                })?;
            }
            CacheCmd::List { node } => {
                let path = match &node {
                    Some(n) => format!("/v1/cache?node={n}"),
                    None => "/v1/cache".to_string(),
                };
                let v = client.call("GET", &path, None)?;
                match output {
                    Output::Json => println!("{}", serde_json::to_string_pretty(&v["nodes"])?),
                    Output::Yaml => print!("{}", yaml_serde::to_string(&v["nodes"])?),
                    Output::Table | Output::Wide => {
                        println!(
                            "{:<16} {:<40} {:>12} {:>15} {:<6} LAST",
                            "NODE", "IMAGE", "BYTES", "LAST_USED_MS", "STICKY"
                        );
                        for (n, c) in v["nodes"].as_object().cloned().unwrap_or_default() {
                            let last = c["outcomes"]
                                .as_array()
                                .and_then(|o| o.last())
                                .map(|o| {
                                    format!(
                                        "{} {} {}{}",
                                        o["op"].as_str().unwrap_or_default(),
                                        o["image"].as_str().unwrap_or_default(),
                                        if o["ok"] == true { "ok" } else { "failed" },
                                        o["detail"]
                                            .as_str()
                                            .filter(|d| !d.is_empty())
                                            .map(|d| format!(": {d}"))
                                            .unwrap_or_default()
                                    )
                                })
                                .unwrap_or_default();
                            let images = c["images"].as_array().cloned().unwrap_or_default();
                            if images.is_empty() {
                                println!("{n:<16} {:<40} {:>12} {:>15} {:<6} {last}", "-", 0, 0, "-");
                            }
                            for i in images {
                                println!(
                                    "{n:<16} {:<40} {:>12} {:>15} {:<6} {last}",
                                    i["file"].as_str().unwrap_or_default(),
                                    i["size"].as_u64().unwrap_or(0),
                                    i["last_used_ms"].as_u64().unwrap_or(0),
                                    if i["sticky"] == true { "yes" } else { "no" }
                                );
                            }
                        }
                    }
                }
            }
        },
        Cmd::Cancel { ids, site } => {
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
        }
        Cmd::Nodes => {
            let v = client.call("GET", "/v1/nodes", None)?;
            print_rows(
                v["nodes"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                output,
                false,
                "node",
            )?;
        }
        Cmd::Dag { cmd } => match cmd {
            DagCmd::Submit { file } => {
                let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
                let mut body: Value =
                    yaml_serde::from_str(&text).with_context(|| format!("{}: not YAML/JSON", file.display()))?;
                // Members without a tenant submit as the client's tenant.
                if let (Some(t), Some(members)) = (&tenant, body["allocations"].as_array_mut()) {
                    for m in members {
                        if m.get("tenant").is_none() {
                            m["tenant"] = json!(t);
                        }
                    }
                }
                let v = client.call("POST", "/v1/dags", Some(&body))?;
                print_value(&v, output, |v| format!("{}\n", v["id"].as_str().unwrap_or_default()))?;
                if let (Some(m), Output::Table | Output::Wide) = (v["allocations"].as_object(), output) {
                    for (name, id) in m {
                        eprintln!("  {name}: {}", id.as_str().unwrap_or_default());
                    }
                }
            }
            DagCmd::Status { id } => {
                let v = client.call("GET", &format!("/v1/dags/{id}"), None)?;
                print_value(&v, output, |v| {
                    let mut s = format!("{id}: {}\n", v["state"].as_str().unwrap_or_default());
                    for m in v["allocations"].as_array().cloned().unwrap_or_default() {
                        s.push_str(&format!(
                            "  {:<16} {:<10} {}\n",
                            m["name"].as_str().unwrap_or_default(),
                            m["id"].as_str().unwrap_or_default(),
                            m["state"].as_str().unwrap_or_default()
                        ));
                    }
                    s
                })?;
            }
            DagCmd::Graph { id } => {
                let v = client.call("GET", &format!("/v1/dags/{id}/graph"), None)?;
                print_value(&v, output, lattice_cli::observe::graph_view)?;
            }
            DagCmd::Cancel { id } => {
                let v = client.call("DELETE", &format!("/v1/dags/{id}"), None)?;
                print_value(&v, output, |v| {
                    format!("{id}: cancelled {}\n", v["cancelled"].as_u64().unwrap_or(0))
                })?;
            }
        },
        Cmd::Watch {
            id,
            metrics,
            alerts_only,
            ..
        } if metrics.is_some() || alerts_only => {
            // The live metrics stream: a line per period (and per alert) until it ends.
            let mut path = format!("/v1/allocations/{id}/metrics/stream");
            if let Some(m) = metrics.as_ref().filter(|m| !m.is_empty()) {
                path.push_str(&query(&[("metrics", &Some(m.clone()))]));
            }
            let mut state = String::new();
            client.events(&path, |event, data| {
                let text = match (event, output) {
                    ("end", _) => {
                        state = data["state"].as_str().unwrap_or_default().to_string();
                        None
                    }
                    (_, Output::Json) => Some(json!({"event": event, "data": data}).to_string()),
                    ("metrics", _) if alerts_only => None,
                    ("metrics", _) => Some(lattice_cli::observe::metrics_line(data)),
                    ("alert", _) => Some(format!(
                        "ALERT {} on {} gpu {}",
                        data["rule"].as_str().unwrap_or_default(),
                        data["node"].as_str().unwrap_or_default(),
                        data["gpu"].as_str().unwrap_or_default()
                    )),
                    ("error", _) => Some(format!("error: {}", data["error"].as_str().unwrap_or_default())),
                    _ => None,
                };
                if let Some(t) = text {
                    println!("{t}");
                    let _ = std::io::Write::flush(&mut std::io::stdout());
                }
                event != "end"
            })?;
            if state.is_empty() {
                bail!("{id}: the metrics stream closed before the allocation ended");
            }
            eprintln!("{id}: {state}");
            if state != "completed" {
                std::process::exit(1);
            }
        }
        Cmd::Watch { id, interval, .. } => {
            let mut last: Option<String> = None;
            loop {
                let v = client.call("GET", &format!("/v1/allocations/{id}"), None)?;
                let state = v["state"].as_str().unwrap_or_default().to_string();
                if last.as_deref() != Some(state.as_str()) {
                    // json/yaml: one document per change (JSON lines; YAML documents).
                    match output {
                        Output::Json => println!("{}", serde_json::to_string(&v)?),
                        Output::Yaml => print!("---\n{}", yaml_serde::to_string(&v)?),
                        _ => println!("{}", lattice_cli::status::watch_line(&v, lattice_cli::status::now_ms())),
                    }
                    std::io::Write::flush(&mut std::io::stdout())?;
                    last = Some(state.clone());
                }
                if v["ended_ms"].is_u64() {
                    if state != "completed" {
                        std::process::exit(1);
                    }
                    break;
                }
                std::thread::sleep(std::time::Duration::from_secs_f64(interval.clamp(0.05, 3600.0)));
            }
        }
        Cmd::Diag { id, network, storage } => {
            let part = match (network, storage) {
                (true, false) => "/network",
                (false, true) => "/storage",
                _ => "",
            };
            if network || storage {
                let d = client.call("GET", &format!("/v1/allocations/{id}/diagnostics{part}"), None)?;
                return print_value(&d, output, lattice_cli::observe::diagnostics_view);
            }
            let v = client.call("GET", &format!("/v1/allocations/{id}"), None)?;
            let vc = v["vcluster"].as_str().unwrap_or("default").to_string();
            let q = client.call("GET", &format!("/v1/vclusters/{vc}/queue"), None).ok();
            // Once it runs (or ran), the network and storage diagnostics too.
            let d = match v["started_ms"].is_u64() {
                true => Some(client.call("GET", &format!("/v1/allocations/{id}/diagnostics"), None)?),
                false => None,
            };
            print_value(&json!({"allocation": v, "diagnostics": d}), output, |_| {
                let mut text = lattice_cli::status::diagnose(&v, q.as_ref());
                if let Some(d) = &d {
                    text.push_str(&lattice_cli::observe::diagnostics_view(d));
                }
                text
            })?;
        }
        Cmd::Compare {
            ids,
            metric,
            align,
            step,
        } => {
            let joined = Some(ids.join(","));
            let path = format!(
                "/v1/compare{}",
                query(&[
                    ("ids", &joined),
                    ("metrics", &metric),
                    ("align", &Some(align)),
                    ("step", &step)
                ])
            );
            let v = client.call("GET", &path, None)?;
            print_value(&v, output, lattice_cli::observe::compare_view)?;
        }
        Cmd::Top {
            id: Some(id),
            per_node,
            per_gpu,
            wide,
            duration,
            ..
        } => {
            let mode = match (per_node || wide, per_gpu) {
                (_, true) => "per-gpu",
                (true, false) => "per-node",
                _ => "summary",
            };
            let path = format!(
                "/v1/allocations/{id}/metrics{}",
                query(&[("mode", &Some(mode.to_string())), ("duration", &duration)])
            );
            let v = client.call("GET", &path, None)?;
            print!("{}", lattice_cli::observe::metrics_view(&v));
        }
        Cmd::Top {
            interval, once, all, ..
        } => loop {
            let path = match (&tenant, all) {
                (Some(t), false) => format!("/v1/allocations?tenant={t}"),
                _ => "/v1/allocations".to_string(),
            };
            let allocs = client.call("GET", &path, None)?["allocations"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let nodes = client.call("GET", "/v1/nodes", None)?["nodes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let rows = lattice_cli::terminal::size().map_or(40, |(r, _)| (r as usize).saturating_sub(6).max(5));
            let screen = lattice_cli::status::top_screen(&allocs, &nodes, lattice_cli::status::now_ms(), rows);
            if once {
                print!("{screen}");
                break;
            }
            // Home, clear, the screen.
            print!("\x1b[H\x1b[2J{screen}");
            std::io::Write::flush(&mut std::io::stdout())?;
            std::thread::sleep(std::time::Duration::from_secs_f64(interval.clamp(0.1, 3600.0)));
        },
        Cmd::Node { cmd } => {
            let (node, op) = match &cmd {
                NodeCmd::Drain { node } => (node, "drain"),
                NodeCmd::Undrain { node } => (node, "undrain"),
                NodeCmd::Disable { node } => (node, "disable"),
                NodeCmd::Enable { node } => (node, "enable"),
            };
            let v = client.call("POST", &format!("/v1/nodes/{node}/{op}"), None)?;
            print_value(&v, output, |v| {
                format!("{node}: {}\n", v["state"].as_str().unwrap_or_default())
            })?;
        }
        Cmd::Audit {
            user,
            allocation,
            node,
            since,
            until,
        } => {
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
        }
        Cmd::History { user, days } => {
            let days = days.map(|d| d.to_string());
            let scope = match (&user, &tenant) {
                (None, Some(t)) => ("tenant", Some(t.clone())),
                _ => ("user", user.clone()),
            };
            let path = format!("/v1/accounting{}", query(&[(scope.0, &scope.1), ("days", &days)]));
            let v = client.call("GET", &path, None)?;
            print_value(&v, output, lattice_cli::observe::history_view)?;
        }
        Cmd::Telemetry { id, mode, duration } => {
            let mut t = json!({"mode": mode});
            if let Some(d) = duration {
                t["duration"] = json!(d);
            }
            let v = client.call(
                "PATCH",
                &format!("/v1/allocations/{id}"),
                Some(&json!({"telemetry": t})),
            )?;
            print_value(&v, output, |v| {
                format!("{id}: telemetry {}\n", v["telemetry"].as_str().unwrap_or_default())
            })?;
        }
        Cmd::Config => {
            let file = std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".config/lattice/config.yaml"))
                .filter(|p| p.exists());
            let from = |env: &'static str, flag: bool, in_file: bool| -> &'static str {
                if flag {
                    "flag"
                } else if std::env::var_os(env).is_some() {
                    env
                } else if in_file {
                    "config file"
                } else {
                    "default"
                }
            };
            let fc = file_config()?;
            println!(
                "config file: {}",
                file.as_ref().map_or("(none)".into(), |p| p.display().to_string())
            );
            println!(
                "endpoint:    {} ({})",
                client.base,
                from("LATTICE_ENDPOINT", cli.endpoint.is_some(), fc.endpoint.is_some())
            );
            println!(
                "tenant:      {} ({})",
                tenant.as_deref().unwrap_or("(none)"),
                from("LATTICE_TENANT", cli.tenant.is_some(), fc.tenant.is_some())
            );
            println!(
                "vcluster:    {}",
                fc.vcluster.as_deref().unwrap_or("(the tenant's default)")
            );
            println!(
                "token:       {} ({})",
                if client.token.is_some() { "set" } else { "none" },
                from("LATTICE_TOKEN", false, fc.token.is_some())
            );
            for (name, env, v) in [
                ("ca", "LATTICE_CA", &fc.ca),
                ("client_cert", "LATTICE_CLIENT_CERT", &fc.client_cert),
                ("client_key", "LATTICE_CLIENT_KEY", &fc.client_key),
            ] {
                let shown = std::env::var_os(env)
                    .map(PathBuf::from)
                    .or(v.clone())
                    .map_or("(none)".into(), |p| p.display().to_string());
                println!("{name:<12} {shown}");
            }
        }
        Cmd::Completion { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "lattice", &mut std::io::stdout());
        }
        Cmd::Admin { cmd } => match cmd {
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
            AdminCmd::Federation { cmd } => {
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
                print_value(&v, output, lattice_cli::observe::federation_status)?;
            }
            AdminCmd::Accounting {
                cmd: AccountingCmd::Status,
            } => {
                let v = client.call("GET", "/api/v1/admin/accounting", None)?;
                print_value(&v, output, lattice_cli::observe::accounting_status)?;
            }
            AdminCmd::Accounting {
                cmd: AccountingCmd::Reconcile { since, until },
            } => {
                let body = json!({"since": since, "until": until});
                let v = client.call("POST", "/api/v1/admin/accounting/reconcile", Some(&body))?;
                print_value(&v, output, |v| {
                    format!(
                        "queued {} event(s) from {since} to {until} ({} dropped: buffers full)\n",
                        v["queued"], v["dropped"]
                    )
                })?;
            }
            AdminCmd::Tenant {
                cmd: None | Some(TenantCmd::List),
            } => {
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
            AdminCmd::Tenant {
                cmd: Some(TenantCmd::Create { name, quota }),
            } => {
                let mut body = quota.body();
                body.insert("name".into(), json!(name));
                let v = client.call("POST", "/api/v1/tenants", Some(&Value::Object(body)))?;
                print_value(&v, output, |v| {
                    format!("created tenant {name}\n{}", lattice_cli::observe::tenant_view(v))
                })?;
            }
            AdminCmd::Tenant {
                cmd: Some(TenantCmd::Update { name, quota } | TenantCmd::SetQuota { name, quota }),
            } => {
                let body = Value::Object(quota.body());
                let v = client.call("PUT", &format!("/api/v1/tenants/{name}"), Some(&body))?;
                if let Some(w) = v["warning"].as_str() {
                    eprintln!("warning: {w}");
                }
                print_value(&v, output, |v| {
                    format!("updated tenant {name}\n{}", lattice_cli::observe::tenant_view(v))
                })?;
            }
            AdminCmd::Tenant {
                cmd: Some(TenantCmd::Delete { name }),
            } => {
                let v = client.call("DELETE", &format!("/api/v1/tenants/{name}"), None)?;
                print_value(&v, output, |_| format!("deleted tenant {name}\n"))?;
            }
            AdminCmd::Tenant {
                cmd: Some(TenantCmd::Show { name }),
            } => {
                let v = client.call("GET", &format!("/v1/tenants/{name}"), None)?;
                print_value(&v, output, lattice_cli::observe::tenant_view)?;
            }
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
            AdminCmd::Project {
                cmd: ProjectCmd::List { tenant },
            } => {
                let v = client.call("GET", &format!("/api/v1/tenants/{tenant}/projects"), None)?;
                print_value(&v, output, |v| {
                    v["projects"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(lattice_cli::observe::project_view)
                        .collect()
                })?;
            }
            AdminCmd::Project {
                cmd: ProjectCmd::Show { tenant, name },
            } => {
                let v = client.call("GET", &format!("/api/v1/tenants/{tenant}/projects/{name}"), None)?;
                print_value(&v, output, lattice_cli::observe::project_view)?;
            }
            AdminCmd::Project {
                cmd: ProjectCmd::Create { tenant, name, quota },
            } => {
                let mut body = quota.body();
                body.insert("name".into(), json!(name));
                let path = format!("/api/v1/tenants/{tenant}/projects");
                let v = client.call("POST", &path, Some(&Value::Object(body)))?;
                print_value(&v, output, |v| {
                    format!(
                        "created project {tenant}/{name}\n{}",
                        lattice_cli::observe::project_view(v)
                    )
                })?;
            }
            AdminCmd::Project {
                cmd: ProjectCmd::Update { tenant, name, quota },
            } => {
                let body = Value::Object(quota.body());
                let path = format!("/api/v1/tenants/{tenant}/projects/{name}");
                let v = client.call("PUT", &path, Some(&body))?;
                if let Some(w) = v["warning"].as_str() {
                    eprintln!("warning: {w}");
                }
                print_value(&v, output, |v| {
                    format!(
                        "updated project {tenant}/{name}\n{}",
                        lattice_cli::observe::project_view(v)
                    )
                })?;
            }
            AdminCmd::Project {
                cmd: ProjectCmd::Delete { tenant, name },
            } => {
                let v = client.call("DELETE", &format!("/api/v1/tenants/{tenant}/projects/{name}"), None)?;
                print_value(&v, output, |_| format!("deleted project {tenant}/{name}\n"))?;
            }
            AdminCmd::Vcluster {
                cmd:
                    VclusterCmd::SetWeights {
                        vcluster,
                        weights,
                        profile,
                    },
            } => {
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
            }
        },
    }
    Ok(())
}

/// Prints rows as a table (chosen columns), wide (more columns), JSON or YAML.
/// Runs a task launch and waits for it; exits the process with its status.
/// `?k=v&...` of the given (set) parameters, percent-encoded.
fn query(params: &[(&str, &Option<String>)]) -> String {
    let parts: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", lattice_util::url::component(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn launch(client: &Client, alloc: Option<String>, args: &lattice_cli::launch::LaunchArgs) -> Result<()> {
    let inside = std::env::var("LATTICE_ALLOC_ID").ok();
    let Some(alloc) = alloc.or(inside.clone()) else {
        bail!("--alloc: which allocation? (or run `lattice launch` inside one)");
    };
    // A multi-node allocation's script runs on every node: node 0's launch spans them all.
    if inside.as_deref() == Some(alloc.as_str())
        && std::env::var("LATTICE_NODEID").is_ok_and(|n| n != "0")
        && std::env::var("LATTICE_LAUNCH_ID").is_err()
    {
        return Ok(());
    }
    let v = client.call("POST", &format!("/v1/allocations/{alloc}/tasks"), Some(&args.body()))?;
    let id = v["launch_id"].as_str().unwrap_or_default().to_string();
    let mut pause = std::time::Duration::from_millis(25);
    let view = loop {
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(500));
        let v = client.call("GET", &format!("/v1/allocations/{alloc}/tasks/{id}"), None)?;
        if matches!(v["state"].as_str(), Some("completed" | "failed")) {
            break v;
        }
    };
    let (out, err) = lattice_cli::launch::rank_output(&view, args.label);
    print!("{out}");
    eprint!("{err}");
    if let Some(r) = view["reason"].as_str() {
        eprintln!("lattice launch: {id} failed: {r}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(lattice_cli::launch::exit_status(&view));
}

fn print_rows(rows: &[Value], output: Output, single: bool, kind: &str) -> Result<()> {
    match output {
        Output::Json => {
            let v = if single && rows.len() == 1 {
                rows[0].clone()
            } else {
                Value::Array(rows.to_vec())
            };
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Output::Yaml => {
            let v = if single && rows.len() == 1 {
                rows[0].clone()
            } else {
                Value::Array(rows.to_vec())
            };
            print!("{}", yaml_serde::to_string(&v)?);
        }
        Output::Table | Output::Wide => {
            let cols: &[&str] = match (kind, output) {
                ("node", Output::Wide) => &["name", "state", "owner", "gpu_type", "gpu_count", "group"],
                ("node", _) => &["name", "state", "owner"],
                (_, Output::Wide) => &[
                    "id",
                    "tenant",
                    "vcluster",
                    "user",
                    "state",
                    "requested_nodes",
                    "nodes",
                    "walltime_s",
                    "preemption_class",
                    "reason",
                ],
                _ => &["id", "tenant", "state", "requested_nodes", "reason"],
            };
            let cell = |v: &Value| match v {
                Value::Null => "-".to_string(),
                Value::String(s) => s.clone(),
                Value::Array(a) => a
                    .iter()
                    .map(|x| x.as_str().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(","),
                other => other.to_string(),
            };
            let table: Vec<Vec<String>> = rows
                .iter()
                .map(|r| cols.iter().map(|c| cell(&r[*c])).collect())
                .collect();
            print!("{}", lattice_cli::observe::table(cols, &table));
        }
    }
    Ok(())
}

/// An answer as JSON or YAML, or as `text` renders it for the table formats.
fn print_value(v: &Value, output: Output, text: impl FnOnce(&Value) -> String) -> Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(v)?),
        Output::Yaml => print!("{}", yaml_serde::to_string(v)?),
        Output::Table | Output::Wide => print!("{}", text(v)),
    }
    Ok(())
}

/// Writes a job's output to our stdout, or to our stderr when it is the job's stderr.
fn print_stream(to_stderr: bool, text: &str) {
    if to_stderr {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
}
